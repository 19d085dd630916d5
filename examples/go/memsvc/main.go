// Command memsvc is a net/http microservice keeping agents' memory in kvmem,
// with the same endpoints as examples/node/memory-service:
//
//	GET    /health                   {version, spec}
//	GET    /agents                   {agents: [id...]}
//	GET    /agents/{id}              agent info
//	POST   /agents/{id}/append       {k, v, token_ids?, text?, token_text_offsets?, positions?, flush?}
//	POST   /agents/{id}/flush        agent info
//	POST   /agents/{id}/retrieve     {query, top_k?, gather?, base_position?}
//	POST   /agents/{id}/save, /load  no body: the agent's file in the store (501 without one)
//	DELETE /agents/{id}              close and remove the agent
//
// Errors come back as {error, status, message} with kvmem's own message.
//
// Persistence goes through the pool's store: a directory chosen when the
// service starts (KVMEM_STORE_DIR), one AGENT_ID.safetensors file per agent,
// the id already checked by kvmem ([A-Za-z0-9._-], no leading '.'). A client
// never names a file: a body with a path (or any field) is refused, so no
// request can write or read outside the store; messages name the store
// <store>, and what is wrong inside a damaged file goes to the log only.
//
// Run (the binding's link recipe: pkg-config finds kvmem, installed or a build tree,
// and its libdir goes into the rpath; or -tags kvmem_static):
//
//	export PKG_CONFIG_PATH=$PWD/build/default   # a checkout after make build; an install: <prefix>/lib/pkgconfig
//	cd examples/go/memsvc && CGO_LDFLAGS="-Wl,-rpath,$(pkg-config --variable=libdir kvmem)" \
//	  KVMEM_STORE_DIR=/var/lib/kvmem go run .
//	(HOST, PORT; PORT=0 picks a free port; without KVMEM_STORE_DIR, save/load answer 501)
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

type agentEntry struct {
	mu    sync.Mutex // kvmem: one goroutine per agent at a time
	agent *kvmem.Agent
}

type service struct {
	ctx      *kvmem.Context
	pool     *kvmem.Pool
	storeDir string      // the pool's store, absolute; "" = no persistence
	log      *log.Logger // the service's log (stderr)
	mu       sync.Mutex
	agents   map[string]*agentEntry
}

// newService: storeDir is an existing directory, the only place agents are
// saved to and loaded from (the pool's store); "" = no persistence.
func newService(spec kvmem.ModelSpec, params kvmem.PoolParams, storeDir string) (*service, error) {
	if storeDir != "" {
		abs, err := filepath.Abs(storeDir)
		if err != nil {
			return nil, err
		}
		if st, err := os.Stat(abs); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("store directory %s does not exist or is not a directory", abs)
		}
		storeDir, params.StoreDir = abs, abs
	}
	ctx, err := kvmem.NewContext(kvmem.ContextParams{Backend: "cpu"})
	if err != nil {
		return nil, err
	}
	pool, err := ctx.PoolCreate(spec, params)
	if err != nil {
		ctx.Close()
		return nil, err
	}
	return &service{ctx: ctx, pool: pool, storeDir: storeDir, log: log.New(os.Stderr, "memsvc: ", 0), agents: map[string]*agentEntry{}}, nil
}

func (s *service) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.agents {
		e.mu.Lock()
		e.agent.Close()
		e.mu.Unlock()
	}
	s.agents = map[string]*agentEntry{}
	s.ctx.Close()
}

// withAgent runs fn on the agent (opened on first use) under its lock.
func (s *service) withAgent(id string, fn func(a *kvmem.Agent) (any, error)) (any, error) {
	s.mu.Lock()
	e := s.agents[id]
	if e == nil {
		a, err := s.pool.AgentOpen(id)
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		e = &agentEntry{agent: a}
		s.agents[id] = e
	}
	s.mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	return fn(e.agent)
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
	kvmem.StatusUnsupported: 501,
}

func info(a *kvmem.Agent) (any, error) {
	i, err := a.GetInfo()
	if err != nil {
		return nil, err
	}
	return map[string]any{"id": a.ID(), "n_tokens": i.NTokens, "n_blocks": i.NBlocks, "n_sealed": i.NSealed,
		"bytes": i.Bytes, "text_bytes": i.TextBytes}, nil
}

type appendBody struct {
	K                []float32 `json:"k"`
	V                []float32 `json:"v"`
	TokenIDs         []int32   `json:"token_ids"`
	Text             string    `json:"text"`
	TokenTextOffsets []int32   `json:"token_text_offsets"`
	Positions        []int32   `json:"positions"`
	Flush            bool      `json:"flush"`
}

func (s *service) route(r *http.Request) (any, error) {
	if r.Method == http.MethodGet && r.URL.Path == "/health" {
		return map[string]any{"version": kvmem.Version(), "spec": map[string]any{
			"n_layers": s.pool.Spec.NLayers, "n_q_heads": s.pool.Spec.NQHeads, "n_kv_heads": s.pool.Spec.NKVHeads,
			"head_dim": s.pool.Spec.HeadDim, "model_id": s.pool.Spec.ModelID}}, nil
	}
	// split before unescaping, so an id holding %2F is one (invalid) id, as in the Node service
	parts := strings.Split(strings.Trim(r.URL.EscapedPath(), "/"), "/")
	for i, p := range parts {
		u, err := url.PathUnescape(p)
		if err != nil {
			return nil, badRequest("bad escape in path segment %q", p)
		}
		parts[i] = u
	}
	if parts[0] != "agents" {
		return nil, &httpError{404, "not_found", "no route " + r.Method + " " + r.URL.Path}
	}
	if len(parts) == 1 && r.Method == http.MethodGet {
		ids, err := s.pool.AgentIDs()
		return map[string]any{"agents": ids}, err
	}
	id := parts[1]
	switch {
	case len(parts) == 2 && r.Method == http.MethodGet:
		ids, err := s.pool.AgentIDs()
		if err != nil {
			return nil, err
		}
		found := false
		for _, x := range ids {
			found = found || x == id
		}
		if !found {
			return nil, &httpError{404, "not_found", "no agent '" + id + "'"}
		}
		return s.withAgent(id, info)
	case len(parts) == 2 && r.Method == http.MethodDelete:
		s.mu.Lock()
		if e := s.agents[id]; e != nil {
			e.mu.Lock()
			e.agent.Close()
			e.mu.Unlock()
			delete(s.agents, id)
		}
		s.mu.Unlock()
		if err := s.pool.RemoveAgent(id); err != nil {
			return nil, err
		}
		return map[string]any{"removed": id}, nil
	case len(parts) == 3 && r.Method == http.MethodPost:
		switch parts[2] {
		case "append":
			var b appendBody
			if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 64<<20)).Decode(&b); err != nil {
				return nil, badRequest("invalid JSON: %v", err)
			}
			return s.withAgent(id, func(a *kvmem.Agent) (any, error) {
				p := &kvmem.AppendParams{TokenIDs: b.TokenIDs, Text: b.Text, TokenTextOffsets: b.TokenTextOffsets, Positions: b.Positions}
				if err := a.Append(kvmem.F32Tensor(b.K), kvmem.F32Tensor(b.V), p); err != nil {
					return nil, err
				}
				if b.Flush {
					if err := a.Flush(); err != nil {
						return nil, err
					}
				}
				return info(a)
			})
		case "flush":
			return s.withAgent(id, func(a *kvmem.Agent) (any, error) {
				if err := a.Flush(); err != nil {
					return nil, err
				}
				return info(a)
			})
		case "retrieve":
			return s.retrieve(id, r)
		case "save", "load":
			return s.persist(parts[2], id, r)
		}
	}
	return nil, &httpError{404, "not_found", "no route " + r.Method + " " + r.URL.Path}
}

func (s *service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	out, err := s.route(r)
	code := http.StatusOK
	if err != nil {
		var he *httpError
		var ke *kvmem.Error
		switch {
		case errors.As(err, &he):
			code, out = he.code, map[string]any{"error": he.kind, "message": he.message}
		case errors.As(err, &ke):
			code = httpForStatus[ke.Code]
			if code == 0 {
				code = 500
			}
			out = map[string]any{"error": ke.Code.String(), "status": int(ke.Code), "message": ke.Msg}
		default:
			code, out = 500, map[string]any{"error": "internal", "message": err.Error()}
		}
	}
	if m, ok := out.(map[string]any); ok && err != nil && s.storeDir != "" && s.storeDir != filepath.VolumeName(s.storeDir)+string(filepath.Separator) {
		// kvmem's messages may name the store's files: clients see <store>, not the server's directories
		m["message"] = strings.ReplaceAll(fmt.Sprint(m["message"]), s.storeDir, "<store>")
	}
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(out)
}

// serve runs the service on ln until ctx is cancelled.
func serve(ctx context.Context, ln net.Listener, svc *service) error {
	srv := &http.Server{Handler: svc}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		err := srv.Shutdown(context.Background())
		<-done
		return err
	case err := <-done:
		return err
	}
}

func envInt(name string, def int32) int32 {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return int32(v)
	}
	return def
}

func main() {
	spec := kvmem.ModelSpecDefault()
	spec.NLayers, spec.NQHeads = envInt("KVMEM_LAYERS", 2), envInt("KVMEM_Q_HEADS", 4)
	spec.NKVHeads, spec.HeadDim, spec.ModelID = envInt("KVMEM_KV_HEADS", 2), envInt("KVMEM_HEAD_DIM", 64), "memsvc"
	params := kvmem.PoolDefaultParams()
	params.BlockSize = 16
	svc, err := newService(spec, params, os.Getenv("KVMEM_STORE_DIR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "memsvc:", err)
		os.Exit(1)
	}
	defer svc.Close()
	host, port := os.Getenv("HOST"), os.Getenv("PORT")
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "8080"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "memsvc:", err)
		os.Exit(1)
	}
	fmt.Printf("kvmem memsvc listening on http://%s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := serve(ctx, ln, svc); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "memsvc:", err)
		os.Exit(1)
	}
}
