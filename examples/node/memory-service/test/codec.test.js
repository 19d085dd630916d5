'use strict';
// Request bodies: every field has one type, anything else is refused (never
// converted); the binary tensor layout decodes to the same fields as JSON.
const test = require('node:test');
const assert = require('node:assert/strict');
const codec = require('../lib/codec');
const { tensorBody } = require('../testing/harness');

const json = (o) => Buffer.from(typeof o === 'string' ? o : JSON.stringify(o));
const refused = (route, body, re, ctype) => {
  assert.throws(() => codec.decodeRequest(route, ctype, Buffer.isBuffer(body) ? body : json(body)),
    (e) => e instanceof codec.BodyError && e.httpCode === 400 && re.test(e.message), `${route} ${String(body).slice(0, 80)}`);
};

test('codec: wrong types are refused with the field named, never converted', () => {
  const k = [0.5, -1, 2];
  const cases = [
    ['append', { k: [true, false], v: k }, /append: k must be an array of numbers \(float32\): element 0 is a boolean/],
    ['append', { k: ['1', '2'], v: k }, /k must be an array of numbers.*element 0 is a string \("1"\)/],
    ['append', { k: [1, null], v: k }, /element 1 is null/],
    ['append', { k: '1,2,3', v: k }, /k must be an array of numbers \(float32\), not a string/],
    ['append', { k: null, v: k }, /k must be .* not null/],
    ['append', { k: [1e39], v: k }, /k element 0 \(1e\+39\) is not a finite float32/],
    ['append', '{"k": [1e400], "v": [1]}', /not a finite float32/],
    ['append', { k, v: k, token_ids: [1.5] }, /token_ids must be an array of 32-bit integers: element 0 is 1.5/],
    ['append', { k, v: k, token_ids: [2 ** 31] }, /element 0 is 2147483648/],
    ['append', { k, v: k, token_ids: ['7'] }, /element 0 is a string/],
    ['append', { k, v: k, positions: [-(2 ** 31) - 1] }, /positions must be an array of 32-bit integers/],
    ['append', { k, v: k, text: 5 }, /text must be a string, not a number/],
    ['append', { k, v: k, flush: 'yes' }, /flush must be true or false, not a string/],
    ['append', { k, v: k, flush: 1 }, /flush must be true or false, not a number/],
    ['append', { k, v: k, save: null }, /save must be true or false, not null/],
    ['append', { k, v: k, expect_tokens: -1 }, /expect_tokens must be an integer in \[0, \d+\], not -1/],
    ['append', { k, v: k, path: '/etc/passwd' }, /append: unknown field "path"/],
    ['append', { v: k }, /append: k is required/],
    ['append', [k, k], /append: the body must be a JSON object, not an array/],
    ['append', '{"k": [1], "v": [1]} trailing', /invalid JSON/],
    ['append', '', /append: k is required/],
    ['retrieve', { query: k, top_k: '3' }, /top_k must be an integer in \[0, 65536\], not a string \("3"\)/],
    ['retrieve', { query: k, top_k: 1.5 }, /top_k must be an integer .* not 1.5/],
    ['retrieve', { query: k, top_k: 2 ** 32 }, /top_k must be an integer .* not 4294967296/],
    ['retrieve', { query: k, gather: 'true' }, /gather must be true or false/],
    ['retrieve', { query: k, base_position: -1 }, /base_position must be an integer in \[0, 2147483647\]/],
    ['retrieve', { query: k, base_position: 2 ** 31 }, /base_position must be an integer/],
    ['retrieve', { top_k: 1 }, /retrieve: query is required/],
    ['flush', { now: true }, /flush takes no body fields \(got "now"\)/],
    ['save', { path: '/tmp/x' }, /save takes no body fields \(got "path"\)/],
    ['save', '"evil.kvm"', /save takes no body fields/],
  ];
  for (const [route, body, re] of cases) refused(route, body, re);
});

test('codec: good bodies decode to typed arrays, nothing converted', () => {
  const f = codec.decodeRequest('append', 'application/json; charset=utf-8',
    json({ k: [0.5, -1], v: [1, 2], token_ids: [-(2 ** 31), 2 ** 31 - 1], text: 'hi', flush: false, save: true, expect_tokens: 0 }));
  assert.ok(f.k instanceof Float32Array && f.token_ids instanceof Int32Array);
  assert.deepEqual(Array.from(f.k), [0.5, -1]);
  assert.deepEqual(Array.from(f.token_ids), [-(2 ** 31), 2 ** 31 - 1]);
  assert.deepEqual([f.text, f.flush, f.save, f.expect_tokens], ['hi', false, true, 0]);
  // any Content-Type but the tensor layout's is read as JSON (curl -d sends form-urlencoded)
  assert.deepEqual(codec.decodeRequest('append', 'application/x-www-form-urlencoded', json({ k: [1], v: [2] })),
    { k: Float32Array.from([1]), v: Float32Array.from([2]) });
  assert.deepEqual(codec.decodeRequest('flush', undefined, Buffer.alloc(0)), {});
  assert.deepEqual(codec.decodeRequest('save', undefined, json({})), {});
});

test('codec: the binary tensor layout gives what the same JSON gives, and its framing is checked', () => {
  const k = Float32Array.from([0.25, -3, 1e-7, 65504]), v = Float32Array.from([1, 2, 3, 4]), ids = Int32Array.from([7, -8]);
  const body = tensorBody({ text: 'ab', flush: true }, { k, v, token_ids: ids });
  const fromBin = codec.decodeRequest('append', 'application/x-kvmem-tensors', body);
  const fromJson = codec.decodeRequest('append', undefined, json({ k: Array.from(k), v: Array.from(v), token_ids: [7, -8], text: 'ab', flush: true }));
  assert.deepEqual(fromBin, fromJson);
  // inline arrays are allowed in the header too
  const mixed = tensorBody({ token_ids: [7, -8] }, { k, v });
  assert.deepEqual(Array.from(codec.decodeRequest('append', 'application/x-kvmem-tensors', mixed).token_ids), [7, -8]);

  const hdr = (h, data = Buffer.alloc(16)) => {
    const hb = Buffer.from(JSON.stringify(h));
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(hb.length));
    return Buffer.concat([len, hb, data]);
  };
  const T = 'application/x-kvmem-tensors';
  const d = (o) => ({ dtype: 'F32', shape: [4], data_offsets: [0, 16], ...o });
  refused('append', Buffer.from([1, 2, 3]), /starts with its header's length \(8 bytes\), got 3 bytes/, T);
  const huge = Buffer.alloc(16);
  huge.writeBigUInt64LE(2n ** 63n);
  refused('append', huge, /header length 9223372036854775808 exceeds the body/, T);
  refused('append', hdr([1]), /header must be a JSON object/, T);
  refused('append', hdr({ k: d({ data_offsets: [0, 32] }), v: d() }), /data_offsets must be \[BEGIN, END\] with 0 <= BEGIN <= END <= 16/, T);
  refused('append', hdr({ k: d({ data_offsets: [8, 4] }), v: d() }), /data_offsets must be/, T);
  refused('append', hdr({ k: d({ shape: [5] }), v: d() }), /data_offsets span 16 bytes, shape \[5\] needs 20/, T);
  refused('append', hdr({ k: d({ dtype: 'F16' }), v: d() }), /append: k: dtype must be "F32"/, T);
  refused('append', hdr({ k: d(), v: d(), token_ids: d() }), /token_ids: dtype must be "I32"/, T);
  refused('append', hdr({ k: d({ shape: [-4] }), v: d() }), /shape must be an array of at most 8 non-negative integers/, T);
  refused('append', hdr({ k: d({ offsets: 1 }), v: d() }), /unknown descriptor field "offsets"/, T);
  const nan = Buffer.alloc(16);
  nan.writeFloatLE(NaN, 4);
  refused('append', hdr({ k: d(), v: d() }, nan), /k element 1 \(NaN\) is not a finite float32/, T);
  // a descriptor is a tensor only in the binary layout
  refused('append', json({ k: d(), v: d() }), /k must be an array of numbers \(float32\), not a object/);
});

test('codec: the answer layout round-trips its tensors, and the size bound covers JSON', () => {
  const out = { blocks: [{ block: 0, token_ids: [1, 2] }], gathered: { shape: [1, 2, 1, 2], k: Float32Array.from([1, -2, 3.5, 4]), v: Float32Array.from([5, 6, 7, -8e-30]) } };
  const buf = Buffer.concat(codec.tensorChunks(out));
  const n = Number(buf.readBigUInt64LE(0));
  const h = JSON.parse(buf.toString('utf8', 8, 8 + n));
  assert.deepEqual(h.blocks, out.blocks);
  const at = (o) => new Float32Array(buf.buffer.slice(buf.byteOffset + 8 + n + o.data_offsets[0], buf.byteOffset + 8 + n + o.data_offsets[1]));
  assert.deepEqual(at(h.gathered.k), out.gathered.k);
  assert.deepEqual(at(h.gathered.v), out.gathered.v);
  // the JSON bound: the longest float32 printed as a double, with its comma
  const worst = Float32Array.from({ length: 1000 }, (_, i) => -Math.fround(1.2345678e-38 * (i + 1.1)));
  assert.ok(codec.jsonBytes({ blocks: [], gathered: { shape: [], k: worst, v: worst } }).length <= codec.responseBound(false, 2000, 0, 0));
});

test('codec pool: background threads run at nice 10, foreground ones at the service\'s priority, and each kind gets its own work', { skip: process.platform !== 'linux' && 'skipped: per-thread priorities are set on Linux only' }, async () => {
  const os = require('node:os');
  const { CodecPool } = require('../lib/codec-pool');
  const pool = new CodecPool(2, { inlineBytes: 16, nForeground: 1 });
  try {
    await pool.start();
    const own = os.getPriority(0);
    const prios = (await pool.priorities()).map((p) => `${p.background ? 'bg' : 'fg'} ${p.priority}`).sort();
    assert.deepEqual(prios, [`bg ${Math.max(own, 10)}`, `bg ${Math.max(own, 10)}`, `fg ${own}`]);
    // a large body decoded as foreground work goes to the foreground thread
    const body = Buffer.from(JSON.stringify({ query: Array.from({ length: 64 }, (_, i) => i / 8) }));
    const jobs = () => pool.workers.map((w) => `${w.background ? 'bg' : 'fg'} ${w.jobs}`).sort();
    const fg = pool.decode('retrieve', 'application/json', body, false);
    assert.deepEqual(jobs(), ['bg 0', 'bg 0', 'fg 1']);
    assert.equal((await fg).query.length, 64);
    const bg = pool.decode('retrieve', 'application/json', Buffer.from(body), true);
    assert.deepEqual(jobs(), ['bg 0', 'bg 1', 'fg 0']);
    assert.equal((await bg).query.length, 64);
  } finally {
    pool.close();
  }
});

test('codec pool: a body in the chunks it arrived in decodes as the whole body, the chunks moved to the thread, not copied', async () => {
  const { CodecPool } = require('../lib/codec-pool');
  const pool = new CodecPool(1, { inlineBytes: 1024, nForeground: 1 });
  try {
    await pool.start();
    const k = Float32Array.from({ length: 3000 }, (_, i) => Math.fround(Math.sin(i) * 3)), v = k.map((x) => -x);
    const bodies = {
      [codec.CT_TENSORS]: Buffer.concat(codec.tensorChunks({ k, v, flush: true })),
      [codec.CT_JSON]: Buffer.from(JSON.stringify({ k: Array.from(k), v: Array.from(v), flush: true })),
    };
    for (const [ctype, whole] of Object.entries(bodies)) {
      const want = codec.decodeRequest('append', ctype, whole);
      // cut at odd places (inside a header, a float, a number): standalone chunks, as the
      // HTTP parser hands them over, and one view into a larger buffer (copied, not moved)
      const cuts = [0, 5, 4099, 9001, 9002, whole.length];
      const alone = (b) => { const ab = new ArrayBuffer(b.length); new Uint8Array(ab).set(b); return Buffer.from(ab); };
      const chunks = cuts.slice(1).map((end, i) => alone(whole.subarray(cuts[i], end)));
      const shared = Buffer.concat([Buffer.alloc(3), chunks[2], Buffer.alloc(3)]);
      chunks[2] = shared.subarray(3, 3 + chunks[2].length);
      for (const background of [true, false]) {
        const parts = chunks.map((c) => (c === chunks[2] ? c : alone(c)));
        const got = await pool.decode('append', ctype, parts, background);
        assert.deepEqual(got, want, `${ctype}, background ${background}`);
        // the standalone chunks went to the thread (detached here); the view's buffer stayed
        assert.deepEqual(parts.map((c) => c.buffer.byteLength === 0), [true, true, false, true, true]);
      }
      // small bodies in chunks decode on the calling thread
      const small = Buffer.from(JSON.stringify({ k: [1, 2], v: [3, 4] }));
      assert.deepEqual(await pool.decode('append', codec.CT_JSON, [small.subarray(0, 7), small.subarray(7)], true),
        codec.decodeRequest('append', codec.CT_JSON, small));
    }
  } finally {
    pool.close();
  }
});
