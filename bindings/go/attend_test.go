package kvmem_test

import (
	"errors"
	"math"
	"testing"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

func TestAttendFullAtTauZero(t *testing.T) {
	const HQ, H, D, T = 4, 2, 8, 40
	q, k, v := seq(HQ*D, 0.1), seq(T*H*D, 0.2), seq(T*H*D, 0.3)
	ctx, _ := kvmem.NewContext(kvmem.ContextParams{Backend: "cpu", NThreads: 1})
	defer ctx.Close()
	out := make([]float32, HQ*D)
	kt := kvmem.F32Tensor(k, T, H, D)
	vt := kvmem.F32Tensor(v, T, H, D)
	p := kvmem.AttendDefaultParams()
	p.TauS, p.TauD, p.TileSize = 0, 0, 8
	st, err := kvmem.Attend(ctx, kvmem.F32Tensor(q, 1, HQ, D), kvmem.AttendSource{K: &kt, V: &vt}, p, kvmem.F32Tensor(out, 1, HQ, D))
	if err != nil || st.TilesVisited != 10 {
		t.Fatalf("%+v %v", st, err)
	}
	for h := 0; h < HQ; h++ {
		kh := h / 2
		logits := make([]float64, T)
		m := math.Inf(-1)
		for j := 0; j < T; j++ {
			for d := 0; d < D; d++ {
				logits[j] += float64(q[h*D+d]) * float64(k[(j*H+kh)*D+d])
			}
			logits[j] /= math.Sqrt(D)
			m = math.Max(m, logits[j])
		}
		z := 0.0
		for j := range logits {
			logits[j] = math.Exp(logits[j] - m)
			z += logits[j]
		}
		for d := 0; d < D; d++ {
			want := 0.0
			for j := 0; j < T; j++ {
				want += logits[j] / z * float64(v[(j*H+kh)*D+d])
			}
			if math.Abs(float64(out[h*D+d])-want) > 1e-4 {
				t.Fatalf("head %d dim %d: %v want %v", h, d, out[h*D+d], want)
			}
		}
	}
	p.TileSize = 5000
	if _, err := kvmem.Attend(ctx, kvmem.F32Tensor(q, 1, HQ, D), kvmem.AttendSource{K: &kt, V: &vt}, p, kvmem.F32Tensor(out, 1, HQ, D)); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Fatalf("tile size 5000: %v", err)
	}
	ctx2, pool := smallPool(t, kvmem.F32)
	defer ctx2.Close()
	a, _ := pool.AgentOpen("att")
	kk := seq(2*12*2*8, 4)
	_ = a.Append(kvmem.F32Tensor(kk), kvmem.F32Tensor(kk), nil)
	p = kvmem.AttendDefaultParams()
	p.TauS, p.TauD = 0, 0
	st, err = kvmem.Attend(ctx2, kvmem.F32Tensor(q), kvmem.AttendSource{Agent: a, Layer: 1}, p, kvmem.F32Tensor(out, 1, HQ, D))
	if err != nil || st.TilesTotal != 2*3 {
		t.Fatalf("agent source %+v %v", st, err)
	}
}
