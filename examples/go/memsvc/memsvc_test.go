package main

// Starts the service on a free loopback port, drives it over HTTP, stops it.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

const tL, tHQ, tHKV, tD = 2, 4, 2, 8

func wordKV(words []string) []float32 {
	k := make([]float32, tL*len(words)*tHKV*tD)
	for t, w := range words {
		h0 := uint32(7)
		for _, c := range w {
			h0 = h0*31 + uint32(c)
		}
		for l := 0; l < tL; l++ {
			for h := 0; h < tHKV; h++ {
				k[((l*len(words)+t)*tHKV+h)*tD+int((h0>>(l+h))%tD)] = 1
			}
		}
	}
	return k
}

func TestMemsvc(t *testing.T) {
	spec := kvmem.ModelSpecDefault()
	spec.NLayers, spec.NQHeads, spec.NKVHeads, spec.HeadDim = tL, tHQ, tHKV, tD
	params := kvmem.PoolDefaultParams()
	params.BlockSize = 16
	svc, err := newService(spec, params)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, svc) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("serve: %v", err)
		}
		if _, err := http.Get(base + "/health"); err == nil {
			t.Fatal("the service still answers after it was stopped")
		}
	}()

	call := func(method, path string, body any) (int, map[string]any) {
		t.Helper()
		var rd *bytes.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		} else {
			rd = bytes.NewReader(nil)
		}
		req, _ := http.NewRequest(method, base+path, rd)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, out
	}

	code, out := call("GET", "/health", nil)
	if code != 200 || out["version"] != kvmem.Version() {
		t.Fatalf("health %d %v", code, out)
	}
	turns := [][]string{{"mountains", "trip", "june", "hike"}, {"sister", "peanuts", "allergy"}, {"budget", "euros", "hotel", "lake", "quiet"}}
	tokens := 0
	for _, words := range turns {
		k := wordKV(words)
		ids := make([]int32, len(words))
		for i := range ids {
			ids[i] = int32(tokens + i)
		}
		code, out = call("POST", "/agents/alice/append", map[string]any{"k": k, "v": k, "token_ids": ids, "text": strings.Join(words, " "), "flush": true})
		tokens += len(words)
		if code != 200 || out["n_tokens"] != float64(tokens) {
			t.Fatalf("append %d %v", code, out)
		}
	}
	if out["n_sealed"] != float64(3) {
		t.Fatalf("sealed %v", out)
	}
	if code, out = call("POST", "/agents/bob/append", map[string]any{"k": wordKV([]string{"x"}), "v": wordKV([]string{"x"})}); code != 200 {
		t.Fatalf("bob %d %v", code, out)
	}
	if _, out = call("GET", "/agents", nil); !reflect.DeepEqual(out["agents"], []any{"alice", "bob"}) {
		t.Fatalf("agents %v", out)
	}

	// bad input: kvmem's message reaches the client, nothing changes
	code, out = call("POST", "/agents/alice/append", map[string]any{"k": []float32{1, 2, 3}, "v": []float32{1, 2, 3}})
	if code != 400 || !strings.Contains(fmt.Sprint(out["message"]), "not a whole tensor") {
		t.Fatalf("short K: %d %v", code, out)
	}
	bad := wordKV([]string{"a"})
	bad[3] = 1e30
	code, out = call("POST", "/agents/alice/append", map[string]any{"k": bad, "v": bad})
	if code != 400 || out["error"] != "KVMEM_ERR_INVALID_ARG" || !strings.Contains(fmt.Sprint(out["message"]), "exceeds the f16 storage range") {
		t.Fatalf("1e30: %d %v", code, out)
	}
	code, out = call("POST", "/agents/bad%20id/append", map[string]any{"k": bad, "v": bad})
	if code != 400 || !strings.Contains(fmt.Sprint(out["message"]), "agent id 'bad id' is invalid") {
		t.Fatalf("bad id: %d %v", code, out)
	}
	if _, out = call("GET", "/agents/alice", nil); out["n_tokens"] != float64(12) {
		t.Fatalf("alice changed: %v", out)
	}
	if code, _ = call("GET", "/agents/nobody", nil); code != 404 {
		t.Fatalf("nobody: %d", code)
	}

	q := make([]float32, 0, tL*tHQ*tD)
	qk := wordKV([]string{"peanuts"})
	for l := 0; l < tL; l++ {
		for hq := 0; hq < tHQ; hq++ {
			q = append(q, qk[(l*tHKV+hq/(tHQ/tHKV))*tD:(l*tHKV+hq/(tHQ/tHKV))*tD+tD]...)
		}
	}
	code, out = call("POST", "/agents/alice/retrieve", map[string]any{"query": q, "top_k": 1, "gather": true, "base_position": 5})
	checkRetrieve(t, code, out)
	file := t.TempDir() + "/alice.kvm"
	for _, op := range []string{"save", "load"} {
		code, out = call("POST", "/agents/alice/"+op, map[string]any{"path": file})
		checkPersist(t, op, code, out)
	}
	if code, _ = call("DELETE", "/agents/bob", nil); code != 200 {
		t.Fatalf("delete %d", code)
	}
	if _, out = call("GET", "/agents", nil); !reflect.DeepEqual(out["agents"], []any{"alice"}) {
		t.Fatalf("agents after delete %v", out)
	}
}
