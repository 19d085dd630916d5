/* The scripted session of `kvmem demo` (synth/demo_script.c) as JSON, so
 * the browser demo replays exactly the turns the native demo runs. */
#include "glue.h"

#include "demo_script.h"

#include <stdio.h>

static char g_script[4096];

const char *kvmw_demo_script(void) {
    if (g_script[0]) return g_script;
    const kvmem_model_spec spec = kvm_demo_spec();
    size_t n = 0, cap = sizeof g_script;
#define PUT(...) n += (size_t)snprintf(g_script + n, n < cap ? cap - n : 0, __VA_ARGS__)
    PUT("{\"model\":{\"id\":\"%s\",\"nLayers\":%d,\"nQHeads\":%d,\"nKvHeads\":%d,\"headDim\":%d,\"ropeTheta\":%.17g},",
        spec.model_id, spec.n_layers, spec.n_q_heads, spec.n_kv_heads, spec.head_dim, spec.rope_theta);
    PUT("\"topK\":%d,\"answerTokens\":%d,\"systemTopic\":%d,\"topics\":[", KVM_DEMO_TOP_K, KVM_DEMO_ANSWER_TOKENS,
        KVM_DEMO_SYSTEM_TOPIC);
    for (int t = 0; t < KVM_DEMO_TOPICS; t++) PUT("%s\"%s\"", t ? "," : "", kvm_demo_topic_name[t]);
    PUT("],\"agents\":[");
    for (int a = 0; a < kvm_demo_n_agents; a++) {
        const kvm_demo_agent *da = &kvm_demo_agents[a];
        PUT("%s{\"id\":\"%s\",\"rotated\":%s,\"steps\":[", a ? "," : "", da->id, da->rotated ? "true" : "false");
        for (int i = 0; i < da->n_steps; i++)
            PUT("%s{\"topic\":%d,\"tokens\":%d,\"ask\":%s}", i ? "," : "", da->steps[i].topic, da->steps[i].tokens,
                da->steps[i].ask ? "true" : "false");
        PUT("]}");
    }
    PUT("]}");
#undef PUT
    if (n >= cap) g_script[0] = '\0'; /* cannot happen with the fixed script; "" tells JS */
    return g_script;
}
