/* kvmem — command-line tool: demo, inspect, bench, backends, version. */
#include "args.h"
#include "commands.h"
#include "kvmem.h"

#include <stdio.h>
#include <string.h>

int kvm_tool_error(const char *what, int status) {
    fprintf(stderr, "kvmem: %s: %s (%s)\n", what, kvmem_last_error(), kvmem_status_str((kvmem_status)status));
    return 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: kvmem COMMAND [options]\n       kvmem --version\n\ncommands:\n");
    for (int i = 0; kvm_commands[i]; i++) fprintf(f, "  %-10s %s\n", kvm_commands[i]->name, kvm_commands[i]->usage);
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    /* --version is what users of other tools type first: the same as `kvmem version` */
    const char *name = strcmp(argv[1], "--version") == 0 ? "version" : argv[1];
    for (int i = 0; kvm_commands[i]; i++)
        if (strcmp(name, kvm_commands[i]->name) == 0) return kvm_commands[i]->run(argc - 1, argv + 1);
    fprintf(stderr, "kvmem: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

/* A command that takes nothing: only --help. */
static int no_arguments(const char *cmd, const char *help, int argc, char **argv) {
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    for (int c; (c = kvm_getopt(cmd, argc, argv, opts)) != -1;) {
        if (c != 'h') return KVM_EXIT_USAGE;
        printf("usage: kvmem %s\n  %s\n", cmd, help);
        return 0;
    }
    return kvm_args_at_most(cmd, argc, argv, optind, 0) ? -1 : KVM_EXIT_USAGE;
}

static int cmd_version(int argc, char **argv) {
    int rc = no_arguments("version", "print the library version", argc, argv);
    if (rc >= 0) return rc;
    printf("kvmem %s (header %s)\n", kvmem_version(), KVMEM_VERSION_STRING);
    return 0;
}
const kvm_command kvm_cmd_version = {"version", "print the library version", cmd_version};

static int cmd_backends(int argc, char **argv) {
    int rc = no_arguments("backends", "list backends and why any is unusable", argc, argv);
    if (rc >= 0) return rc;
    kvmem_backend_info info[8];
    size_t n = 0;
    kvmem_status st = kvmem_backends(info, 8, &n);
    if (st != KVMEM_OK) return kvm_tool_error("backends", st);
    for (size_t i = 0; i < n && i < 8; i++)
        printf("%-7s %-11s %s\n", info[i].name, info[i].available ? "available" : "unavailable", info[i].detail);
    return 0;
}
const kvm_command kvm_cmd_backends = {"backends", "list backends and why any is unusable", cmd_backends};
