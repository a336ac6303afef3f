// The console (idem serve) in a real browser: Debian's chromium driven by
// puppeteer-core, against a log filled through `idem exec` and the Python
// binding (the story in lib.mjs), with a ledger that counts every
// application of the refund provider.
//   node tests/console/browser_test.mjs IDEM_BINARY [LOG_URL]
// LOG_URL defaults to a SQLite file in a temporary directory; CTest runs
// it as console_browser, and on a throwaway PostgreSQL server as
// console_browser_pg (tests/pg/tests.cmake).  Needs /usr/bin/chromium
// (or $IDEM_CHROMIUM) and tests/console/node_modules (`npm ci`, which
// scripts/install-deps.sh --peers runs); IDEM_CONSOLE_SKIP_MISSING=1 skips
// (exit 77) where they are missing, otherwise that is a failure.
// Screenshots of the in-doubt list, the resolve dialog and the timeline go
// to $IDEM_SCREENSHOTS when set (`make screenshots`: docs/img), else to the
// temporary directory (kept with IDEM_KEEP=1).
//
// It checks: the in-doubt list shows the actions (tool, session, call id,
// attempts, check_with); a verdict given in the page (token typed in
// #token) settles a1 as applied, after which `idem exec` of a1 replays and
// the ledger still has ONE application of its key; a second verdict on
// a1, from a page opened before the first, is refused in #error with
// "no longer in doubt" (and by the API: 409); the session's timeline shows
// b2 fenced with a.dup-link to b1 and following it shows b1; arguments
// holding <script> and <img onerror> show as text (no dialog, no element
// injected); no CSP violation and no uncaught error in the page; the
// search finds by session and call id, and by state; the read-only console
// has no resolve button, no token field and no token line; with nothing
// left in doubt the list shows #doubt-empty.  The ledger is counted
// throughout: a1, x1, b1 and p1 applied once each, b2 never.
import fs from 'node:fs';
import path from 'node:path';
import {
  Api, CHROMIUM, Story, eq, logUrl, need, ok, peers, run, serve, summary,
  tempDir,
} from './lib.mjs';

const [idem, given] = process.argv.slice(2);
if (!idem) {
  console.error('usage: browser_test.mjs IDEM_BINARY [LOG_URL]');
  process.exit(2);
}
await need(`chromium (${CHROMIUM})`, fs.existsSync(CHROMIUM));
const [puppeteer] = await peers('puppeteer-core');

const dir = tempDir();
const shots = process.env.IDEM_SCREENSHOTS || dir;
fs.mkdirSync(shots, { recursive: true });
const story = new Story(idem, dir, logUrl(dir, given));
await story.fill();
const S = story.S;

const srv = await serve(idem, ['--log', story.log, '--policy', story.policy]);
const servers = [srv];
ok(srv.token && srv.token.length >= 16, 'a token line', srv.lines);
const api = new Api(srv.url, srv.token);
// a PostgreSQL URL's password is never shown: not on stdout, not by the API
let secret = null;
try { secret = new URL(story.log).password || null; } catch { /* sqlite: */ }
if (secret) {
  ok(!srv.lines.join('\n').includes(secret), 'the password not on stdout',
    srv.lines);
  const shown = (await api.info()).log;
  ok(shown && !shown.includes(secret), 'the password not in /api/info',
    shown);
}
const browser = await puppeteer.launch({
  executablePath: CHROMIUM,
  headless: true,
  // root cannot use chromium's sandbox; the page is our own
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  protocolTimeout: 30000,
});

// Every page is watched: dialogs (an injected alert would open one),
// console messages (CSP violations are reported there) and uncaught errors.
const dialogs = [], consoleMsgs = [], pageErrors = [];
async function open(hash) {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  page.on('dialog', async (d) => {
    dialogs.push(d.message());
    await d.dismiss();
  });
  page.on('console', (m) => consoleMsgs.push(`${m.type()}: ${m.text()}`));
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  await page.goto(srv.url + hash, { waitUntil: 'load' });
  return page;
}
const row = (call) =>
  `tr.doubt-row[data-session="${S}"][data-call="${call}"]`;
const call = (c) => `section#timeline div.call[data-call="${c}"]`;
const text = (page, sel) =>
  page.$eval(sel, (e) => e.textContent).catch(() => null);
const T = { timeout: 10000 };

try {
  // (a) the in-doubt list
  const p1 = await open('#/');
  await p1.waitForSelector(row('a1'), T);
  await p1.waitForSelector(row('x1'), T);
  eq(await p1.$$eval(`tr.doubt-row[data-session="${S}"]`,
    (rs) => rs.map((r) => r.dataset.call).sort()), ['a1', 'x1'],
  'in doubt: a1 and x1, nothing else of the session');
  eq(await text(p1, `${row('a1')} .tool`), 'refund_payment', 'a1: tool');
  eq((await text(p1, `${row('a1')} .attempts`) || '').trim(), '1',
    'a1: attempts');
  const link = await p1.$eval(`${row('a1')} a.session-link`,
    (a) => [a.textContent, a.getAttribute('href')]).catch(() => null);
  ok(link && link[0].includes(S) &&
     link[1] === `#/session/${encodeURIComponent(S)}`,
  'a1: a.session-link shows and links the session', link);
  ok((await p1.$eval(row('a1'), (r) => r.textContent)).includes('a1'),
    'a1: the call id shows');
  let cw = await text(p1, `${row('a1')} pre.check-with`);
  ok(cw && cw.includes('get_refund_status') && cw.includes('oA'),
    'a1: check_with shows the status tool and its arguments', cw);
  const args = await text(p1, `${row('a1')} pre.args`);
  ok(args && JSON.stringify(JSON.parse(args)) ===
     JSON.stringify({ amount_cents: 6000, order_id: 'oA' }),
  'a1: pre.args is its arguments', args);
  // idem exec cannot call a status tool: no check ran, and none is
  // counted (the page says none yet, not "unknown (1 check)")
  const lc = await text(p1, `${row('a1')} .last-check`);
  eq(lc, 'none yet', 'a1: last check: none ran', lc);
  const settle = await text(p1, `${row('a1')} .settle-ends`);
  ok(settle && !settle.includes('--policy'),
    'a1: settle ends is known (served with --policy)', settle);
  // (e) in the list too
  const xa = await text(p1, `${row('x1')} pre.args`);
  ok(xa && xa.includes(story.XSS) && xa.includes(story.IMG),
    'x1: <script> and <img> shown as text in the list', xa);
  await p1.screenshot({ path: path.join(shots, 'console-doubt.png'),
    fullPage: true });

  // a second page, open on the list before the verdict
  const p2 = await open('#/');
  await p2.waitForSelector(`${row('a1')} button.resolve`, T);

  // (b) the verdict in the page: applied, with a result (a page in the
  // background does not render: each page is brought to the front first)
  await p1.bringToFront();
  await p1.type('#token', srv.token);
  await p1.click('#token-save');
  await p1.click(`${row('a1')} button.resolve`);
  await p1.waitForSelector('form#resolve-form', { visible: true, ...T });
  await p1.click('form#resolve-form input[name=verdict][value=applied]');
  await p1.type('textarea#resolve-result', '{"refund_id":"re_op"}');
  await p1.type('input#resolve-reason', 'found it on the PSP dashboard');
  // (who: a field the page may offer beyond the contract)
  const by = await p1.$('input#resolve-by');
  if (by) await by.type('alice@ops');
  await p1.screenshot({ path: path.join(shots, 'console-resolve.png') });
  eq(story.applied('a1'), 1, 'a1: one application before the verdict');
  const said = await text(p1, '#message');
  await p1.click('button#resolve-submit');
  await p1.waitForFunction((was) => {
    const m = document.querySelector('#message');
    return m && !m.hidden && m.textContent !== was;
  }, T, said).catch(() => {});
  ok(await p1.$eval('#message', (m) => !m.hidden && m.textContent !== ''),
    'the verdict: #message says so', await text(p1, '#error'));
  ok(await p1.$eval('#error', (m) => m.hidden || m.textContent === ''),
    'the verdict: no #error', await text(p1, '#error'));
  await p1.waitForFunction((sel) => !document.querySelector(sel), T,
    row('a1')).catch(() => {});
  eq(await p1.$(row('a1')), null, 'a1: gone from the in-doubt list');
  let rec = await story.show('a1');
  eq(rec && [rec.state, rec.resolution], ['succeeded', 'operator'],
    'a1: the log has the verdict');
  eq(rec && rec.result, { refund_id: 're_op' }, 'a1: with its result');
  if (by) {
    ok(rec && String(rec.resolved_by).includes('alice@ops'), 'a1: by whom',
      rec && rec.resolved_by);
  }
  let r = await story.exec('a1', 't1', 'ok');
  eq(r.code, 0, 'a1 again: exec exit');
  eq(r.env && [r.env.status, r.env.replayed], ['succeeded', true],
    'a1 again: replayed');
  eq(r.env && r.env.result, { refund_id: 're_op' },
    'a1 again: the verdict\'s result');
  eq(story.applied('a1'), 1, 'a1: still ONE application after the replay');

  // (c) a second verdict on a1: from the page opened before, then the API
  await p2.bringToFront();
  await p2.type('#token', srv.token);
  await p2.click('#token-save');
  // (the page may have refreshed its list since: then there is no button
  // left to press, and the refusal cannot be seen in the page)
  ok(await p2.$(`${row('a1')} button.resolve`),
    'the page opened before the verdict still offers a1');
  await p2.click(`${row('a1')} button.resolve`);
  await p2.waitForSelector('form#resolve-form', { visible: true, ...T });
  await p2.click('form#resolve-form input[name=verdict][value=not_applied]');
  await p2.type('input#resolve-reason', 'not on the dashboard');
  await p2.click('button#resolve-submit');
  await p2.waitForFunction(
    () => (document.querySelector('#error')?.textContent || '') !== '', T)
    .catch(() => {});
  const err = await text(p2, '#error');
  ok(err && err.includes('no longer in doubt'),
    'second verdict: refused in #error, "no longer in doubt"', err);
  r = await api.resolve({ session: S, call_id: 'a1', verdict: 'not_applied',
    reason: 'again' });
  eq(r.status, 409, 'second verdict by the API: 409');
  ok(r.json && String(r.json.error).includes('no longer in doubt'),
    'second verdict by the API: says why', r.text);
  rec = await story.show('a1');
  eq(rec && [rec.state, rec.result], ['succeeded', { refund_id: 're_op' }],
    'a1: the first verdict stands');
  eq(story.applied('a1'), 1, 'a1: still ONE application');

  // (d) the timeline: b2 fenced, linked to b1
  const p3 = await open(`#/session/${encodeURIComponent(S)}`);
  await p3.waitForSelector(call('b2'), T);
  ok((await text(p3, '#timeline-title') || '').includes(S),
    'timeline: titled with the session');
  const calls = await p3.$$eval('section#timeline div.call',
    (cs) => cs.map((c) => c.dataset.call));
  eq([...calls].sort(), ['a1', 'b1', 'b2', 'p1', 'x1'],
    'timeline: every call of the session');
  const turnOf = await p3.$$eval('section#timeline div.turn', (ts) =>
    Object.fromEntries(ts.flatMap((t) => [...t.querySelectorAll('div.call')]
      .map((c) => [c.dataset.call, t.dataset.turn]))));
  eq(turnOf, { a1: 't1', x1: 't1', b1: 't1', b2: 't2', p1: 't3' },
    'timeline: calls grouped by turn');
  const b2 = call('b2');
  ok((await text(p3, `${b2} .state`) || '').includes('deduplicated'),
    'b2: state deduplicated', await text(p3, `${b2} .state`));
  const dup = await p3.$eval(`${b2} a.dup-link`,
    (a) => [a.textContent.trim(), a.getAttribute('href')]).catch(() => null);
  eq(dup, ['b1', `#/call/${encodeURIComponent(S)}/b1`],
    'b2: a.dup-link names and links b1');
  ok(await p3.$(`${call('b1')} .late`) ||
     await p3.$('section#timeline div.call.late[data-call="b1"]'),
  'b1: marked late');
  const a1v = await text(p3, `${call('a1')} .verdict`);
  ok(a1v && a1v.trim() !== '', 'a1: its verdict shows', a1v);
  // (e) the arguments as text, in the timeline
  const xt = await text(p3, `${call('x1')} pre.args`);
  ok(xt && xt.includes(story.XSS) && xt.includes(story.IMG),
    'x1: <script> and <img> shown as text in the timeline', xt);
  await p3.screenshot({ path: path.join(shots, 'console-timeline.png'),
    fullPage: true });
  await p3.click(`${b2} a.dup-link`);
  await p3.waitForFunction((h) => location.hash === h, T,
    `#/call/${encodeURIComponent(S)}/b1`).catch(() => {});
  eq(await p3.evaluate(() => location.hash),
    `#/call/${encodeURIComponent(S)}/b1`, 'the link followed');
  // (the calls shown: those of the view on screen)
  const shown = () => p3.$$eval('div.call', (cs) => cs
    .filter((c) => c.offsetParent !== null).map((c) => c.dataset.call));
  await p3.waitForFunction(() => [...document.querySelectorAll('div.call')]
    .some((c) => c.offsetParent !== null && c.dataset.call === 'b1'), T)
    .catch(() => {});
  eq(await shown(), ['b1'], 'the link shows b1, and only b1');

  // the search: exact matches (the session and a call id; then a state)
  await p3.goto(srv.url + '#/search', { waitUntil: 'load' });
  await p3.waitForSelector('form#search', { visible: true, ...T });
  // (the view's own first search answered before ours is asked)
  await p3.waitForNetworkIdle({ idleTime: 200, timeout: 10000 });
  await p3.type('#q-session', S);
  await p3.type('#q-call', 'b2');
  await p3.click('button#q-go');
  const found = () => p3.$$eval('table#records tr.record-row',
    (rs) => rs.map((r) => `${r.dataset.session}/${r.dataset.call}`));
  // (the rows of the view's own first search may still show: wait for ours)
  await p3.waitForFunction((want) => [...document.querySelectorAll(
    'table#records tr.record-row')].map((r) => r.dataset.call).join() ===
    want, T, 'b2').catch(() => {});
  eq(await found(), [`${S}/b2`], 'search: session and call id');
  await p3.$eval('#q-call', (e) => { e.value = ''; });
  await p3.select('select#q-state', 'in_doubt');
  await p3.click('button#q-go');
  await p3.waitForFunction((want) => [...document.querySelectorAll(
    'table#records tr.record-row')].map((r) => r.dataset.call).join() ===
    want, T, 'x1').catch(() => {});
  eq(await found(), [`${S}/x1`], 'search: the session\'s calls in doubt');

  // (e) nothing injected, anywhere the arguments were shown
  for (const [name, p] of [['list', p1], ['second page', p2],
    ['timeline', p3]]) {
    const dom = await p.evaluate(() => ({
      inline: [...document.scripts].filter((s) => !s.src).length,
      img: document.querySelectorAll('img[src="x"], img[onerror]').length,
      pre: document.querySelectorAll('pre script, pre img').length,
    }));
    eq(dom, { inline: 0, img: 0, pre: 0 }, `${name}: no element injected`);
  }
  // the list again, with x1 still in doubt, after a reload
  await p1.bringToFront();
  await p1.reload({ waitUntil: 'load' });
  await p1.waitForSelector(row('x1'), T);
  eq(dialogs, [], 'no dialog opened (no alert ran)');
  // (f) no CSP violation, no uncaught error
  eq(consoleMsgs.filter((m) => /Content Security Policy|Refused to/i.test(m)),
    [], 'no CSP violation reported');
  eq(pageErrors, [], 'no uncaught error in the page');
  if (secret) {
    ok(!(await p1.content()).includes(secret), 'the password not in the page');
  }

  // the ledger throughout: every action applied once, b2 never ran
  for (const c of ['a1', 'x1', 'b1', 'p1']) {
    eq(story.applied(c), 1, `${c}: one application in the end`);
  }
  eq(story.total(), 4, 'the ledger: four applications in all');

  // the read-only console: no token, no buttons
  const ro = await serve(idem, ['--log', story.log, '--read-only']);
  servers.push(ro);
  eq(ro.token, null, 'read-only: no token line');
  const info = await new Api(ro.url).info();
  eq(info && info.read_only, true, 'read-only: /api/info says so');
  const p4 = await browser.newPage();
  p4.on('dialog', async (d) => {
    dialogs.push(d.message());
    await d.dismiss();
  });
  await p4.bringToFront();
  await p4.goto(ro.url + '#/', { waitUntil: 'load' });
  await p4.waitForSelector(row('x1'), T);
  eq(await p4.$$eval('button.resolve', (b) => b.length), 0,
    'read-only: no button.resolve');
  eq(await p4.evaluate(() => document.body.classList.contains('read-only')),
    true, 'read-only: body.read-only');
  eq(await p4.$eval('#token', (e) => e.offsetParent === null)
    .catch(() => true), true, 'read-only: #token hidden');

  // x1 settled too (applied: the command applied it before it died):
  // nothing in doubt, and the list says so
  const r2 = await api.resolve({ session: S, call_id: 'x1',
    verdict: 'applied', reason: 'found it too' });
  eq(r2.status, 200, `x1 resolved by the API (${r2.text})`);
  // the read-only page, left open, drops x1 by itself (kept current every
  // 10 s), without a reload
  await p4.bringToFront();
  await p4.waitForFunction(() => !document.querySelector('tr.doubt-row'),
    { timeout: 30000 }).catch(() => {});
  eq(await p4.$$eval('tr.doubt-row', (rs) => rs.length), 0,
    'the open list keeps current: x1 gone without a reload');
  await p1.bringToFront();
  await p1.reload({ waitUntil: 'load' });
  await p1.waitForSelector('#doubt-empty', { visible: true, ...T })
    .catch(() => {});
  eq(await p1.$eval('#doubt-empty', (e) => e.offsetParent !== null)
    .catch(() => false), true, 'nothing in doubt: #doubt-empty shown');
  eq(await p1.$$eval('tr.doubt-row', (rs) => rs.length), 0,
    'nothing in doubt: no row');
  eq(story.total(), 4, 'the ledger: still four applications');
} catch (e) {
  ok(false, `the browser steps: ${e.stack || e}`);
} finally {
  await browser.close();
  for (const x of servers) {
    eq(await x.stop(), 0, 'idem serve: exit 0 on SIGTERM');
  }
  if (srv.err()) console.error(`idem serve's stderr: ${srv.err()}`);
}
process.exit(summary());
