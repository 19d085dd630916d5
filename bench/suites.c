/* The registry of benchmark suites. Each suite lives in its own file. */
#include "bench.h"

extern const kvm_bench_suite kvm_bench_machine;
/* retrieval */
extern const kvm_bench_suite kvm_bench_retrieval;

/* evict */

/* attend */

/* store */

/* segments */


const kvm_bench_suite *const kvm_bench_suites[] = {
    &kvm_bench_machine,
    /* retrieval */
    &kvm_bench_retrieval,

    /* evict */

    /* attend */

    /* store */

    /* segments */

    NULL,
};
