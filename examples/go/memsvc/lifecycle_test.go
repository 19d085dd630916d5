package main

// Restarts and races: SIGTERM saves every agent before the service exits, a
// restarted service lists and serves what its store holds, append's save
// survives kill -9, a DELETE racing other requests never makes them fail
// with 500, and GET /agents/{id} never answers a spurious 404 while other
// agents come and go; the same against a Redis store.

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// storedIDs: the token ids of every sealed block of an agent, in token order
func storedIDs(t *testing.T, call caller, id string) []int {
	t.Helper()
	code, info := call("GET", "/agents/"+id, nil)
	if code != 200 {
		t.Fatalf("%s: %d %v", id, code, info)
	}
	code, out := call("POST", "/agents/"+id+"/retrieve", map[string]any{"query": queryFor("x"), "top_k": info["n_sealed"]})
	if code != 200 {
		t.Fatalf("retrieve %s: %d %v", id, code, out)
	}
	blocks := out["blocks"].([]any)
	sort.Slice(blocks, func(i, j int) bool {
		return blocks[i].(map[string]any)["first_token"].(float64) < blocks[j].(map[string]any)["first_token"].(float64)
	})
	var ids []int
	for _, b := range blocks {
		for _, x := range b.(map[string]any)["token_ids"].([]any) {
			ids = append(ids, int(x.(float64)))
		}
	}
	return ids
}

func ints(first, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = first + i
	}
	return out
}

func restartKeeps(t *testing.T, env map[string]string) {
	p := startProc(t, env)
	for _, a := range []struct {
		id string
		n  int
	}{{"alice", 5}, {"bob", 3}} {
		if code, out := p.call("POST", "/agents/"+a.id+"/append", appendBody(len(a.id), 0, a.n, nil)); code != 200 {
			t.Fatalf("append %s: %d %v", a.id, code, out)
		}
	}
	if code, out := p.call("POST", "/agents/bob/save", nil); code != 200 {
		t.Fatalf("save: %d %v", code, out)
	}
	if code, _ := p.call("POST", "/agents/bob/append", appendBody(3, 3, 2, nil)); code != 200 {
		t.Fatal("changed after its save")
	}
	p.stop(t, syscall.SIGTERM)
	if !strings.Contains(p.stderr(), "stopping: finishing the requests at work and saving the agents") {
		t.Fatalf("log: %s", p.stderr())
	}
	p = startProc(t, env)
	if _, out := p.call("GET", "/agents", nil); !reflect.DeepEqual(out["agents"], []any{"alice", "bob"}) {
		t.Fatalf("the store's agents are listed after a restart: %v", out)
	}
	if got := storedIDs(t, p.call, "alice"); !reflect.DeepEqual(got, ints(0, 5)) {
		t.Fatalf("alice, never saved before SIGTERM: %v", got)
	}
	if got := storedIDs(t, p.call, "bob"); !reflect.DeepEqual(got, ints(0, 5)) {
		t.Fatalf("bob, changed after its save: %v", got)
	}
	if code, _ := p.call("DELETE", "/agents/alice", nil); code != 200 {
		t.Fatal(code)
	}
	p.stop(t, syscall.SIGTERM)
	p = startProc(t, env)
	if _, out := p.call("GET", "/agents", nil); !reflect.DeepEqual(out["agents"], []any{"bob"}) {
		t.Fatalf("a deleted agent is gone from the store: %v", out)
	}
	if code, _ := p.call("GET", "/agents/alice", nil); code != 404 {
		t.Fatal(code)
	}
	p.stop(t, syscall.SIGTERM)
}

func TestRestartSIGTERMSavesEveryAgentAndTheStoreIsListedDirectory(t *testing.T) {
	restartKeeps(t, map[string]string{"KVMEM_STORE_DIR": t.TempDir()})
}

func TestRestartTheSameWithARedisStore(t *testing.T) {
	url, stopRedis := startRedis(t)
	restartKeeps(t, map[string]string{"KVMEM_STORE": url + "/0?pool=svc-test"})
	p := startProc(t, map[string]string{"KVMEM_STORE": url + "?pool=svc-test"})
	if code, out := p.call("GET", "/healthz", nil); code != 200 || out["status"] != "ok" || out["store"] != "redis" {
		t.Fatalf("healthz %d %v", code, out)
	}
	stopRedis()
	if code, out := p.call("GET", "/healthz", nil); code != 503 || out["status"] != "store_unavailable" {
		t.Fatalf("healthz without redis %d %v", code, out)
	}
	// the store is away: a save is refused as unavailable (503), not as a server bug
	code, out := p.call("POST", "/agents/carol/append", appendBody(5, 0, 2, map[string]any{"save": true}))
	if code != 503 || out["error"] != "KVMEM_ERR_IO" {
		t.Fatalf("save without redis: %d %v", code, out)
	}
	p.stop(t, syscall.SIGKILL)
}

func TestKill9KeepsWhatAppendSavedAndExpectTokensRefusesAStaleAppend(t *testing.T) {
	env := map[string]string{"KVMEM_STORE_DIR": t.TempDir()}
	p := startProc(t, env)
	code, out := p.call("POST", "/agents/dave/append", appendBody(4, 0, 4, map[string]any{"save": true}))
	if code != 200 || out["saved"] != true {
		t.Fatalf("append with save: %d %v", code, out)
	}
	if code, _ = p.call("POST", "/agents/dave/append", appendBody(4, 4, 4, nil)); code != 200 {
		t.Fatal(code) // not saved: may be lost
	}
	p.stop(t, syscall.SIGKILL)
	p = startProc(t, env)
	if _, out = p.call("GET", "/agents/dave", nil); out["n_tokens"] != float64(4) {
		t.Fatalf("after kill -9: %v", out)
	}
	code, out = p.call("POST", "/agents/dave/append", appendBody(4, 8, 2, map[string]any{"expect_tokens": 8}))
	wants(t, "a stale append", code, out, 409, `agent 'dave' holds 4 tokens, the request expected 8`)
	code, out = p.call("POST", "/agents/dave/append", appendBody(4, 4, 2, map[string]any{"expect_tokens": 4}))
	wants(t, "the right one", code, out, 200, "")
	if got := storedIDs(t, p.call, "dave"); !reflect.DeepEqual(got, ints(0, 6)) {
		t.Fatalf("dave %v", got)
	}
	p.stop(t, syscall.SIGTERM)
}

func TestRacesDeleteWhileOthersUseTheAgentAnswers200Or404Never500(t *testing.T) {
	_, call := startSvcEnv(t, map[string]string{"KVMEM_STORE_DIR": t.TempDir()}, nil)
	codes := map[int]int{}
	var mu sync.Mutex
	for round := 0; round < 10; round++ {
		id := fmt.Sprintf("r%d", round%3)
		if code, out := call("POST", "/agents/"+id+"/append", appendBody(1, 0, 2048, nil)); code != 200 {
			t.Fatalf("%d %v", code, out)
		}
		var wg sync.WaitGroup
		fire := func(method, path string, body any) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, out := call(method, path, body)
				mu.Lock()
				codes[code]++
				mu.Unlock()
				if code != 200 && code != 404 {
					t.Errorf("round %d: %s %s: %d %v", round, method, path, code, out)
				}
			}()
		}
		others := func() {
			fire("GET", "/agents/"+id, nil)
			fire("POST", "/agents/"+id+"/flush", nil)
			fire("POST", "/agents/"+id+"/retrieve", map[string]any{"query": queryFor("x"), "top_k": 2})
			fire("POST", "/agents/"+id+"/save", nil)
		}
		// a save (written and fsynced) keeps the agent busy; the DELETE and the rest, before it and after, arrive meanwhile
		fire("POST", "/agents/"+id+"/save", nil)
		time.Sleep(time.Millisecond)
		for i := 0; i < 4; i++ {
			others()
		}
		fire("DELETE", "/agents/"+id, nil)
		for i := 0; i < 4; i++ {
			others()
		}
		fire("POST", "/agents/"+id+"/append", appendBody(1, 0, 1, nil))
		wg.Wait()
		call("DELETE", "/agents/"+id, nil)
	}
	if codes[200] == 0 || codes[404] == 0 {
		t.Fatalf("codes %v", codes)
	}
}

func TestGetAnswersNoSpurious404WhileOtherAgentsComeAndGo(t *testing.T) {
	_, call := startSvcEnv(t, nil, nil)
	// many agents: listing them by index takes longer, as it does in a service in use
	for i := 0; i < 50; i++ {
		if code, _ := call("POST", fmt.Sprintf("/agents/bg%d/append", i), appendBody(1, 0, 1, nil)); code != 200 {
			t.Fatal(code)
		}
	}
	if code, _ := call("POST", "/agents/stable/append", appendBody(1, 0, 3, nil)); code != 200 {
		t.Fatal(code)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("c%d-%d", w, i%4)
				call("POST", "/agents/"+id+"/append", appendBody(1, 0, 1, nil))
				call("DELETE", "/agents/"+id, nil)
			}
		}(w)
	}
	for i := 0; i < 400; i++ {
		if code, out := call("GET", "/agents/stable", nil); code != 200 {
			close(stop)
			wg.Wait()
			t.Fatalf("GET %d of a stable agent while others come and go: %d %v", i, code, out)
		}
	}
	close(stop)
	wg.Wait()
}
