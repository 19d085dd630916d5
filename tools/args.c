#include "args.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kvm_getopt(const char *cmd, int argc, char **argv, const struct option *opts) {
    opterr = 0; /* libc would print "argv[0]: ..." (the command name only): say it ourselves */
    int c = getopt_long(argc, argv, ":h", opts, NULL);
    if (c != ':' && c != '?') return c;
    const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "";
    if (c == ':') {
        const char *name = NULL;
        for (const struct option *o = opts; o->name; o++)
            if (o->val == optopt) name = o->name;
        if (name) fprintf(stderr, "kvmem %s: option '--%s' needs a value\n", cmd, name);
        else fprintf(stderr, "kvmem %s: option '%s' needs a value\n", cmd, arg);
    } else if (strncmp(arg, "--", 2) == 0 && optopt != 0 && strchr(arg, '=')) {
        fprintf(stderr, "kvmem %s: option '%.*s' takes no value\n", cmd, (int)(strchr(arg, '=') - arg), arg);
    } else if (strncmp(arg, "--", 2) == 0) {
        fprintf(stderr, "kvmem %s: unknown or ambiguous option '%s' (kvmem %s --help lists them)\n", cmd, arg, cmd);
    } else {
        fprintf(stderr, "kvmem %s: unknown option '-%c' (kvmem %s --help lists them)\n", cmd, isprint(optopt) ? optopt : '?', cmd);
    }
    return '?';
}

/* Only ASCII digits, at least one: strtoull would take "-1" (as 2^64 - 1),
 * " 7" and "+7". */
static int all_digits(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}

int kvm_arg_u64(const char *cmd, const char *opt, const char *s, uint64_t *out) {
    if (!all_digits(s)) {
        fprintf(stderr, "kvmem %s: %s: '%s' is not a non-negative decimal integer\n", cmd, opt, s);
        return 0;
    }
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno == ERANGE || v > UINT64_MAX) {
        fprintf(stderr, "kvmem %s: %s: '%s' is larger than %llu\n", cmd, opt, s, (unsigned long long)UINT64_MAX);
        return 0;
    }
    *out = (uint64_t)v;
    return 1;
}

int kvm_arg_int(const char *cmd, const char *opt, const char *s, long lo, long hi, int *out) {
    const char *digits = s[0] == '-' ? s + 1 : s;
    long v = 0;
    int ok = all_digits(digits);
    if (ok) {
        errno = 0;
        v = strtol(s, NULL, 10);
        ok = errno != ERANGE && v >= lo && v <= hi;
    }
    if (!ok) {
        fprintf(stderr, "kvmem %s: %s: '%s' is not an integer in [%ld, %ld]\n", cmd, opt, s, lo, hi);
        return 0;
    }
    *out = (int)v;
    return 1;
}

int kvm_arg_float(const char *cmd, const char *opt, const char *s, double lo, double hi, float *out) {
    char *end = NULL;
    errno = 0;
    double v = *s && !isspace((unsigned char)*s) ? strtod(s, &end) : NAN;
    /* errno ERANGE also flags underflow to 0 or a denormal: refuse it too,
     * the value would not be the one written */
    if (!end || *end || errno == ERANGE || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "kvmem %s: %s: '%s' is not a number in [%g, %g]\n", cmd, opt, s, lo, hi);
        return 0;
    }
    *out = (float)v;
    return 1;
}

int kvm_args_at_most(const char *cmd, int argc, char **argv, int first, int allowed) {
    if (argc - first <= allowed) return 1;
    if (allowed == 0) fprintf(stderr, "kvmem %s: takes no arguments, got '%s'\n", cmd, argv[first]);
    else fprintf(stderr, "kvmem %s: unexpected argument '%s'\n", cmd, argv[first + allowed]);
    return 0;
}
