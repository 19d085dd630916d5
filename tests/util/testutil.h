/* Helpers for kvmem's cmocka tests. */
#ifndef KVMEM_TESTUTIL_H
#define KVMEM_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kvmem.h"

/* Assert a call fails with `code` and a message containing `needle`. */
#define assert_status(call, code, needle)                                            \
    do {                                                                             \
        kvmem_status st_ = (call);                                                   \
        if (st_ != (code))                                                           \
            fail_msg("%s: got %s (%s), expected %s", #call, kvmem_status_str(st_), \
                     kvmem_last_error(), kvmem_status_str(code));                    \
        kvm_test_assert_msg(#call, needle);                                          \
    } while (0)

#define assert_ok(call)                                                                    \
    do {                                                                                   \
        kvmem_status st_ = (call);                                                         \
        if (st_ != KVMEM_OK) fail_msg("%s: %s (%s)", #call, kvmem_status_str(st_), kvmem_last_error()); \
    } while (0)

void kvm_test_assert_msg(const char *call, const char *needle);

/* Skipping, for the programs that run on a device backend which may be
 * absent: TU_SKIP prints "skipped: <reason>", counts the skip and skips the
 * test; tu_group_result turns cmocka's failure count into the exit status
 * ctest reads (SKIP_RETURN_CODE 77): 1 when any test failed, 77 only when
 * every test skipped, else 0. A failure is never reported as a skip (ctest's
 * SKIP_REGULAR_EXPRESSION would mark a program that printed one skip reason
 * skipped whatever its other tests did). */
extern int tu_skips;
#define TU_SKIP(...)                                     \
    do {                                                 \
        print_message("skipped: " __VA_ARGS__);          \
        print_message("\n");                             \
        tu_skips++;                                      \
        skip();                                          \
    } while (0)
int tu_group_result(int failed, size_t n_tests);

/* Deterministic random numbers (splitmix64). */
uint64_t tu_next(uint64_t *s);
float tu_uniform(uint64_t *s, float lo, float hi);
float tu_normal(uint64_t *s);

/* A small GQA spec used across tests: L layers, 4 q heads, 2 kv heads, head_dim D. */
kvmem_model_spec tu_spec(int32_t L, int32_t D);

/* A context on the CPU with n threads (asserts). */
kvmem_context *tu_context(int32_t n_threads);

/* Fill a contiguous [L][T][H][D] f32 tensor view over `buf` with N(0, 1) values. */
void tu_fill_kv(float *buf, size_t n, uint64_t *rng);

/* The largest finite f16 value <= x and the smallest >= x (x within f16's
 * finite range), found among all finite f16 values decoded here with ldexp:
 * a reference independent of the library's conversions. */
double tu_f16_below(double x);
double tu_f16_above(double x);

/* A fresh directory /tmp/kvmem-<tag>-XXXXXX in dir (size >= 64); 0 on
 * success, as cmocka's setup functions return. */
int tu_tmpdir_make(char *dir, size_t size, const char *tag);
/* Remove dir and everything below it; 0 on success. */
int tu_tmpdir_remove(const char *dir);

#endif
