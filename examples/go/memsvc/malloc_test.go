package main

import (
	"os"
	"runtime"
	"sync"
	"testing"
)

// C memory kvmem frees must leave the RSS: glibc's defaults keep it in
// per-thread arenas and, once a large block was freed, carve later large
// blocks from them too. The service sets both (tuneMalloc).
func tunedMalloc(t *testing.T) {
	t.Helper()
	if mallocArenas() < 0 {
		t.Skip("skipped: not glibc's malloc (or no cgo): nothing to tune")
	}
	if os.Getenv("MALLOC_ARENA_MAX") != "" || os.Getenv("MALLOC_MMAP_THRESHOLD_") != "" {
		t.Skip("skipped: MALLOC_ARENA_MAX or MALLOC_MMAP_THRESHOLD_ is set in the environment, which the service leaves to it")
	}
	if !tuneMalloc(mallocArenaMax, mallocMmapThreshold) {
		t.Fatal("mallopt refused the service's settings")
	}
}

// Threads that malloc for the first time share the arenas there are.
func TestMallocArenasStayWithinTheServicesLimit(t *testing.T) {
	before := mallocArenas()
	tunedMalloc(t)
	// 16 OS threads (each goroutine locked to its own, which ends with it) malloc at once
	start := make(chan struct{})
	var ready, done sync.WaitGroup
	for i := 0; i < 16; i++ {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			runtime.LockOSThread() // not unlocked: the thread exits with the goroutine
			ready.Done()
			<-start
			mallocTouch()
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	allowed := mallocArenaMax
	if before > allowed {
		allowed = before
	}
	if after := mallocArenas(); after > allowed {
		t.Fatalf("%d malloc arenas after 16 threads malloced (%d before, the service's limit %d)", after, before, mallocArenaMax)
	}
}

// A large block is mapped on its own even after a larger one was freed
// (glibc's default then raises the threshold to that block's size, up to 32
// MiB). 16 MiB: a block an arena's free memory is unlikely to hold already,
// which it would be served from whatever the threshold.
func TestLargeBlocksAreMappedOnTheirOwn(t *testing.T) {
	tunedMalloc(t)
	if got := mappedOnItsOwn(24 << 20); got != 1 {
		t.Fatalf("a 24 MiB block: mapped on its own = %d, want 1", got)
	}
	if got := mappedOnItsOwn(16 << 20); got != 1 {
		t.Fatalf("a 16 MiB block after a 24 MiB one was freed: mapped on its own = %d, want 1", got)
	}
	if got := mappedOnItsOwn(4096); got != 0 {
		t.Fatalf("a 4096-byte block: mapped on its own = %d, want 0 (from an arena)", got)
	}
}
