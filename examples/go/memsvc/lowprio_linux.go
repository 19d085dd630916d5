//go:build linux

package main

import (
	"runtime"
	"syscall"
)

// lowNice is the CPU priority of background requests (sched.go): nice 10
// takes about a tenth of a core's time from a nice-0 thread that wants it.
const lowNice = 10

// runLowPriority runs fn on an OS thread of its own at nice lowNice: its Go
// code and the kvmem calls it makes (the append, a spill's write). The
// thread is locked to the goroutine and never unlocked, so it ends with it
// rather than going back to the runtime at the lower priority. A panic in
// fn is raised again in the caller with its own value (net/http's recovery
// applies, and http.ErrAbortHandler still aborts quietly).
func runLowPriority(fn func() (any, error)) (any, error) {
	type result struct {
		out   any
		err   error
		panic any
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		_ = syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), lowNice) // best effort
		var r result
		defer func() {
			if p := recover(); p != nil {
				r.panic = p
			}
			done <- r
		}()
		r.out, r.err = fn()
	}()
	r := <-done
	if r.panic != nil {
		panic(r.panic)
	}
	return r.out, r.err
}
