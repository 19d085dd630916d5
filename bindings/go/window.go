package kvmem

// The model's window when retrieved memory goes into it (experimental): the
// order of the retrieved blocks before the live context (kvmem_arrange) and how
// the window is shared between memory and the live context (kvmem_window_split).

/*
#include <kvmem.h>
*/
import "C"

import "math"

// ArrangeOrder is kvmem_arrange_order.
type ArrangeOrder int32

// Orders of Arrange.
const (
	ArrangeChrono ArrangeOrder = 0 // ascending block id: the history's own order
	ArrangeScore  ArrangeOrder = 1 // ascending score: the most relevant block last; ties: the older first
	ArrangeRuns   ArrangeOrder = 2 // runs of adjacent ids kept whole, the runs by ascending best score
)

// Arrange is kvmem_arrange: the order to gather blocks (distinct ids >= 0) in,
// first = farthest from the new tokens. scores: one per block, or nil for
// ArrangeChrono.
func Arrange(blocks []int32, scores []float32, order ArrangeOrder) ([]int32, error) {
	if len(blocks) > math.MaxInt32 {
		return nil, argErr("Arrange: %d blocks is more than int32 holds", len(blocks))
	}
	if scores != nil && len(scores) != len(blocks) {
		return nil, argErr("Arrange: scores has %d values, expected %d", len(scores), len(blocks))
	}
	out := make([]int32, len(blocks))
	sp := ptrF32(scores) // nil for nil (no scores) and for an empty set
	err := call(func() C.kvmem_status {
		return C.kvmem_arrange(ptr32(blocks), sp, C.int32_t(len(blocks)), C.kvmem_arrange_order(order), ptr32(out))
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// WindowPlan is kvmem_window_plan.
type WindowPlan struct {
	MemoryTokens int32 // retrieved memory, whole blocks
	TopK         int32 // blocks to retrieve: MemoryTokens / block size
	LiveTokens   int32 // newest history tokens kept as the live context
}

// WindowSplit is kvmem_window_split: a window of window tokens, reserve of them
// for the turn itself; memory gets memoryShare of the window in whole blocks,
// the live context liveShare of it (0: all that is left). Shares in [0, 1].
func WindowSplit(window, reserve int32, memoryShare, liveShare float32, blockSize int32) (WindowPlan, error) {
	var p C.kvmem_window_plan
	err := call(func() C.kvmem_status {
		return C.kvmem_window_split(C.int32_t(window), C.int32_t(reserve), C.float(memoryShare), C.float(liveShare),
			C.int32_t(blockSize), &p)
	})
	if err != nil {
		return WindowPlan{}, err
	}
	return WindowPlan{int32(p.memory_tokens), int32(p.top_k), int32(p.live_tokens)}, nil
}
