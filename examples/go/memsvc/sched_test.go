package main

// Fair turns: a free slot goes to the client with the fewest requests at
// work (then the one served least recently), one client never holds every
// slot, and a client's requests beyond its queue are refused at once.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

type schedRecorder struct {
	t       *testing.T
	s       *fairScheduler
	tickets map[string]*ticket
	order   []string
}

func newRecorder(t *testing.T, s *fairScheduler) *schedRecorder {
	return &schedRecorder{t: t, s: s, tickets: map[string]*ticket{}}
}

func (r *schedRecorder) submit(client, label string) {
	r.t.Helper()
	tk, err := r.s.enqueue(client)
	if err != nil {
		r.t.Fatalf("%s: %v", label, err)
	}
	r.tickets[label] = tk
}

// started: the labels that got a slot, in submission order of the checks
func (r *schedRecorder) started(labels ...string) []string {
	var out []string
	for _, l := range labels {
		select {
		case <-r.tickets[l].ready:
			if r.tickets[l].err == nil {
				out = append(out, l)
			}
		default:
		}
	}
	return out
}

func TestSchedFloodDoesNotDelayAnotherClientBeyondTheRequestAtWork(t *testing.T) {
	s := newFairScheduler(1, 1, 100)
	r := newRecorder(t, s)
	var all []string
	for i := 0; i < 20; i++ {
		l := "f" + string(rune('a'+i))
		r.submit("flood", l)
		all = append(all, l)
	}
	r.submit("light", "l0")
	if got := r.started(append(all, "l0")...); !reflect.DeepEqual(got, []string{"fa"}) {
		t.Fatalf("started %v", got)
	}
	r.tickets["fa"].release()
	if got := r.started("fb", "l0"); !reflect.DeepEqual(got, []string{"l0"}) {
		t.Fatalf("the light client goes before the flood's second request: started %v", got)
	}
	r.submit("light", "l1")
	r.tickets["l0"].release()
	if got := r.started("fb", "l1"); !reflect.DeepEqual(got, []string{"fb"}) {
		t.Fatalf("turns alternate while both wait: started %v", got)
	}
	r.tickets["fb"].release()
	if got := r.started("fc", "l1"); !reflect.DeepEqual(got, []string{"l1"}) {
		t.Fatalf("started %v", got)
	}
}

func TestSchedOneClientHoldsAtMostClientRunningSlots(t *testing.T) {
	s := newFairScheduler(3, 2, 100)
	r := newRecorder(t, s)
	for _, l := range []string{"f0", "f1", "f2", "f3"} {
		r.submit("flood", l)
	}
	if got := r.started("f0", "f1", "f2", "f3"); !reflect.DeepEqual(got, []string{"f0", "f1"}) {
		t.Fatalf("the third slot stays free for others: started %v", got)
	}
	if st := s.stats(); st != (schedStats{2, 2, 1}) {
		t.Fatalf("stats %+v", st)
	}
	r.submit("light", "l0")
	if got := r.started("l0"); len(got) != 1 {
		t.Fatal("a newcomer starts at once, without waiting for the flood")
	}
	r.tickets["l0"].release()
	r.tickets["f0"].release()
	if got := r.started("f2", "f3"); !reflect.DeepEqual(got, []string{"f2"}) {
		t.Fatalf("started %v", got)
	}
}

func TestSchedBeyondTheQueueIsRefusedAtOnce(t *testing.T) {
	s := newFairScheduler(1, 1, 3)
	r := newRecorder(t, s)
	for _, l := range []string{"a0", "a1", "a2"} {
		r.submit("a", l)
	}
	if _, err := s.enqueue("a"); !errors.Is(err, errQueueFull) || !strings.Contains(err.Error(), "client 'a' has 3 requests in the service already") {
		t.Fatalf("a 4th request of a: %v", err)
	}
	r.submit("b", "b0")
	r.tickets["a0"].release()
	if got := r.started("a1", "b0"); !reflect.DeepEqual(got, []string{"b0"}) {
		t.Fatalf("started %v", got)
	}
	r.submit("a", "a3")
	if _, err := s.enqueue("a"); !errors.Is(err, errQueueFull) {
		t.Fatalf("a is full again: %v", err)
	}
}

func TestSchedAClientGoneLeavesTheQueueAndDrainRefusesWhatWaits(t *testing.T) {
	s := newFairScheduler(1, 1, 10)
	release, _, err := s.acquire(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error)
	go func() { _, _, err := s.acquire(ctx, "a"); gone <- err }()
	r := newRecorder(t, s)
	r.submit("b", "b0")
	for s.stats().Queued != 2 {
		runtime.Gosched()
	}
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait: %v", err)
	}
	if st := s.stats(); st != (schedStats{1, 1, 2}) {
		t.Fatalf("stats %+v", st)
	}
	drained := s.drain()
	<-r.tickets["b0"].ready
	if !errors.Is(r.tickets["b0"].err, errDraining) {
		t.Fatalf("a waiting request at drain: %v", r.tickets["b0"].err)
	}
	select {
	case <-drained:
		t.Fatal("drain waits for the request at work")
	default:
	}
	if _, err := s.enqueue("c"); !errors.Is(err, errDraining) {
		t.Fatalf("a new request while draining: %v", err)
	}
	release()
	<-drained
	if st := s.stats(); st != (schedStats{0, 0, 0}) {
		t.Fatalf("stats %+v", st)
	}
}

func TestSchedMarksTheRequestsOfAClientWithOthersInTheServiceBackground(t *testing.T) {
	s := newFairScheduler(3, 2, 10)
	r := newRecorder(t, s)
	for _, l := range []string{"f0", "f1", "f2"} {
		r.submit("flood", l)
	}
	r.submit("light", "l0")
	if got := r.started("f0", "f1", "f2", "l0"); !reflect.DeepEqual(got, []string{"f0", "f1", "l0"}) {
		t.Fatalf("started %v", got)
	}
	busy := map[string]bool{}
	for _, l := range []string{"f0", "f1", "l0"} {
		busy[l] = r.tickets[l].busy
	}
	// f0 was alone when it came; f1 came to work beside f0 with f2 waiting
	if !reflect.DeepEqual(busy, map[string]bool{"f0": false, "f1": true, "l0": false}) {
		t.Fatalf("background: %v", busy)
	}
	r.tickets["l0"].release()
	r.tickets["f0"].release()
	r.tickets["f1"].release()
	r.tickets["f2"].release()
	r.submit("flood", "f3") // alone in the service now
	if len(r.started("f3")) != 1 || r.tickets["f3"].busy {
		t.Fatalf("a lone request of the flood's client: started %v, background %v", r.started("f3"), r.tickets["f3"].busy)
	}
}

func TestRunLowPriorityRunsOnAThreadOfItsOwnAtNice10(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("skipped: per-thread priorities are set on Linux only")
	}
	// getpriority(2)'s raw value is 20 - nice
	nice := func() int {
		p, err := syscall.Getpriority(syscall.PRIO_PROCESS, syscall.Gettid())
		if err != nil {
			t.Fatal(err)
		}
		return 20 - p
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := nice()
	var inside int
	out, err := runLowPriority(func() (any, error) { inside = nice(); return "x", errors.New("e") })
	if inside != lowNice || out != "x" || err == nil || err.Error() != "e" {
		t.Fatalf("nice inside %d (want %d), out %v, err %v", inside, lowNice, out, err)
	}
	if after := nice(); after != before {
		t.Fatalf("the caller's thread went from nice %d to %d", before, after)
	}
	defer func() {
		if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "boom") {
			t.Fatalf("a panic in fn reaches the caller: %v", p)
		}
	}()
	_, _ = runLowPriority(func() (any, error) { panic("boom") })
}

// slotWriter records whether the request still held its slot when the answer was written
type slotWriter struct {
	*httptest.ResponseRecorder
	s       *fairScheduler
	running []int
}

func (w *slotWriter) Write(b []byte) (int, error) {
	w.running = append(w.running, w.s.stats().Running)
	return w.ResponseRecorder.Write(b)
}

func TestAnAnswerIsEncodedAndWrittenWhileItsRequestHoldsItsSlot(t *testing.T) {
	cfg, err := loadConfig(testEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := newService(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	for _, path := range []string{"/agents", "/agents/nobody"} {
		w := &slotWriter{ResponseRecorder: httptest.NewRecorder(), s: svc.sched}
		svc.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if len(w.running) == 0 {
			t.Fatalf("%s: nothing written", path)
		}
		// the list is the work's answer, written in its slot; a 404 is an error, written after
		want := map[string]int{"/agents": 1, "/agents/nobody": 0}[path]
		if w.running[0] != want || w.Code != map[string]int{"/agents": 200, "/agents/nobody": 404}[path] {
			t.Fatalf("%s: %d, written with %d requests at work (want %d)", path, w.Code, w.running[0], want)
		}
	}
	if st := svc.sched.stats(); st.Running != 0 {
		t.Fatalf("slots still held: %+v", st)
	}
}
