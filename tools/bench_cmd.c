/* kvmem bench [--json] [--quick] [--backend NAME] [--threads N] [--store URL] SUITE... | all */
#include "commands.h"
#include "kvmem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVMEM_WITH_BENCH
#  include "bench.h"

static int cmd_bench(int argc, char **argv) {
    kvm_bench_opts o = {0, 0, "cpu", 0, stdout, NULL};
    int n_suites = 0;
    const char *names[32];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) o.json = 1;
        else if (strcmp(argv[i], "--quick") == 0) o.quick = 1;
        else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) o.backend = argv[++i];
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) o.n_threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--store") == 0 && i + 1 < argc) o.store = argv[++i];
        else if (argv[i][0] == '-') {
            fprintf(stderr, "kvmem bench: unknown option '%s'\n", argv[i]);
            return 2;
        } else if (n_suites < 32) names[n_suites++] = argv[i];
    }
    if (n_suites == 0) {
        fprintf(stderr, "usage: kvmem bench [--json] [--quick] [--backend NAME] [--threads N] [--store URL] SUITE... | all\n"
                        "  --store redis://HOST:PORT/DB  also measure the store suite against this server\nsuites:\n");
        for (int i = 0; kvm_bench_suites[i]; i++)
            fprintf(stderr, "  %-10s %s\n", kvm_bench_suites[i]->name, kvm_bench_suites[i]->what);
        return 2;
    }
    for (int s = 0; s < n_suites; s++) {
        int all = strcmp(names[s], "all") == 0, found = 0;
        for (int i = 0; kvm_bench_suites[i]; i++) {
            if (!all && strcmp(names[s], kvm_bench_suites[i]->name) != 0) continue;
            found = 1;
            if (kvm_bench_suites[i]->run(&o) != 0) {
                fprintf(stderr, "kvmem bench: suite %s failed: %s\n", kvm_bench_suites[i]->name, kvmem_last_error());
                return 1;
            }
        }
        if (!found) {
            fprintf(stderr, "kvmem bench: unknown suite '%s'\n", names[s]);
            return 2;
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
