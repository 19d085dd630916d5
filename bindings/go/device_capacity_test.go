package kvmem_test

// PoolParams.DeviceCapacityBytes and Pool.DeviceStats: the device-resident
// mirrors never hold more than the capacity, and an agent whose mirror does
// not fit is served from the host copy with the CPU context's results.
// Vulkan is lavapipe here; without a usable device that part skips.

import (
	"math"
	"reflect"
	"testing"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

type capStep struct {
	blocks []int32
	scores []float32
	k, v   []float32
}

func capacityStep(t *testing.T, ctx *kvmem.Context, capacity uint64) (capStep, *kvmem.Pool) {
	t.Helper()
	const L, HQ, H, D, BS, NB = 2, 4, 2, 16, 16, 6
	spec := kvmem.ModelSpecDefault()
	spec.NLayers, spec.NQHeads, spec.NKVHeads, spec.HeadDim = L, HQ, H, D
	pp := kvmem.PoolDefaultParams()
	pp.BlockSize, pp.DeviceCapacityBytes = BS, capacity
	pool, err := ctx.PoolCreate(spec, pp)
	if err != nil {
		t.Fatal(err)
	}
	a, err := pool.AgentOpen("a")
	if err != nil {
		t.Fatal(err)
	}
	n := L * NB * BS * H * D
	k, v := make([]float32, n), make([]float32, n)
	for i := range k {
		k[i] = float32(math.Sin(float64(i)*0.37) + 2*math.Cos(float64(i/(H*D*BS))*1.7))
		v[i] = float32(math.Cos(float64(i) * 0.11))
	}
	if err := a.Append(kvmem.Tensor{Data: k}, kvmem.Tensor{Data: v}, nil); err != nil {
		t.Fatal(err)
	}
	q := make([]float32, L*HQ*D)
	for i := range q {
		q[i] = float32(math.Sin(float64(i) * 0.53))
	}
	rp := kvmem.RetrieveDefaultParams()
	rp.TopK = 3
	r, err := a.Retrieve(kvmem.Tensor{Data: q, Shape: []int64{1, L, HQ, D}}, rp, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	blocks, scores, err := r.Get(0)
	if err != nil {
		t.Fatal(err)
	}
	gk, gv, _, err := a.GatherF32(blocks, 0)
	if err != nil {
		t.Fatal(err)
	}
	return capStep{blocks, scores, gk, gv}, pool
}

func TestDeviceCapacityOnACPUContextHoldsNothing(t *testing.T) {
	if kvmem.PoolDefaultParams().DeviceCapacityBytes != 0 {
		t.Fatal("the default device capacity is not 0 (no limit)")
	}
	ctx, err := kvmem.NewContext(kvmem.ContextParams{Backend: "cpu", NThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	_, pool := capacityStep(t, ctx, 1)
	b, e, u, err := pool.DeviceStats()
	if err != nil || b != 0 || e != 0 || u != 0 {
		t.Fatalf("DeviceStats on cpu: %d %d %d %v", b, e, u, err)
	}
}

func TestDeviceCapacityServesFromTheHostWithTheSameResults(t *testing.T) {
	dev, err := kvmem.NewContext(kvmem.ContextParams{Backend: "vulkan", NThreads: 1})
	if err != nil {
		t.Skipf("backend vulkan: %v", err)
	}
	defer dev.Close()
	cpu, err := kvmem.NewContext(kvmem.ContextParams{Backend: "cpu", NThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	ref, _ := capacityStep(t, cpu, 0)
	for _, capacity := range []uint64{1, 0} {
		got, pool := capacityStep(t, dev, capacity)
		if !reflect.DeepEqual(got.blocks, ref.blocks) || !reflect.DeepEqual(got.v, ref.v) {
			t.Fatalf("capacity %d: blocks %v (cpu %v), or gathered values differ", capacity, got.blocks, ref.blocks)
		}
		scale := 0.0
		for _, x := range ref.k {
			scale = math.Max(scale, math.Abs(float64(x)))
		}
		for i := range ref.k {
			if math.Abs(float64(got.k[i]-ref.k[i])) > 1e-5*scale {
				t.Fatalf("capacity %d: k[%d] = %g, cpu %g", capacity, i, got.k[i], ref.k[i])
			}
		}
		for i := range ref.scores {
			if math.Abs(float64(got.scores[i]-ref.scores[i])) > 1e-4*math.Abs(float64(ref.scores[i]))+1e-7 {
				t.Fatalf("capacity %d: score %d = %g, cpu %g", capacity, i, got.scores[i], ref.scores[i])
			}
		}
		b, _, u, err := pool.DeviceStats()
		if err != nil || (capacity != 0 && (b != 0 || u == 0)) || (capacity == 0 && (b == 0 || u != 0)) {
			t.Fatalf("capacity %d: mirror bytes %d, unmirrored %d, %v", capacity, b, u, err)
		}
		pool.Close()
	}
}
