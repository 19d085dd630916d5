/* kvmem inspect [--json] FILE: what an agent file holds (spec, dtype,
 * blocks, tensors, sizes, tokens, a text preview), whether its checksum
 * matches, and whether kvmem's strict loader accepts it (by loading it into a
 * pool built from the file's own spec). The header is read by the core's one
 * strict safetensors reader (core/format/safetensors.h), the metadata by
 * the agent-file format's own names, spec string and checksum rule
 * (core/format/agent_file.h); a file the reader refuses is still described
 * as far as its JSON parsed, with the reader's reason. */
#include "args.h"
#include "commands.h"
#include "kvmem.h"
#include "cpu/kernels.h"
#include "format/agent_file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The whole file is in memory already: any header length that fits it is
 * read (the loader, which validates, has its own limit). */
#define INSPECT_MAX_HEADER UINT64_MAX

/* s[0..n) as a JSON string, escaped as the agent files' own writer does. */
static void json_escape(FILE *f, const char *s, size_t n) {
    kvm_jbuf b = {0};
    kvm_jbuf_str(&b, s, n);
    if (b.oom) fputs("null", f);
    else fwrite(b.s, 1, b.n, f);
    kvm_jbuf_free(&b);
}

/* A metadata value for the human-readable output: as is, or escaped when it
 * holds control characters (a NUL would otherwise cut it short). */
static void show(const kvm_json *v, const char *none) {
    if (!v) {
        fputs(none, stdout);
        return;
    }
    for (size_t i = 0; i < v->len; i++)
        if ((unsigned char)v->str[i] < 0x20) {
            json_escape(stdout, v->str, v->len);
            return;
        }
    fwrite(v->str, 1, v->len, stdout);
}

static void json_str(const kvm_json *v) {
    if (v) json_escape(stdout, v->str, v->len);
    else printf("null");
}

/* Whether s[0..n) is a JSON number that a double holds as a finite value: it
 * is then printed as the file wrote it, so no digit is lost or added. */
static int json_number_ok(const char *s, size_t n) {
    size_t i = 0;
    if (i < n && s[i] == '-') i++;
    if (i < n && s[i] == '0') i++;
    else if (i < n && s[i] >= '1' && s[i] <= '9')
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    else return 0;
    if (i < n && s[i] == '.') {
        if (++i == n || s[i] < '0' || s[i] > '9') return 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        if (++i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i == n || s[i] < '0' || s[i] > '9') return 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i != n || n > 64) return 0;
    char buf[65];
    memcpy(buf, s, n);
    buf[n] = '\0';
    double d = strtod(buf, NULL);
    return d - d == 0; /* finite: 1e999 is a valid JSON number but no double */
}

/* Metadata values are strings in every safetensors file; --json gives the
 * numbers among them as numbers, and null where the string is not one. */
static void json_num(const char *s, size_t n) {
    if (json_number_ok(s, n)) fwrite(s, 1, n, stdout);
    else printf("null");
}

/* The model spec ("n_layers=32;...;layer_window=0,0,...") as an object of
 * kvmem_model_spec's fields: numbers (enums as their C values), layer_window
 * an array. null when a piece is not key=value. */
static void json_spec(const kvm_json *v) {
    const char *s = v->str, *end = v->str + v->len;
    int ok = 1;
    for (const char *p = s; p < end;) {
        const char *semi = memchr(p, ';', (size_t)(end - p)), *stop = semi ? semi : end;
        ok &= memchr(p, '=', (size_t)(stop - p)) != NULL;
        p = semi ? semi + 1 : end;
    }
    if (!ok) {
        printf("null");
        return;
    }
    putchar('{');
    for (const char *p = s; p < end;) {
        const char *semi = memchr(p, ';', (size_t)(end - p)), *stop = semi ? semi : end;
        const char *eq = memchr(p, '=', (size_t)(stop - p));
        printf("%s", p == s ? "" : ",");
        json_escape(stdout, p, (size_t)(eq - p));
        putchar(':');
        if ((size_t)(eq - p) == strlen("layer_window") && !memcmp(p, "layer_window", (size_t)(eq - p))) {
            putchar('[');
            for (const char *e = eq + 1; e < stop;) {
                const char *comma = memchr(e, ',', (size_t)(stop - e)), *to = comma ? comma : stop;
                printf("%s", e == eq + 1 ? "" : ",");
                json_num(e, (size_t)(to - e));
                e = comma ? comma + 1 : stop;
            }
            putchar(']');
        } else {
            json_num(eq + 1, (size_t)(stop - eq - 1));
        }
        p = semi ? semi + 1 : end;
    }
    putchar('}');
}

/* A failure before the file could be described: to stderr, and with --json
 * also as one object on stdout, so a script reading stdout always gets one. */
static int inspect_fail(int json, const char *path, const char *why) {
    fprintf(stderr, "kvmem inspect: '%s' %s\n", path, why);
    if (json) {
        printf("{\"file\":");
        json_escape(stdout, path, strlen(path));
        printf(",\"valid\":false,\"error\":");
        json_escape(stdout, why, strlen(why));
        printf("}\n");
    }
    return 1;
}

static const char *file_kind(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

/* Read a whole regular file. O_NONBLOCK: opening a FIFO (or some devices)
 * would otherwise block until a writer appears; fstat on the open
 * descriptor then refuses anything but a regular file before a byte is read
 * (regular files ignore O_NONBLOCK). */
static int read_regular(const char *path, unsigned char **out, size_t *size, struct stat *st, char *why, size_t why_size) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_size, "cannot be opened: %s", strerror(errno));
        return 0;
    }
    if (fstat(fd, st) != 0) {
        snprintf(why, why_size, "cannot be examined (fstat): %s", strerror(errno));
        close(fd);
        return 0;
    }
    if (!S_ISREG(st->st_mode)) {
        snprintf(why, why_size, "is %s, not a regular file: refused", file_kind(st->st_mode));
        close(fd);
        return 0;
    }
    if (st->st_size < 8) {
        snprintf(why, why_size, "is %lld bytes, shorter than the 8-byte header length that starts a safetensors file",
                 (long long)st->st_size);
        close(fd);
        return 0;
    }
    if ((uint64_t)st->st_size > SIZE_MAX) {
        snprintf(why, why_size, "is %lld bytes, more than this process can hold", (long long)st->st_size);
        close(fd);
        return 0;
    }
    size_t n = (size_t)st->st_size, got = 0;
    unsigned char *blob = malloc(n);
    if (!blob) {
        snprintf(why, why_size, "is %zu bytes: out of memory reading it", n);
        close(fd);
        return 0;
    }
    while (got < n) {
        ssize_t r = read(fd, blob + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r < 0) snprintf(why, why_size, "cannot be read: %s", strerror(errno));
            else snprintf(why, why_size, "shrank while being read (%zu of %zu bytes)", got, n);
            free(blob);
            close(fd);
            return 0;
        }
        got += (size_t)r;
    }
    close(fd);
    *out = blob;
    *size = n;
    return 1;
}

static int inspect_usage(FILE *f) {
    fprintf(f, "usage: kvmem inspect [--json] FILE\n"
               "  what an agent file holds, whether its checksum matches and whether kvmem's loader accepts it\n");
    return f == stdout ? 0 : KVM_EXIT_USAGE;
}

static int cmd_inspect(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    int json = 0;
    for (int c; (c = kvm_getopt("inspect", argc, argv, opts)) != -1;) {
        if (c == 'h') return inspect_usage(stdout);
        if (c != 'j') return KVM_EXIT_USAGE;
        json = 1;
    }
    if (optind == argc) {
        fprintf(stderr, "kvmem inspect: no FILE given\n");
        return inspect_usage(stderr);
    }
    if (!kvm_args_at_most("inspect", argc, argv, optind, 1)) return KVM_EXIT_USAGE;
    const char *path = argv[optind];

    unsigned char *blob;
    size_t sz;
    struct stat st;
    char why[512];
    if (!read_regular(path, &blob, &sz, &st, why, sizeof why)) return inspect_fail(json, path, why);
    uint64_t hl = 0;
    if (kvm_st_header_len(blob, sz, INSPECT_MAX_HEADER, &hl) != KVMEM_OK) {
        /* the reader's reason: it never repeats the 8 bytes it read */
        snprintf(why, sizeof why, "is not a valid safetensors file: %s", kvmem_last_error());
        free(blob);
        return inspect_fail(json, path, why);
    }
    kvm_st_rules rules = kvm_st_default_rules();
    rules.quote = 1; /* the user asked about this file */
    kvm_st_header hdr;
    kvmem_status vst = kvm_st_parse((const char *)blob + 8, (size_t)hl, (uint64_t)sz - 8 - hl, &rules, &hdr);
    if (vst != KVMEM_OK && !hdr.root) { /* not even a JSON object: nothing to describe */
        snprintf(why, sizeof why, "is not a valid safetensors file: %s", kvmem_last_error());
        kvm_st_header_free(&hdr);
        free(blob);
        return inspect_fail(json, path, why);
    }
    char vmsg[640] = "not a kvmem agent file";
    if (vst == KVMEM_OK) vst = kvm_st_check_layout(&hdr, &rules);
    if (vst != KVMEM_OK) snprintf(vmsg, sizeof vmsg, "%s", kvmem_last_error());
    const kvm_json_doc *dp = &hdr.doc;
    const kvm_json *root = hdr.root, *meta = hdr.meta;
    const kvm_json *meta_v[KVM_AF_N_KEYS];
    for (int k = 0; k < KVM_AF_N_KEYS; k++) meta_v[k] = kvm_st_meta(&hdr, kvm_af_keys[k]);
    const kvm_json *fmt = meta_v[KVM_AF_FORMAT], *ver = meta_v[KVM_AF_FORMAT_VERSION];
    const kvm_json *id = meta_v[KVM_AF_AGENT_ID], *model = meta_v[KVM_AF_MODEL_ID];
    const kvm_json *specs = meta_v[KVM_AF_MODEL_SPEC], *dt = meta_v[KVM_AF_STORAGE_DTYPE];
    const kvm_json *bs = meta_v[KVM_AF_BLOCK_SIZE], *nt = meta_v[KVM_AF_N_TOKENS];
    const kvm_json *blocks = meta_v[KVM_AF_BLOCK_TOKENS], *sum = meta_v[KVM_AF_CHECKSUM];
    const kvm_json *textv = meta_v[KVM_AF_TEXT];
    uint64_t data = (uint64_t)sz - 8 - hl;
    char computed[KVM_AF_CHECKSUM_LEN + 1]; /* the file's checksum rule, computed here, not by the loader */
    kvm_af_checksum_text(kvm_af_checksum(blob + 8 + hl, data, kvm_cpu_kernels_get()->acc64_stripes), computed);
    int sum_ok = sum && !strcmp(sum->str, computed);
    int n_blocks = blocks && *blocks->str ? 1 : 0;
    for (const char *c = blocks ? blocks->str : ""; *c; c++) n_blocks += *c == ',';

    if (vst != KVMEM_OK) {
        /* the reader's reason (a NUL in a name or a metadata string, a bad
         * entry, offsets that do not tile the data): described, not loaded */
    } else if (fmt && specs && dt && bs && id && model) {
        /* full validation: load into a pool made from the file's own spec */
        vst = KVMEM_ERR_FORMAT; /* until the load says otherwise */
        int32_t window[4096];
        kvmem_model_spec spec;
        struct stat now;
        spec = kvmem_model_spec_default();
        if (kvm_af_spec_read(specs->str, specs->len, &spec, window, 4096) != KVMEM_OK) {
            snprintf(vmsg, sizeof vmsg, "its model_spec cannot be read: %s", kvmem_last_error());
        } else if (stat(path, &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
            /* the loader opens the path again: it must still be this file */
            snprintf(vmsg, sizeof vmsg, "the file was replaced while being inspected");
        } else {
            snprintf(spec.model_id, sizeof spec.model_id, "%s", model->str);
            kvmem_context *ctx = NULL;
            kvmem_pool *pool = NULL;
            kvmem_agent *a = NULL;
            kvmem_pool_params pp = kvmem_pool_default_params();
            pp.block_size = atoi(bs->str);
            for (int d = 0; d <= 5; d++)
                if (!strcmp(kvmem_dtype_name((kvmem_dtype)d), dt->str)) pp.storage_dtype = (kvmem_dtype)d;
            if ((vst = kvmem_context_create(NULL, &ctx)) == KVMEM_OK && (vst = kvmem_pool_create(ctx, &spec, &pp, &pool)) == KVMEM_OK &&
                (vst = kvmem_agent_open(pool, id->str, &a)) == KVMEM_OK)
                vst = kvmem_agent_load(a, path);
            snprintf(vmsg, sizeof vmsg, "%s", vst == KVMEM_OK ? "ok" : kvmem_last_error());
            kvmem_agent_close(a);
            kvmem_pool_free(pool);
            kvmem_context_free(ctx);
        }
    } else {
        vst = KVMEM_ERR_FORMAT; /* a safetensors file, but not an agent file: vmsg says so */
    }
    size_t preview = textv ? (textv->len < 160 ? textv->len : 160) : 0;
    if (json) {
        printf("{\"file\":");
        json_escape(stdout, path, strlen(path));
        printf(",\"bytes\":%zu,\"header_bytes\":%" PRIu64 ",\"data_bytes\":%" PRIu64, sz, hl, data);
        static const kvm_af_key shown[] = {KVM_AF_FORMAT,        KVM_AF_FORMAT_VERSION, KVM_AF_AGENT_ID,
                                           KVM_AF_MODEL_ID,      KVM_AF_MODEL_SPEC,     KVM_AF_STORAGE_DTYPE,
                                           KVM_AF_BLOCK_SIZE,    KVM_AF_N_TOKENS,       KVM_AF_CHECKSUM};
        for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++) {
            const kvm_json *v = meta_v[shown[i]];
            printf(",\"%s\":", kvm_af_keys[shown[i]]);
            if (!v) printf("null");
            else if (shown[i] == KVM_AF_MODEL_SPEC) json_spec(v);
            else if (shown[i] == KVM_AF_FORMAT_VERSION || shown[i] == KVM_AF_BLOCK_SIZE || shown[i] == KVM_AF_N_TOKENS)
                json_num(v->str, v->len);
            else json_str(v);
        }
        printf(",\"n_blocks\":%d,\"checksum_ok\":%s,\"valid\":%s,\"validation\":", n_blocks, sum_ok ? "true" : "false",
               vst == KVMEM_OK ? "true" : "false");
        json_escape(stdout, vmsg, strlen(vmsg));
        printf(",\"text_preview\":");
        if (textv) json_escape(stdout, textv->str, preview);
        else printf("null");
        printf(",\"tensors\":[");
        int first = 1;
        for (const kvm_json *c = kvm_json_child(dp, root); c; c = kvm_json_next(dp, c)) {
            if (c == meta) continue;
            const kvm_json *tdt = kvm_json_get(dp, c, "dtype"), *sh = kvm_json_get(dp, c, "shape"), *of = kvm_json_get(dp, c, "data_offsets");
            printf("%s{\"name\":", first ? "" : ",");
            json_escape(stdout, c->key, c->key_len);
            printf(",\"dtype\":");
            if (tdt && tdt->type == KVM_JSON_STRING) json_escape(stdout, tdt->str, tdt->len);
            else printf("null");
            printf(",\"shape\":[");
            if (sh && sh->type == KVM_JSON_ARRAY)
                for (const kvm_json *e = kvm_json_child(dp, sh); e; e = kvm_json_next(dp, e))
                    printf("%s%lld", e == kvm_json_child(dp, sh) ? "" : ",", (long long)e->i);
            long long nb = -1;
            if (of && of->type == KVM_JSON_ARRAY && of->n == 2) nb = kvm_json_next(dp, kvm_json_child(dp, of))->i - kvm_json_child(dp, of)->i;
            printf("],\"bytes\":%lld}", nb);
            first = 0;
        }
        printf("]}\n");
    } else {
        printf("file:       %s (%zu bytes: header %" PRIu64 ", data %" PRIu64 ")\n", path, sz, hl, data);
        printf("format:     ");
        show(fmt, "(none: not a kvmem agent file)");
        printf(" version ");
        show(ver, "?");
        printf("\nagent:      ");
        show(id, "?");
        printf("\nmodel:      ");
        show(model, "?");
        printf("\nspec:       ");
        show(specs, "?");
        printf("\nstorage:    ");
        show(dt, "?");
        printf(", block size ");
        show(bs, "?");
        printf(", ");
        show(nt, "?");
        printf(" tokens, %d sealed blocks\n", n_blocks);
        printf("checksum:   ");
        show(sum, "(none)");
        printf(" (%s)\n", sum_ok ? "matches the data" : "MISMATCH");
        printf("validation: %s\n", vmsg);
        if (textv) {
            printf("text:       ");
            json_escape(stdout, textv->str, preview);
            printf("%s (%zu bytes)\n", textv->len > preview ? "..." : "", textv->len);
        }
        printf("tensors:\n");
        for (const kvm_json *c = kvm_json_child(dp, root); c; c = kvm_json_next(dp, c)) {
            if (c == meta) continue;
            const kvm_json *tdt = kvm_json_get(dp, c, "dtype"), *sh = kvm_json_get(dp, c, "shape");
            printf("  %-24.*s %-5s [", (int)c->key_len, c->key, tdt && tdt->type == KVM_JSON_STRING ? tdt->str : "?");
            if (sh && sh->type == KVM_JSON_ARRAY)
                for (const kvm_json *e = kvm_json_child(dp, sh); e; e = kvm_json_next(dp, e))
                    printf("%s%lld", e == kvm_json_child(dp, sh) ? "" : ", ", (long long)e->i);
            printf("]\n");
        }
    }
    kvm_st_header_free(&hdr);
    free(blob);
    return vst == KVMEM_OK ? 0 : 1;
}

const kvm_command kvm_cmd_inspect = {"inspect", "[--json] FILE: what an agent file holds, checksum and validation", cmd_inspect};
