package kvmem

/*
#include <stdlib.h>
#include <kvmem.h>

static void kvgo_ikv_tensor(kvmem_tensor *t, void *data, const int64_t *meta) {
	t->data = data;
	t->dtype = (kvmem_dtype)meta[0];
	t->ndim = (int32_t)meta[1];
	for (int i = 0; i < KVMEM_MAX_DIMS; i++) { t->shape[i] = meta[2 + i]; t->strides[i] = meta[2 + KVMEM_MAX_DIMS + i]; }
}

// The growable source form where the loaded library has it (see attend.go).
#pragma weak kvmem_session_key_derive_v2
// and the growable spec (spec.go)
int kvgo_spec_v2(const kvmem_model_spec *s, kvmem_model_spec_v2 *v);
#pragma weak kvmem_qmem_score_v2
#pragma weak kvmem_qmem_head_apply_v2
#pragma weak kvmem_snapkv_score_v2
#pragma weak kvmem_qmem_store_create_v2
#pragma weak kvmem_kvstore_create_v2

static kvmem_status kvgo_session_key_derive(const kvmem_qmem_store *s, const char *sid, const int32_t *ids,
                                            int64_t n, int64_t mb, int64_t me, kvmem_session_key *out) {
	if (kvmem_session_key_derive_v2) {
		kvmem_session_source_v2 v2;
		kvmem_session_source_v2_init(&v2);
		v2.session_id = sid, v2.token_ids = ids, v2.n_tokens = n, v2.mark_begin = mb, v2.mark_end = me;
		return kvmem_session_key_derive_v2(s, &v2, out);
	}
	kvmem_session_source src;
	src.session_id = sid;
	src.token_ids = ids;
	src.n_tokens = n;
	src.mark_begin = mb;
	src.mark_end = me;
	return kvmem_session_key_derive(s, &src, out);
}

static kvmem_status kvgo_qmem_update(kvmem_qmem_store *s, const kvmem_session_key *key, void *qd, const int64_t *qm,
                                     int64_t b, int64_t e, float *mem) {
	kvmem_tensor q;
	kvgo_ikv_tensor(&q, qd, qm);
	return kvmem_qmem_update(s, key, &q, b, e, mem);
}

static kvmem_status kvgo_qmem_score(kvmem_context *ctx, const kvmem_model_spec *spec, const float *mem,
                                    void *kd, const int64_t *km, float *scores) {
	kvmem_tensor k;
	kvgo_ikv_tensor(&k, kd, km);
	kvmem_model_spec_v2 s2;
	if (kvgo_spec_v2(spec, &s2)) return kvmem_qmem_score_v2(ctx, &s2, mem, &k, scores);
	return kvmem_qmem_score(ctx, spec, mem, &k, scores);
}

static kvmem_status kvgo_qmem_head_apply(const kvmem_qmem_head *h, const kvmem_model_spec *spec, const float *mem,
                                         void *kd, const int64_t *km, const float *rule, int64_t b, int64_t e,
                                         float *out) {
	kvmem_tensor k;
	kvgo_ikv_tensor(&k, kd, km);
	kvmem_model_spec_v2 s2;
	if (kvgo_spec_v2(spec, &s2)) return kvmem_qmem_head_apply_v2(h, &s2, mem, &k, rule, b, e, out);
	return kvmem_qmem_head_apply(h, spec, mem, &k, rule, b, e, out);
}

static kvmem_status kvgo_snapkv_score(kvmem_context *ctx, const kvmem_model_spec *spec, void *qd, const int64_t *qm,
                                      void *kd, const int64_t *km, int32_t pool_kernel, float *scores) {
	kvmem_tensor q, k;
	kvgo_ikv_tensor(&q, qd, qm);
	kvgo_ikv_tensor(&k, kd, km);
	kvmem_model_spec_v2 s2;
	if (kvgo_spec_v2(spec, &s2)) return kvmem_snapkv_score_v2(ctx, &s2, &q, &k, pool_kernel, scores);
	return kvmem_snapkv_score(ctx, spec, &q, &k, pool_kernel, scores);
}

static kvmem_status kvgo_slotmap_append(kvmem_slotmap *m, void *kd, const int64_t *km, void *vd, const int64_t *vm) {
	kvmem_tensor k, v;
	kvgo_ikv_tensor(&k, kd, km);
	kvgo_ikv_tensor(&v, vd, vm);
	return kvmem_slotmap_append(m, &k, &v);
}

static kvmem_status kvgo_slotmap_gather(const kvmem_slotmap *m, void *kd, const int64_t *km, void *vd,
                                        const int64_t *vm, int32_t *pos) {
	kvmem_tensor k, v;
	kvgo_ikv_tensor(&k, kd, km);
	kvgo_ikv_tensor(&v, vd, vm);
	return kvmem_slotmap_gather(m, &k, &v, pos);
}

// spec with a C-memory layer window (see kvgo_pool_create)
static kvmem_status kvgo_qmem_store_create(kvmem_model_spec *spec, const int32_t *w, const kvmem_qmem_params *p,
                                           kvmem_qmem_store **out) {
	spec->layer_window = w;
	kvmem_model_spec_v2 s2;
	if (kvgo_spec_v2(spec, &s2)) return kvmem_qmem_store_create_v2(&s2, p, out);
	return kvmem_qmem_store_create(spec, p, out);
}
static kvmem_status kvgo_kvstore_create(kvmem_model_spec *spec, const int32_t *w, const kvmem_kvstore_params *p,
                                        kvmem_kvstore **out) {
	spec->layer_window = w;
	kvmem_model_spec_v2 s2;
	if (kvgo_spec_v2(spec, &s2)) return kvmem_kvstore_create_v2(&s2, p, out);
	return kvmem_kvstore_create(spec, p, out);
}
*/
import "C"

import (
	"math"
	"runtime"
	"unsafe"
)

// Session key kinds, the dead slot and the sentinel key (IntentKV).
const (
	SessionExplicit = 1
	SessionMarked   = 2
	SessionPrefix   = 3
	SessionLocal    = 4
	DeadSlot        = 0
	SentinelK       = float32(-1.0e4)
)

// QmemParams is kvmem_qmem_params.
type QmemParams struct {
	Capacity, PrefixTokens int32
	Lambda                 float64
}

// QmemDefaultParams is kvmem_qmem_default_params.
func QmemDefaultParams() QmemParams {
	p := C.kvmem_qmem_default_params()
	return QmemParams{int32(p.capacity), int32(p.prefix_tokens), float64(p.lambda)}
}

// SessionKey is kvmem_session_key.
type SessionKey struct {
	Hi, Lo uint64
	Kind   int32
}

func (k SessionKey) toC() C.kvmem_session_key {
	return C.kvmem_session_key{hi: C.uint64_t(k.Hi), lo: C.uint64_t(k.Lo), kind: C.kvmem_session_kind(k.Kind)}
}

// SessionSource is kvmem_session_source (MarkBegin == MarkEnd: no marked span).
type SessionSource struct {
	SessionID          string
	TokenIDs           []int32
	MarkBegin, MarkEnd int64
}

// QmemStore is kvmem_qmem_store.
type QmemStore struct {
	n    *node
	spec ModelSpec
}

// NewQmemStore is kvmem_qmem_store_create.
func NewQmemStore(spec ModelSpec, p QmemParams) (*QmemStore, error) {
	cs, w, err := spec.toC()
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(w))
	cp := C.kvmem_qmem_default_params() // sets struct_size
	cp.capacity, cp.prefix_tokens, cp.lambda = C.int32_t(p.Capacity), C.int32_t(p.PrefixTokens), C.double(p.Lambda)
	var out *C.kvmem_qmem_store
	if err := call(func() C.kvmem_status { return C.kvgo_qmem_store_create(&cs, w, &cp, &out) }); err != nil {
		return nil, err
	}
	s := &QmemStore{newNode(unsafe.Pointer(out), func(p unsafe.Pointer) { C.kvmem_qmem_store_free((*C.kvmem_qmem_store)(p)) }, nil, false, "QmemStore"), spec}
	runtime.SetFinalizer(s, (*QmemStore).Close)
	return s, nil
}

// Close is kvmem_qmem_store_free. Idempotent.
func (s *QmemStore) Close() { s.n.close() }

func (s *QmemStore) ptr() (*C.kvmem_qmem_store, error) {
	h, err := s.n.get()
	return (*C.kvmem_qmem_store)(h), err
}

func (s *QmemStore) memLen() int { return int(s.spec.NLayers * s.spec.NQHeads * s.spec.HeadDim) }

// SessionKey is kvmem_session_key_derive.
func (s *QmemStore) SessionKey(src SessionSource) (SessionKey, error) {
	h, err := s.ptr()
	if err != nil {
		return SessionKey{}, err
	}
	var sid *C.char
	if src.SessionID != "" {
		if sid, err = cString(src.SessionID, "session id"); err != nil {
			return SessionKey{}, err
		}
		defer C.free(unsafe.Pointer(sid))
	}
	var out C.kvmem_session_key
	err = call(func() C.kvmem_status {
		return C.kvgo_session_key_derive(h, sid, ptr32(src.TokenIDs), C.int64_t(len(src.TokenIDs)), C.int64_t(src.MarkBegin), C.int64_t(src.MarkEnd), &out)
	})
	runtime.KeepAlive(src.TokenIDs)
	return SessionKey{uint64(out.hi), uint64(out.lo), int32(out.kind)}, err
}

// Update is kvmem_qmem_update: fold q ([n_q][n_layers][n_q_heads][head_dim],
// post-RoPE) rows [spanBegin, spanEnd) into key's memory; returns the new memory.
func (s *QmemStore) Update(key SessionKey, q Tensor, spanBegin, spanEnd int64) ([]float32, error) {
	h, err := s.ptr()
	if err != nil {
		return nil, err
	}
	qd, qm, err := q.view("q", []int64{-1, int64(s.spec.NLayers), int64(s.spec.NQHeads), int64(s.spec.HeadDim)})
	if err != nil {
		return nil, err
	}
	mem := make([]float32, s.memLen())
	ck := key.toC()
	err = call(func() C.kvmem_status {
		return C.kvgo_qmem_update(h, &ck, qd, &qm[0], C.int64_t(spanBegin), C.int64_t(spanEnd), (*C.float)(unsafe.Pointer(&mem[0])))
	})
	runtime.KeepAlive(q.Data)
	if err != nil {
		return nil, err
	}
	return mem, nil
}

// Get is kvmem_qmem_get.
func (s *QmemStore) Get(key SessionKey) ([]float32, error) {
	h, err := s.ptr()
	if err != nil {
		return nil, err
	}
	mem := make([]float32, s.memLen())
	ck := key.toC()
	if err := call(func() C.kvmem_status { return C.kvmem_qmem_get(h, &ck, (*C.float)(unsafe.Pointer(&mem[0]))) }); err != nil {
		return nil, err
	}
	return mem, nil
}

// Count is kvmem_qmem_count.
func (s *QmemStore) Count() int {
	h, err := s.ptr()
	if err != nil {
		return 0
	}
	return int(C.kvmem_qmem_count(h))
}

func kvShapeOf(spec ModelSpec) []int64 {
	return []int64{int64(spec.NLayers), -1, int64(spec.NKVHeads), int64(spec.HeadDim)}
}

// QmemScore is kvmem_qmem_score: rule scores of the N positions of k
// ([n_layers][N][n_kv_heads][head_dim], post-RoPE) under memory.
func QmemScore(ctx *Context, spec ModelSpec, memory []float32, k Tensor) ([]float32, error) {
	cp, err := ctx.n.get()
	if err != nil {
		return nil, err
	}
	if len(memory) != int(spec.NLayers*spec.NQHeads*spec.HeadDim) {
		return nil, argErr("QmemScore: memory has %d values, expected %d", len(memory), spec.NLayers*spec.NQHeads*spec.HeadDim)
	}
	kd, km, err := k.view("k", kvShapeOf(spec))
	if err != nil {
		return nil, err
	}
	cs, w, err := spec.toC()
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(w))
	scores := make([]float32, int(km[3]))
	err = call(func() C.kvmem_status {
		cs.layer_window = w
		return C.kvgo_qmem_score((*C.kvmem_context)(cp), &cs, (*C.float)(unsafe.Pointer(&memory[0])), kd, &km[0], ptrF32(scores))
	})
	runtime.KeepAlive(k.Data)
	if err != nil {
		return nil, err
	}
	return scores, nil
}

func ptrF32(s []float32) *C.float {
	if len(s) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&s[0]))
}

// QmemHead is kvmem_qmem_head, the trained residual head.
type QmemHead struct{ n *node }

func newQmemHead(out *C.kvmem_qmem_head) *QmemHead {
	h := &QmemHead{newNode(unsafe.Pointer(out), func(p unsafe.Pointer) { C.kvmem_qmem_head_free((*C.kvmem_qmem_head)(p)) }, nil, false, "QmemHead")}
	runtime.SetFinalizer(h, (*QmemHead).Close)
	return h
}

// QmemHeadLoad is kvmem_qmem_head_load.
func QmemHeadLoad(path string) (*QmemHead, error) {
	cs, err := cString(path, "path")
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(cs))
	var out *C.kvmem_qmem_head
	if err := call(func() C.kvmem_status { return C.kvmem_qmem_head_load(cs, &out) }); err != nil {
		return nil, err
	}
	return newQmemHead(out), nil
}

// QmemHeadLoadBuffer is kvmem_qmem_head_load_buffer (the bytes are copied by C).
func QmemHeadLoadBuffer(data []byte) (*QmemHead, error) {
	var p unsafe.Pointer
	if len(data) > 0 {
		p = unsafe.Pointer(&data[0])
	}
	var out *C.kvmem_qmem_head
	err := call(func() C.kvmem_status { return C.kvmem_qmem_head_load_buffer(p, C.size_t(len(data)), &out) })
	runtime.KeepAlive(data)
	if err != nil {
		return nil, err
	}
	return newQmemHead(out), nil
}

// Close is kvmem_qmem_head_free. Idempotent.
func (h *QmemHead) Close() { h.n.close() }

// HeadDim is kvmem_qmem_head_dim (0 once closed).
func (h *QmemHead) HeadDim() int {
	p, err := h.n.get()
	if err != nil {
		return 0
	}
	return int(C.kvmem_qmem_head_dim((*C.kvmem_qmem_head)(p)))
}

// Alpha is kvmem_qmem_head_alpha (0 once closed).
func (h *QmemHead) Alpha() float32 {
	p, err := h.n.get()
	if err != nil {
		return 0
	}
	return float32(C.kvmem_qmem_head_alpha((*C.kvmem_qmem_head)(p)))
}

// Apply is kvmem_qmem_head_apply: rule + alpha * MLP(...) for the N positions of k.
func (h *QmemHead) Apply(spec ModelSpec, memory []float32, k Tensor, rule []float32, spanBegin, spanEnd int64) ([]float32, error) {
	p, err := h.n.get()
	if err != nil {
		return nil, err
	}
	kd, km, err := k.view("k", kvShapeOf(spec))
	if err != nil {
		return nil, err
	}
	n := int(km[3])
	if len(memory) != int(spec.NLayers*spec.NQHeads*spec.HeadDim) || len(rule) != n {
		return nil, argErr("QmemHead.Apply: memory has %d values, rule %d (N = %d)", len(memory), len(rule), n)
	}
	cs, w, err := spec.toC()
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(w))
	out := make([]float32, n)
	err = call(func() C.kvmem_status {
		cs.layer_window = w
		return C.kvgo_qmem_head_apply((*C.kvmem_qmem_head)(p), &cs, ptrF32(memory), kd, &km[0], ptrF32(rule),
			C.int64_t(spanBegin), C.int64_t(spanEnd), ptrF32(out))
	})
	runtime.KeepAlive(k.Data)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func keep(n int64, f func(kept *C.int32_t, nk *C.int64_t) C.kvmem_status) ([]int32, error) {
	// kept positions are int32: a larger n is refused before its n entries are allocated
	if n < 0 || n > math.MaxInt32 {
		return nil, argErr("n = %d is outside [0, %d]", n, math.MaxInt32)
	}
	kept := make([]int32, n+1)
	var nk C.int64_t
	if err := call(func() C.kvmem_status { return f(ptr32(kept), &nk) }); err != nil {
		return nil, err
	}
	return kept[:nk], nil
}

// SelectKeep is kvmem_select_keep: kept positions (ascending).
func SelectKeep(scores []float32, budget, protect, spanBegin, spanEnd int64) ([]int32, error) {
	return keep(int64(len(scores)), func(kept *C.int32_t, nk *C.int64_t) C.kvmem_status {
		return C.kvmem_select_keep(ptrF32(scores), C.int64_t(len(scores)), C.int64_t(budget), C.int64_t(protect),
			C.int64_t(spanBegin), C.int64_t(spanEnd), kept, nk)
	})
}

// StreamingKeep is kvmem_streaming_keep (StreamingLLM).
func StreamingKeep(n, nSink, window int64) ([]int32, error) {
	return keep(n, func(kept *C.int32_t, nk *C.int64_t) C.kvmem_status {
		return C.kvmem_streaming_keep(C.int64_t(n), C.int64_t(nSink), C.int64_t(window), kept, nk)
	})
}

// H2OAccumulate is kvmem_h2o_accumulate: acc[j] += sum over the nRows rows of probs[r][j], in place.
func H2OAccumulate(probs []float32, nRows int64, acc []float32) error {
	n := int64(len(acc))
	if nRows < 0 || (n == 0 && len(probs) != 0) || (n > 0 && (int64(len(probs))%n != 0 || int64(len(probs))/n != nRows)) {
		return argErr("H2OAccumulate: probs has %d values, expected %d rows of %d", len(probs), nRows, n)
	}
	return call(func() C.kvmem_status {
		return C.kvmem_h2o_accumulate(ptrF32(probs), C.int64_t(nRows), C.int64_t(n), ptrF32(acc))
	})
}

// H2OKeep is kvmem_h2o_keep.
func H2OKeep(acc []float32, budget, recent int64) ([]int32, error) {
	return keep(int64(len(acc)), func(kept *C.int32_t, nk *C.int64_t) C.kvmem_status {
		return C.kvmem_h2o_keep(ptrF32(acc), C.int64_t(len(acc)), C.int64_t(budget), C.int64_t(recent), kept, nk)
	})
}

// SnapKVScore is kvmem_snapkv_score: qObs [W][n_layers][n_q_heads][head_dim], k [n_layers][N][n_kv_heads][head_dim].
func SnapKVScore(ctx *Context, spec ModelSpec, qObs, k Tensor, poolKernel int32) ([]float32, error) {
	cp, err := ctx.n.get()
	if err != nil {
		return nil, err
	}
	qd, qm, err := qObs.view("qObs", []int64{-1, int64(spec.NLayers), int64(spec.NQHeads), int64(spec.HeadDim)})
	if err != nil {
		return nil, err
	}
	kd, km, err := k.view("k", kvShapeOf(spec))
	if err != nil {
		return nil, err
	}
	cs, w, err := spec.toC()
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(w))
	scores := make([]float32, int(km[3]))
	err = call(func() C.kvmem_status {
		cs.layer_window = w
		return C.kvgo_snapkv_score((*C.kvmem_context)(cp), &cs, qd, &qm[0], kd, &km[0], C.int32_t(poolKernel), ptrF32(scores))
	})
	runtime.KeepAlive(qObs.Data)
	runtime.KeepAlive(k.Data)
	if err != nil {
		return nil, err
	}
	return scores, nil
}

// KVStoreParams is kvmem_kvstore_params.
type KVStoreParams struct {
	PageSlots int32
	MaxSlots  int64
}

// KVStoreDefaultParams is kvmem_kvstore_default_params.
func KVStoreDefaultParams() KVStoreParams {
	p := C.kvmem_kvstore_default_params()
	return KVStoreParams{int32(p.page_slots), int64(p.max_slots)}
}

// KVStore is kvmem_kvstore; closing it closes its slot maps first.
type KVStore struct {
	n    *node
	spec ModelSpec
}

// NewKVStore is kvmem_kvstore_create.
func NewKVStore(spec ModelSpec, p KVStoreParams) (*KVStore, error) {
	cs, w, err := spec.toC()
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(w))
	cp := C.kvmem_kvstore_default_params() // sets struct_size
	cp.page_slots, cp.max_slots = C.int32_t(p.PageSlots), C.int64_t(p.MaxSlots)
	var out *C.kvmem_kvstore
	if err := call(func() C.kvmem_status { return C.kvgo_kvstore_create(&cs, w, &cp, &out) }); err != nil {
		return nil, err
	}
	s := &KVStore{newNode(unsafe.Pointer(out), func(p unsafe.Pointer) { C.kvmem_kvstore_free((*C.kvmem_kvstore)(p)) }, nil, false, "KVStore"), spec}
	runtime.SetFinalizer(s, (*KVStore).Close)
	return s, nil
}

// Close is kvmem_kvstore_free, after freeing its slot maps. Idempotent.
func (s *KVStore) Close() { s.n.close() }

func (s *KVStore) ptr() (*C.kvmem_kvstore, error) {
	h, err := s.n.get()
	return (*C.kvmem_kvstore)(h), err
}

// KVStoreInfo is kvmem_kvstore_info.
type KVStoreInfo struct {
	NSlots, NUsed, NFree int64
	PageSlots, DeadSlot  int32
}

// GetInfo is kvmem_kvstore_get_info.
func (s *KVStore) GetInfo() (KVStoreInfo, error) {
	h, err := s.ptr()
	if err != nil {
		return KVStoreInfo{}, err
	}
	var i C.kvmem_kvstore_info
	err = call(func() C.kvmem_status { return C.kvmem_kvstore_get_info(h, &i) })
	return KVStoreInfo{int64(i.n_slots), int64(i.n_used), int64(i.n_free), int32(i.page_slots), int32(i.dead_slot)}, err
}

// SlotRefs is kvmem_kvstore_slot_refs.
func (s *KVStore) SlotRefs(slot int32) (int32, error) {
	h, err := s.ptr()
	if err != nil {
		return 0, err
	}
	var r C.int32_t
	err = call(func() C.kvmem_status { return C.kvmem_kvstore_slot_refs(h, C.int32_t(slot), &r) })
	return int32(r), err
}

// ReadSlot is kvmem_kvstore_read_slot: K and V rows, each [n_layers][n_kv_heads][head_dim].
func (s *KVStore) ReadSlot(slot int32) (k, v []float32, err error) {
	h, err := s.ptr()
	if err != nil {
		return nil, nil, err
	}
	n := int(s.spec.NLayers * s.spec.NKVHeads * s.spec.HeadDim)
	k, v = make([]float32, n), make([]float32, n)
	if err := call(func() C.kvmem_status { return C.kvmem_kvstore_read_slot(h, C.int32_t(slot), ptrF32(k), ptrF32(v)) }); err != nil {
		return nil, nil, err
	}
	return k, v, nil
}

// SlotMap is kvmem_slotmap: one request's positions -> slots.
type SlotMap struct {
	n     *node
	store *KVStore
}

func (s *KVStore) newMap(out *C.kvmem_slotmap) *SlotMap {
	m := &SlotMap{newNode(unsafe.Pointer(out), func(p unsafe.Pointer) { C.kvmem_slotmap_free((*C.kvmem_slotmap)(p)) }, s.n, false, "SlotMap"), s}
	runtime.SetFinalizer(m, (*SlotMap).Close)
	return m
}

// SlotmapCreate is kvmem_slotmap_create.
func (s *KVStore) SlotmapCreate() (*SlotMap, error) {
	h, err := s.ptr()
	if err != nil {
		return nil, err
	}
	var out *C.kvmem_slotmap
	if err := call(func() C.kvmem_status { return C.kvmem_slotmap_create(h, &out) }); err != nil {
		return nil, err
	}
	return s.newMap(out), nil
}

// Close is kvmem_slotmap_free. Idempotent.
func (m *SlotMap) Close() { m.n.close() }

func (m *SlotMap) ptr() (*C.kvmem_slotmap, error) {
	h, err := m.n.get()
	return (*C.kvmem_slotmap)(h), err
}

// Fork is kvmem_slotmap_fork.
func (m *SlotMap) Fork(prefixLen int64) (*SlotMap, error) {
	h, err := m.ptr()
	if err != nil {
		return nil, err
	}
	var out *C.kvmem_slotmap
	if err := call(func() C.kvmem_status { return C.kvmem_slotmap_fork(h, C.int64_t(prefixLen), &out) }); err != nil {
		return nil, err
	}
	return m.store.newMap(out), nil
}

// Append is kvmem_slotmap_append: k, v [n_layers][T][n_kv_heads][head_dim], post-RoPE keys.
func (m *SlotMap) Append(k, v Tensor) error {
	h, err := m.ptr()
	if err != nil {
		return err
	}
	shape := kvShapeOf(m.store.spec)
	kd, km, err := k.view("k", shape)
	if err != nil {
		return err
	}
	vd, vm, err := v.view("v", shape)
	if err != nil {
		return err
	}
	err = call(func() C.kvmem_status { return C.kvgo_slotmap_append(h, kd, &km[0], vd, &vm[0]) })
	runtime.KeepAlive(k.Data)
	runtime.KeepAlive(v.Data)
	return err
}

// SetProtected is kvmem_slotmap_set_protected.
func (m *SlotMap) SetProtected(protect int64) error {
	h, err := m.ptr()
	if err != nil {
		return err
	}
	return call(func() C.kvmem_status { return C.kvmem_slotmap_set_protected(h, C.int64_t(protect)) })
}

// Evict is kvmem_slotmap_evict: slots returned to the allocator.
func (m *SlotMap) Evict(kept []int32) (int64, error) {
	h, err := m.ptr()
	if err != nil {
		return 0, err
	}
	var freed C.int64_t
	err = call(func() C.kvmem_status { return C.kvmem_slotmap_evict(h, ptr32(kept), C.int64_t(len(kept)), &freed) })
	return int64(freed), err
}

// Compact is kvmem_slotmap_compact: slots returned to the allocator.
func (m *SlotMap) Compact(kept []int32) (int64, error) {
	h, err := m.ptr()
	if err != nil {
		return 0, err
	}
	var freed C.int64_t
	err = call(func() C.kvmem_status { return C.kvmem_slotmap_compact(h, ptr32(kept), C.int64_t(len(kept)), &freed) })
	return int64(freed), err
}

// Slots is kvmem_slotmap_slots: the position -> slot array (copied) and the dead slot id.
func (m *SlotMap) Slots() ([]int32, int32, error) {
	h, err := m.ptr()
	if err != nil {
		return nil, 0, err
	}
	var p *C.int32_t
	var n C.int64_t
	var dead C.int32_t
	if err := call(func() C.kvmem_status { return C.kvmem_slotmap_slots(h, &p, &n, &dead) }); err != nil {
		return nil, 0, err
	}
	if n == 0 {
		return nil, int32(dead), nil
	}
	return append([]int32(nil), unsafe.Slice((*int32)(unsafe.Pointer(p)), int(n))...), int32(dead), nil
}

// SlotmapInfo is kvmem_slotmap_info.
type SlotmapInfo struct{ Length, NLive, Protect, NParked int64 }

// GetInfo is kvmem_slotmap_get_info.
func (m *SlotMap) GetInfo() (SlotmapInfo, error) {
	h, err := m.ptr()
	if err != nil {
		return SlotmapInfo{}, err
	}
	var i C.kvmem_slotmap_info
	err = call(func() C.kvmem_status { return C.kvmem_slotmap_get_info(h, &i) })
	return SlotmapInfo{int64(i.length), int64(i.n_live), int64(i.protect), int64(i.n_parked)}, err
}

// Gather is kvmem_slotmap_gather: the live rows in position order (f32) and their positions.
func (m *SlotMap) Gather() (k, v []float32, positions []int32, err error) {
	h, err := m.ptr()
	if err != nil {
		return nil, nil, nil, err
	}
	info, err := m.GetInfo()
	if err != nil {
		return nil, nil, nil, err
	}
	s := m.store.spec
	n := info.NLive
	size := int(int64(s.NLayers) * n * int64(s.NKVHeads) * int64(s.HeadDim))
	k, v, positions = make([]float32, size), make([]float32, size), make([]int32, n)
	shape := []int64{int64(s.NLayers), n, int64(s.NKVHeads), int64(s.HeadDim)}
	kt, vt := Tensor{Data: k, DType: F32, Shape: shape}, Tensor{Data: v, DType: F32, Shape: shape}
	kd, km, err := kt.view("k", nil)
	if err != nil {
		return nil, nil, nil, err
	}
	vd, vm, err := vt.view("v", nil)
	if err != nil {
		return nil, nil, nil, err
	}
	err = call(func() C.kvmem_status { return C.kvgo_slotmap_gather(h, kd, &km[0], vd, &vm[0], ptr32(positions)) })
	runtime.KeepAlive(k)
	runtime.KeepAlive(v)
	if err != nil {
		return nil, nil, nil, err
	}
	return k, v, positions, nil
}
