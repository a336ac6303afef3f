// The binding's tables against include/idem.h, read at test time: the
// error classes against IDEM_STATUS_MAP, the enums and flags the driver
// uses, and the layouts of idem_call and idem_completion as koffi lays
// them out against the compiler's (a small C program printing sizeof and
// offsetof, compiled here).
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import koffi from 'koffi';
import { ERRORS, IdemError, JSONError, StoreError } from '../src/errors.js';
import { NEXT, OUTCOME, DELIVER, ENDED } from '../src/driver.js';
import { lib } from '../src/lib.js';
import { plainEnv } from './helpers.js';

const REPO = fileURLToPath(new URL('../../../', import.meta.url));
const HEADER = fs.readFileSync(path.join(REPO, 'include', 'idem.h'), 'utf8');

test('one error class per status code of the header, with its name', () => {
  const rows = [...HEADER.matchAll(/X\((\w+), (\d+), "(\w+)", "[^"]*"\)/g)]
    .map((m) => [Number(m[2]), m[3]]);
  assert.ok(rows.length >= 25, `read ${rows.length} codes`);
  for (const [code, name] of rows) {
    if (code === 0) continue;
    const cls = ERRORS.get(code);
    assert.ok(cls, `no class for code ${code} (${name})`);
    assert.equal(cls.status, name, `code ${code}`);
    assert.equal(cls.code, code);
    assert.ok(new cls('x') instanceof IdemError);
  }
  assert.equal(ERRORS.size, rows.length - 1, 'no class for a code the ' +
    'header does not have');
  assert.ok(new (ERRORS.get(24))('x') instanceof JSONError);
  assert.ok(new (ERRORS.get(43))('x') instanceof StoreError);
  // the types declare every class
  const dts = fs.readFileSync(new URL('../src/index.d.ts', import.meta.url),
    'utf8');
  for (const cls of ERRORS.values())
    assert.match(dts, new RegExp(`export class ${cls.name} extends`),
      `index.d.ts declares ${cls.name}`);
  // and the library agrees at run time
  const L = lib();
  for (const [code, name] of rows) assert.equal(L.status_name(code), name);
});

function enumOf(name) {
  const body = HEADER.match(new RegExp(`enum ${name} \\{([^}]*)\\}`))[1];
  return Object.fromEntries([...body.matchAll(/IDEM_\w+?_(\w+) = (\d+)/g)]
    .map((m) => [m[1], Number(m[2])]));
}

test('the enums the driver uses are the header\'s', () => {
  assert.deepEqual(NEXT, enumOf('idem_next'));
  assert.deepEqual(OUTCOME, enumOf('idem_outcome'));
  assert.match(HEADER, new RegExp(`#define IDEM_QUEUE_DELIVER ${DELIVER} `));
  assert.match(HEADER, new RegExp(`#define IDEM_QUEUE_ENDED ${ENDED} `));
});

const STRUCTS = {
  idem_call: ['Call', ['size', 'session', 'call_id', 'tool', 'args',
    'args_len', 'turn', 'own_check']],
  idem_completion: ['Completion', ['size', 'user', 'step', 'op', 'rc',
    'next', 'answer', 'errmsg']],
  idem_metrics: ['Metrics', ['size', 'answers', 'replays', 'fenced',
    'coalesced', 'attempts', 'late', 'checks', 'resolved', 'latency_le',
    'latency_count', 'latency_sum_us']],
};

test('idem_call, idem_completion and idem_metrics as koffi lays them ' +
  'out are the ' +
  'compiler\'s', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-layout-'));
  try {
    // the layout does not depend on the version header, which a build makes
    fs.writeFileSync(path.join(dir, 'idem_version.h'), '');
    const lines = [];
    for (const [st, [, fields]] of Object.entries(STRUCTS)) {
      lines.push(`  printf("${st}.sizeof %zu\\n", sizeof(${st}));`);
      for (const f of fields)
        lines.push(`  printf("${st}.${f} %zu\\n", offsetof(${st}, ${f}));`);
    }
    fs.writeFileSync(path.join(dir, 'layout.c'), [
      '#include <stddef.h>', '#include <stdio.h>', '#include "idem.h"',
      'int main(void) {', ...lines, '  return 0;', '}', ''].join('\n'));
    const exe = path.join(dir, 'layout');
    // the compiler and the program are not this process: without the
    // sanitizer's preload of the sanitizer build
    const env = plainEnv();
    execFileSync(process.env.CC || 'cc', ['-I', path.join(REPO, 'include'),
      '-I', dir, '-o', exe, path.join(dir, 'layout.c')], { env });
    const c = Object.fromEntries(execFileSync(exe, { encoding: 'utf8', env })
      .trim().split('\n').map((l) => l.split(' '))
      .map(([k, v]) => [k, Number(v)]));
    const L = lib();
    assert.equal(L.callSize, c['idem_call.sizeof']);
    assert.equal(L.completionSize, c['idem_completion.sizeof']);
    for (const [st, [js, fields]] of Object.entries(STRUCTS)) {
      assert.equal(koffi.sizeof(L[js]), c[`${st}.sizeof`], `sizeof ${st}`);
      for (const f of fields)
        assert.equal(koffi.offsetof(L[js], f), c[`${st}.${f}`],
          `offsetof(${st}, ${f})`);
      // the header's field list is exactly the binding's
      const body = HEADER.match(new RegExp(
        `typedef struct ${st} \\{([\\s\\S]*?)\\} ${st};`))[1]
        .replace(/\/\*[\s\S]*?\*\//g, '');
      const declared = [...body.matchAll(/(\w+)(?:\[\w*\])?;/g)]
        .map((m) => m[1]);
      assert.deepEqual(declared, fields, st);
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
