/* The agent-file format module on its own (core/format/agent_file.h), no
 * pool: the spec string read back field for field and refused when it is
 * not exactly what the writer writes; a header built for a plan that the
 * strict reader accepts, whose metadata names are the format's table, whose
 * data section starts aligned as the format promises, and whose checksum
 * digits land where kvm_af_header_set_checksum writes them; the checksum
 * of a data section equals the rule computed here from the XXH64 and acc64
 * primitives chunk by chunk. */
#include "testutil.h"
#include "format/agent_file.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvmem_model_spec odd_spec(int32_t *window) {
    kvmem_model_spec s = kvmem_model_spec_default();
    s.n_layers = 3;
    s.n_q_heads = 8;
    s.n_kv_heads = 2;
    s.head_dim = 96;
    s.rotary_dim = 32;
    s.rope_style = KVMEM_ROPE_GPTJ;
    s.rope_theta = 500000.123456789;
    s.rope_scaling = KVMEM_ROPE_SCALING_YARN;
    s.rope_factor = 1.0 / 3.0 * 12;
    s.rope_low_freq_factor = 0.1;
    s.rope_high_freq_factor = 1e-300;
    s.rope_original_max_pos = 131072;
    s.yarn_beta_fast = 32.5;
    s.yarn_beta_slow = -0.0;
    s.yarn_attn_factor = 0.7071067811865476;
    window[0] = 0, window[1] = 4096, window[2] = 7;
    s.layer_window = window;
    return s;
}

static void spec_string_reads_back_every_field_exactly(void **state) {
    (void)state;
    int32_t win[3], back_win[8];
    const kvmem_model_spec s = odd_spec(win);
    kvm_jbuf b = {0};
    kvm_af_spec_write(&s, &b);
    assert_false(b.oom);
    kvmem_model_spec r = kvmem_model_spec_default();
    assert_ok(kvm_af_spec_read(b.s, b.n, &r, back_win, 8));
    assert_int_equal(r.n_layers, 3);
    assert_int_equal(r.n_q_heads, 8);
    assert_int_equal(r.n_kv_heads, 2);
    assert_int_equal(r.head_dim, 96);
    assert_int_equal(r.rotary_dim, 32);
    assert_int_equal(r.rope_style, KVMEM_ROPE_GPTJ);
    assert_int_equal(r.rope_scaling, KVMEM_ROPE_SCALING_YARN);
    assert_int_equal(r.rope_original_max_pos, 131072);
    /* %.17g: every double comes back bit for bit */
    assert_memory_equal(&r.rope_theta, &s.rope_theta, sizeof(double));
    assert_memory_equal(&r.rope_factor, &s.rope_factor, sizeof(double));
    assert_memory_equal(&r.rope_low_freq_factor, &s.rope_low_freq_factor, sizeof(double));
    assert_memory_equal(&r.rope_high_freq_factor, &s.rope_high_freq_factor, sizeof(double));
    assert_memory_equal(&r.yarn_beta_fast, &s.yarn_beta_fast, sizeof(double));
    assert_true(r.yarn_beta_slow == 0.0 && signbit(r.yarn_beta_slow));
    assert_memory_equal(&r.yarn_attn_factor, &s.yarn_attn_factor, sizeof(double));
    assert_ptr_equal(r.layer_window, back_win);
    assert_int_equal(back_win[0], 0);
    assert_int_equal(back_win[1], 4096);
    assert_int_equal(back_win[2], 7);
    /* written again, the same string */
    kvm_jbuf b2 = {0};
    kvm_af_spec_write(&r, &b2);
    assert_int_equal(b2.n, b.n);
    assert_memory_equal(b2.s, b.s, b.n);
    kvm_jbuf_free(&b2);
    /* all-zero windows read back as none; rotary_dim 0 is written as head_dim */
    kvmem_model_spec z = kvmem_model_spec_default();
    z.n_layers = 2;
    z.rotary_dim = 0;
    kvm_jbuf bz = {0};
    kvm_af_spec_write(&z, &bz);
    assert_non_null(strstr(bz.s, "rotary_dim=64;"));
    assert_ok(kvm_af_spec_read(bz.s, bz.n, &r, back_win, 8));
    assert_null(r.layer_window);
    assert_int_equal(r.rotary_dim, 64);
    kvm_jbuf_free(&bz);
    kvm_jbuf_free(&b);
}

static void spec_string_that_is_not_the_writers_is_refused(void **state) {
    (void)state;
    int32_t win[3], back[8];
    const kvmem_model_spec s = odd_spec(win);
    kvm_jbuf b = {0};
    kvm_af_spec_write(&s, &b);
    const char *good = b.s;
    char bad[1024];
    kvmem_model_spec r = kvmem_model_spec_default();
    /* a field out of order */
    snprintf(bad, sizeof bad, "n_q_heads=8;n_layers=3;%s", strstr(good, "n_kv_heads="));
    assert_status(kvm_af_spec_read(bad, strlen(bad), &r, back, 8), KVMEM_ERR_FORMAT, "'n_layers=' expected");
    /* a window missing, one too many, text after them */
    snprintf(bad, sizeof bad, "%.*s0,4096", (int)(strstr(good, "layer_window=") - good + 13), good);
    assert_status(kvm_af_spec_read(bad, strlen(bad), &r, back, 8), KVMEM_ERR_FORMAT, "must list 3 windows");
    snprintf(bad, sizeof bad, "%s,9", good);
    assert_status(kvm_af_spec_read(bad, strlen(bad), &r, back, 8), KVMEM_ERR_FORMAT, "must list 3 windows");
    snprintf(bad, sizeof bad, "%s;x=1", good);
    assert_status(kvm_af_spec_read(bad, strlen(bad), &r, back, 8), KVMEM_ERR_FORMAT, "text after layer_window");
    /* not numbers; more layers than the caller has room for; cut short */
    snprintf(bad, sizeof bad, "n_layers=3x;%s", strstr(good, "n_q_heads="));
    assert_status(kvm_af_spec_read(bad, strlen(bad), &r, back, 8), KVMEM_ERR_FORMAT, "'n_layers' is not an integer");
    char *theta = strstr(good, "rope_theta=");
    snprintf(bad, sizeof bad, "%.*srope_theta=1e5z%s", (int)(theta - good), good, strchr(theta, ';'));
    assert_status(kvm_af_spec_read(bad, strlen(bad), &r, back, 8), KVMEM_ERR_FORMAT, "'rope_theta' is not a number");
    assert_status(kvm_af_spec_read(good, b.n, &r, back, 2), KVMEM_ERR_FORMAT, "n_layers 3 outside [1, 2]");
    assert_status(kvm_af_spec_read(good, 40, &r, back, 8), KVMEM_ERR_FORMAT, "model spec string");
    /* r untouched by every refusal */
    assert_int_equal(r.n_layers, kvmem_model_spec_default().n_layers);
    kvm_jbuf_free(&b);
}

static void header_is_what_the_strict_reader_takes(void **state) {
    (void)state;
    int32_t win[3];
    kvmem_model_spec s = odd_spec(win);
    snprintf(s.model_id, sizeof s.model_id, "m\"odel\n");
    const kvm_af_geom g = {3, 2, 96, 16, KVMEM_Q4, 2};
    const int32_t blocks[2] = {16, 9};
    const int32_t ids[30] = {1, 2, 3};
    int64_t offs[30];
    for (int i = 0; i < 30; i++) offs[i] = i < 12 ? i : -1;
    static const char binary[] = "bytes \xff\x00 not utf-8";
    for (int textual = 0; textual < 2; textual++) {
        kvm_af_plan pl;
        assert_ok(kvm_af_plan_build(&g, KVM_AF_VERSION, 2, 25, 5, &pl));
        const uint64_t data = kvm_af_plan_lay_out(&pl);
        const char *text = textual ? "plain \"text\"\twith escapes" : binary;
        const size_t text_len = textual ? strlen(text) : sizeof binary - 1;
        const kvm_af_meta m = {"agent.1", &s, KVMEM_Q4, 16, 30, 2, blocks, sizeof blocks[0], ids, offs, text, text_len};
        kvm_af_header h;
        assert_ok(kvm_af_header_build(&m, &pl, 0, &h));
        kvm_af_header_set_checksum(&h, 0x0123456789abcdefull);
        const unsigned char *hb = kvm_af_header_bytes(&h);
        const size_t hn = kvm_af_header_size(&h);
        uint64_t len = 0;
        for (int i = 7; i >= 0; i--) len = len << 8 | hb[i];
        assert_int_equal(len + 8, hn);
        assert_int_equal(hn % 8, 0); /* the data section starts 8-byte aligned */
        /* the reader takes the header with a data section of the planned size */
        kvm_st_rules rules = kvm_af_rules();
        kvm_st_header sh;
        assert_ok(kvm_st_parse((const char *)hb + 8, (size_t)len, data, &rules, &sh));
        assert_ok(kvm_st_check_layout(&sh, &rules));
        assert_int_equal(sh.n_tensors, pl.n);
        /* every metadata member is one of the format's names, each once */
        int n_meta = 0;
        for (const kvm_json *c = kvm_json_child(&sh.doc, sh.meta); c; c = kvm_json_next(&sh.doc, c), n_meta++) {
            int known = 0;
            for (int k = 0; k < KVM_AF_N_KEYS; k++) known |= c->key_len == strlen(kvm_af_keys[k]) && !memcmp(c->key, kvm_af_keys[k], c->key_len);
            if (!known) fail_msg("metadata key '%s' is not in kvm_af_keys", c->key);
        }
        assert_int_equal(n_meta, KVM_AF_N_KEYS - 1); /* text or text_hex */
        assert_non_null(kvm_st_meta(&sh, textual ? "text" : "text_hex"));
        assert_string_equal(kvm_st_meta(&sh, "checksum")->str, "acc64-1m:0123456789abcdef");
        assert_string_equal(kvm_st_meta(&sh, "model_id")->str, "m\"odel\n");
        /* and the metadata reader takes it back against the same settings */
        const kvm_af_expect want = {&s, KVMEM_Q4, 16, 0, "agent.1"};
        kvm_af_info info;
        assert_ok(kvm_af_check_meta(&sh, &want, &info));
        assert_int_equal(info.version, KVM_AF_VERSION);
        assert_int_equal(info.n_tokens, 30);
        assert_true(info.checksum == 0x0123456789abcdefull);
        int32_t *lens = NULL;
        int64_t n_sealed = 0, tail_n = 0;
        assert_ok(kvm_af_block_lengths(&sh, 16, 30, &lens, &n_sealed, &tail_n));
        assert_int_equal(n_sealed, 2);
        assert_int_equal(tail_n, 5);
        assert_int_equal(lens[0], 16);
        assert_int_equal(lens[1], 9);
        kvm_free(lens);
        size_t tl = 0;
        assert_ok(kvm_af_text_len(&sh, &tl));
        assert_int_equal(tl, text_len);
        char back[64];
        assert_ok(kvm_af_text(&sh, back, tl));
        assert_memory_equal(back, text, tl);
        int64_t offs_back[30];
        assert_ok(kvm_af_token_offsets(&sh, 30, tl, offs_back));
        assert_memory_equal(offs_back, offs, sizeof offs);
        kvm_st_header_free(&sh);
        kvm_af_header_free(&h);
        kvm_af_plan_free(&pl);
    }
}

static void checksum_is_xxh64_over_the_chunks_acc64_digests(void **state) {
    (void)state;
    const size_t n = (size_t)(2 * KVM_AF_CHUNK + 12345);
    unsigned char *d = malloc(n);
    uint64_t rng = 99;
    for (size_t i = 0; i < n; i++) d[i] = (unsigned char)tu_next(&rng);
    /* the rule written out: each 1 MiB chunk's digest, 8 bytes little-endian */
    unsigned char le[24];
    for (int c = 0; c < 3; c++) {
        size_t b = (size_t)c * KVM_AF_CHUNK, e = b + KVM_AF_CHUNK < n ? b + KVM_AF_CHUNK : n;
        uint64_t dig = kvm_acc64(d + b, e - b);
        for (int k = 0; k < 8; k++) le[c * 8 + k] = (unsigned char)(dig >> (8 * k));
    }
    const uint64_t want = kvm_xxh64_once(le, sizeof le, 0);
    assert_true(kvm_af_checksum(d, n, NULL) == want);
    char text[KVM_AF_CHECKSUM_LEN + 1];
    kvm_af_checksum_text(want, text);
    assert_int_equal(strlen(text), KVM_AF_CHECKSUM_LEN);
    assert_memory_equal(text, "acc64-1m:", 9);
    free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(spec_string_reads_back_every_field_exactly),
        cmocka_unit_test(spec_string_that_is_not_the_writers_is_refused),
        cmocka_unit_test(header_is_what_the_strict_reader_takes),
        cmocka_unit_test(checksum_is_xxh64_over_the_chunks_acc64_digests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
