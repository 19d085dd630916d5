package main

// What the service needs to know of the pool's store that kvmem's API does not
// tell: which agents it holds (the agent list after a restart) and whether it
// answers (/healthz). A directory store is read with ReadDir; a Redis store
// (redis://, unix://, the URL kvmem_pool_create takes) with SCAN over the
// plugin's manifest keys kvmem:{POOL:AGENT}:m through a few lines of RESP.
// A Redis Cluster is not scanned node by node: one server or one proxy.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

var storedIDRe = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$`)

func isStoreURL(s string) bool {
	return strings.HasPrefix(s, "redis://") || strings.HasPrefix(s, "unix://")
}

type storeLister interface {
	kind() string
	list() ([]string, error)
	ping() error
}

type noStore struct{}

func (noStore) kind() string            { return "none" }
func (noStore) list() ([]string, error) { return nil, nil }
func (noStore) ping() error             { return nil }

type dirStore struct{ dir string }

func (dirStore) kind() string { return "dir" }

// AGENT.safetensors files; the store's temporary files start with '.'
func (d dirStore) list() ([]string, error) {
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if id := strings.TrimSuffix(e.Name(), ".safetensors"); id != e.Name() && storedIDRe.MatchString(id) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

func (d dirStore) ping() error {
	st, err := os.Stat(d.dir)
	if err == nil && !st.IsDir() {
		err = errors.New("the store is not a directory")
	}
	return err
}

// redisStore: the parts of a store URL the plugin reads
// (stores/redis/redis_store.c); the password stays out of every message.
type redisStore struct {
	network, addr string
	user, pass    string
	hasPass       bool
	db            int
	pool          string
	timeout       time.Duration
}

func parseRedisURL(u string) *redisStore {
	r := &redisStore{network: "tcp", pool: "default", timeout: 2 * time.Second}
	main, query, _ := strings.Cut(u, "?")
	if strings.HasPrefix(main, "unix://") {
		r.network, r.addr = "unix", strings.TrimPrefix(main, "unix://")
	} else {
		p := strings.TrimPrefix(main, "redis://")
		if at := strings.LastIndex(p, "@"); at >= 0 {
			cred := p[:at]
			if user, pass, ok := strings.Cut(cred, ":"); ok {
				r.user, r.pass, r.hasPass = user, pass, true
			} else if cred != "" {
				r.pass, r.hasPass = cred, true
			}
			p = p[at+1:]
		}
		if host, db, ok := strings.Cut(p, "/"); ok {
			if db != "" {
				r.db, _ = strconv.Atoi(db)
			}
			p = host
		}
		host, port := p, "6379"
		if strings.HasPrefix(p, "[") {
			if rb := strings.Index(p, "]"); rb >= 0 {
				host = p[1:rb]
				if strings.HasPrefix(p[rb+1:], ":") {
					port = p[rb+2:]
				}
			}
		} else if h, pt, ok := strings.Cut(p, ":"); ok {
			host, port = h, pt
		}
		r.addr = net.JoinHostPort(host, port)
	}
	for _, kv := range strings.Split(query, "&") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "pool":
			r.pool = v
		case "db":
			r.db, _ = strconv.Atoi(v)
		case "timeout_ms":
			if ms, err := strconv.Atoi(v); err == nil && ms > 0 {
				r.timeout = time.Duration(ms) * time.Millisecond
			}
		}
	}
	return r
}

func (*redisStore) kind() string { return "redis" }

type respConn struct {
	c net.Conn
	r *bufio.Reader
}

func (r *redisStore) session(fn func(cmd func(args ...string) (any, error)) error) error {
	c, err := net.DialTimeout(r.network, r.addr, r.timeout)
	if err != nil {
		return fmt.Errorf("redis %s: %w", r.addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(r.timeout))
	rc := &respConn{c, bufio.NewReader(c)}
	cmd := func(args ...string) (any, error) {
		var b strings.Builder
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
		if _, err := io.WriteString(rc.c, b.String()); err != nil {
			return nil, err
		}
		v, err := rc.read()
		if e, ok := v.(respError); ok {
			return nil, fmt.Errorf("%s: %s", args[0], string(e))
		}
		return v, err
	}
	if r.hasPass {
		args := []string{"AUTH", r.pass}
		if r.user != "" {
			args = []string{"AUTH", r.user, r.pass}
		}
		if _, err := cmd(args...); err != nil {
			return fmt.Errorf("redis %s: AUTH failed", r.addr)
		}
	}
	if r.db != 0 {
		if _, err := cmd("SELECT", strconv.Itoa(r.db)); err != nil {
			return fmt.Errorf("redis %s: %w", r.addr, err)
		}
	}
	if err := fn(cmd); err != nil {
		return fmt.Errorf("redis %s: %w", r.addr, err)
	}
	return nil
}

type respError string

// read one RESP2 reply
func (rc *respConn) read() (any, error) {
	line, err := rc.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty reply")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return respError(line[1:]), nil
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(rc.r, b); err != nil {
			return nil, err
		}
		return string(b[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return nil, err
		}
		out := make([]any, 0, max(n, 0))
		for i := 0; i < n; i++ {
			v, err := rc.read()
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected reply type %q", line[0])
}

func (r *redisStore) list() ([]string, error) {
	pre := "kvmem:{" + r.pool + ":"
	seen := map[string]bool{}
	err := r.session(func(cmd func(args ...string) (any, error)) error {
		cursor := "0"
		for {
			v, err := cmd("SCAN", cursor, "MATCH", pre+"*}:m", "COUNT", "1000")
			if err != nil {
				return err
			}
			a, ok := v.([]any)
			if !ok || len(a) != 2 {
				return errors.New("SCAN: unexpected reply")
			}
			cursor, _ = a[0].(string)
			keys, _ := a[1].([]any)
			for _, k := range keys {
				s, _ := k.(string)
				if !strings.HasPrefix(s, pre) || !strings.HasSuffix(s, "}:m") {
					continue
				}
				if id := s[len(pre) : len(s)-3]; storedIDRe.MatchString(id) {
					seen[id] = true
				}
			}
			if cursor == "0" || cursor == "" {
				return nil
			}
		}
	})
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, err
}

func (r *redisStore) ping() error {
	return r.session(func(cmd func(args ...string) (any, error)) error { _, err := cmd("PING"); return err })
}

// storeOf: spec is a directory (made absolute, must exist), a store URL, or "".
func storeOf(spec string) (storeLister, string, error) {
	if spec == "" {
		return noStore{}, "", nil
	}
	if isStoreURL(spec) {
		return parseRedisURL(spec), spec, nil
	}
	abs, err := filepath.Abs(spec)
	if err != nil {
		return nil, "", err
	}
	if st, err := os.Stat(abs); err != nil || !st.IsDir() {
		return nil, "", fmt.Errorf("store directory %s does not exist or is not a directory", abs)
	}
	return dirStore{abs}, abs, nil
}
