/* Crash consistency: a child process saving an agent is killed with SIGKILL
 * at random points of the save, 200 times; after each kill the file loads
 * as the old content or the new one, never anything else. */
#include "testutil.h"
#include "internal.h"
#include "format/hash.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define L 2
#define D 64
#define ITERS 200

static const int32_t k_tokens[2] = {300, 700}; /* version 0 (old), version 1 (new) */

static kvmem_pool *make_pool(kvmem_context *ctx) {
    kvmem_model_spec spec = tu_spec(L, D);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = 16;
    kvmem_pool *p = NULL;
    if (kvmem_pool_create(ctx, &spec, &pp, &p) != KVMEM_OK) return NULL;
    return p;
}

/* Build version `ver` of the agent (deterministic). */
static int build(kvmem_agent *a, int ver) {
    int32_t T = k_tokens[ver];
    size_t n = (size_t)L * (size_t)T * 2 * D;
    float *k = malloc(n * 4), *v = malloc(n * 4);
    uint64_t rng = 1000 + (uint64_t)ver;
    for (size_t i = 0; i < n; i++) k[i] = tu_normal(&rng), v[i] = tu_normal(&rng);
    kvmem_tensor tk, tv;
    int64_t shape[4] = {L, T, 2, D};
    kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape);
    kvmem_status st = kvmem_agent_append(a, &tk, &tv, NULL);
    free(k);
    free(v);
    return st == KVMEM_OK;
}

/* Digest of everything an agent holds, read through the public API. */
static uint64_t digest(kvmem_agent *a) {
    kvmem_agent_info info;
    if (kvmem_agent_get_info(a, &info) != KVMEM_OK) return 0;
    size_t n = (size_t)L * (size_t)info.n_tokens * 2 * D;
    float *k = malloc(n * 4 + 4), *v = malloc(n * 4 + 4);
    kvmem_tensor tk, tv;
    int64_t shape[4] = {L, info.n_tokens, 2, D};
    kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape);
    uint64_t h = 0;
    if (kvmem_agent_read(a, 0, info.n_tokens, &tk, &tv) == KVMEM_OK)
        h = kvm_xxh64_once(k, n * 4, (uint64_t)info.n_tokens) ^ kvm_xxh64_once(v, n * 4, 7);
    free(k);
    free(v);
    return h;
}

static uint64_t load_digest(kvmem_context *ctx, const char *path) {
    kvmem_pool *p = make_pool(ctx);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "crash", &a));
    kvmem_status st = kvmem_agent_load(a, path);
    if (st != KVMEM_OK) fail_msg("after a kill the file does not load: %s (%s)", kvmem_status_str(st), kvmem_last_error());
    uint64_t h = digest(a);
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    return h;
}

/* Remove the temporary files a killed save leaves; returns how many. */
static int clean_tmp(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    char path[600];
    while (d && (e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".tmp.")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
            n++;
        }
    if (d) closedir(d);
    return n;
}

static void killed_saves_leave_old_or_new(void **state) {
    (void)state;
    char dir[] = "/tmp/kvmem-crash-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[600];
    snprintf(path, sizeof path, "%s/crash.safetensors", dir);
    kvmem_context *ctx = tu_context(1); /* no worker threads: fork-safe */
    uint64_t want[2];
    double save_s = 0;
    for (int ver = 0; ver < 2; ver++) {
        kvmem_pool *p = make_pool(ctx);
        kvmem_agent *a;
        assert_ok(kvmem_agent_open(p, "crash", &a));
        assert_true(build(a, ver));
        want[ver] = digest(a);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        assert_ok(kvmem_agent_save(a, path)); /* leaves version 1 on disk */
        clock_gettime(CLOCK_MONOTONIC, &t1);
        save_s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        kvmem_agent_close(a);
        kvmem_pool_free(p);
    }
    assert_true(want[0] != want[1]);
    int on_disk = 1, seen[2] = {0, 0}, torn = 0, switched = 0;
    uint64_t rng = (uint64_t)time(NULL);
    for (int it = 0; it < ITERS; it++) {
        int next = 1 - on_disk;
        int pipefd[2];
        assert_int_equal(pipe(pipefd), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) { /* child: build the other version, say so, save it */
            close(pipefd[0]);
            kvmem_context_params cp = kvmem_context_default_params();
            cp.n_threads = 1;
            kvmem_context *c;
            if (kvmem_context_create(&cp, &c) != KVMEM_OK) _exit(3);
            kvmem_pool *p = make_pool(c);
            kvmem_agent *a;
            if (!p || kvmem_agent_open(p, "crash", &a) != KVMEM_OK || !build(a, next)) _exit(3);
            char go = 'g';
            if (write(pipefd[1], &go, 1) != 1) _exit(3);
            _exit(kvmem_agent_save(a, path) == KVMEM_OK ? 0 : 4);
        }
        close(pipefd[1]);
        char go;
        assert_int_equal(read(pipefd[0], &go, 1), 1);
        close(pipefd[0]);
        /* somewhere from the first byte to a bit after a typical save */
        double delay = (double)tu_uniform(&rng, 0.0f, 1.3f) * save_s;
        struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (WIFEXITED(status)) assert_int_equal(WEXITSTATUS(status), 0);
        torn += clean_tmp(dir) > 0;
        uint64_t h = load_digest(ctx, path);
        int before = on_disk;
        if (h == want[0]) on_disk = 0;
        else if (h == want[1]) on_disk = 1;
        else fail_msg("iteration %d: the file holds neither the old nor the new content", it);
        seen[on_disk]++;
        switched += on_disk != before;
    }
    print_message("crash test: %d kills: %d before the rename (%d left a temporary file), %d after; v0 %d times, v1 %d "
                  "times (save %.1f ms)\n", ITERS, ITERS - switched, torn, switched, seen[0], seen[1], save_s * 1e3);
    /* kills landed both before and after the rename */
    assert_true(switched > 0 && switched < ITERS);
    unlink(path);
    rmdir(dir);
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(killed_saves_leave_old_or_new),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
