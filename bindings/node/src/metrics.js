// This process's counters (idem_metrics_read): what every guard of the
// process has done since it started - what the attempt log cannot know, a
// replay writes nothing.  docs/CONSOLE.md names each one.
import { lib, LATENCY_BUCKETS } from './lib.js';
import { errorFor } from './errors.js';

const ANSWERS = ['succeeded', 'failed', 'outcome_unknown', 'already_applied',
  'conflict', 'in_progress', 'refused', 'invalid_arguments'];
const CHECKS = ['applied', 'rejected', 'not_applied', 'unknown'];

/** {answers: {succeeded, ...}, replays, fenced, coalesced, attempts, late,
 * checks: {applied, ...}, resolved, latency: {buckets: [[leSeconds,
 * cumulative], ...], count, sumSeconds}} */
export function processMetrics() {
  const L = lib();
  const out = { size: L.metricsSize };
  const rc = L.metrics_read(out);
  if (rc) throw errorFor(rc, 'idem_metrics_read: the library is older ' +
    'than this binding');
  const buckets = [];
  for (let i = 0; i < LATENCY_BUCKETS; i++) {
    const bound = Number(L.latency_bound_us(i));
    if (bound < 0) break;
    buckets.push([bound / 1e6, Number(out.latency_le[i])]);
  }
  const n = (v) => Number(v);
  return {
    answers: Object.fromEntries(ANSWERS.map((a, i) =>
      [a, n(out.answers[i + 1])])),
    replays: n(out.replays), fenced: n(out.fenced),
    coalesced: n(out.coalesced), attempts: n(out.attempts),
    late: n(out.late),
    checks: Object.fromEntries(CHECKS.map((c, i) =>
      [c, n(out.checks[i + 1])])),
    resolved: n(out.resolved),
    latency: { buckets, count: n(out.latency_count),
      sumSeconds: n(out.latency_sum_us) / 1e6 },
  };
}
