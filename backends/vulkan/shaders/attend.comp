#version 450
// attend: one decode row of ART attention (core/backend/backend.h, dev_attend; the
// rule of include/kvmem.h, "ART attention"; kvm_attend_cpu is the reference).
// One workgroup per stream = KV head g and its G query heads. Tiles are
// visited in `order`, one step per chunk of C = 128 / G positions of a tile:
//   1. invocation (c, h) scores position c of the chunk for query head h
//      (dead slots: -inf, their K and V are never read);
//   2. per-head max and sum over the chunk (tree reductions in shared
//      memory) update the running max m_h and denominator l_h (online
//      softmax: older terms rescaled by exp(m_old - m_new));
//   3. each invocation updates its share of the [G][head_dim] accumulator
//      (element i = tid + 128 k, registers) with the chunk's V rows.
// After the last chunk of a tile with a live position, the STRIDED probe
// (32 elements of the normalised output, z_i = o[i s + s/2], s = N / 32; all
// N when N <= 32) is reduced across the workgroup -- subgroupAdd in the _sg
// variant, a shared memory tree otherwise -- and the stop rule runs:
//   scale:     | |z| - |z_prev| | <= tau_s |z_prev|
//   direction: 1 - cos(z, z_prev) = |z/|z| - z_prev/|z_prev||^2 / 2 <= tau_d
// (the difference form keeps float precision where 1 - cos is tiny; the CPU
// computes 1 - dot/(|z||z'|) in double: the same quantity). The stream stops
// after `patience` passing tiles in a row (never when stop_enabled is 0).
// A live position whose logit is not finite (K not finite there, or the
// product overflows) stops the stream at once with visited = -1 - that
// position (the lowest of its chunk): the core refuses such a call, as the
// CPU does.
//
// Bounded dispatches: a dispatch runs at most max_steps steps, then saves the
// stream's state (cursors in the order and in the tile, the rule's state, m,
// l, the previous probe, the accumulator) to `st`, and the next dispatch of
// the submission goes on from there (first = 1: from scratch). A long history
// is many dispatches, each within KVM_VK_LOOP_BUDGET loop iterations per
// invocation (vk_internal.h: lavapipe silently cuts longer runs short);
// vk_attend.c's attend_step_iters counts the loops below, so a loop added
// here is added there. Every dispatch that runs writes out and visited.
// Limits (checked by the host): G <= 128, G * head_dim <= 4096 (ACC_PER
// accumulator registers per invocation), 32-bit element indices.
#extension GL_GOOGLE_include_directive : require
#ifdef KVM_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#include "common.glsl"

#define ACC_PER 32
#define PROBE 32

layout(local_size_x = KVM_WG) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { uint kw[]; };
layout(std430, binding = 2) readonly buffer V { uint vw[]; };
layout(std430, binding = 3) readonly buffer S { int slot_map[]; };
layout(std430, binding = 4) readonly buffer Ord { int order_[]; };
layout(std430, binding = 5) writeonly buffer Out { float o[]; };
layout(std430, binding = 6) writeonly buffer Vis { int visited[]; };
// [n_kv] done flags, then per stream: S_M words of cursors and rule state,
// m [G], l [G], the previous probe [PROBE], the accumulator [G * D]
layout(std430, binding = 7) buffer St { uint st[]; };
// the device mirror's (backend.h, dev_attend): f32 tail rows and the RoPE table
layout(std430, binding = 8) readonly buffer KT { float ktail[]; };
layout(std430, binding = 9) readonly buffer VT { float vtail[]; };
layout(std430, binding = 10) readonly buffer CS { float rcs[]; };
layout(push_constant) uniform P {
    uint n_slots, n_pos, n_kv, G, D, tile, n_visit, n_tiles;
    uint f16; // K and V are f16 (halves of 32-bit words), else f32
    float scale, tau_s, tau_d;
    uint patience, stop_enabled;
    // element offsets (K and V: in elements of their dtype)
    uint q_off, k_off, v_off, s_off, ord_off, out_off, vis_off;
    uint first;     // 1: the first dispatch of the visit (no state to load)
    uint max_steps; // steps (chunks) this dispatch may run
    uint tail_slot; // slots >= tail_slot read ktail / vtail (0xffffffff: none)
    uint tail_off;  // in floats
    uint rot;       // rotary_dim: keys rotated on the fly to base + position (0: as stored)
    uint gptj;
    float attn_factor;
    uint cs_off;    // in floats: row 0 the base's cos/sin, row 1 + pos the position's
    uint ord_stride; // entries between the streams' orders (0: one order for all)
    uint scored;     // 1: visited[n_kv + g] gets the live positions stream g read
} p;

// a stream's record in st: words S_ORD .. S_PREV_NORM, then m at S_M
#define S_ORD 0u       // next entry of the order
#define S_CUR 1u       // positions of that entry's tile already read
#define S_VIS 2u
#define S_STREAK 3u
#define S_FLAGS 4u
#define S_PREV_NORM 5u
#define S_POS 6u       // live positions of the tiles counted in S_VIS
#define S_TPOS 7u      // live positions of the tile being read so far
#define S_M 8u
#define F_HAS_PREV 1u
#define F_STOP 2u
#define F_TILE_LIVE 4u // the tile being read has a live position so far

shared float ss[KVM_WG];  // chunk scores, then probabilities, [c][h]
shared float red[KVM_WG]; // reductions
shared int sslot[KVM_WG]; // slot of each chunk position, -1 when dead
shared float sm[KVM_WG], sl[KVM_WG], scorr[KVM_WG]; // per query head: max, denominator, rescale
shared float sz[PROBE], sprev[PROBE];
shared uint slive; // live positions of the chunk
shared uint sbad; // lowest position of the chunk with a non-finite logit, 0xffffffff: none

float load_kv(bool is_k, uint e) {
    uint w = is_k ? kw[p.f16 != 0u ? e >> 1 : e] : vw[p.f16 != 0u ? e >> 1 : e];
    if (p.f16 == 0u) return uintBitsToFloat(w);
    return uintBitsToFloat(kvm_f16_to_f32((w >> ((e & 1u) * 16u)) & 0xffffu));
}

// Element d of slot s's row for KV head g as stored (the tail's f32 rows
// for slots >= tail_slot).
float kv_elem(bool is_k, uint s, uint g, uint d) {
    if (s >= p.tail_slot) {
        uint e = p.tail_off + ((s - p.tail_slot) * p.n_kv + g) * p.D + d;
        return is_k ? ktail[e] : vtail[e];
    }
    return load_kv(is_k, (is_k ? p.k_off : p.v_off) + (s * p.n_kv + g) * p.D + d);
}

// The mirror's read path, for any kernel that reads it: V row element, and
// K row element rotated to position base + pos (backend.h, dev_attend: the
// angle of base + pos by angle addition from the table's rows 0 and 1 + pos,
// then kvm_rope_rotate's operations; the CUDA kernel's kvmcu_mirror_k does
// the same).
float load_v(uint s, uint g, uint d) { return kv_elem(false, s, g, d); }
float load_k_rot(uint s, uint g, uint d, uint pos) {
    float x = kv_elem(true, s, g, d);
    if (d >= p.rot) return x;
    uint np = p.rot / 2u, j, partner;
    bool first;
    if (p.gptj != 0u) { j = d >> 1; first = (d & 1u) == 0u; partner = first ? d + 1u : d - 1u; }
    else { first = d < np; j = first ? d : d - np; partner = first ? d + np : d - np; }
    uint rb = p.cs_off, rp = p.cs_off + (pos + 1u) * p.rot;
    float cb = rcs[rb + j], sb = rcs[rb + np + j], cp = rcs[rp + j], sp = rcs[rp + np + j];
    float c = cb * cp - sb * sp, sn = sb * cp + cb * sp;
    float y = kv_elem(true, s, g, partner);
    // (x0, x1) -> (x0 c - x1 s, x0 s + x1 c), as the CPU rotation
    float r = first ? x * c - y * sn : y * sn + x * c;
    return p.attn_factor != 1.0 ? r * p.attn_factor : r;
}

// Sum of x over the workgroup; every invocation gets it. Uniform control flow only.
float wg_sum(float x) {
    uint tid = gl_LocalInvocationID.x;
#ifdef KVM_SUBGROUP
    float s = subgroupAdd(x);
    if (subgroupElect()) red[gl_SubgroupID] = s;
    barrier();
    float t = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; i++) t += red[i];
    barrier();
    return t;
#else
    red[tid] = x;
    barrier();
    for (uint st = KVM_WG / 2; st > 0u; st >>= 1) {
        if (tid < st) red[tid] += red[tid + st];
        barrier();
    }
    float t = red[0];
    barrier();
    return t;
#endif
}

uint pow2_ceil(uint x) {
    uint r = 1u;
    while (r < x) r <<= 1;
    return r;
}

void main() {
    const uint tid = gl_LocalInvocationID.x, g = gl_WorkGroupID.x;
    const uint G = p.G, D = p.D, N = G * D;
    const uint C = KVM_WG / G;         // positions per chunk
    const uint c = tid / G, h = tid - (tid / G) * G;
    const bool act = tid < C * G;
    const uint NP = N > PROBE ? PROBE : N, stride = N / PROBE;
    const uint qbase = p.q_off + g * G * D;
    const uint sb = p.n_kv + g * (S_M + 2u * G + PROBE + N); // this stream's record
    const uint s_l = sb + S_M + G, s_prev = s_l + G, s_acc = s_prev + PROBE;
    const float NEG_INF = uintBitsToFloat(0xff800000u);

    float acc[ACC_PER];
    uint oi = 0u, cur = 0u, flags = 0u;
    int vis = 0, streak = 0;
    float prev_norm = 0.0;
    uint npos = 0u, tpos = 0u;
    if (p.first != 0u) {
        for (uint k = 0u; k < ACC_PER; k++) acc[k] = 0.0;
        if (tid < G) {
            sm[tid] = NEG_INF;
            sl[tid] = 0.0;
        }
    } else {
        if (st[g] != 0u) return; // finished in an earlier dispatch, which wrote out and visited (uniform)
        oi = st[sb + S_ORD];
        cur = st[sb + S_CUR];
        vis = int(st[sb + S_VIS]);
        streak = int(st[sb + S_STREAK]);
        flags = st[sb + S_FLAGS];
        prev_norm = uintBitsToFloat(st[sb + S_PREV_NORM]);
        npos = st[sb + S_POS];
        tpos = st[sb + S_TPOS];
        for (uint k = 0u; k < ACC_PER; k++) {
            uint i = tid + k * KVM_WG;
            acc[k] = 0.0;
            if (i < N) acc[k] = uintBitsToFloat(st[s_acc + i]);
        }
        if (tid < G) {
            sm[tid] = uintBitsToFloat(st[sb + S_M + tid]);
            sl[tid] = uintBitsToFloat(st[s_l + tid]);
        }
        if (tid < NP) sprev[tid] = uintBitsToFloat(st[s_prev + tid]);
    }
    bool has_prev = (flags & F_HAS_PREV) != 0u, stop = (flags & F_STOP) != 0u;
    bool tile_live = (flags & F_TILE_LIVE) != 0u;

    for (uint step = 0u; step < p.max_steps && oi < p.n_visit && !stop; step++) {
        int t = order_[p.ord_off + g * p.ord_stride + oi];
        if (t < 0 || uint(t) >= p.n_tiles) { // the device cannot refuse: skip
            oi++;
            continue;
        }
        const uint t0 = uint(t) * p.tile, t1 = min(t0 + p.tile, p.n_pos);
        const uint c0 = t0 + cur, cn = min(C, t1 - c0); // this chunk: [c0, c0 + cn)
        const uint half0 = pow2_ceil(cn) / 2u;
        barrier(); // the last step's reads of shared memory are done
        // 1. slots and scores
        if (tid == 0u) {
            slive = 0u;
            sbad = 0xffffffffu;
        }
        if (act && h == 0u) {
            int s = -1;
            if (c < cn) {
                int x = slot_map[p.s_off + c0 + c];
                if (x >= 0 && uint(x) < p.n_slots) s = x;
            }
            sslot[c] = s;
        }
        barrier();
        if (act && h == 0u && sslot[c] >= 0) atomicAdd(slive, 1u);
        float sc = NEG_INF;
        if (act && sslot[c] >= 0) {
            uint qb = qbase + h * D;
            float d = 0.0;
            for (uint i = 0u; i < D; i++) d += q[qb + i] * load_k_rot(uint(sslot[c]), g, i, c0 + c);
            sc = p.scale * d;
            if (!(abs(sc) <= 3.402823466e38)) atomicMin(sbad, c0 + c); // NaN or infinite
        }
        red[tid] = sc;
        barrier();
        if (sbad != 0xffffffffu) { // uniform: read after the barrier
            vis = -1 - int(sbad);
            stop = true;
            break;
        }
        // 2. per-head max over the chunk's positions: red[h] (c = 0)
        for (uint w = half0; w > 0u; w >>= 1) {
            if (act && c < w && c + w < cn) red[tid] = max(red[tid], red[tid + w * G]);
            barrier();
        }
        if (tid < G) {
            float mo = sm[tid], mn = max(mo, red[tid]);
            scorr[tid] = mo == NEG_INF ? 0.0 : exp(mo - mn);
            sm[tid] = mn;
        }
        barrier();
        float pr = (act && sc != NEG_INF) ? exp(sc - sm[h]) : 0.0;
        ss[tid] = pr;
        red[tid] = pr;
        barrier();
        for (uint w = half0; w > 0u; w >>= 1) {
            if (act && c < w && c + w < cn) red[tid] += red[tid + w * G];
            barrier();
        }
        if (tid < G) sl[tid] = sl[tid] * scorr[tid] + red[tid];
        // 3. the accumulator: acc = corr * acc + sum_c p_c v_c
        for (uint k = 0u; k < ACC_PER; k++) {
            uint i = tid + k * KVM_WG;
            if (i < N) {
                uint hq = i / D, d = i - hq * D;
                float a = acc[k] * scorr[hq];
                for (uint cc = 0u; cc < cn; cc++) {
                    int s = sslot[cc];
                    if (s >= 0) a += ss[cc * G + hq] * load_v(uint(s), g, d);
                }
                acc[k] = a;
            }
        }
        barrier();
        tile_live = tile_live || slive != 0u; // uniform: read after the barrier
        tpos += slive;
        cur += cn;
        if (c0 + cn < t1) continue; // the tile goes on in the next step
        oi++;
        cur = 0u;
        if (!tile_live) continue;
        tile_live = false;
        vis++;
        npos += tpos;
        tpos = 0u;
        // the probe of the normalised output: element i is entry j
        for (uint k = 0u; k < ACC_PER; k++) {
            uint i = tid + k * KVM_WG;
            if (i < N) {
                uint j = i;
                if (N > PROBE) {
                    uint lo = stride / 2u;
                    j = i >= lo && (i - lo) % stride == 0u ? (i - lo) / stride : PROBE;
                }
                if (j < NP) {
                    float l = sl[i / D];
                    sz[j] = l > 0.0 ? acc[k] / l : 0.0;
                }
            }
        }
        barrier();
        float zi = tid < NP ? sz[tid] : 0.0;
        float nz = sqrt(wg_sum(zi * zi));
        bool fire = false;
        if (has_prev) {
            bool ok;
            if (prev_norm == 0.0 || nz == 0.0) {
                ok = prev_norm == 0.0 && nz == 0.0;
            } else {
                float e = tid < NP ? zi / nz - sprev[tid] / prev_norm : 0.0;
                float d2 = wg_sum(e * e);
                ok = abs(nz - prev_norm) <= p.tau_s * prev_norm && 0.5 * d2 <= p.tau_d;
            }
            streak = ok ? streak + 1 : 0;
            fire = p.stop_enabled != 0u && uint(streak) >= p.patience;
        }
        barrier();
        if (tid < NP) sprev[tid] = zi;
        prev_norm = nz;
        has_prev = true;
        stop = fire;
    }
    barrier();
    // the state for the next dispatch
    const bool done = stop || oi >= p.n_visit;
    if (tid == 0u) {
        st[g] = done ? 1u : 0u;
        st[sb + S_ORD] = oi;
        st[sb + S_CUR] = cur;
        st[sb + S_VIS] = uint(vis);
        st[sb + S_STREAK] = uint(streak);
        st[sb + S_FLAGS] = (has_prev ? F_HAS_PREV : 0u) | (stop ? F_STOP : 0u) | (tile_live ? F_TILE_LIVE : 0u);
        st[sb + S_PREV_NORM] = floatBitsToUint(prev_norm);
        st[sb + S_POS] = npos;
        st[sb + S_TPOS] = tpos;
    }
    if (!done) {
        if (tid < G) {
            st[sb + S_M + tid] = floatBitsToUint(sm[tid]);
            st[s_l + tid] = floatBitsToUint(sl[tid]);
        }
        if (tid < NP) st[s_prev + tid] = floatBitsToUint(sprev[tid]);
    }
    // the output as it stands (and the accumulator when the visit goes on)
    for (uint k = 0u; k < ACC_PER; k++) {
        uint i = tid + k * KVM_WG;
        if (i < N) {
            if (!done) st[s_acc + i] = floatBitsToUint(acc[k]);
            float l = sl[i / D];
            o[p.out_off + g * N + i] = l > 0.0 ? acc[k] * (1.0 / l) : 0.0;
        }
    }
    if (tid == 0u) visited[p.vis_off + g] = vis;
    if (tid == 0u && p.scored != 0u) visited[p.vis_off + p.n_kv + g] = int(npos);
}
