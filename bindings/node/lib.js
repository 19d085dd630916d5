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
const { checkInt, isInt } = require('./ints');
const { camel } = require('./names');

const SONAMES = process.platform === 'darwin' ? ['libkvmem.0.dylib', 'libkvmem.dylib'] : ['libkvmem.so.0', 'libkvmem.so'];

function candidates() {
  const out = [];
  if (process.env.KVMEM_LIBRARY) out.push(process.env.KVMEM_LIBRARY);
  // built for this machine by scripts/build.js, then the package's prebuilt one
  for (const n of SONAMES) out.push(path.join(__dirname, 'build', n));
  for (const n of SONAMES) out.push(path.join(__dirname, 'prebuilds', `${process.platform}-${process.arch}`, n));
  for (const n of SONAMES) out.push(path.join(__dirname, n));
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
  // an installed package without a prebuilt library for this platform carries the sources
  const hint = fs.existsSync(path.join(__dirname, 'csrc'))
    ? `No prebuilt library fits ${process.platform}-${process.arch}: build it from the package's sources ` +
      `(cmake and a C compiler) with \`node ${path.join(__dirname, 'scripts', 'build.js')}\`, or let npm run ` +
      'the install step: npm install-scripts approve kvmem && npm rebuild kvmem. Or set KVMEM_LIBRARY. '
    : 'Set KVMEM_LIBRARY to its path, or build it (make build) / install it. ';
  throw new Error(`kvmem: cannot load libkvmem. ${hint}Looked in:\n  ` + tried.join('\n  '));
}

const { lib, path: libraryPath } = load();

// ---- types mirroring include/kvmem.h ----
const MAX_DIMS = 6;
for (const e of ['kvmem_status', 'kvmem_dtype', 'kvmem_log_level', 'kvmem_rope_style', 'kvmem_rope_scaling'])
  koffi.alias(e, 'int');
for (const e of ['kvmem_retrieve_mode', 'kvmem_retrieve_norm', 'kvmem_retrieve_agg', 'kvmem_retrieve_scope'])
  koffi.alias(e, 'int');
koffi.alias('kvmem_group_state', 'int');
koffi.alias('kvmem_session_kind', 'int');
koffi.alias('kvmem_prefix_kind', 'int');
koffi.alias('kvmem_arrange_order', 'int');
for (const e of ['kvmem_attend_source_kind', 'kvmem_attend_order', 'kvmem_attend_probe']) koffi.alias(e, 'int');
for (const o of ['kvmem_qmem_store', 'kvmem_qmem_head', 'kvmem_kvstore', 'kvmem_slotmap']) koffi.opaque(o);
for (const o of ['kvmem_context', 'kvmem_pool', 'kvmem_agent', 'kvmem_retrieval', 'kvmem_segments']) koffi.opaque(o);

const types = {
  kvmem_tensor: koffi.struct('kvmem_tensor', {
    data: 'void *', dtype: 'kvmem_dtype', ndim: 'int32_t',
    shape: koffi.array('int64_t', MAX_DIMS), strides: koffi.array('int64_t', MAX_DIMS),
  }),
  kvmem_backend_info: koffi.struct('kvmem_backend_info', {
    name: 'const char *', available: 'int32_t', detail: 'const char *',
  }),
  kvmem_context_params: koffi.struct('kvmem_context_params', { struct_size: 'size_t', backend: 'const char *', n_threads: 'int32_t', reserved: 'int32_t' }),
  kvmem_model_spec: koffi.struct('kvmem_model_spec', {
    n_layers: 'int32_t', n_q_heads: 'int32_t', n_kv_heads: 'int32_t', head_dim: 'int32_t',
    rotary_dim: 'int32_t', rope_style: 'kvmem_rope_style', rope_theta: 'double',
    rope_scaling: 'kvmem_rope_scaling', rope_factor: 'double', rope_low_freq_factor: 'double',
    rope_high_freq_factor: 'double', rope_original_max_pos: 'int32_t', yarn_beta_fast: 'double',
    yarn_beta_slow: 'double', yarn_attn_factor: 'double', layer_window: 'const int32_t *',
    model_id: koffi.array('char', 128, 'String'),
  }),
  // the frozen spec's fields after struct_size, ordered without padding
  kvmem_model_spec_v2: koffi.struct('kvmem_model_spec_v2', {
    struct_size: 'size_t', layer_window: 'const int32_t *', n_layers: 'int32_t', n_q_heads: 'int32_t',
    n_kv_heads: 'int32_t', head_dim: 'int32_t', rotary_dim: 'int32_t', rope_style: 'kvmem_rope_style',
    rope_scaling: 'kvmem_rope_scaling', rope_original_max_pos: 'int32_t', rope_theta: 'double', rope_factor: 'double',
    rope_low_freq_factor: 'double', rope_high_freq_factor: 'double', yarn_beta_fast: 'double', yarn_beta_slow: 'double',
    yarn_attn_factor: 'double', model_id: koffi.array('char', 128, 'String'),
  }),
  kvmem_pool_params: koffi.struct('kvmem_pool_params', {
    struct_size: 'size_t',
    block_size: 'int32_t', storage_dtype: 'kvmem_dtype', capacity_bytes: 'uint64_t',
    max_agents: 'int32_t', max_tokens_per_agent: 'int32_t', store_dir: 'const char *', host_budget_bytes: 'uint64_t',
    device_capacity_bytes: 'uint64_t',
  }),
  kvmem_pool_info: koffi.struct('kvmem_pool_info', {
    used_bytes: 'uint64_t', capacity_bytes: 'uint64_t', n_agents: 'int32_t', block_size: 'int32_t',
    storage_dtype: 'kvmem_dtype', reserved: 'int32_t',
  }),
  kvmem_append_params: koffi.struct('kvmem_append_params', {
    struct_size: 'size_t',
    token_ids: 'const int32_t *', text: 'const char *', text_len: 'size_t',
    token_text_offsets: 'const int32_t *', positions: 'const int32_t *',
    keys_rotated: 'int32_t', reserved: 'int32_t',
  }),
  kvmem_agent_info: koffi.struct('kvmem_agent_info', {
    n_tokens: 'int64_t', n_blocks: 'int32_t', n_sealed: 'int32_t', bytes: 'uint64_t', text_bytes: 'uint64_t',
  }),
  kvmem_block_info: koffi.struct('kvmem_block_info', { first_token: 'int64_t', n_tokens: 'int32_t', sealed: 'int32_t' }),
  kvmem_retrieve_params: koffi.struct('kvmem_retrieve_params', {
    struct_size: 'size_t',
    top_k: 'int32_t', mode: 'kvmem_retrieve_mode', norm: 'kvmem_retrieve_norm', agg: 'kvmem_retrieve_agg',
    scope: 'kvmem_retrieve_scope', tau: 'float', rr_c: 'float', exclude: 'const int32_t *', n_exclude: 'int32_t',
    always_include: 'const int32_t *', n_always_include: 'int32_t', recent_window: 'int32_t', skip_recent: 'int32_t',
    reserved: 'int32_t',
  }),
  kvmem_segments_params: koffi.struct('kvmem_segments_params', { struct_size: 'size_t', static_after_steps: 'int32_t', max_segments: 'int32_t' }),
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
  kvmem_kmeans_params: koffi.struct('kvmem_kmeans_params', { struct_size: 'size_t', k: 'int32_t', max_iters: 'int32_t', seed: 'uint64_t' }),
  kvmem_multihop_params: koffi.struct('kvmem_multihop_params', { struct_size: 'size_t', ratio: 'float', max_iters: 'int32_t' }),
  kvmem_multihop_result: koffi.struct('kvmem_multihop_result', { n_selected: 'int32_t', iters: 'int32_t', converged: 'int32_t', reserved: 'int32_t' }),
  kvmem_load_plan_params: koffi.struct('kvmem_load_plan_params', { struct_size: 'size_t', bandwidth_gbps: 'double', max_ahead: 'int32_t', reserved: 'int32_t' }),
  kvmem_load_item: koffi.struct('kvmem_load_item', {
    segment: 'int32_t', layer: 'int32_t', issue_layer: 'int32_t', reserved: 'int32_t', start_ms: 'double', end_ms: 'double',
  }),
  kvmem_load_plan_stats: koffi.struct('kvmem_load_plan_stats', {
    naive_makespan_ms: 'double', naive_compute_idle_ms: 'double', naive_load_idle_ms: 'double',
    balanced_makespan_ms: 'double', balanced_compute_idle_ms: 'double', balanced_load_idle_ms: 'double',
    compute_ms: 'double', load_ms: 'double', n_loads: 'uint64_t',
  }),
  kvmem_session_key: koffi.struct('kvmem_session_key', { hi: 'uint64_t', lo: 'uint64_t', kind: 'kvmem_session_kind', reserved: 'int32_t' }),
  kvmem_session_source: koffi.struct('kvmem_session_source', {
    session_id: 'const char *', token_ids: 'const int32_t *', n_tokens: 'int64_t', mark_begin: 'int64_t', mark_end: 'int64_t',
  }),
  kvmem_session_source_v2: koffi.struct('kvmem_session_source_v2', {
    struct_size: 'size_t', session_id: 'const char *', token_ids: 'const int32_t *', n_tokens: 'int64_t', mark_begin: 'int64_t',
    mark_end: 'int64_t',
  }),
  kvmem_qmem_params: koffi.struct('kvmem_qmem_params', { struct_size: 'size_t', capacity: 'int32_t', prefix_tokens: 'int32_t', lambda: 'double' }),
  kvmem_kvstore_params: koffi.struct('kvmem_kvstore_params', { struct_size: 'size_t', page_slots: 'int32_t', max_slots: 'int64_t' }),
  kvmem_kvstore_info: koffi.struct('kvmem_kvstore_info', {
    n_slots: 'int64_t', n_used: 'int64_t', n_free: 'int64_t', page_slots: 'int32_t', dead_slot: 'int32_t',
  }),
  kvmem_slotmap_info: koffi.struct('kvmem_slotmap_info', { length: 'int64_t', n_live: 'int64_t', protect: 'int64_t', n_parked: 'int64_t' }),
  kvmem_attend_source: koffi.struct('kvmem_attend_source', {
    kind: 'kvmem_attend_source_kind', layer: 'int32_t', k: 'const kvmem_tensor *', v: 'const kvmem_tensor *',
    slots: 'const int32_t *', n_positions: 'int64_t', dead_slot: 'int32_t', reserved: 'int32_t',
    agent: 'kvmem_agent *', positions: 'const int32_t *', base_position: 'int64_t', mask: 'const uint8_t *',
  }),
  kvmem_attend_source_v2: koffi.struct('kvmem_attend_source_v2', {
    struct_size: 'size_t', kind: 'kvmem_attend_source_kind', layer: 'int32_t', k: 'const kvmem_tensor *',
    v: 'const kvmem_tensor *', slots: 'const int32_t *', n_positions: 'int64_t', dead_slot: 'int32_t', reserved: 'int32_t',
    agent: 'kvmem_agent *', positions: 'const int32_t *', mask: 'const uint8_t *', base_position: 'int64_t',
  }),
  kvmem_attend_params: koffi.struct('kvmem_attend_params', {
    struct_size: 'size_t',
    order: 'kvmem_attend_order', n_sink: 'int32_t', tile_order: 'const int32_t *', n_tile_order: 'int32_t',
    tile_size: 'int32_t', scale: 'float', tau_s: 'float', tau_d: 'float', patience: 'int32_t',
    probe: 'kvmem_attend_probe', causal: 'int32_t', compare: 'int32_t', reserved: 'int32_t',
  }),
  kvmem_attend_stats: koffi.struct('kvmem_attend_stats', {
    n_streams: 'int64_t', tiles_total: 'int64_t', tiles_visited: 'int64_t', streams_stopped: 'int64_t',
    oracle_tiles: 'int64_t', oracle_agree: 'int64_t', positions_read: 'int64_t', stopped_early: 'int32_t', reserved: 'int32_t',
  }),
  kvmem_prefix_params: koffi.struct('kvmem_prefix_params', { struct_size: 'size_t', min_ratio: 'double' }),
  kvmem_device_memory: koffi.struct('kvmem_device_memory', {
    struct_size: 'size_t', kind: 'int', device: 'int32_t', handle: 'uint64_t', offset: 'uint64_t', size: 'uint64_t',
    stream: 'void *',
  }),
  kvmem_vulkan_device: koffi.struct('kvmem_vulkan_device', {
    struct_size: 'size_t', instance: 'void *', physical_device: 'void *', device: 'void *', queue: 'void *',
    queue_family: 'uint32_t', api_version: 'uint32_t',
  }),
  kvmem_prefix_result: koffi.struct('kvmem_prefix_result', {
    kind: 'kvmem_prefix_kind', reserved: 'int32_t', reuse_tokens: 'int64_t', common_bytes: 'size_t', process_from: 'size_t',
  }),
  kvmem_window_plan: koffi.struct('kvmem_window_plan', { memory_tokens: 'int32_t', top_k: 'int32_t', live_tokens: 'int32_t' }),
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
  'size_t kvmem_agent_last_error(const kvmem_agent *agent, void *buf, size_t size)',
  'size_t kvmem_pool_last_error(const kvmem_pool *pool, void *buf, size_t size)',
  'size_t kvmem_context_last_error(const kvmem_context *ctx, void *buf, size_t size)',
  'void kvmem_log_set(kvmem_log_callback *callback, void *user_data)',
  'void kvmem_free(void *ptr)',
  // Tensors
  'const char *kvmem_dtype_name(kvmem_dtype dtype)',
  'kvmem_status kvmem_tensor_init(_Out_ kvmem_tensor *out, void *data, kvmem_dtype dtype, int32_t ndim, const int64_t *shape)',
  // Context and backends
  'kvmem_status kvmem_backends(_Out_ kvmem_backend_info *out, size_t capacity, _Out_ size_t *count)',
  'kvmem_status kvmem_context_params_init(_Out_ kvmem_context_params *params, size_t struct_size)',
  'kvmem_status kvmem_context_create(const kvmem_context_params *params, _Out_ kvmem_context **out)',
  'void kvmem_context_free(kvmem_context *ctx)',
  'const char *kvmem_context_backend(const kvmem_context *ctx)',
  'int32_t kvmem_context_n_threads(const kvmem_context *ctx)',
  // (experimental) host <-> device transfer counters
  'kvmem_status kvmem_context_transfer_stats(const kvmem_context *ctx, _Out_ uint64_t *h2d_bytes, _Out_ uint64_t *d2h_bytes)',
  'kvmem_status kvmem_context_transfer_reset(kvmem_context *ctx)',
  'kvmem_status kvmem_pool_device_stats(kvmem_pool *pool, _Out_ uint64_t *mirror_bytes, _Out_ uint64_t *evictions, _Out_ uint64_t *unmirrored)',
  'kvmem_status kvmem_tensor_init_device(_Out_ kvmem_tensor *out, const kvmem_device_memory *mem, kvmem_dtype dtype, int32_t ndim, const int64_t *shape)',
  'kvmem_status kvmem_context_vulkan_device(const kvmem_context *ctx, _Inout_ kvmem_vulkan_device *out)',
  // Model geometry
  'kvmem_model_spec kvmem_model_spec_default(void)',
  'kvmem_status kvmem_model_spec_validate(const kvmem_model_spec *spec)',
  'kvmem_status kvmem_rope_apply(const kvmem_model_spec *spec, float *x, size_t n_rows, size_t stride, const int32_t *positions, int32_t inverse)',
  // Pool and agents
  'kvmem_status kvmem_pool_params_init(_Out_ kvmem_pool_params *params, size_t struct_size)',
  'kvmem_status kvmem_pool_create(kvmem_context *ctx, const kvmem_model_spec *spec, const kvmem_pool_params *params, _Out_ kvmem_pool **out)',
  'void kvmem_pool_free(kvmem_pool *pool)',
  'kvmem_status kvmem_pool_get_info(kvmem_pool *pool, _Out_ kvmem_pool_info *out)',
  'kvmem_status kvmem_pool_get_spec(kvmem_pool *pool, _Out_ kvmem_model_spec *out)',
  'kvmem_status kvmem_pool_agent_id(kvmem_pool *pool, int32_t index, _Out_ uint8_t *buf, size_t size, _Out_ size_t *len)',
  'int32_t kvmem_agent_id_valid(const char *id)',
  'kvmem_status kvmem_agent_open(kvmem_pool *pool, const char *id, _Out_ kvmem_agent **out)',
  'kvmem_status kvmem_agent_open_file(kvmem_pool *pool, const char *path, uint32_t flags, _Out_ kvmem_agent **out)',
  'void kvmem_agent_close(kvmem_agent *agent)',
  'kvmem_status kvmem_pool_remove_agent(kvmem_pool *pool, const char *id)',
  'const char *kvmem_agent_get_id(const kvmem_agent *agent)',
  'kvmem_status kvmem_append_params_init(_Out_ kvmem_append_params *params, size_t struct_size)',
  'kvmem_status kvmem_agent_append(kvmem_agent *agent, const kvmem_tensor *k, const kvmem_tensor *v, const kvmem_append_params *params)',
  'kvmem_status kvmem_agent_flush(kvmem_agent *agent)',
  'kvmem_status kvmem_agent_get_info(kvmem_agent *agent, _Out_ kvmem_agent_info *out)',
  'kvmem_status kvmem_agent_block_info(kvmem_agent *agent, int32_t block, _Out_ kvmem_block_info *out)',
  'kvmem_status kvmem_agent_read(kvmem_agent *agent, int64_t first_token, int64_t n_tokens, const kvmem_tensor *k_out, const kvmem_tensor *v_out)',
  'kvmem_status kvmem_agent_block_aabb(kvmem_agent *agent, int32_t block, float *out_min, float *out_max)',
  'kvmem_status kvmem_agent_tokens(kvmem_agent *agent, int64_t first, int64_t n, int32_t *out)',
  'kvmem_status kvmem_agent_text(kvmem_agent *agent, _Out_ const void **text, _Out_ size_t *len)',
  // MemArt retrieval
  'kvmem_status kvmem_retrieve_params_init(_Out_ kvmem_retrieve_params *params, size_t struct_size)',
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
  'kvmem_status kvmem_segments_params_init(_Out_ kvmem_segments_params *params, size_t struct_size)',
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
  'kvmem_status kvmem_kmeans_params_init(_Out_ kvmem_kmeans_params *params, size_t struct_size)',
  'kvmem_status kvmem_cluster_kmeans(const float *emb, size_t n, size_t dim, const kvmem_kmeans_params *params, int32_t *labels, float *centroids, _Out_ int32_t *iters)',
  'kvmem_status kvmem_multihop_params_init(_Out_ kvmem_multihop_params *params, size_t struct_size)',
  'kvmem_status kvmem_multihop_select(const kvmem_multihop_params *params, const float *q2s, int32_t n_query, const float *s2s, int32_t n_segments, const uint8_t *candidates, uint8_t *selected, float *importance, _Out_ kvmem_multihop_result *result)',
  'kvmem_status kvmem_multihop_schedule(int32_t n_layers, float avg, float *ratios)',
  'kvmem_status kvmem_load_plan_params_init(_Out_ kvmem_load_plan_params *params, size_t struct_size)',
  'kvmem_status kvmem_load_plan(const kvmem_load_plan_params *params, const double *compute_ms, int32_t n_layers, const uint64_t *load_bytes, int32_t n_segments, const uint8_t *recompute, _Out_ kvmem_load_item *items, size_t capacity, _Out_ size_t *n_items, double *layer_start_ms, _Out_ kvmem_load_plan_stats *stats)',
  // IntentKV: QueryMemory, selection baselines, slot maps
  'kvmem_status kvmem_qmem_params_init(_Out_ kvmem_qmem_params *params, size_t struct_size)',
  'kvmem_status kvmem_qmem_store_create(const kvmem_model_spec *spec, const kvmem_qmem_params *params, _Out_ kvmem_qmem_store **out)',
  'void kvmem_qmem_store_free(kvmem_qmem_store *store)',
  'kvmem_status kvmem_session_key_derive(const kvmem_qmem_store *store, const kvmem_session_source *src, _Out_ kvmem_session_key *out)',
  'kvmem_status kvmem_session_key_derive_v2(const kvmem_qmem_store *store, const kvmem_session_source_v2 *src, _Out_ kvmem_session_key *out)',
  'kvmem_status kvmem_qmem_update(kvmem_qmem_store *store, const kvmem_session_key *key, const kvmem_tensor *q, int64_t span_begin, int64_t span_end, float *memory_out)',
  'kvmem_status kvmem_qmem_get(kvmem_qmem_store *store, const kvmem_session_key *key, float *out)',
  'int32_t kvmem_qmem_count(const kvmem_qmem_store *store)',
  'kvmem_status kvmem_qmem_score(kvmem_context *ctx, const kvmem_model_spec *spec, const float *memory, const kvmem_tensor *k, float *scores)',
  'kvmem_status kvmem_qmem_head_load(const char *path, _Out_ kvmem_qmem_head **out)',
  'kvmem_status kvmem_qmem_head_load_buffer(const void *data, size_t size, _Out_ kvmem_qmem_head **out)',
  'void kvmem_qmem_head_free(kvmem_qmem_head *head)',
  'int32_t kvmem_qmem_head_dim(const kvmem_qmem_head *head)',
  'float kvmem_qmem_head_alpha(const kvmem_qmem_head *head)',
  'kvmem_status kvmem_qmem_head_apply(const kvmem_qmem_head *head, const kvmem_model_spec *spec, const float *memory, const kvmem_tensor *k, const float *rule, int64_t span_begin, int64_t span_end, float *scores_out)',
  'kvmem_status kvmem_select_keep(const float *scores, int64_t n, int64_t budget, int64_t protect, int64_t span_begin, int64_t span_end, int32_t *kept, _Out_ int64_t *n_kept)',
  'kvmem_status kvmem_streaming_keep(int64_t n, int64_t n_sink, int64_t window, int32_t *kept, _Out_ int64_t *n_kept)',
  'kvmem_status kvmem_h2o_accumulate(const float *probs, int64_t n_rows, int64_t n, float *acc)',
  'kvmem_status kvmem_h2o_keep(const float *acc, int64_t n, int64_t budget, int64_t recent, int32_t *kept, _Out_ int64_t *n_kept)',
  'kvmem_status kvmem_snapkv_score(kvmem_context *ctx, const kvmem_model_spec *spec, const kvmem_tensor *q_obs, const kvmem_tensor *k, int32_t pool_kernel, float *scores)',
  'kvmem_status kvmem_arrange(const int32_t *blocks, const float *scores, int32_t n, kvmem_arrange_order order, int32_t *out)',
  'kvmem_status kvmem_window_split(int32_t window, int32_t reserve, float memory_share, float live_share, int32_t block_size, _Out_ kvmem_window_plan *out)',
  'kvmem_status kvmem_kvstore_params_init(_Out_ kvmem_kvstore_params *params, size_t struct_size)',
  'kvmem_status kvmem_kvstore_create(const kvmem_model_spec *spec, const kvmem_kvstore_params *params, _Out_ kvmem_kvstore **out)',
  'void kvmem_kvstore_free(kvmem_kvstore *store)',
  'kvmem_status kvmem_kvstore_get_info(kvmem_kvstore *store, _Out_ kvmem_kvstore_info *out)',
  'kvmem_status kvmem_kvstore_slot_refs(kvmem_kvstore *store, int32_t slot, _Out_ int32_t *refs)',
  'kvmem_status kvmem_kvstore_read_slot(kvmem_kvstore *store, int32_t slot, float *k_out, float *v_out)',
  'kvmem_status kvmem_slotmap_create(kvmem_kvstore *store, _Out_ kvmem_slotmap **out)',
  'kvmem_status kvmem_slotmap_fork(kvmem_slotmap *parent, int64_t prefix_len, _Out_ kvmem_slotmap **out)',
  'void kvmem_slotmap_free(kvmem_slotmap *map)',
  'kvmem_status kvmem_slotmap_append(kvmem_slotmap *map, const kvmem_tensor *k, const kvmem_tensor *v)',
  'kvmem_status kvmem_slotmap_set_protected(kvmem_slotmap *map, int64_t protect)',
  'kvmem_status kvmem_slotmap_evict(kvmem_slotmap *map, const int32_t *kept, int64_t n_kept, _Out_ int64_t *n_freed)',
  'kvmem_status kvmem_slotmap_compact(kvmem_slotmap *map, const int32_t *kept, int64_t n_kept, _Out_ int64_t *n_freed)',
  'kvmem_status kvmem_slotmap_slots(const kvmem_slotmap *map, _Out_ const void **slots, _Out_ int64_t *len, _Out_ int32_t *dead_slot)',
  'kvmem_status kvmem_slotmap_get_info(const kvmem_slotmap *map, _Out_ kvmem_slotmap_info *out)',
  'kvmem_status kvmem_slotmap_gather(const kvmem_slotmap *map, const kvmem_tensor *k_out, const kvmem_tensor *v_out, int32_t *positions_out)',
  // ART attention
  'kvmem_status kvmem_attend_params_init(_Out_ kvmem_attend_params *params, size_t struct_size)',
  'kvmem_status kvmem_attend(kvmem_context *ctx, const kvmem_tensor *q, const kvmem_attend_source *source, const kvmem_attend_params *params, const kvmem_tensor *out, _Out_ kvmem_attend_stats *stats)',
  'kvmem_status kvmem_attend_v2(kvmem_context *ctx, const kvmem_tensor *q, const kvmem_attend_source_v2 *source, const kvmem_attend_params *params, const kvmem_tensor *out, _Out_ kvmem_attend_stats *stats)',
  // Persistence, prefix, batch
  'kvmem_status kvmem_agent_save(kvmem_agent *agent, const char *path)',
  'kvmem_status kvmem_agent_load(kvmem_agent *agent, const char *path)',
  'kvmem_status kvmem_pool_sync(kvmem_pool *pool)',
  'kvmem_status kvmem_agent_truncate(kvmem_agent *agent, int64_t n_tokens)',
  'kvmem_status kvmem_prefix_params_init(_Out_ kvmem_prefix_params *params, size_t struct_size)',
  'kvmem_status kvmem_prefix_match(kvmem_agent *agent, const char *new_text, size_t new_len, const kvmem_prefix_params *params, _Out_ kvmem_prefix_result *out)',
  'kvmem_status kvmem_batch_merge(kvmem_agent **agents, int32_t n_agents, int32_t layer, const kvmem_tensor *k_out, const kvmem_tensor *v_out, int64_t *lengths)',
  'kvmem_status kvmem_batch_extract(const kvmem_tensor *batch, int32_t row, int64_t length, int64_t first, int64_t n, const kvmem_tensor *out)',
  // Deprecated: the failure message in a caller buffer (asyncForm's fallback for a library
  // older than kvmem_agent_last_error and co)
  // the model spec that grows (kvmem_model_spec_v2) and the _v2 forms of the calls that take a spec
  'kvmem_status kvmem_model_spec_v2_init(_Out_ kvmem_model_spec_v2 *spec, size_t struct_size)',
  'kvmem_status kvmem_model_spec_validate_v2(const kvmem_model_spec_v2 *spec)',
  'kvmem_status kvmem_rope_apply_v2(const kvmem_model_spec_v2 *spec, float *x, size_t n_rows, size_t stride, const int32_t *positions, int32_t inverse)',
  'kvmem_status kvmem_pool_create_v2(kvmem_context *ctx, const kvmem_model_spec_v2 *spec, const kvmem_pool_params *params, _Out_ kvmem_pool **out)',
  'kvmem_status kvmem_pool_get_spec_v2(kvmem_pool *pool, _Inout_ kvmem_model_spec_v2 *out)',
  'kvmem_status kvmem_qmem_store_create_v2(const kvmem_model_spec_v2 *spec, const kvmem_qmem_params *params, _Out_ kvmem_qmem_store **out)',
  'kvmem_status kvmem_qmem_score_v2(kvmem_context *ctx, const kvmem_model_spec_v2 *spec, const float *memory, const kvmem_tensor *k, float *scores)',
  'kvmem_status kvmem_kvstore_create_v2(const kvmem_model_spec_v2 *spec, const kvmem_kvstore_params *params, _Out_ kvmem_kvstore **out)',
  'kvmem_status kvmem_qmem_head_apply_v2(const kvmem_qmem_head *head, const kvmem_model_spec_v2 *spec, const float *memory, const kvmem_tensor *k, const float *rule, int64_t span_begin, int64_t span_end, float *scores_out)',
  'kvmem_status kvmem_snapkv_score_v2(kvmem_context *ctx, const kvmem_model_spec_v2 *spec, const kvmem_tensor *q_obs, const kvmem_tensor *k, int32_t pool_kernel, float *scores)',
  'kvmem_status kvmem_pool_sync_errbuf(kvmem_pool *pool, void *errbuf, size_t errbuf_size)',
  'kvmem_status kvmem_agent_append_errbuf(kvmem_agent *agent, const kvmem_tensor *k, const kvmem_tensor *v, const kvmem_append_params *params, void *errbuf, size_t errbuf_size)',
  'kvmem_status kvmem_agent_read_errbuf(kvmem_agent *agent, int64_t first_token, int64_t n_tokens, const kvmem_tensor *k_out, const kvmem_tensor *v_out, void *errbuf, size_t errbuf_size)',
  'kvmem_status kvmem_agent_save_errbuf(kvmem_agent *agent, const char *path, void *errbuf, size_t errbuf_size)',
  'kvmem_status kvmem_agent_load_errbuf(kvmem_agent *agent, const char *path, void *errbuf, size_t errbuf_size)',
  'kvmem_status kvmem_retrieve_errbuf(kvmem_agent *agent, const kvmem_tensor *query, const kvmem_retrieve_params *params, kvmem_retrieval *result, void *errbuf, size_t errbuf_size)',
  'kvmem_status kvmem_gather_errbuf(kvmem_agent *agent, const int32_t *blocks, int32_t n_blocks, int64_t base_position, const kvmem_tensor *k_out, const kvmem_tensor *v_out, void *errbuf, size_t errbuf_size)',
  'kvmem_status kvmem_attend_errbuf(kvmem_context *ctx, const kvmem_tensor *q, const kvmem_attend_source *source, const kvmem_attend_params *params, const kvmem_tensor *out, _Out_ kvmem_attend_stats *stats, void *errbuf, size_t errbuf_size)',
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

// kvmem_last_error()'s buffer size in the core: no message is longer
const ERRBUF_SIZE = 512;

// The calls that do real work get `.async` (a koffi worker-thread call).
const ASYNC_CALLS = ['kvmem_pool_sync', 'kvmem_pool_get_info', 'kvmem_agent_open', 'kvmem_pool_remove_agent', 'kvmem_agent_flush', 'kvmem_agent_append', 'kvmem_agent_read', 'kvmem_agent_save',
                     'kvmem_agent_load', 'kvmem_retrieve', 'kvmem_gather', 'kvmem_attend', 'kvmem_attend_v2'];

// The `.async` form of a status function: a koffi async call runs on a worker
// thread, where kvmem_last_error() stays, so a failure's message is read from
// the object the call was made on (its first argument: kvmem_agent_last_error,
// kvmem_pool_last_error, kvmem_context_last_error) once the call has settled.
// The call runs once; a failure rejects with its own message. Resolves with the
// status. A library older than those falls back to NAME_errbuf.
function asyncForm(name, f) {
  const kind = /\(\s*(?:const\s+)?kvmem_(agent|pool|context)\s*\*/.exec(declared[name] || '');
  const objError = kind && raw[`kvmem_${kind[1]}_last_error`];
  const eb = raw[name + '_errbuf'];
  const text = (buf) => { const end = buf.indexOf(0); return buf.toString('utf8', 0, end < 0 ? buf.length : end); };
  return (...args) => new Promise((resolve, reject) => {
    if (!objError && eb) {
      const buf = Buffer.alloc(ERRBUF_SIZE);
      eb.async(...args, buf, buf.length, (err, st) => {
        if (err) return reject(err);
        if (st === 0) return resolve(st);
        reject(errors.errorFor(st, text(buf), statusStr(st)));
      });
      return;
    }
    f.async(...args, (err, st) => {
      if (err) return reject(err);
      if (st === 0) return resolve(st);
      if (!objError) { // neither: the status, and why there is no message
        return reject(errors.errorFor(st, `${name} failed on a worker thread (${statusStr(st)}); ${libraryPath} has no ` +
                                          'kvmem_*_last_error to say why: use the synchronous call or a newer libkvmem', statusStr(st)));
      }
      const buf = Buffer.alloc(ERRBUF_SIZE);
      objError(args[0], buf, buf.length);
      reject(errors.errorFor(st, text(buf), statusStr(st)));
    });
  });
}

// f with its integer arguments, and the integer fields of the structs it takes by
// pointer, checked before C (ints.js): koffi would wrap them.
function guarded(f, proto) {
  const inner = proto.slice(proto.indexOf('(') + 1, proto.lastIndexOf(')')).trim();
  const params = inner === 'void' || !inner ? [] : inner.split(',').map((p) => p.trim());
  const checks = [];
  f.info.arguments.forEach((t, i) => {
    const p = params[i], what = camel(p.split(/[\s*]+/).pop());
    const ti = koffi.introspect(t);
    if (isInt(ti.primitive)) {
      checks.push((a) => { a[i] = checkInt(a[i], what, ti.primitive); });
    } else if (ti.primitive === 'Pointer' && !p.startsWith('_Out_') && ti.ref && koffi.introspect(ti.ref).primitive === 'Record') {
      const ints = Object.values(koffi.introspect(ti.ref).members)
        .map((m) => [m.name, koffi.introspect(m.type).primitive]).filter(([, prim]) => isInt(prim));
      if (ints.length) {
        checks.push((a) => {
          const o = a[i];
          if (!o || typeof o !== 'object' || ArrayBuffer.isView(o)) return;
          for (const [name, prim] of ints) if (o[name] !== undefined) checkInt(o[name], camel(name), prim);
        });
      }
    }
  });
  if (!checks.length) return f;
  const run = (a) => { for (const c of checks) c(a); return a; };
  const g = (...a) => f(...run(a));
  g.async = (...a) => {
    try { run(a); } catch (e) { return a[a.length - 1](e); } // the callback: the call rejects
    return f.async(...a);
  };
  g.info = f.info;
  return g;
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
  f = guarded(f, proto);
  raw[name] = f;
  fns[name] = /^kvmem_status\s/.test(proto) ? (...args) => check(f(...args)) : f;
}
for (const name of ASYNC_CALLS) if (raw[name]) fns[name].async = asyncForm(name, raw[name]);

// kvmem.h's inline kvmem_X_default_params(): struct_size is the size of the
// struct mirrored here, so against a newer library this binding gets the
// defaults of the fields it knows and the library uses its own for the rest.
for (const name of ['context', 'pool', 'append', 'retrieve', 'qmem', 'kvstore', 'attend', 'prefix', 'segments',
                    'kmeans', 'multihop', 'load_plan']) {
  const init = fns[`kvmem_${name}_params_init`], size = koffi.sizeof(types[`kvmem_${name}_params`]);
  fns[`kvmem_${name}_default_params`] = () => { const p = {}; init(p, size); return p; };
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
