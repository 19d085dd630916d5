package kvmem

/*
#include <string.h>
#include <kvmem.h>

// The growable spec (kvmem_model_spec_v2) where the loaded library has it: a
// weak reference is NULL against an older libkvmem of the same SONAME, whose
// callers get the frozen calls (the same fields, the same meaning).
#pragma weak kvmem_model_spec_v2_init

// The fields the frozen and the growable spec share, listed once.
#define KVGO_SPEC_FIELDS(X) X(layer_window) X(n_layers) X(n_q_heads) X(n_kv_heads) X(head_dim) X(rotary_dim) \
	X(rope_style) X(rope_scaling) X(rope_original_max_pos) X(rope_theta) X(rope_factor) X(rope_low_freq_factor) \
	X(rope_high_freq_factor) X(yarn_beta_fast) X(yarn_beta_slow) X(yarn_attn_factor)
#define KVGO_COPY(f) to->f = from->f;

// 1 and *v = s as the growable spec (the library's defaults of this
// binding's struct size, then every field of s); 0 where the library has
// only the frozen spec. The other preambles declare it.
int kvgo_spec_v2(const kvmem_model_spec *s, kvmem_model_spec_v2 *v) {
	if (!kvmem_model_spec_v2_init || kvmem_model_spec_v2_init(v, sizeof *v) != KVMEM_OK) return 0;
	const kvmem_model_spec *from = s;
	kvmem_model_spec_v2 *to = v;
	KVGO_SPEC_FIELDS(KVGO_COPY)
	memcpy(v->model_id, s->model_id, sizeof v->model_id);
	return 1;
}

// The growable spec's fields in the frozen struct (kvmem_pool_get_spec_v2's output).
void kvgo_spec_of_v2(const kvmem_model_spec_v2 *v, kvmem_model_spec *s) {
	memset(s, 0, sizeof *s);
	const kvmem_model_spec_v2 *from = v;
	kvmem_model_spec *to = s;
	KVGO_SPEC_FIELDS(KVGO_COPY)
	memcpy(s->model_id, v->model_id, sizeof s->model_id);
}

static int kvgo_have_spec_v2(void) { return kvmem_model_spec_v2_init != NULL; }
*/
import "C"

// SpecV2 reports whether the loaded library has kvmem_model_spec_v2, the
// spec that grows; the binding passes every spec through it where it does.
func SpecV2() bool { return C.kvgo_have_spec_v2() != 0 }
