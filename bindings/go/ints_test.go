package kvmem_test

// Integers are refused, not wrapped, before C: a Go int converted with
// C.int32_t(v) wraps modulo 2^32 (BlockInfo(1<<32) returned block 0), and a
// size allocated before C checks it ends the process (Tokens(0, 1<<40) and
// ReadF32(0, 1<<40): "fatal error: runtime: out of memory"; Tokens(0, 1<<62)
// panicked). Parameters typed int32/int64/uint64 cannot hold a value outside
// their C type: the compiler refuses it. The table covers every exported
// function's parameter of type int, and the sizes the binding allocates from;
// the last test parses the package so a new int parameter without a row fails.

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

type intWorld struct {
	ctx  *kvmem.Context
	pool *kvmem.Pool
	a    *kvmem.Agent
	r    *kvmem.Retrieval
	spec kvmem.ModelSpec
	k    []float32
}

func newIntWorld(t *testing.T) *intWorld {
	t.Helper()
	ctx, pool := smallPool(t, kvmem.F32)
	a, err := pool.AgentOpen("alice")
	if err != nil {
		t.Fatal(err)
	}
	s := pool.Spec
	k := seq(int(s.NLayers)*8*int(s.NKVHeads)*int(s.HeadDim), 1)
	if err := a.Append(kvmem.F32Tensor(k), kvmem.F32Tensor(k), &kvmem.AppendParams{TokenIDs: []int32{0, 1, 2, 3, 4, 5, 6, 7}}); err != nil {
		t.Fatal(err)
	}
	q := seq(int(s.NLayers*s.NQHeads*s.HeadDim), 2)
	rp := kvmem.RetrieveDefaultParams()
	rp.TopK = 1
	r, err := a.Retrieve(kvmem.F32Tensor(q), rp, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &intWorld{ctx, pool, a, r, s, k}
}

// the value in range is accepted, the values around it refused naming the argument
var intCases = []struct {
	name string // as the message names it
	fn   string // "Type.Method(param)" or "Func(param)", as the source declares it
	call func(w *intWorld, v int) error
}{
	{"index", "Pool.AgentID(index)", func(w *intWorld, v int) error { _, err := w.pool.AgentID(v); return err }},
	{"block", "Agent.BlockInfo(block)", func(w *intWorld, v int) error { _, err := w.a.BlockInfo(v); return err }},
	{"block", "Agent.BlockAABB(block)", func(w *intWorld, v int) error { _, _, err := w.a.BlockAABB(v); return err }},
	{"set", "Retrieval.Get(set)", func(w *intWorld, v int) error { _, _, err := w.r.Get(v); return err }},
	{"set", "Retrieval.View(set)", func(w *intWorld, v int) error { _, _, err := w.r.View(v); return err }},
	{"set", "Retrieval.BlockScores(set)", func(w *intWorld, v int) error { _, err := w.r.BlockScores(v); return err }},
	{"set", "Retrieval.NTokens(set)", func(w *intWorld, v int) error { _, err := w.r.NTokens(v); return err }},
	{"nQuery", "MultihopSelect(nQuery)", func(w *intWorld, v int) error {
		_, _, _, err := kvmem.MultihopSelect(kvmem.MultihopDefaultParams(), make([]float32, 4), v, make([]float32, 4), 2, nil)
		return err
	}},
	{"nSegments", "MultihopSelect(nSegments)", func(w *intWorld, v int) error {
		_, _, _, err := kvmem.MultihopSelect(kvmem.MultihopDefaultParams(), make([]float32, 4), 2, make([]float32, 4), v, nil)
		return err
	}},
	{"emb", "ClusterKmeans(n)", func(w *intWorld, v int) error {
		_, _, _, err := kvmem.ClusterKmeans(make([]float32, 8), v, 2, kvmem.KmeansParams{K: 2, MaxIters: 4})
		return err
	}},
	{"emb", "ClusterKmeans(dim)", func(w *intWorld, v int) error {
		_, _, _, err := kvmem.ClusterKmeans(make([]float32, 8), 4, v, kvmem.KmeansParams{K: 2, MaxIters: 4})
		return err
	}},
	{"stride", "RopeApply(stride)", func(w *intWorld, v int) error {
		return kvmem.RopeApply(w.spec, make([]float32, 64), v, []int32{0, 1, 2}, false)
	}},
}

// values of an int that do not fit (or, for sizes, wrap into one that does)
var badInts = []int{1 << 32, 1<<32 + 1, 1 << 31, -1<<31 - 1, 1 << 40, math.MaxInt64, math.MinInt64, 1<<62 + 2}

func TestIntsOutsideTheirCTypeAreRefusedNamingThem(t *testing.T) {
	w := newIntWorld(t)
	defer w.ctx.Close()
	before, _ := w.a.GetInfo()
	for _, c := range intCases {
		for _, v := range badInts {
			err := c.call(w, v)
			if !errors.Is(err, kvmem.ErrInvalidArg) {
				t.Errorf("%s = %d: want ErrInvalidArg, got %v", c.fn, v, err)
				continue
			}
			if !strings.Contains(err.Error(), c.name) {
				t.Errorf("%s = %d: the message does not name %s: %v", c.fn, v, c.name, err)
			}
		}
	}
	// the reported wraps: block 1<<32 was block 0
	_, err := w.a.BlockInfo(1 << 32)
	if err == nil || !strings.Contains(err.Error(), "block = 4294967296 is outside the range of int32") {
		t.Errorf("BlockInfo(1<<32): %v", err)
	}
	if b, err := w.a.BlockInfo(1); err != nil || b.FirstToken != 4 {
		t.Errorf("BlockInfo(1) in range: %+v %v", b, err)
	}
	after, _ := w.a.GetInfo()
	if after != before {
		t.Errorf("a refused call changed the agent: %+v -> %+v", before, after)
	}
}

func TestSizesAreCheckedBeforeAllocating(t *testing.T) {
	w := newIntWorld(t)
	defer w.ctx.Close()
	for _, c := range []struct {
		what string
		call func() error
	}{
		{"Tokens(0, 1<<40)", func() error { _, err := w.a.Tokens(0, 1<<40); return err }},
		{"Tokens(0, 1<<62)", func() error { _, err := w.a.Tokens(0, 1<<62); return err }},
		{"Tokens(1<<62, 1<<62)", func() error { _, err := w.a.Tokens(1<<62, 1<<62); return err }},
		{"Tokens(-1, 2)", func() error { _, err := w.a.Tokens(-1, 2); return err }},
		{"ReadF32(0, 1<<40)", func() error { _, _, err := w.a.ReadF32(0, 1<<40); return err }},
		{"ReadF32(1<<40, -1)", func() error { _, _, err := w.a.ReadF32(1<<40, -1); return err }},
		{"ReadF32(math.MaxInt64, 2)", func() error { _, _, err := w.a.ReadF32(math.MaxInt64, 2); return err }},
	} {
		err := c.call()
		if !errors.Is(err, kvmem.ErrInvalidArg) || !strings.Contains(err.Error(), "outside [0, 8)") {
			t.Errorf("%s: %v", c.what, err)
		}
	}
	if _, err := kvmem.StreamingKeep(1<<40, 4, 4); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Errorf("StreamingKeep(1<<40): %v", err)
	}
	for _, maxLen := range []int64{-1, math.MaxInt64, 1 << 62} {
		if _, _, _, err := kvmem.BatchMerge([]*kvmem.Agent{w.a}, 0, maxLen); !errors.Is(err, kvmem.ErrInvalidArg) {
			t.Errorf("BatchMerge(maxLen %d): %v", maxLen, err)
		}
	}
	if err := kvmem.H2OAccumulate(make([]float32, 4), 1<<62+1, make([]float32, 4)); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Errorf("H2OAccumulate(nRows 1<<62+1, n 4): %v", err) // 4 * (2^62+1) wraps to 4
	}
	// a view whose reach wraps int64 is refused (it used to pass the bounds check)
	k := make([]float32, 16)
	bad := kvmem.Tensor{Data: k, DType: kvmem.F32, Shape: []int64{2, 1, 3, 8}, Strides: []int64{1, 1, 1 << 62, 1}}
	if err := w.a.Append(bad, bad, nil); !errors.Is(err, kvmem.ErrInvalidArg) {
		t.Errorf("a strided view reaching past int64: %v", err)
	}
	if toks, err := w.a.Tokens(2, 3); err != nil || len(toks) != 3 || toks[0] != 2 {
		t.Errorf("Tokens(2, 3) in range: %v %v", toks, err)
	}
}

// Every exported function or method with a parameter of type int (or uint) has a
// row in intCases: parsed from the package's sources.
func TestEveryIntParameterHasARow(t *testing.T) {
	rows := map[string]bool{}
	for _, c := range intCases {
		rows[c.fn] = true
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var missing []string
	found := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || !fd.Name.IsExported() {
				continue
			}
			name := fd.Name.Name
			if fd.Recv != nil {
				rt := fd.Recv.List[0].Type
				if st, ok := rt.(*ast.StarExpr); ok {
					rt = st.X
				}
				name = rt.(*ast.Ident).Name + "." + name
			}
			for _, p := range fd.Type.Params.List {
				id, ok := p.Type.(*ast.Ident)
				if !ok || (id.Name != "int" && id.Name != "uint" && id.Name != "uintptr") {
					continue
				}
				for _, n := range p.Names {
					found++
					if key := name + "(" + n.Name + ")"; !rows[key] {
						missing = append(missing, key)
					}
				}
			}
		}
	}
	if found == 0 {
		t.Fatal("parsed no int parameter: the parse is broken")
	}
	if len(missing) > 0 {
		t.Errorf("int parameters without a row in intCases: %v", missing)
	}
}
