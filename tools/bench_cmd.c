/* kvmem bench [--json] [--quick] [--backend NAME] [--threads N] [--store URL] SUITE... | all */
#include "args.h"
#include "commands.h"
#include "kvmem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVMEM_WITH_BENCH
#  include "bench.h"

static int bench_usage(FILE *f) {
    fprintf(f, "usage: kvmem bench [--json] [--quick] [--backend NAME] [--threads N] [--store URL] SUITE... | all\n"
               "  --store redis://HOST:PORT/DB  also measure the store suite against this server\nsuites:\n");
    for (int i = 0; kvm_bench_suites[i]; i++) fprintf(f, "  %-10s %s\n", kvm_bench_suites[i]->name, kvm_bench_suites[i]->what);
    return f == stdout ? 0 : KVM_EXIT_USAGE;
}

/* A name kvmem_context_create takes: "auto" or a backend this build knows. */
static int known_backend(const char *name) {
    kvmem_backend_info info[8];
    size_t n = 0;
    if (strcmp(name, "auto") == 0) return 1;
    if (kvmem_backends(info, 8, &n) != KVMEM_OK) return 1; /* cannot tell: the context will say */
    for (size_t i = 0; i < n && i < 8; i++)
        if (strcmp(info[i].name, name) == 0) return 1;
    fprintf(stderr, "kvmem bench: --backend: '%s' is not one of auto", name);
    for (size_t i = 0; i < n && i < 8; i++) fprintf(stderr, ", %s", info[i].name);
    fprintf(stderr, "\n");
    return 0;
}

static int cmd_bench(int argc, char **argv) {
    enum { O_BACKEND = 256, O_THREADS, O_STORE };
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},          {"quick", no_argument, NULL, 'q'},
        {"backend", required_argument, NULL, O_BACKEND}, {"threads", required_argument, NULL, O_THREADS},
        {"store", required_argument, NULL, O_STORE}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    kvm_bench_opts o = {0, 0, "cpu", 0, stdout, NULL};
    for (int c; (c = kvm_getopt("bench", argc, argv, opts)) != -1;) {
        int ok = 1;
        switch (c) {
        case 'j': o.json = 1; break;
        case 'q': o.quick = 1; break;
        case 'h': return bench_usage(stdout);
        case O_BACKEND: ok = known_backend(o.backend = optarg); break;
        /* the context's range (kvmem_context_create): 0 = all cores */
        case O_THREADS: ok = kvm_arg_int("bench", "--threads", optarg, 0, 1024, &o.n_threads); break;
        case O_STORE:
            o.store = optarg;
            /* the URL forms of kvmem_pool_params.store_dir; the store checks the rest */
            if (strncmp(optarg, "redis://", 8) != 0 && strncmp(optarg, "unix://", 7) != 0) {
                fprintf(stderr, "kvmem bench: --store: '%s' is not a redis:// or unix:// URL\n", optarg);
                ok = 0;
            }
            break;
        default: ok = 0;
        }
        if (!ok) return KVM_EXIT_USAGE;
    }
    const int n_suites = argc - optind;
    char **names = argv + optind;
    if (n_suites == 0) return bench_usage(stderr);
    /* every suite name before any suite runs */
    int store_runs = 0;
    for (int s = 0; s < n_suites; s++) {
        int all = strcmp(names[s], "all") == 0, found = all;
        for (int i = 0; kvm_bench_suites[i]; i++)
            if (all || strcmp(names[s], kvm_bench_suites[i]->name) == 0) {
                found = 1;
                store_runs |= strcmp(kvm_bench_suites[i]->name, "store") == 0;
            }
        if (!found) {
            fprintf(stderr, "kvmem bench: unknown suite '%s' (kvmem bench --help lists them)\n", names[s]);
            return KVM_EXIT_USAGE;
        }
    }
    if (o.store && !store_runs) {
        fprintf(stderr, "kvmem bench: --store applies to the store suite, which is not selected\n");
        return KVM_EXIT_USAGE;
    }
    for (int s = 0; s < n_suites; s++) {
        int all = strcmp(names[s], "all") == 0;
        for (int i = 0; kvm_bench_suites[i]; i++) {
            if (!all && strcmp(names[s], kvm_bench_suites[i]->name) != 0) continue;
            if (kvm_bench_suites[i]->run(&o) != 0) {
                fprintf(stderr, "kvmem bench: suite %s failed: %s\n", kvm_bench_suites[i]->name, kvmem_last_error());
                return 1;
            }
        }
    }
    return 0;
}
#else
static int cmd_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kvmem bench: this build has no benchmarks (configure with -DKVMEM_BUILD_BENCH=ON)\n");
    return 2;
}
#endif

const kvm_command kvm_cmd_bench = {"bench", "run benchmark suites (--json for JSON lines)", cmd_bench};
