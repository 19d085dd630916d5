'use strict';
// Ids and paths on their way to C, checked before any call. C reads a string
// up to its first NUL, so agentOpen('alice\0-evil') would open agent 'alice'
// and save('a.kvm\0.bak') would write 'a.kvm': a NUL is refused with
// InvalidArgumentError. Anything but a string is a TypeError: koffi would
// hand a Buffer over as a pointer with no terminating NUL, and C would read
// past its end.
const { fileURLToPath } = require('node:url');
const errors = require('./errors');

const kind = (v) => (v === null ? 'null' : Array.isArray(v) ? 'an array' : v?.constructor?.name ?? typeof v);

// an id or name (agent id, segment name, owner, session id, backend, model id)
function cId(v, what) {
  if (typeof v !== 'string') throw new TypeError(`kvmem: ${what} must be a string, not ${kind(v)}`);
  if (v.includes('\0')) throw new errors.InvalidArgumentError(`${what} ${JSON.stringify(v)} contains a NUL character`);
  return v;
}

// a file path: a string or a file: URL (as node:fs takes them); null and
// undefined stay null (the pool's store)
function cPath(v, what = 'path') {
  if (v === null || v === undefined) return null;
  if (v instanceof URL) v = fileURLToPath(v); // refuses other schemes and encoded NULs
  if (typeof v !== 'string') throw new TypeError(`kvmem: ${what} must be a string or a file: URL, not ${kind(v)}`);
  if (v.includes('\0')) throw new errors.InvalidArgumentError(`${what} ${JSON.stringify(v)} contains a NUL character`);
  return v;
}

module.exports = { cId, cPath };
