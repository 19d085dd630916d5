//go:build !linux || !cgo

package main

func mallocArenas() int { return -1 }

func limitMallocArenas(n int) bool { return false }

func mallocTouch() {}
