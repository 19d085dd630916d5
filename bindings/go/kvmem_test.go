package kvmem_test

import (
	"errors"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

func smallPool(t *testing.T, storage kvmem.DType) (*kvmem.Context, *kvmem.Pool) {
	t.Helper()
	ctx, err := kvmem.NewContext(kvmem.ContextParams{Backend: "cpu", NThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	spec := kvmem.ModelSpecDefault()
	spec.NLayers, spec.NQHeads, spec.NKVHeads, spec.HeadDim = 2, 4, 2, 8
	pp := kvmem.PoolDefaultParams()
	pp.BlockSize, pp.StorageDType = 4, storage
	pool, err := ctx.PoolCreate(spec, pp)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, pool
}

func seq(n int, s float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(math.Sin(float64(i)*0.37 + s))
	}
	return out
}

func TestStridedViewsWithoutCopies(t *testing.T) {
	ctx, pool := smallPool(t, kvmem.F32)
	defer ctx.Close()
	a, _ := pool.AgentOpen("t")
	const L, T, H, D = 2, 3, 2, 8
	big := seq(L*T*H*2*D, 1) // [L][T][H][2D], every other element
	k := kvmem.Tensor{Data: big, DType: kvmem.F32, Shape: []int64{L, T, H, D}, Strides: []int64{T * H * 2 * D, H * 2 * D, 2 * D, 2}}
	if err := a.Append(k, k, nil); err != nil {
		t.Fatal(err)
	}
	// read into the odd elements of a strided output
	out := make([]float32, L*T*H*2*D)
	ko := kvmem.Tensor{Data: out[1:], DType: kvmem.F32, Shape: k.Shape, Strides: k.Strides}
	if err := a.Read(0, T, &ko, nil); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(out); i += 2 {
		if out[i+1] != big[i] || out[i] != 0 {
			t.Fatalf("element %d: %v, want %v (and the gap untouched: %v)", i, out[i+1], big[i], out[i])
		}
	}
	bad := kvmem.Tensor{Data: big[:10], DType: kvmem.F32, Shape: k.Shape, Strides: k.Strides}
	if err := a.Append(bad, bad, nil); !errors.Is(err, kvmem.ErrInvalidArg) || !strings.Contains(err.Error(), "reaches element") {
		t.Fatalf("a view past the slice: %v", err)
	}
	if err := a.Append(kvmem.Tensor{Data: []float64{1}, DType: kvmem.F32}, k, nil); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Fatalf("[]float64: %v", err)
	}
	if err := a.Append(kvmem.F32Tensor(seq(7, 0)), kvmem.F32Tensor(seq(7, 0)), nil); err == nil || !strings.Contains(err.Error(), "whole tensor") {
		t.Fatalf("7 floats: %v", err)
	}
}

func TestBF16Bits(t *testing.T) {
	ctx, pool := smallPool(t, kvmem.F32)
	defer ctx.Close()
	a, _ := pool.AgentOpen("b")
	f := seq(2*2*8, 2)
	bits := make([]uint16, len(f))
	for i, x := range f {
		bits[i] = uint16(math.Float32bits(x) >> 16)
	}
	if err := a.Append(kvmem.U16Tensor(bits, kvmem.BF16), kvmem.U16Tensor(bits, kvmem.BF16), nil); err != nil {
		t.Fatal(err)
	}
	k, _, err := a.ReadF32(0, -1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range k {
		if k[i] != math.Float32frombits(uint32(bits[i])<<16) {
			t.Fatalf("element %d: %v", i, k[i])
		}
	}
	back := make([]uint16, len(bits))
	bt := kvmem.U16Tensor(back, kvmem.BF16)
	if err := a.Read(0, 1, &bt, nil); err != nil {
		t.Fatal(err)
	}
	for i := range back {
		if back[i] != bits[i] {
			t.Fatalf("bf16 read %d", i)
		}
	}
	if err := a.Append(kvmem.U16Tensor(bits, kvmem.F32), kvmem.U16Tensor(bits, kvmem.F32), nil); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Fatalf("uint16 as f32: %v", err)
	}
}

func TestLifetimes(t *testing.T) {
	ctx, pool := smallPool(t, kvmem.F16)
	a, _ := pool.AgentOpen("x")
	a.Close()
	a.Close()
	if err := a.Flush(); !errors.Is(err, kvmem.ErrClosed) || !strings.Contains(err.Error(), "Agent 'x' is closed") {
		t.Fatalf("closed agent: %v", err)
	}
	b, err := pool.AgentOpen("x")
	if err != nil || b.ID() != "x" {
		t.Fatal(err)
	}
	if _, err := pool.AgentOpen("x"); !errors.Is(err, kvmem.ErrExists) {
		t.Fatalf("second open: %v", err)
	}
	// an unreachable agent is closed by its finalizer, so it can be opened again
	b = nil
	for i := 0; i < 10; i++ {
		runtime.GC()
		if c, err := pool.AgentOpen("x"); err == nil {
			c.Close()
			break
		} else if i == 9 {
			t.Fatalf("the finalizer did not close the agent: %v", err)
		}
	}
	ctx.Close()
	ctx.Close()
	if _, err := pool.GetInfo(); !errors.Is(err, kvmem.ErrClosed) {
		t.Fatalf("pool after context close: %v", err)
	}
}

func TestConcurrentAgents(t *testing.T) {
	ctx, pool := smallPool(t, kvmem.F16)
	defer ctx.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			a, err := pool.AgentOpen("g" + string(rune('a'+g)))
			if err != nil {
				errs <- err
				return
			}
			defer a.Close()
			for i := 0; i < 20; i++ {
				k := seq(2*3*2*8, float64(g))
				if err := a.Append(kvmem.F32Tensor(k), kvmem.F32Tensor(k), nil); err != nil {
					errs <- err
					return
				}
			}
			// errors carry their own thread's message even under concurrency
			_, err = a.Tokens(0, 1000)
			if err == nil || !strings.Contains(err.Error(), "outside [0, 60)") {
				errs <- err
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestSpecPoolAndFreeFunctions(t *testing.T) {
	spec := kvmem.ModelSpecDefault()
	spec.NLayers, spec.NQHeads, spec.NKVHeads, spec.HeadDim = 1, 3, 2, 4
	if err := spec.Validate(); !errors.Is(err, kvmem.ErrInvalidArg) || !strings.Contains(err.Error(), "n_q_heads") {
		t.Fatalf("validate: %v", err)
	}
	if _, err := kvmem.NewContext(kvmem.ContextParams{Backend: "nonsense"}); !errors.Is(err, kvmem.ErrNotFound) || !strings.Contains(err.Error(), "nonsense") {
		t.Fatalf("unknown backend: %v", err)
	}
	ctx, _ := kvmem.NewContext(kvmem.ContextParams{Backend: "cpu", NThreads: 1})
	defer ctx.Close()
	if ctx.Backend() != "cpu" || ctx.NThreads() != 1 {
		t.Fatalf("context %s %d", ctx.Backend(), ctx.NThreads())
	}
	spec.NQHeads, spec.NLayers, spec.LayerWindow = 2, 2, []int32{0, 8}
	pp := kvmem.PoolDefaultParams()
	pp.BlockSize = 3
	if _, err := ctx.PoolCreate(spec, pp); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Fatalf("block size 3: %v", err)
	}
	pool, err := ctx.PoolCreate(spec, kvmem.PoolDefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	if got := pool.Spec.LayerWindow; len(got) != 2 || got[1] != 8 {
		t.Fatalf("layer window %v", got)
	}
	if kvmem.Version() != "0.1.0" || kvmem.VersionNumber() != 1000 || kvmem.StatusStr(-6) != "KVMEM_ERR_CLOSED" ||
		kvmem.DTypeName(kvmem.F16) != "f16" || !kvmem.AgentIDValid("a.b") || kvmem.AgentIDValid(".x") {
		t.Fatal("free functions")
	}
	bs, err := kvmem.Backends()
	if err != nil || len(bs) == 0 || bs[0].Name != "cpu" || !bs[0].Available {
		t.Fatalf("backends %v %v", bs, err)
	}
	st, err := kvmem.TensorInit(kvmem.F32, []int64{2, 3, 4})
	if err != nil || st[0] != 12 || st[1] != 4 || st[2] != 1 {
		t.Fatalf("tensor init %v %v", st, err)
	}
	if _, err := kvmem.TensorInit(kvmem.Q4, []int64{2}); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Fatalf("tensor init q4: %v", err)
	}
	var mu sync.Mutex
	var logged []string
	kvmem.LogSet(func(level int, msg string) { mu.Lock(); logged = append(logged, msg); mu.Unlock() })
	_, _ = kvmem.NewContext(kvmem.ContextParams{Backend: "nonsense"})
	kvmem.LogSet(nil)
	mu.Lock()
	defer mu.Unlock()
	if len(logged) == 0 || !strings.Contains(strings.Join(logged, "\n"), "nonsense") {
		t.Fatalf("log callback got %v", logged)
	}
	x := []float32{1, 0, 0, 0}
	s1 := kvmem.ModelSpecDefault()
	s1.HeadDim = 4
	if err := kvmem.RopeApply(s1, x, 4, []int32{3}, false); err != nil {
		t.Fatal(err)
	}
	if err := kvmem.RopeApply(s1, x, 4, []int32{3}, true); err != nil || math.Abs(float64(x[0]-1)) > 1e-6 {
		t.Fatalf("rope round trip %v %v", x, err)
	}
	_ = kvmem.LastError()
	kvmem.Free(nil)
}
