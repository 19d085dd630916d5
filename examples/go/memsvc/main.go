// Command memsvc is a net/http memory service over kvmem, with the same API
// and settings as examples/node/memory-service:
//
//	GET    /healthz                  200 {status: "ok", pid, started, ...}; 503 while shutting down or when the store does not answer
//	GET    /health                   {version, spec, limits, pool}
//	GET    /agents                   {agents: [id...]}: the pool's agents and the store's
//	GET    /agents/{id}              agent info
//	POST   /agents/{id}/append       {k, v, token_ids?, text?, token_text_offsets?, positions?, flush?, save?, expect_tokens?}
//	POST   /agents/{id}/flush        agent info
//	POST   /agents/{id}/retrieve     {query, top_k?, gather?, base_position?}
//	POST   /agents/{id}/save, /load  no body: the agent's entry in the store (501 without one)
//	DELETE /agents/{id}              remove the agent, from the store too
//
// Only append creates an agent; the others answer 404 for one the service
// does not hold. Bodies are JSON or the binary tensor layout (codec.go), every
// field checked for its type (400, never converted). append's save: true
// answers only once the agent is in the store (saved: true); expect_tokens: N
// refuses (409) unless the agent holds N tokens. Errors come back as
// {error, status?, message} with kvmem's own message.
//
// Persistence goes through the pool's store, chosen when the service starts
// (KVMEM_STORE): a directory, one AGENT_ID.safetensors file per agent, or a
// redis:// URL. A client never names a file: save and load take no body, the
// id is checked by kvmem ([A-Za-z0-9._-], no leading '.'), messages name a
// directory store <store>, and what is wrong inside a damaged file goes to
// the log only. SIGTERM or SIGINT stops taking requests, finishes those at
// work and writes every changed agent to the store before exiting.
//
// Limits (docs/reliability.md): a memory budget (KVMEM_MEMORY_BUDGET; the pool
// gets what the runtime and the requests at work leave, 507 once it is full
// and no agent can be moved to the store; the Go heap is held to its part
// with debug.SetMemoryLimit), bodies (KVMEM_MAX_BODY_BYTES, 413), answers
// (KVMEM_MAX_RESPONSE_BYTES, 413, checked before the work), tokens per agent
// (KVMEM_MAX_AGENT_TOKENS, 413), and fair turns (sched.go): KVMEM_WORKERS
// requests at work, one client at most KVMEM_CLIENT_RUNNING of them and
// KVMEM_CLIENT_QUEUE in the service (429 beyond). A client is its address,
// or the KVMEM_CLIENT_HEADER header a proxy in front sets. One JSON line per
// request goes to the access log (KVMEM_ACCESS_LOG: - for stdout, off, or a
// file); the service's own messages to stderr.
//
// Run (the binding's link recipe: pkg-config finds kvmem, installed or a build tree,
// and its libdir goes into the rpath; or -tags kvmem_static):
//
//	export PKG_CONFIG_PATH=$PWD/build/default   # a checkout after make build; an install: <prefix>/lib/pkgconfig
//	cd examples/go/memsvc && CGO_LDFLAGS="-Wl,-rpath,$(pkg-config --variable=libdir kvmem)" \
//	  KVMEM_STORE=/var/lib/kvmem go run .
//	(HOST, PORT; PORT=0 picks a free port; without a store, save/load answer 501)
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

// agentEntry: the agent as requests use it. mu: one kvmem call per agent at a
// time; refs (under service.mu): the requests holding or waiting for mu.
type agentEntry struct {
	mu    sync.Mutex
	refs  int
	agent *kvmem.Agent
	dead  bool // removed by a DELETE: requests queued behind it start over
}

type service struct {
	cfg       *config
	ctx       *kvmem.Context
	pool      *kvmem.Pool
	store     storeLister
	storeDir  string // a directory store, absolute ("" otherwise): hidden in messages
	hasStore  bool
	log       *log.Logger // the service's log (stderr)
	accessMu  sync.Mutex
	access    io.Writer // nil: no access log
	sched     *fairScheduler
	draining  atomic.Bool
	mu        sync.Mutex
	entries   map[string]*agentEntry
	known     map[string]bool // the agents: those in the store at startup and those created since
	started   time.Time
	closeOnce sync.Once
}

// newService opens the pool on cfg.Store and lists the agents it holds.
func newService(cfg *config) (*service, error) {
	store, spec, err := storeOf(cfg.Store)
	if err != nil {
		return nil, err
	}
	ctx, err := kvmem.NewContext(kvmem.ContextParams{Backend: "cpu"})
	if err != nil {
		return nil, err
	}
	params := kvmem.PoolDefaultParams()
	params.BlockSize, params.CapacityBytes, params.StoreDir = cfg.BlockSize, uint64(cfg.PoolCapacity), spec
	params.MaxTokensPerAgent = int32(cfg.MaxAgentTokens)
	pool, err := ctx.PoolCreate(cfg.Spec, params)
	if err != nil {
		ctx.Close()
		return nil, err
	}
	ids, err := store.list()
	if err != nil {
		pool.Close()
		ctx.Close()
		return nil, fmt.Errorf("cannot list the store's agents: %v", err)
	}
	s := &service{cfg: cfg, ctx: ctx, pool: pool, store: store, hasStore: spec != "", log: log.New(os.Stderr, "memsvc: ", 0), started: time.Now(),
		sched: newFairScheduler(cfg.Workers, cfg.ClientRunning, cfg.ClientQueue), entries: map[string]*agentEntry{}, known: map[string]bool{}}
	if _, ok := store.(dirStore); ok && spec != filepath.VolumeName(spec)+string(filepath.Separator) {
		s.storeDir = spec
	}
	for _, id := range ids {
		s.known[id] = true
	}
	switch cfg.AccessLog {
	case "off":
	case "-":
		s.access = os.Stdout
	default:
		f, err := os.OpenFile(cfg.AccessLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.access = f
	}
	return s, nil
}

// closeHandles closes the agents' handles (their memory stays in the pool).
func (s *service) closeHandles() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.entries {
		e.mu.Lock()
		if e.agent != nil {
			e.agent.Close()
			e.agent = nil
		}
		e.mu.Unlock()
	}
}

// Close frees the pool without saving (shutdown saves). Idempotent.
func (s *service) Close() {
	s.closeOnce.Do(func() {
		s.closeHandles()
		s.pool.Close()
		s.ctx.Close()
		if f, ok := s.access.(*os.File); ok && f != os.Stdout {
			f.Close()
		}
	})
}

// shutdown: after the requests at work are done (drained), every agent that
// changed since its last save goes to the store, retried until cfg.Shutdown
// passes; then the pool is freed. nil when everything was saved.
func (s *service) shutdown() error {
	var err error
	if s.hasStore {
		s.closeHandles()
		until := time.Now().Add(s.cfg.Shutdown)
		for wait := 100 * time.Millisecond; ; wait = minDuration(2*wait, 2*time.Second) {
			if err = s.pool.Sync(); err == nil {
				break
			}
			s.log.Printf("saving the agents to the store: %s", s.hide(errMessage(err)))
			if time.Now().Add(wait).After(until) {
				s.log.Printf("giving up: agents changed since their last save are lost")
				break
			}
			time.Sleep(wait)
		}
	}
	s.Close()
	return err
}

func minDuration(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

var errRetry = errors.New("retry")

// withEntry runs fn(e) after the earlier requests on the agent: one kvmem
// call per agent at a time. The handle stays open while requests for the
// agent are in, and is closed after the last, so the pool may move the
// agent to the store when it needs room.
func (s *service) withEntry(id string, fn func(e *agentEntry) (any, error)) (any, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	for {
		s.mu.Lock()
		e := s.entries[id]
		if e == nil {
			e = &agentEntry{}
			s.entries[id] = e
		}
		e.refs++
		s.mu.Unlock()
		out, err := s.runLocked(id, e, fn)
		if err != errRetry {
			return out, err
		}
	}
}

func (s *service) runLocked(id string, e *agentEntry, fn func(e *agentEntry) (any, error)) (any, error) {
	e.mu.Lock()
	defer func() {
		s.mu.Lock()
		e.refs--
		last := e.refs == 0
		s.mu.Unlock()
		if last && e.agent != nil {
			e.agent.Close()
			e.agent = nil
		}
		e.mu.Unlock()
		s.mu.Lock()
		if e.refs == 0 && s.entries[id] == e {
			delete(s.entries, id)
		}
		s.mu.Unlock()
	}()
	if e.dead {
		return nil, errRetry
	}
	return fn(e)
}

func notFound(id string) error { return &httpError{404, "not_found", "no agent '" + id + "'"} }

// open: the entry's agent, opened on first use; only a creating request
// opens an agent the service does not know. created: it did not exist.
func (s *service) open(e *agentEntry, id string, create bool) (a *kvmem.Agent, created bool, err error) {
	if e.agent != nil {
		return e.agent, false, nil
	}
	s.mu.Lock()
	known := s.known[id]
	s.mu.Unlock()
	if !known && !create {
		return nil, false, notFound(id)
	}
	if e.agent, err = s.pool.AgentOpen(id); err != nil {
		return nil, false, err
	}
	s.mu.Lock()
	s.known[id] = true
	s.mu.Unlock()
	return e.agent, !known, nil
}

// undoCreate removes an agent a failed first request created.
func (s *service) undoCreate(e *agentEntry, id string) {
	if i, err := e.agent.GetInfo(); err != nil || i.NTokens != 0 {
		return
	}
	e.agent.Close()
	e.agent = nil
	if err := s.pool.RemoveAgent(id); err != nil {
		s.log.Printf("undoing the creation of '%s': %s", id, errMessage(err))
	}
	s.mu.Lock()
	delete(s.known, id)
	s.mu.Unlock()
}

var idRe = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$`)

func checkID(id string) error {
	if strings.IndexByte(id, 0) >= 0 {
		return badRequest("agent id %q contains a NUL byte", id)
	}
	if !idRe.MatchString(id) || !kvmem.AgentIDValid(id) {
		short := id
		if len(short) > 40 {
			short = short[:40] + "..."
		}
		return badRequest("agent id '%s' is invalid: use 1-128 of [A-Za-z0-9._-], not starting with '.'", short)
	}
	return nil
}

type httpError struct {
	code    int
	kind    string
	message string
}

func (e *httpError) Error() string { return e.message }

func badRequest(format string, a ...any) error {
	return &httpError{http.StatusBadRequest, "bad_request", fmt.Sprintf(format, a...)}
}

var httpForStatus = map[kvmem.Status]int{
	kvmem.StatusInvalidArg: 400, kvmem.StatusMismatch: 400, kvmem.StatusFormat: 400, kvmem.StatusNotFound: 404,
	kvmem.StatusExists: 409, kvmem.StatusBusy: 409, kvmem.StatusConflict: 409, kvmem.StatusCapacity: 507,
	kvmem.StatusNoMem: 507, kvmem.StatusUnsupported: 501, kvmem.StatusIO: 503,
}

func errMessage(err error) string {
	var ke *kvmem.Error
	if errors.As(err, &ke) {
		return ke.Msg
	}
	return err.Error()
}

func info(a *kvmem.Agent) (map[string]any, error) {
	i, err := a.GetInfo()
	if err != nil {
		return nil, err
	}
	return map[string]any{"id": a.ID(), "n_tokens": i.NTokens, "n_blocks": i.NBlocks, "n_sealed": i.NSealed,
		"bytes": i.Bytes, "text_bytes": i.TextBytes}, nil
}

func (s *service) append(id string, f fields) (any, error) {
	if f.flag("save") {
		if err := s.persistable("save"); err != nil {
			return nil, err
		}
	}
	sp := s.pool.Spec
	per := int64(sp.NLayers) * int64(sp.NKVHeads) * int64(sp.HeadDim)
	k := f.f32s("k")
	return s.withEntry(id, func(e *agentEntry) (any, error) {
		a, created, err := s.open(e, id, true)
		if err != nil {
			return nil, err
		}
		err = func() error {
			i, err := a.GetInfo()
			if err != nil {
				return err
			}
			if want := f.integer("expect_tokens", -1); want >= 0 && i.NTokens != want {
				return &httpError{409, "conflict", fmt.Sprintf("agent '%s' holds %d tokens, the request expected %d", id, i.NTokens, want)}
			}
			if T := int64(len(k)) / per; int64(len(k))%per == 0 && i.NTokens+T > s.cfg.MaxAgentTokens {
				return &httpError{413, "too_large", fmt.Sprintf("agent '%s' holds %d tokens: %d more would pass the service's limit of %d tokens per agent",
					id, i.NTokens, T, s.cfg.MaxAgentTokens)}
			}
			p := &kvmem.AppendParams{TokenIDs: f.i32s("token_ids"), Text: f.str("text"), TokenTextOffsets: f.i32s("token_text_offsets"),
				Positions: f.i32s("positions")}
			return a.Append(kvmem.F32Tensor(k), kvmem.F32Tensor(f.f32s("v")), p)
		}()
		if err != nil {
			if created {
				s.undoCreate(e, id)
			}
			return nil, err
		}
		if f.flag("flush") {
			if err := a.Flush(); err != nil {
				return nil, err
			}
		}
		if f.flag("save") {
			if err := a.Save(""); err != nil {
				var ke *kvmem.Error
				if errors.As(err, &ke) {
					return nil, &kvmem.Error{Code: ke.Code, Msg: "appended, but not saved: " + ke.Msg}
				}
				return nil, err
			}
		}
		out, err := info(a)
		if err == nil && f.flag("save") {
			out["saved"] = true
		}
		return out, err
	})
}

func (s *service) route(name, id string, f fields, binary bool) (any, error) {
	switch name {
	case "list":
		s.mu.Lock()
		ids := make([]string, 0, len(s.known))
		for id := range s.known {
			ids = append(ids, id)
		}
		s.mu.Unlock()
		sort.Strings(ids)
		return map[string]any{"agents": ids}, nil
	case "info":
		return s.withEntry(id, func(e *agentEntry) (any, error) {
			a, _, err := s.open(e, id, false)
			if err != nil {
				return nil, err
			}
			return info(a)
		})
	case "remove":
		return s.withEntry(id, func(e *agentEntry) (any, error) {
			s.mu.Lock()
			known := s.known[id]
			s.mu.Unlock()
			if e.agent == nil && !known {
				return nil, notFound(id)
			}
			if e.agent != nil {
				e.agent.Close()
				e.agent = nil
			}
			if err := s.pool.RemoveAgent(id); err != nil {
				return nil, err
			}
			s.mu.Lock()
			delete(s.known, id)
			e.dead = true
			if s.entries[id] == e {
				delete(s.entries, id)
			}
			s.mu.Unlock()
			return map[string]any{"removed": id}, nil
		})
	case "append":
		return s.append(id, f)
	case "flush":
		return s.withEntry(id, func(e *agentEntry) (any, error) {
			a, _, err := s.open(e, id, false)
			if err != nil {
				return nil, err
			}
			if err := a.Flush(); err != nil {
				return nil, err
			}
			return info(a)
		})
	case "retrieve":
		return s.retrieve(id, f, binary)
	case "save", "load":
		return s.persist(name, id)
	}
	return nil, fmt.Errorf("no route %s", name)
}

// routeOf: the route and agent id of a request (400 for a bad escape, 404 for no route)
func routeOf(method, escapedPath string) (string, string, error) {
	// split before unescaping, so an id holding %2F is one (invalid) id
	var parts []string
	for _, p := range strings.Split(strings.Trim(escapedPath, "/"), "/") {
		if p == "" {
			continue
		}
		u, err := url.PathUnescape(p)
		if err != nil {
			return "", "", badRequest("bad percent escape in %q", escapedPath)
		}
		parts = append(parts, u)
	}
	none := &httpError{404, "not_found", "no route " + method + " " + escapedPath}
	if len(parts) == 1 && method == http.MethodGet && (parts[0] == "healthz" || parts[0] == "health") {
		return parts[0], "", nil
	}
	if len(parts) == 0 || parts[0] != "agents" || len(parts) > 3 {
		return "", "", none
	}
	switch {
	case len(parts) == 1 && method == http.MethodGet:
		return "list", "", nil
	case len(parts) == 2 && method == http.MethodGet:
		return "info", parts[1], nil
	case len(parts) == 2 && method == http.MethodDelete:
		return "remove", parts[1], nil
	case len(parts) == 3 && method == http.MethodPost:
		switch parts[2] {
		case "append", "flush", "retrieve", "save", "load":
			return parts[2], parts[1], nil
		}
	}
	return "", "", none
}

func (s *service) errorAnswer(err error) (int, map[string]any) {
	var he *httpError
	var ke *kvmem.Error
	var qf *queueFullError
	var mb *http.MaxBytesError
	switch {
	case errors.As(err, &he):
		return he.code, map[string]any{"error": he.kind, "message": he.message}
	case errors.As(err, &qf):
		return 429, map[string]any{"error": "too_many_requests", "message": qf.msg}
	case errors.Is(err, errDraining):
		return 503, map[string]any{"error": "shutting_down", "message": err.Error()}
	case errors.As(err, &mb):
		return 413, map[string]any{"error": "too_large", "message": fmt.Sprintf("request body over the service's limit of %d bytes", mb.Limit)}
	case errors.As(err, &ke):
		code := httpForStatus[ke.Code]
		if code == 0 {
			code = 500
		}
		return code, map[string]any{"error": ke.Code.String(), "status": int(ke.Code), "message": ke.Msg}
	}
	s.log.Printf("internal error: %v", err)
	return 500, map[string]any{"error": "internal", "message": err.Error()}
}

// kvmem's messages may name the store's files: clients see <store>, not the server's directories
func (s *service) hide(msg string) string {
	if s.storeDir == "" {
		return msg
	}
	return strings.ReplaceAll(msg, s.storeDir, "<store>")
}

var clientRe = regexp.MustCompile(`^[\x21-\x7e]{1,128}$`)

func (s *service) clientOf(r *http.Request) string {
	if h := s.cfg.ClientHeader; h != "" {
		if v := r.Header.Get(h); clientRe.MatchString(v) {
			return v
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// countingWriter counts the answer's bytes for the access log; status 499
// (nginx's code): the client went away before an answer was written
type countingWriter struct {
	http.ResponseWriter
	n      int64
	status int
}

func (w *countingWriter) WriteHeader(code int) { w.status = code; w.ResponseWriter.WriteHeader(code) }
func (w *countingWriter) Write(b []byte) (int, error) {
	if w.status == 499 {
		w.status = 200
	}
	n, err := w.ResponseWriter.Write(b)
	w.n += int64(n)
	return n, err
}

func (s *service) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	start := time.Now()
	w := &countingWriter{ResponseWriter: rw, status: 499}
	client := s.clientOf(r)
	var queued time.Duration
	var inBytes int
	defer func() {
		if s.access == nil {
			return
		}
		p := r.URL.EscapedPath()
		if len(p) > 300 {
			p = p[:300]
		}
		line, _ := json.Marshal(map[string]any{"time": start.UTC().Format(time.RFC3339Nano), "client": client, "method": r.Method, "path": p,
			"status": w.status, "in": inBytes, "out": w.n, "ms": float64(time.Since(start).Microseconds()) / 1000,
			"queue_ms": float64(queued.Microseconds()) / 1000})
		s.accessMu.Lock()
		_, _ = s.access.Write(append(line, '\n'))
		s.accessMu.Unlock()
	}()
	out, err := s.handle(w, r, client, &queued, &inBytes)
	if err == nil && out == nil {
		return // answered already
	}
	code := http.StatusOK
	if err != nil {
		if r.Context().Err() != nil {
			return // the client went away
		}
		var m map[string]any
		code, m = s.errorAnswer(err)
		m["message"] = s.hide(fmt.Sprint(m["message"]))
		out = m
	}
	writeJSON(w, code, out)
}

func writeJSON(w http.ResponseWriter, code int, out any) {
	b, err := json.Marshal(out)
	if err != nil {
		code, b = 500, []byte(`{"error":"internal","message":"the answer could not be encoded"}`)
	}
	h := w.Header()
	h.Set("content-type", ctJSON)
	h.Set("content-length", fmt.Sprint(len(b)))
	if code == 429 || code == 503 {
		h.Set("retry-after", "1")
	}
	if code == 429 || code == 413 {
		h.Set("connection", "close")
	}
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// handle: the answer for writeJSON, or nil, nil when it wrote the answer itself
func (s *service) handle(w http.ResponseWriter, r *http.Request, client string, queued *time.Duration, inBytes *int) (any, error) {
	name, id, err := routeOf(r.Method, r.URL.EscapedPath())
	if err != nil {
		return nil, err
	}
	switch name {
	case "healthz":
		if s.draining.Load() {
			w.Header().Set("retry-after", "1")
			return writeAndNil(w, 503, map[string]any{"status": "shutting_down"})
		}
		if err := s.store.ping(); err != nil {
			return writeAndNil(w, 503, map[string]any{"status": "store_unavailable", "message": s.hide(err.Error())})
		}
		st := s.sched.stats()
		s.mu.Lock()
		n := len(s.known)
		s.mu.Unlock()
		return map[string]any{"status": "ok", "store": s.store.kind(), "agents": n, "running": st.Running, "queued": st.Queued, "clients": st.Clients,
			"pid": os.Getpid(), "started": s.started.UnixMilli()}, nil
	case "health":
		sp := s.pool.Spec
		pi, err := s.pool.GetInfo()
		if err != nil {
			return nil, err
		}
		c := s.cfg
		return map[string]any{"version": kvmem.Version(), "spec": map[string]any{
			"n_layers": sp.NLayers, "n_q_heads": sp.NQHeads, "n_kv_heads": sp.NKVHeads, "head_dim": sp.HeadDim, "model_id": sp.ModelID},
			"limits": map[string]any{"memory_budget_bytes": c.BudgetBytes, "pool_capacity_bytes": c.PoolCapacity, "max_body_bytes": c.MaxBodyBytes,
				"max_response_bytes": c.MaxResponseBytes, "max_agent_tokens": c.MaxAgentTokens, "workers": c.Workers,
				"client_running": c.ClientRunning, "client_queue": c.ClientQueue},
			"pool": map[string]any{"used_bytes": pi.UsedBytes, "n_agents": pi.NAgents}}, nil
	}
	if s.draining.Load() {
		return nil, errDraining
	}
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return nil, &httpError{413, "too_large", fmt.Sprintf("request body of %d bytes is over the service's limit of %d", r.ContentLength, s.cfg.MaxBodyBytes)}
	}
	t0 := time.Now()
	release, background, err := s.sched.acquire(r.Context(), client)
	if err != nil {
		return nil, err
	}
	defer release()
	*queued = time.Since(t0)
	work := func() (any, error) { return s.work(w, r, name, id, inBytes) }
	if background {
		return runLowPriority(work)
	}
	return work()
}

// work reads, decodes and carries out a request that holds a slot, and
// writes its answer (nil, nil) or returns the error to answer with: the
// slot covers the answer's encoding and writing too, so a client's large
// answers take no more cores than its slots.
func (s *service) work(w http.ResponseWriter, r *http.Request, name, id string, inBytes *int) (any, error) {
	body, err := readBody(w, r, s.cfg.MaxBodyBytes)
	*inBytes = len(body)
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return nil, err
		}
		return nil, badRequest("reading the body: %v", err)
	}
	var f fields
	if name != "list" && name != "info" && name != "remove" {
		if f, err = decodeRequest(name, r.Header.Get("content-type"), body); err != nil {
			return nil, err
		}
	}
	body = nil
	binary := acceptsTensors(r.Header.Get("accept"))
	out, err := s.route(name, id, f, binary)
	if err != nil {
		return nil, err
	}
	if m, ok := out.(map[string]any); ok && binary && m["gathered"] != nil {
		header, parts := tensorAnswer(m)
		n := int64(len(header))
		for _, p := range parts {
			n += 4 * int64(len(p))
		}
		w.Header().Set("content-type", ctTensors)
		w.Header().Set("content-length", fmt.Sprint(n))
		w.WriteHeader(200)
		if _, err := w.Write(header); err != nil {
			return nil, nil
		}
		for _, p := range parts {
			if writeF32s(w, p) != nil {
				break
			}
		}
		return nil, nil
	}
	writeJSON(w, http.StatusOK, out)
	return nil, nil
}

// readBody reads the body into one buffer of its announced length (io.ReadAll
// grows by doubling: twice a large body's bytes in garbage, and as many
// collections of the Go heap)
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	rd := http.MaxBytesReader(w, r.Body, limit)
	if r.ContentLength < 0 || r.ContentLength > limit {
		return io.ReadAll(rd)
	}
	body := make([]byte, r.ContentLength)
	if _, err := io.ReadFull(rd, body); err != nil {
		return nil, err
	}
	return body, nil // net/http ends the body at its Content-Length
}

// writeF32s writes xs little-endian, 64 KiB at a time
func writeF32s(w io.Writer, xs []float32) error {
	buf := make([]byte, 0, 64<<10)
	for len(xs) > 0 {
		n := len(xs)
		if n > cap(buf)/4 {
			n = cap(buf) / 4
		}
		buf = buf[:4*n]
		for i, x := range xs[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
		}
		if _, err := w.Write(buf); err != nil {
			return err
		}
		xs = xs[n:]
	}
	return nil
}

func writeAndNil(w http.ResponseWriter, code int, out any) (any, error) {
	writeJSON(w, code, out)
	return nil, nil
}

// serve runs the service on ln until ctx is cancelled, then shuts it down:
// no new requests, the ones at work finished (an answer a client does not
// read is cut after cfg.Shutdown), every changed agent saved.
func serve(ctx context.Context, ln net.Listener, svc *service) error {
	srv := &http.Server{Handler: svc, ReadHeaderTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
	case err := <-done:
		svc.Close()
		return err
	}
	svc.draining.Store(true)
	drained := svc.sched.drain()
	sctx, cancel := context.WithTimeout(context.Background(), svc.cfg.Shutdown)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	<-done
	<-drained
	return svc.shutdown()
}

func main() {
	cfg, err := loadConfig(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "memsvc:", err)
		os.Exit(1)
	}
	debug.SetMemoryLimit(cfg.GoMemLimit)
	tuneMalloc(mallocArenaMax, mallocMmapThreshold) // before kvmem allocates: freed C memory the budget cannot see otherwise
	svc, err := newService(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "memsvc:", err)
		os.Exit(1)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, cfg.Port))
	if err != nil {
		svc.Close()
		fmt.Fprintln(os.Stderr, "memsvc:", err)
		os.Exit(1)
	}
	fmt.Printf("kvmem memsvc listening on http://%s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	go func() {
		<-ctx.Done()
		fmt.Fprintln(os.Stderr, "memsvc: stopping: finishing the requests at work and saving the agents")
	}()
	err = serve(ctx, ln, svc)
	stop()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "memsvc:", err)
		os.Exit(1)
	}
}
