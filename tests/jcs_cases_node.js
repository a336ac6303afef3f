#!/usr/bin/env node
// jcs_cases_node.js - check the expectations of the project's own
// canonicalizer cases (tests/data/jcs) against an oracle other than idem.
//
//   node tests/jcs_cases_node.js tests/data/jcs
//
// Each ok_<case>/ holds `input` and `expected`: JSON.parse of the input,
// written out the RFC 8785 way (JSON.stringify for strings and numbers,
// members sorted by their names' UTF-16 code units, no white space), must
// be the expected bytes.  Each err_<case>/ holds `input` and `error`
// ("<status name> <byte offset>", an offset inside the input); those rules
// are idem's own (SPEC §4), so only their form is checked here.  A case
// with neither file, or a directory with no case, fails.
'use strict';

const fs = require('fs');
const path = require('path');

function canon(v) {
  if (Array.isArray(v)) return '[' + v.map(canon).join(',') + ']';
  if (v !== null && typeof v === 'object')
    return '{' + Object.keys(v).sort().map((k) => JSON.stringify(k) + ':' + canon(v[k])).join(',') + '}';
  return JSON.stringify(v);
}

const dir = process.argv[2];
if (!dir) {
  console.error('usage: node jcs_cases_node.js CASES_DIR');
  process.exit(2);
}
let ok = 0, err = 0, bad = 0;
for (const name of fs.readdirSync(dir).sort()) {
  if (name.startsWith('.') || name === 'README.md') continue;
  const d = path.join(dir, name);
  const input = fs.readFileSync(path.join(d, 'input'));
  if (fs.existsSync(path.join(d, 'expected'))) {
    const want = fs.readFileSync(path.join(d, 'expected'), 'utf8');
    let got;
    try {
      got = canon(JSON.parse(input.toString('utf8')));
    } catch (e) {
      got = `(JSON.parse: ${e.message})`;
    }
    if (got === want) ok++;
    else {
      console.log(`${name}: expected ${want}\n${' '.repeat(name.length)}  node     ${got}`);
      bad++;
    }
  } else if (fs.existsSync(path.join(d, 'error'))) {
    const m = /^([a-z0-9_]+) ([0-9]+)\n?$/.exec(fs.readFileSync(path.join(d, 'error'), 'utf8'));
    if (m && Number(m[2]) <= input.length) err++;
    else {
      console.log(`${name}: error is not "<status> <offset within the input>"`);
      bad++;
    }
  } else {
    console.log(`${name}: neither expected nor error`);
    bad++;
  }
}
console.log(`${ok} accepted cases agree with node, ${err} rejections well formed, ${bad} problems`);
process.exitCode = bad || ok === 0 || err === 0 ? 1 : 0;
