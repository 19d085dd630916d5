/* The backend interface (internal). A backend is a table of function pointers
 * plus its own context, in the manner of ggml-backend: buffers (alloc, free,
 * upload, download) and the buffer-level device ops (dev_*), nothing that
 * names the core's pools or agents. The CPU backend (core/cpu) fills every
 * entry: its entries are the CPU ops the core runs (the host-side forms of
 * the arguments let them read the core's memory in place), so the
 * conformance suite, which compares every backend with them, checks what
 * CPU users run. CUDA and Vulkan are plugins loaded with dlopen that export
 * one init symbol and are checked for the exact KVMEM_BACKEND_API_VERSION.
 * Entries marked (optional) may be NULL. The core's router
 * (core/backend/route) picks the backend of each op by one policy, from
 * the entries a table has and its supports_op.
 *
 * Buffers: backend memory is reached through kvmem_buffer handles plus byte
 * offsets, never raw device pointers, so Vulkan (VkBuffer) and CUDA (device
 * pointers) fit the same table. For the CPU backend a buffer is host memory.
 *
 * This header and the others directly in core/backend/ are the whole
 * interface a plugin sees (with include/kvmem.h): they include nothing else
 * of the core and name none of its internal types, and plugins are built
 * with only this folder of the core on their include path
 * (tests/checks/backend_includes.sh keeps it so); core/backend/route is the
 * core's side. */
#ifndef KVMEM_BACKEND_H
#define KVMEM_BACKEND_H

/* the device tensors' descriptor (kvmem_device_memory) is in the header's
 * experimental section, which the backend interface uses */
#ifndef KVMEM_EXPERIMENTAL
#define KVMEM_EXPERIMENTAL
#endif
#include "kvmem.h"

#include <stddef.h>
#include <stdint.h>

/* 2: struct kvmem_backend gained fail, detail and cpu_device (the services a
 *    plugin needs from the core and shows its users)
 * 3: the device kernels (dev_score, dev_topk, dev_gather_rope, dev_attend,
 *    dev_qmem_score)
 * 4: dev_score_reduce (a decode retrieval reads back per-set block scores)
 * 5: the table holds buffers and device ops only: the host-level entries
 *    (aabb_score, topk, gather, qmem_score, attend) became core functions and
 *    the entries nothing used (synchronize, convert, aabb_build, quantize,
 *    dequantize) are gone
 * 6: dev_attend reports a non-finite logit in visited (-1 - position)
 * 7: supports_op; the CPU backend's entries are the CPU ops the core runs,
 *    so dev_score, dev_gather_rope and dev_qmem_score gained host-side forms
 *    (the pool's own box layout and a candidate list, keys and rows read
 *    through callbacks, caller tensors) that a device's supports_op refuses
 * 8: the device-resident mirror's forms: f16 split boxes (KVM_BOXES_SPLIT_F16),
 *    dev_gather_rope's src_dtype, dev_attend's keys rotated on the fly
 *    (rope_cs) and its f32 tail rows (k_tail, v_tail)

 * 9: dev_attend's scored form (the SCORED order found by the backend);
 *    dev_score's EXACT buffer form (keys read from device rows) */
#define KVMEM_BACKEND_API_VERSION 9u

typedef struct kvmem_backend kvmem_backend;
typedef struct kvmem_buffer kvmem_buffer;

/* The ops of the table, for supports_op. */
typedef enum kvm_op {
    KVM_OP_SCORE,
    KVM_OP_SCORE_REDUCE,
    KVM_OP_TOPK,
    KVM_OP_GATHER_ROPE,
    KVM_OP_ATTEND,
    KVM_OP_QMEM_SCORE
} kvm_op;
/* Arguments of the device kernels (defined below the table). */
struct kvm_dev_score_args;
struct kvm_dev_topk_args;
struct kvm_dev_gather_args;
struct kvm_dev_attend_args;
struct kvm_dev_qmem_args;
struct kvm_dev_score_reduce_args;

typedef struct kvmem_backend_iface {
    const char *name;
    void (*free)(kvmem_backend *be);

    /* ---- buffers ---- */
    kvmem_status (*buffer_alloc)(kvmem_backend *be, size_t size, kvmem_buffer **out);
    void (*buffer_free)(kvmem_backend *be, kvmem_buffer *buf);
    kvmem_status (*buffer_upload)(kvmem_backend *be, kvmem_buffer *dst, size_t offset,
                                  const void *src, size_t size);
    kvmem_status (*buffer_download)(kvmem_backend *be, const kvmem_buffer *src, size_t offset,
                                    void *dst, size_t size);
    /* (optional) host address of a buffer, NULL when not host-visible */
    void *(*buffer_host_ptr)(kvmem_backend *be, kvmem_buffer *buf);

    /* ---- device ops ----
     * Buffer-level forms of retrieval, gather, attention and the rule
     * score, for backends whose memory the core cannot read: the core packs
     * the inputs into the backend's buffers (or keeps them resident there),
     * calls these, and reads the results back. The CPU backend implements
     * them too, as the reference the conformance suite (tests/backend)
     * compares every backend with. Offsets are bytes, multiples of 4; counts
     * are elements; args are validated like every entry (bad shapes or
     * ranges: KVMEM_ERR_INVALID_ARG and nothing runs). Each entry is
     * (optional): NULL means the core runs the op with its own CPU code. */
    kvmem_status (*dev_score)(kvmem_backend *be, const struct kvm_dev_score_args *a);
    kvmem_status (*dev_topk)(kvmem_backend *be, const struct kvm_dev_topk_args *a);
    kvmem_status (*dev_gather_rope)(kvmem_backend *be, const struct kvm_dev_gather_args *a);
    kvmem_status (*dev_attend)(kvmem_backend *be, const struct kvm_dev_attend_args *a);
    kvmem_status (*dev_qmem_score)(kvmem_backend *be, const struct kvm_dev_qmem_args *a);
    kvmem_status (*dev_score_reduce)(kvmem_backend *be, const struct kvm_dev_score_reduce_args *a);

    /* Whether the entry of `op` takes these arguments (ggml's supports_op;
     * args: that entry's argument struct): nonzero when it does. The core's
     * router (core/backend/route) asks before it routes an op to a device,
     * so a device refuses here the host-side forms of the arguments and the
     * shapes beyond its kernels it can see from the arguments; an entry then
     * still refuses what only a run can tell (KVMEM_ERR_UNSUPPORTED). */
    int (*supports_op)(kvmem_backend *be, kvm_op op, const void *args);

    /* (optional) escape hatch for entries a newer core knows and an older
     * backend does not: returns NULL for unknown names. */
    void *(*get_proc_address)(kvmem_backend *be, const char *name);
} kvmem_backend_iface;

struct kvmem_backend {
    const kvmem_backend_iface *iface;
    void *impl;          /* the backend's own state */
    kvmem_context *ctx;  /* owning context */
    /* -- plugin services: what a plugin, which links none of the core's
     * hidden symbols, gets from the core and tells it -- */
    /* Set by the core's loader right after a plugin's init: a plugin cannot
     * link the core's hidden kvm_fail, so its ops report messages for
     * kvmem_last_error() through this pointer. NULL inside init. */
    kvmem_status (*fail)(kvmem_status status, const char *fmt, ...);
    /* (optional, set by the plugin) what it runs on, shown by kvmem_backends()
     * ("llvmpipe (LLVM 15.0.6, 256 bits), Vulkan 1.3"); owned by the backend. */
    const char *detail;
    /* Set by the plugin when its device is a CPU (Mesa lavapipe, SwiftShader):
     * "auto" then keeps the native CPU backend, which is faster than a CPU
     * emulating a GPU. Explicit requests ("vulkan") still get it. */
    int cpu_device;
};

/* ---- arguments of the device kernels ---- */

/* Host-side forms (the CPU backend's; a device's supports_op refuses them):
 * the core hands its own memory to the CPU ops in place, through these.
 * Keys of the candidate blocks (dev_score, EXACT): block b is an index into
 * the box array. rows (optional) returns the rows of (b, layer l, KV head g)
 * where they lie in memory as f32 or f16 (*n rows, *dtype), NULL otherwise;
 * read decodes them into dst, f32 [*n][head_dim] (a failed read leaves
 * zeros, which the core checks after the call). */
typedef struct kvm_dev_keys {
    void *ctx;
    int32_t max_rows; /* the most rows a block has */
    const void *(*rows)(void *ctx, int32_t b, int32_t l, int32_t g, int32_t *n, kvmem_dtype *dtype);
    void (*read)(void *ctx, int32_t b, int32_t l, int32_t g, float *dst, int32_t *n);
} kvm_dev_keys;

/* Source rows of dev_gather_rope: output rows [first[s], first[s + 1]) come
 * from segment s (a block), whose rows of (which: K 0 or V 1, layer, head)
 * read decodes into dst, f32 [rows][head_dim] (failures as above). */
typedef struct kvm_dev_rows {
    void *ctx;
    int32_t n_segs, max_rows;
    const int64_t *first; /* n_segs + 1 */
    void (*read)(void *ctx, int32_t seg, int which, int32_t layer, int32_t head, float *dst);
} kvm_dev_rows;

/* dev_score's box layouts */
#define KVM_BOXES_SPLIT_F32 0  /* s_min and s_max: two f32 [n_blocks][n_layers][n_kv_heads][head_dim] arrays */
#define KVM_BOXES_PAIRED_F32 1 /* s_max: one f32 [.][n_layers][n_kv_heads][2][head_dim] array, each box's
                                  s_max then its s_min (the pool's); s_min unused */
#define KVM_BOXES_PAIRED_F16 2 /* the same in f16 */
#define KVM_BOXES_SPLIT_F16 3  /* SPLIT_F32's two arrays in f16 (the device mirror's; s_off even in
                                  halves, so a multiple of 4 bytes) */

/* dev_score: MemArt block scores, normalised and aggregated per query head.
 * For query token t, layer l, query head h (KV head g = h / (Hq / Hkv)) and
 * block j:
 *   I[t][l][h][j] = sum_d max(q_d * s_max[j][l][g][d], q_d * s_min[j][l][g][d])
 *   p = SOFTMAX: exp(tau * I_j) / sum_j' exp(tau * I_j')      (over j, per t, l, h)
 *       RR:      1 / (rank_j + rr_c), rank from 1 by I descending, ties:
 *                the lower j ranks first
 *   out[l][h][j] = MAX or SUM over t of p
 * dev_score_reduce sums out into the per-set scores retrieval returns.
 * tau > 0 and rr_c > 0 are resolved by the core. A relevance I that is not
 * finite (the query's products overflow f32) leaves NaN or infinite scores
 * (the CPU backend makes every score NaN then), which the core refuses.
 * Host-side forms (all zero: the form above): n_sets > 0 writes the per-set
 * sums of out instead, out f32 [n_sets][n_blocks] (as dev_score_reduce
 * would, summed in the backend's own order); box_layout PAIRED reads the
 * boxes of blocks[j] (host, ascending; NULL: j) from s_max at s_off; mode
 * EXACT takes I = max over the block's keys of q . k, keys from `keys`.
 * EXACT's buffer form (keys NULL, key_rows set; s_min and s_max unused):
 * block j's keys are rows [j * block_rows, (j + 1) * block_rows) of
 * key_rows[l] for layer l, f32 (key_f16 0) or f16 rows [.][n_kv_heads]
 * [head_dim] from byte s_off (an agent's resident raw keys). */
typedef struct kvm_dev_score_args {
    const kvmem_buffer *q;              /* f32 [n_q][n_layers][n_q_heads][head_dim] */
    const kvmem_buffer *s_min, *s_max;  /* f32 (SPLIT_F32) or f16 (SPLIT_F16) [n_blocks][n_layers][n_kv_heads][head_dim] */
    kvmem_buffer *out;                  /* f32 [n_layers][n_q_heads][n_blocks] */
    size_t q_off, s_off, out_off;       /* s_off applies to both s_min and s_max */
    int32_t n_q, n_blocks, n_layers, n_q_heads, n_kv_heads, head_dim;
    kvmem_retrieve_norm norm;
    kvmem_retrieve_agg agg;
    float tau, rr_c;
    /* host-side forms */
    int32_t n_sets;
    int32_t box_layout;        /* KVM_BOXES_*; devices take SPLIT_F32 and SPLIT_F16 */
    const int32_t *blocks;     /* (host) */
    kvmem_retrieve_mode mode;
    const kvm_dev_keys *keys;  /* (host) EXACT */
    /* EXACT's buffer form */
    const kvmem_buffer *const *key_rows; /* (host array) [n_layers] */
    int32_t block_rows, key_f16;
} kvm_dev_score_args;

/* dev_topk: the min(k, #non-NaN) indices of the largest scores (NaN never
 * selected; ties: the lower index wins), written to idx in ascending index
 * order (chronological: what retrieval returns); *n_out (host) gets the
 * count. idx needs only min(k, n) entries (k > n is allowed); n = 0 or
 * k = 0 writes nothing and sets *n_out = 0. Argument checks shared by the
 * CPU and Vulkan entries: core/backend/dev_args.h. */
typedef struct kvm_dev_topk_args {
    const kvmem_buffer *scores;  /* f32 [n] */
    kvmem_buffer *idx;           /* int32 [k] */
    size_t scores_off, idx_off;
    int32_t n, k;
    int32_t *n_out;              /* host */
} kvm_dev_topk_args;

/* dev_gather_rope: out row i ([n_heads][head_dim] f32, contiguous) = source
 * row idx[i] (f32 rows src_rs elements apart, n_src of them) rotated with
 * row i's cos/sin: cs = [n_out][rotary_dim/2] cos then [n_out][rotary_dim/2]
 * sin (kvm_rope_cos_sin for the new positions), pairs as in kvm_rope_rotate
 * (NEOX: d and d + rotary_dim/2; GPT-J: 2d and 2d + 1), both results times
 * attn_factor; dims >= rotary_dim copied. rotary_dim 0: a plain gather
 * (values; cs unused, may be NULL). src_dtype F16: the source rows are f16
 * (src_rs and n_src in elements, src_off a multiple of 4 bytes), decoded
 * exactly to f32 before the rotation. idx are uint32; an index >= n_src gives
 * a zero row (the host cannot check device memory), never a stray read.
 * Host-side forms (all zero: the form above): `rows` reads the source rows
 * (src, idx, n_src and src_rs unused); out_view (host) takes the rows
 * instead of out, a [n_layers][n_out][n_heads][head_dim] view of any tensor
 * dtype and strides; n_layers (0: 1) layers in one call, `which` passed to
 * the reader; cs_rows 1: cs holds row i's cos then sin at i * rotary_dim
 * (the row kernel's layout) instead of the two planes. */
typedef struct kvm_dev_gather_args {
    const kvmem_buffer *src, *idx, *cs;
    kvmem_buffer *out;
    size_t src_off, idx_off, cs_off, out_off;
    size_t n_src, src_rs, n_out, n_heads, head_dim, rotary_dim;
    int gptj;          /* 0 NEOX, 1 GPT-J pairing */
    float attn_factor; /* YaRN's; 1 otherwise */
    /* host-side forms */
    const kvm_dev_rows *rows;     /* (host) */
    const kvmem_tensor *out_view; /* (host) */
    int32_t n_layers, which, cs_rows;
    kvmem_dtype src_dtype; /* F32 (0) or F16: the element type of src */
} kvm_dev_gather_args;

/* dev_attend: one decode row of ART attention, kvmem_attend()'s rule on a
 * SLOTMAP source with the STRIDED probe and no mask: position p < n_pos
 * reads slot slot_map[p] of k and v ([n_slots][n_kv_heads][head_dim], dtype
 * F32 or F16); a slot < 0 is dead (never read). Tiles are runs of `tile`
 * positions, visited in `order` (n_visit distinct tile ids < ceil(n_pos /
 * tile)). The stop rule runs per stream = KV head g (its G = n_q_heads /
 * n_kv_heads query heads together): after each tile with a live position
 * the probe of the stream's running output is tested with tau_s and tau_d,
 * and the stream stops after `patience` passing tiles in a row; tau_s =
 * tau_d = 0: never stops. q f32 [n_q_heads][head_dim]; out f32
 * [n_q_heads][head_dim] (zeros for a head that saw no live position);
 * visited int32 [n_kv_heads] = tiles with a live position the stream read.
 * A live position the kernel reads whose logit (scale * q . k for some query
 * head of the stream) is not finite (K not finite there, or the product
 * overflows) stops that stream with visited[g] = -1 - such a position; the
 * other outputs of that call are unspecified, and the core refuses it,
 * naming the position, as kvm_attend_cpu refuses the same.
 * scale > 0 is resolved by the core. kvm_attend_cpu is the reference.
 * scored = 1 (kvmem_attend's SCORED order, found by the backend): every tile
 * is visited (n_visit = ceil(n_pos / tile)), each stream in its own order,
 * tiles by their score = the largest logit over their live positions and
 * the stream's query heads (NaN logits ignored; no live position: -inf),
 * highest first, equal scores newest (highest id) first. order is then an
 * output, int32 [n_kv_heads][n_visit]: stream g's order at g * n_visit;
 * visited holds 2 * n_kv_heads entries, the second half the live positions
 * each stream read (the tiles it counts in visited[g], whole).
 * Contents only device memory holds: the CPU reference refuses a live slot
 * >= n_slots and tile ids outside [0, ceil(n_pos / tile)) or repeated
 * (KVMEM_ERR_INVALID_ARG); a device skips such slots like dead ones and such
 * tile ids (never a stray read). A shape beyond a device kernel's limits:
 * KVMEM_ERR_UNSUPPORTED with a message (kvmem_attend then runs the CPU).
 * The device mirror's fields (zero: none; the CPU reference refuses them):
 *  - k_tail, v_tail (both or neither): f32 rows [.][n_kv_heads][head_dim];
 *    a live slot s >= tail_slot reads row s - tail_slot of them (at
 *    tail_off bytes) instead of k and v: the unsealed tail, kept in f32;
 *  - rotary_dim > 0: keys are raw (no RoPE) and rotated on the fly to
 *    position base + p (p: the position being read) by angle addition:
 *    rope_cs (f32 at rope_off bytes) holds rows of rotary_dim floats, cos
 *    of the rotary_dim/2 pairs then sin; row 0 is the angle of base, row
 *    1 + p that of p (both from kvm_rope_cos_sin), and the key's pair
 *    (x0, x1) (NEOX: d, d + rotary_dim/2; GPT-J: 2d, 2d + 1) becomes
 *      c = cb cp - sb sp, s = sb cp + cb sp (kvm_rope_cos_sin(base + p) up
 *      to rounding: exact when base is 0),
 *      y0 = (x0 c - x1 s) * attn_factor, y1 = (x0 s + x1 c) * attn_factor
 *    (kvm_rope_rotate's operations); dims >= rotary_dim
 *    as stored. So a new base uploads one row, not a key per position. */
typedef struct kvm_dev_attend_args {
    const kvmem_buffer *q, *k, *v, *slot_map, *order;
    kvmem_buffer *out, *visited;
    size_t q_off, k_off, v_off, slot_map_off, order_off, out_off, visited_off;
    int64_t n_slots, n_pos;
    int32_t n_q_heads, n_kv_heads, head_dim, tile, n_visit;
    kvmem_dtype dtype; /* of k and v */
    float scale, tau_s, tau_d;
    int32_t patience;
    /* the device mirror's fields (above) */
    const kvmem_buffer *k_tail, *v_tail, *rope_cs;
    size_t tail_off, rope_off;
    int64_t tail_slot;
    int32_t rotary_dim, gptj;
    float attn_factor;
    int32_t scored; /* 0 or 1 (above) */
} kvm_dev_attend_args;

/* dev_qmem_score: IntentKV's rule score (kvmem_qmem_score) of n tokens:
 * mem f32 [n_layers][n_q_heads][head_dim], k f32 [n_layers][n][n_kv_heads][head_dim],
 * scores f32 [n]. Host-side form: k_view (host), a view of that shape in
 * any tensor dtype and strides (head-major caches too), instead of k. */
typedef struct kvm_dev_qmem_args {
    const kvmem_buffer *mem, *k;
    kvmem_buffer *scores;
    size_t mem_off, k_off, scores_off;
    int32_t n_layers, n_q_heads, n_kv_heads, head_dim, n;
    const kvmem_tensor *k_view; /* (host) */
} kvm_dev_qmem_args;

/* dev_score_reduce: dev_score's out summed into per-set block scores, the
 * form retrieval returns (so a decode retrieval reads back n_sets * n
 * floats, not n_layers * n_heads * n). Sets: n_sets 1 (every layer, GLOBAL)
 * or n_layers (set s = layer s, PER_LAYER). The order is fixed, so every
 * backend returns the same bits (the CPU entry is the reference):
 *   out[s][j] = sum over the set's layers l, ascending, of
 *               (sum over h = 0, 1, .., n_heads - 1 of in[l][h][j])
 * both sums in f32, left to right from 0, one rounding per addition. Two
 * levels keep the error on non-negative terms within (n_heads + n_layers)
 * ulps, where one running sum would allow n_layers * n_heads. */
typedef struct kvm_dev_score_reduce_args {
    const kvmem_buffer *in; /* f32 [n_layers][n_heads][n] */
    kvmem_buffer *out;      /* f32 [n_sets][n], not overlapping in */
    size_t in_off, out_off;
    int32_t n_layers, n_heads, n, n_sets;
} kvm_dev_score_reduce_args;

/* -- device timing: a device's own clock, because host timers around an
 * asynchronous op measure the queue, not the kernel -- */
/* get_proc_address(be, KVM_PROC_LAST_OP_SECONDS) returns a kvm_last_op_seconds_fn
 * (or NULL): device time of the backend's last op, from GPU timestamps
 * (negative when the device has no timestamps). Used by benchmarks. */
#define KVM_PROC_LAST_OP_SECONDS "last_op_seconds"
typedef double (*kvm_last_op_seconds_fn)(kvmem_backend *be);

/* -- device tensors (kvmem.h, "Device tensors") --
 * Reached through get_proc_address, so a backend without them answers NULL
 * and the core refuses device tensors on its context.
 * KVM_PROC_BUFFER_WRAP: a kvm_buffer_wrap_fn that makes a kvmem_buffer of
 * the caller's memory (mem->handle, mem->size bytes; mem->offset is the
 * core's to apply) that the ops take like their own and buffer_free
 * releases without freeing the memory. The core has checked the
 * descriptor's fields and the tensor's extent; the backend refuses memory
 * that is not its kind or not on its device (KVMEM_ERR_UNSUPPORTED, naming
 * both) and orders its later work after mem->stream where it has streams.
 * KVM_PROC_VULKAN_DEVICE: a kvm_vulkan_device_fn filling every field of
 * *out but struct_size (the Vulkan backend only). */
#define KVM_PROC_BUFFER_WRAP "buffer_wrap"
typedef kvmem_status (*kvm_buffer_wrap_fn)(kvmem_backend *be, const kvmem_device_memory *mem, kvmem_buffer **out);
#define KVM_PROC_VULKAN_DEVICE "vulkan_device"
typedef void (*kvm_vulkan_device_fn)(kvmem_backend *be, kvmem_vulkan_device *out);

/* The symbol every backend plugin exports. It fills *out or writes a plain
 * reason ("no device", "driver too old") into why and returns an error. */
#define KVMEM_BACKEND_PLUGIN_INIT "kvmem_backend_plugin_init"
typedef kvmem_status (*kvmem_backend_plugin_init_fn)(uint32_t api_version, kvmem_context *ctx,
                                                      kvmem_backend **out, char *why,
                                                      size_t why_size);

#endif
