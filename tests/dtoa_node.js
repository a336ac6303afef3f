#!/usr/bin/env node
// dtoa_node.js - compare idem__dtoa output with JavaScript's own number
// formatting.
//
//   test_dtoa --emit 1000000 --seed 7 | node tests/dtoa_node.js 1000000
//
// Each input line is "HEX,FORMATTED": the IEEE-754 bits of a double in hex
// and what idem__dtoa made of it.  The double is rebuilt from the bits (so no
// parsing is involved) and JSON.stringify(x) - which is what RFC 8785 uses,
// and which prints -0 as "0" - must equal FORMATTED byte for byte.
//
// The argument is the number of lines the emitter was asked for: fewer (an
// emitter that died or printed nothing) or more fails, so an empty pipe
// cannot pass.  The producer's own exit status is the caller's to check
// (CTest runs the pipe under bash's pipefail).
'use strict';

const readline = require('readline');

const expected = Number(process.argv[2]);
if (!Number.isSafeInteger(expected) || expected <= 0) {
  console.error('usage: test_dtoa --emit N ... | node dtoa_node.js N');
  process.exit(2);
}

const view = new DataView(new ArrayBuffer(8));
let passed = 0;
let failed = 0;
let lineNo = 0;

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });

rl.on('line', (line) => {
  lineNo++;
  if (line === '') return;
  const comma = line.indexOf(',');
  if (comma <= 0 || !/^[0-9a-fA-F]{1,16}$/.test(line.slice(0, comma))) {
    console.log(`line ${lineNo}: malformed: ${line}`);
    failed++;
    return;
  }
  const hex = line.slice(0, comma);
  const got = line.slice(comma + 1);
  view.setBigUint64(0, BigInt('0x' + hex));
  const x = view.getFloat64(0);
  const want = JSON.stringify(x);
  if (got === want) {
    passed++;
  } else {
    console.log(`MISMATCH ${hex}: dtoa=${got} node=${want}`);
    failed++;
  }
});

rl.on('close', () => {
  if (passed + failed !== expected) {
    console.log(`${passed + failed} lines compared, not the ${expected} asked for`);
    failed++;
  }
  console.log(`${passed} passed, ${failed} failed`);
  process.exitCode = failed ? 1 : 0;
});
