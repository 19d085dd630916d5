/* The registry of benchmark suites. Each suite lives in its own file. */
#include "bench.h"

extern const kvm_bench_suite kvm_bench_machine;
extern const kvm_bench_suite kvm_bench_backend; /* backends (Vulkan issue) */
/* retrieval */
extern const kvm_bench_suite kvm_bench_retrieval;

/* evict */
extern const kvm_bench_suite kvm_bench_evict;

/* attend */
extern const kvm_bench_suite kvm_bench_attend;

/* store */
extern const kvm_bench_suite kvm_bench_store;

/* segments */
extern const kvm_bench_suite kvm_bench_segments;

/* cuda */
extern const kvm_bench_suite kvm_bench_cuda;

/* wasm */
extern const kvm_bench_suite kvm_bench_webref;

const kvm_bench_suite *const kvm_bench_suites[] = {
    &kvm_bench_machine,
    &kvm_bench_backend,
    /* retrieval */
    &kvm_bench_retrieval,

    /* evict */
    &kvm_bench_evict,

    /* attend */
    &kvm_bench_attend,

    /* store */
    &kvm_bench_store,

    /* segments */
    &kvm_bench_segments,

    /* cuda */
    &kvm_bench_cuda,

    /* wasm */
    &kvm_bench_webref,

    NULL,
};
