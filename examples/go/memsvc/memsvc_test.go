package main

// Starts the service on a free loopback port, drives it over HTTP, stops it.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
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

// caller: one request; body nil = none, []byte = as it is, anything else JSON
type caller func(method, path string, body any) (int, map[string]any)

// testEnv: the settings every test service gets (the tests' model dims), then env
func testEnv(env map[string]string) func(string) string {
	base := map[string]string{"KVMEM_LAYERS": fmt.Sprint(tL), "KVMEM_Q_HEADS": fmt.Sprint(tHQ), "KVMEM_KV_HEADS": fmt.Sprint(tHKV),
		"KVMEM_HEAD_DIM": fmt.Sprint(tD), "KVMEM_ACCESS_LOG": "off"}
	for k, v := range env {
		base[k] = v
	}
	return func(k string) string { return base[k] }
}

// startSvc runs the service in this process on a free loopback port with
// this store directory ("" = none) until the test ends; its log goes to logBuf.
func startSvc(t *testing.T, storeDir string, logBuf *bytes.Buffer) caller {
	t.Helper()
	_, call := startSvcEnv(t, map[string]string{"KVMEM_STORE_DIR": storeDir}, logBuf)
	return call
}

func startSvcEnv(t *testing.T, env map[string]string, logBuf *bytes.Buffer) (string, caller) {
	t.Helper()
	cfg, err := loadConfig(testEnv(env))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := newService(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if logBuf != nil {
		svc.log = log.New(logBuf, "memsvc: ", 0)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, svc) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("serve: %v", err)
		}
		if _, err := http.Get(base + "/health"); err == nil {
			t.Fatal("the service still answers after it was stopped")
		}
	})
	return base, httpCaller(t, base)
}

func httpCaller(t *testing.T, base string) caller {
	return func(method, path string, body any) (int, map[string]any) {
		t.Helper()
		code, out, _ := do(t, base, method, path, body, nil)
		return code, out
	}
}

// do: one request with headers; a JSON answer decoded, any other returned raw
func do(t *testing.T, base, method, path string, body any, headers map[string]string) (int, map[string]any, []byte) {
	t.Helper()
	var rd *bytes.Reader
	switch b := body.(type) {
	case nil:
		rd = bytes.NewReader(nil)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(body)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil { // a path Go would not parse (a bad escape) goes as it is
		req, _ = http.NewRequest(method, base+"/", rd)
		req.URL.Opaque = path
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(resp.Header.Get("content-type"), "application/json") {
		return resp.StatusCode, nil, raw
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %v: %s", method, path, err, raw)
	}
	return resp.StatusCode, out, raw
}

func TestMemsvc(t *testing.T) {
	store := t.TempDir()
	call := startSvc(t, store, nil)
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
	// save and load go to the store directory, one file per agent
	for _, op := range []string{"save", "load"} {
		code, out = call("POST", "/agents/alice/"+op, nil)
		checkPersist(t, op, code, out)
	}
	if ents, _ := os.ReadDir(store); len(ents) != 1 || ents[0].Name() != "alice.safetensors" || out["n_tokens"] != float64(12) {
		t.Fatalf("the store holds %v after save/load (%v)", ents, out)
	}
	if code, _ = call("DELETE", "/agents/bob", nil); code != 200 {
		t.Fatalf("delete %d", code)
	}
	if _, out = call("GET", "/agents", nil); !reflect.DeepEqual(out["agents"], []any{"alice"}) {
		t.Fatalf("agents after delete %v", out)
	}
}

// A client names an agent, never a file: requests that tried to write or
// read files anywhere (an absolute path, ../, /etc/passwd, an id that walks
// out of the store, a NUL) are refused, write nothing, and no message
// repeats a file's bytes or the store's path.
func TestMemsvcSaveLoadCannotReachFilesOutsideTheStore(t *testing.T) {
	store, outside := t.TempDir(), t.TempDir()
	var logBuf bytes.Buffer
	call := startSvc(t, store, &logBuf)
	if code, out := call("POST", "/agents/alice/append", map[string]any{"k": wordKV([]string{"a", "b"}), "v": wordKV([]string{"a", "b"}), "flush": true}); code != 200 {
		t.Fatalf("append %d %v", code, out)
	}
	// the first 8 bytes of /etc/passwd as the loader's old "header length", or
	// the server's store path (the client's own input may be quoted back)
	leaks := func(out map[string]any) bool {
		b, _ := json.Marshal(out)
		m := string(b)
		return strings.Contains(m, "3475222254926655346") || strings.Contains(m, "root:x:0") || strings.Contains(m, store)
	}
	attacks := []struct {
		route string
		body  any
		msg   string
	}{
		{"/agents/alice/save", map[string]any{"path": outside + "/evil.kvm"}, `takes no body fields (got "path")`},
		{"/agents/alice/save", map[string]any{"path": "../../../../tmp/evil.kvm"}, "takes no body fields"},
		{"/agents/alice/save", map[string]any{"path": nil}, "takes no body fields"},
		{"/agents/alice/save", map[string]any{"file": outside + "/evil.kvm"}, `takes no body fields (got "file")`},
		{"/agents/alice/save", []string{outside + "/evil.kvm"}, "takes no body fields"},
		{"/agents/alice/save", "evil.kvm", "takes no body fields"},
		{"/agents/alice/load", map[string]any{"path": "/etc/passwd"}, "takes no body fields"},
		{"/agents/alice/load", map[string]any{"path": "../alice.safetensors"}, "takes no body fields"},
		{"/agents/" + strings.ReplaceAll(outside+"/evil", "/", "%2F") + "/save", nil, "is invalid"},
		{"/agents/..%2F..%2F..%2Ftmp%2Fevil/save", nil, "is invalid"},
		{"/agents/..%2F..%2F..%2F..%2Fetc%2Fpasswd/load", nil, "is invalid"},
		{"/agents/.hidden/load", nil, "is invalid"},
		{"/agents/alice%00-evil/save", nil, "contains a NUL"},
		{"/agents/alice%00.safetensors/load", nil, "contains a NUL"},
	}
	for _, a := range attacks {
		code, out := call("POST", a.route, a.body)
		if code != 400 || !strings.Contains(fmt.Sprint(out["message"]), a.msg) || leaks(out) {
			t.Fatalf("%s %v: %d %v (want 400 and %q, no file bytes or store path)", a.route, a.body, code, out, a.msg)
		}
	}
	for _, dir := range []string{outside, store} {
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Fatalf("a refused request wrote %v in %s", ents, dir)
		}
	}
	if _, out := call("GET", "/agents", nil); !reflect.DeepEqual(out["agents"], []any{"alice"}) {
		t.Fatalf("a refused request created an agent: %v", out)
	}
	// the honest requests still work, and a damaged store file is reported
	// without its bytes or the store's path (the details go to the log)
	if code, out := call("POST", "/agents/alice/save", nil); code != 200 {
		t.Fatalf("save %d %v", code, out)
	}
	if err := os.WriteFile(store+"/alice.safetensors", []byte("root:x:0:0:root:/root:/bin/bash\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := call("POST", "/agents/alice/load", map[string]any{})
	if code != 400 || out["error"] != "KVMEM_ERR_FORMAT" || leaks(out) ||
		!strings.Contains(fmt.Sprint(out["message"]), "agent 'alice': the stored file is not a valid kvmem agent file") {
		t.Fatalf("damaged store file: %d %v", code, out)
	}
	if !strings.Contains(logBuf.String(), "memsvc: load 'alice': ") {
		t.Fatalf("the details are not in the log: %q", logBuf.String())
	}
	if _, out = call("GET", "/agents/alice", nil); out["n_tokens"] != float64(2) {
		t.Fatalf("a failed load changed the agent: %v", out)
	}
}

func TestMemsvcWithoutAStore(t *testing.T) {
	call := startSvc(t, "", nil)
	for _, op := range []string{"save", "load"} {
		if code, out := call("POST", "/agents/alice/"+op, nil); code != 501 || out["error"] != "no_store" {
			t.Fatalf("%s without a store: %d %v", op, code, out)
		}
	}
	cfg, err := loadConfig(testEnv(map[string]string{"KVMEM_STORE_DIR": "/nonexistent/kvmem-store"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newService(cfg); err == nil ||
		!strings.Contains(err.Error(), "store directory /nonexistent/kvmem-store does not exist") {
		t.Fatalf("a missing store directory: %v", err)
	}
}
