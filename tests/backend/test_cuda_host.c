/* The CUDA backend's host-side logic, on the CPU: argument validation,
 * launch parameters, the caching allocator's bookkeeping and the pinned
 * staging plan. None of it needs a GPU, so it runs everywhere. */
#include "testutil.h"
#include "cuda_host.h"

#include <stdlib.h>
#include <string.h>

static void ranges_reject_overflow_and_outside(void **state) {
    (void)state;
    assert_true(kvm_cu_in_range(100, 0, 100));
    assert_true(kvm_cu_in_range(100, 100, 0));
    assert_false(kvm_cu_in_range(100, 101, 0));
    assert_false(kvm_cu_in_range(100, 1, 100));
    assert_false(kvm_cu_in_range(100, 50, SIZE_MAX));
    size_t b = 0;
    assert_true(kvm_cu_tensor_bytes(KVMEM_BF16, 3, &b));
    assert_int_equal(b, 6);
    assert_false(kvm_cu_tensor_bytes(KVMEM_F32, SIZE_MAX / 2, &b));
    assert_false(kvm_cu_tensor_bytes(KVMEM_Q4, 8, &b));
}

static void convert_checks_dtypes_ranges_alignment(void **state) {
    (void)state;
    assert_int_equal(kvm_cu_check_convert(64, 0, KVMEM_F16, 128, 0, KVMEM_F32, 32), KVMEM_OK);
    assert_int_equal(kvm_cu_check_convert(64, 0, KVMEM_F16, 128, 0, KVMEM_F32, 33), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "33 elements outside"));
    assert_int_equal(kvm_cu_check_convert(64, 0, KVMEM_Q8, 128, 0, KVMEM_F32, 1), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "f32, f16 or bf16"));
    assert_int_equal(kvm_cu_check_convert(64, 1, KVMEM_F16, 128, 0, KVMEM_F32, 4), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "multiples of the element size"));
    assert_int_equal(kvm_cu_check_convert(64, 0, KVMEM_F16, 128, 2, KVMEM_F32, 4), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_check_convert(64, 0, KVMEM_F16, 128, 0, KVMEM_F32, SIZE_MAX / 2), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_check_convert(0, 0, KVMEM_F16, 0, 0, KVMEM_F32, 0), KVMEM_OK);
}

static void aabb_build_checks_match_the_cpu_backend_rules(void **state) {
    (void)state;
    /* 3 groups of 4 rows of 8, groups 40 floats apart: the last group ends at 2*40 + 32 */
    size_t need = (2 * 40 + 32) * 4;
    assert_int_equal(kvm_cu_check_aabb_build(need, 0, 3, 40, 4, 8, 96, 96, 0), KVMEM_OK);
    assert_int_equal(kvm_cu_check_aabb_build(need - 4, 0, 3, 40, 4, 8, 96, 96, 0), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_check_aabb_build(need, 0, 3, 40, 4, 8, 92, 96, 0), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_check_aabb_build(need, 0, 3, 40, 4, 8, 96, 96, 4), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_check_aabb_build(need, 0, 0, 40, 4, 8, 96, 96, 0), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "empty input"));
    assert_int_equal(kvm_cu_check_aabb_build(SIZE_MAX, 0, SIZE_MAX, SIZE_MAX, 4, 8, 96, 96, 0), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_check_aabb_build(need + 2, 2, 3, 40, 4, 8, 96, 96, 0), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "multiples of 4"));
}

static void grids_cover_the_work_and_respect_caps(void **state) {
    (void)state;
    kvm_cu_grid g = kvm_cu_grid_1d(0, 256, 100);
    assert_int_equal(g.blocks, 0);
    g = kvm_cu_grid_1d(1000, 256, 100);
    assert_int_equal(g.blocks, 4);
    assert_int_equal(g.threads, 256);
    g = kvm_cu_grid_1d((size_t)1 << 40, 256, 1056);
    assert_int_equal(g.blocks, 1056); /* grid-stride loops take the rest */
    g = kvm_cu_grid_aabb(10, 100);
    assert_int_equal(g.blocks, 10);
    assert_int_equal(g.threads, 128); /* dims rounded up to a warp multiple */
    g = kvm_cu_grid_aabb(10, 1000);
    assert_int_equal(g.threads, 256);
    g = kvm_cu_grid_aabb((size_t)1 << 32, 128);
    assert_true(g.blocks >= 65535u && g.blocks <= 65535u * 16u);
    assert_true(kvm_cu_head_dim_supported(128) && kvm_cu_head_dim_supported(64) && kvm_cu_head_dim_supported(256));
    assert_false(kvm_cu_head_dim_supported(80));
}

static void score_plan_pads_to_mma_tiles_and_falls_back_to_workspace(void **state) {
    (void)state;
    /* Llama-3.1-8B, 14k tokens in blocks of 16, 32 query tokens */
    kvm_cu_score_shape s = {32, 32, 8, 128, 32, 875, 0};
    kvm_cu_score_plan p;
    assert_int_equal(kvm_cu_score_plan_make(&s, 227 * 1024, &p), KVMEM_OK);
    assert_int_equal(p.rows_pad, 32);
    assert_int_equal(p.nb_pad, 880);
    assert_int_equal(p.sort_len, 0);
    assert_true(p.in_smem);
    size_t qp_tile = 32 * 256 * 2, scores = 32 * 880 * 4;
    assert_int_equal(p.smem_bytes, qp_tile + scores);
    assert_int_equal(p.qp_bytes, (size_t)32 * 32 * qp_tile);
    assert_int_equal(p.blk_bytes, (size_t)32 * 8 * 880 * 256 * 2);
    assert_int_equal(p.ws_bytes % 256, 0);
    assert_true(p.ws_bytes >= p.qp_bytes);
    /* RR sorts in a power-of-two buffer */
    s.norm_rr = 1;
    assert_int_equal(kvm_cu_score_plan_make(&s, 227 * 1024, &p), KVMEM_OK);
    assert_int_equal(p.sort_len, 1024);
    assert_int_equal(p.smem_bytes, qp_tile + scores + 1024 * 8);
    /* 200k tokens: scores no longer fit, they go to the workspace */
    s.n_blocks = 12500;
    assert_int_equal(kvm_cu_score_plan_make(&s, 227 * 1024, &p), KVMEM_OK);
    assert_false(p.in_smem);
    assert_int_equal(p.smem_bytes, qp_tile);
    size_t per_cta = (size_t)32 * 12512 * 4 + (size_t)16384 * 8;
    assert_true(p.ws_bytes >= p.qp_bytes + (size_t)32 * 32 * per_cta);
    /* bad shapes */
    s.n_q = 65;
    assert_int_equal(kvm_cu_score_plan_make(&s, 227 * 1024, &p), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "65 query tokens"));
    s.n_q = 32;
    s.head_dim = 96;
    assert_int_equal(kvm_cu_score_plan_make(&s, 227 * 1024, &p), KVMEM_ERR_UNSUPPORTED);
    s.head_dim = 128;
    s.n_q_heads = 30;
    assert_int_equal(kvm_cu_score_plan_make(&s, 227 * 1024, &p), KVMEM_ERR_INVALID_ARG);
    s.n_q_heads = 32;
    s.n_blocks = 0;
    assert_int_equal(kvm_cu_score_plan_make(&s, 227 * 1024, &p), KVMEM_ERR_INVALID_ARG);
}

static void topk_plan_clamps_k_to_n(void **state) {
    (void)state;
    kvm_cu_topk_plan p;
    assert_int_equal(kvm_cu_topk_plan_make(875, 64, &p), KVMEM_OK);
    assert_int_equal(p.k, 64);
    assert_int_equal(p.sort_len, 64);
    assert_int_equal(kvm_cu_topk_plan_make(5, 64, &p), KVMEM_OK);
    assert_int_equal(p.k, 5);
    assert_int_equal(p.sort_len, 8);
    assert_true(p.smem_bytes >= 256 * 4 + 8 * 4);
    assert_int_equal(kvm_cu_topk_plan_make(100, 0, &p), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_topk_plan_make(100, KVM_CU_TOPK_MAX_K + 1, &p), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_topk_plan_make(0, 4, &p), KVMEM_ERR_INVALID_ARG);
}

static void attend_plan_waves_cover_every_tile_once(void **state) {
    (void)state;
    kvm_cu_attend_shape s = {14000, 64, 32, 8, 128, 219, 0, 132};
    kvm_cu_attend_plan p;
    assert_int_equal(kvm_cu_attend_plan_make(&s, &p), KVMEM_OK);
    assert_int_equal(p.n_tiles, 219);
    assert_int_equal(p.tiles_per_wave, 66); /* 4 CTAs per SM over 8 KV heads */
    assert_int_equal(p.n_waves, 4);
    assert_true((int64_t)p.n_waves * p.tiles_per_wave >= 219 && (int64_t)(p.n_waves - 1) * p.tiles_per_wave < 219);
    assert_int_equal(p.state_stride, kvm_cu_attend_state_bytes(128));
    assert_int_equal(p.state_stride % 16, 0);
    assert_true(p.state_stride >= (128 + 34) * 4 + 16);
    assert_true(p.partial_bytes >= (size_t)32 * 66 * 130 * 4);
    assert_int_equal(p.ws_bytes, p.partial_bytes + p.state_bytes);
    s.tiles_per_wave = 1000; /* clamped to the tiles visited */
    assert_int_equal(kvm_cu_attend_plan_make(&s, &p), KVMEM_OK);
    assert_int_equal(p.tiles_per_wave, 219);
    assert_int_equal(p.n_waves, 1);
    s.n_tiles_visit = 220;
    assert_int_equal(kvm_cu_attend_plan_make(&s, &p), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "220 tiles to visit"));
    s.n_tiles_visit = 219;
    s.tile = 48;
    assert_int_equal(kvm_cu_attend_plan_make(&s, &p), KVMEM_ERR_INVALID_ARG);
    s.tile = 64;
    s.head_dim = 80;
    assert_int_equal(kvm_cu_attend_plan_make(&s, &p), KVMEM_ERR_UNSUPPORTED);
    s.head_dim = 128;
    s.n_pos = 0;
    assert_int_equal(kvm_cu_attend_plan_make(&s, &p), KVMEM_ERR_INVALID_ARG);
}

static void staging_chunks_tile_the_transfer_and_alternate(void **state) {
    (void)state;
    const size_t chunk = 1000;
    for (size_t bytes = 0; bytes < 5000; bytes += 333) {
        size_t n = kvm_cu_staging_n_chunks(bytes, chunk), next = 0;
        assert_int_equal(n, (bytes + chunk - 1) / chunk);
        for (size_t i = 0; i < n; i++) {
            kvm_cu_chunk c = kvm_cu_staging_chunk(bytes, chunk, i);
            assert_int_equal(c.offset, next);
            assert_true(c.size > 0 && c.size <= chunk);
            assert_int_equal(c.slot, (int)(i % 2));
            next += c.size;
        }
        assert_int_equal(next, bytes);
        assert_int_equal(kvm_cu_staging_chunk(bytes, chunk, n).size, 0);
    }
    assert_int_equal(kvm_cu_staging_n_chunks(10, 0), 0);
}

/* ---- the caching allocator over malloc ---- */
typedef struct {
    int live, allocs, frees, fail_after;
} raw_state;
static void *t_alloc(void *u, size_t n) {
    raw_state *r = u;
    if (r->fail_after >= 0 && r->allocs >= r->fail_after) return NULL;
    r->allocs++;
    r->live++;
    return malloc(n);
}
static void t_free(void *u, void *p) {
    raw_state *r = u;
    r->frees++;
    r->live--;
    free(p);
}

static void size_classes_round_up_without_overflow(void **state) {
    (void)state;
    assert_int_equal(kvm_cu_round_size(0), 512);
    assert_int_equal(kvm_cu_round_size(1), 512);
    assert_int_equal(kvm_cu_round_size(513), 1024);
    assert_int_equal(kvm_cu_round_size((size_t)1 << 20), (size_t)1 << 20);
    assert_int_equal(kvm_cu_round_size(((size_t)1 << 20) + 1), (size_t)2 << 20);
    assert_int_equal(kvm_cu_round_size(SIZE_MAX - 5), 0);
}

static void allocator_reuses_released_blocks(void **state) {
    (void)state;
    raw_state r = {0, 0, 0, -1};
    kvm_cu_allocator *a = kvm_cu_allocator_create(t_alloc, t_free, &r, (size_t)64 << 20);
    assert_non_null(a);
    size_t g1, g2, g3;
    void *p1 = kvm_cu_alloc(a, 3000, &g1);
    assert_non_null(p1);
    assert_int_equal(g1, 3072);
    memset(p1, 1, g1); /* the granted size is usable */
    kvm_cu_release(a, p1, g1);
    kvm_cu_alloc_stats s = kvm_cu_allocator_stats(a);
    assert_int_equal(s.in_use, 0);
    assert_int_equal(s.cached, 3072);
    void *p2 = kvm_cu_alloc(a, 2900, &g2); /* same class: the same block, no raw call */
    assert_ptr_equal(p2, p1);
    assert_int_equal(r.allocs, 1);
    /* a small request does not take a block more than twice its size */
    kvm_cu_release(a, p2, g2);
    void *p3 = kvm_cu_alloc(a, 100, &g3);
    assert_ptr_not_equal(p3, p1);
    assert_int_equal(r.allocs, 2);
    s = kvm_cu_allocator_stats(a);
    assert_int_equal(s.reuses, 1);
    assert_int_equal(s.raw_allocs, 2);
    assert_int_equal(s.in_use, 512);
    assert_int_equal(s.cached, 3072);
    assert_int_equal(s.peak_in_use, 3072);
    kvm_cu_release(a, p3, g3);
    kvm_cu_allocator_trim(a);
    s = kvm_cu_allocator_stats(a);
    assert_int_equal(s.cached, 0);
    assert_int_equal(r.live, 0);
    kvm_cu_allocator_free(a);
    assert_int_equal(r.live, 0);
}

static void allocator_respects_the_cache_cap_and_retries_after_trim(void **state) {
    (void)state;
    raw_state r = {0, 0, 0, -1};
    kvm_cu_allocator *a = kvm_cu_allocator_create(t_alloc, t_free, &r, 4096);
    size_t g[4];
    void *p[4];
    for (int i = 0; i < 4; i++) p[i] = kvm_cu_alloc(a, 2048, &g[i]);
    for (int i = 0; i < 4; i++) kvm_cu_release(a, p[i], g[i]);
    kvm_cu_alloc_stats s = kvm_cu_allocator_stats(a);
    assert_int_equal(s.cached, 4096); /* two kept, two returned */
    assert_int_equal(r.live, 2);
    /* the raw allocator fails: the cache is emptied and the call retried */
    r.fail_after = r.allocs + 1;
    size_t gb;
    void *big = kvm_cu_alloc(a, 1 << 20, &gb); /* first raw call succeeds */
    assert_non_null(big);
    void *big2 = kvm_cu_alloc(a, 1 << 20, &gb); /* fails, trim, fails again */
    assert_null(big2);
    assert_int_equal(kvm_cu_allocator_stats(a).cached, 0);
    r.fail_after = -1;
    kvm_cu_release(a, big, (size_t)1 << 20);
    kvm_cu_allocator_free(a);
    assert_int_equal(r.live, 0);
    /* no callbacks, no allocator; NULL is a no-op everywhere */
    assert_null(kvm_cu_allocator_create(NULL, t_free, NULL, 0));
    kvm_cu_allocator_free(NULL);
    kvm_cu_release(NULL, NULL, 0);
    assert_null(kvm_cu_alloc(NULL, 10, NULL));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ranges_reject_overflow_and_outside),
        cmocka_unit_test(convert_checks_dtypes_ranges_alignment),
        cmocka_unit_test(aabb_build_checks_match_the_cpu_backend_rules),
        cmocka_unit_test(grids_cover_the_work_and_respect_caps),
        cmocka_unit_test(score_plan_pads_to_mma_tiles_and_falls_back_to_workspace),
        cmocka_unit_test(topk_plan_clamps_k_to_n),
        cmocka_unit_test(attend_plan_waves_cover_every_tile_once),
        cmocka_unit_test(staging_chunks_tile_the_transfer_and_alternate),
        cmocka_unit_test(size_classes_round_up_without_overflow),
        cmocka_unit_test(allocator_reuses_released_blocks),
        cmocka_unit_test(allocator_respects_the_cache_cap_and_retries_after_trim),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
