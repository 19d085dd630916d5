'use strict';
// The service's settings, read from the environment and checked: a value that
// is not what its variable takes stops the service at startup with a message
// naming the variable (never a silent default or a coerced NaN).
const os = require('node:os');

class ConfigError extends Error {}

const UNITS = { '': 1, K: 1024, M: 1024 ** 2, G: 1024 ** 3 };

// "123", "64K", "512M", "2G" (powers of 1024)
function size(env, name, def, min, max = Number.MAX_SAFE_INTEGER) {
  const s = env[name];
  if (s === undefined || s === '') return def;
  const m = /^([0-9]+)([KMG]?)(?:i?B)?$/i.exec(s.trim());
  const v = m ? Number(m[1]) * UNITS[m[2].toUpperCase()] : NaN;
  if (!Number.isSafeInteger(v) || v < min || v > max)
    throw new ConfigError(`${name}=${JSON.stringify(s)}: expected a byte count in [${min}, ${max}] (digits, optionally K, M or G)`);
  return v;
}

function int(env, name, def, min, max) {
  const s = env[name];
  if (s === undefined || s === '') return def;
  const v = /^-?[0-9]+$/.test(s.trim()) ? Number(s.trim()) : NaN;
  if (!Number.isSafeInteger(v) || v < min || v > max)
    throw new ConfigError(`${name}=${JSON.stringify(s)}: expected an integer in [${min}, ${max}]`);
  return v;
}

// Memory the service keeps outside the pool, counted against the budget: the
// runtime itself (the main thread and the JSON codec threads, measured idle
// at 60-90 MB RSS), and per request at work its body, the decoded arrays
// and the answer. A JSON body of one-digit numbers ("0,") holds a number
// every 2 bytes, an 8-byte double each while parsed (twice that while V8
// grows the array): up to 8 x the body, plus its text and the float32 copy.
const RUNTIME_BYTES = 128 * 1024 ** 2;
const perRequestBytes = (c) => 10 * c.maxBodyBytes + 3 * c.maxResponseBytes;

function loadConfig(env = process.env) {
  const cpus = Math.max(1, os.availableParallelism ? os.availableParallelism() : os.cpus().length);
  const c = {
    host: env.HOST ?? '127.0.0.1',
    port: int(env, 'PORT', 8080, 0, 65535),
    spec: {
      nLayers: int(env, 'KVMEM_LAYERS', 2, 1, 1024), nQHeads: int(env, 'KVMEM_Q_HEADS', 4, 1, 1024),
      nKvHeads: int(env, 'KVMEM_KV_HEADS', 2, 1, 1024), headDim: int(env, 'KVMEM_HEAD_DIM', 64, 2, 4096),
      modelId: 'memory-service',
    },
    blockSize: int(env, 'KVMEM_BLOCK_SIZE', 16, 1, 4096),
    store: null,
    budgetBytes: size(env, 'KVMEM_MEMORY_BUDGET', 1024 ** 3, 1),
    maxBodyBytes: size(env, 'KVMEM_MAX_BODY_BYTES', 8 * 1024 ** 2, 1024, 1024 ** 3),
    maxResponseBytes: size(env, 'KVMEM_MAX_RESPONSE_BYTES', 8 * 1024 ** 2, 1024, 1024 ** 3),
    maxAgentTokens: int(env, 'KVMEM_MAX_AGENT_TOKENS', 65536, 1, 2 ** 31 - 1),
    // one more request at work than cores, and one client holds at most all
    // cores but one: a newcomer finds a free slot and a core to run on
    workers: int(env, 'KVMEM_WORKERS', cpus + 1, 1, 1024),
    clientRunning: 0,
    clientQueue: int(env, 'KVMEM_CLIENT_QUEUE', 64, 1, 1 << 20),
    clientHeader: (env.KVMEM_CLIENT_HEADER ?? '').trim().toLowerCase() || null,
    accessLog: env.KVMEM_ACCESS_LOG ?? '-',
    shutdownMs: int(env, 'KVMEM_SHUTDOWN_TIMEOUT_MS', 30000, 0, 24 * 3600 * 1000),
  };
  c.clientRunning = int(env, 'KVMEM_CLIENT_RUNNING', Math.max(1, Math.min(c.workers - 1, cpus - 1)), 1, c.workers);
  if (c.clientHeader !== null && !/^[a-z0-9-]+$/.test(c.clientHeader))
    throw new ConfigError(`KVMEM_CLIENT_HEADER=${JSON.stringify(env.KVMEM_CLIENT_HEADER)}: expected a header name`);
  // KVMEM_STORE: a directory or a redis:// / unix:// URL; KVMEM_STORE_DIR, its older name
  const store = env.KVMEM_STORE || null, storeDir = env.KVMEM_STORE_DIR || null;
  if (store && storeDir && store !== storeDir)
    throw new ConfigError('KVMEM_STORE and KVMEM_STORE_DIR name different stores: set one');
  c.store = store ?? storeDir;
  c.poolCapacityBytes = c.budgetBytes - RUNTIME_BYTES - c.workers * perRequestBytes(c);
  if (c.poolCapacityBytes < 16 * 1024 ** 2)
    throw new ConfigError(`KVMEM_MEMORY_BUDGET=${c.budgetBytes} bytes leaves ${c.poolCapacityBytes} for agents (under 16 MiB): `
      + `the runtime takes ${RUNTIME_BYTES} and each of the ${c.workers} requests at work up to ${perRequestBytes(c)} `
      + '(10 x KVMEM_MAX_BODY_BYTES + 3 x KVMEM_MAX_RESPONSE_BYTES); raise the budget or lower the limits');
  return c;
}

module.exports = { loadConfig, ConfigError, RUNTIME_BYTES, perRequestBytes };
