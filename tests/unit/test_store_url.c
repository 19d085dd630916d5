/* Store selection by URL when the Redis plugin cannot be loaded (unit-test
 * programs link libkvmem statically and have no plugin beside them): a
 * clear KVMEM_ERR_UNSUPPORTED naming the Redis store, and a failed pool
 * creation that leaves nothing behind. The plugin itself is tested against a
 * live server by tests/checks/redis_store.sh. */
#include "testutil.h"
#include "store/store.h"

#include <stdlib.h>
#include <string.h>

static void urls_are_told_from_directories(void **state) {
    (void)state;
    assert_true(kvm_store_is_url("redis://127.0.0.1:6379/0"));
    assert_true(kvm_store_is_url("unix:///run/redis.sock"));
    assert_false(kvm_store_is_url("/var/lib/agents"));
    assert_false(kvm_store_is_url("redis"));
    assert_false(kvm_store_is_url("./redis://x")); /* a relative directory, not a URL */
    assert_false(kvm_store_is_url(NULL));
}

static void missing_plugin_is_reported_by_name(void **state) {
    (void)state;
    setenv("KVMEM_BACKEND_PATH", "/nonexistent-kvmem-plugins", 1);
    kvm_store *s = NULL;
    assert_status(kvm_store_open("redis://127.0.0.1:6379/0", &s), KVMEM_ERR_UNSUPPORTED, "redis store: ");
    assert_null(s);
    kvmem_context *ctx = tu_context(1);
    kvmem_model_spec spec = tu_spec(1, 64);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.store_dir = "unix:///tmp/kvmem-no-such.sock";
    kvmem_pool *p = NULL;
    assert_status(kvmem_pool_create(ctx, &spec, &pp, &p), KVMEM_ERR_UNSUPPORTED, "redis store: ");
    assert_null(p);
    /* a directory is still a directory */
    pp.store_dir = "/nonexistent-kvmem-dir";
    assert_status(kvmem_pool_create(ctx, &spec, &pp, &p), KVMEM_ERR_NOT_FOUND, "does not exist");
    kvmem_context_free(ctx);
    unsetenv("KVMEM_BACKEND_PATH");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(urls_are_told_from_directories),
        cmocka_unit_test(missing_plugin_is_reported_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
