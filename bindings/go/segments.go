package kvmem

/*
#include <stdlib.h>
#include <kvmem.h>

// As in kvmem.go: tensors and append params are built on the C stack from
// plain pointer arguments (meta: dtype, ndim, shape[6], strides[6]).
static void kvgo_seg_tensor(kvmem_tensor *t, void *data, const int64_t *meta) {
	t->data = data;
	t->dtype = (kvmem_dtype)meta[0];
	t->ndim = (int32_t)meta[1];
	for (int i = 0; i < KVMEM_MAX_DIMS; i++) { t->shape[i] = meta[2 + i]; t->strides[i] = meta[2 + KVMEM_MAX_DIMS + i]; }
}

static kvmem_status kvgo_segments_store(kvmem_segments *s, int group, int32_t id, void *kd, const int64_t *km,
                                        void *vd, const int64_t *vm, const int32_t *token_ids, const char *text,
                                        size_t text_len, const int32_t *offsets, const int32_t *positions,
                                        int32_t keys_rotated) {
	kvmem_tensor k, v;
	kvgo_seg_tensor(&k, kd, km);
	kvgo_seg_tensor(&v, vd, vm);
	kvmem_append_params p = kvmem_append_default_params();
	p.token_ids = token_ids;
	p.text = text;
	p.text_len = text_len;
	p.token_text_offsets = offsets;
	p.positions = positions;
	p.keys_rotated = keys_rotated;
	return group ? kvmem_segments_store_group(s, id, &k, &v, &p) : kvmem_segments_store_segment(s, id, &k, &v, &p);
}
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// Group states, event kinds and unit kinds of KEEP segments.
const (
	GroupDynamic         = 0
	GroupStatic          = 1
	SegEventSegmentStale = 1
	SegEventGroupStatic  = 2
	SegEventGroupDynamic = 3
	SegUnitSegment       = 0
	SegUnitGroup         = 1
)

// SegmentsParams is kvmem_segments_params.
type SegmentsParams struct {
	StaticAfterSteps int32
	MaxSegments      int32
}

// SegmentsDefaultParams is kvmem_segments_default_params.
func SegmentsDefaultParams() SegmentsParams {
	p := C.kvmem_segments_default_params()
	return SegmentsParams{int32(p.static_after_steps), int32(p.max_segments)}
}

// Segments is kvmem_segments, a KEEP segment store whose KV lives in a Pool.
type Segments struct {
	n    *node
	pool *Pool
}

// SegmentsCreate is kvmem_segments_create. Closing the pool closes the store first.
func (p *Pool) SegmentsCreate(owner string, params SegmentsParams) (*Segments, error) {
	h, err := p.ptr()
	if err != nil {
		return nil, err
	}
	cs, err := cString(owner, "owner")
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(cs))
	sp := C.kvmem_segments_default_params() // sets struct_size
	sp.static_after_steps, sp.max_segments = C.int32_t(params.StaticAfterSteps), C.int32_t(params.MaxSegments)
	var out *C.kvmem_segments
	if err := call(func() C.kvmem_status { return C.kvmem_segments_create(h, cs, &sp, &out) }); err != nil {
		return nil, err
	}
	s := &Segments{n: newNode(unsafe.Pointer(out), func(p unsafe.Pointer) { C.kvmem_segments_free((*C.kvmem_segments)(p)) }, p.n, false, "Segments"), pool: p}
	runtime.SetFinalizer(s, (*Segments).Close)
	return s, nil
}

// Close is kvmem_segments_free (removes the store's agents). Idempotent.
func (s *Segments) Close() { s.n.close() }

func (s *Segments) ptr() (*C.kvmem_segments, error) {
	h, err := s.n.get()
	return (*C.kvmem_segments)(h), err
}

func (s *Segments) simple(f func(h *C.kvmem_segments) C.kvmem_status) error {
	h, err := s.ptr()
	if err != nil {
		return err
	}
	return call(func() C.kvmem_status { return f(h) })
}

// Add is kvmem_segments_add: the new segment's index.
func (s *Segments) Add(name string, group int32) (int32, error) {
	cs, err := cString(name, "segment name")
	if err != nil {
		return -1, err
	}
	defer C.free(unsafe.Pointer(cs))
	var i C.int32_t
	err = s.simple(func(h *C.kvmem_segments) C.kvmem_status { return C.kvmem_segments_add(h, cs, C.int32_t(group), &i) })
	return int32(i), err
}

// Update is kvmem_segments_update.
func (s *Segments) Update(index int32) error {
	return s.simple(func(h *C.kvmem_segments) C.kvmem_status { return C.kvmem_segments_update(h, C.int32_t(index)) })
}

// Remove is kvmem_segments_remove.
func (s *Segments) Remove(index int32) error {
	return s.simple(func(h *C.kvmem_segments) C.kvmem_status { return C.kvmem_segments_remove(h, C.int32_t(index)) })
}

// Assign is kvmem_segments_assign.
func (s *Segments) Assign(index, group int32) error {
	return s.simple(func(h *C.kvmem_segments) C.kvmem_status {
		return C.kvmem_segments_assign(h, C.int32_t(index), C.int32_t(group))
	})
}

// Step is kvmem_segments_step.
func (s *Segments) Step() error {
	return s.simple(func(h *C.kvmem_segments) C.kvmem_status { return C.kvmem_segments_step(h) })
}

// SegmentEvent is kvmem_segment_event.
type SegmentEvent struct {
	Kind, Group, Segment int32
	Step                 int64
}

// DrainEvents is kvmem_segments_drain_events: every queued event, oldest first.
func (s *Segments) DrainEvents() ([]SegmentEvent, error) {
	var out []SegmentEvent
	var buf [64]C.kvmem_segment_event
	for {
		var n, left C.size_t
		if err := s.simple(func(h *C.kvmem_segments) C.kvmem_status {
			return C.kvmem_segments_drain_events(h, &buf[0], C.size_t(len(buf)), &n, &left)
		}); err != nil {
			return out, err
		}
		for _, e := range buf[:n] {
			out = append(out, SegmentEvent{int32(e.kind), int32(e.group), int32(e.segment), int64(e.step)})
		}
		if left == 0 || n == 0 {
			return out, nil
		}
	}
}

func (s *Segments) store(group bool, id int32, k, v Tensor, p *AppendParams) error {
	h, err := s.ptr()
	if err != nil {
		return err
	}
	sp := s.pool.Spec
	shape := []int64{int64(sp.NLayers), -1, int64(sp.NKVHeads), int64(sp.HeadDim)}
	kd, km, err := k.view("k", shape)
	if err != nil {
		return err
	}
	vd, vm, err := v.view("v", shape)
	if err != nil {
		return err
	}
	if p == nil {
		p = &AppendParams{}
	}
	T := int(km[3])
	for _, x := range [][]int32{p.TokenIDs, p.TokenTextOffsets, p.Positions} {
		if x != nil && len(x) != T {
			return argErr("an append parameter has %d entries, T is %d", len(x), T)
		}
	}
	var text *C.char
	tb := []byte(p.Text)
	if len(tb) > 0 {
		text = (*C.char)(unsafe.Pointer(&tb[0]))
	}
	rot, g := C.int32_t(0), C.int(0)
	if p.Positions != nil {
		rot = 1
	}
	if group {
		g = 1
	}
	err = call(func() C.kvmem_status {
		return C.kvgo_segments_store(h, g, C.int32_t(id), kd, &km[0], vd, &vm[0], ptr32(p.TokenIDs), text, C.size_t(len(tb)),
			ptr32(p.TokenTextOffsets), ptr32(p.Positions), rot)
	})
	runtime.KeepAlive(k.Data)
	runtime.KeepAlive(v.Data)
	runtime.KeepAlive(tb)
	return err
}

// StoreSegment is kvmem_segments_store_segment (k, v as Agent.Append takes them).
func (s *Segments) StoreSegment(index int32, k, v Tensor, p *AppendParams) error {
	return s.store(false, index, k, v, p)
}

// StoreGroup is kvmem_segments_store_group: the joint KV of a STATIC group.
func (s *Segments) StoreGroup(group int32, k, v Tensor, p *AppendParams) error {
	return s.store(true, group, k, v, p)
}

// SegmentsInfo is kvmem_segments_info.
type SegmentsInfo struct {
	Step                                  int64
	NSegments, NIndices, NGroups, NStatic int32
	NEvents                               uint64
}

// GetInfo is kvmem_segments_get_info.
func (s *Segments) GetInfo() (SegmentsInfo, error) {
	var i C.kvmem_segments_info
	err := s.simple(func(h *C.kvmem_segments) C.kvmem_status { return C.kvmem_segments_get_info(h, &i) })
	return SegmentsInfo{int64(i.step), int32(i.n_segments), int32(i.n_indices), int32(i.n_groups), int32(i.n_static), uint64(i.n_events)}, err
}

// SegmentInfo is kvmem_segment_info.
type SegmentInfo struct {
	Group               int32
	Alive, HasKV        bool
	LastUpdate, NTokens int64
}

// SegmentInfo is kvmem_segments_segment_info.
func (s *Segments) SegmentInfo(index int32) (SegmentInfo, error) {
	var i C.kvmem_segment_info
	err := s.simple(func(h *C.kvmem_segments) C.kvmem_status {
		return C.kvmem_segments_segment_info(h, C.int32_t(index), &i)
	})
	return SegmentInfo{int32(i.group), i.alive != 0, i.has_kv != 0, int64(i.last_update), int64(i.n_tokens)}, err
}

// GroupInfo is kvmem_group_info.
type GroupInfo struct {
	State, NMembers     int32
	HasKV               bool
	LastChange, NTokens int64
}

// GroupInfo is kvmem_segments_group_info.
func (s *Segments) GroupInfo(group int32) (GroupInfo, error) {
	var i C.kvmem_group_info
	err := s.simple(func(h *C.kvmem_segments) C.kvmem_status { return C.kvmem_segments_group_info(h, C.int32_t(group), &i) })
	return GroupInfo{int32(i.state), int32(i.n_members), i.has_kv != 0, int64(i.last_change), int64(i.n_tokens)}, err
}

// Find is kvmem_segments_find: the index of a live segment by name.
func (s *Segments) Find(name string) (int32, error) {
	cs, err := cString(name, "segment name")
	if err != nil {
		return -1, err
	}
	defer C.free(unsafe.Pointer(cs))
	var i C.int32_t
	err = s.simple(func(h *C.kvmem_segments) C.kvmem_status { return C.kvmem_segments_find(h, cs, &i) })
	return int32(i), err
}

// Name is kvmem_segments_name.
func (s *Segments) Name(index int32) (string, error) {
	var n C.size_t
	if err := s.simple(func(h *C.kvmem_segments) C.kvmem_status {
		return C.kvmem_segments_name(h, C.int32_t(index), nil, 0, &n)
	}); err != nil {
		return "", err
	}
	buf := (*C.char)(C.malloc(n + 1))
	defer C.free(unsafe.Pointer(buf))
	if err := s.simple(func(h *C.kvmem_segments) C.kvmem_status {
		return C.kvmem_segments_name(h, C.int32_t(index), buf, n+1, &n)
	}); err != nil {
		return "", err
	}
	return C.GoStringN(buf, C.int(n)), nil
}

// GroupMembers is kvmem_segments_group_members.
func (s *Segments) GroupMembers(group int32) ([]int32, error) {
	var n C.size_t
	if err := s.simple(func(h *C.kvmem_segments) C.kvmem_status {
		return C.kvmem_segments_group_members(h, C.int32_t(group), nil, 0, &n)
	}); err != nil {
		return nil, err
	}
	out := make([]int32, int(n))
	err := s.simple(func(h *C.kvmem_segments) C.kvmem_status {
		return C.kvmem_segments_group_members(h, C.int32_t(group), ptr32(out), n, &n)
	})
	return out[:int(n)], err
}

// SegmentUnit is kvmem_segment_unit.
type SegmentUnit struct {
	Kind, Group, Segment int32
	NeedsCompute         bool
	Score                float32
	FirstToken, NTokens  int64
	AgentID              string
}

// Plan is kvmem_segments_plan: units to load for a query, best first.
// scores: one per segment index, or nil.
func (s *Segments) Plan(scores []float32, maxUnits int32) ([]SegmentUnit, error) {
	var sp *C.float
	if len(scores) > 0 {
		sp = (*C.float)(unsafe.Pointer(&scores[0]))
	}
	var n C.size_t
	if err := s.simple(func(h *C.kvmem_segments) C.kvmem_status {
		return C.kvmem_segments_plan(h, sp, C.size_t(len(scores)), C.int32_t(maxUnits), nil, 0, &n)
	}); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	units := (*C.kvmem_segment_unit)(C.malloc(n * C.size_t(unsafe.Sizeof(C.kvmem_segment_unit{}))))
	defer C.free(unsafe.Pointer(units))
	if err := s.simple(func(h *C.kvmem_segments) C.kvmem_status {
		return C.kvmem_segments_plan(h, sp, C.size_t(len(scores)), C.int32_t(maxUnits), units, n, &n)
	}); err != nil {
		return nil, err
	}
	runtime.KeepAlive(scores)
	out := make([]SegmentUnit, int(n))
	for i, u := range unsafe.Slice(units, int(n)) {
		out[i] = SegmentUnit{int32(u.kind), int32(u.group), int32(u.segment), u.needs_compute != 0, float32(u.score),
			int64(u.first_token), int64(u.n_tokens), C.GoString(&u.agent_id[0])}
	}
	return out, nil
}

// KmeansParams is kvmem_kmeans_params.
type KmeansParams struct {
	K, MaxIters int32
	Seed        uint64
}

// KmeansDefaultParams is kvmem_kmeans_default_params.
func KmeansDefaultParams() KmeansParams {
	p := C.kvmem_kmeans_default_params()
	return KmeansParams{int32(p.k), int32(p.max_iters), uint64(p.seed)}
}

// ClusterKmeans is kvmem_cluster_kmeans over emb [n][dim]: labels, centroids [k][dim], rounds run.
func ClusterKmeans(emb []float32, n, dim int, p KmeansParams) (labels []int32, centroids []float32, iters int32, err error) {
	// len(emb)/dim, not n*dim: a product that wraps could match len(emb) and size labels past it
	if n <= 0 || dim <= 0 || len(emb)%dim != 0 || n != len(emb)/dim {
		return nil, nil, 0, argErr("ClusterKmeans: emb has %d values, n*dim is %d*%d", len(emb), n, dim)
	}
	if p.K < 1 || int(p.K) > n {
		// C reports this too; checked here first because centroids is sized by K
		return nil, nil, 0, argErr("ClusterKmeans: k = %d outside [1, %d]", p.K, n)
	}
	labels, centroids = make([]int32, n), make([]float32, int(p.K)*dim)
	kp := C.kvmem_kmeans_default_params() // sets struct_size
	kp.k, kp.max_iters, kp.seed = C.int32_t(p.K), C.int32_t(p.MaxIters), C.uint64_t(p.Seed)
	var it C.int32_t
	err = call(func() C.kvmem_status {
		return C.kvmem_cluster_kmeans((*C.float)(unsafe.Pointer(&emb[0])), C.size_t(n), C.size_t(dim), &kp,
			ptr32(labels), (*C.float)(unsafe.Pointer(&centroids[0])), &it)
	})
	if err != nil {
		return nil, nil, 0, err
	}
	return labels, centroids, int32(it), nil
}

// MultihopParams is kvmem_multihop_params.
type MultihopParams struct {
	Ratio    float32
	MaxIters int32
}

// MultihopDefaultParams is kvmem_multihop_default_params.
func MultihopDefaultParams() MultihopParams {
	p := C.kvmem_multihop_default_params()
	return MultihopParams{float32(p.ratio), int32(p.max_iters)}
}

// MultihopResult is kvmem_multihop_result.
type MultihopResult struct {
	NSelected, Iters int32
	Converged        bool
}

// MultihopSelect is kvmem_multihop_select: q2s [nQuery][nSegments], s2s
// [nSegments][nSegments], candidates nSegments 0/1 bytes or nil.
func MultihopSelect(p MultihopParams, q2s []float32, nQuery int, s2s []float32, nSegments int, candidates []uint8) (selected []uint8, importance []float32, res MultihopResult, err error) {
	// sizes compared by division: products that wrap could match the slices' lengths
	if nQuery < 1 || nSegments < 1 || len(q2s)%nSegments != 0 || len(q2s)/nSegments != nQuery ||
		len(s2s)%nSegments != 0 || len(s2s)/nSegments != nSegments || (candidates != nil && len(candidates) != nSegments) {
		return nil, nil, res, argErr("MultihopSelect: sizes of q2s (%d), s2s (%d), candidates (%d) do not match nQuery = %d x nSegments = %d",
			len(q2s), len(s2s), len(candidates), nQuery, nSegments)
	}
	cq, err := i32("nQuery", nQuery)
	if err != nil {
		return nil, nil, res, err
	}
	cs, err := i32("nSegments", nSegments)
	if err != nil {
		return nil, nil, res, err
	}
	selected, importance = make([]uint8, nSegments), make([]float32, nSegments)
	mp := C.kvmem_multihop_default_params() // sets struct_size
	mp.ratio, mp.max_iters = C.float(p.Ratio), C.int32_t(p.MaxIters)
	var cand *C.uint8_t
	if candidates != nil {
		cand = (*C.uint8_t)(unsafe.Pointer(&candidates[0]))
	}
	var r C.kvmem_multihop_result
	err = call(func() C.kvmem_status {
		return C.kvmem_multihop_select(&mp, (*C.float)(unsafe.Pointer(&q2s[0])), cq, (*C.float)(unsafe.Pointer(&s2s[0])),
			cs, cand, (*C.uint8_t)(unsafe.Pointer(&selected[0])), (*C.float)(unsafe.Pointer(&importance[0])), &r)
	})
	if err != nil {
		return nil, nil, res, err
	}
	return selected, importance, MultihopResult{int32(r.n_selected), int32(r.iters), r.converged != 0}, nil
}

// MultihopSchedule is kvmem_multihop_schedule: per-layer ratios with mean avg.
func MultihopSchedule(nLayers int32, avg float32) ([]float32, error) {
	if nLayers < 1 {
		return nil, argErr("MultihopSchedule: n_layers = %d", nLayers)
	}
	out := make([]float32, nLayers)
	err := call(func() C.kvmem_status {
		return C.kvmem_multihop_schedule(C.int32_t(nLayers), C.float(avg), (*C.float)(unsafe.Pointer(&out[0])))
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// LoadPlanParams is kvmem_load_plan_params.
type LoadPlanParams struct {
	BandwidthGBps float64
	MaxAhead      int32
}

// LoadPlanDefaultParams is kvmem_load_plan_default_params.
func LoadPlanDefaultParams() LoadPlanParams {
	p := C.kvmem_load_plan_default_params()
	return LoadPlanParams{float64(p.bandwidth_gbps), int32(p.max_ahead)}
}

// LoadItem is kvmem_load_item.
type LoadItem struct {
	Segment, Layer, IssueLayer int32
	StartMs, EndMs             float64
}

// LoadPlanStats is kvmem_load_plan_stats.
type LoadPlanStats struct {
	NaiveMakespanMs, NaiveComputeIdleMs, NaiveLoadIdleMs          float64
	BalancedMakespanMs, BalancedComputeIdleMs, BalancedLoadIdleMs float64
	ComputeMs, LoadMs                                             float64
	NLoads                                                        uint64
}

// LoadPlan is kvmem_load_plan: compute_ms per layer, load_bytes per segment,
// recompute [nLayers][nSegments] 0/1. Returns the balanced plan's loads, the
// layers' start times and the stats.
func LoadPlan(p LoadPlanParams, computeMs []float64, loadBytes []uint64, recompute []uint8) ([]LoadItem, []float64, LoadPlanStats, error) {
	nl, ns := len(computeMs), len(loadBytes)
	var st LoadPlanStats
	if nl < 1 || ns < 1 || len(recompute) != nl*ns {
		return nil, nil, st, argErr("LoadPlan: recompute has %d entries, expected %d layers x %d segments", len(recompute), nl, ns)
	}
	lp := C.kvmem_load_plan_default_params() // sets struct_size
	lp.bandwidth_gbps, lp.max_ahead = C.double(p.BandwidthGBps), C.int32_t(p.MaxAhead)
	cm := (*C.double)(unsafe.Pointer(&computeMs[0]))
	lb := (*C.uint64_t)(unsafe.Pointer(&loadBytes[0]))
	rc := (*C.uint8_t)(unsafe.Pointer(&recompute[0]))
	var n C.size_t
	if err := call(func() C.kvmem_status {
		return C.kvmem_load_plan(&lp, cm, C.int32_t(nl), lb, C.int32_t(ns), rc, nil, 0, &n, nil, nil)
	}); err != nil {
		return nil, nil, st, err
	}
	cap := n
	if cap == 0 {
		cap = 1
	}
	items := (*C.kvmem_load_item)(C.malloc(cap * C.size_t(unsafe.Sizeof(C.kvmem_load_item{}))))
	defer C.free(unsafe.Pointer(items))
	starts := make([]float64, nl)
	var cs C.kvmem_load_plan_stats
	if err := call(func() C.kvmem_status {
		return C.kvmem_load_plan(&lp, cm, C.int32_t(nl), lb, C.int32_t(ns), rc, items, cap, &n,
			(*C.double)(unsafe.Pointer(&starts[0])), &cs)
	}); err != nil {
		return nil, nil, st, err
	}
	out := make([]LoadItem, int(n))
	for i, it := range unsafe.Slice(items, int(n)) {
		out[i] = LoadItem{int32(it.segment), int32(it.layer), int32(it.issue_layer), float64(it.start_ms), float64(it.end_ms)}
	}
	st = LoadPlanStats{float64(cs.naive_makespan_ms), float64(cs.naive_compute_idle_ms), float64(cs.naive_load_idle_ms),
		float64(cs.balanced_makespan_ms), float64(cs.balanced_compute_idle_ms), float64(cs.balanced_load_idle_ms),
		float64(cs.compute_ms), float64(cs.load_ms), uint64(cs.n_loads)}
	return out, starts, st, nil
}
