package kvmem

/*
#include <stdlib.h>
#include <string.h>
#include <kvmem.h>

// The growable source form where the loaded library has it: a weak
// reference is NULL against an older libkvmem of the same SONAME, which gets
// the frozen form (the same fields, the same meaning).
#pragma weak kvmem_attend_v2

static void kvgo_att_tensor(kvmem_tensor *t, void *data, const int64_t *meta) {
	t->data = data;
	t->dtype = (kvmem_dtype)meta[0];
	t->ndim = (int32_t)meta[1];
	for (int i = 0; i < KVMEM_MAX_DIMS; i++) { t->shape[i] = meta[2 + i]; t->strides[i] = meta[2 + KVMEM_MAX_DIMS + i]; }
}

// Every pointer of the source and params structs arrives as a plain argument
// and the structs are assembled here (cgo pointer rules, see kvmem.go).
static kvmem_status kvgo_attend(kvmem_context *ctx, void *qd, const int64_t *qm, int32_t kind, int32_t layer,
                                void *kd, const int64_t *km, void *vd, const int64_t *vm, const int32_t *slots,
                                int64_t n_positions, int32_t dead_slot, kvmem_agent *agent, const int32_t *positions,
                                int64_t base_position, const uint8_t *mask, kvmem_attend_params p,
                                const int32_t *tile_order, void *od, const int64_t *om, kvmem_attend_stats *stats) {
	kvmem_tensor q, k, v, o;
	kvmem_attend_source s;
	memset(&s, 0, sizeof s);
	kvgo_att_tensor(&q, qd, qm);
	kvgo_att_tensor(&o, od, om);
	s.kind = (kvmem_attend_source_kind)kind;
	s.layer = layer;
	if (km) { kvgo_att_tensor(&k, kd, km); s.k = &k; }
	if (vm) { kvgo_att_tensor(&v, vd, vm); s.v = &v; }
	s.slots = slots;
	s.n_positions = n_positions;
	s.dead_slot = dead_slot;
	s.agent = agent;
	s.positions = positions;
	s.base_position = base_position;
	s.mask = mask;
	p.tile_order = tile_order;
	if (kvmem_attend_v2) {
		kvmem_attend_source_v2 s2;
		kvmem_attend_source_v2_init(&s2);
		s2.kind = s.kind, s2.layer = s.layer, s2.k = s.k, s2.v = s.v, s2.slots = s.slots;
		s2.n_positions = s.n_positions, s2.dead_slot = s.dead_slot, s2.agent = s.agent;
		s2.positions = s.positions, s2.base_position = s.base_position, s2.mask = s.mask;
		return kvmem_attend_v2(ctx, &q, &s2, &p, &o, stats);
	}
	return kvmem_attend(ctx, &q, &s, &p, &o, stats);
}
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// Attention source kinds, tile orders and probes (kvmem_attend_*).
const (
	AttendSrcTensors   = 0
	AttendSrcAgent     = 1
	AttendSrcSlotmap   = 2
	AttendRecent       = 0
	AttendImportance   = 1
	AttendIndex        = 2
	AttendScored       = 3
	AttendProbeStrided = 0
	AttendProbeOracle  = 1
	AttendMaxRows      = 64
	AttendProbeSize    = 32
)

// AttendParams is kvmem_attend_params.
type AttendParams struct {
	Order, NSink      int32
	TileOrder         []int32
	TileSize          int32
	Scale, TauS, TauD float32
	Patience, Probe   int32
	Causal, Compare   bool
}

// AttendDefaultParams is kvmem_attend_default_params.
func AttendDefaultParams() AttendParams {
	p := C.kvmem_attend_default_params()
	return AttendParams{Order: int32(p.order), NSink: int32(p.n_sink), TileSize: int32(p.tile_size), Scale: float32(p.scale),
		TauS: float32(p.tau_s), TauD: float32(p.tau_d), Patience: int32(p.patience), Probe: int32(p.probe),
		Causal: p.causal != 0, Compare: p.compare != 0}
}

// AttendSource is kvmem_attend_source: set Agent (and Layer, Positions or
// BasePosition), or K and V ([T][n_kv_heads][head_dim] with Shape set), plus
// Slots and DeadSlot for a slot map. Mask: T bytes, 0 = skip, or nil.
type AttendSource struct {
	Agent        *Agent
	Layer        int32
	Positions    []int32
	BasePosition int64
	K, V         *Tensor
	Slots        []int32
	DeadSlot     int32
	Mask         []uint8
}

// AttendStats is kvmem_attend_stats.
type AttendStats struct {
	NStreams, TilesTotal, TilesVisited, StreamsStopped int64
	OracleTiles, OracleAgree, PositionsRead            int64
	StoppedEarly                                       bool
}

// Attend is kvmem_attend: q [n_rows][n_q_heads][head_dim] (post-RoPE, Shape
// set unless the source is an agent) into out (same shape).
func Attend(ctx *Context, q Tensor, src AttendSource, p AttendParams, out Tensor) (AttendStats, error) {
	var st AttendStats
	cp, err := ctx.n.get()
	if err != nil {
		return st, err
	}
	var want []int64
	kind := C.int32_t(AttendSrcTensors)
	var agent *C.kvmem_agent
	if src.Agent != nil {
		if agent, err = src.Agent.ptr(); err != nil {
			return st, err
		}
		s := src.Agent.pool.Spec
		want, kind = []int64{-1, int64(s.NQHeads), int64(s.HeadDim)}, AttendSrcAgent
	} else if src.Slots != nil {
		kind = AttendSrcSlotmap
	}
	qd, qm, err := q.view("q", want)
	if err != nil {
		return st, err
	}
	oshape := make([]int64, int(qm[1]))
	for i := range oshape {
		oshape[i] = int64(qm[2+i])
	}
	od, om, err := out.view("out", oshape)
	if err != nil {
		return st, err
	}
	var kd, vd unsafe.Pointer
	var km, vm [14]C.int64_t
	var kmp, vmp *C.int64_t
	if src.Agent == nil {
		if src.K == nil || src.V == nil {
			return st, argErr("Attend: the source needs an Agent, or K and V")
		}
		if kd, km, err = src.K.view("k", nil); err != nil {
			return st, err
		}
		if vd, vm, err = src.V.view("v", nil); err != nil {
			return st, err
		}
		kmp, vmp = &km[0], &vm[0]
	}
	var mask *C.uint8_t
	if len(src.Mask) > 0 {
		mask = (*C.uint8_t)(unsafe.Pointer(&src.Mask[0]))
	}
	nto, err := i32("len(TileOrder)", len(p.TileOrder))
	if err != nil {
		return st, err
	}
	cpar := C.kvmem_attend_default_params()
	cpar.order, cpar.n_sink, cpar.n_tile_order = C.kvmem_attend_order(p.Order), C.int32_t(p.NSink), nto
	cpar.tile_size, cpar.scale, cpar.tau_s, cpar.tau_d = C.int32_t(p.TileSize), C.float(p.Scale), C.float(p.TauS), C.float(p.TauD)
	cpar.patience, cpar.probe = C.int32_t(p.Patience), C.kvmem_attend_probe(p.Probe)
	cpar.causal, cpar.compare = 0, 0
	if p.Causal {
		cpar.causal = 1
	}
	if p.Compare {
		cpar.compare = 1
	}
	var cs C.kvmem_attend_stats
	err = call(func() C.kvmem_status {
		return C.kvgo_attend((*C.kvmem_context)(cp), qd, &qm[0], kind, C.int32_t(src.Layer), kd, kmp, vd, vmp,
			ptr32(src.Slots), C.int64_t(len(src.Slots)), C.int32_t(src.DeadSlot), agent, ptr32(src.Positions),
			C.int64_t(src.BasePosition), mask, cpar, ptr32(p.TileOrder), od, &om[0], &cs)
	})
	runtime.KeepAlive(q.Data)
	runtime.KeepAlive(out.Data)
	runtime.KeepAlive(src)
	runtime.KeepAlive(p.TileOrder)
	if err != nil {
		return st, err
	}
	return AttendStats{int64(cs.n_streams), int64(cs.tiles_total), int64(cs.tiles_visited), int64(cs.streams_stopped),
		int64(cs.oracle_tiles), int64(cs.oracle_agree), int64(cs.positions_read), cs.stopped_early != 0}, nil
}
