package kvmem_test

// Every KVMEM_API function of include/kvmem.h is called by the Go binding
// (directly as C.name or from a cgo helper in the preamble).

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func headerFunctions(t *testing.T) []string {
	b, err := os.ReadFile(filepath.Join(repoRoot(), "include", "kvmem.h"))
	if err != nil {
		t.Fatal(err)
	}
	text := regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAllString(string(b), " ")
	text = regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(text, " ")
	var names []string
	for _, m := range regexp.MustCompile(`KVMEM_API\b[^;(]*?\b(kvmem_\w+)\s*\(`).FindAllStringSubmatch(text, -1) {
		names = append(names, m[1])
	}
	if len(names) < 30 {
		t.Fatalf("the header parser found only %d functions", len(names))
	}
	return names
}

func TestEveryPublicFunctionIsBound(t *testing.T) {
	files, _ := filepath.Glob("*.go")
	var src strings.Builder
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, _ := os.ReadFile(f)
		src.Write(b)
	}
	s := src.String()
	var missing []string
	for _, n := range headerFunctions(t) {
		// The *_errbuf forms serve bindings whose async calls run on threads
		// they cannot run code on; Go reads kvmem_last_error() on the calling
		// OS thread (call() keeps the goroutine locked to it).
		if strings.HasSuffix(n, "_errbuf") {
			continue
		}
		// kvmem_X_params_init is what kvmem.h's inline kvmem_X_default_params
		// calls, and those are what the binding calls.
		if x := strings.TrimSuffix(n, "_params_init"); x != n {
			n = x + "_default_params"
		}
		// C.name( from Go, or name( called inside a kvgo_ helper
		if !regexp.MustCompile(`\bC\.` + n + `\(|[^\w.]` + n + `\(`).MatchString(s) {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("the Go binding does not call: %v", missing)
	}
}
