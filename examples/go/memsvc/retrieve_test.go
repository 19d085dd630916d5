package main

import "testing"

func checkRetrieve(t *testing.T, code int, out map[string]any) {
	t.Helper()
	if code != 501 {
		t.Fatalf("retrieve before the binding has it: %d %v", code, out)
	}
}

func checkPersist(t *testing.T, op string, code int, out map[string]any) {
	t.Helper()
	if code != 501 {
		t.Fatalf("%s before the binding has it: %d %v", op, code, out)
	}
}
