// The idem console's page (docs/CONSOLE.md).  Everything the log holds -
// arguments, results, ids, errors - is set with textContent, never as
// markup, and the server's Content-Security-Policy runs no inline script.
'use strict';

const $ = (sel, root = document) => root.querySelector(sel);
let info = null;      // GET /api/info
let resolving = null; // the record the dialog is about
let seq = 0;          // the current route: an answer for an older one is
                      // dropped (a slow search must not overwrite a newer)

// ---- small helpers --------------------------------------------------------

function el(tag, props = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === 'text') e.textContent = v;
    else if (k === 'class') e.className = v;
    else if (k === 'data') Object.assign(e.dataset, v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) if (k != null) e.append(k);
  return e;
}

function pretty(v) {
  if (v === undefined) return '';
  return JSON.stringify(v, null, 2);
}

function when(ms) {
  if (!ms) return '—';
  return new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

function age(ms) {
  if (ms < 0) ms = 0;
  const s = Math.floor(ms / 1000);
  if (s < 60) return s + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min ' + (s % 60) + ' s';
  if (s < 86400) return Math.floor(s / 3600) + ' h ' +
    Math.floor((s % 3600) / 60) + ' min';
  return Math.floor(s / 86400) + ' d ' + Math.floor((s % 86400) / 3600) + ' h';
}

function say(text) {
  const m = $('#message');
  m.textContent = text;
  m.hidden = !text;
  if (text) $('#error').hidden = true;
}

function fail(text) {
  const m = $('#error');
  m.textContent = text;
  m.hidden = !text;
  if (text) $('#message').hidden = true;
}

async function api(path) {
  const r = await fetch('/api/' + path, {credentials: 'same-origin'});
  const body = await r.json().catch(() => ({error: r.statusText}));
  if (!r.ok) throw new Error(body.error || ('HTTP ' + r.status));
  return body;
}

function callHref(session, call) {
  return '#/call/' + encodeURIComponent(session) + '/' +
    encodeURIComponent(call);
}

function sessionHref(session) {
  return '#/session/' + encodeURIComponent(session);
}

// ---- in doubt -------------------------------------------------------------

function executorCell(r) {
  if (!r.executor) return 'none running';
  if (r.executor_alive === true) return 'alive: ' + r.executor;
  if (r.executor_alive === false) return 'gone: ' + r.executor;
  return 'unknown (another host): ' + r.executor;
}

function lastCheck(r) {
  if (!r.last_check) return r.check_with ? 'none yet' : 'no check';
  return r.last_check + ' at ' + when(r.checked_at) + ' (' + r.checks +
    (r.checks === 1 ? ' check)' : ' checks)');
}

function settleEnds(r, now) {
  if (r.settle_ends == null)
    return info && info.policy ? '—' : '— (serve with --policy)';
  const left = r.settle_ends - now;
  return when(r.settle_ends) + (left > 0 ? ' (in ' + age(left) + ')'
                                         : ' (passed)');
}

function doubtRow(r, now) {
  const tr = el('tr', {class: 'doubt-row',
                       data: {session: r.session, call: r.call_id}});
  tr.append(
    el('td', {class: 'tool', text: r.tool}),
    el('td', {}, el('pre', {class: 'args', text: pretty(r.args)})),
    el('td', {class: 'ids'},
       el('a', {class: 'session-link', href: sessionHref(r.session),
                text: r.session}),
       el('br'),
       el('a', {class: 'call-link', href: callHref(r.session, r.call_id),
                text: r.call_id})),
    el('td', {class: 'age', text: age(r.age_ms),
              title: 'since ' + when(r.created)}),
    el('td', {class: 'attempts', text: String(r.attempts)}),
    el('td', {class: 'executor', text: executorCell(r)}),
    el('td', {class: 'last-check', text: lastCheck(r)}),
    el('td', {class: 'settle-ends', text: settleEnds(r, now)}),
    el('td', {}, el('pre', {class: 'check-with',
                            text: r.check_with ? pretty(r.check_with)
                                               : '(none told)'})));
  const act = el('td');
  if (!info.read_only) {
    const b = el('button', {class: 'resolve', type: 'button',
                            text: 'Resolve…'});
    b.addEventListener('click', () => openResolve(r));
    act.append(b);
  }
  tr.append(act);
  return tr;
}

let doubtNext = null;

async function showDoubt(more) {
  const body = $('#doubt tbody');
  const my = seq;
  const page = await api('doubt' + (more && doubtNext
    ? '?after=' + encodeURIComponent(doubtNext) : ''));
  if (my !== seq) return;
  if (!more) body.replaceChildren();
  for (const r of page.items) body.append(doubtRow(r, page.now));
  doubtNext = page.next;
  $('#doubt-more').hidden = !page.next;
  const n = body.children.length;
  $('#doubt-empty').hidden = n > 0;
  $('#doubt').hidden = n === 0;
  $('#doubt-count').textContent = n ? '(' + n + (page.next ? '+' : '') + ')'
                                    : '';
}

// ---- the verdict ----------------------------------------------------------

function openResolve(r) {
  resolving = r;
  $('#resolve-what').textContent = r.tool + ' — call ' + r.call_id +
    ' of session ' + r.session + ', key ' + r.key;
  for (const i of document.querySelectorAll('input[name=verdict]'))
    i.checked = false;
  $('#resolve-result').value = '';
  $('#resolve-reason').value = '';
  $('#resolve-by').value = localStorage.getItem('idem.by') || '';
  $('#resolve-error').hidden = true;
  $('#resolve-dialog').showModal();
}

async function submitResolve() {
  const r = resolving;
  const picked = $('input[name=verdict]:checked');
  const err = $('#resolve-error');
  if (!picked) {
    err.textContent = 'Pick applied or not applied.';
    err.hidden = false;
    return;
  }
  const by = $('#resolve-by').value.trim();
  if (by) localStorage.setItem('idem.by', by);
  const body = {session: r.session, call_id: r.call_id,
                verdict: picked.value, by};
  const result = $('#resolve-result').value.trim();
  const reason = $('#resolve-reason').value.trim();
  if (result) body.result = result;
  if (reason) body.reason = reason;
  const resp = await fetch('/api/resolve', {
    method: 'POST',
    credentials: 'same-origin',
    headers: {
      'Content-Type': 'application/json',
      'Authorization': 'Bearer ' + (sessionStorage.getItem('idem.token') ||
                                    ''),
      'X-Idem-CSRF': info.csrf || '',
    },
    body: JSON.stringify(body),
  });
  const answer = await resp.json().catch(() => ({error: resp.statusText}));
  if (resp.status === 400) { // the form's mistake: fix it in place
    err.textContent = answer.error;
    err.hidden = false;
    return;
  }
  $('#resolve-dialog').close();
  if (!resp.ok) {
    fail(answer.error || ('HTTP ' + resp.status));
  } else {
    say('Recorded: call ' + r.call_id + ' of session ' + r.session +
        ' is ' + answer.record.state + ' (' + picked.value.replace('_', ' ') +
        ', by ' + answer.record.resolved_by + ').');
  }
  await route();
}

// ---- search and timeline --------------------------------------------------

function recordRow(r) {
  return el('tr', {class: 'record-row',
                   data: {session: r.session, call: r.call_id}},
    el('td', {text: when(r.created)}),
    el('td', {}, el('a', {class: 'session-link', href: sessionHref(r.session),
                          text: r.session})),
    el('td', {}, el('a', {class: 'call-link',
                          href: callHref(r.session, r.call_id),
                          text: r.call_id})),
    el('td', {class: 'tool', text: r.tool}),
    el('td', {class: 'state state-' + r.state, text: r.state}),
    el('td', {class: 'attempts', text: String(r.attempts)}),
    el('td', {}, el('pre', {class: 'args', text: pretty(r.args)})));
}

let searchNext = null;

function searchQuery() {
  const q = new URLSearchParams();
  const put = (k, id) => {
    const v = $(id).value.trim();
    if (v) q.set(k, v);
  };
  put('session', '#q-session');
  put('call_id', '#q-call');
  put('key', '#q-key');
  put('tool', '#q-tool');
  put('state', '#q-state');
  return q;
}

async function showSearch(params, more) {
  if (!more && [...params.keys()].length) { // the fields show the URL's
    $('#q-session').value = params.get('session') || '';
    $('#q-call').value = params.get('call_id') || '';
    $('#q-key').value = params.get('key') || '';
    $('#q-tool').value = params.get('tool') || '';
    $('#q-state').value = params.get('state') || '';
  }
  const q = new URLSearchParams(params);
  if (more && searchNext) q.set('after', searchNext);
  if (!more) { // a new search: no row of the last one stays meanwhile
    $('#records tbody').replaceChildren();
    $('#more').hidden = true;
  }
  const my = seq;
  const page = await api('records?' + q);
  if (my !== seq) return;
  const body = $('#records tbody');
  if (!more) body.replaceChildren();
  for (const r of page.items) body.append(recordRow(r));
  searchNext = page.next;
  $('#more').hidden = !page.next;
}

function callCard(r) {
  const card = el('div', {class: 'call state-' + r.state,
                          data: {call: r.call_id}});
  const head = el('div', {class: 'head'},
    el('a', {class: 'call-link', href: callHref(r.session, r.call_id),
             text: r.call_id}),
    ' ',
    el('span', {class: 'tool', text: r.tool}),
    ' ',
    el('span', {class: 'state', text: r.state}),
    ' ',
    el('span', {class: 'muted', text: when(r.created) + ', ' + r.attempts +
      (r.attempts === 1 ? ' attempt' : ' attempts')}));
  card.append(head);
  if (r.duplicate_of) {
    card.append(el('p', {class: 'dup'}, 'answered as the repeat of ',
      el('a', {class: 'dup-link', href: callHref(r.session, r.duplicate_of),
               text: r.duplicate_of}),
      ' — it did not run'));
  }
  card.append(el('div', {class: 'label', text: 'arguments'}),
              el('pre', {class: 'args', text: pretty(r.args)}));
  if (r.result !== null && r.result !== undefined)
    card.append(el('div', {class: 'label', text: 'result'}),
                el('pre', {class: 'result', text: pretty(r.result)}));
  else if (r.result_bytes)
    card.append(el('p', {class: 'muted',
                         text: 'result of ' + r.result_bytes + ' bytes'}));
  if (r.error && r.resolution === 'operator')
    card.append(el('p', {class: 'reason', text: 'reason: ' + r.error}));
  else if (r.error)
    card.append(el('p', {class: 'error-text', text: r.error}));
  if (r.resolution === 'late')
    card.append(el('p', {class: 'late',
                         text: 'settled by a late result, ' +
                               when(r.updated)}));
  if (r.resolved_by)
    card.append(el('p', {class: 'verdict',
                         text: 'verdict by ' + r.resolved_by + ' at ' +
                               when(r.resolved_at)}));
  if (r.state === 'in_doubt')
    card.append(el('p', {class: 'doubt-note', text: 'in doubt; last check: ' +
                         lastCheck(r)}));
  return card;
}

let timelineNext = null;
let lastTurn = undefined;

async function showTimeline(session, more) {
  $('#timeline-title').textContent = session;
  const q = new URLSearchParams({session});
  if (more && timelineNext) q.set('after', timelineNext);
  const my = seq;
  const page = await api('session?' + q);
  if (my !== seq) return;
  const box = $('#timeline-calls');
  if (!more) {
    box.replaceChildren();
    lastTurn = undefined;
  }
  for (const r of page.items) {
    // one turn's calls together; a call without a turn stands alone
    let group = box.lastElementChild;
    if (!r.turn || r.turn !== lastTurn || !group) {
      group = el('div', {class: 'turn'});
      if (r.turn) {
        group.dataset.turn = r.turn;
        group.append(el('h3', {text: 'turn ' + r.turn}));
      }
      box.append(group);
    }
    lastTurn = r.turn;
    group.append(callCard(r));
  }
  timelineNext = page.next;
  $('#timeline-more').hidden = !page.next;
}

async function showCall(session, call) {
  const q = new URLSearchParams({session, call_id: call});
  const my = seq;
  const r = await api('record?' + q);
  if (my !== seq) return;
  $('#call-title').textContent = call + ' of session ' + session;
  const box = $('#call-detail');
  box.replaceChildren(callCard(r),
    el('p', {}, el('a', {class: 'session-link', href: sessionHref(session),
                         text: 'the whole session'})));
  const dl = el('dl', {class: 'fields'});
  for (const k of ['key', 'fingerprint', 'resolution', 'turn', 'owner',
                   'executor', 'last_check', 'check_with']) {
    if (r[k] == null) continue;
    dl.append(el('dt', {text: k}),
              el('dd', {text: typeof r[k] === 'string' ? r[k]
                                                       : pretty(r[k])}));
  }
  box.append(dl);
  if (!info.read_only && (r.state === 'in_doubt')) {
    const b = el('button', {class: 'resolve', type: 'button',
                            text: 'Resolve…'});
    b.addEventListener('click', () => openResolve(r));
    box.append(b);
  }
}

// ---- routes ---------------------------------------------------------------

function show(id) {
  for (const v of document.querySelectorAll('.view')) v.hidden = v.id !== id;
}

async function route() {
  const h = location.hash || '#/';
  seq++;
  try {
    if (h.startsWith('#/session/')) {
      show('timeline');
      await showTimeline(decodeURIComponent(h.slice(10)), false);
    } else if (h.startsWith('#/call/')) {
      const [s, c] = h.slice(7).split('/');
      show('view-call');
      await showCall(decodeURIComponent(s), decodeURIComponent(c || ''));
    } else if (h.startsWith('#/search')) {
      show('view-search');
      const i = h.indexOf('?');
      await showSearch(new URLSearchParams(i < 0 ? '' : h.slice(i + 1)),
                       false);
    } else {
      show('view-doubt');
      await showDoubt(false);
    }
  } catch (e) {
    fail(e.message);
  }
}

async function start() {
  try {
    info = await api('info');
  } catch (e) {
    fail('cannot reach idem serve: ' + e.message);
    return;
  }
  document.body.classList.toggle('read-only', info.read_only);
  $('#log-name').textContent = 'log ' + info.log +
    (info.read_only ? ' (read-only)' : '');
  $('#version').textContent = 'idem ' + info.version;
  $('#token').value = sessionStorage.getItem('idem.token') || '';
  $('#token-save').addEventListener('click', () => {
    sessionStorage.setItem('idem.token', $('#token').value.trim());
    say('Token set for this tab.');
  });
  $('#resolve-submit').addEventListener('click', () =>
    submitResolve().catch(e => fail(e.message)));
  $('#resolve-cancel').addEventListener('click', () =>
    $('#resolve-dialog').close());
  $('#search').addEventListener('submit', ev => {
    ev.preventDefault();
    const h = '#/search?' + searchQuery();
    if (location.hash === h) route();
    else location.hash = h;
  });
  $('#more').addEventListener('click', () =>
    showSearch(searchQuery(), true).catch(e => fail(e.message)));
  $('#doubt-more').addEventListener('click', () =>
    showDoubt(true).catch(e => fail(e.message)));
  $('#timeline-more').addEventListener('click', () =>
    showTimeline($('#timeline-title').textContent, true)
      .catch(e => fail(e.message)));
  window.addEventListener('hashchange', route);
  await route();
  // the list of actions in doubt stays current while it is looked at
  // (not while a verdict is being written, nor past its first page)
  setInterval(() => {
    const h = location.hash || '#/';
    if ((h === '#/' || h === '#') && !$('#resolve-dialog').open &&
        !doubtNext && !document.hidden)
      showDoubt(false).catch(e => fail(e.message));
  }, 10000);
}

document.addEventListener('DOMContentLoaded', start);
