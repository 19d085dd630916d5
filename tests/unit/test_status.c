/* Status names, the thread-local last error, versions, logging. */
#include "testutil.h"
#include "internal.h"

#include <pthread.h>
#include <string.h>

static void every_status_has_a_distinct_name(void **state) {
    (void)state;
    const char *seen[32];
    int n = 0;
    for (int c = 0; c >= -15; c--) {
        const char *s = kvmem_status_str((kvmem_status)c);
        assert_non_null(s);
        assert_true(strncmp(s, "KVMEM_", 6) == 0);
        assert_string_not_equal(s, "KVMEM_ERR_UNKNOWN");
        for (int i = 0; i < n; i++) assert_string_not_equal(s, seen[i]);
        seen[n++] = s;
    }
    assert_string_equal(kvmem_status_str((kvmem_status)-999), "KVMEM_ERR_UNKNOWN");
    assert_string_equal(kvmem_status_str(KVMEM_OK), "KVMEM_OK");
}

static void version_macros_match_runtime(void **state) {
    (void)state;
    assert_int_equal(kvmem_version_number(), KVMEM_VERSION_NUMBER);
    assert_string_equal(kvmem_version(), KVMEM_VERSION_STRING);
    assert_int_equal(KVMEM_VERSION_NUMBER,
                     KVMEM_VERSION_MAJOR * 1000000 + KVMEM_VERSION_MINOR * 1000 + KVMEM_VERSION_PATCH);
}

static void *other_thread(void *arg) {
    (void)arg;
    kvm_fail(KVMEM_ERR_IO, "message from the other thread");
    return strstr(kvmem_last_error(), "other thread") ? (void *)1 : NULL;
}

static void last_error_is_thread_local(void **state) {
    (void)state;
    kvm_fail(KVMEM_ERR_INVALID_ARG, "message from main %d", 7);
    pthread_t t;
    void *ok = NULL;
    assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
    pthread_join(t, &ok);
    assert_non_null(ok);
    assert_string_equal(kvmem_last_error(), "message from main 7");
}

static int g_logged;
static void count_log(kvmem_log_level lvl, const char *msg, void *user) {
    (void)lvl;
    assert_ptr_equal(user, &g_logged);
    assert_non_null(msg);
    g_logged++;
}

static void log_callback_receives_failures_and_can_be_removed(void **state) {
    (void)state;
    g_logged = 0;
    kvmem_log_set(count_log, &g_logged);
    kvmem_context *ctx = NULL;
    kvmem_context_params p = kvmem_context_default_params();
    p.backend = "no-such-backend";
    assert_status(kvmem_context_create(&p, &ctx), KVMEM_ERR_NOT_FOUND, "unknown backend 'no-such-backend'");
    assert_null(ctx);
    assert_true(g_logged >= 1);
    kvmem_log_set(NULL, NULL);
    int before = g_logged;
    assert_status(kvmem_context_create(&p, &ctx), KVMEM_ERR_NOT_FOUND, "unknown backend");
    assert_int_equal(g_logged, before);
}

static void dtype_names(void **state) {
    (void)state;
    assert_string_equal(kvmem_dtype_name(KVMEM_F32), "f32");
    assert_string_equal(kvmem_dtype_name(KVMEM_F16), "f16");
    assert_string_equal(kvmem_dtype_name(KVMEM_BF16), "bf16");
    assert_string_equal(kvmem_dtype_name((kvmem_dtype)77), "?");
    kvmem_free(NULL); /* a no-op */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_status_has_a_distinct_name),
        cmocka_unit_test(version_macros_match_runtime),
        cmocka_unit_test(last_error_is_thread_local),
        cmocka_unit_test(log_callback_receives_failures_and_can_be_removed),
        cmocka_unit_test(dtype_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
