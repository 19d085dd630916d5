"""An independent safetensors reader (standard library only) that checks the
files st_writer.c made: layout per the safetensors spec, the XXH64 checksum,
and every tensor decoded by its documented rule against the closed-form KV.
Reads format version 2 (quantized tensors block-major, one AABB tensor in f16
rounded outward) and version 1 (per-layer, per-head tensors, f32 AABBs)."""
import json
import re
import math
import struct
import sys
import os

M64 = (1 << 64) - 1
P1, P2, P3, P4, P5 = (11400714785074694791, 14029467366897019727, 1609587929392839161,
                      9650029242287828579, 2870177450012600261)


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def rnd(acc, x):
    return (rotl((acc + x * P2) & M64, 31) * P1) & M64


def xxh64(data, seed=0):
    n = len(data)
    i = 0
    if n >= 32:
        v = [(seed + P1 + P2) & M64, (seed + P2) & M64, seed, (seed - P1) & M64]
        while i + 32 <= n:
            for j in range(4):
                v[j] = rnd(v[j], struct.unpack_from('<Q', data, i + 8 * j)[0])
            i += 32
        acc = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M64
        for j in range(4):
            acc = ((acc ^ rnd(0, v[j])) * P1 + P4) & M64
    else:
        acc = (seed + P5) & M64
    acc = (acc + n) & M64
    while i + 8 <= n:
        acc = (rotl(acc ^ rnd(0, struct.unpack_from('<Q', data, i)[0]), 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        acc = (rotl(acc ^ ((struct.unpack_from('<I', data, i)[0] * P1) & M64), 23) * P2 + P3) & M64
        i += 4
    while i < n:
        acc = (rotl(acc ^ ((data[i] * P5) & M64), 11) * P1) & M64
        i += 1
    acc ^= acc >> 33
    acc = (acc * P2) & M64
    acc ^= acc >> 29
    acc = (acc * P3) & M64
    acc ^= acc >> 32
    return acc


def kval(which, l, t, h, d):
    x = 0.1 * (l * 1000 + t * 37 + h * 11 + d)
    return math.cos(x) * 1.5 if which else math.sin(x) * 2.0 + 0.01 * d


ACC_KEYS = [0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
            0x27D4EB2F165667C5, 0x94D049BB133111EB, 0xBF58476D1CE4E5B9, 0xD6E8FEB86659FD93]


def acc64(data):
    # eight lanes; per 64-byte stripe: acc[i] += lo32(d^K[i]) * hi32(d^K[i]); acc[i^1] += d
    n = len(data)
    acc = [k ^ n for k in ACC_KEYS]
    padded = data + b'\0' * ((-n) % 64)
    for s in range(0, len(padded), 64):
        d = struct.unpack_from('<8Q', padded, s)
        for i in range(8):
            v = d[i] ^ ACC_KEYS[i]
            acc[i ^ 1] = (acc[i ^ 1] + d[i]) & M64
            acc[i] = (acc[i] + (v & 0xffffffff) * (v >> 32)) & M64
    h = (n * P1) & M64
    for i in range(8):
        h ^= (rotl((acc[i] * P2) & M64, 31) * P1) & M64
        h = (rotl(h, 27) * P1 + P4) & M64
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    h ^= h >> 32
    return h


SIZES = {'F32': 4, 'F16': 2, 'BF16': 2, 'U32': 4, 'I8': 1}


def decode(dtype, raw):
    if dtype == 'F32':
        return list(struct.unpack('<%df' % (len(raw) // 4), raw))
    if dtype == 'F16':
        return list(struct.unpack('<%de' % (len(raw) // 2), raw))
    if dtype == 'BF16':
        hs = struct.unpack('<%dH' % (len(raw) // 2), raw)
        return [struct.unpack('<f', struct.pack('<I', h << 16))[0] for h in hs]
    if dtype == 'U32':
        return list(struct.unpack('<%dI' % (len(raw) // 4), raw))
    if dtype == 'I8':
        return list(struct.unpack('<%db' % len(raw), raw))
    raise ValueError(dtype)


def f32(x):
    """x rounded to f32, as the writer's floats are."""
    return struct.unpack('<f', struct.pack('<f', x))[0]


def f16_bits_value(h):
    return struct.unpack('<e', struct.pack('<H', h))[0]


def f16_directed(x, up):
    """The nearest f16 value at or above (up) / at or below x: round to
    nearest with struct's 'e' format, then step one f16 ulp if that went the
    wrong way (f16 bit patterns are ordered by magnitude within a sign)."""
    h = struct.unpack('<H', struct.pack('<e', x))[0]
    v = f16_bits_value(h)
    if (up and v >= x) or (not up and v <= x):
        return v
    neg = h & 0x8000
    if h & 0x7fff == 0:
        h = 0x0001 if up else 0x8001
    elif up != bool(neg):
        h += 1
    else:
        h -= 1
    return f16_bits_value(h)


def fail(msg):
    print('FAIL: ' + msg)
    sys.exit(1)


def check(path):
    blob = open(path, 'rb').read()
    (hl,) = struct.unpack_from('<Q', blob, 0)
    header = json.loads(blob[8:8 + hl].decode('utf-8'))
    data = blob[8 + hl:]
    meta = header.pop('__metadata__')
    if not all(isinstance(v, str) for v in meta.values()):
        fail('metadata values must be strings')
    # offsets tile the data section (the safetensors rule)
    spans = sorted((t['data_offsets'][0], t['data_offsets'][1], name) for name, t in header.items())
    pos = 0
    for b, e, name in spans:
        if b != pos:
            fail('%s: tensor %s starts at %d, expected %d' % (path, name, b, pos))
        n = 1
        for s in header[name]['shape']:
            n *= s
        if e - b != n * SIZES[header[name]['dtype']]:
            fail('%s: %s size' % (path, name))
        pos = e
    if pos != len(data):
        fail('data section size')
    # the data section starts 8-byte aligned, and the first KV tensor on a
    # page wherever its offset in the section is a multiple of 8 (load speed)
    if (8 + hl) % 8:
        fail('%s: data section at %d, not 8-byte aligned' % (path, 8 + hl))
    kv = [b for b, e, name in spans if re.fullmatch(r'layer_\d+_[kv]|[kv]_(weights|scales|biases)', name)]
    if kv and kv[0] % 8 == 0 and (8 + hl + kv[0]) % 4096:
        fail('%s: first KV tensor at file offset %d, not on a 4096-byte page' % (path, 8 + hl + kv[0]))
    # XXH64 over the little-endian acc64 digests of consecutive 1 MiB chunks
    digests = b''.join(struct.pack('<Q', acc64(data[c:c + (1 << 20)])) for c in range(0, len(data), 1 << 20))
    want = 'acc64-1m:%016x' % xxh64(digests)
    if meta['checksum'] != want:
        fail('%s: checksum %s != %s' % (path, meta['checksum'], want))
    t_of = {}

    def tensor(name):
        t = header[name]
        b, e = t['data_offsets']
        return t['shape'], decode(t['dtype'], data[b:e])

    dt = meta['storage_dtype']
    bs = int(meta['block_size'])
    blocks = [int(x) for x in meta['block_tokens'].split(',')] if meta['block_tokens'] else []
    ntok = int(meta['n_tokens'])
    ts = sum(blocks)
    spec = dict(kv.split('=') for kv in meta['model_spec'].split(';'))
    L, H, D = int(spec['n_layers']), int(spec['n_kv_heads']), int(spec['head_dim'])
    ids = [int(x) for x in meta['token_ids'].split(',')]
    if ids != [500 + 3 * t for t in range(ntok)]:
        fail('token ids')
    if meta['text'] != 'r\u00e9sum\u00e9 of a "quoted"\ttext\n with \u20ac and more words here':
        fail('text %r' % meta['text'])
    if meta['token_text_offsets'] != ','.join(['-1'] * ntok):
        fail('offsets')
    version = int(meta['format_version'])
    if version not in (1, 2):
        fail('%s: format_version %d' % (path, version))
    block_of = []
    for b, n in enumerate(blocks):
        block_of += [b] * n
    firsts = [sum(blocks[:b]) for b in range(len(blocks))]
    worst = 0.0
    if version == 2 and dt in ('q8', 'q4', 'q4_kivi'):
        # one row per (block, layer, head, token), block after block
        qt = {}
        for kv in ('k', 'v'):
            for part in ('weights', 'scales') + (() if dt == 'q8' else ('biases',)):
                qt[kv + '_' + part] = tensor(kv + '_' + part)
        if qt['k_weights'][0] != [L * H * ts, D if dt == 'q8' else (D + 7) // 8]:
            fail('%s: k_weights shape %r' % (path, qt['k_weights'][0]))

        def qrow(b, l, h, t):  # row of token t of block b
            return firsts[b] * L * H + (l * H + h) * blocks[b] + (t - firsts[b])
    for l in range(L):
        for which, kv in ((0, 'k'), (1, 'v')):
            base = 'layer_%d_%s' % (l, kv)
            if dt in ('f32', 'f16', 'bf16'):
                shape, x = tensor(base)
                tol = {'f32': 1e-6, 'f16': 2.0 ** -11 * 4, 'bf16': 2.0 ** -8 * 4}[dt]
                for h in range(H):
                    for t in range(ts):
                        for d in range(D):
                            want = kval(which, l, t, h, d)
                            got = x[(h * ts + t) * D + d]
                            if abs(got - want) > tol * max(1.0, abs(want)):
                                fail('%s %s h%d t%d d%d: %g vs %g' % (path, base, h, t, d, got, want))
            elif dt == 'q8':
                G = (D + 31) // 32
                if version == 1:
                    _, q = tensor(base + '_weights')
                    _, sc = tensor(base + '_scales')
                    row = lambda h, t: h * ts + t
                else:
                    q, sc = qt[kv + '_weights'][1], qt[kv + '_scales'][1]
                    row = lambda h, t: qrow(block_of[t], l, h, t)
                for h in range(H):
                    for t in range(ts):
                        for d in range(D):
                            s = sc[row(h, t) * G + d // 32]
                            got = q[row(h, t) * D + d] * s
                            want = kval(which, l, t, h, d)
                            err = abs(got - want)
                            worst = max(worst, err / max(s, 1e-12))
                            if err > s / 2 + 1e-5:
                                fail('%s q8 %s: err %g > s/2 %g' % (path, base, err, s / 2))
            else:
                W = (D + 7) // 8
                G = (D + 63) // 64
                chan = dt == 'q4_kivi' and which == 0
                if version == 1:
                    _, w = tensor(base + '_weights')
                    _, sc = tensor(base + '_scales')
                    _, bi = tensor(base + '_biases')
                    row = lambda h, t: h * ts + t
                    crow = lambda h, t: h * len(blocks) + block_of[t]
                else:
                    w, sc, bi = qt[kv + '_weights'][1], qt[kv + '_scales'][1], qt[kv + '_biases'][1]
                    row = lambda h, t: qrow(block_of[t], l, h, t)
                    crow = lambda h, t: (block_of[t] * L + l) * H + h
                for h in range(H):
                    for t in range(ts):
                        for d in range(D):
                            code = (w[row(h, t) * W + d // 8] >> (4 * (d % 8))) & 15  # MLX: low bits first
                            if chan:
                                g = crow(h, t) * D + d
                            else:
                                g = row(h, t) * G + d // 64
                            got = code * sc[g] + bi[g]
                            want = kval(which, l, t, h, d)
                            err = abs(got - want)
                            if err > sc[g] / 2 + 1e-5:
                                fail('%s q4 %s h%d t%d d%d: err %g > s/2 %g' % (path, base, h, t, d, err, sc[g] / 2))
            tail = ntok - ts
            if tail:
                shape, x = tensor(base + '_tail')
                if shape != [H, tail, D]:
                    fail('tail shape')
                for h in range(H):
                    for t in range(tail):
                        for d in range(D):
                            if abs(x[(h * tail + t) * D + d] - kval(which, l, ts + t, h, d)) > 1e-6:
                                fail('tail value')
        if version == 1:
            _, mn = tensor('layer_%d_aabb_min' % l)
            _, mx = tensor('layer_%d_aabb_max' % l)
            box_at = lambda b, h, d, hi: (b * H + h) * D + d
        else:
            shape, box = tensor('aabb')  # [blocks][L][H][s_max, s_min][D]
            if shape != [len(blocks), L, H, 2, D]:
                fail('%s: aabb shape %r' % (path, shape))
            want = 'F32' if dt in ('f32', 'bf16') else 'F16'
            if header['aabb']['dtype'] != want:
                fail('%s: aabb dtype %s, expected %s' % (path, header['aabb']['dtype'], want))
            mn = mx = box
            box_at = lambda b, h, d, hi: (((b * L + l) * H + h) * 2 + (0 if hi else 1)) * D + d
        first = 0
        for b, n in enumerate(blocks):
            for h in range(H):
                for d in range(D):
                    ks = [f32(kval(0, l, t, h, d)) for t in range(first, first + n)]
                    lo, hi = mn[box_at(b, h, d, False)], mx[box_at(b, h, d, True)]
                    if not (lo <= min(ks) and max(ks) <= hi):  # the bound: every key inside its box
                        fail('%s: aabb l%d b%d h%d d%d: [%r, %r] does not hold the keys' % (path, l, b, h, d, lo, hi))
                    if version == 2 and dt not in ('f32', 'bf16'):  # f16, rounded outward and tight
                        ok = lo == f16_directed(min(ks), False) and hi == f16_directed(max(ks), True)
                    else:
                        ok = lo == min(ks) and hi == max(ks)
                    if not ok:
                        fail('%s: aabb l%d b%d h%d d%d: [%r, %r] for keys in [%r, %r]' % (path, l, b, h, d, lo, hi,
                                                                                         min(ks), max(ks)))
            first += n
    print('ok %s: %s, %d tokens in %d blocks + %d tail, %d tensors' % (os.path.basename(path), dt, ntok, len(blocks),
                                                                       ntok - ts, len(header)))


if __name__ == '__main__':
    files = sys.argv[1:]
    if len(files) != 6:
        fail('expected 6 files, got %d' % len(files))
    for f in files:
        check(f)
