package main

// The service as something to deploy: bounded agents, bodies, answers and
// memory (413 / 507 with a message, nothing changed), fair turns that a
// flooding client cannot take from another (429 beyond its queue), typed
// fields over HTTP, the binary tensor body, /healthz and the access log.

import (
	"encoding/json"
	"fmt"
	"net"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

func wants(t *testing.T, what string, code int, out map[string]any, wantCode int, re string) {
	t.Helper()
	if code != wantCode || (re != "" && !regexp.MustCompile(re).MatchString(fmt.Sprint(out["message"]))) {
		t.Fatalf("%s: %d %v, want %d and %q", what, code, out, wantCode, re)
	}
}

func appendBody(seed, first, n int, extra map[string]any) map[string]any {
	b := map[string]any{"k": tokensKV(seed, first, n), "v": tokensKV(seed, first, n), "token_ids": rangeIDs(first, n), "flush": true}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func TestLimitsTokensPerAgentBodyAndAnswerSizesAre413AndChangeNothing(t *testing.T) {
	base, call := startSvcEnv(t, map[string]string{"KVMEM_MAX_AGENT_TOKENS": "40", "KVMEM_MAX_BODY_BYTES": "64K", "KVMEM_MAX_RESPONSE_BYTES": "8K"}, nil)
	code, out := call("POST", "/agents/a/append", appendBody(1, 0, 32, nil))
	wants(t, "32 tokens", code, out, 200, "")
	code, out = call("POST", "/agents/a/append", appendBody(1, 32, 16, nil))
	wants(t, "16 more", code, out, 413, `agent 'a' holds 32 tokens: 16 more would pass the service's limit of 40 tokens per agent`)
	if out["error"] != "too_large" {
		t.Fatalf("error %v", out["error"])
	}
	code, out = call("POST", "/agents/a/append", appendBody(1, 32, 8, nil))
	if code != 200 || out["n_tokens"] != float64(40) {
		t.Fatalf("up to the limit: %d %v", code, out)
	}
	big := make([]float32, 70*1024/2)
	code, out = call("POST", "/agents/a/append", map[string]any{"k": big, "v": big})
	wants(t, "a 70 KiB body", code, out, 413, `request body of \d+ bytes is over the service's limit of 65536`)
	if _, out = call("GET", "/agents/a", nil); out["n_tokens"] != float64(40) {
		t.Fatalf("changed: %v", out)
	}
	q := queryFor("x")
	code, out = call("POST", "/agents/a/retrieve", map[string]any{"query": q, "top_k": 8, "gather": true})
	wants(t, "a gathered JSON answer", code, out, 413,
		`the answer would take up to \d+ bytes, over the service's limit of 8192: ask for fewer blocks \(top_k\), or for the gathered tensors as application/x-kvmem-tensors`)
	code, out = call("POST", "/agents/a/retrieve", map[string]any{"query": q, "top_k": 8})
	if code != 200 || len(out["blocks"].([]any)) != 3 {
		t.Fatalf("the blocks alone: %d %v", code, out)
	}
	code, _, _ = do(t, base, "POST", "/agents/a/retrieve", map[string]any{"query": q, "top_k": 1, "gather": true},
		map[string]string{"accept": ctTensors})
	if code != 200 {
		t.Fatalf("one block as binary fits: %d", code)
	}
}

func TestLimitsTheMemoryBudgetBoundsThePool507WhenFull(t *testing.T) {
	// 16 MiB of the budget left for agents: 32 MiB for the runtime, 3 requests at work of 4 x 1 MiB + 3 x 64 KiB
	budget := runtimeBytes + 3*(4<<20+3*65536) + 16<<20
	base, call := startSvcEnv(t, map[string]string{"KVMEM_MEMORY_BUDGET": fmt.Sprint(budget), "KVMEM_MAX_BODY_BYTES": "1M",
		"KVMEM_MAX_RESPONSE_BYTES": "64K", "KVMEM_WORKERS": "3", "KVMEM_HEAD_DIM": "256", "KVMEM_KV_HEADS": "8", "KVMEM_Q_HEADS": "8"}, nil)
	_, h := call("GET", "/health", nil)
	if h["limits"].(map[string]any)["pool_capacity_bytes"] != float64(16<<20) {
		t.Fatalf("limits %v", h["limits"])
	}
	// 16 tokens of [2][16][8][256] f32 = 256 KiB each for K and V (8 KiB per token held as f16)
	const T = 16
	k := make([]float32, tL*T*8*256)
	for i := range k {
		k[i] = 0.5
	}
	body := tensorBody(map[string]any{"flush": true}, []string{"k", "v"}, k, k)
	var code int
	var out map[string]any
	i := 0
	for ; i < 200; i++ {
		code, out, _ = do(t, base, "POST", fmt.Sprintf("/agents/a%d/append", i%7), body, map[string]string{"content-type": ctTensors})
		if code != 200 {
			break
		}
	}
	wants(t, fmt.Sprintf("after %d appends", i), code, out, 507, `pool capacity 16777216 bytes: .*nothing was appended`)
	if out["error"] != "KVMEM_ERR_CAPACITY" {
		t.Fatalf("error %v", out["error"])
	}
	_, h = call("GET", "/health", nil)
	used := h["pool"].(map[string]any)["used_bytes"].(float64)
	if used > 16<<20 || used < 12<<20 || i < 40 {
		t.Fatalf("%d appends, %v bytes held: the budget bounds the pool and was used", i, used)
	}
	if _, out = call("GET", fmt.Sprintf("/agents/a%d", i%7), nil); out["n_tokens"] != float64(T*(i/7)) {
		t.Fatalf("the refused append added something: %v", out)
	}
}

// stuckRequest: a request whose body never finishes; it holds a slot (or waits for one)
func stuckRequest(t *testing.T, base, client string) net.Conn {
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /agents/%s-stuck/append HTTP/1.1\r\nhost: x\r\nx-client-id: %s\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"k\": [", client, client)
	return c
}

func TestFairTurnsAFloodGets429BeyondItsQueueAndAnotherClientIsServed(t *testing.T) {
	base, call := startSvcEnv(t, map[string]string{"KVMEM_WORKERS": "2", "KVMEM_CLIENT_QUEUE": "2", "KVMEM_CLIENT_HEADER": "x-client-id"}, nil)
	c1, c2 := stuckRequest(t, base, "flood"), stuckRequest(t, base, "flood")
	defer c1.Close()
	defer c2.Close()
	var hz map[string]any
	for i := 0; i < 250; i++ {
		_, hz = call("GET", "/healthz", nil)
		if hz["running"].(float64)+hz["queued"].(float64) == 2 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if hz["running"] != float64(1) || hz["queued"] != float64(1) {
		t.Fatalf("one at work (its slot cap), one waiting: %v", hz)
	}
	one := map[string]any{"k": wordKV([]string{"x"}), "v": wordKV([]string{"x"})}
	code, out, _ := do(t, base, "POST", "/agents/f/append", one, map[string]string{"x-client-id": "flood"})
	wants(t, "the flood's third request", code, out, 429, `client 'flood' has 2 requests in the service already`)
	code, out, _ = do(t, base, "POST", "/agents/l/append", one, map[string]string{"x-client-id": "light"})
	wants(t, "the other client takes the slot the flood may not hold", code, out, 200, "")
}

func TestTypedFieldsOverHTTPAre400NeverConvertedAndChangeNothing(t *testing.T) {
	_, call := startSvcEnv(t, nil, nil)
	code, out := call("POST", "/agents/a/append", map[string]any{"k": wordKV([]string{"a", "b"}), "v": wordKV([]string{"a", "b"}), "token_ids": []int{1, 2}, "flush": true})
	wants(t, "append", code, out, 200, "")
	k1 := wordKV([]string{"c"})
	bools, strs := make([]bool, len(k1)), make([]string, len(k1))
	for i, x := range k1 {
		bools[i], strs[i] = x == 1, fmt.Sprint(x)
	}
	bad := []struct {
		method, path string
		body         any
		re           string
	}{
		// net/http refuses it before the handler (400, plain text)
		{"POST", "/agents/a%ZZ/append", map[string]any{"k": k1, "v": k1}, ``},
		{"POST", "/agents/a/retrieve", map[string]any{"query": queryFor("a"), "top_k": "1"}, `top_k must be an integer in \[0, 65536\], not a string`},
		{"POST", "/agents/a/append", map[string]any{"k": bools, "v": k1}, `k must be an array of numbers \(float32\): element 0 is a boolean`},
		{"POST", "/agents/a/append", map[string]any{"k": strs, "v": k1}, `element 0 is a string`},
		{"POST", "/agents/a/append", map[string]any{"k": k1, "v": k1, "token_ids": []string{"9"}}, `token_ids must be an array of 32-bit integers`},
		{"POST", "/agents/a/append", map[string]any{"k": k1, "v": k1, "flush": "true"}, `flush must be true or false`},
		{"POST", "/agents/a/append", map[string]any{"k": k1, "v": k1, "path": "x"}, `unknown field "path"`},
		{"POST", "/agents/a/append", []any{k1, k1}, `the body must be a JSON object`},
	}
	for _, b := range bad {
		code, out = call(b.method, b.path, b.body)
		wants(t, b.method+" "+b.path, code, out, 400, b.re)
	}
	if _, out = call("GET", "/agents/a", nil); out["n_tokens"] != float64(2) || out["n_blocks"] != float64(1) {
		t.Fatalf("something was appended: %v", out)
	}
	code, _ = call("POST", "/agents/nobody/retrieve", map[string]any{"query": queryFor("a")})
	if code != 404 {
		t.Fatalf("only append creates an agent: %d", code)
	}
	if _, out = call("GET", "/agents", nil); !reflect.DeepEqual(out["agents"], []any{"a"}) {
		t.Fatalf("agents %v", out)
	}
}

func TestBinaryTensorBodyEqualsItsJSONTwin(t *testing.T) {
	base, call := startSvcEnv(t, nil, nil)
	words := []string{"mountains", "trip", "june", "sister", "peanuts", "allergy"}
	k, v := wordKV(words), tokensKV(3, 0, len(words))
	ids := rangeIDs(100, len(words))
	code, out := call("POST", "/agents/json/append", map[string]any{"k": k, "v": v, "token_ids": ids, "text": strings.Join(words, " "), "flush": true})
	wants(t, "JSON append", code, out, 200, "")
	code, out, _ = do(t, base, "POST", "/agents/bin/append", tensorBody(map[string]any{"text": strings.Join(words, " "), "flush": true},
		[]string{"k", "v", "token_ids"}, k, v, ids), map[string]string{"content-type": ctTensors})
	if code != 200 || out["n_tokens"] != float64(len(words)) {
		t.Fatalf("binary append: %d %v", code, out)
	}
	q := queryFor("peanuts")
	_, a := call("POST", "/agents/json/retrieve", map[string]any{"query": q, "top_k": 1, "gather": true, "base_position": 3})
	code, _, raw := do(t, base, "POST", "/agents/bin/retrieve", tensorBody(map[string]any{"top_k": 1, "gather": true, "base_position": 3}, []string{"query"}, q),
		map[string]string{"content-type": ctTensors, "accept": ctTensors})
	if code != 200 {
		t.Fatalf("binary retrieve: %d %s", code, raw)
	}
	b := readTensorBody(t, raw)
	if !reflect.DeepEqual(b["blocks"], a["blocks"]) {
		t.Fatalf("blocks %v, JSON %v", b["blocks"], a["blocks"])
	}
	g, ag := b["gathered"].(map[string]any), a["gathered"].(map[string]any)
	if fmt.Sprint(g["shape"]) != fmt.Sprint([]int{tL, len(words), tHKV, tD}) {
		t.Fatalf("shape %v", g["shape"])
	}
	for _, name := range []string{"k", "v"} {
		var fromJSON []float32
		j, _ := json.Marshal(ag[name])
		_ = json.Unmarshal(j, &fromJSON)
		if !reflect.DeepEqual(g[name], fromJSON) {
			t.Fatalf("gathered %s differs between the layouts", name)
		}
	}
	if !reflect.DeepEqual(g["v"], v) {
		t.Fatal("V is not what was given (small integers are exact in f16)")
	}
	code, out, _ = do(t, base, "POST", "/agents/bin/append", []byte("not a tensor body"), map[string]string{"content-type": ctTensors})
	wants(t, "garbage", code, out, 400, `header length \d+ exceeds the body`)
}

func TestHealthzAndTheAccessLog(t *testing.T) {
	p := startProc(t, nil)
	code, out := p.call("GET", "/healthz", nil)
	if code != 200 || out["status"] != "ok" || out["store"] != "none" {
		t.Fatalf("healthz %d %v", code, out)
	}
	code, _ = p.call("POST", "/agents/a/append", map[string]any{"k": wordKV([]string{"a"}), "v": wordKV([]string{"a"})})
	if code != 200 {
		t.Fatal(code)
	}
	if code, _ = p.call("GET", "/agents/zz", nil); code != 404 {
		t.Fatal(code)
	}
	var lines []map[string]any
	for i := 0; i < 50 && len(lines) < 3; i++ {
		time.Sleep(20 * time.Millisecond)
		lines = nil
		for _, l := range strings.Split(p.stdout(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil {
				lines = append(lines, m)
			}
		}
	}
	find := func(path string) map[string]any {
		for _, l := range lines {
			if l["path"] == path {
				return l
			}
		}
		t.Fatalf("no access log line for %s in %q", path, p.stdout())
		return nil
	}
	ap := find("/agents/a/append")
	ts, _ := ap["time"].(string)
	if _, err := time.Parse(time.RFC3339Nano, ts); err != nil || ap["method"] != "POST" || ap["status"] != float64(200) || ap["client"] != "127.0.0.1" ||
		ap["in"].(float64) <= 0 || ap["out"].(float64) <= 0 || ap["ms"].(float64) < 0 || ap["queue_ms"].(float64) < 0 {
		t.Fatalf("access log line %v", ap)
	}
	if find("/agents/zz")["status"] != float64(404) {
		t.Fatal("the 404 is logged as such")
	}
}
