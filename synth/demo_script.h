/* The scripted session of `kvmem demo`: two agents, their turns and the
 * questions they ask, and the model they run. Shared by the native demo
 * (tools/demo.c, tools/demo_view.c) and the browser demo (the wasm module
 * exports it as JSON, wasm/demo/demo.js replays it), so both build the same
 * memory from the same generator and seed. */
#ifndef KVMEM_DEMO_SCRIPT_H
#define KVMEM_DEMO_SCRIPT_H

#include "kvmem.h"

#define KVM_DEMO_TOPICS 9
#define KVM_DEMO_SYSTEM_TOPIC 8
#define KVM_DEMO_TOP_K 8
#define KVM_DEMO_MAX_STEPS 12
#define KVM_DEMO_ANSWER_TOKENS 48 /* an answer's tokens join the memory after each question */

/* A turn that adds memory (ask = 0) or a question about an earlier topic
 * (ask = 1: retrieve first, then the question and its answer join the
 * memory too). */
typedef struct kvm_demo_step {
    int topic, tokens, ask;
} kvm_demo_step;

typedef struct kvm_demo_agent {
    const char *id;
    int rotated; /* the engine hands post-RoPE keys with positions (kvmem de-rotates them) */
    kvm_demo_step steps[KVM_DEMO_MAX_STEPS];
    int n_steps;
} kvm_demo_agent;

extern const char *const kvm_demo_topic_name[KVM_DEMO_TOPICS];
extern const kvm_demo_agent kvm_demo_agents[];
extern const int kvm_demo_n_agents;

/* The demo's model geometry. */
kvmem_model_spec kvm_demo_spec(void);

struct kvm_synth;
/* Append T tokens of `topic` to the agent as the engine would after a turn,
 * then flush (so the turn's last partial block is retrievable). Rotated
 * agents hand keys post-RoPE at positions at..at+T-1. k, v: scratch of
 * T * n_layers * n_kv_heads * head_dim floats; pos: T * n_kv_heads ints. */
kvmem_status kvm_demo_add_turn(kvmem_agent *ag, const kvmem_model_spec *spec, const struct kvm_synth *syn, int topic,
                               int T, int rotated, int32_t at, uint64_t *rng, float *k, float *v, int32_t *pos);

#endif
