package kvmem

/*
#include <stdlib.h>
#include <kvmem.h>

static void kvgo_ret_tensor(kvmem_tensor *t, void *data, const int64_t *meta) {
	t->data = data;
	t->dtype = (kvmem_dtype)meta[0];
	t->ndim = (int32_t)meta[1];
	for (int i = 0; i < KVMEM_MAX_DIMS; i++) { t->shape[i] = meta[2 + i]; t->strides[i] = meta[2 + KVMEM_MAX_DIMS + i]; }
}

// exclude / always_include travel as plain pointer arguments (cgo rules, see kvmem.go)
static kvmem_status kvgo_retrieve(kvmem_agent *a, void *qd, const int64_t *qm, kvmem_retrieve_params p,
                                  const int32_t *exclude, const int32_t *always_include, kvmem_retrieval *r) {
	kvmem_tensor q;
	kvgo_ret_tensor(&q, qd, qm);
	p.exclude = exclude;
	p.always_include = always_include;
	return kvmem_retrieve(a, &q, &p, r);
}

static kvmem_status kvgo_gather(kvmem_agent *a, const int32_t *blocks, int32_t n_blocks, int64_t base,
                                void *kd, const int64_t *km, void *vd, const int64_t *vm) {
	kvmem_tensor k, v;
	if (km) kvgo_ret_tensor(&k, kd, km);
	if (vm) kvgo_ret_tensor(&v, vd, vm);
	return kvmem_gather(a, blocks, n_blocks, base, km ? &k : NULL, vm ? &v : NULL);
}
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// Retrieval modes, normalisations, aggregations and scopes (kvmem_retrieve_*).
const (
	RetrieveAABB  = 0
	RetrieveExact = 1
	NormSoftmax   = 0
	NormRR        = 1
	AggMax        = 0
	AggSum        = 1
	ScopeGlobal   = 0
	ScopePerLayer = 1
)

// RetrieveParams is kvmem_retrieve_params.
type RetrieveParams struct {
	TopK                     int32
	Mode, Norm, Agg, Scope   int32
	Tau, RRC                 float32
	Exclude, AlwaysInclude   []int32
	RecentWindow, SkipRecent int32
}

// RetrieveDefaultParams is kvmem_retrieve_default_params.
func RetrieveDefaultParams() RetrieveParams {
	p := C.kvmem_retrieve_default_params()
	return RetrieveParams{TopK: int32(p.top_k), Mode: int32(p.mode), Norm: int32(p.norm), Agg: int32(p.agg),
		Scope: int32(p.scope), Tau: float32(p.tau), RRC: float32(p.rr_c), RecentWindow: int32(p.recent_window),
		SkipRecent: int32(p.skip_recent)}
}

// Retrieval is kvmem_retrieval: the reusable result of Agent.Retrieve.
type Retrieval struct{ n *node }

// NewRetrieval is kvmem_retrieval_create.
func NewRetrieval() (*Retrieval, error) {
	var out *C.kvmem_retrieval
	if err := call(func() C.kvmem_status { return C.kvmem_retrieval_create(&out) }); err != nil {
		return nil, err
	}
	r := &Retrieval{newNode(unsafe.Pointer(out), func(p unsafe.Pointer) { C.kvmem_retrieval_free((*C.kvmem_retrieval)(p)) }, nil, false, "Retrieval")}
	runtime.SetFinalizer(r, (*Retrieval).Close)
	return r, nil
}

// Close is kvmem_retrieval_free. Idempotent.
func (r *Retrieval) Close() { r.n.close() }

func (r *Retrieval) ptr() (*C.kvmem_retrieval, error) {
	h, err := r.n.get()
	return (*C.kvmem_retrieval)(h), err
}

// NSets is kvmem_retrieval_n_sets (0 once closed).
func (r *Retrieval) NSets() int {
	h, err := r.ptr()
	if err != nil {
		return 0
	}
	return int(C.kvmem_retrieval_n_sets(h))
}

// Get is kvmem_retrieval_copy: the blocks (chronological) and scores of a set.
func (r *Retrieval) Get(set int) (blocks []int32, scores []float32, err error) {
	h, err := r.ptr()
	if err != nil {
		return nil, nil, err
	}
	cs, err := i32("set", set)
	if err != nil {
		return nil, nil, err
	}
	var n C.int32_t
	if err := call(func() C.kvmem_status { return C.kvmem_retrieval_copy(h, cs, nil, nil, 0, &n) }); err != nil {
		return nil, nil, err
	}
	blocks, scores = make([]int32, int(n)), make([]float32, int(n))
	if n == 0 {
		return blocks, scores, nil
	}
	err = call(func() C.kvmem_status {
		return C.kvmem_retrieval_copy(h, cs, ptr32(blocks), (*C.float)(unsafe.Pointer(&scores[0])), n, &n)
	})
	return blocks, scores, err
}

// View is kvmem_retrieval_get: the same, read through the pointers the result owns.
func (r *Retrieval) View(set int) (blocks []int32, scores []float32, err error) {
	h, err := r.ptr()
	if err != nil {
		return nil, nil, err
	}
	cs, err := i32("set", set)
	if err != nil {
		return nil, nil, err
	}
	var b *C.int32_t
	var s *C.float
	var n C.int32_t
	if err := call(func() C.kvmem_status { return C.kvmem_retrieval_get(h, cs, &b, &s, &n) }); err != nil {
		return nil, nil, err
	}
	if n == 0 {
		return nil, nil, nil
	}
	return append([]int32(nil), unsafe.Slice((*int32)(unsafe.Pointer(b)), int(n))...),
		append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(s)), int(n))...), nil
}

// BlockScores is kvmem_retrieval_block_scores: S(b) of every sealed block (NaN: not a candidate).
func (r *Retrieval) BlockScores(set int) ([]float32, error) {
	h, err := r.ptr()
	if err != nil {
		return nil, err
	}
	cs, err := i32("set", set)
	if err != nil {
		return nil, err
	}
	var s *C.float
	var n C.int32_t
	if err := call(func() C.kvmem_status { return C.kvmem_retrieval_block_scores(h, cs, &s, &n) }); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	return append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(s)), int(n))...), nil
}

// NTokens is kvmem_retrieval_n_tokens: tokens in the set's blocks.
func (r *Retrieval) NTokens(set int) (int64, error) {
	h, err := r.ptr()
	if err != nil {
		return 0, err
	}
	cs, err := i32("set", set)
	if err != nil {
		return 0, err
	}
	var n C.int64_t
	err = call(func() C.kvmem_status { return C.kvmem_retrieval_n_tokens(h, cs, &n) })
	return int64(n), err
}

// Retrieve is kvmem_retrieve: query rows [n_q][n_layers][n_q_heads][head_dim]
// (raw, pre-RoPE). Fills result (a new Retrieval when nil) and returns it.
func (a *Agent) Retrieve(query Tensor, p RetrieveParams, result *Retrieval) (*Retrieval, error) {
	h, err := a.ptr()
	if err != nil {
		return nil, err
	}
	s := a.pool.Spec
	qd, qm, err := query.view("query", []int64{-1, int64(s.NLayers), int64(s.NQHeads), int64(s.HeadDim)})
	if err != nil {
		return nil, err
	}
	if result == nil {
		if result, err = NewRetrieval(); err != nil {
			return nil, err
		}
	}
	rh, err := result.ptr()
	if err != nil {
		return nil, err
	}
	nex, err := i32("len(Exclude)", len(p.Exclude))
	if err != nil {
		return nil, err
	}
	nai, err := i32("len(AlwaysInclude)", len(p.AlwaysInclude))
	if err != nil {
		return nil, err
	}
	cp := C.kvmem_retrieve_default_params()
	cp.top_k, cp.mode, cp.norm = C.int32_t(p.TopK), C.kvmem_retrieve_mode(p.Mode), C.kvmem_retrieve_norm(p.Norm)
	cp.agg, cp.scope, cp.tau, cp.rr_c = C.kvmem_retrieve_agg(p.Agg), C.kvmem_retrieve_scope(p.Scope), C.float(p.Tau), C.float(p.RRC)
	cp.n_exclude, cp.n_always_include = nex, nai
	cp.recent_window, cp.skip_recent = C.int32_t(p.RecentWindow), C.int32_t(p.SkipRecent)
	err = call(func() C.kvmem_status {
		return C.kvgo_retrieve(h, qd, &qm[0], cp, ptr32(p.Exclude), ptr32(p.AlwaysInclude), rh)
	})
	runtime.KeepAlive(query.Data)
	runtime.KeepAlive(p.Exclude)
	runtime.KeepAlive(p.AlwaysInclude)
	if err != nil {
		return nil, err
	}
	return result, nil
}

// Gather is kvmem_gather: the sealed blocks concatenated and re-encoded at
// positions basePosition.., written into kOut, vOut
// ([n_layers][M][n_kv_heads][head_dim]; either may be nil).
func (a *Agent) Gather(blocks []int32, basePosition int64, kOut, vOut *Tensor) error {
	h, err := a.ptr()
	if err != nil {
		return err
	}
	nb, err := i32("len(blocks)", len(blocks))
	if err != nil {
		return err
	}
	m := int64(0)
	for _, b := range blocks {
		bi, err := a.BlockInfo(int(b))
		if err != nil {
			return err
		}
		m += int64(bi.NTokens)
	}
	var kd, vd unsafe.Pointer
	var km, vm [14]C.int64_t
	var kmp, vmp *C.int64_t
	if kOut != nil {
		if kd, km, err = kOut.view("kOut", a.kvShape(m)); err != nil {
			return err
		}
		kmp = &km[0]
	}
	if vOut != nil {
		if vd, vm, err = vOut.view("vOut", a.kvShape(m)); err != nil {
			return err
		}
		vmp = &vm[0]
	}
	err = call(func() C.kvmem_status {
		return C.kvgo_gather(h, ptr32(blocks), nb, C.int64_t(basePosition), kd, kmp, vd, vmp)
	})
	if kOut != nil {
		runtime.KeepAlive(kOut.Data)
	}
	if vOut != nil {
		runtime.KeepAlive(vOut.Data)
	}
	runtime.KeepAlive(blocks)
	return err
}

// GatherF32 gathers into new f32 slices and returns them with the token count M.
func (a *Agent) GatherF32(blocks []int32, basePosition int64) (k, v []float32, m int64, err error) {
	for _, b := range blocks {
		bi, err := a.BlockInfo(int(b))
		if err != nil {
			return nil, nil, 0, err
		}
		m += int64(bi.NTokens)
	}
	s := a.pool.Spec
	size := int(int64(s.NLayers) * m * int64(s.NKVHeads) * int64(s.HeadDim))
	k, v = make([]float32, size), make([]float32, size)
	kt, vt := F32Tensor(k), F32Tensor(v)
	if err := a.Gather(blocks, basePosition, &kt, &vt); err != nil {
		return nil, nil, 0, err
	}
	return k, v, m, nil
}
