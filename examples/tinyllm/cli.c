/* tinyllm's command-line helpers (cli.h). */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int tl_cli_int(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "tinyllm %s: %s '%s': expected an integer in %lld..%lld\n", cmd, opt, s,
                (long long)lo, (long long)hi);
        return 2;
    }
    *out = v;
    return 0;
}

int tl_cli_u64(const char *cmd, const char *opt, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    /* strtoull would take "-1" as 2^64 - 1: only digits are a seed */
    unsigned long long v = s[0] >= '0' && s[0] <= '9' ? strtoull(s, &end, 10) : 0;
    if (!(s[0] >= '0' && s[0] <= '9') || *end || errno) {
        fprintf(stderr, "tinyllm %s: %s '%s': expected an integer in 0..%llu\n", cmd, opt, s,
                (unsigned long long)UINT64_MAX);
        return 2;
    }
    *out = v;
    return 0;
}

int tl_cli_float(const char *cmd, const char *opt, const char *s, float lo, float hi, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "tinyllm %s: %s '%s': expected a number in %g..%g\n", cmd, opt, s, lo, hi);
        return 2;
    }
    *out = v;
    return 0;
}

int tl_cli_bad_option(const char *cmd, int argc, char **argv, int c, const char *usage) {
    /* getopt has just stepped past the option it could not take */
    const char *arg = optind > 0 && optind - 1 < argc ? argv[optind - 1] : "?";
    if (c == ':')
        fprintf(stderr, "tinyllm %s: option %s needs a value\n%s", cmd, arg, usage);
    else if (optopt && optopt != '?')
        fprintf(stderr, "tinyllm %s: unknown option -%c\n%s", cmd, optopt, usage);
    else
        fprintf(stderr, "tinyllm %s: unknown option %s\n%s", cmd, arg, usage);
    return 2;
}

int tl_cli_one_positional(const char *cmd, int argc, char **argv, const char *what, const char *usage,
                          const char **out) {
    if (optind >= argc) {
        fprintf(stderr, "tinyllm %s: %s is missing\n%s", cmd, what, usage);
        return 2;
    }
    if (argc - optind > 1) {
        fprintf(stderr, "tinyllm %s: unexpected argument '%s' (only one %s)\n%s", cmd, argv[optind + 1],
                what, usage);
        return 2;
    }
    *out = argv[optind];
    return 0;
}

int tl_cli_dir(const char *cmd, const char *opt, const char *dir, int write) {
    struct stat st;
    if (stat(dir, &st) != 0) {
        fprintf(stderr, "tinyllm %s: %s '%s': %s\n", cmd, opt, dir, strerror(errno));
        return 2;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "tinyllm %s: %s '%s': not a directory\n", cmd, opt, dir);
        return 2;
    }
    if (write && access(dir, W_OK | X_OK) != 0) {
        fprintf(stderr, "tinyllm %s: %s '%s': cannot write there: %s\n", cmd, opt, dir, strerror(errno));
        return 2;
    }
    return 0;
}
