// Package kvmem is the Go binding of kvmem, memory for LLM agents kept as the
// model's own KV cache. It is a thin cgo layer over include/kvmem.h: the same
// objects (Context, Pool, Agent) and names, slices handed to C without copies,
// errors as *Error values carrying the C status and kvmem_last_error().
//
// Build: `#cgo pkg-config: kvmem` finds the header and library of an installed
// kvmem (or of a build tree: PKG_CONFIG_PATH=$REPO/build/default); -tags
// kvmem_static links libkvmem.a instead (link_shared.go, link_static.go,
// README.md).
//
// Ownership: Close() frees the C object and is idempotent; a finalizer frees
// objects that were never closed. Closing a Pool closes its Agents (C frees
// their handles); closing a Context closes its Pools. Close must not race with
// calls on the same object. As in C, one Agent is used by one goroutine at a time.
package kvmem

/*
// The binding wraps kvmem.h's experimental section too (segments, the qmem
// head, the eviction baselines): #cgo flags hold for every file of the package.
#cgo CFLAGS: -DKVMEM_EXPERIMENTAL
#include <stdlib.h>
#include <string.h>
#include <kvmem.h>

// cgo forbids Go memory that holds Go pointers from being passed to C, and a
// kvmem_tensor holds its data pointer. So the data pointers travel as plain
// arguments and these helpers build the structs on the C stack; C never
// keeps any of them past the call.
// meta: dtype, ndim, shape[6], strides[6]
// A device tensor's descriptor checked by the library (it lives on the C
// stack for the call only; Go's calls take slices, not device memory yet).
static kvmem_status kvgo_device_check(int32_t kind, int32_t device, uint64_t handle, uint64_t offset,
                                      uint64_t size, int32_t dtype, int32_t ndim, const int64_t *shape) {
    kvmem_device_memory m = kvmem_device_memory_default();
    m.kind = (kvmem_memory_kind)kind;
    m.device = device;
    m.handle = handle;
    m.offset = offset;
    m.size = size;
    kvmem_tensor t;
    return kvmem_tensor_init_device(&t, &m, (kvmem_dtype)dtype, ndim, shape);
}

static void kvgo_tensor(kvmem_tensor *t, void *data, const int64_t *meta) {
	t->data = data;
	t->dtype = (kvmem_dtype)meta[0];
	t->ndim = (int32_t)meta[1];
	for (int i = 0; i < KVMEM_MAX_DIMS; i++) { t->shape[i] = meta[2 + i]; t->strides[i] = meta[2 + KVMEM_MAX_DIMS + i]; }
}

static kvmem_status kvgo_agent_append(kvmem_agent *a, void *kd, const int64_t *km, void *vd, const int64_t *vm,
                                      const int32_t *token_ids, const char *text, size_t text_len,
                                      const int32_t *offsets, const int32_t *positions, int32_t keys_rotated) {
	kvmem_tensor k, v;
	kvgo_tensor(&k, kd, km);
	kvgo_tensor(&v, vd, vm);
	kvmem_append_params p = kvmem_append_default_params();
	p.token_ids = token_ids;
	p.text = text;
	p.text_len = text_len;
	p.token_text_offsets = offsets;
	p.positions = positions;
	p.keys_rotated = keys_rotated;
	return kvmem_agent_append(a, &k, &v, &p);
}

static kvmem_status kvgo_agent_read(kvmem_agent *a, int64_t first, int64_t n, void *kd, const int64_t *km,
                                    void *vd, const int64_t *vm) {
	kvmem_tensor k, v;
	if (km) kvgo_tensor(&k, kd, km);
	if (vm) kvgo_tensor(&v, vd, vm);
	return kvmem_agent_read(a, first, n, km ? &k : NULL, vm ? &v : NULL);
}

static kvmem_status kvgo_tensor_init(void *data, const int64_t *meta, const int64_t *shape, int64_t *out_strides) {
	kvmem_tensor t;
	kvmem_status st = kvmem_tensor_init(&t, data, (kvmem_dtype)meta[0], (int32_t)meta[1], shape);
	if (st == KVMEM_OK) memcpy(out_strides, t.strides, sizeof t.strides);
	return st;
}

// The calls that take a spec go through the growable one where the library
// has it (spec.go).
int kvgo_spec_v2(const kvmem_model_spec *s, kvmem_model_spec_v2 *v);
void kvgo_spec_of_v2(const kvmem_model_spec_v2 *v, kvmem_model_spec *s);
#pragma weak kvmem_pool_create_v2
#pragma weak kvmem_pool_get_spec_v2
#pragma weak kvmem_model_spec_validate_v2
#pragma weak kvmem_rope_apply_v2

// The spec's layer_window points into C memory owned by the caller of these.
static kvmem_status kvgo_pool_create(kvmem_context *ctx, kvmem_model_spec *spec, const int32_t *window,
                                     const kvmem_pool_params *params, kvmem_pool **out) {
	spec->layer_window = window;
	kvmem_model_spec_v2 v;
	if (kvgo_spec_v2(spec, &v)) return kvmem_pool_create_v2(ctx, &v, params, out);
	return kvmem_pool_create(ctx, spec, params, out);
}

static kvmem_status kvgo_spec_validate(const kvmem_model_spec *spec) {
	kvmem_model_spec_v2 v;
	if (kvgo_spec_v2(spec, &v)) return kvmem_model_spec_validate_v2(&v);
	return kvmem_model_spec_validate(spec);
}

static kvmem_status kvgo_rope_apply(const kvmem_model_spec *spec, float *x, size_t n, size_t stride,
                                    const int32_t *positions, int32_t inverse) {
	kvmem_model_spec_v2 v;
	if (kvgo_spec_v2(spec, &v)) return kvmem_rope_apply_v2(&v, x, n, stride, positions, inverse);
	return kvmem_rope_apply(spec, x, n, stride, positions, inverse);
}

static kvmem_status kvgo_pool_get_spec(kvmem_pool *pool, kvmem_model_spec *out) {
	kvmem_model_spec d = kvmem_model_spec_default();
	kvmem_model_spec_v2 v;
	if (!kvgo_spec_v2(&d, &v)) return kvmem_pool_get_spec(pool, out);
	kvmem_status st = kvmem_pool_get_spec_v2(pool, &v);
	if (st == KVMEM_OK) kvgo_spec_of_v2(&v, out);
	return st;
}

extern void kvgoLog(int level, char *message);
static void kvgo_log_tramp(kvmem_log_level level, const char *message, void *user_data) {
	(void)user_data;
	kvgoLog((int)level, (char *)message);
}
static void kvgo_log_set(int on) { kvmem_log_set(on ? kvgo_log_tramp : NULL, NULL); }
*/
import "C"

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// ---------------------------------------------------------------------------
// Status and errors
// ---------------------------------------------------------------------------

// Status is kvmem_status.
type Status int32

const (
	OK                Status = 0
	StatusInvalidArg  Status = -1
	StatusNoMem       Status = -2
	StatusCapacity    Status = -3
	StatusNotFound    Status = -4
	StatusExists      Status = -5
	StatusClosed      Status = -6
	StatusUnsupported Status = -7
	StatusBackend     Status = -8
	StatusIO          Status = -9
	StatusFormat      Status = -10
	StatusCorrupt     Status = -11
	StatusMismatch    Status = -12
	StatusConflict    Status = -13
	StatusInternal    Status = -14
	StatusBusy        Status = -15
)

// String is kvmem_status_str: "KVMEM_ERR_INVALID_ARG".
func (s Status) String() string { return StatusStr(s) }

// Error is a failed kvmem call: the C status and the library's message.
type Error struct {
	Code Status
	Msg  string
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return "kvmem: " + e.Code.String()
	}
	return "kvmem: " + e.Code.String() + ": " + e.Msg
}

// Is makes errors.Is(err, kvmem.ErrBusy) compare status codes.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && (t.Msg == "" || t.Msg == e.Msg)
}

// Sentinels for errors.Is, one per status.
var (
	ErrInvalidArg  = &Error{Code: StatusInvalidArg}
	ErrNoMem       = &Error{Code: StatusNoMem}
	ErrCapacity    = &Error{Code: StatusCapacity}
	ErrNotFound    = &Error{Code: StatusNotFound}
	ErrExists      = &Error{Code: StatusExists}
	ErrClosed      = &Error{Code: StatusClosed}
	ErrUnsupported = &Error{Code: StatusUnsupported}
	ErrBackend     = &Error{Code: StatusBackend}
	ErrIO          = &Error{Code: StatusIO}
	ErrFormat      = &Error{Code: StatusFormat}
	ErrCorrupt     = &Error{Code: StatusCorrupt}
	ErrMismatch    = &Error{Code: StatusMismatch}
	ErrConflict    = &Error{Code: StatusConflict}
	ErrInternal    = &Error{Code: StatusInternal}
	ErrBusy        = &Error{Code: StatusBusy}
)

// call runs one C call that returns kvmem_status. The goroutine stays on its
// OS thread until kvmem_last_error() (thread-local) has been read.
func call(f func() C.kvmem_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	st := f()
	if st == C.KVMEM_OK {
		return nil
	}
	return &Error{Code: Status(st), Msg: C.GoString(C.kvmem_last_error())}
}

func argErr(format string, a ...any) error {
	return &Error{Code: StatusInvalidArg, Msg: fmt.Sprintf(format, a...)}
}

// i32 is v as an int32_t argument, or an ErrInvalidArg naming it: C.int32_t(v)
// of a Go int wraps modulo 2^32 (BlockInfo(1<<32) read block 0).
func i32(what string, v int) (C.int32_t, error) {
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, argErr("%s = %d is outside the range of int32 [%d, %d]", what, v, math.MinInt32, math.MaxInt32)
	}
	return C.int32_t(v), nil
}

// span checks tokens [first, first+n) against an agent of total tokens before
// an output of n tokens is allocated: make() of a size no agent can have
// (Tokens(0, 1<<40)) would end the process ("out of memory"), not return an error.
func span(fn string, first, n, total int64) error {
	if first < 0 || n < 0 || first > total || n > total-first {
		return argErr("%s: tokens [%d, %d) outside [0, %d)", fn, first, first+n, total)
	}
	return nil
}

// cString is C.CString for an id or a path, refusing a NUL byte: C reads up
// to the first NUL, so "alice\x00-evil" would be agent "alice" and
// "a.kvm\x00.bak" the file "a.kvm". The caller frees the result.
func cString(s, what string) (*C.char, error) {
	if strings.IndexByte(s, 0) >= 0 {
		return nil, argErr("%s %q contains a NUL byte", what, s)
	}
	return C.CString(s), nil
}

// ---------------------------------------------------------------------------
// Free functions
// ---------------------------------------------------------------------------

// Version is kvmem_version: the loaded library's version string.
func Version() string { return C.GoString(C.kvmem_version()) }

// VersionNumber is kvmem_version_number.
func VersionNumber() int { return int(C.kvmem_version_number()) }

// StatusStr is kvmem_status_str.
func StatusStr(s Status) string { return C.GoString(C.kvmem_status_str(C.kvmem_status(s))) }

// objectError copies an object's last failure (kvmem_X_last_error): what the
// last failed call on it said, on whichever OS thread it ran.
func objectError(f func(buf *C.char, size C.size_t) C.size_t) string {
	buf := make([]byte, 512)
	n := int(f((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf))))
	if n >= len(buf) {
		buf = make([]byte, n+1)
		f((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	}
	if n > len(buf)-1 {
		n = len(buf) - 1
	}
	return string(buf[:n])
}

// LastError is kvmem_last_error of the current OS thread; errors returned by
// this package already carry their message, so this is rarely needed.
func LastError() string { return C.GoString(C.kvmem_last_error()) }

// DType is kvmem_dtype.
type DType int32

const (
	F32    DType = 0
	F16    DType = 1
	BF16   DType = 2
	Q8     DType = 3
	Q4     DType = 4
	Q4KIVI DType = 5
)

// DTypeName is kvmem_dtype_name ("f16").
func DTypeName(d DType) string { return C.GoString(C.kvmem_dtype_name(C.kvmem_dtype(d))) }

func (d DType) String() string { return DTypeName(d) }

// AgentIDValid is kvmem_agent_id_valid.
func AgentIDValid(id string) bool {
	cs, err := cString(id, "agent id")
	if err != nil {
		return false // C would judge only the part before the NUL
	}
	defer C.free(unsafe.Pointer(cs))
	return C.kvmem_agent_id_valid(cs) == 1
}

// Free is kvmem_free, for memory kvmem documents as caller-owned.
func Free(p unsafe.Pointer) { C.kvmem_free(p) }

// BackendInfo is kvmem_backend_info.
type BackendInfo struct {
	Name      string
	Available bool
	Detail    string
}

// Backends is kvmem_backends: every backend this build knows, and whether it runs here.
func Backends() ([]BackendInfo, error) {
	var n C.size_t
	if err := call(func() C.kvmem_status { return C.kvmem_backends(nil, 0, &n) }); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	arr := (*C.kvmem_backend_info)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.kvmem_backend_info{}))))
	defer C.free(unsafe.Pointer(arr))
	if err := call(func() C.kvmem_status { return C.kvmem_backends(arr, n, &n) }); err != nil {
		return nil, err
	}
	out := make([]BackendInfo, int(n))
	for i, b := range unsafe.Slice(arr, int(n)) {
		out[i] = BackendInfo{C.GoString(b.name), b.available != 0, C.GoString(b.detail)}
	}
	return out, nil
}

var logMu sync.Mutex
var logFn func(level int, msg string)

// LogSet is kvmem_log_set: route kvmem's messages to fn (nil turns logging off).
// fn may be called from any goroutine/thread.
func LogSet(fn func(level int, msg string)) {
	logMu.Lock()
	logFn = fn
	logMu.Unlock()
	on := C.int(0)
	if fn != nil {
		on = 1
	}
	C.kvgo_log_set(on)
}

func logDispatch(level int, msg string) {
	logMu.Lock()
	fn := logFn
	logMu.Unlock()
	if fn != nil {
		fn(level, msg)
	}
}

// ---------------------------------------------------------------------------
// Model spec
// ---------------------------------------------------------------------------

// RoPE styles and scalings (kvmem_rope_style, kvmem_rope_scaling).
const (
	RopeNeox          = 0
	RopeGPTJ          = 1
	RopeScalingNone   = 0
	RopeScalingLinear = 1
	RopeScalingLlama3 = 2
	RopeScalingYarn   = 3
)

// ModelSpec is kvmem_model_spec.
type ModelSpec struct {
	NLayers, NQHeads, NKVHeads, HeadDim, RotaryDim int32
	RopeStyle                                      int32
	RopeTheta                                      float64
	RopeScaling                                    int32
	RopeFactor, RopeLowFreqFactor                  float64
	RopeHighFreqFactor                             float64
	RopeOriginalMaxPos                             int32
	YarnBetaFast, YarnBetaSlow, YarnAttnFactor     float64
	LayerWindow                                    []int32 // nil = all full attention
	ModelID                                        string
}

// ModelSpecDefault is kvmem_model_spec_default.
func ModelSpecDefault() ModelSpec { return specFromC(C.kvmem_model_spec_default()) }

func specFromC(c C.kvmem_model_spec) ModelSpec {
	s := ModelSpec{
		NLayers: int32(c.n_layers), NQHeads: int32(c.n_q_heads), NKVHeads: int32(c.n_kv_heads),
		HeadDim: int32(c.head_dim), RotaryDim: int32(c.rotary_dim), RopeStyle: int32(c.rope_style),
		RopeTheta: float64(c.rope_theta), RopeScaling: int32(c.rope_scaling), RopeFactor: float64(c.rope_factor),
		RopeLowFreqFactor: float64(c.rope_low_freq_factor), RopeHighFreqFactor: float64(c.rope_high_freq_factor),
		RopeOriginalMaxPos: int32(c.rope_original_max_pos), YarnBetaFast: float64(c.yarn_beta_fast),
		YarnBetaSlow: float64(c.yarn_beta_slow), YarnAttnFactor: float64(c.yarn_attn_factor),
		ModelID: C.GoString(&c.model_id[0]),
	}
	if c.layer_window != nil && c.n_layers > 0 {
		s.LayerWindow = append([]int32(nil), unsafe.Slice((*int32)(unsafe.Pointer(c.layer_window)), int(c.n_layers))...)
	}
	return s
}

// toC fills a C spec; the layer window is copied into C memory the caller frees.
func (s *ModelSpec) toC() (c C.kvmem_model_spec, window *C.int32_t, err error) {
	c = C.kvmem_model_spec_default()
	c.n_layers, c.n_q_heads, c.n_kv_heads = C.int32_t(s.NLayers), C.int32_t(s.NQHeads), C.int32_t(s.NKVHeads)
	c.head_dim, c.rotary_dim = C.int32_t(s.HeadDim), C.int32_t(s.RotaryDim)
	c.rope_style, c.rope_theta = C.kvmem_rope_style(s.RopeStyle), C.double(s.RopeTheta)
	c.rope_scaling, c.rope_factor = C.kvmem_rope_scaling(s.RopeScaling), C.double(s.RopeFactor)
	c.rope_low_freq_factor, c.rope_high_freq_factor = C.double(s.RopeLowFreqFactor), C.double(s.RopeHighFreqFactor)
	c.rope_original_max_pos = C.int32_t(s.RopeOriginalMaxPos)
	c.yarn_beta_fast, c.yarn_beta_slow, c.yarn_attn_factor = C.double(s.YarnBetaFast), C.double(s.YarnBetaSlow), C.double(s.YarnAttnFactor)
	if strings.IndexByte(s.ModelID, 0) >= 0 {
		return c, nil, argErr("model id %q contains a NUL byte", s.ModelID)
	}
	if len(s.ModelID) >= C.KVMEM_MAX_MODEL_ID {
		return c, nil, argErr("model id of %d bytes: at most %d", len(s.ModelID), C.KVMEM_MAX_MODEL_ID-1)
	}
	for i := 0; i < len(s.ModelID); i++ {
		c.model_id[i] = C.char(s.ModelID[i])
	}
	c.model_id[len(s.ModelID)] = 0
	if s.LayerWindow != nil {
		if len(s.LayerWindow) != int(s.NLayers) {
			return c, nil, argErr("LayerWindow has %d entries, NLayers is %d", len(s.LayerWindow), s.NLayers)
		}
		if len(s.LayerWindow) > 0 {
			window = (*C.int32_t)(C.malloc(C.size_t(4 * len(s.LayerWindow))))
			copy(unsafe.Slice((*int32)(unsafe.Pointer(window)), len(s.LayerWindow)), s.LayerWindow)
		}
	}
	c.layer_window = nil
	return c, window, nil
}

// Validate is kvmem_model_spec_validate.
func (s *ModelSpec) Validate() error {
	c, w, err := s.toC()
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(w))
	return call(func() C.kvmem_status {
		c.layer_window = w
		return C.kvgo_spec_validate(&c)
	})
}

// RopeApply is kvmem_rope_apply: rotate len(positions) rows of x in place
// (row r at x[r*stride:], head_dim floats), or undo the rotation.
func RopeApply(spec ModelSpec, x []float32, stride int, positions []int32, inverse bool) error {
	c, w, err := spec.toC()
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(w))
	n := len(positions)
	if n == 0 {
		return nil
	}
	if stride < int(spec.HeadDim) || stride > len(x) || (n-1)*stride+int(spec.HeadDim) > len(x) {
		return argErr("RopeApply: %d rows of stride %d (head_dim %d) exceed x (%d floats)", n, stride, spec.HeadDim, len(x))
	}
	inv := C.int32_t(0)
	if inverse {
		inv = 1
	}
	return call(func() C.kvmem_status {
		c.layer_window = w
		return C.kvgo_rope_apply(&c, (*C.float)(unsafe.Pointer(&x[0])), C.size_t(n), C.size_t(stride),
			(*C.int32_t)(unsafe.Pointer(&positions[0])), inv)
	})
}

// ---------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------

// Tensor is a borrowed view of a slice as kvmem_tensor, handed to C without a copy.
// Data is []float32 (F32), []uint16 (F16 or BF16 bits: set DType), or []byte
// (set DType). Shape nil takes the shape the call expects (the slice must hold
// exactly that many elements); Strides nil is row-major. Strides in elements.
type Tensor struct {
	Data    any
	DType   DType
	Shape   []int64
	Strides []int64
}

// F32Tensor views a []float32 (shape optional).
func F32Tensor(data []float32, shape ...int64) Tensor {
	return Tensor{Data: data, DType: F32, Shape: shape}
}

// U16Tensor views f16 or bf16 bits held in a []uint16.
func U16Tensor(data []uint16, dtype DType, shape ...int64) Tensor {
	return Tensor{Data: data, DType: dtype, Shape: shape}
}

// view: the data pointer, element count and meta block for kvgo_tensor.
func (t *Tensor) view(what string, want []int64) (unsafe.Pointer, [14]C.int64_t, error) {
	var meta [14]C.int64_t
	var ptr unsafe.Pointer
	var n int
	isz := 4
	switch d := t.Data.(type) {
	case []float32:
		if t.DType != F32 {
			return nil, meta, argErr("%s: []float32 data with dtype %v", what, t.DType)
		}
		n = len(d)
		if n > 0 {
			ptr = unsafe.Pointer(&d[0])
		}
	case []uint16:
		if t.DType != F16 && t.DType != BF16 {
			return nil, meta, argErr("%s: []uint16 data needs DType F16 or BF16, not %v", what, t.DType)
		}
		isz, n = 2, len(d)
		if n > 0 {
			ptr = unsafe.Pointer(&d[0])
		}
	case []byte:
		if t.DType < F32 || t.DType > BF16 {
			return nil, meta, argErr("%s: []byte data needs DType F32, F16 or BF16", what)
		}
		if t.DType != F32 {
			isz = 2
		}
		if len(d)%isz != 0 {
			return nil, meta, argErr("%s: %d bytes is not a whole number of %d-byte elements", what, len(d), isz)
		}
		n = len(d) / isz
		if n > 0 {
			ptr = unsafe.Pointer(&d[0])
		}
	default:
		return nil, meta, argErr("%s: Data must be []float32, []uint16 or []byte, not %T", what, t.Data)
	}
	shape := t.Shape
	if len(shape) == 0 {
		shape = append([]int64(nil), want...)
		known, unknown := int64(1), -1
		for i, s := range shape {
			if s < 0 {
				unknown = i
			} else {
				known *= s
			}
		}
		if unknown >= 0 {
			if known == 0 || int64(n)%known != 0 {
				return nil, meta, argErr("%s holds %d elements, not a whole tensor of shape %v", what, n, want)
			}
			shape[unknown] = int64(n) / known
		}
	} else if want != nil {
		if len(shape) != len(want) {
			return nil, meta, argErr("%s has shape %v, expected %d dimensions", what, shape, len(want))
		}
		for i := range want {
			if want[i] >= 0 && want[i] != shape[i] {
				return nil, meta, argErr("%s has shape %v, expected %v", what, shape, want)
			}
		}
	}
	if len(shape) < 1 || len(shape) > C.KVMEM_MAX_DIMS {
		return nil, meta, argErr("%s has %d dimensions, expected 1..%d", what, len(shape), C.KVMEM_MAX_DIMS)
	}
	strides := t.Strides
	if strides == nil {
		strides = make([]int64, len(shape))
		acc := int64(1)
		for i := len(shape) - 1; i >= 0; i-- {
			strides[i] = acc
			acc *= shape[i]
		}
	}
	if len(strides) != len(shape) {
		return nil, meta, argErr("%s: %d strides for %d dimensions", what, len(strides), len(shape))
	}
	// the furthest element of the view must lie inside the slice: C trusts it
	last, empty := int64(0), false
	for i := range shape {
		if shape[i] < 0 || strides[i] < 0 {
			return nil, meta, argErr("%s: negative extent or stride (shape %v, strides %v)", what, shape, strides)
		}
		if shape[i] == 0 {
			empty = true
		}
		// (shape-1)*stride + last computed without wrapping: a wrapped sum would pass the check below
		if shape[i] > 1 && strides[i] > 0 && shape[i]-1 > (math.MaxInt64-last)/strides[i] {
			return nil, meta, argErr("%s: shape %v with strides %v reaches past the int64 range", what, shape, strides)
		}
		last += (shape[i] - 1) * strides[i]
	}
	if !empty && last >= int64(n) {
		return nil, meta, argErr("%s: shape %v with strides %v reaches element %d, the slice has %d", what, shape, strides, last, n)
	}
	meta[0], meta[1] = C.int64_t(t.DType), C.int64_t(len(shape))
	for i := range shape {
		meta[2+i], meta[8+i] = C.int64_t(shape[i]), C.int64_t(strides[i])
	}
	return ptr, meta, nil
}

// TensorInit is kvmem_tensor_init: the row-major strides C computes for shape
// (a check of a Tensor's geometry by the library itself).
func TensorInit(dtype DType, shape []int64) ([]int64, error) {
	if len(shape) == 0 {
		return nil, argErr("TensorInit: empty shape")
	}
	var meta [2]C.int64_t
	meta[0], meta[1] = C.int64_t(dtype), C.int64_t(len(shape))
	var strides [C.KVMEM_MAX_DIMS]C.int64_t
	var dummy C.float
	cs := make([]C.int64_t, len(shape))
	for i, s := range shape {
		cs[i] = C.int64_t(s)
	}
	err := call(func() C.kvmem_status {
		return C.kvgo_tensor_init(unsafe.Pointer(&dummy), &meta[0], &cs[0], &strides[0])
	})
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(shape))
	for i := range out {
		out[i] = int64(strides[i])
	}
	return out, nil
}

// ---------------------------------------------------------------------------
// Handles: a tree (context -> pools -> agents) guarded by one mutex, kept in
// small state records so that finalizers on the user-facing objects can run
// even while their owner is alive.
// ---------------------------------------------------------------------------

var treeMu sync.Mutex

type node struct {
	ptr           unsafe.Pointer
	free          func(unsafe.Pointer)
	parent        *node
	children      map[*node]struct{}
	freedByParent bool // an agent's handle dies with its pool
	kind          string
}

func newNode(ptr unsafe.Pointer, free func(unsafe.Pointer), parent *node, freedByParent bool, kind string) *node {
	n := &node{ptr: ptr, free: free, parent: parent, children: map[*node]struct{}{}, freedByParent: freedByParent, kind: kind}
	if parent != nil {
		treeMu.Lock()
		parent.children[n] = struct{}{}
		treeMu.Unlock()
	}
	return n
}

func (n *node) get() (unsafe.Pointer, error) {
	treeMu.Lock()
	p := n.ptr
	treeMu.Unlock()
	if p == nil {
		return nil, &Error{Code: StatusClosed, Msg: n.kind + " is closed"}
	}
	return p, nil
}

func (n *node) closeLocked() {
	if n.ptr == nil {
		return
	}
	for c := range n.children {
		if c.freedByParent {
			c.ptr = nil
			c.children = map[*node]struct{}{}
		} else {
			c.closeLocked()
		}
	}
	n.children = map[*node]struct{}{}
	n.free(n.ptr)
	n.ptr = nil
	if n.parent != nil {
		delete(n.parent.children, n)
	}
}

func (n *node) close() {
	treeMu.Lock()
	defer treeMu.Unlock()
	n.closeLocked()
}

// ---------------------------------------------------------------------------
// Context
// ---------------------------------------------------------------------------

// ContextParams is kvmem_context_params.
type ContextParams struct {
	Backend  string // "cpu", "cuda", "vulkan" or "auto" ("" = auto)
	NThreads int32  // 0 = online cores
}

// ContextDefaultParams is kvmem_context_default_params.
func ContextDefaultParams() ContextParams {
	p := C.kvmem_context_default_params()
	b := "auto"
	if p.backend != nil {
		b = C.GoString(p.backend)
	}
	return ContextParams{Backend: b, NThreads: int32(p.n_threads)}
}

// Context is kvmem_context.
type Context struct{ n *node }

// NewContext is kvmem_context_create.
func NewContext(p ContextParams) (*Context, error) {
	cp := C.kvmem_context_default_params()
	if p.Backend != "" {
		cs, err := cString(p.Backend, "backend")
		if err != nil {
			return nil, err
		}
		defer C.free(unsafe.Pointer(cs))
		cp.backend = cs
	}
	cp.n_threads = C.int32_t(p.NThreads)
	var out *C.kvmem_context
	if err := call(func() C.kvmem_status { return C.kvmem_context_create(&cp, &out) }); err != nil {
		return nil, err
	}
	c := &Context{newNode(unsafe.Pointer(out), func(p unsafe.Pointer) { C.kvmem_context_free((*C.kvmem_context)(p)) }, nil, false, "Context")}
	runtime.SetFinalizer(c, (*Context).Close)
	return c, nil
}

// Close is kvmem_context_free, after closing the context's pools. Idempotent.
func (c *Context) Close() { c.n.close() }

// Backend is kvmem_context_backend.
func (c *Context) Backend() string {
	p, err := c.n.get()
	if err != nil {
		return ""
	}
	return C.GoString(C.kvmem_context_backend((*C.kvmem_context)(p)))
}

// NThreads is kvmem_context_n_threads.
func (c *Context) NThreads() int {
	p, err := c.n.get()
	if err != nil {
		return 0
	}
	return int(C.kvmem_context_n_threads((*C.kvmem_context)(p)))
}

// LastError is kvmem_context_last_error: the message of the last failed call
// on this context (Attend, QmemScore), whichever OS thread made it ("" once
// closed).
func (c *Context) LastError() string {
	p, err := c.n.get()
	if err != nil {
		return ""
	}
	return objectError(func(b *C.char, n C.size_t) C.size_t {
		return C.kvmem_context_last_error((*C.kvmem_context)(p), b, n)
	})
}

// TransferStats is kvmem_context_transfer_stats (experimental): the bytes the
// library moved to (h2d) and from (d2h) the context's backend buffers.
func (c *Context) TransferStats() (h2d, d2h uint64, err error) {
	p, err := c.n.get()
	if err != nil {
		return 0, 0, err
	}
	var h, d C.uint64_t
	err = call(func() C.kvmem_status { return C.kvmem_context_transfer_stats((*C.kvmem_context)(p), &h, &d) })
	return uint64(h), uint64(d), err
}

// TransferReset is kvmem_context_transfer_reset (experimental).
func (c *Context) TransferReset() error {
	p, err := c.n.get()
	if err != nil {
		return err
	}
	return call(func() C.kvmem_status { return C.kvmem_context_transfer_reset((*C.kvmem_context)(p)) })
}

// VulkanDevice is kvmem_context_vulkan_device (experimental): the Vulkan
// objects a "vulkan" context runs on, as handle values, so an engine makes its
// buffers on that device. They belong to the context.
type VulkanDevice struct {
	Instance, PhysicalDevice, Device, Queue uintptr
	QueueFamily, APIVersion                 uint32
}

// VulkanDevice returns the context's Vulkan objects; an *Error with
// KVMEM_ERR_UNSUPPORTED on a context of another backend.
func (c *Context) VulkanDevice() (VulkanDevice, error) {
	p, err := c.n.get()
	if err != nil {
		return VulkanDevice{}, err
	}
	var out C.kvmem_vulkan_device
	out.struct_size = C.size_t(unsafe.Sizeof(out))
	err = call(func() C.kvmem_status { return C.kvmem_context_vulkan_device((*C.kvmem_context)(p), &out) })
	return VulkanDevice{uintptr(out.instance), uintptr(out.physical_device), uintptr(out.device), uintptr(out.queue),
		uint32(out.queue_family), uint32(out.api_version)}, err
}

// Memory kinds of a device tensor (kvmem.h, "Device tensors").
const (
	MemoryCUDA   = 1
	MemoryVulkan = 2
)

// CheckDeviceTensor is kvmem_tensor_init_device (experimental) for a
// descriptor of device memory: nil when kvmem would take such a tensor (the
// kind, handle and span within size), else the library's refusal. Go's calls
// take slices; device tensors reach kvmem through C, Python or Node for now.
func CheckDeviceTensor(kind int32, device int32, handle, offset, size uint64, dtype DType, shape ...int64) error {
	if len(shape) == 0 || len(shape) > 6 {
		return &Error{Code: StatusInvalidArg, Msg: "kvmem: a device tensor has 1 to 6 dimensions"}
	}
	var sh [6]C.int64_t
	for i, e := range shape {
		sh[i] = C.int64_t(e)
	}
	return call(func() C.kvmem_status {
		return C.kvgo_device_check(C.int32_t(kind), C.int32_t(device), C.uint64_t(handle), C.uint64_t(offset),
			C.uint64_t(size), C.int32_t(dtype), C.int32_t(len(shape)), &sh[0])
	})
}

// ---------------------------------------------------------------------------
// Pool
// ---------------------------------------------------------------------------

// PoolParams is kvmem_pool_params.
type PoolParams struct {
	BlockSize         int32
	StorageDType      DType
	CapacityBytes     uint64
	MaxAgents         int32
	MaxTokensPerAgent int32
	StoreDir          string // a directory where agents persist; "" = none
	HostBudgetBytes   uint64
	// DeviceCapacityBytes bounds the device bytes the agents' device-resident
	// mirrors hold together (0 = no limit): past it closed agents' mirrors give
	// way, then an agent is served from the host copy (same results). See DeviceStats.
	DeviceCapacityBytes uint64
}

// PoolDefaultParams is kvmem_pool_default_params.
func PoolDefaultParams() PoolParams {
	p := C.kvmem_pool_default_params()
	return PoolParams{BlockSize: int32(p.block_size), StorageDType: DType(p.storage_dtype), CapacityBytes: uint64(p.capacity_bytes),
		MaxAgents: int32(p.max_agents), MaxTokensPerAgent: int32(p.max_tokens_per_agent), HostBudgetBytes: uint64(p.host_budget_bytes),
		DeviceCapacityBytes: uint64(p.device_capacity_bytes)}
}

// PoolInfo is kvmem_pool_info.
type PoolInfo struct {
	UsedBytes, CapacityBytes uint64
	NAgents, BlockSize       int32
	StorageDType             DType
}

// Pool is kvmem_pool. Spec is the pool's model spec (read at creation).
type Pool struct {
	n    *node
	ctx  *Context
	Spec ModelSpec
}

// PoolCreate is kvmem_pool_create on this context.
func (c *Context) PoolCreate(spec ModelSpec, params PoolParams) (*Pool, error) {
	cp, err := c.n.get()
	if err != nil {
		return nil, err
	}
	cs, w, err := spec.toC()
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(w))
	pp := C.kvmem_pool_default_params() // sets struct_size
	pp.block_size, pp.storage_dtype = C.int32_t(params.BlockSize), C.kvmem_dtype(params.StorageDType)
	pp.capacity_bytes, pp.max_agents = C.uint64_t(params.CapacityBytes), C.int32_t(params.MaxAgents)
	pp.max_tokens_per_agent, pp.host_budget_bytes = C.int32_t(params.MaxTokensPerAgent), C.uint64_t(params.HostBudgetBytes)
	pp.device_capacity_bytes = C.uint64_t(params.DeviceCapacityBytes)
	if params.StoreDir != "" {
		if pp.store_dir, err = cString(params.StoreDir, "store dir"); err != nil { // copied by kvmem_pool_create
			return nil, err
		}
		defer C.free(unsafe.Pointer(pp.store_dir))
	}
	var out *C.kvmem_pool
	if err := call(func() C.kvmem_status { return C.kvgo_pool_create((*C.kvmem_context)(cp), &cs, w, &pp, &out) }); err != nil {
		return nil, err
	}
	p := &Pool{n: newNode(unsafe.Pointer(out), func(p unsafe.Pointer) { C.kvmem_pool_free((*C.kvmem_pool)(p)) }, c.n, false, "Pool"), ctx: c}
	runtime.SetFinalizer(p, (*Pool).Close)
	if p.Spec, err = p.GetSpec(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Close is kvmem_pool_free: frees the pool and every agent handle. Idempotent.
func (p *Pool) Close() { p.n.close() }

func (p *Pool) ptr() (*C.kvmem_pool, error) {
	h, err := p.n.get()
	return (*C.kvmem_pool)(h), err
}

// LastError is kvmem_pool_last_error: the message of the last failed call on
// this pool, whichever OS thread made it ("" once closed).
func (p *Pool) LastError() string {
	h, err := p.ptr()
	if err != nil {
		return ""
	}
	return objectError(func(b *C.char, n C.size_t) C.size_t { return C.kvmem_pool_last_error(h, b, n) })
}

// GetInfo is kvmem_pool_get_info.
func (p *Pool) GetInfo() (PoolInfo, error) {
	h, err := p.ptr()
	if err != nil {
		return PoolInfo{}, err
	}
	var i C.kvmem_pool_info
	err = call(func() C.kvmem_status { return C.kvmem_pool_get_info(h, &i) })
	return PoolInfo{uint64(i.used_bytes), uint64(i.capacity_bytes), int32(i.n_agents), int32(i.block_size), DType(i.storage_dtype)}, err
}

// DeviceStats is kvmem_pool_device_stats (experimental): the device bytes the
// agents' device-resident mirrors hold, the closed agents' mirrors evicted for
// room, and the device calls served from the host copy because a mirror did
// not fit DeviceCapacityBytes.
func (p *Pool) DeviceStats() (mirrorBytes, evictions, unmirrored uint64, err error) {
	h, err := p.ptr()
	if err != nil {
		return 0, 0, 0, err
	}
	var b, e, u C.uint64_t
	err = call(func() C.kvmem_status { return C.kvmem_pool_device_stats(h, &b, &e, &u) })
	return uint64(b), uint64(e), uint64(u), err
}

// GetSpec is kvmem_pool_get_spec.
func (p *Pool) GetSpec() (ModelSpec, error) {
	h, err := p.ptr()
	if err != nil {
		return ModelSpec{}, err
	}
	var s C.kvmem_model_spec
	if err := call(func() C.kvmem_status { return C.kvgo_pool_get_spec(h, &s) }); err != nil {
		return ModelSpec{}, err
	}
	return specFromC(s), nil
}

// AgentID is kvmem_pool_agent_id: the id of the agent at index (agents sorted by id).
func (p *Pool) AgentID(index int) (string, error) {
	h, err := p.ptr()
	if err != nil {
		return "", err
	}
	ci, err := i32("index", index)
	if err != nil {
		return "", err
	}
	var buf [C.KVMEM_MAX_AGENT_ID + 1]C.char
	var n C.size_t
	if err := call(func() C.kvmem_status {
		return C.kvmem_pool_agent_id(h, ci, &buf[0], C.size_t(len(buf)), &n)
	}); err != nil {
		return "", err
	}
	return C.GoStringN(&buf[0], C.int(n)), nil
}

// AgentIDs lists every agent id in the pool.
func (p *Pool) AgentIDs() ([]string, error) {
	info, err := p.GetInfo()
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, info.NAgents)
	for i := 0; i < int(info.NAgents); i++ {
		id, err := p.AgentID(i)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// RemoveAgent is kvmem_pool_remove_agent.
func (p *Pool) RemoveAgent(id string) error {
	h, err := p.ptr()
	if err != nil {
		return err
	}
	cs, err := cString(id, "agent id")
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(cs))
	return call(func() C.kvmem_status { return C.kvmem_pool_remove_agent(h, cs) })
}

// ---------------------------------------------------------------------------
// Agent
// ---------------------------------------------------------------------------

// Agent is kvmem_agent.
type Agent struct {
	n    *node
	pool *Pool
}

// AgentOpen is kvmem_agent_open.
func (p *Pool) AgentOpen(id string) (*Agent, error) {
	h, err := p.ptr()
	if err != nil {
		return nil, err
	}
	cs, err := cString(id, "agent id")
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(cs))
	var out *C.kvmem_agent
	if err := call(func() C.kvmem_status { return C.kvmem_agent_open(h, cs, &out) }); err != nil {
		return nil, err
	}
	a := &Agent{n: newNode(unsafe.Pointer(out), func(p unsafe.Pointer) { C.kvmem_agent_close((*C.kvmem_agent)(p)) }, p.n, true, "Agent '"+id+"'"), pool: p}
	runtime.SetFinalizer(a, (*Agent).Close)
	return a, nil
}

// Close is kvmem_agent_close; the agent's memory stays in the pool. Idempotent.
func (a *Agent) Close() { a.n.close() }

func (a *Agent) ptr() (*C.kvmem_agent, error) {
	h, err := a.n.get()
	return (*C.kvmem_agent)(h), err
}

// LastError is kvmem_agent_last_error: the message of the last failed call
// on this agent, whichever OS thread made it ("" once closed).
func (a *Agent) LastError() string {
	h, err := a.ptr()
	if err != nil {
		return ""
	}
	return objectError(func(b *C.char, n C.size_t) C.size_t { return C.kvmem_agent_last_error(h, b, n) })
}

// ID is kvmem_agent_get_id ("" once closed).
func (a *Agent) ID() string {
	h, err := a.ptr()
	if err != nil {
		return ""
	}
	return C.GoString(C.kvmem_agent_get_id(h))
}

func (a *Agent) kvShape(n int64) []int64 {
	s := a.pool.Spec
	return []int64{int64(s.NLayers), n, int64(s.NKVHeads), int64(s.HeadDim)}
}

// AppendParams is kvmem_append_params (nil slices = not given).
type AppendParams struct {
	TokenIDs         []int32
	Text             string
	TokenTextOffsets []int32
	Positions        []int32 // positions the keys were rotated at: K is post-RoPE
}

func ptr32(s []int32) *C.int32_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&s[0]))
}

// Append is kvmem_agent_append: k, v are [n_layers][T][n_kv_heads][head_dim]
// views; p may be nil. With p.Positions set the keys are post-RoPE.
func (a *Agent) Append(k, v Tensor, p *AppendParams) error {
	h, err := a.ptr()
	if err != nil {
		return err
	}
	kd, km, err := k.view("k", a.kvShape(-1))
	if err != nil {
		return err
	}
	vd, vm, err := v.view("v", a.kvShape(-1))
	if err != nil {
		return err
	}
	T := int(km[3])
	if p == nil {
		p = &AppendParams{}
	}
	for _, x := range []struct {
		name string
		s    []int32
	}{{"TokenIDs", p.TokenIDs}, {"TokenTextOffsets", p.TokenTextOffsets}, {"Positions", p.Positions}} {
		if x.s != nil && len(x.s) != T {
			return argErr("%s has %d entries, T is %d", x.name, len(x.s), T)
		}
	}
	var text *C.char
	if len(p.Text) > 0 {
		tb := []byte(p.Text)
		text = (*C.char)(unsafe.Pointer(&tb[0]))
		defer runtime.KeepAlive(tb)
	}
	rot := C.int32_t(0)
	if p.Positions != nil {
		rot = 1
	}
	err = call(func() C.kvmem_status {
		return C.kvgo_agent_append(h, kd, &km[0], vd, &vm[0], ptr32(p.TokenIDs), text, C.size_t(len(p.Text)),
			ptr32(p.TokenTextOffsets), ptr32(p.Positions), rot)
	})
	runtime.KeepAlive(k.Data)
	runtime.KeepAlive(v.Data)
	return err
}

// Flush is kvmem_agent_flush.
func (a *Agent) Flush() error {
	h, err := a.ptr()
	if err != nil {
		return err
	}
	return call(func() C.kvmem_status { return C.kvmem_agent_flush(h) })
}

// AgentInfo is kvmem_agent_info.
type AgentInfo struct {
	NTokens          int64
	NBlocks, NSealed int32
	Bytes, TextBytes uint64
}

// GetInfo is kvmem_agent_get_info.
func (a *Agent) GetInfo() (AgentInfo, error) {
	h, err := a.ptr()
	if err != nil {
		return AgentInfo{}, err
	}
	var i C.kvmem_agent_info
	err = call(func() C.kvmem_status { return C.kvmem_agent_get_info(h, &i) })
	return AgentInfo{int64(i.n_tokens), int32(i.n_blocks), int32(i.n_sealed), uint64(i.bytes), uint64(i.text_bytes)}, err
}

// BlockInfo is kvmem_block_info.
type BlockInfo struct {
	FirstToken int64
	NTokens    int32
	Sealed     bool
}

// BlockInfo is kvmem_agent_block_info.
func (a *Agent) BlockInfo(block int) (BlockInfo, error) {
	h, err := a.ptr()
	if err != nil {
		return BlockInfo{}, err
	}
	cb, err := i32("block", block)
	if err != nil {
		return BlockInfo{}, err
	}
	var b C.kvmem_block_info
	err = call(func() C.kvmem_status { return C.kvmem_agent_block_info(h, cb, &b) })
	return BlockInfo{int64(b.first_token), int32(b.n_tokens), b.sealed != 0}, err
}

// Read is kvmem_agent_read: raw KV of tokens [first, first+n) written into the
// given views ([n_layers][n][n_kv_heads][head_dim]); either may be nil.
func (a *Agent) Read(first, n int64, kOut, vOut *Tensor) error {
	h, err := a.ptr()
	if err != nil {
		return err
	}
	var kd, vd unsafe.Pointer
	var km, vm [14]C.int64_t
	var kmp, vmp *C.int64_t
	if kOut != nil {
		if kd, km, err = kOut.view("kOut", a.kvShape(n)); err != nil {
			return err
		}
		kmp = &km[0]
	}
	if vOut != nil {
		if vd, vm, err = vOut.view("vOut", a.kvShape(n)); err != nil {
			return err
		}
		vmp = &vm[0]
	}
	err = call(func() C.kvmem_status { return C.kvgo_agent_read(h, C.int64_t(first), C.int64_t(n), kd, kmp, vd, vmp) })
	if kOut != nil {
		runtime.KeepAlive(kOut.Data)
	}
	if vOut != nil {
		runtime.KeepAlive(vOut.Data)
	}
	return err
}

// ReadF32 reads tokens [first, first+n) (n < 0: to the end) into new f32 slices.
func (a *Agent) ReadF32(first, n int64) (k, v []float32, err error) {
	info, err := a.GetInfo()
	if err != nil {
		return nil, nil, err
	}
	if n < 0 {
		n = info.NTokens - first
	}
	if err := span("ReadF32", first, n, info.NTokens); err != nil {
		return nil, nil, err
	}
	s := a.pool.Spec
	size := int(int64(s.NLayers) * n * int64(s.NKVHeads) * int64(s.HeadDim))
	k, v = make([]float32, size), make([]float32, size)
	kt, vt := F32Tensor(k), F32Tensor(v)
	if err := a.Read(first, n, &kt, &vt); err != nil {
		return nil, nil, err
	}
	return k, v, nil
}

// BlockAABB is kvmem_agent_block_aabb: min and max of a sealed block's raw
// keys, each [n_layers][n_kv_heads][head_dim] f32.
func (a *Agent) BlockAABB(block int) (min, max []float32, err error) {
	h, err := a.ptr()
	if err != nil {
		return nil, nil, err
	}
	cb, err := i32("block", block)
	if err != nil {
		return nil, nil, err
	}
	s := a.pool.Spec
	n := int(s.NLayers * s.NKVHeads * s.HeadDim)
	min, max = make([]float32, n), make([]float32, n)
	err = call(func() C.kvmem_status {
		return C.kvmem_agent_block_aabb(h, cb, (*C.float)(unsafe.Pointer(&min[0])), (*C.float)(unsafe.Pointer(&max[0])))
	})
	if err != nil {
		return nil, nil, err
	}
	return min, max, nil
}

// Tokens is kvmem_agent_tokens: token ids [first, first+n) (-1 where none was given).
func (a *Agent) Tokens(first, n int64) ([]int32, error) {
	h, err := a.ptr()
	if err != nil {
		return nil, err
	}
	info, err := a.GetInfo()
	if err != nil {
		return nil, err
	}
	if err := span("Tokens", first, n, info.NTokens); err != nil {
		return nil, err
	}
	out := make([]int32, n)
	err = call(func() C.kvmem_status { return C.kvmem_agent_tokens(h, C.int64_t(first), C.int64_t(n), ptr32(out)) })
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Text is kvmem_agent_text, copied out (the C pointer is valid only until the next append).
func (a *Agent) Text() (string, error) {
	h, err := a.ptr()
	if err != nil {
		return "", err
	}
	var p *C.char
	var n C.size_t
	if err := call(func() C.kvmem_status { return C.kvmem_agent_text(h, &p, &n) }); err != nil {
		return "", err
	}
	if n == 0 {
		return "", nil
	}
	return C.GoStringN(p, C.int(n)), nil
}
