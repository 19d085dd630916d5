/* Command-line parsing shared by the kvmem tool's commands: getopt_long
 * (libc) for the options, and strict readers for their values. A value is
 * read whole or refused: no sign where none is allowed, no trailing
 * characters, no silent clamping or wrap-around. Every refusal prints
 * "kvmem CMD: --OPTION: 'VALUE' ..." to stderr, naming what was wrong, and
 * the caller returns exit code 2 (usage error). */
#ifndef KVMEM_TOOL_ARGS_H
#define KVMEM_TOOL_ARGS_H

#include <getopt.h>
#include <stdint.h>

#define KVM_EXIT_USAGE 2

/* getopt_long over a command's argv (argv[0] is the command name) with
 * libc's own messages off: returns the option's val, -1 at the end, or
 * '?' after printing what was wrong (unknown option, missing or unexpected
 * value). Positional arguments are left in argv[optind..argc). */
int kvm_getopt(const char *cmd, int argc, char **argv, const struct option *opts);

/* A decimal unsigned 64-bit value (0 .. 18446744073709551615). */
int kvm_arg_u64(const char *cmd, const char *opt, const char *s, uint64_t *out);
/* A decimal integer in [lo, hi]. */
int kvm_arg_int(const char *cmd, const char *opt, const char *s, long lo, long hi, int *out);
/* A finite number in [lo, hi] that a float holds. */
int kvm_arg_float(const char *cmd, const char *opt, const char *s, double lo, double hi, float *out);

/* Refuse positional arguments argv[first..argc) beyond the first `allowed`;
 * returns 1 when there are none too many. */
int kvm_args_at_most(const char *cmd, int argc, char **argv, int first, int allowed);

#endif
