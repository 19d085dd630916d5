package kvmem_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	kvmem "github.com/kvmem/kvmem/bindings/go"
)

// refused: the call failed before C with a kvmem.Error of StatusInvalidArg
// whose message names what held the NUL.
func refused(t *testing.T, err error, what string) {
	t.Helper()
	var e *kvmem.Error
	if !errors.As(err, &e) || e.Code != kvmem.StatusInvalidArg || !strings.Contains(e.Msg, "NUL") || !strings.Contains(e.Msg, what) {
		t.Fatalf("want an InvalidArg error naming %s and the NUL, got %v", what, err)
	}
}

// C reads a string up to its first NUL: AgentOpen("alice\x00-evil") used to
// open agent "alice". Ids with a NUL are refused and nothing is created or
// removed.
func TestAgentIDsWithNULAreRefused(t *testing.T) {
	ctx, pool := smallPool(t, kvmem.F32)
	defer ctx.Close()
	for _, bad := range []string{"alice\x00-evil", "\x00", "alice\x00"} {
		a, err := pool.AgentOpen(bad)
		refused(t, err, "agent id")
		if a != nil {
			t.Fatal("a refused open returned an agent")
		}
	}
	if ids, _ := pool.AgentIDs(); len(ids) != 0 {
		t.Fatalf("agents after refused opens: %v", ids)
	}
	a, err := pool.AgentOpen("alice")
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	refused(t, pool.RemoveAgent("alice\x00-evil"), "agent id")
	if ids, _ := pool.AgentIDs(); !reflect.DeepEqual(ids, []string{"alice"}) {
		t.Fatalf("agents after a refused remove: %v", ids)
	}
	if !kvmem.AgentIDValid("alice") || kvmem.AgentIDValid("alice\x00-evil") {
		t.Fatal("AgentIDValid")
	}
}

func TestPathsWithNULAreRefusedAndNothingIsWritten(t *testing.T) {
	ctx, pool := smallPool(t, kvmem.F32)
	defer ctx.Close()
	a, _ := pool.AgentOpen("alice")
	k := seq(2*5*2*8, 3)
	if err := a.Append(kvmem.F32Tensor(k), kvmem.F32Tensor(k), nil); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	target := filepath.Join(dir, "alice.kvm")
	refused(t, a.Save(target+"\x00.bak"), "path")
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("a refused save wrote %v", ents)
	}
	if err := a.Save(target); err != nil {
		t.Fatal(err)
	}
	refused(t, a.Load(target+"\x00"), "path")
	if err := a.Load(target); err != nil {
		t.Fatal(err)
	}
	pp := kvmem.PoolDefaultParams()
	pp.StoreDir = dir + "\x00/elsewhere"
	_, err := ctx.PoolCreate(pool.Spec, pp)
	refused(t, err, "store dir")
	_, err = kvmem.QmemHeadLoad("/tmp/head\x00.safetensors")
	refused(t, err, "path")
}

func TestOtherNamesWithNULAreRefused(t *testing.T) {
	_, err := kvmem.NewContext(kvmem.ContextParams{Backend: "cpu\x00cuda"})
	refused(t, err, "backend")
	ctx, pool := smallPool(t, kvmem.F32)
	defer ctx.Close()
	spec := pool.Spec
	spec.ModelID = "llama\x00-other"
	_, err = ctx.PoolCreate(spec, kvmem.PoolDefaultParams())
	refused(t, err, "model id")
	_, err = pool.SegmentsCreate("robot\x00x", kvmem.SegmentsDefaultParams())
	refused(t, err, "owner")
	if ids, _ := pool.AgentIDs(); len(ids) != 0 {
		t.Fatalf("agents after a refused segment store: %v", ids)
	}
	segs, err := pool.SegmentsCreate("robot", kvmem.SegmentsDefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	defer segs.Close()
	_, err = segs.Add("tool\x00s", 0)
	refused(t, err, "segment name")
	if i, err := segs.Add("tools", 0); err != nil || i != 0 {
		t.Fatalf("add: %d %v", i, err)
	}
	_, err = segs.Find("tools\x00x")
	refused(t, err, "segment name")
	p := kvmem.QmemDefaultParams()
	p.Capacity = 2
	store, err := kvmem.NewQmemStore(ikvSpec(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	_, err = store.SessionKey(kvmem.SessionSource{SessionID: "chat-1\x00x"})
	refused(t, err, "session id")
}
