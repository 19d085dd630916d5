//go:build linux && cgo

package main

/*
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
static int limit_arenas(int n) { return mallopt(M_ARENA_MAX, n); }
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
// a malloc on the calling thread (its first attaches it to an arena)
static void touch_malloc(void) { free(malloc(64)); }
#else
static void touch_malloc(void) {}
static int limit_arenas(int n) { (void)n; return 0; }
static int count_arenas(void) { return -1; }
#endif
*/
import "C"

import "os"

// mallocTouch mallocs on the calling OS thread (the tests' arena check).
func mallocTouch() { C.touch_malloc() }

// mallocArenas is the number of glibc malloc arenas, or -1 where it is not known.
func mallocArenas() int { return int(C.count_arenas()) }

// limitMallocArenas holds glibc's malloc to at most n arenas unless the
// environment sets MALLOC_ARENA_MAX. glibc gives each thread that mallocs an
// arena of its own (up to 8 per core) and keeps what is freed in each; kvmem's
// calls run on whichever OS thread the Go runtime picks (a blocking cgo call
// may get a fresh one), so the pool's blocks and a Redis store's chunk buffers
// and replies spread over many arenas whose freed memory the RSS keeps, outside
// both the pool's capacity and the Go heap's limit. Under the flood of
// scripts/loadfault/flood.js (Go on Redis, 256 MB budget, 3 rounds of 15 s)
// the peak RSS was 212-273 MB by default (278 and 297 MB in earlier runs),
// 191-235 MB with 2.
// Reports whether the limit was set.
func limitMallocArenas(n int) bool {
	if os.Getenv("MALLOC_ARENA_MAX") != "" {
		return false
	}
	return C.limit_arenas(C.int(n)) == 1
}
