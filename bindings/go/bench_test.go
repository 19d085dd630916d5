package kvmem_test

import (
	"testing"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

// Binding overhead, Go: go test -run x -bench . (Llama-3-8B shape, one 16-token turn)
func benchAgent(b *testing.B) (*kvmem.Context, *kvmem.Agent, []float32) {
	ctx, _ := kvmem.NewContext(kvmem.ContextParams{Backend: "cpu", NThreads: 1})
	spec := kvmem.ModelSpecDefault()
	spec.NLayers, spec.NQHeads, spec.NKVHeads, spec.HeadDim = 32, 32, 8, 128
	pool, err := ctx.PoolCreate(spec, kvmem.PoolDefaultParams())
	if err != nil {
		b.Fatal(err)
	}
	a, _ := pool.AgentOpen("bench")
	k := seq(32*16*8*128, 1)
	if err := a.Append(kvmem.F32Tensor(k), kvmem.F32Tensor(k), nil); err != nil {
		b.Fatal(err)
	}
	return ctx, a, k
}

func BenchmarkGetInfo(b *testing.B) {
	ctx, a, _ := benchAgent(b)
	defer ctx.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_, _ = a.GetInfo()
	}
}

func BenchmarkAppend16(b *testing.B) {
	ctx, a, k := benchAgent(b)
	defer ctx.Close()
	b.SetBytes(int64(len(k) * 8))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = a.Append(kvmem.F32Tensor(k), kvmem.F32Tensor(k), nil)
	}
}

func BenchmarkRead16Into(b *testing.B) {
	ctx, a, k := benchAgent(b)
	defer ctx.Close()
	out := kvmem.F32Tensor(make([]float32, len(k)))
	b.SetBytes(int64(len(k) * 4))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = a.Read(0, 16, &out, nil)
	}
}
