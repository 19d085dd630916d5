package kvmem_test

// kvmem_model_spec_v2, the spec that grows: the binding's specs reach the
// library through it (pool, RoPE, validation) where the library has it, and
// what comes back is what went in and what the header says.

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

func TestSpecV2IsUsedWhereTheLibraryHasIt(t *testing.T) {
	if !kvmem.SpecV2() {
		t.Fatal("the linked libkvmem lacks kvmem_model_spec_v2_init")
	}
}

func TestSpecDefaultsAreTheHeaders(t *testing.T) {
	// kvmem.h: a 1-layer, 1-head, head_dim 64 shape with NEOX RoPE, theta 10000, no scaling
	ctx, err := kvmem.NewContext(kvmem.ContextParams{Backend: "cpu", NThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	pool, err := ctx.PoolCreate(kvmem.ModelSpecDefault(), kvmem.PoolDefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	got, err := pool.GetSpec()
	if err != nil {
		t.Fatal(err)
	}
	want := kvmem.ModelSpec{NLayers: 1, NQHeads: 1, NKVHeads: 1, HeadDim: 64, RopeStyle: kvmem.RopeNeox, RopeTheta: 10000,
		RopeScaling: kvmem.RopeScalingNone, RopeFactor: 1, RopeLowFreqFactor: 1, RopeHighFreqFactor: 4,
		RopeOriginalMaxPos: 8192, YarnBetaFast: 32, YarnBetaSlow: 1}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("pool spec %+v, want %+v", got, want)
	}
}

func TestPoolThroughSpecV2KeepsEveryField(t *testing.T) {
	ctx, err := kvmem.NewContext(kvmem.ContextParams{Backend: "cpu", NThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	spec := kvmem.ModelSpec{NLayers: 3, NQHeads: 4, NKVHeads: 2, HeadDim: 8, RotaryDim: 6, RopeStyle: kvmem.RopeGPTJ,
		RopeTheta: 500000, RopeScaling: kvmem.RopeScalingLlama3, RopeFactor: 8, RopeLowFreqFactor: 1,
		RopeHighFreqFactor: 4, RopeOriginalMaxPos: 4096, YarnBetaFast: 32, YarnBetaSlow: 1,
		LayerWindow: []int32{0, 16, 0}, ModelID: "m-v2"}
	pp := kvmem.PoolDefaultParams()
	pp.BlockSize = 4
	pool, err := ctx.PoolCreate(spec, pp)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pool.GetSpec()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, spec) {
		t.Fatalf("pool spec %+v, want %+v", got, spec)
	}
}

func TestRopeThroughSpecV2EqualsAPlainRotation(t *testing.T) {
	// NEOX pairs (i, i + r/2), angle p * theta^(-2i/r) (DESIGN.md)
	const d, theta = 8, 10000.0
	pos := []int32{0, 7, 1000}
	x := make([]float32, 3*d)
	for i := range x {
		x[i] = float32(2 * math.Sin(float64(i)*1.3))
	}
	ref := make([]float64, len(x))
	for row, p := range pos {
		for i := 0; i < d/2; i++ {
			a := float64(p) * math.Pow(theta, -2*float64(i)/d)
			x0, x1 := float64(x[row*d+i]), float64(x[row*d+i+d/2])
			ref[row*d+i] = x0*math.Cos(a) - x1*math.Sin(a)
			ref[row*d+i+d/2] = x0*math.Sin(a) + x1*math.Cos(a)
		}
	}
	spec := kvmem.ModelSpecDefault()
	spec.HeadDim, spec.RopeTheta = d, theta
	if err := kvmem.RopeApply(spec, x, d, pos, false); err != nil {
		t.Fatal(err)
	}
	for i := range x {
		if math.Abs(float64(x[i])-ref[i]) > 2e-6 {
			t.Fatalf("x[%d] = %g, plain rotation %g", i, x[i], ref[i])
		}
	}
}

func TestValidateThroughSpecV2NamesTheField(t *testing.T) {
	spec := kvmem.ModelSpecDefault()
	spec.NLayers, spec.NQHeads, spec.NKVHeads, spec.HeadDim = 1, 3, 2, 8
	err := spec.Validate()
	if !errors.Is(err, kvmem.ErrInvalidArg) || !strings.Contains(err.Error(), "n_kv_heads") {
		t.Fatalf("Validate: %v", err)
	}
	spec.NQHeads = 4
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
}
