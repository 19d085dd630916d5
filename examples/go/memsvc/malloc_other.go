//go:build !linux || !cgo

package main

func mallocArenas() int           { return -1 }
func mallocTouch()                {}
func mappedOnItsOwn(size int) int { return -1 }

func tuneMalloc(arenas, mmapThreshold int) bool { return false }
