'use strict';
// Integers on their way to C, refused (never wrapped). koffi converts a JavaScript
// number to a C integer by truncating and wrapping: topK 2**32, 2**40 or NaN became
// INT32_MIN, 1.5 became 1, a token id 2**40 or 'x' became 0. Every integer
// argument of a declared C function and every integer field of a struct handed to
// C passes through checkInt first (lib.js, guarded): a non-integer or an integer
// outside the C type's range is an InvalidArgumentError naming the argument (its
// camelCase name) and the range. BigInts in range are taken.
const errors = require('./errors');

// koffi primitive -> [lo, hi, C name]
const RANGES = {};
for (const bits of [8, 16, 32, 64]) {
  RANGES[`Int${bits}`] = [-(2n ** BigInt(bits - 1)), 2n ** BigInt(bits - 1) - 1n, `int${bits}`];
  RANGES[`UInt${bits}`] = [0n, 2n ** BigInt(bits) - 1n, `uint${bits}`];
}

const kind = (v) => (v === null ? 'null' : Array.isArray(v) ? 'an array' : typeof v);

// v as koffi should receive it, or an InvalidArgumentError naming `what`
function checkInt(v, what, prim) {
  const [lo, hi, name] = RANGES[prim];
  if (typeof v === 'number') {
    if (!Number.isInteger(v)) throw new errors.InvalidArgumentError(`${what} must be an integer (${name}), not ${v}`);
  } else if (typeof v !== 'bigint') {
    throw new errors.InvalidArgumentError(`${what} must be an integer (${name}), not ${kind(v)}` +
                                          (typeof v === 'string' ? ` '${v}'` : ''));
  }
  // numbers and bigints compare exactly with each other
  if (v < lo || v > hi) throw new errors.InvalidArgumentError(`${what} = ${v} is outside the range of ${name} [${lo}, ${hi}]`);
  return typeof v === 'bigint' && hi <= 2n ** 32n ? Number(v) : v;
}

const isInt = (prim) => prim in RANGES;

// A new typed array of `Ctor` (Int32Array, Uint8Array, BigUint64Array, ...) holding
// the values of x (any iterable), each checked; an array of that type is used as it is.
function intArray(x, Ctor, prim, what) {
  if (x instanceof Ctor) return x;
  const vals = Array.from(x);
  const big = Ctor === BigInt64Array || Ctor === BigUint64Array;
  const out = new Ctor(vals.length);
  vals.forEach((v, i) => { const c = checkInt(v, `${what}[${i}]`, prim); out[i] = big ? BigInt(c) : Number(c); });
  return out;
}

module.exports = { checkInt, isInt, intArray, RANGES };
