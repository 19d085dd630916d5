//go:build !linux

package main

// runLowPriority: per-thread priorities are a Linux feature here; fn runs as is.
func runLowPriority(fn func() (any, error)) (any, error) { return fn() }
