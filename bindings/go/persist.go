package kvmem

/*
#include <stdlib.h>
#include <kvmem.h>

static void kvgo_per_tensor(kvmem_tensor *t, void *data, const int64_t *meta) {
	t->data = data;
	t->dtype = (kvmem_dtype)meta[0];
	t->ndim = (int32_t)meta[1];
	for (int i = 0; i < KVMEM_MAX_DIMS; i++) { t->shape[i] = meta[2 + i]; t->strides[i] = meta[2 + KVMEM_MAX_DIMS + i]; }
}

// agents: a C array of handles (they are C pointers, so Go may keep them in C memory)
static kvmem_status kvgo_batch_merge(kvmem_agent *const *agents, int32_t n, int32_t layer, void *kd, const int64_t *km,
                                     void *vd, const int64_t *vm, int64_t *lengths) {
	kvmem_tensor k, v;
	if (km) kvgo_per_tensor(&k, kd, km);
	if (vm) kvgo_per_tensor(&v, vd, vm);
	return kvmem_batch_merge(agents, n, layer, km ? &k : NULL, vm ? &v : NULL, lengths);
}

static kvmem_status kvgo_batch_extract(void *bd, const int64_t *bm, int32_t row, int64_t length, int64_t first,
                                       int64_t n, void *od, const int64_t *om) {
	kvmem_tensor b, o;
	kvgo_per_tensor(&b, bd, bm);
	kvgo_per_tensor(&o, od, om);
	return kvmem_batch_extract(&b, row, length, first, n, &o);
}
*/
import "C"

import (
	"math"
	"runtime"
	"unsafe"
)

// Prefix match kinds (kvmem_prefix_kind).
const (
	PrefixExact   = 0
	PrefixExtend  = 1
	PrefixDiverge = 2
)

// cpath: "" is NULL (the pool's store).
func cpath(path string) (*C.char, error) {
	if path == "" {
		return nil, nil
	}
	return cString(path, "path")
}

// Save is kvmem_agent_save: a crash-safe safetensors file ("" = the pool's store).
func (a *Agent) Save(path string) error {
	h, err := a.ptr()
	if err != nil {
		return err
	}
	cs, err := cpath(path)
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(cs))
	return call(func() C.kvmem_status { return C.kvmem_agent_save(h, cs) })
}

// Load is kvmem_agent_load: replace the agent's memory with a saved file ("" = the pool's store).
// OpenFileNoVerify skips the data checksum pass of AgentOpenFile (KVMEM_OPEN_FILE_NO_VERIFY).
const OpenFileNoVerify = 0x1

// AgentOpenFile is kvmem_agent_open_file (experimental): a saved agent file
// opened in place, read-only; its KV blocks stay in the file and are read
// when used, so the agent may be larger than the pool's capacity. The agent
// takes the file's agent id. flags: 0 or OpenFileNoVerify.
func (p *Pool) AgentOpenFile(path string, flags uint32) (*Agent, error) {
	h, err := p.ptr()
	if err != nil {
		return nil, err
	}
	cs, err := cpath(path)
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(cs))
	var out *C.kvmem_agent
	if err := call(func() C.kvmem_status { return C.kvmem_agent_open_file(h, cs, C.uint32_t(flags), &out) }); err != nil {
		return nil, err
	}
	id := C.GoString(C.kvmem_agent_get_id(out))
	a := &Agent{n: newNode(unsafe.Pointer(out), func(p unsafe.Pointer) { C.kvmem_agent_close((*C.kvmem_agent)(p)) }, p.n, true, "Agent '"+id+"'"), pool: p}
	runtime.SetFinalizer(a, (*Agent).Close)
	return a, nil
}

func (a *Agent) Load(path string) error {
	h, err := a.ptr()
	if err != nil {
		return err
	}
	cs, err := cpath(path)
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(cs))
	return call(func() C.kvmem_status { return C.kvmem_agent_load(h, cs) })
}

// Sync is kvmem_pool_sync: write changed agents to the pool's store.
func (p *Pool) Sync() error {
	h, err := p.ptr()
	if err != nil {
		return err
	}
	return call(func() C.kvmem_status { return C.kvmem_pool_sync(h) })
}

// Truncate is kvmem_agent_truncate.
func (a *Agent) Truncate(nTokens int64) error {
	h, err := a.ptr()
	if err != nil {
		return err
	}
	return call(func() C.kvmem_status { return C.kvmem_agent_truncate(h, C.int64_t(nTokens)) })
}

// PrefixParams is kvmem_prefix_params.
type PrefixParams struct{ MinRatio float64 }

// PrefixDefaultParams is kvmem_prefix_default_params.
func PrefixDefaultParams() PrefixParams {
	return PrefixParams{float64(C.kvmem_prefix_default_params().min_ratio)}
}

// PrefixResult is kvmem_prefix_result.
type PrefixResult struct {
	Kind                     int32
	ReuseTokens              int64
	CommonBytes, ProcessFrom uint64
}

// PrefixMatch is kvmem_prefix_match.
func (a *Agent) PrefixMatch(newText string, p PrefixParams) (PrefixResult, error) {
	h, err := a.ptr()
	if err != nil {
		return PrefixResult{}, err
	}
	tb := []byte(newText)
	var tp *C.char
	if len(tb) > 0 {
		tp = (*C.char)(unsafe.Pointer(&tb[0]))
	}
	cp := C.kvmem_prefix_default_params() // sets struct_size
	cp.min_ratio = C.double(p.MinRatio)
	var r C.kvmem_prefix_result
	err = call(func() C.kvmem_status { return C.kvmem_prefix_match(h, tp, C.size_t(len(tb)), &cp, &r) })
	runtime.KeepAlive(tb)
	return PrefixResult{int32(r.kind), int64(r.reuse_tokens), uint64(r.common_bytes), uint64(r.process_from)}, err
}

// BatchMerge is kvmem_batch_merge: one layer of the agents, left-padded to
// maxLen (0: the longest agent), as f32 k, v [B][n_kv_heads][maxLen][head_dim]
// and each agent's length.
func BatchMerge(agents []*Agent, layer int32, maxLen int64) (k, v []float32, lengths []int64, err error) {
	if len(agents) == 0 {
		return nil, nil, nil, argErr("BatchMerge: no agents")
	}
	cn, err := i32("len(agents)", len(agents))
	if err != nil {
		return nil, nil, nil, err
	}
	hs := (*[1 << 28]*C.kvmem_agent)(C.malloc(C.size_t(len(agents)) * C.size_t(unsafe.Sizeof(uintptr(0)))))[:len(agents):len(agents)]
	defer C.free(unsafe.Pointer(&hs[0]))
	for i, a := range agents {
		if hs[i], err = a.ptr(); err != nil {
			return nil, nil, nil, err
		}
	}
	if maxLen == 0 {
		for _, a := range agents {
			info, err := a.GetInfo()
			if err != nil {
				return nil, nil, nil, err
			}
			if info.NTokens > maxLen {
				maxLen = info.NTokens
			}
		}
	}
	s := agents[0].pool.Spec
	shape := []int64{int64(len(agents)), int64(s.NKVHeads), maxLen, int64(s.HeadDim)}
	if maxLen < 0 || maxLen > math.MaxInt64/(shape[0]*shape[1]*shape[3]) {
		return nil, nil, nil, argErr("BatchMerge: maxLen = %d is outside [0, %d]", maxLen, math.MaxInt64/(shape[0]*shape[1]*shape[3]))
	}
	size := int(shape[0] * shape[1] * shape[2] * shape[3])
	k, v, lengths = make([]float32, size), make([]float32, size), make([]int64, len(agents))
	kt, vt := Tensor{Data: k, DType: F32, Shape: shape}, Tensor{Data: v, DType: F32, Shape: shape}
	kd, km, err := kt.view("k", nil)
	if err != nil {
		return nil, nil, nil, err
	}
	vd, vm, err := vt.view("v", nil)
	if err != nil {
		return nil, nil, nil, err
	}
	err = call(func() C.kvmem_status {
		return C.kvgo_batch_merge(&hs[0], cn, C.int32_t(layer), kd, &km[0], vd, &vm[0],
			(*C.int64_t)(unsafe.Pointer(&lengths[0])))
	})
	runtime.KeepAlive(k)
	runtime.KeepAlive(v)
	if err != nil {
		return nil, nil, nil, err
	}
	return k, v, lengths, nil
}

// BatchExtract is kvmem_batch_extract: n tokens of row `row` of a left-padded
// batch [B][n_kv_heads][max_len][head_dim] (Shape set) into out [n][n_kv_heads][head_dim].
func BatchExtract(batch Tensor, row int32, length, first, n int64, out Tensor) error {
	bd, bm, err := batch.view("batch", nil)
	if err != nil {
		return err
	}
	if bm[1] != 4 {
		return argErr("BatchExtract: batch must be [B][n_kv_heads][max_len][head_dim]")
	}
	od, om, err := out.view("out", []int64{n, int64(bm[3]), int64(bm[5])})
	if err != nil {
		return err
	}
	err = call(func() C.kvmem_status {
		return C.kvgo_batch_extract(bd, &bm[0], C.int32_t(row), C.int64_t(length), C.int64_t(first), C.int64_t(n), od, &om[0])
	})
	runtime.KeepAlive(batch.Data)
	runtime.KeepAlive(out.Data)
	return err
}
