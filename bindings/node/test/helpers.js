// Shared by the tests: a temp log, a ledger of refunds, a guard on it.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Guard } from '../src/index.js';

export function tmpLog(tag) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `idem-node-${tag}-`));
  return { dir, url: `sqlite:${path.join(dir, 'log.db')}`,
    file: path.join(dir, 'log.db') };
}

/** A payment provider's ledger: every refund that took effect. */
export function ledger() {
  const applied = [];
  return {
    applied,
    refund: async (args, ms = 0) => {
      if (ms) await new Promise((r) => setTimeout(r, ms));
      applied.push(args);
      return { refund_id: `rf_${applied.length}`, amount: args.amount };
    },
  };
}

export const REFUND_POLICY = {
  unknown_tools: 'refuse',
  tools: { refund: { class: 'guarded', timeout_ms: 2000 } },
};

/** The refund policy with these fields for the tool. */
export const refundPolicy = (fields) =>
  ({ tools: { refund: { class: 'guarded', ...fields } } });

export function guardOn(tag, policy = REFUND_POLICY) {
  const log = tmpLog(tag);
  return { log, guard: new Guard(log.url, { policy }) };
}

/** The environment for a process that is not node with libidem (python3,
 * the compiler): without the sanitizer build's preload. */
export function plainEnv() {
  const env = { ...process.env };
  delete env.LD_PRELOAD;
  return env;
}
