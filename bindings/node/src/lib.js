// Finding libidem and declaring its functions (koffi).
//
// The library is looked for, in order (as the Python binding does):
//   1. $IDEM_LIBRARY: the path of the shared library to load;
//   2. next to this module: src/libidem.so* (a package that bundles it);
//   3. the build tree, when the package is used in place from a checkout:
//      bindings/node/src -> <checkout>/build/libidem.so;
//   4. an installed one: pkg-config's libdir of idem (libidem.so.0, then
//      libidem.so), then the soname libidem.so.0 through the dynamic
//      loader (ldconfig's paths, LD_LIBRARY_PATH).
// A library that cannot be loaded is a LibraryNotFound naming every place
// tried and why.
//
// Every prototype is declared once here; the operations that may wait on
// the attempt log are submitted to the library's completion queue
// (driver.js), so the event loop never blocks on the log.
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import koffi from 'koffi';
import { LibraryNotFound } from './errors.js';

const SONAME = 'libidem.so.0';
const here = path.dirname(fileURLToPath(import.meta.url));

function pkgConfigLibdir() {
  try {
    const d = execFileSync('pkg-config', ['--variable=libdir', 'idem'], {
      encoding: 'utf8', timeout: 5000, stdio: ['ignore', 'pipe', 'ignore'],
    }).trim();
    return d || null;
  } catch {
    return null;
  }
}

function* candidates() {
  const env = process.env.IDEM_LIBRARY;
  if (env) {
    yield [env, 'IDEM_LIBRARY'];
    return;
  }
  for (const name of fs.readdirSync(here).sort())
    if (name.startsWith('libidem.so')) yield [path.join(here, name), 'package'];
  const root = path.resolve(here, '..', '..', '..');
  if (fs.existsSync(path.join(root, 'include', 'idem.h')))
    yield [path.join(root, 'build', 'libidem.so'), 'build tree'];
  const libdir = pkgConfigLibdir();
  if (libdir)
    for (const n of [SONAME, 'libidem.so'])
      yield [path.join(libdir, n), 'pkg-config'];
  yield [SONAME, 'system'];
}

/** Load libidem: [the koffi library, its path].  Throws LibraryNotFound. */
export function load() {
  const tried = [];
  for (const [p, where] of candidates()) {
    if (where !== 'system' && !fs.existsSync(p)) {
      tried.push(`${p} (no such file)`);
      continue;
    }
    try {
      return [koffi.load(p), p];
    } catch (e) {
      tried.push(`${p} (${String(e.message || e).split('\n')[0]})`);
      if (where === 'IDEM_LIBRARY') break;
    }
  }
  throw new LibraryNotFound(
    `cannot load libidem; tried ${tried.join(', ')}. Build it (cmake -S . ` +
    '-B build && cmake --build build) and install it (cmake --install ' +
    'build, then ldconfig; for a prefix of your own, put ' +
    '<prefix>/lib/pkgconfig on PKG_CONFIG_PATH so that `pkg-config ' +
    '--variable=libdir idem` names it), or set IDEM_LIBRARY to the path ' +
    'of libidem.so');
}

let cached = null;
export const LATENCY_BUCKETS = 16; // IDEM_LATENCY_BUCKETS

/** The bound library, loaded on first use (so that importing the package
 * never fails: the first Guard says what is missing). */
export function lib() {
  if (cached) return cached;
  const [l, p] = load();
  const F = (proto) => l.func(proto);
  // idem_call (idem.h): size first, the ABI rule; pointers as void * so that
  // the binding passes buffers it keeps alive for the async call.
  const Call = koffi.struct('idem_call', {
    size: 'size_t', session: 'const char *', call_id: 'const char *',
    tool: 'const char *', args: 'const char *', args_len: 'size_t',
    turn: 'const char *', own_check: 'int',
  });
  // idem_completion (idem.h): what idem_queue_pop fills; user is the
  // binding's number for the operation (void * in C, the same bits)
  const Completion = koffi.struct('idem_completion', {
    size: 'size_t', user: 'intptr_t', step: 'void *', op: 'int', rc: 'int',
    next: 'int', answer: 'int', errmsg: 'const char *',
  });
  // idem_metrics (idem.h): this process's counters (idem_metrics_read)
  const Metrics = koffi.struct('idem_metrics', {
    size: 'size_t', answers: koffi.array('long long', 9),
    replays: 'long long', fenced: 'long long', coalesced: 'long long',
    attempts: 'long long', late: 'long long',
    checks: koffi.array('long long', 5), resolved: 'long long',
    latency_le: koffi.array('long long', LATENCY_BUCKETS),
    latency_count: 'long long', latency_sum_us: 'long long',
  });
  const libc = koffi.load('libc.so.6');
  const L = {
    path: p,
    Call,
    callSize: koffi.sizeof(Call),
    Completion,
    completionSize: koffi.sizeof(Completion),
    Metrics,
    metricsSize: koffi.sizeof(Metrics),
    metrics_read: F('int idem_metrics_read(_Inout_ idem_metrics *out)'),
    latency_bound_us: F('long long idem_latency_bound_us(int i)'),
    dup: libc.func('int dup(int fd)'),
    strerror: F('const char *idem_strerror(int rc)'),
    status_name: F('const char *idem_status_name(int rc)'),
    version: F('const char *idem_version(void)'),
    free: F('void idem_free(void *p)'),
    policy_load: F('int idem_policy_load(const char *path, _Out_ void **out)'),
    policy_parse: F('int idem_policy_parse(const char *text, size_t len, ' +
                    'const char *origin, _Out_ void **out)'),
    policy_free: F('void idem_policy_free(void *p)'),
    policy_errmsg: F('const char *idem_policy_errmsg(void *p)'),
    guard_open: F('int idem_guard_open(const char *url, void *policy, ' +
                  '_Out_ void **out)'),
    guard_close: F('void idem_guard_close(void *g)'),
    guard_errmsg: F('const char *idem_guard_errmsg(void *g)'),
    guard_owner: F('const char *idem_guard_owner(void *g)'),
    guard_resolve: F('int idem_guard_resolve(void *g, const char *session, ' +
                     'const char *call_id, int outcome, const char *result, ' +
                     'size_t result_len, const char *reason, const char *by)'),
    // the completion queue (idem.h): the log's operations of a step
    queue_open: F('int idem_queue_open(void *g, _Out_ void **q)'),
    queue_close: F('void idem_queue_close(void *q)'),
    queue_fd: F('int idem_queue_fd(void *q)'),
    queue_pop: F('int idem_queue_pop(void *q, void *c, size_t n, ' +
                 '_Out_ size_t *got)'),
    queue_begin: F('int idem_queue_begin(void *q, const idem_call *call, ' +
                   'int flags, intptr_t user)'),
    queue_finish: F('int idem_queue_finish(void *q, void *s, int outcome, ' +
                    'const char *result, size_t result_len, ' +
                    'const char *error, int flags, intptr_t user)'),
    queue_resolve: F('int idem_queue_resolve(void *q, void *s, ' +
                     'int outcome, const char *result, size_t result_len, ' +
                     'int flags, intptr_t user)'),
    queue_poll: F('int idem_queue_poll(void *q, void *s, int flags, ' +
                  'intptr_t user)'),
    queue_delivered: F('int idem_queue_delivered(void *q, void *s, ' +
                       'intptr_t user)'),
    queue_undelivered: F('int idem_queue_undelivered(void *q, void *s, ' +
                         'intptr_t user)'),
    step_next: F('int idem_step_next(void *s)'),
    step_free: F('void idem_step_free(void *s)'),
    step_key: F('const char *idem_step_key(void *s)'),
    step_args: F('const char *idem_step_args(void *s, _Out_ size_t *len)'),
    step_check_key: F('const char *idem_step_check_key(void *s)'),
    step_check_target: F('const char *idem_step_check_target(void *s, ' +
                         '_Out_ size_t *len)'),
    step_deadline_ms: F('long long idem_step_deadline_ms(void *s)'),
    step_delay_ms: F('long long idem_step_delay_ms(void *s)'),
    step_envelope: F('const char *idem_step_envelope(void *s, ' +
                     '_Out_ size_t *len)'),
  };
  cached = L;
  return L;
}
