// idem for TypeScript harnesses: guarded tool calls take effect at most
// once.  See README.md.
export { Guard, Tool, currentKey } from './guard.js';
export { withIdem, idemModel } from './adapters.js';
export * from './errors.js';
export { processMetrics } from './metrics.js';
