package kvmem_test

// The shared scenario (bindings/README.md): the same calls as
// bindings/fixture/scenario.c, through the binding, must give exactly what the
// C program recorded.

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

const (
	sL, sHQ, sHKV, sD, sBS = 2, 4, 2, 8, 4
)

type turn struct {
	n       int
	rotated bool
	text    string
}

var scenarioAgents = []struct {
	id    string
	salt  int64
	turns []turn
}{
	{"alice", 1, []turn{{5, false, "hello there"}, {6, false, "what is kv memory"}, {3, false, "ok"}}},
	{"bob", 2, []turn{{4, false, "plan a trip"}, {7, true, "to the mountains"}}},
}

func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Join(wd, "..", "..")
}

type fxError struct {
	Status  int    `json:"status"`
	Name    string `json:"name"`
	Message string `json:"message"`
}

type fxBlock struct {
	FirstToken int64     `json:"first_token"`
	NTokens    int32     `json:"n_tokens"`
	Sealed     int       `json:"sealed"`
	AABBMin    []float64 `json:"aabb_min"`
	AABBMax    []float64 `json:"aabb_max"`
}

type fxAgent struct {
	NTokens   int64     `json:"n_tokens"`
	NBlocks   int32     `json:"n_blocks"`
	NSealed   int32     `json:"n_sealed"`
	Bytes     uint64    `json:"bytes"`
	TextBytes uint64    `json:"text_bytes"`
	K         []float64 `json:"k"`
	V         []float64 `json:"v"`
	Tokens    []int32   `json:"tokens"`
	Text      string    `json:"text"`
	Blocks    []fxBlock `json:"blocks"`
}

type fixture struct {
	Pool struct {
		NAgents   int32    `json:"n_agents"`
		UsedBytes uint64   `json:"used_bytes"`
		AgentIDs  []string `json:"agent_ids"`
	} `json:"pool"`
	Agents   map[string]fxAgent `json:"agents"`
	Retrieve struct {
		NSets       int       `json:"n_sets"`
		NTokens     int64     `json:"n_tokens"`
		Blocks      []int32   `json:"blocks"`
		Scores      []float64 `json:"scores"`
		BlockScores []float64 `json:"block_scores"`
		GatherK     []float64 `json:"gather_k"`
		GatherV     []float64 `json:"gather_v"`
		BobPerLayer []struct {
			Blocks []int32   `json:"blocks"`
			Scores []float64 `json:"scores"`
		} `json:"bob_per_layer"`
	} `json:"retrieve"`
	Errors      map[string]fxError `json:"errors"`
	AfterRemove struct {
		NAgents   int32  `json:"n_agents"`
		UsedBytes uint64 `json:"used_bytes"`
	} `json:"after_remove"`
}

func loadFixture(t *testing.T) fixture {
	t.Helper()
	p := os.Getenv("KVMEM_FIXTURE")
	if p == "" {
		p = filepath.Join(repoRoot(), "build", "default", "bindings", "scenario.json")
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("scenario fixture: %v (build the C tree first: make build, or set KVMEM_FIXTURE)", err)
	}
	var fx fixture
	if err := json.Unmarshal(b, &fx); err != nil {
		t.Fatal(err)
	}
	return fx
}

func value(salt, layer, token, head, dim, mul, mod int64) float32 {
	idx := (((salt*8+layer)*1000+token)*16+head)*64 + dim
	return float32(float64((idx*mul+17)%mod)/(float64(mod)/2.0) - 1.0)
}

func kvFor(salt, g0 int64, n int) (k, v []float32) {
	k = make([]float32, sL*n*sHKV*sD)
	v = make([]float32, len(k))
	i := 0
	for l := int64(0); l < sL; l++ {
		for t := int64(0); t < int64(n); t++ {
			for h := int64(0); h < sHKV; h++ {
				for d := int64(0); d < sD; d++ {
					k[i] = value(salt, l, g0+t, h, d, 7919, 2003)
					v[i] = value(salt, l, g0+t, h, d, 104729, 1999)
					i++
				}
			}
		}
	}
	return
}

func f32s(xs []float64) []float32 {
	out := make([]float32, len(xs))
	for i, x := range xs {
		out[i] = float32(x)
	}
	return out
}

func scenarioSpec() kvmem.ModelSpec {
	spec := kvmem.ModelSpecDefault()
	spec.NLayers, spec.NQHeads, spec.NKVHeads, spec.HeadDim, spec.ModelID = sL, sHQ, sHKV, sD, "scenario"
	return spec
}

func appendTurn(t *testing.T, spec kvmem.ModelSpec, a *kvmem.Agent, salt, g0 int64, tu turn) {
	t.Helper()
	k, v := kvFor(salt, g0, tu.n)
	p := &kvmem.AppendParams{Text: tu.text}
	for i := 0; i < tu.n; i++ {
		p.TokenIDs = append(p.TokenIDs, int32(salt*1000+g0)+int32(i))
		p.TokenTextOffsets = append(p.TokenTextOffsets, int32(i*len(tu.text)/tu.n))
	}
	if tu.rotated {
		rows := make([]int32, sL*tu.n*sHKV)
		for i := 0; i < tu.n; i++ {
			p.Positions = append(p.Positions, int32(g0)+int32(i)+100)
		}
		for r := range rows {
			rows[r] = p.Positions[(r/sHKV)%tu.n]
		}
		if err := kvmem.RopeApply(spec, k, sD, rows, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Append(kvmem.F32Tensor(k), kvmem.F32Tensor(v), p); err != nil {
		t.Fatal(err)
	}
}

func TestScenarioMatchesCFixture(t *testing.T) {
	fx := loadFixture(t)
	ctx, err := kvmem.NewContext(kvmem.ContextParams{Backend: "cpu", NThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	spec := scenarioSpec()
	pp := kvmem.PoolDefaultParams()
	pp.BlockSize, pp.StorageDType = sBS, kvmem.F16
	pool, err := ctx.PoolCreate(spec, pp)
	if err != nil {
		t.Fatal(err)
	}
	agents := map[string]*kvmem.Agent{}
	done := map[string]int64{}
	for _, ad := range scenarioAgents {
		if agents[ad.id], err = pool.AgentOpen(ad.id); err != nil {
			t.Fatal(err)
		}
	}
	for ti := 0; ti < 3; ti++ {
		for _, ad := range scenarioAgents {
			if ti < len(ad.turns) {
				appendTurn(t, spec, agents[ad.id], ad.salt, done[ad.id], ad.turns[ti])
				done[ad.id] += int64(ad.turns[ti].n)
			}
		}
	}
	for _, a := range agents {
		if err := a.Flush(); err != nil {
			t.Fatal(err)
		}
	}

	info, err := pool.GetInfo()
	if err != nil || info.NAgents != fx.Pool.NAgents || info.UsedBytes != fx.Pool.UsedBytes {
		t.Fatalf("pool info %+v (%v), want %+v", info, err, fx.Pool)
	}
	if ids, _ := pool.AgentIDs(); !reflect.DeepEqual(ids, fx.Pool.AgentIDs) {
		t.Fatalf("agent ids %v, want %v", ids, fx.Pool.AgentIDs)
	}
	for id, a := range agents {
		want := fx.Agents[id]
		ai, err := a.GetInfo()
		if err != nil {
			t.Fatal(err)
		}
		if got := [5]uint64{uint64(ai.NTokens), uint64(ai.NBlocks), uint64(ai.NSealed), ai.Bytes, ai.TextBytes}; got != [5]uint64{uint64(want.NTokens), uint64(want.NBlocks), uint64(want.NSealed), want.Bytes, want.TextBytes} {
			t.Fatalf("%s info %v", id, got)
		}
		k, v, err := a.ReadF32(0, -1)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(k, f32s(want.K)) || !reflect.DeepEqual(v, f32s(want.V)) {
			t.Fatalf("%s: read-back KV differs from the fixture", id)
		}
		toks, err := a.Tokens(0, ai.NTokens)
		if err != nil || !reflect.DeepEqual(toks, want.Tokens) {
			t.Fatalf("%s tokens %v (%v), want %v", id, toks, err, want.Tokens)
		}
		if text, _ := a.Text(); text != want.Text {
			t.Fatalf("%s text %q, want %q", id, text, want.Text)
		}
		for b, wb := range want.Blocks {
			bi, err := a.BlockInfo(b)
			if err != nil || bi.FirstToken != wb.FirstToken || bi.NTokens != wb.NTokens || bi.Sealed != (wb.Sealed == 1) {
				t.Fatalf("%s block %d: %+v (%v), want %+v", id, b, bi, err, wb)
			}
			if bi.Sealed {
				mn, mx, err := a.BlockAABB(b)
				if err != nil || !reflect.DeepEqual(mn, f32s(wb.AABBMin)) || !reflect.DeepEqual(mx, f32s(wb.AABBMax)) {
					t.Fatalf("%s block %d AABB differs (%v)", id, b, err)
				}
			}
		}
	}

	// retrieval: the same query rows as the fixture program, then a gather at 50
	rq := make([]float32, 0, 2*sL*sHQ*sD)
	for i := int64(0); i < 2; i++ {
		for l := int64(0); l < sL; l++ {
			for h := int64(0); h < sHQ; h++ {
				for d := int64(0); d < sD; d++ {
					rq = append(rq, value(7, l, i, h, d, 7919, 2003))
				}
			}
		}
	}
	wr := fx.Retrieve
	rp := kvmem.RetrieveDefaultParams()
	rp.TopK = 2
	res, err := agents["alice"].Retrieve(kvmem.F32Tensor(rq), rp, nil)
	if err != nil {
		t.Fatal(err)
	}
	blocks, scores, _ := res.Get(0)
	nt, _ := res.NTokens(0)
	bs, _ := res.BlockScores(0)
	vb, _, _ := res.View(0)
	if res.NSets() != wr.NSets || nt != wr.NTokens || !reflect.DeepEqual(blocks, wr.Blocks) || !reflect.DeepEqual(vb, wr.Blocks) ||
		!reflect.DeepEqual(scores, f32s(wr.Scores)) || !reflect.DeepEqual(bs, f32s(wr.BlockScores)) {
		t.Fatalf("retrieve %v %v %v, want %+v", blocks, scores, bs, wr)
	}
	gk, gv, _, err := agents["alice"].GatherF32(blocks, 50)
	if err != nil || !reflect.DeepEqual(gk, f32s(wr.GatherK)) || !reflect.DeepEqual(gv, f32s(wr.GatherV)) {
		t.Fatalf("gather differs from the fixture (%v)", err)
	}
	rp.TopK, rp.Scope = 1, kvmem.ScopePerLayer
	if _, err := agents["bob"].Retrieve(kvmem.F32Tensor(rq), rp, res); err != nil || res.NSets() != sL {
		t.Fatalf("per layer: %v", err)
	}
	for set, ws := range wr.BobPerLayer {
		b2, s2, _ := res.Get(set)
		if !reflect.DeepEqual(b2, ws.Blocks) || !reflect.DeepEqual(s2, f32s(ws.Scores)) {
			t.Fatalf("bob set %d: %v %v", set, b2, s2)
		}
	}
	res.Close()

	// bad input: the C status and message reach the caller, nothing changes
	expect := func(err error, want fxError, sentinel error) {
		t.Helper()
		var e *kvmem.Error
		if !errors.As(err, &e) || int(e.Code) != want.Status || e.Code.String() != want.Name || e.Msg != want.Message {
			t.Fatalf("got %v, want %s: %s", err, want.Name, want.Message)
		}
		if !errors.Is(err, sentinel) {
			t.Fatalf("%v is not %v", err, sentinel)
		}
	}
	alice := agents["alice"]
	before, _ := alice.GetInfo()
	k, v := kvFor(9, 0, 3)
	v[((1*3+2)*sHKV+0)*sD+0] = float32(math.NaN())
	expect(alice.Append(kvmem.F32Tensor(k), kvmem.F32Tensor(v), nil), fx.Errors["append_nan"], kvmem.ErrInvalidArg)
	if after, _ := alice.GetInfo(); after != before {
		t.Fatalf("a failed append changed the agent: %+v -> %+v", before, after)
	}
	_, err = pool.AgentOpen("bad id!")
	expect(err, fx.Errors["open_bad_id"], kvmem.ErrInvalidArg)
	expect(pool.RemoveAgent("bob"), fx.Errors["remove_open"], kvmem.ErrBusy)
	kOut := kvmem.F32Tensor(make([]float32, sL*2*sHKV*sD))
	expect(alice.Read(13, 2, &kOut, nil), fx.Errors["read_past_end"], kvmem.ErrInvalidArg)

	agents["bob"].Close()
	agents["bob"].Close() // idempotent
	if err := pool.RemoveAgent("bob"); err != nil {
		t.Fatal(err)
	}
	info, _ = pool.GetInfo()
	if info.NAgents != fx.AfterRemove.NAgents || info.UsedBytes != fx.AfterRemove.UsedBytes {
		t.Fatalf("after remove %+v, want %+v", info, fx.AfterRemove)
	}
	if _, err := agents["bob"].GetInfo(); !errors.Is(err, kvmem.ErrClosed) {
		t.Fatalf("closed agent: %v", err)
	}
	ctx.Close() // closes the pool, which closes alice
	if _, err := alice.GetInfo(); !errors.Is(err, kvmem.ErrClosed) {
		t.Fatalf("agent after its context closed: %v", err)
	}
	if _, err := pool.GetInfo(); !errors.Is(err, kvmem.ErrClosed) {
		t.Fatalf("pool after its context closed: %v", err)
	}
}
