package kvmem_test

// Arrange and WindowSplit against plain reimplementations of the header's
// contract (include/kvmem.h, "The window").

import (
	"errors"
	"math"
	"math/rand"
	"reflect"
	"sort"
	"testing"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

func refArrange(blocks []int32, scores []float32, order kvmem.ArrangeOrder) []int32 {
	ids := append([]int32(nil), blocks...)
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	if order == kvmem.ArrangeChrono {
		return ids
	}
	s := map[int32]float32{}
	for i, b := range blocks {
		s[b] = scores[i]
	}
	if order == kvmem.ArrangeScore { // ascending score, ties: the older block first
		sort.SliceStable(ids, func(i, j int) bool { return s[ids[i]] < s[ids[j]] })
		return ids
	}
	var runs [][]int32
	for _, b := range ids {
		if n := len(runs); n > 0 && b == runs[n-1][len(runs[n-1])-1]+1 {
			runs[n-1] = append(runs[n-1], b)
		} else {
			runs = append(runs, []int32{b})
		}
	}
	best := func(r []int32) float32 {
		m := s[r[0]]
		for _, b := range r {
			if s[b] > m {
				m = s[b]
			}
		}
		return m
	}
	sort.SliceStable(runs, func(i, j int) bool { return best(runs[i]) < best(runs[j]) })
	var out []int32
	for _, r := range runs {
		out = append(out, r...)
	}
	return out
}

func TestArrange(t *testing.T) {
	blocks := []int32{9, 3, 4, 12, 5, 10}
	scores := []float32{0.7, 0.1, 0.9, 0.3, 0.2, 0.4}
	for _, c := range []struct {
		order kvmem.ArrangeOrder
		sc    []float32
		want  []int32
	}{
		{kvmem.ArrangeChrono, nil, []int32{3, 4, 5, 9, 10, 12}},
		{kvmem.ArrangeScore, scores, []int32{3, 5, 12, 10, 9, 4}},
		{kvmem.ArrangeRuns, scores, []int32{12, 9, 10, 3, 4, 5}}, // runs 3-5 (0.9), 9-10 (0.7), 12 (0.3)
	} {
		if got, err := kvmem.Arrange(blocks, c.sc, c.order); err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("Arrange(%v): %v %v, want %v", c.order, got, err, c.want)
		}
	}
	if got, err := kvmem.Arrange(nil, nil, kvmem.ArrangeChrono); err != nil || len(got) != 0 {
		t.Errorf("Arrange of none: %v %v", got, err)
	}
	rng := rand.New(rand.NewSource(3))
	for it := 0; it < 50; it++ {
		n := 1 + rng.Intn(11)
		perm := rng.Perm(20)[:n]
		b, sc := make([]int32, n), make([]float32, n)
		for i := range b {
			b[i], sc[i] = int32(perm[i]), float32(rng.Intn(4))/4 // ties on purpose
		}
		for _, o := range []kvmem.ArrangeOrder{kvmem.ArrangeChrono, kvmem.ArrangeScore, kvmem.ArrangeRuns} {
			if got, err := kvmem.Arrange(b, sc, o); err != nil || !reflect.DeepEqual(got, refArrange(b, sc, o)) {
				t.Fatalf("Arrange(%v, %v, %v) = %v %v, want %v", b, sc, o, got, err, refArrange(b, sc, o))
			}
		}
	}
	for _, bad := range []func() error{
		func() error {
			_, err := kvmem.Arrange([]int32{1, 2, 1}, []float32{0.1, 0.2, 0.3}, kvmem.ArrangeScore)
			return err
		},
		func() error { _, err := kvmem.Arrange([]int32{1, 2}, nil, kvmem.ArrangeRuns); return err },
		func() error {
			_, err := kvmem.Arrange([]int32{1, 2}, []float32{0.1, float32(math.NaN())}, kvmem.ArrangeScore)
			return err
		},
		func() error { _, err := kvmem.Arrange([]int32{1, -2}, nil, kvmem.ArrangeChrono); return err },
		func() error { _, err := kvmem.Arrange([]int32{1, 2}, []float32{0.1}, kvmem.ArrangeScore); return err },
		func() error {
			_, err := kvmem.Arrange([]int32{1, 2}, []float32{0.1, 0.2}, kvmem.ArrangeOrder(7))
			return err
		},
	} {
		if err := bad(); !errors.Is(err, kvmem.ErrInvalidArg) {
			t.Errorf("bad Arrange: %v", err)
		}
	}
}

func refSplit(window, reserve int32, ms, ls float32, bs int32) kvmem.WindowPlan {
	room := window - reserve
	memory := int32(math.Floor(float64(ms)*float64(window)+1e-9)) / bs * bs
	if memory > room {
		memory = room / bs * bs
	}
	left := room - memory
	live := left
	if ls > 0 {
		live = int32(math.Floor(float64(ls)*float64(window) + 1e-9))
	}
	if live > left {
		live = left
	}
	return kvmem.WindowPlan{MemoryTokens: memory, TopK: memory / bs, LiveTokens: live}
}

func TestWindowSplit(t *testing.T) {
	for _, c := range []struct {
		w, r   int32
		ms, ls float32
		bs     int32
		want   kvmem.WindowPlan
	}{
		{256, 64, 0.5, 0.25, 16, kvmem.WindowPlan{MemoryTokens: 128, TopK: 8, LiveTokens: 64}},
		{256, 64, 0.5, 0, 16, kvmem.WindowPlan{MemoryTokens: 128, TopK: 8, LiveTokens: 64}},
		{200, 100, 0.9, 0.5, 16, kvmem.WindowPlan{MemoryTokens: 96, TopK: 6, LiveTokens: 4}},
		{100, 0, 0.3, 0, 8, kvmem.WindowPlan{MemoryTokens: 24, TopK: 3, LiveTokens: 76}},
	} {
		if got, err := kvmem.WindowSplit(c.w, c.r, c.ms, c.ls, c.bs); err != nil || got != c.want {
			t.Errorf("WindowSplit%v: %v %v", c, got, err)
		}
	}
	shares := []float32{0, 0.1, 0.25, 1.0 / 3, 0.5, 0.75, 1}
	for _, w := range []int32{1, 7, 64, 255, 2048} {
		for _, r := range []int32{0, 1, 16, 200} {
			if r > w {
				continue
			}
			for _, ms := range shares {
				for _, ls := range shares {
					for _, bs := range []int32{1, 3, 16, 64} {
						got, err := kvmem.WindowSplit(w, r, ms, ls, bs)
						if want := refSplit(w, r, ms, ls, bs); err != nil || got != want {
							t.Fatalf("WindowSplit(%d, %d, %v, %v, %d) = %v %v, want %v", w, r, ms, ls, bs, got, err, want)
						}
						if got.MemoryTokens+got.LiveTokens > w-r {
							t.Fatalf("WindowSplit overfills: %v", got)
						}
					}
				}
			}
		}
	}
	nan := float32(math.NaN())
	for _, a := range []struct {
		w, r   int32
		ms, ls float32
		bs     int32
	}{{0, 0, 0.5, 0.25, 4}, {64, 65, 0.5, 0.25, 4}, {64, -1, 0.5, 0.25, 4}, {64, 0, 1.5, 0.25, 4},
		{64, 0, 0.5, -0.1, 4}, {64, 0, nan, 0.25, 4}, {64, 0, 0.5, 0.25, 0}} {
		if _, err := kvmem.WindowSplit(a.w, a.r, a.ms, a.ls, a.bs); !errors.Is(err, kvmem.ErrInvalidArg) {
			t.Errorf("WindowSplit%v: %v", a, err)
		}
	}
}
