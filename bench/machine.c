/* Suite "machine": this machine's own limits, the denominators every other
 * suite divides by. */
#include "bench.h"

static int run_machine(const kvm_bench_opts *o) {
    size_t big = o->quick ? ((size_t)32 << 20) : ((size_t)256 << 20);
    double rd = kvm_measure_read_bw_gbps(big);
    double mc = kvm_measure_memcpy_gbps(big);
    double fl = kvm_measure_peak_gflops();
    if (o->json) {
        kvm_json_begin(o->out, "machine");
        kvm_json_num(o->out, "read_bw_gbps", rd);
        kvm_json_num(o->out, "memcpy_gbps", mc);
        kvm_json_num(o->out, "peak_gflops", fl);
        kvm_json_int(o->out, "bytes", (long long)big);
        kvm_json_end(o->out);
    } else {
        fprintf(o->out, "machine: single-thread read %.1f GB/s, memcpy %.1f GB/s, one core %.1f GFLOP/s (f32 FMA)\n",
                rd, mc, fl);
    }
    return 0;
}

const kvm_bench_suite kvm_bench_machine = {"machine", "this machine's read/memcpy bandwidth and FMA peak",
                                           run_machine};
