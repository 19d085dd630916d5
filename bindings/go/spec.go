package kvmem

/*
#include <string.h>
#include <kvmem.h>

// The growable spec (kvmem_model_spec_v2) where the loaded library has it: a
// weak reference is NULL against an older libkvmem of the same SONAME, whose
// callers get the frozen calls (the same fields, the same meaning).
#pragma weak kvmem_model_spec_v2_init

// 1 and *v = s as the growable spec (the library's defaults of this
// binding's struct size, then every field of s); 0 where the library has
// only the frozen spec. The other preambles declare it.
int kvgo_spec_v2(const kvmem_model_spec *s, kvmem_model_spec_v2 *v) {
	if (!kvmem_model_spec_v2_init || kvmem_model_spec_v2_init(v, sizeof *v) != KVMEM_OK) return 0;
	v->layer_window = s->layer_window;
	v->n_layers = s->n_layers, v->n_q_heads = s->n_q_heads, v->n_kv_heads = s->n_kv_heads;
	v->head_dim = s->head_dim, v->rotary_dim = s->rotary_dim, v->rope_style = s->rope_style;
	v->rope_scaling = s->rope_scaling, v->rope_original_max_pos = s->rope_original_max_pos;
	v->rope_theta = s->rope_theta, v->rope_factor = s->rope_factor;
	v->rope_low_freq_factor = s->rope_low_freq_factor, v->rope_high_freq_factor = s->rope_high_freq_factor;
	v->yarn_beta_fast = s->yarn_beta_fast, v->yarn_beta_slow = s->yarn_beta_slow;
	v->yarn_attn_factor = s->yarn_attn_factor;
	memcpy(v->model_id, s->model_id, sizeof v->model_id);
	return 1;
}

// The growable spec's fields in the frozen struct (kvmem_pool_get_spec_v2's output).
void kvgo_spec_of_v2(const kvmem_model_spec_v2 *v, kvmem_model_spec *s) {
	memset(s, 0, sizeof *s);
	s->layer_window = v->layer_window;
	s->n_layers = v->n_layers, s->n_q_heads = v->n_q_heads, s->n_kv_heads = v->n_kv_heads;
	s->head_dim = v->head_dim, s->rotary_dim = v->rotary_dim, s->rope_style = v->rope_style;
	s->rope_scaling = v->rope_scaling, s->rope_original_max_pos = v->rope_original_max_pos;
	s->rope_theta = v->rope_theta, s->rope_factor = v->rope_factor;
	s->rope_low_freq_factor = v->rope_low_freq_factor, s->rope_high_freq_factor = v->rope_high_freq_factor;
	s->yarn_beta_fast = v->yarn_beta_fast, s->yarn_beta_slow = v->yarn_beta_slow;
	s->yarn_attn_factor = v->yarn_attn_factor;
	memcpy(s->model_id, v->model_id, sizeof s->model_id);
}

static int kvgo_have_spec_v2(void) { return kvmem_model_spec_v2_init != NULL; }
*/
import "C"

// SpecV2 reports whether the loaded library has kvmem_model_spec_v2, the
// spec that grows; the binding passes every spec through it where it does.
func SpecV2() bool { return C.kvgo_have_spec_v2() != 0 }
