package main

import (
	"fmt"
	"testing"
)

func checkRetrieve(t *testing.T, code int, out map[string]any) {
	t.Helper()
	if code != 200 {
		t.Fatalf("retrieve: %d %v", code, out)
	}
	blocks := out["blocks"].([]any)
	b0 := blocks[0].(map[string]any)
	if len(blocks) != 1 || b0["block"] != float64(1) || fmt.Sprint(b0["token_ids"]) != "[4 5 6]" {
		t.Fatalf("retrieve found %v", out)
	}
	if fmt.Sprint(out["gathered"].(map[string]any)["shape"]) != "[2 3 2 8]" {
		t.Fatalf("gathered %v", out["gathered"])
	}
}

func checkPersist(t *testing.T, op string, code int, out map[string]any) {
	t.Helper()
	if code != 200 {
		t.Fatalf("%s: %d %v", op, code, out)
	}
}
