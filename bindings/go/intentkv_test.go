package kvmem_test

import (
	"errors"
	"math"
	"reflect"
	"testing"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

func ikvSpec() kvmem.ModelSpec {
	s := kvmem.ModelSpecDefault()
	s.NLayers, s.NQHeads, s.NKVHeads, s.HeadDim = 2, 4, 2, 8
	return s
}

func TestQueryMemoryAndRuleScore(t *testing.T) {
	spec := ikvSpec()
	p := kvmem.QmemDefaultParams()
	p.Capacity = 4
	store, err := kvmem.NewQmemStore(spec, p)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	a1, _ := store.SessionKey(kvmem.SessionSource{SessionID: "chat-1"})
	a2, _ := store.SessionKey(kvmem.SessionSource{SessionID: "chat-1"})
	b, _ := store.SessionKey(kvmem.SessionSource{SessionID: "chat-2"})
	if a1 != a2 || a1.Kind != kvmem.SessionExplicit || (a1.Hi == b.Hi && a1.Lo == b.Lo) {
		t.Fatalf("keys %+v %+v %+v", a1, a2, b)
	}
	ids := make([]int32, 300)
	if pk, _ := store.SessionKey(kvmem.SessionSource{TokenIDs: ids}); pk.Kind != kvmem.SessionPrefix {
		t.Fatalf("prefix key %+v", pk)
	}
	const row = 2 * 4 * 8
	q := seq(6*row, 0.3)
	mem, err := store.Update(a1, kvmem.F32Tensor(q), 2, 5)
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < 8; r++ {
		var want [8]float64
		norm := 0.0
		for d := 0; d < 8; d++ {
			want[d] = (float64(q[2*row+r*8+d]) + float64(q[3*row+r*8+d]) + float64(q[4*row+r*8+d])) / 3
			norm += want[d] * want[d]
		}
		for d := 0; d < 8; d++ {
			if math.Abs(float64(mem[r*8+d])-want[d]/math.Sqrt(norm)) > 1e-5 {
				t.Fatalf("memory row %d: %v", r, mem[r*8:r*8+8])
			}
		}
	}
	if got, _ := store.Get(a1); !reflect.DeepEqual(got, mem) || store.Count() != 1 {
		t.Fatal("get")
	}
	if _, err := store.Get(b); !errors.Is(err, kvmem.ErrNotFound) {
		t.Fatalf("get b: %v", err)
	}
	if _, err := store.Update(b, kvmem.F32Tensor(q), 4, 4); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Fatalf("empty span: %v", err)
	}
	ctx, _ := kvmem.NewContext(kvmem.ContextParams{Backend: "cpu", NThreads: 1})
	defer ctx.Close()
	s, err := kvmem.QmemScore(ctx, spec, mem, kvmem.F32Tensor(seq(2*10*2*8, 1)))
	sum := 0.0
	for _, x := range s {
		sum += float64(x)
	}
	if err != nil || len(s) != 10 || math.Abs(sum-8) > 1e-4 {
		t.Fatalf("score %v %v (sum %v)", s, err, sum)
	}
}

func TestKeepSets(t *testing.T) {
	kept, err := kvmem.SelectKeep([]float32{0.1, 0.9, 0.2, 0.8, 0.3, 0.05, 0.7, 0.6}, 5, 1, 6, 8)
	if err != nil || !reflect.DeepEqual(kept, []int32{0, 1, 3, 6, 7}) {
		t.Fatalf("select %v %v", kept, err)
	}
	if k, _ := kvmem.StreamingKeep(10, 2, 3); !reflect.DeepEqual(k, []int32{0, 1, 7, 8, 9}) {
		t.Fatalf("streaming %v", k)
	}
	acc := make([]float32, 4)
	if err := kvmem.H2OAccumulate([]float32{0.1, 0.2, 0.3, 0.4, 0.4, 0.3, 0.2, 0.1}, 2, acc); err != nil {
		t.Fatal(err)
	}
	for _, x := range acc {
		if math.Abs(float64(x)-0.5) > 1e-6 {
			t.Fatalf("acc %v", acc)
		}
	}
	if k, _ := kvmem.H2OKeep([]float32{5, 1, 4, 0.5, 0.2, 0.1}, 4, 2); !reflect.DeepEqual(k, []int32{0, 2, 4, 5}) {
		t.Fatalf("h2o %v", k)
	}
	if _, err := kvmem.H2OKeep([]float32{5, 1}, 1, 2); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Fatalf("recent > budget: %v", err)
	}
	ctx, _ := kvmem.NewContext(kvmem.ContextParams{Backend: "cpu", NThreads: 1})
	defer ctx.Close()
	s, err := kvmem.SnapKVScore(ctx, ikvSpec(), kvmem.F32Tensor(seq(3*2*4*8, 2)), kvmem.F32Tensor(seq(2*12*2*8, 3)), 3)
	if err != nil || len(s) != 12 {
		t.Fatalf("snapkv %v %v", s, err)
	}
}

func TestSlotMaps(t *testing.T) {
	kp := kvmem.KVStoreDefaultParams()
	kp.PageSlots = 4
	store, err := kvmem.NewKVStore(ikvSpec(), kp)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := store.SlotmapCreate()
	k, v := seq(2*5*2*8, 4), seq(2*5*2*8, 5)
	if err := m.Append(kvmem.F32Tensor(k), kvmem.F32Tensor(v)); err != nil {
		t.Fatal(err)
	}
	child, _ := m.Fork(3)
	slots, dead, _ := m.Slots()
	if refs, _ := store.SlotRefs(slots[0]); dead != kvmem.DeadSlot || refs != 2 {
		t.Fatalf("dead %d refs %d", dead, refs)
	}
	if freed, err := m.Evict([]int32{0, 2, 4}); err != nil || freed != 1 {
		t.Fatalf("evict %d %v", freed, err)
	}
	after, _, _ := m.Slots()
	if after[1] != dead || after[3] != dead {
		t.Fatalf("slots %v", after)
	}
	gk, _, pos, err := m.Gather()
	if err != nil || !reflect.DeepEqual(pos, []int32{0, 2, 4}) {
		t.Fatalf("gather %v %v", pos, err)
	}
	const row = 16
	for l := 0; l < 2; l++ {
		for i, p := range []int{0, 2, 4} {
			if !reflect.DeepEqual(gk[(l*3+i)*row:(l*3+i+1)*row], k[(l*5+p)*row:(l*5+p+1)*row]) {
				t.Fatalf("gathered row l%d p%d", l, p)
			}
		}
	}
	rk, _, _ := store.ReadSlot(after[2])
	if !reflect.DeepEqual(rk[:row], k[2*row:3*row]) {
		t.Fatal("read slot")
	}
	if _, err := m.Compact([]int32{0, 2, 4}); err != nil {
		t.Fatal(err)
	}
	if info, _ := m.GetInfo(); info.Length != 3 {
		t.Fatalf("after compact %+v", info)
	}
	if _, err := m.Evict([]int32{2, 1}); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Fatalf("unsorted: %v", err)
	}
	store.Close()
	if _, err := m.GetInfo(); !errors.Is(err, kvmem.ErrClosed) {
		t.Fatalf("map after store close: %v", err)
	}
	if _, err := child.GetInfo(); !errors.Is(err, kvmem.ErrClosed) {
		t.Fatalf("fork after store close: %v", err)
	}
	if _, err := kvmem.QmemHeadLoad("/nonexistent/head.safetensors"); err == nil {
		t.Fatal("loading a missing head")
	}
	if _, err := kvmem.QmemHeadLoadBuffer([]byte("not a safetensors file")); err == nil {
		t.Fatal("loading garbage")
	}
}
