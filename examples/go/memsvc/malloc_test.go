package main

import (
	"os"
	"runtime"
	"sync"
	"testing"
)

// kvmem's calls run on many OS threads; with glibc's default each thread that
// mallocs gets an arena of its own, and what is freed in each stays in the RSS
// beyond the memory budget. The service holds malloc to mallocArenaMax arenas:
// threads that malloc for the first time after that share them.
func TestMallocArenasStayWithinTheServicesLimit(t *testing.T) {
	if mallocArenas() < 0 {
		t.Skip("skipped: not glibc's malloc (or no cgo): no arenas to limit")
	}
	if os.Getenv("MALLOC_ARENA_MAX") != "" {
		t.Skip("skipped: MALLOC_ARENA_MAX is set in the environment, which the service leaves to it")
	}
	before := mallocArenas()
	if !limitMallocArenas(mallocArenaMax) {
		t.Fatal("mallopt(M_ARENA_MAX) was refused")
	}
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
