#include "demo_script.h"
#include "synth.h"

#include <stdio.h>


const char *const kvm_demo_topic_name[KVM_DEMO_TOPICS] = {
    "trip to Lisbon", "quarterly budget", "sourdough recipe", "car repair",   "birthday gift ideas",
    "a Python bug",   "garden plan",      "job interview",    "system prompt",
};

#define SYS KVM_DEMO_SYSTEM_TOPIC
const kvm_demo_agent kvm_demo_agents[] = {
    {"alice", 0,
     {{SYS, 32, 0}, {0, 120, 0}, {1, 96, 0}, {2, 80, 0}, {3, 140, 0}, {4, 64, 0}, {1, 12, 1}, {5, 110, 0},
      {3, 10, 1}, {0, 14, 1}},
     10},
    {"bob", 1,
     {{SYS, 32, 0}, {6, 150, 0}, {7, 90, 0}, {5, 70, 0}, {2, 60, 0}, {6, 16, 1}, {4, 100, 0}, {7, 12, 1},
      {5, 9, 1}},
     9},
};
const int kvm_demo_n_agents = (int)(sizeof kvm_demo_agents / sizeof kvm_demo_agents[0]);

kvmem_model_spec kvm_demo_spec(void) {
    kvmem_model_spec spec = kvmem_model_spec_default();
    spec.n_layers = 8;
    spec.n_q_heads = 8;
    spec.n_kv_heads = 2;
    spec.head_dim = 64;
    spec.rope_theta = 10000.0;
    snprintf(spec.model_id, sizeof spec.model_id, "synthetic-8L-8q2kv-64");
    return spec;
}

kvmem_status kvm_demo_add_turn(kvmem_agent *ag, const kvmem_model_spec *spec, const kvm_synth *syn, int topic, int T,
                               int rotated, int32_t at, uint64_t *rng, float *k, float *v, int32_t *pos) {
    kvm_synth_tokens(syn, topic, T, rng, k, v);
    kvmem_append_params ap = kvmem_append_default_params();
    const size_t HD = (size_t)spec->n_kv_heads * (size_t)spec->head_dim;
    if (rotated) {
        for (int32_t i = 0; i < T * spec->n_kv_heads; i++) pos[i] = at + i / spec->n_kv_heads;
        for (int32_t l = 0; l < spec->n_layers; l++) {
            kvmem_status st = kvmem_rope_apply(spec, k + (size_t)l * (size_t)T * HD, (size_t)T * (size_t)spec->n_kv_heads,
                                               (size_t)spec->head_dim, pos, 0);
            if (st != KVMEM_OK) return st;
        }
        for (int32_t i = 0; i < T; i++) pos[i] = at + i;
        ap.positions = pos;
        ap.keys_rotated = 1;
    }
    int64_t shape[4] = {spec->n_layers, T, spec->n_kv_heads, spec->head_dim};
    kvmem_tensor kt, vt;
    kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape);
    kvmem_status st = kvmem_agent_append(ag, &kt, &vt, &ap);
    /* each turn ends in a flush, so its last partial block is retrievable */
    return st == KVMEM_OK ? kvmem_agent_flush(ag) : st;
}
