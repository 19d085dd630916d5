'use strict';
// One Error subclass per kvmem_status, all deriving from KvmemError.
// `status` is the C code, `code` its C name, `message` kvmem_last_error().
class KvmemError extends Error {
  constructor(message, status = -14, code = 'KVMEM_ERR_INTERNAL') {
    super(message);
    this.name = new.target.name;
    this.status = status;
    this.code = code;
  }
}

const TABLE = [
  [-1, 'KVMEM_ERR_INVALID_ARG', 'InvalidArgumentError'],
  [-2, 'KVMEM_ERR_NOMEM', 'NoMemoryError'],
  [-3, 'KVMEM_ERR_CAPACITY', 'CapacityError'],
  [-4, 'KVMEM_ERR_NOT_FOUND', 'NotFoundError'],
  [-5, 'KVMEM_ERR_EXISTS', 'ExistsError'],
  [-6, 'KVMEM_ERR_CLOSED', 'ClosedError'],
  [-7, 'KVMEM_ERR_UNSUPPORTED', 'UnsupportedError'],
  [-8, 'KVMEM_ERR_BACKEND', 'BackendError'],
  [-9, 'KVMEM_ERR_IO', 'IOError'],
  [-10, 'KVMEM_ERR_FORMAT', 'FormatError'],
  [-11, 'KVMEM_ERR_CORRUPT', 'CorruptError'],
  [-12, 'KVMEM_ERR_MISMATCH', 'MismatchError'],
  [-13, 'KVMEM_ERR_CONFLICT', 'ConflictError'],
  [-14, 'KVMEM_ERR_INTERNAL', 'InternalError'],
  [-15, 'KVMEM_ERR_BUSY', 'BusyError'],
];

const classes = { KvmemError };
const byStatus = new Map();
for (const [status, code, name] of TABLE) {
  // a named class per status, so `err instanceof kvmem.BusyError` works
  const cls = { [name]: class extends KvmemError {
    constructor(message, st = status, c = code) { super(message, st, c); }
  } }[name];
  cls.status = status;
  cls.code = code;
  classes[name] = cls;
  byStatus.set(status, cls);
}

function errorFor(status, message, code) {
  const cls = byStatus.get(status);
  return cls ? new cls(message, status, code) : new KvmemError(message, status, code);
}

module.exports = { ...classes, errorFor };
