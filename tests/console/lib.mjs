// What the console's tests share: a log filled through the real front ends
// (`idem exec` with tests/tools/refund.sh, and the Python binding), a
// ledger that counts every application, `idem serve` started on a free port
// with its URL and token read from its stdout, and the HTTP API's calls.
//
// The story in the log, one session S (unique per run: a PostgreSQL log
// may be shared), policy: refund_payment guarded, timeout 300 ms, no
// retries, settle_ms 10 minutes, status tool get_refund_status (which
// `idem exec` cannot call: it only tells the model to check with it, so
// what goes in doubt stays in doubt):
//   a1  turn t1  order oA   the command applies, then dies (SIGKILL):
//                           in doubt, ONE application on the ledger
//   x1  turn t1  order oX   the same, with <script>/<img onerror> in its
//                           arguments: in doubt
//   b1  turn t1  order oB   the command sleeps 1.5 s, then applies: exec
//                           answers outcome_unknown at 300 ms, its runner
//                           records the late result (succeeded, late)
//   b2  turn t2  order oB   the model's re-issue, a new call id: fenced,
//                           deduplicated, duplicate_of b1, nothing run
//   p1  turn t3  order oP   through the Python binding: succeeded
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const HERE = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(HERE, '../..');
export const REFUND = path.join(ROOT, 'tests/tools/refund.sh');
export const CHROMIUM = process.env.IDEM_CHROMIUM || '/usr/bin/chromium';

let passed = 0;
let failed = 0;
export function ok(cond, what, got) {
  if (cond) { passed++; return true; }
  failed++;
  console.error(`FAIL: ${what}` +
    (got === undefined ? '' : `: got ${JSON.stringify(got)}`));
  return false;
}
export function eq(got, want, what) {
  const g = JSON.stringify(got), w = JSON.stringify(want);
  if (g === w) { passed++; return true; }
  failed++;
  console.error(`FAIL: ${what}: expected ${w}, got ${g}`);
  return false;
}
export function summary() {
  console.log(`${passed} passed, ${failed} failed`);
  return failed === 0 && passed > 0 ? 0 : 1;
}

// Missing peers (chromium, node_modules) fail the test, unless
// IDEM_CONSOLE_SKIP_MISSING=1 says this machine may lack them: then the
// test exits 77, which CTest reports as skipped (SKIP_RETURN_CODE).
export async function need(what, present) {
  if (present) return;
  if (process.env.IDEM_CONSOLE_SKIP_MISSING === '1') {
    console.log(`skipped: ${what} is missing`);
    process.exit(77);
  }
  console.error(`${what} is missing: run scripts/install-deps.sh --peers ` +
    '(or set IDEM_CONSOLE_SKIP_MISSING=1 to skip)');
  process.exit(1);
}

export async function peers(...names) {
  await need('tests/console/node_modules (npm ci)',
    names.every((n) => fs.existsSync(path.join(HERE, 'node_modules', n))));
  const out = [];
  for (const n of names) out.push((await import(n)).default);
  return out;
}

// run(cmd, args, {env, input}): {code, signal, out, err}
export function run(cmd, args, opt = {}) {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, {
      env: { ...process.env, ...(opt.env || {}) },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let out = '', err = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { err += d; });
    p.on('error', reject);
    p.on('close', (code, signal) => resolve({ code, signal, out, err }));
    // a command that exits without reading its input: not the test's error
    p.stdin.on('error', () => {});
    p.stdin.end(opt.input || '');
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function tempDir() {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-console-'));
  process.on('exit', () => {
    if (!process.env.IDEM_KEEP) fs.rmSync(d, { recursive: true, force: true });
  });
  return d;
}

// The log the test uses: argv LOG_URL, else a SQLite file in dir.
export function logUrl(dir, given) {
  return given || `sqlite:${path.join(dir, 'log.db')}`;
}

export class Story {
  constructor(idem, dir, log) {
    this.idem = idem;
    this.dir = dir;
    this.log = log;
    // (the pictures of `make screenshots` show a steady name)
    this.S = process.env.IDEM_SCREENSHOTS ? 'agent_run_42' :
      `console_${process.pid}_${Math.floor(Math.random() * 1e6)}`;
    this.ledger = path.join(dir, 'ledger');
    this.policy = path.join(dir, 'policy.json');
    fs.writeFileSync(this.ledger, '');
    fs.writeFileSync(this.policy, JSON.stringify({
      tools: {
        refund_payment: {
          class: 'guarded', timeout_ms: 300, retries: 0,
          settle_ms: 600000,
          status: {
            tool: 'get_refund_status',
            arguments: { order_id: '{order_id}' },
          },
        },
        get_refund_status: { class: 'read_only' },
      },
    }));
    this.XSS = '<script>alert(1)</script>';
    this.IMG = '<img src=x onerror=alert(2)>';
    this.args = {
      a1: { order_id: 'oA', amount_cents: 6000 },
      x1: { order_id: 'oX', amount_cents: 100, note: this.XSS,
            memo: this.IMG },
      b1: { order_id: 'oB', amount_cents: 2500 },
      b2: { order_id: 'oB', amount_cents: 2500 },
      p1: { order_id: 'oP', amount_cents: 300 },
      s1: { order_id: 'oS', amount_cents: 700 },
    };
    this.keys = {};
  }

  // idem exec of one call of the story; {code, env (the envelope)}
  async exec(call, turn, mode, extra = {}, flags = []) {
    const r = await run(this.idem, ['exec', '--log', this.log,
      '--policy', this.policy, '--session', this.S, '--call', call,
      '--turn', turn, '--tool', 'refund_payment', ...flags,
      '--args', JSON.stringify(this.args[call]), '--', REFUND],
    { env: { LEDGER: this.ledger, REFUND_MODE: mode, ...extra } });
    let env = null;
    try { env = JSON.parse(r.out); } catch { /* checked by the caller */ }
    if (env && env.idempotency_key) this.keys[call] = env.idempotency_key;
    return { code: r.code, env, err: r.err };
  }

  // the applications of call's key on the ledger
  applied(call) {
    const k = this.keys[call];
    return fs.readFileSync(this.ledger, 'utf8').split('\n')
      .filter((l) => l === k).length;
  }

  total() {
    return fs.readFileSync(this.ledger, 'utf8').split('\n')
      .filter((l) => l !== '').length;
  }

  async show(call) {
    const r = await run(this.idem, ['show', '--json', '--log', this.log,
      this.S, call]);
    return r.code === 0 ? JSON.parse(r.out) : null;
  }

  // The Python binding (bindings/python, the library of this build:
  // IDEM_LIBRARY) guards p1.  In the sanitizer build the interpreter
  // needs the ASan runtime first: IDEM_PY_PRELOAD names it.
  async python(call, turn) {
    const code = `
import fcntl, os, sys
import idem
log, pol, s, call, turn, args = sys.argv[1:7]
def refund(a, key):
    with open(os.environ["LEDGER"], "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(key + "\\n")
    return {"refund_id": "re_py", "order_id": a["order_id"]}
with idem.Guard(log, pol) as g:
    print(str(g.call(s, call, "refund_payment", args, refund, turn=turn)))
`;
    const env = {
      LEDGER: this.ledger,
      PYTHONPATH: path.join(ROOT, 'bindings/python'),
      PYTHONDONTWRITEBYTECODE: '1',
    };
    if (process.env.IDEM_PY_PRELOAD) {
      env.LD_PRELOAD = process.env.IDEM_PY_PRELOAD;
      env.ASAN_OPTIONS = 'detect_leaks=1:verify_asan_link_order=0';
      env.LSAN_OPTIONS = 'print_suppressions=0:malloc_context_size=2:' +
        `suppressions=${path.join(ROOT, 'bindings/python/tests/lsan.supp')}`;
    }
    const r = await run(process.env.IDEM_PYTHON || 'python3', ['-c', code,
      this.log, this.policy, this.S, call, turn,
      JSON.stringify(this.args[call])], { env });
    let e = null;
    try { e = JSON.parse(r.out); } catch { /* checked by the caller */ }
    if (e && e.idempotency_key) this.keys[call] = e.idempotency_key;
    return { code: r.code, env: e, err: r.err };
  }

  // Fill the log (the story above), checking each answer on the way.
  async fill() {
    // (a deadline that a busy machine does not reach first: the command
    // applies, then dies)
    const slow = ['--timeout', '20000'];
    let r = await this.exec('a1', 't1', 'crash', {}, slow);
    eq(r.code, 75, 'a1: exec exit (in doubt)');
    eq(r.env && r.env.status, 'outcome_unknown', 'a1: outcome_unknown');
    eq(this.applied('a1'), 1, 'a1: applied once before it died');
    r = await this.exec('x1', 't1', 'crash', {}, slow);
    eq(r.env && r.env.status, 'outcome_unknown', 'x1: outcome_unknown');
    r = await this.exec('b1', 't1', 'late', { LATE: '1.5' });
    eq(r.code, 75, 'b1: exec exit (deadline)');
    eq(r.env && r.env.status, 'outcome_unknown', 'b1: outcome_unknown');
    // the runner records the late result
    let rec = null;
    for (let i = 0; i < 150; i++) {
      rec = await this.show('b1');
      if (rec && rec.state === 'succeeded') break;
      await sleep(100);
    }
    eq(rec && [rec.state, rec.resolution], ['succeeded', 'late'],
      'b1: the late result recorded');
    eq(this.applied('b1'), 1, 'b1: applied once, late');
    r = await this.exec('b2', 't2', 'ok');
    eq(r.code, 0, 'b2: exec exit');
    eq(r.env && [r.env.status, r.env.duplicate_of], ['already_applied', 'b1'],
      'b2: the re-issue fenced');
    this.keys.b2 = r.env && r.env.idempotency_key;
    eq(this.applied('b2'), 0, 'b2: nothing run');
    // (IDEM_CONSOLE_NO_PYTHON: a build whose library Python cannot load)
    r = process.env.IDEM_CONSOLE_NO_PYTHON === '1' ?
      await this.exec('p1', 't3', 'ok') : await this.python('p1', 't3');
    eq(r.code, 0, `p1: exit (${r.err.trim()})`);
    eq(r.env && r.env.status, 'succeeded', 'p1: succeeded');
    eq(this.applied('p1'), 1, 'p1: applied once');
    eq(this.total(), 4, 'the ledger: a1, x1, b1, p1 once each');
  }
}

// Start `idem serve` on a free port; {proc, url, token, lines, stop()}.
// A server the test did not stop (it failed on the way) ends with it.
const started = new Set();
process.on('exit', () => {
  for (const p of started) {
    if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  }
});
export async function serve(idem, args, env = {}) {
  const proc = spawn(idem, ['serve', '--listen', '127.0.0.1:0', ...args], {
    env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  started.add(proc);
  let out = '', err = '';
  proc.stderr.on('data', (d) => { err += d; });
  const s = { proc, url: null, token: null, lines: [], err: () => err };
  const readOnly = args.includes('--read-only');
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(
      `idem serve printed no URL in 15 s: ${out} ${err}`)), 15000);
    const done = () => { clearTimeout(timer); resolve(); };
    proc.stdout.on('data', (d) => {
      out += d;
      s.lines = out.split('\n').filter((l) => l);
      for (const l of s.lines) {
        let m = /^idem serve: (http:\/\/\S+\/) \(log /.exec(l);
        if (m) s.url = m[1];
        m = /^idem serve: token (\S+)$/.exec(l);
        if (m) s.token = m[1];
      }
      // with --read-only no token line comes: a short grace for a wrong one
      if (s.url && s.token) done();
      else if (s.url && readOnly) setTimeout(done, 300);
    });
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`idem serve exited ${code}: ${err}`));
    });
  });
  proc.removeAllListeners('exit');
  s.stop = () => new Promise((resolve) => {
    if (proc.exitCode !== null || proc.signalCode !== null) {
      resolve(proc.exitCode);
      return;
    }
    proc.on('exit', (code) => resolve(code));
    proc.kill('SIGTERM');
  });
  return s;
}

// The HTTP API as a browser of the console would call it.
export class Api {
  constructor(url, token) {
    this.url = url;
    this.token = token;
    this.origin = url.replace(/\/$/, '');
  }

  async get(p) {
    const r = await fetch(this.url + p.replace(/^\//, ''));
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* not JSON */ }
    return { status: r.status, json, text, headers: r.headers };
  }

  async info() {
    const r = await this.get('/api/info');
    this.csrf = r.json && r.json.csrf;
    return r.json;
  }

  async resolve(body, opt = {}) {
    if (this.csrf === undefined) await this.info();
    const h = {
      'Content-Type': 'application/json',
      Authorization: `Bearer ${opt.token ?? this.token}`,
      'X-Idem-CSRF': opt.csrf ?? this.csrf,
      Cookie: `idem_csrf=${opt.cookie ?? this.csrf}`,
      Origin: opt.origin ?? this.origin,
    };
    const r = await fetch(this.url + 'api/resolve', {
      method: 'POST', headers: h, body: JSON.stringify(body),
    });
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* not JSON */ }
    return { status: r.status, json, text };
  }
}
