// GET /metrics of idem serve, parsed by parse-prometheus-text-format, against
// the log read independently (`idem ls --json`, `idem ls --in-doubt
// --json`, `idem stats --json`), on the story of lib.mjs.
//   node tests/console/metrics_test.mjs IDEM_BINARY [LOG_URL]
// (CTest: console_metrics.)  Needs tests/console/node_modules (npm ci).
//
// The metrics, Prometheus text format 0.0.4.  From the log, at each scrape
// (gauges: idem gc deletes records, so these sums may go down):
//   idem_actions{tool,state,resolution}   records
//   idem_in_doubt                         actions waiting for a verdict
//                                         (idem ls --in-doubt)
//   idem_in_doubt_oldest_age_seconds      the age of the oldest of them,
//                                         since created (0: none)
//   idem_log_attempts{tool}               their attempts, summed
//   idem_log_status_checks{tool}          status checks run on them
//   idem_log_late_results{tool}           settled by a late result
//   idem_log_deduplicated{tool}           answered as another's repeat
//   idem_log_operator_verdicts{tool}      settled by an operator
// Of the serving process (counters; its verdicts are its guard's calls):
//   idem_process_answers_total{answer}, idem_process_replays_total,
//   idem_process_fenced_total, idem_process_coalesced_total,
//   idem_process_attempts_total, idem_process_late_results_total,
//   idem_process_verdicts_total, idem_process_status_checks_total{answer}
//   idem_guard_latency_seconds            histogram (cumulative buckets)
// And the JSON API against the same log: /api/record's fields, and the
// pages of /api/session, /api/records and /api/doubt (limit, after) in the
// log's order.
import {
  Api, Story, eq, logUrl, ok, peers, run, serve, summary, tempDir,
} from './lib.mjs';

const [idem, given] = process.argv.slice(2);
if (!idem) {
  console.error('usage: metrics_test.mjs IDEM_BINARY [LOG_URL]');
  process.exit(2);
}
const [parse] = await peers('parse-prometheus-text-format');
const dir = tempDir();
const story = new Story(idem, dir, logUrl(dir, given));
await story.fill();

async function lines(args) {
  const r = await run(idem, [...args, '--log', story.log]);
  eq(r.code, 0, `idem ${args.join(' ')}: exit (${r.err.trim()})`);
  return r.out.split('\n').filter((l) => l).map((l) => JSON.parse(l));
}

// name -> family; one sample's value by labels
function families(textBody) {
  const m = new Map();
  for (const f of parse(textBody)) m.set(f.name, f);
  return m;
}
function value(fams, name, labels = {}) {
  const f = fams.get(name);
  if (!f) return undefined;
  const want = JSON.stringify(Object.entries(labels).sort());
  const s = f.metrics.find((x) =>
    JSON.stringify(Object.entries(x.labels || {}).sort()) === want);
  return s === undefined ? undefined : Number(s.value);
}

const srv = await serve(idem, ['--log', story.log, '--policy', story.policy]);
const api = new Api(srv.url, srv.token);

// One scrape checked against the log as read by idem ls / stats.
async function scrape(when) {
  const t0 = Date.now();
  const r = await fetch(srv.url + 'metrics');
  const body = await r.text();
  const t1 = Date.now();
  eq(r.status, 200, `${when}: GET /metrics`);
  ok(/^text\/plain/.test(r.headers.get('content-type') || '') &&
     (r.headers.get('content-type') || '').includes('version=0.0.4'),
  `${when}: text/plain; version=0.0.4`, r.headers.get('content-type'));
  ok((r.headers.get('content-security-policy') || '')
    .includes("default-src 'none'"), `${when}: the CSP header`);
  let fams;
  try {
    fams = families(body);
  } catch (e) {
    ok(false, `${when}: /metrics parses: ${e}`, body);
    return null;
  }
  const recs = await lines(['ls', '--json']);
  const doubt = await lines(['ls', '--in-doubt', '--json']);
  const stats = (await lines(['stats', '--json']))[0];

  // idem_actions{tool,state,resolution}: every group of the log, and no
  // other non-zero
  const group = (rows, f) => {
    const o = {};
    for (const x of rows) {
      const [k, n] = f(x);
      if (n !== 0) o[k] = (o[k] || 0) + n;
    }
    return Object.entries(o).sort();
  };
  const fam = fams.get('idem_actions');
  ok(fam && fam.type === 'GAUGE', `${when}: idem_actions is a gauge`,
    fam && fam.type);
  const samples = fam ? fam.metrics : [];
  eq(group(samples, (x) => [`${x.labels.tool} ${x.labels.state} ` +
    x.labels.resolution, Number(x.value)]),
  group(recs, (x) => [`${x.tool} ${x.state} ${x.resolution}`, 1]),
  `${when}: idem_actions by tool, state and resolution`);
  const got = Object.fromEntries(group(samples, (x) =>
    [`${x.labels.tool}\u0000${x.labels.state}`, Number(x.value)]));
  // ... whose sums by state are idem stats --json
  const byState = {};
  for (const [k, n] of Object.entries(got)) {
    const st = k.split('\u0000')[1];
    byState[st] = (byState[st] || 0) + n;
  }
  for (const [st, n] of Object.entries(stats)) {
    if (st !== 'total') {
      eq(byState[st] || 0, n, `${when}: idem_actions summed, ${st}`);
    }
  }
  eq(Object.values(byState).reduce((a, b) => a + b, 0), stats.total,
    `${when}: idem_actions summed: total`);
  const apiStats = await api.get('/api/stats');
  eq(apiStats.json && apiStats.json.total, stats.total,
    `${when}: /api/stats total`);

  eq(value(fams, 'idem_in_doubt'), doubt.length, `${when}: idem_in_doubt`);
  const age = value(fams, 'idem_in_doubt_oldest_age_seconds');
  if (doubt.length) {
    const first = Math.min(...doubt.map((x) => x.created));
    ok(age >= (t0 - first) / 1000 - 0.001 && age <= (t1 - first) / 1000 + 1,
      `${when}: the oldest age ` +
      `in [${(t0 - first) / 1000}, ${(t1 - first) / 1000 + 1}]`, age);
  } else {
    ok(age === undefined || age === 0, `${when}: no oldest age`, age);
  }

  // the sums by tool, each a gauge whose non-zero samples are the log's
  const byTool = {
    idem_log_attempts: (x) => x.attempts,
    idem_log_status_checks: (x) => x.checks || 0,
    idem_log_late_results: (x) => (x.resolution === 'late' ? 1 : 0),
    idem_log_deduplicated: (x) => (x.state === 'deduplicated' ? 1 : 0),
    idem_log_operator_verdicts: (x) => (x.resolution === 'operator' ? 1 : 0),
  };
  for (const [name, f] of Object.entries(byTool)) {
    const fm = fams.get(name);
    ok(fm && fm.type === 'GAUGE', `${when}: ${name} is a gauge`,
      fm && fm.type);
    eq(group(fm ? fm.metrics : [], (x) => [x.labels.tool, Number(x.value)]),
      group(recs, (x) => [x.tool, f(x)]), `${when}: ${name} by tool`);
  }

  for (const n of ['idem_process_answers_total',
    'idem_process_replays_total', 'idem_process_fenced_total',
    'idem_process_coalesced_total', 'idem_process_attempts_total',
    'idem_process_late_results_total', 'idem_process_verdicts_total',
    'idem_process_status_checks_total']) {
    const f = fams.get(n);
    ok(f && f.type === 'COUNTER', `${when}: ${n} is a counter`, f && f.type);
    ok(f && f.metrics.every((s) => Number(s.value) >= 0),
      `${when}: ${n} >= 0`);
  }
  const h = fams.get('idem_guard_latency_seconds');
  ok(h && h.type === 'HISTOGRAM', `${when}: the latency is a histogram`,
    h && h.type);
  for (const s of (h ? h.metrics : [])) {
    const b = Object.entries(s.buckets)
      .map(([le, n]) => [le === '+Inf' ? Infinity : Number(le), Number(n)])
      .sort((x, y) => x[0] - y[0]);
    ok(b.length > 1 && b.every(([le], i) => i === 0 || le > b[i - 1][0]),
      `${when}: the latency's bounds increase`, b);
    ok(b.every(([, n], i) => i === 0 || n >= b[i - 1][1]),
      `${when}: the latency's buckets are cumulative`, b);
    eq(b.length && b[b.length - 1][0], Infinity,
      `${when}: the latency's last bucket is +Inf`);
    eq(b.length && b[b.length - 1][1], Number(s.count),
      `${when}: the latency's +Inf bucket is its count`);
    ok(Number(s.sum) >= 0, `${when}: the latency's sum`, s.sum);
  }
  return fams;
}

// The API against the log: the fields of a record, and paging
const REC = ['session', 'call_id', 'tool', 'state', 'resolution', 'attempts',
  'key', 'fingerprint', 'args', 'result', 'error', 'duplicate_of', 'turn',
  'delivered', 'created', 'updated', 'settle_from', 'settle_ends',
  'executor', 'executor_alive', 'owner', 'check_with', 'last_check',
  'checked_at', 'checks', 'resolved_by', 'resolved_at', 'age_ms'];
async function pages(p, limit) {
  const out = [];
  let after = null;
  for (let i = 0; i < 20; i++) {
    const sep = p.includes('?') ? '&' : '?';
    const r = await api.get(`${p}${sep}limit=${limit}` +
      (after ? `&after=${encodeURIComponent(after)}` : ''));
    if (!ok(r.status === 200 && r.json && Array.isArray(r.json.items),
      `GET ${p} limit ${limit}: a page`, r.text)) return out;
    ok(r.json.items.length <= limit, `GET ${p}: at most ${limit}`,
      r.json.items.length);
    out.push(...r.json.items);
    after = r.json.next;
    if (!after) return out;
  }
  ok(false, `GET ${p}: more than 20 pages`);
  return out;
}
async function apiChecks() {
  const S = encodeURIComponent(story.S);
  for (const c of ['a1', 'b2', 'p1']) {
    const r = await api.get(`/api/record?session=${S}&call_id=${c}`);
    const shown = await story.show(c);
    eq(r.status, 200, `/api/record ${c}`);
    const rec = r.json || {};
    eq(REC.filter((k) => !(k in rec)), [], `/api/record ${c}: every field`);
    for (const k of ['state', 'resolution', 'attempts', 'key', 'args',
      'result', 'duplicate_of', 'turn', 'created', 'resolved_by']) {
      eq(rec[k], shown && shown[k], `/api/record ${c}: ${k} as idem show`);
    }
  }
  const no = await api.get(`/api/record?session=${S}&call_id=nosuch`);
  eq(no.status, 404, '/api/record of no record: 404');
  ok(no.json && typeof no.json.error === 'string',
    '/api/record of no record: {"error":...}', no.text);
  const order = (await lines(['ls', '--json', '--session', story.S]))
    .map((x) => x.call_id);
  eq((await pages(`/api/session?session=${S}`, 2)).map((x) => x.call_id),
    order, '/api/session by pages of 2: every call, in order');
  eq((await pages(`/api/records?session=${S}`, 3)).map((x) => x.call_id),
    order, '/api/records by pages of 3: the same');
  eq((await pages(`/api/records?session=${S}&tool=refund_payment&` +
    'state=succeeded', 1)).map((x) => x.call_id),
  order.filter((c) => ['b1', 'p1'].includes(c)),
  '/api/records by tool and state, pages of 1');
  eq((await pages(`/api/records?key=${encodeURIComponent(story.keys.p1)}`,
    50)).map((x) => x.call_id), ['p1'], '/api/records by key');
  const doubt = (await lines(['ls', '--in-doubt', '--json']))
    .map((x) => `${x.session}/${x.call_id}`);
  eq((await pages('/api/doubt', 1)).map((x) => `${x.session}/${x.call_id}`),
    doubt, '/api/doubt by pages of 1: idem ls --in-doubt, in order');
}

try {
  await apiChecks();
  const before = await scrape('filled');
  eq(before && value(before, 'idem_in_doubt'), 2, 'filled: a1 and x1');
  const tool = { tool: 'refund_payment' };
  eq(before && value(before, 'idem_log_late_results', tool), 1,
    'filled: b1 late');
  eq(before && value(before, 'idem_log_deduplicated', tool), 1,
    'filled: b2 deduplicated');
  eq(before && value(before, 'idem_process_verdicts_total'), 0,
    'filled: no verdict by this process');
  // verdicts move the counts
  let r = await api.resolve({ session: story.S, call_id: 'a1',
    verdict: 'applied', result: '{"refund_id":"re_op"}', reason: 'seen' });
  eq(r.status, 200, `resolve a1 (${r.text})`);
  const mid = await scrape('a1 resolved');
  eq(mid && value(mid, 'idem_in_doubt'), 1, 'a1 resolved: x1 left');
  eq(mid && value(mid, 'idem_process_verdicts_total'), 1,
    'a1 resolved: one verdict by this process');
  eq(mid && value(mid, 'idem_log_operator_verdicts', tool), 1,
    'a1 resolved: one operator\'s verdict in the log');
  const sop = { ...tool, state: 'succeeded', resolution: 'operator' };
  eq(mid && [value(before, 'idem_actions', sop) || 0,
    value(mid, 'idem_actions', sop)], [0, 1],
  'a1 resolved: succeeded by an operator');
  // (a wrong verdict, x1 was applied: only the counts matter here, and
  // nothing runs x1 again)
  r = await api.resolve({ session: story.S, call_id: 'x1',
    verdict: 'not_applied', reason: 'not on the dashboard' });
  eq(r.status, 200, `resolve x1 (${r.text})`);
  const after = await scrape('all resolved');
  eq(after && value(after, 'idem_in_doubt'), 0, 'all resolved: none');
  eq(after && value(after, 'idem_process_verdicts_total'), 2,
    'all resolved: two verdicts by this process');
  // a front end killed after its durable write, before the tool ran: the
  // action is pending under a holder that is gone - in doubt, as the page
  // lists it, and counted so
  r = await story.exec('s1', 't9', 'ok', { IDEM_CRASH_AT:
    'after_pending_commit' });
  ok(r.code !== 0 && r.env === null, 's1: the front end died', r);
  eq(story.total(), 4, 's1: nothing ran');
  const stranded = await scrape('stranded');
  eq(stranded && value(stranded, 'idem_in_doubt'), 1,
    'stranded: the pending action of a dead front end is in doubt');
  eq(stranded && value(stranded, 'idem_actions', { ...tool,
    state: 'pending', resolution: 'none' }), 1, 'stranded: its state pending');
  eq((await pages('/api/doubt', 5)).map((x) => x.call_id), ['s1'],
    'stranded: /api/doubt lists it');
} catch (e) {
  ok(false, `the scrapes: ${e.stack || e}`);
} finally {
  eq(await srv.stop(), 0, 'idem serve: exit 0 on SIGTERM');
}
process.exit(summary());
