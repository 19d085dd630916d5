'use strict';
// glibc's malloc, held to the budget (docs/reliability.md, "Bounded memory").
//
// kvmem's C memory, the Redis store's chunk buffers and replies, and Node's
// Buffers are malloc'd on many threads: the event loop, koffi's and libuv's
// worker threads, and each codec thread. By default glibc gives each such
// thread an arena of its own (up to 8 per core) and keeps what is freed in
// it, and raises the mmap threshold to the largest block freed (up to 32
// MiB), after which multi-megabyte blocks are carved from the arenas too and
// stay in the RSS when freed. tuneMalloc() sets at most ARENA_MAX arenas and a
// fixed MMAP_THRESHOLD (a fixed one also turns off the rising), unless the
// environment sets them itself (MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_),
// as the Go service does.
const path = require('node:path');

const ARENA_MAX = 2;
const MMAP_THRESHOLD = 1 << 20;
// glibc's mallopt parameters (malloc.h)
const M_MMAP_THRESHOLD = -3;
const M_ARENA_MAX = -8;

// koffi is the kvmem binding's dependency: resolve it from there, wherever
// npm put it (nested under the binding or hoisted next to it)
function koffi() {
  const kvmemDir = path.dirname(require.resolve('kvmem'));
  return require(require.resolve('koffi', { paths: [kvmemDir] }));
}

let tuned = null; // what tuneMalloc() set
let libc; // undefined: not looked up yet; null: not glibc
// glibc's functions, or null where the malloc is another (musl, macOS)
function glibc() {
  if (libc !== undefined) return libc;
  libc = null;
  if (process.platform !== 'linux') return libc;
  try {
    const k = koffi();
    const lib = k.load('libc.so.6');
    lib.func('const char *gnu_get_libc_version(void)'); // glibc's own: throws elsewhere
    libc = {
      koffi: k,
      mallopt: lib.func('int mallopt(int param, int value)'),
      malloc: lib.func('void *malloc(size_t size)'),
      free: lib.func('void free(void *ptr)'),
      memset: lib.func('void *memset(void *s, int c, size_t n)'),
      mallocInfo: lib.func('int malloc_info(int options, void *stream)'),
      openMemstream: lib.func('void *open_memstream(void *ptr, void *size)'), // char **, size_t *: written up to fclose
      fclose: lib.func('int fclose(void *stream)'),
      // hblks: the blocks mapped on their own (the 5th size_t of struct mallinfo2, glibc 2.33+)
      mallinfo2: lib.func('mallinfo2', k.struct({
        arena: 'size_t', ordblks: 'size_t', smblks: 'size_t', hblks: 'size_t', hblkhd: 'size_t',
        usmblks: 'size_t', fsmblks: 'size_t', uordblks: 'size_t', fordblks: 'size_t', keepcost: 'size_t',
      }), []),
    };
  } catch {
    libc = null;
  }
  return libc;
}

// Sets what the environment does not; returns which it set ({arenaMax,
// mmapThreshold}: true set, false left to the environment), or null where
// the malloc is not glibc's. Throws if glibc refuses a setting.
function tuneMalloc(env = process.env) {
  const c = glibc();
  if (!c) return null;
  const set = tuned = { arenaMax: false, mmapThreshold: false };
  if (!env.MALLOC_ARENA_MAX) {
    if (c.mallopt(M_ARENA_MAX, ARENA_MAX) !== 1) throw new Error(`mallopt(M_ARENA_MAX, ${ARENA_MAX}) refused`);
    set.arenaMax = true;
  }
  if (!env.MALLOC_MMAP_THRESHOLD_) {
    if (c.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) !== 1) throw new Error(`mallopt(M_MMAP_THRESHOLD, ${MMAP_THRESHOLD}) refused`);
    set.mmapThreshold = true;
  }
  return set;
}

// For the tests. The arenas malloc has made (malloc_info lists one <heap>
// each), or -1 where not known.
function mallocArenas() {
  const c = glibc();
  if (!c) return -1;
  // the stream writes its buffer's address and length until fclose: they
  // must live in memory of ours, not in a call's temporaries
  const k = c.koffi;
  const bufp = k.alloc('void *', 1), lenp = k.alloc('size_t', 1);
  try {
    const f = c.openMemstream(bufp, lenp);
    if (!f) return -1;
    const ok = c.mallocInfo(0, f) === 0;
    c.fclose(f);
    const buf = k.decode(bufp, 'void *');
    const len = Number(k.decode(lenp, 'size_t'));
    const text = ok && buf && len ? k.decode(buf, 'char', len) : '';
    if (buf) c.free(buf);
    return ok ? (text.match(/<heap nr=/g) ?? []).length : -1;
  } finally {
    k.free(bufp);
    k.free(lenp);
  }
}

// For the tests. Whether a block of size bytes is mapped on its own (so free
// returns it to the system): 1, 0 (from an arena), -1 not known.
function mappedOnItsOwn(size) {
  const c = glibc();
  if (!c) return -1;
  let before;
  try { before = Number(c.mallinfo2().hblks); } catch { return -1; } // glibc before 2.33
  const p = c.malloc(size);
  if (!p) return -1;
  c.memset(p, 1, size);
  const held = Number(c.mallinfo2().hblks);
  c.free(p);
  return held > before ? 1 : 0;
}

// For /health: the arenas there are (null: not known) and what the service
// set (null: left to the environment or to the malloc's defaults).
function mallocReport() {
  const n = mallocArenas();
  return {
    arenas: n < 0 ? null : n,
    arena_max: tuned?.arenaMax ? ARENA_MAX : null,
    mmap_threshold_bytes: tuned?.mmapThreshold ? MMAP_THRESHOLD : null,
  };
}

module.exports = { tuneMalloc, mallocArenas, mappedOnItsOwn, mallocReport, ARENA_MAX, MMAP_THRESHOLD };
