/* tinyllm's command-line helpers: every argument is checked whole, and a
 * bad one is named in the message (stderr). Each returns 0, or 2 (the usage
 * exit status) having printed why. */
#ifndef TINYLLM_CLI_H
#define TINYLLM_CLI_H

#include <stdint.h>

int tl_cli_int(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
int tl_cli_u64(const char *cmd, const char *opt, const char *s, uint64_t *out);
int tl_cli_float(const char *cmd, const char *opt, const char *s, float lo, float hi, float *out);
/* After getopt_long returned '?' or ':' (optstring starting with ':'). */
int tl_cli_bad_option(const char *cmd, int argc, char **argv, int c, const char *usage);
/* Exactly one positional argument left after getopt_long (argv[optind]). */
int tl_cli_one_positional(const char *cmd, int argc, char **argv, const char *what, const char *usage,
                          const char **out);
/* dir names an existing directory (writable too when `write`). */
int tl_cli_dir(const char *cmd, const char *opt, const char *dir, int write);

#endif
