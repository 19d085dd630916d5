package main

import (
	"fmt"
	"math"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

// config is the service's settings, read from the environment and checked:
// a value that is not what its variable takes stops the service at startup
// with a message naming the variable (the Node service reads the same ones).
type config struct {
	Host, Port       string
	Spec             kvmem.ModelSpec
	BlockSize        int32
	Store            string // a directory or a redis:// / unix:// URL; "" = none
	BudgetBytes      int64
	MaxBodyBytes     int64
	MaxResponseBytes int64
	MaxAgentTokens   int64
	Workers          int
	ClientRunning    int
	ClientQueue      int
	ClientHeader     string // "" = the client is its address
	AccessLog        string // "-" stdout, "off", or a file
	Shutdown         time.Duration
	PoolCapacity     int64 // what the budget leaves for agents
	GoMemLimit       int64 // the Go heap's soft limit (runtime/debug.SetMemoryLimit)
}

// Memory kept outside the pool, counted against the budget: the runtime
// (measured idle at 10-20 MB RSS) and, per request at work, its body, the
// decoded fields (JSON numbers, then float32 slices), the answer and its
// encoding.
const runtimeBytes = 32 << 20

// glibc's malloc as the service sets it (malloc_glibc.go): at most 2 arenas
// (what C frees is kept per arena, and kvmem runs on many OS threads), and
// blocks of 1 MiB or more mapped on their own, so freeing them returns them.
const (
	mallocArenaMax      = 2
	mallocMmapThreshold = 1 << 20
)

func (c *config) perRequestBytes() int64 { return 4*c.MaxBodyBytes + 3*c.MaxResponseBytes }

var sizeRe = regexp.MustCompile(`^(?i)([0-9]+)([KMG]?)(?:i?B)?$`)

func loadConfig(getenv func(string) string) (*config, error) {
	var firstErr error
	fail := func(format string, a ...any) {
		if firstErr == nil {
			firstErr = fmt.Errorf(format, a...)
		}
	}
	integer := func(name string, def, lo, hi int64) int64 {
		s := strings.TrimSpace(getenv(name))
		if s == "" {
			return def
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < lo || v > hi {
			fail("%s=%q: expected an integer in [%d, %d]", name, getenv(name), lo, hi)
			return def
		}
		return v
	}
	size := func(name string, def, lo, hi int64) int64 {
		s := strings.TrimSpace(getenv(name))
		if s == "" {
			return def
		}
		m := sizeRe.FindStringSubmatch(s)
		var v int64 = -1
		if m != nil {
			n, err := strconv.ParseInt(m[1], 10, 64)
			unit := map[string]int64{"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[strings.ToUpper(m[2])]
			if err == nil && n <= math.MaxInt64/unit {
				v = n * unit
			}
		}
		if v < lo || v > hi {
			fail("%s=%q: expected a byte count in [%d, %d] (digits, optionally K, M or G)", name, getenv(name), lo, hi)
			return def
		}
		return v
	}
	c := &config{Host: getenv("HOST"), Port: getenv("PORT")}
	if c.Host == "" {
		c.Host = "127.0.0.1"
	}
	if c.Port == "" {
		c.Port = "8080"
	} else {
		integer("PORT", 0, 0, 65535)
	}
	c.Spec = kvmem.ModelSpecDefault()
	c.Spec.NLayers = int32(integer("KVMEM_LAYERS", 2, 1, 1024))
	c.Spec.NQHeads = int32(integer("KVMEM_Q_HEADS", 4, 1, 1024))
	c.Spec.NKVHeads = int32(integer("KVMEM_KV_HEADS", 2, 1, 1024))
	c.Spec.HeadDim = int32(integer("KVMEM_HEAD_DIM", 64, 2, 4096))
	c.Spec.ModelID = "memsvc"
	c.BlockSize = int32(integer("KVMEM_BLOCK_SIZE", 16, 1, 4096))
	c.BudgetBytes = size("KVMEM_MEMORY_BUDGET", 1<<30, 1, math.MaxInt64)
	c.MaxBodyBytes = size("KVMEM_MAX_BODY_BYTES", 8<<20, 1024, 1<<30)
	c.MaxResponseBytes = size("KVMEM_MAX_RESPONSE_BYTES", 8<<20, 1024, 1<<30)
	c.MaxAgentTokens = integer("KVMEM_MAX_AGENT_TOKENS", 65536, 1, math.MaxInt32)
	// one more request at work than cores, and one client holds at most all
	// cores but one: a newcomer finds a free slot and a core to run on
	c.Workers = int(integer("KVMEM_WORKERS", int64(runtime.NumCPU()+1), 1, 1024))
	c.ClientRunning = int(integer("KVMEM_CLIENT_RUNNING", int64(max(1, min(c.Workers-1, runtime.NumCPU()-1))), 1, int64(c.Workers)))
	c.ClientQueue = int(integer("KVMEM_CLIENT_QUEUE", 64, 1, 1<<20))
	c.ClientHeader = strings.ToLower(strings.TrimSpace(getenv("KVMEM_CLIENT_HEADER")))
	if c.ClientHeader != "" && !regexp.MustCompile(`^[a-z0-9-]+$`).MatchString(c.ClientHeader) {
		fail("KVMEM_CLIENT_HEADER=%q: expected a header name", getenv("KVMEM_CLIENT_HEADER"))
	}
	c.AccessLog = getenv("KVMEM_ACCESS_LOG")
	if c.AccessLog == "" {
		c.AccessLog = "-"
	}
	c.Shutdown = time.Duration(integer("KVMEM_SHUTDOWN_TIMEOUT_MS", 30000, 0, 24*3600*1000)) * time.Millisecond
	// KVMEM_STORE: a directory or a redis:// / unix:// URL; KVMEM_STORE_DIR, its older name
	store, dir := getenv("KVMEM_STORE"), getenv("KVMEM_STORE_DIR")
	if store != "" && dir != "" && store != dir {
		fail("KVMEM_STORE and KVMEM_STORE_DIR name different stores: set one")
	}
	c.Store = store
	if c.Store == "" {
		c.Store = dir
	}
	if firstErr != nil {
		return nil, firstErr
	}
	inflight := int64(c.Workers) * c.perRequestBytes()
	c.PoolCapacity = c.BudgetBytes - runtimeBytes - inflight
	c.GoMemLimit = runtimeBytes + inflight
	if c.PoolCapacity < 16<<20 {
		return nil, fmt.Errorf("KVMEM_MEMORY_BUDGET=%d bytes leaves %d for agents (under 16 MiB): the runtime takes %d and each of the %d "+
			"requests at work up to %d (4 x KVMEM_MAX_BODY_BYTES + 3 x KVMEM_MAX_RESPONSE_BYTES); raise the budget or lower the limits",
			c.BudgetBytes, c.PoolCapacity, runtimeBytes, c.Workers, c.perRequestBytes())
	}
	return c, nil
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

func max(a, b int) int {
	if a > b {
		return a
	}
	return b
}
