'use strict';
// Low level: find libkvmem, mirror its structs, declare each C function once.
//
// Each public C function appears exactly once in DECLARATIONS below, as its C
// prototype (koffi parses it); `_Out_` marks output pointers. Functions that
// return kvmem_status are wrapped so a failure throws the KvmemError subclass
// of its status with kvmem_last_error(). A function the loaded library lacks
// (an older build) is listed in `missing` and throws UnsupportedError.
const fs = require('node:fs');
const path = require('node:path');
const koffi = require('koffi');
const errors = require('./errors');

const SONAMES = process.platform === 'darwin' ? ['libkvmem.0.dylib', 'libkvmem.dylib'] : ['libkvmem.so.0', 'libkvmem.so'];

function candidates() {
  const out = [];
  if (process.env.KVMEM_LIBRARY) out.push(process.env.KVMEM_LIBRARY);
  for (const n of SONAMES) out.push(path.join(__dirname, n)); // shipped beside the package
  const root = path.resolve(__dirname, '..', '..');            // a source checkout
  for (const preset of ['default', 'release', 'debug', 'dev'])
    for (const n of SONAMES) out.push(path.join(root, 'build', preset, 'core', n));
  return out.concat(SONAMES);                                   // the system search path
}

function load() {
  const tried = [];
  const env = process.env.KVMEM_LIBRARY;
  for (const c of candidates()) {
    if (c.includes(path.sep) && !fs.existsSync(c)) {
      tried.push(`${c} (no such file)`);
    } else {
      try {
        return { lib: koffi.load(c), path: c };
      } catch (e) {
        tried.push(`${c} (${e.message})`);
      }
    }
    if (env && c === env) break; // an explicit KVMEM_LIBRARY that fails is an error, not a hint
  }
  throw new Error('kvmem: cannot load libkvmem. Set KVMEM_LIBRARY to its path, or build it ' +
                  '(make build) / install it. Looked in:\n  ' + tried.join('\n  '));
}

const { lib, path: libraryPath } = load();

// ---- types mirroring include/kvmem.h ----
const MAX_DIMS = 6;
for (const e of ['kvmem_status', 'kvmem_dtype', 'kvmem_log_level', 'kvmem_rope_style', 'kvmem_rope_scaling'])
  koffi.alias(e, 'int');
for (const e of ['kvmem_retrieve_mode', 'kvmem_retrieve_norm', 'kvmem_retrieve_agg', 'kvmem_retrieve_scope'])
  koffi.alias(e, 'int');
koffi.alias('kvmem_group_state', 'int');
for (const o of ['kvmem_context', 'kvmem_pool', 'kvmem_agent', 'kvmem_retrieval', 'kvmem_segments']) koffi.opaque(o);

const types = {
  kvmem_tensor: koffi.struct('kvmem_tensor', {
    data: 'void *', dtype: 'kvmem_dtype', ndim: 'int32_t',
    shape: koffi.array('int64_t', MAX_DIMS), strides: koffi.array('int64_t', MAX_DIMS),
  }),
  kvmem_backend_info: koffi.struct('kvmem_backend_info', {
    name: 'const char *', available: 'int32_t', detail: 'const char *',
  }),
  kvmem_context_params: koffi.struct('kvmem_context_params', { backend: 'const char *', n_threads: 'int32_t' }),
  kvmem_model_spec: koffi.struct('kvmem_model_spec', {
    n_layers: 'int32_t', n_q_heads: 'int32_t', n_kv_heads: 'int32_t', head_dim: 'int32_t',
    rotary_dim: 'int32_t', rope_style: 'kvmem_rope_style', rope_theta: 'double',
    rope_scaling: 'kvmem_rope_scaling', rope_factor: 'double', rope_low_freq_factor: 'double',
    rope_high_freq_factor: 'double', rope_original_max_pos: 'int32_t', yarn_beta_fast: 'double',
    yarn_beta_slow: 'double', yarn_attn_factor: 'double', layer_window: 'const int32_t *',
    model_id: koffi.array('char', 128, 'String'),
  }),
  kvmem_pool_params: koffi.struct('kvmem_pool_params', {
    block_size: 'int32_t', storage_dtype: 'kvmem_dtype', capacity_bytes: 'uint64_t',
    max_agents: 'int32_t', max_tokens_per_agent: 'int32_t',
  }),
  kvmem_pool_info: koffi.struct('kvmem_pool_info', {
    used_bytes: 'uint64_t', capacity_bytes: 'uint64_t', n_agents: 'int32_t', block_size: 'int32_t',
    storage_dtype: 'kvmem_dtype', reserved: 'int32_t',
  }),
  kvmem_append_params: koffi.struct('kvmem_append_params', {
    token_ids: 'const int32_t *', text: 'const char *', text_len: 'size_t',
    token_text_offsets: 'const int32_t *', positions: 'const int32_t *',
    keys_rotated: 'int32_t', reserved: 'int32_t',
  }),
  kvmem_agent_info: koffi.struct('kvmem_agent_info', {
    n_tokens: 'int64_t', n_blocks: 'int32_t', n_sealed: 'int32_t', bytes: 'uint64_t', text_bytes: 'uint64_t',
  }),
  kvmem_block_info: koffi.struct('kvmem_block_info', { first_token: 'int64_t', n_tokens: 'int32_t', sealed: 'int32_t' }),
  kvmem_retrieve_params: koffi.struct('kvmem_retrieve_params', {
    top_k: 'int32_t', mode: 'kvmem_retrieve_mode', norm: 'kvmem_retrieve_norm', agg: 'kvmem_retrieve_agg',
    scope: 'kvmem_retrieve_scope', tau: 'float', rr_c: 'float', exclude: 'const int32_t *', n_exclude: 'int32_t',
    always_include: 'const int32_t *', n_always_include: 'int32_t', recent_window: 'int32_t', skip_recent: 'int32_t',
  }),
  kvmem_segments_params: koffi.struct('kvmem_segments_params', { static_after_steps: 'int32_t', max_segments: 'int32_t' }),
  kvmem_segment_event: koffi.struct('kvmem_segment_event', {
    kind: 'int32_t', group: 'int32_t', segment: 'int32_t', reserved: 'int32_t', step: 'int64_t',
  }),
  kvmem_segments_info: koffi.struct('kvmem_segments_info', {
    step: 'int64_t', n_segments: 'int32_t', n_indices: 'int32_t', n_groups: 'int32_t', n_static: 'int32_t', n_events: 'uint64_t',
  }),
  kvmem_segment_info: koffi.struct('kvmem_segment_info', {
    group: 'int32_t', alive: 'int32_t', has_kv: 'int32_t', reserved: 'int32_t', last_update: 'int64_t', n_tokens: 'int64_t',
  }),
  kvmem_group_info: koffi.struct('kvmem_group_info', {
    state: 'kvmem_group_state', n_members: 'int32_t', has_kv: 'int32_t', reserved: 'int32_t', last_change: 'int64_t', n_tokens: 'int64_t',
  }),
  kvmem_segment_unit: koffi.struct('kvmem_segment_unit', {
    kind: 'int32_t', group: 'int32_t', segment: 'int32_t', needs_compute: 'int32_t', score: 'float', reserved: 'int32_t',
    first_token: 'int64_t', n_tokens: 'int64_t', agent_id: koffi.array('char', 129, 'String'),
  }),
  kvmem_kmeans_params: koffi.struct('kvmem_kmeans_params', { k: 'int32_t', max_iters: 'int32_t', seed: 'uint64_t' }),
  kvmem_multihop_params: koffi.struct('kvmem_multihop_params', { ratio: 'float', max_iters: 'int32_t' }),
  kvmem_multihop_result: koffi.struct('kvmem_multihop_result', { n_selected: 'int32_t', iters: 'int32_t', converged: 'int32_t', reserved: 'int32_t' }),
  kvmem_load_plan_params: koffi.struct('kvmem_load_plan_params', { bandwidth_gbps: 'double', max_ahead: 'int32_t', reserved: 'int32_t' }),
  kvmem_load_item: koffi.struct('kvmem_load_item', {
    segment: 'int32_t', layer: 'int32_t', issue_layer: 'int32_t', reserved: 'int32_t', start_ms: 'double', end_ms: 'double',
  }),
  kvmem_load_plan_stats: koffi.struct('kvmem_load_plan_stats', {
    naive_makespan_ms: 'double', naive_compute_idle_ms: 'double', naive_load_idle_ms: 'double',
    balanced_makespan_ms: 'double', balanced_compute_idle_ms: 'double', balanced_load_idle_ms: 'double',
    compute_ms: 'double', load_ms: 'double', n_loads: 'uint64_t',
  }),
};
types.kvmem_log_callback = koffi.proto('void kvmem_log_callback(kvmem_log_level level, const char *message, void *user_data)');

// ---- declarations: the C prototypes, once each ----
const DECLARATIONS = [
  // Version
  'int32_t kvmem_version_number(void)',
  'const char *kvmem_version(void)',
  // Status and errors
  'const char *kvmem_status_str(kvmem_status status)',
  'const char *kvmem_last_error(void)',
  'void kvmem_log_set(kvmem_log_callback *callback, void *user_data)',
  'void kvmem_free(void *ptr)',
  // Tensors
  'const char *kvmem_dtype_name(kvmem_dtype dtype)',
  'kvmem_status kvmem_tensor_init(_Out_ kvmem_tensor *out, void *data, kvmem_dtype dtype, int32_t ndim, const int64_t *shape)',
  // Context and backends
  'kvmem_status kvmem_backends(_Out_ kvmem_backend_info *out, size_t capacity, _Out_ size_t *count)',
  'kvmem_context_params kvmem_context_default_params(void)',
  'kvmem_status kvmem_context_create(const kvmem_context_params *params, _Out_ kvmem_context **out)',
  'void kvmem_context_free(kvmem_context *ctx)',
  'const char *kvmem_context_backend(const kvmem_context *ctx)',
  'int32_t kvmem_context_n_threads(const kvmem_context *ctx)',
  // Model geometry
  'kvmem_model_spec kvmem_model_spec_default(void)',
  'kvmem_status kvmem_model_spec_validate(const kvmem_model_spec *spec)',
  'kvmem_status kvmem_rope_apply(const kvmem_model_spec *spec, float *x, size_t n_rows, size_t stride, const int32_t *positions, int32_t inverse)',
  // Pool and agents
  'kvmem_pool_params kvmem_pool_default_params(void)',
  'kvmem_status kvmem_pool_create(kvmem_context *ctx, const kvmem_model_spec *spec, const kvmem_pool_params *params, _Out_ kvmem_pool **out)',
  'void kvmem_pool_free(kvmem_pool *pool)',
  'kvmem_status kvmem_pool_get_info(kvmem_pool *pool, _Out_ kvmem_pool_info *out)',
  'kvmem_status kvmem_pool_get_spec(kvmem_pool *pool, _Out_ kvmem_model_spec *out)',
  'kvmem_status kvmem_pool_agent_id(kvmem_pool *pool, int32_t index, _Out_ uint8_t *buf, size_t size, _Out_ size_t *len)',
  'int32_t kvmem_agent_id_valid(const char *id)',
  'kvmem_status kvmem_agent_open(kvmem_pool *pool, const char *id, _Out_ kvmem_agent **out)',
  'void kvmem_agent_close(kvmem_agent *agent)',
  'kvmem_status kvmem_pool_remove_agent(kvmem_pool *pool, const char *id)',
  'const char *kvmem_agent_get_id(const kvmem_agent *agent)',
  'kvmem_append_params kvmem_append_default_params(void)',
  'kvmem_status kvmem_agent_append(kvmem_agent *agent, const kvmem_tensor *k, const kvmem_tensor *v, const kvmem_append_params *params)',
  'kvmem_status kvmem_agent_flush(kvmem_agent *agent)',
  'kvmem_status kvmem_agent_get_info(kvmem_agent *agent, _Out_ kvmem_agent_info *out)',
  'kvmem_status kvmem_agent_block_info(kvmem_agent *agent, int32_t block, _Out_ kvmem_block_info *out)',
  'kvmem_status kvmem_agent_read(kvmem_agent *agent, int64_t first_token, int64_t n_tokens, const kvmem_tensor *k_out, const kvmem_tensor *v_out)',
  'kvmem_status kvmem_agent_block_aabb(kvmem_agent *agent, int32_t block, float *out_min, float *out_max)',
  'kvmem_status kvmem_agent_tokens(kvmem_agent *agent, int64_t first, int64_t n, int32_t *out)',
  'kvmem_status kvmem_agent_text(kvmem_agent *agent, _Out_ const void **text, _Out_ size_t *len)',
  // MemArt retrieval
  'kvmem_retrieve_params kvmem_retrieve_default_params(void)',
  'kvmem_status kvmem_retrieval_create(_Out_ kvmem_retrieval **out)',
  'void kvmem_retrieval_free(kvmem_retrieval *r)',
  'kvmem_status kvmem_retrieve(kvmem_agent *agent, const kvmem_tensor *query, const kvmem_retrieve_params *params, kvmem_retrieval *result)',
  'int32_t kvmem_retrieval_n_sets(const kvmem_retrieval *r)',
  'kvmem_status kvmem_retrieval_get(const kvmem_retrieval *r, int32_t set, _Out_ const void **blocks, _Out_ const void **scores, _Out_ int32_t *n)',
  'kvmem_status kvmem_retrieval_copy(const kvmem_retrieval *r, int32_t set, int32_t *blocks, float *scores, int32_t capacity, _Out_ int32_t *n)',
  'kvmem_status kvmem_retrieval_block_scores(const kvmem_retrieval *r, int32_t set, _Out_ const void **scores, _Out_ int32_t *n_blocks)',
  'kvmem_status kvmem_retrieval_n_tokens(const kvmem_retrieval *r, int32_t set, _Out_ int64_t *n_tokens)',
  'kvmem_status kvmem_gather(kvmem_agent *agent, const int32_t *blocks, int32_t n_blocks, int64_t base_position, const kvmem_tensor *k_out, const kvmem_tensor *v_out)',
  // KEEP segments
  'kvmem_segments_params kvmem_segments_default_params(void)',
  'kvmem_status kvmem_segments_create(kvmem_pool *pool, const char *owner, const kvmem_segments_params *params, _Out_ kvmem_segments **out)',
  'void kvmem_segments_free(kvmem_segments *segs)',
  'kvmem_status kvmem_segments_add(kvmem_segments *segs, const char *name, int32_t group, _Out_ int32_t *index)',
  'kvmem_status kvmem_segments_update(kvmem_segments *segs, int32_t index)',
  'kvmem_status kvmem_segments_remove(kvmem_segments *segs, int32_t index)',
  'kvmem_status kvmem_segments_assign(kvmem_segments *segs, int32_t index, int32_t group)',
  'kvmem_status kvmem_segments_step(kvmem_segments *segs)',
  'kvmem_status kvmem_segments_drain_events(kvmem_segments *segs, _Out_ kvmem_segment_event *out, size_t capacity, _Out_ size_t *n_out, _Out_ size_t *n_left)',
  'kvmem_status kvmem_segments_store_segment(kvmem_segments *segs, int32_t index, const kvmem_tensor *k, const kvmem_tensor *v, const kvmem_append_params *params)',
  'kvmem_status kvmem_segments_store_group(kvmem_segments *segs, int32_t group, const kvmem_tensor *k, const kvmem_tensor *v, const kvmem_append_params *params)',
  'kvmem_status kvmem_segments_get_info(kvmem_segments *segs, _Out_ kvmem_segments_info *out)',
  'kvmem_status kvmem_segments_segment_info(kvmem_segments *segs, int32_t index, _Out_ kvmem_segment_info *out)',
  'kvmem_status kvmem_segments_group_info(kvmem_segments *segs, int32_t group, _Out_ kvmem_group_info *out)',
  'kvmem_status kvmem_segments_find(kvmem_segments *segs, const char *name, _Out_ int32_t *index)',
  'kvmem_status kvmem_segments_name(kvmem_segments *segs, int32_t index, _Out_ uint8_t *buf, size_t size, _Out_ size_t *len)',
  'kvmem_status kvmem_segments_group_members(kvmem_segments *segs, int32_t group, int32_t *out, size_t capacity, _Out_ size_t *n_members)',
  'kvmem_status kvmem_segments_plan(kvmem_segments *segs, const float *scores, size_t n_scores, int32_t max_units, _Out_ kvmem_segment_unit *out, size_t capacity, _Out_ size_t *n_units)',
  'kvmem_kmeans_params kvmem_kmeans_default_params(void)',
  'kvmem_status kvmem_cluster_kmeans(const float *emb, size_t n, size_t dim, const kvmem_kmeans_params *params, int32_t *labels, float *centroids, _Out_ int32_t *iters)',
  'kvmem_multihop_params kvmem_multihop_default_params(void)',
  'kvmem_status kvmem_multihop_select(const kvmem_multihop_params *params, const float *q2s, int32_t n_query, const float *s2s, int32_t n_segments, const uint8_t *candidates, uint8_t *selected, float *importance, _Out_ kvmem_multihop_result *result)',
  'kvmem_status kvmem_multihop_schedule(int32_t n_layers, float avg, float *ratios)',
  'kvmem_load_plan_params kvmem_load_plan_default_params(void)',
  'kvmem_status kvmem_load_plan(const kvmem_load_plan_params *params, const double *compute_ms, int32_t n_layers, const uint64_t *load_bytes, int32_t n_segments, const uint8_t *recompute, _Out_ kvmem_load_item *items, size_t capacity, _Out_ size_t *n_items, double *layer_start_ms, _Out_ kvmem_load_plan_stats *stats)',
];

const fns = {};       // name -> wrapped function (throws on a failing status)
const raw = {};       // name -> koffi function
const declared = {};  // name -> prototype
const missing = new Set();

function lastError() { return raw.kvmem_last_error() || ''; }
function statusStr(s) { return raw.kvmem_status_str(s) || `kvmem status ${s}`; }
function check(st) {
  if (st !== 0) throw errors.errorFor(st, lastError(), statusStr(st));
  return st;
}

for (const proto of DECLARATIONS) {
  const name = proto.slice(0, proto.indexOf('(')).trim().split(/[\s*]+/).pop();
  declared[name] = proto;
  let f;
  try {
    f = lib.func(proto);
  } catch (e) {
    if (!/cannot find function|symbol/i.test(e.message)) throw e;
    missing.add(name);
    const fail = () => { throw new errors.UnsupportedError(`${name} is not in ${libraryPath} (built from an older kvmem)`); };
    fns[name] = fail;
    fail.async = async () => fail();
    continue;
  }
  raw[name] = f;
  if (/^kvmem_status\s/.test(proto)) {
    const w = (...args) => check(f(...args));
    // The async form runs on a koffi worker thread; kvmem_last_error() is
    // thread-local there, so on failure the call is replayed synchronously on
    // this thread (a failed kvmem call changes nothing: the replay meets the
    // same state) to recover the message. Resolves with the status.
    w.async = (...args) => new Promise((resolve, reject) => {
      f.async(...args, (err, st) => {
        if (err) return reject(err);
        if (st === 0) return resolve(st);
        let again;
        try { again = f(...args); } catch (e) { return reject(e); }
        if (again === 0) return resolve(again); // the condition cleared: it succeeded once
        reject(errors.errorFor(again, lastError(), statusStr(again)));
      });
    });
    fns[name] = w;
  } else {
    fns[name] = f;
  }
}

// Names of the KVMEM_API functions declared in a kvmem.h text.
function headerFunctions(text) {
  text = text.replace(/\/\*[\s\S]*?\*\//g, ' ').replace(/^\s*#.*$/gm, ' ');
  const out = [];
  const re = /KVMEM_API\b[^;(]*?\b(kvmem_\w+)\s*\(/g;
  let m;
  while ((m = re.exec(text))) out.push(m[1]);
  return out;
}

module.exports = { koffi, lib, libraryPath, types, fns, raw, declared, missing, check, lastError, statusStr, headerFunctions, MAX_DIMS };
