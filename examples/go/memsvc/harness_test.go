package main

// What the tests share: the service as its own process (this test binary
// re-run as main), token data, the binary layout, a Redis server of a test's own.

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if os.Getenv("MEMSVC_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// proc is the service run as a process: stdout (the listening line, the access
// log) and stderr (its log) collected.
type proc struct {
	cmd      *exec.Cmd
	base     string
	call     caller
	mu       sync.Mutex
	out, log strings.Builder
	exited   chan struct{}
	state    *os.ProcessState
}

func (p *proc) stdout() string { p.mu.Lock(); defer p.mu.Unlock(); return p.out.String() }
func (p *proc) stderr() string { p.mu.Lock(); defer p.mu.Unlock(); return p.log.String() }

func startProc(t *testing.T, env map[string]string) *proc {
	t.Helper()
	get := testEnv(env)
	full := []string{"MEMSVC_RUN_MAIN=1", "HOST=127.0.0.1", "PORT=0"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVMEM_STORE") && !strings.HasPrefix(kv, "KVMEM_MEMORY") && !strings.HasPrefix(kv, "KVMEM_MAX") {
			full = append(full, kv)
		}
	}
	for _, k := range []string{"KVMEM_LAYERS", "KVMEM_Q_HEADS", "KVMEM_KV_HEADS", "KVMEM_HEAD_DIM"} {
		full = append(full, k+"="+get(k))
	}
	for k, v := range env {
		full = append(full, k+"="+v)
	}
	if _, ok := env["KVMEM_ACCESS_LOG"]; !ok {
		full = append(full, "KVMEM_ACCESS_LOG=-")
	}
	p := &proc{cmd: exec.Command(os.Args[0], "-test.run=^$"), exited: make(chan struct{})}
	p.cmd.Env = full
	so, _ := p.cmd.StdoutPipe()
	se, _ := p.cmd.StderrPipe()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	listening := make(chan string, 1)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(so)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		re := regexp.MustCompile(`listening on (http://127\.0\.0\.1:\d+)`)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				listening <- m[1]
			}
		}
	}()
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(se)
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
	}()
	go func() { wg.Wait(); _ = p.cmd.Wait(); p.state = p.cmd.ProcessState; close(p.exited) }()
	select {
	case p.base = <-listening:
	case <-p.exited:
		t.Fatalf("the service exited before listening: %s", p.stderr())
	case <-time.After(30 * time.Second):
		t.Fatal("the service did not start in 30 s")
	}
	p.call = httpCaller(t, p.base)
	t.Cleanup(func() { _ = p.cmd.Process.Kill(); <-p.exited })
	return p
}

// stop sends sig and waits; SIGTERM must end with exit status 0
func (p *proc) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("the service did not stop in 60 s")
	}
	if sig == syscall.SIGTERM && !p.state.Success() {
		t.Fatalf("the service did not stop cleanly on SIGTERM (%v): %s", p.state, p.stderr())
	}
}

// tokensKV: n tokens of K = V = small integers (exact in f16), different per agent and token
func tokensKV(seed, first, n int) []float32 {
	k := make([]float32, tL*n*tHKV*tD)
	for l := 0; l < tL; l++ {
		for t := 0; t < n; t++ {
			for h := 0; h < tHKV; h++ {
				for d := 0; d < tD; d++ {
					k[((l*n+t)*tHKV+h)*tD+d] = float32((seed*131+(first+t)*7+l*3+h*5+d)%61 - 30)
				}
			}
		}
	}
	return k
}

// queryFor: the query that finds the token whose key wordKV gives word
func queryFor(word string) []float32 {
	q := make([]float32, 0, tL*tHQ*tD)
	qk := wordKV([]string{word})
	for l := 0; l < tL; l++ {
		for hq := 0; hq < tHQ; hq++ {
			q = append(q, qk[(l*tHKV+hq/(tHQ/tHKV))*tD:(l*tHKV+hq/(tHQ/tHKV))*tD+tD]...)
		}
	}
	return q
}

func rangeIDs(first, n int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(first + i)
	}
	return ids
}

// tensorBody: the binary layout; tensors are []float32 (F32) or []int32 (I32), in order
func tensorBody(fields map[string]any, names []string, tensors ...any) []byte {
	header := map[string]any{}
	for k, v := range fields {
		header[k] = v
	}
	var data []byte
	for i, name := range names {
		off := len(data)
		switch x := tensors[i].(type) {
		case []float32:
			for _, f := range x {
				data = binary.LittleEndian.AppendUint32(data, math.Float32bits(f))
			}
			header[name] = map[string]any{"dtype": "F32", "shape": []int{len(x)}, "data_offsets": []int{off, len(data)}}
		case []int32:
			for _, v := range x {
				data = binary.LittleEndian.AppendUint32(data, uint32(v))
			}
			header[name] = map[string]any{"dtype": "I32", "shape": []int{len(x)}, "data_offsets": []int{off, len(data)}}
		}
	}
	hb, _ := json.Marshal(header)
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(hb)))
	return append(append(out, hb...), data...)
}

// readTensorBody: a tensor-layout answer's header, its F32 descriptors read as []float32
func readTensorBody(t *testing.T, b []byte) map[string]any {
	t.Helper()
	n := binary.LittleEndian.Uint64(b)
	var h map[string]any
	if err := json.Unmarshal(b[8:8+n], &h); err != nil {
		t.Fatal(err)
	}
	data := b[8+n:]
	var walk func(v any) any
	walk = func(v any) any {
		m, ok := v.(map[string]any)
		if !ok {
			return v
		}
		if m["dtype"] == "F32" {
			o := m["data_offsets"].([]any)
			seg := data[int(o[0].(float64)):int(o[1].(float64))]
			out := make([]float32, len(seg)/4)
			for i := range out {
				out[i] = math.Float32frombits(binary.LittleEndian.Uint32(seg[4*i:]))
			}
			return out
		}
		for k, e := range m {
			m[k] = walk(e)
		}
		return m
	}
	return walk(h).(map[string]any)
}

// startRedis: a redis-server of the test's own on a free loopback port; the
// test is skipped, saying so, when there is none.
func startRedis(t *testing.T) (url string, stop func()) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("skipped: redis-server not found (apt-get install redis-server)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command("redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--dir", t.TempDir(), "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	for i := 0; i < 100; i++ {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	var once sync.Once
	stop = func() { once.Do(func() { _ = cmd.Process.Kill(); <-done }) }
	t.Cleanup(stop)
	return fmt.Sprintf("redis://127.0.0.1:%d", port), stop
}
