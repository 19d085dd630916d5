package kvmem_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

func TestSaveLoadTruncatePrefix(t *testing.T) {
	ctx, pool := smallPool(t, kvmem.F32)
	defer ctx.Close()
	a, _ := pool.AgentOpen("alice")
	k := seq(2*7*2*8, 1)
	if err := a.Append(kvmem.F32Tensor(k), kvmem.F32Tensor(k), &kvmem.AppendParams{Text: "hello world",
		TokenIDs: []int32{0, 1, 2, 3, 4, 5, 6}, TokenTextOffsets: []int32{0, 1, 2, 4, 6, 8, 10}}); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "alice.safetensors")
	if err := a.Save(file); err != nil {
		t.Fatal(err)
	}
	b, _ := pool.AgentOpen("bob")
	if err := b.Load(file); !errors.Is(err, kvmem.ErrMismatch) {
		t.Fatalf("load into another agent: %v", err)
	}
	_ = a.Truncate(3)
	if text, _ := a.Text(); text != "hell" {
		t.Fatalf("after truncate %q", text)
	}
	if err := a.Load(file); err != nil {
		t.Fatal(err)
	}
	if rk, _, _ := a.ReadF32(0, -1); !reflect.DeepEqual(rk, k) {
		t.Fatal("reloaded KV differs")
	}
	if r, err := a.PrefixMatch("hello world, again", kvmem.PrefixDefaultParams()); err != nil || r.Kind != kvmem.PrefixExtend || r.ReuseTokens != 7 {
		t.Fatalf("prefix %+v %v", r, err)
	}
	data, _ := os.ReadFile(file)
	data[len(data)-3] ^= 0xff
	_ = os.WriteFile(file, data, 0o600)
	var e *kvmem.Error
	if err := a.Load(file); !errors.As(err, &e) || (e.Code != kvmem.StatusFormat && e.Code != kvmem.StatusCorrupt) {
		t.Fatalf("corrupt file: %v", err)
	}
	if info, _ := a.GetInfo(); info.NTokens != 7 {
		t.Fatalf("a failed load changed the agent: %+v", info)
	}
}

func TestBatchMergeExtract(t *testing.T) {
	ctx, pool := smallPool(t, kvmem.F32)
	defer ctx.Close()
	a, _ := pool.AgentOpen("a")
	b, _ := pool.AgentOpen("b")
	ka, kb := seq(2*5*2*8, 1), seq(2*3*2*8, 2)
	_ = a.Append(kvmem.F32Tensor(ka), kvmem.F32Tensor(ka), nil)
	_ = b.Append(kvmem.F32Tensor(kb), kvmem.F32Tensor(kb), nil)
	k, _, lengths, err := kvmem.BatchMerge([]*kvmem.Agent{a, b}, 1, 0)
	if err != nil || !reflect.DeepEqual(lengths, []int64{5, 3}) {
		t.Fatalf("merge %v %v", lengths, err)
	}
	out := make([]float32, 3*2*8)
	if err := kvmem.BatchExtract(kvmem.F32Tensor(k, 2, 2, 5, 8), 1, 3, 0, 3, kvmem.F32Tensor(out)); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, kb[3*16:6*16]) {
		t.Fatal("extracted row differs from b's layer 1")
	}
	if _, _, _, err := kvmem.BatchMerge([]*kvmem.Agent{a, b}, 5, 0); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Fatalf("layer 5: %v", err)
	}
}

func TestAgentOpenFileInPlace(t *testing.T) {
	// experimental: a saved agent opened in place gives the KV the loaded
	// file gives, in a pool smaller than the file, and is read-only
	ctx, pool := smallPool(t, kvmem.Q4)
	defer ctx.Close()
	a, _ := pool.AgentOpen("fay")
	const T = 4*64 + 1
	k := seq(2*T*2*8, 3)
	if err := a.Append(kvmem.F32Tensor(k), kvmem.F32Tensor(k), nil); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "fay.safetensors")
	if err := a.Save(file); err != nil {
		t.Fatal(err)
	}
	rk, rv, err := a.ReadF32(0, -1)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	if err := pool.RemoveAgent("fay"); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(file)
	spec := kvmem.ModelSpecDefault()
	spec.NLayers, spec.NQHeads, spec.NKVHeads, spec.HeadDim = 2, 4, 2, 8
	pp := kvmem.PoolDefaultParams()
	pp.BlockSize, pp.StorageDType, pp.CapacityBytes = 4, kvmem.Q4, uint64(st.Size()/2)
	small, err := ctx.PoolCreate(spec, pp)
	if err != nil {
		t.Fatal(err)
	}
	m, err := small.AgentOpenFile(file, 0)
	if err != nil {
		t.Fatal(err)
	}
	if m.ID() != "fay" {
		t.Fatalf("id %q", m.ID())
	}
	mk, mv, err := m.ReadF32(0, -1)
	if err != nil || !reflect.DeepEqual(mk, rk) || !reflect.DeepEqual(mv, rv) {
		t.Fatalf("mapped KV differs from the loaded KV (%v)", err)
	}
	if err := m.Truncate(3); !errors.Is(err, kvmem.ErrUnsupported) {
		t.Fatalf("truncate of a mapped agent: %v", err)
	}
	if _, err := small.AgentOpenFile(file, kvmem.OpenFileNoVerify); !errors.Is(err, kvmem.ErrExists) {
		t.Fatalf("second open: %v", err)
	}
	m.Close()
}
