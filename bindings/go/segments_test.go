package kvmem_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

func TestSegmentsLifecycle(t *testing.T) {
	ctx, pool := smallPool(t, kvmem.F16)
	defer ctx.Close()
	sp := kvmem.SegmentsDefaultParams()
	sp.StaticAfterSteps = 2
	segs, err := pool.SegmentsCreate("robot", sp)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := segs.Add("cup", 0)
	b, _ := segs.Add("table", 0)
	if a != 0 || b != 1 {
		t.Fatalf("indices %d %d", a, b)
	}
	if i, _ := segs.Find("table"); i != 1 {
		t.Fatal("find")
	}
	if n, _ := segs.Name(0); n != "cup" {
		t.Fatalf("name %q", n)
	}
	if m, _ := segs.GroupMembers(0); len(m) != 2 || m[1] != 1 {
		t.Fatalf("members %v", m)
	}
	ev, _ := segs.DrainEvents()
	if len(ev) != 2 || ev[0].Kind != kvmem.SegEventSegmentStale || ev[1].Segment != 1 {
		t.Fatalf("events %+v", ev)
	}
	k := make([]float32, 2*3*2*8)
	for i := range k {
		k[i] = 0.5
	}
	if err := segs.StoreSegment(a, kvmem.F32Tensor(k), kvmem.F32Tensor(k), &kvmem.AppendParams{TokenIDs: []int32{1, 2, 3}}); err != nil {
		t.Fatal(err)
	}
	if si, _ := segs.SegmentInfo(a); !si.HasKV || si.NTokens != 3 {
		t.Fatalf("segment info %+v", si)
	}
	_ = segs.Step()
	_ = segs.Step()
	if gi, _ := segs.GroupInfo(0); gi.State != kvmem.GroupStatic {
		t.Fatalf("group %+v", gi)
	}
	if ev, _ = segs.DrainEvents(); len(ev) != 1 || ev[0].Kind != kvmem.SegEventGroupStatic {
		t.Fatalf("events %+v", ev)
	}
	z := make([]float32, 2*5*2*8)
	if err := segs.StoreGroup(0, kvmem.F32Tensor(z), kvmem.F32Tensor(z), nil); err != nil {
		t.Fatal(err)
	}
	units, err := segs.Plan([]float32{1, 2}, 0)
	if err != nil || len(units) != 1 || units[0].Kind != kvmem.SegUnitGroup || units[0].NTokens != 5 || !strings.HasPrefix(units[0].AgentID, "robot.kvseg-g0") {
		t.Fatalf("plan %+v %v", units, err)
	}
	_ = segs.Update(b)
	if units, _ = segs.Plan([]float32{1, 2}, 1); len(units) != 1 || units[0].Segment != 1 || !units[0].NeedsCompute {
		t.Fatalf("plan after update %+v", units)
	}
	if info, _ := segs.GetInfo(); info.NSegments != 2 || info.NGroups != 1 {
		t.Fatalf("info %+v", info)
	}
	if _, err := segs.Add("cup", 3); !errors.Is(err, kvmem.ErrExists) || !strings.Contains(err.Error(), "cup") {
		t.Fatalf("duplicate: %v", err)
	}
	if err := segs.Update(99); !errors.Is(err, kvmem.ErrNotFound) {
		t.Fatalf("update 99: %v", err)
	}
	if _, err := segs.Plan([]float32{1}, 0); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Fatalf("plan with 1 score: %v", err)
	}
	if _, err := pool.SegmentsCreate("robot", sp); !errors.Is(err, kvmem.ErrExists) {
		t.Fatalf("second store: %v", err)
	}
	segs.Close()
	segs.Close()
	ids, _ := pool.AgentIDs()
	for _, id := range ids {
		if strings.HasPrefix(id, "robot.kvseg-") {
			t.Fatalf("agent %s left behind", id)
		}
	}
	if err := segs.Step(); !errors.Is(err, kvmem.ErrClosed) {
		t.Fatalf("closed: %v", err)
	}
	s2, _ := pool.SegmentsCreate("other", sp)
	pool.Close()
	if err := s2.Step(); !errors.Is(err, kvmem.ErrClosed) {
		t.Fatalf("store after its pool closed: %v", err)
	}
}

func TestKmeansMultihopLoadPlan(t *testing.T) {
	emb := []float32{1, 0, 0, 0.9, 0.1, 0, 0, 1, 0, 0, 0.95, 0.05, 0, 0, 1, 0.05, 0, 1}
	kp := kvmem.KmeansDefaultParams()
	kp.K, kp.Seed = 3, 7
	labels, cents, iters, err := kvmem.ClusterKmeans(emb, 6, 3, kp)
	if err != nil || labels[0] != labels[1] || labels[2] != labels[3] || labels[4] != labels[5] || labels[0] == labels[2] || labels[2] == labels[4] || len(cents) != 9 || iters < 1 {
		t.Fatalf("kmeans %v %v %d %v", labels, cents, iters, err)
	}
	if _, _, _, err := kvmem.ClusterKmeans(make([]float32, 6), 2, 3, kvmem.KmeansParams{K: 1, MaxIters: 10}); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Fatalf("zero rows: %v", err)
	}
	q2s := []float32{0, 0, 1, 0}
	s2s := []float32{1, 0, 0, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 1}
	mp := kvmem.MultihopDefaultParams()
	mp.Ratio = 0.5
	sel, _, res, err := kvmem.MultihopSelect(mp, q2s, 1, s2s, 4, nil)
	if err != nil || sel[0] != 1 || sel[1] != 0 || sel[2] != 1 || sel[3] != 0 || res.NSelected != 2 {
		t.Fatalf("multihop %v %+v %v", sel, res, err)
	}
	r, err := kvmem.MultihopSchedule(8, 0.5)
	sum := float32(0)
	for _, x := range r {
		sum += x
	}
	if err != nil || r[0] != 1 || math.Abs(float64(sum/8-0.5)) > 1e-6 {
		t.Fatalf("schedule %v %v", r, err)
	}
	if _, err := kvmem.MultihopSchedule(8, 0.01); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Fatalf("schedule avg 0.01: %v", err)
	}
	lp := kvmem.LoadPlanDefaultParams()
	lp.BandwidthGBps = 1
	items, starts, st, err := kvmem.LoadPlan(lp, []float64{1, 1}, []uint64{1e6, 2e6}, []uint8{0, 0, 0, 0})
	if err != nil || len(items) != 4 || st.NLoads != 4 || starts[0] < 3-1e-9 || st.BalancedMakespanMs > st.NaiveMakespanMs+1e-9 {
		t.Fatalf("load plan %+v %v %+v %v", items, starts, st, err)
	}
	if _, _, _, err := kvmem.LoadPlan(lp, []float64{1, 1}, []uint64{1, 1}, []uint8{0, 0, 1, 1}); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Fatalf("non-monotone: %v", err)
	}
}
