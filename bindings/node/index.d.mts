// Type declarations for `import ... from 'kvmem'` (index.mjs): the names of
// index.d.ts, and the whole module as the default export.
export * from './index.js';
import * as kvmem from './index.js';
export default kvmem;
