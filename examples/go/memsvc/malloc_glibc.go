//go:build linux && cgo

package main

/*
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
static int set_arena_max(int n) { return mallopt(M_ARENA_MAX, n); }
static int set_mmap_threshold(int n) { return mallopt(M_MMAP_THRESHOLD, n); }
// a malloc on the calling thread (its first attaches it to an arena)
static void touch_malloc(void) { free(malloc(64)); }
// the arenas malloc has made so far (malloc_info lists one <heap> each)
static int count_arenas(void) {
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f) return -1;
	int ok = malloc_info(0, f) == 0;
	fclose(f);
	int n = 0;
	for (const char *p = buf; ok && p && (p = strstr(p, "<heap nr=")) != NULL; p++) n++;
	free(buf);
	return ok ? n : -1;
}
// 1 if a block of `size` bytes is mapped on its own (so free returns it to
// the system), 0 if it comes from an arena
#if __GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33)
#define MALLINFO mallinfo2
#else
#define MALLINFO mallinfo
#endif
static int mapped_on_its_own(size_t size) {
	size_t before = (size_t)MALLINFO().hblks;
	void *p = malloc(size);
	if (!p) return -1;
	memset(p, 1, size);
	size_t held = (size_t)MALLINFO().hblks;
	free(p);
	return held > before;
}
#else
static int set_arena_max(int n) { (void)n; return 0; }
static int set_mmap_threshold(int n) { (void)n; return 0; }
static void touch_malloc(void) {}
static int count_arenas(void) { return -1; }
static int mapped_on_its_own(size_t size) { (void)size; return -1; }
#endif
*/
import "C"

import "os"

// mallocArenas is the number of glibc malloc arenas, or -1 where it is not
// known; mallocTouch mallocs on the calling OS thread; mappedOnItsOwn says
// whether a block of size bytes is mapped apart from the arenas (-1: not
// known). For the tests.
func mallocArenas() int           { return int(C.count_arenas()) }
func mallocTouch()                { C.touch_malloc() }
func mappedOnItsOwn(size int) int { return int(C.mapped_on_its_own(C.size_t(size))) }

// tuneMalloc keeps glibc's malloc from holding freed C memory beyond the
// budget, unless the environment sets these itself (MALLOC_ARENA_MAX,
// MALLOC_MMAP_THRESHOLD_):
//   - at most arenas arenas: glibc gives each thread that mallocs an arena of
//     its own (up to 8 per core) and keeps what is freed in each, and kvmem's
//     calls run on whichever OS thread the Go runtime picks (a blocking cgo
//     call may get a fresh one);
//   - blocks of mmapThreshold bytes or more mapped on their own, so freeing
//     them returns them: by default the threshold rises to the largest block
//     freed (up to 32 MB), after which a Redis store's 4 MB chunk buffers and
//     replies, and a whole agent read back, are carved from the arenas and
//     stay in the RSS.
//
// Under the flood of scripts/loadfault/flood.js (Go on Redis, 256 MB budget,
// 3 rounds of 15 s, interleaved) the peak RSS was 259 and 273 MB by default
// (278 and 297 MB in earlier runs), 221-239 MB with 2 arenas, 189 MB with 2
// arenas and a 1 MiB threshold. Reports whether both were set.
func tuneMalloc(arenas, mmapThreshold int) bool {
	ok := true
	if os.Getenv("MALLOC_ARENA_MAX") == "" {
		ok = C.set_arena_max(C.int(arenas)) == 1
	}
	if os.Getenv("MALLOC_MMAP_THRESHOLD_") == "" {
		ok = C.set_mmap_threshold(C.int(mmapThreshold)) == 1 && ok
	}
	return ok
}
