/* Subcommands of the kvmem tool. Each lives in its own file; the table is in
 * tools/commands.c. */
#ifndef KVMEM_TOOL_COMMANDS_H
#define KVMEM_TOOL_COMMANDS_H

typedef struct kvm_command {
    const char *name;
    const char *usage;
    int (*run)(int argc, char **argv); /* argv[0] is the command name; returns the exit code */
} kvm_command;

extern const kvm_command *const kvm_commands[];

/* Print the message of a failed kvmem call to stderr and return 1. */
int kvm_tool_error(const char *what, int status);

#endif
