#!/usr/bin/env python3
"""keys_python.py - SPEC §3: idem's keys against the reference Python snippet.

    python3 tests/keys_python.py --idem build/idem [--count N] [--seed S]

Part 1 generates N calls (default 5000) from a seeded random: ids made of
the unreserved characters A-Za-z0-9-._~ (and some with other printable ASCII,
which idem percent-encodes), tool names, and arguments of printable-ASCII
strings (quotes and backslashes included), integers up to +-2^53 (the bounds
included), booleans, null, nested arrays and objects inserted in random key
order.  For those, SPEC §3 promises that idem's key is byte-identical to

    json.dumps({"tool":t,"args":a}, sort_keys=True, separators=(",",":"))
      -> sha256 -> hexdigest()[:16] -> f"{session}:{call}:{digest}"

(with the ids percent-encoded when they hold other characters).  The calls
go through `idem key --lines` (the keys) and `idem key --lines --json` (the
payload bytes and the full fingerprint), and each one is compared byte for
byte.

Part 2 checks the documented differences from the snippet (docs/KEYS.md):
6000 vs 6000.0, non-ASCII text, the h: form of long keys, --key-arg, and
that argument order and whitespace do not matter.

Standard library only.  Prints failures with both sides, then a final
`N passed, M failed` line; exits 1 on any failure.
"""

import argparse
import hashlib
import json
import random
import string
import subprocess
import sys

UNRESERVED = string.ascii_letters + string.digits + "-._~"
PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))
TWO53 = 2**53

passed = 0
failed = 0


def check(ok, what, got=None, want=None):
    """Count one check; on failure print what and both sides."""
    global passed, failed
    if ok:
        passed += 1
        return True
    failed += 1
    print(f"FAIL: {what}", file=sys.stderr)
    if got is not None or want is not None:
        print(f"   idem:     {got!r}", file=sys.stderr)
        print(f"   expected: {want!r}", file=sys.stderr)
    return False


# ---- the reference ---------------------------------------------------------


def snippet_payload(tool, args, ensure_ascii=True):
    return json.dumps({"tool": tool, "args": args}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=ensure_ascii)


def snippet_digest(tool, args):
    """The SPEC §3 snippet's digest16."""
    return hashlib.sha256(snippet_payload(tool, args).encode()).hexdigest()[:16]


def pct(s):
    """Percent-encode every byte outside A-Za-z0-9-._~ as %XX (uppercase)."""
    out = []
    for b in s.encode("utf-8"):
        c = chr(b)
        out.append(c if c in UNRESERVED else "%%%02X" % b)
    return "".join(out)


def expected_key(session, call, digest, max_len=255):
    key = f"{pct(session)}:{pct(call)}:{digest}"
    if len(key) > max_len:
        key = "h:" + hashlib.sha256(key.encode()).hexdigest()
    return key


# ---- running idem ----------------------------------------------------------


def run_idem(idem, argv, stdin=b""):
    p = subprocess.run([idem] + argv, input=stdin, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, check=False)
    return p.returncode, p.stdout, p.stderr


def idem_key(idem, session, call, tool, args_text, *opts):
    """(exit status, key or error text) of one `idem key` call."""
    if isinstance(args_text, str):
        args_text = args_text.encode("utf-8")
    rc, out, err = run_idem(idem, ["key", "--session", session, "--call", call,
                                   "--tool", tool] + list(opts), args_text)
    if rc != 0:
        return rc, err.decode("utf-8", "replace").strip()
    return rc, out.decode("utf-8").rstrip("\n")


def split_json_line(line):
    """Split a `--json` output line into (fingerprint, key, raw payload
    bytes).  The payload is raw canonical JSON, so it is cut out of the
    line rather than re-serialized."""
    marker = b',"payload":'
    i = line.index(marker)
    head = json.loads(line[:i] + b"}")
    return head["fingerprint"], head["key"], line[i + len(marker):-1]


# ---- part 1: generated calls ---------------------------------------------


def rand_id(rng, prefix, plain):
    n = rng.randint(1, 30)
    alphabet = UNRESERVED if plain else PRINTABLE
    s = "".join(rng.choice(alphabet) for _ in range(n))
    if not plain and all(c in UNRESERVED for c in s):
        s += rng.choice(":/% ?#&\"\\")  # make sure something needs encoding
    return prefix + s


def rand_str(rng, maxlen=20):
    n = rng.randint(0, maxlen)
    pool = PRINTABLE + '"\\"\\'  # extra weight on the characters JSON escapes
    return "".join(rng.choice(pool) for _ in range(n))


def rand_int(rng):
    r = rng.random()
    if r < 0.1:
        return rng.choice([TWO53, -TWO53, TWO53 - 1, -TWO53 + 1, 0, -1, 1])
    if r < 0.5:
        return rng.randint(-1000, 1000)
    return rng.randint(-TWO53, TWO53)


def rand_value(rng, depth):
    kinds = ["str", "int", "bool", "null"]
    if depth < 5:
        kinds += ["array", "object", "object"]
    k = rng.choice(kinds)
    if k == "str":
        return rand_str(rng)
    if k == "int":
        return rand_int(rng)
    if k == "bool":
        return rng.random() < 0.5
    if k == "null":
        return None
    if k == "array":
        return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return rand_object(rng, depth + 1)


def rand_object(rng, depth):
    """A dict whose insertion order (= the order json.dumps writes the
    members in the input line) is random."""
    names = set()
    for _ in range(rng.randint(0, 6)):
        names.add(rand_str(rng, 12))
    names = list(names)
    rng.shuffle(names)
    return {n: rand_value(rng, depth) for n in names}


TOOLS = ["refund_payment", "send_email", "create_ticket", "delete_record",
         "charge_card", "tool.with.dots", "tool-with-dash", "x"]


def gen_calls(rng, count):
    calls = []
    for i in range(count):
        plain = rng.random() < 0.8
        session = rand_id(rng, "sess_", plain)
        call = rand_id(rng, "toolu_", plain or rng.random() < 0.5)
        tool = rng.choice(TOOLS) if rng.random() < 0.7 else rand_str(rng, 16) or "t"
        args = rand_object(rng, 0)
        if i % 10 == 0:  # the typical shape, too
            args = {"amount_cents": rng.randint(1, 10**9),
                    "currency": rng.choice(["usd", "eur"]),
                    "reason": rand_str(rng, 60), "order_id": rand_id(rng, "ord_", True),
                    "items": [{"sku": rand_str(rng, 8), "qty": rng.randint(1, 9)}
                              for _ in range(rng.randint(0, 3))]}
        calls.append((session, call, tool, args))
    return calls


def part1(idem, count, seed):
    rng = random.Random(seed)
    calls = gen_calls(rng, count)
    lines = []
    for session, call, tool, args in calls:
        obj = {"session": session, "call": call, "tool": tool, "args": args}
        if rng.random() < 0.5:  # whitespace and member order vary
            lines.append(json.dumps(obj))
        else:
            lines.append(json.dumps(obj, separators=(",", ":"), indent=None))
    text = ("\n".join(lines) + "\n").encode("ascii")

    rc, out, err = run_idem(idem, ["key", "--lines"], text)
    check(rc == 0, f"idem key --lines exits 0 on {count} good calls (got {rc}: "
          f"{err.decode(errors='replace')[:300]})")
    keys = out.decode("utf-8").split("\n")
    check(keys[-1] == "" and len(keys) == count + 1,
          f"idem key --lines prints {count} lines (got {len(keys) - 1})")
    rc, jout, err = run_idem(idem, ["key", "--lines", "--json"], text)
    check(rc == 0, f"idem key --lines --json exits 0 (got {rc})")
    jlines = jout.split(b"\n")

    shown = 0
    for i, (session, call, tool, args) in enumerate(calls):
        digest = snippet_digest(tool, args)
        want = expected_key(session, call, digest)
        plain = all(c in UNRESERVED for c in session + call)
        if plain:  # the snippet itself, untouched
            assert want == f"{session}:{call}:{digest}"
        got = keys[i] if i < len(keys) else None
        ok = check(got == want, f"line {i + 1}: key of {lines[i][:200]}", got, want)
        payload = snippet_payload(tool, args).encode()
        try:
            fp, jkey, raw = split_json_line(jlines[i])
        except (IndexError, ValueError, KeyError) as e:
            ok = check(False, f"line {i + 1}: --json output unreadable ({e})") and ok
        else:
            ok = check(raw == payload, f"line {i + 1}: payload bytes", raw, payload) and ok
            ok = check(fp == hashlib.sha256(payload).hexdigest(),
                       f"line {i + 1}: fingerprint is sha256(payload)", fp,
                       hashlib.sha256(payload).hexdigest()) and ok
            ok = check(jkey == want, f"line {i + 1}: --json key", jkey, want) and ok
        if not ok:
            shown += 1
            if shown >= 10:
                print("(more failures not shown)", file=sys.stderr)
                break


# ---- part 2: the documented differences -----------------------------------


def part2(idem):
    s, c, t = "sess_1", "toolu_1", "refund_payment"

    # (a) 6000 and 6000.0 are one number in JCS, two in the snippet.
    rc1, k_int = idem_key(idem, s, c, t, '{"amount":6000}')
    rc2, k_flt = idem_key(idem, s, c, t, '{"amount":6000.0}')
    check(rc1 == 0 and rc2 == 0, "(a) idem accepts 6000 and 6000.0", (rc1, rc2), (0, 0))
    check(k_int == k_flt, "(a) 6000 and 6000.0 give the same idem key", k_flt, k_int)
    d_int = snippet_digest(t, json.loads('{"amount":6000}'))
    d_flt = snippet_digest(t, json.loads('{"amount":6000.0}'))
    check(d_int != d_flt, "(a) the snippet gives 6000 and 6000.0 different digests",
          d_flt, "!= " + d_int)
    check(k_int == f"{s}:{c}:{d_int}", "(a) the integer form matches the snippet",
          k_int, f"{s}:{c}:{d_int}")
    rc, k_exp = idem_key(idem, s, c, t, '{"amount":6e3}')
    check(rc == 0 and k_exp == k_int, "(a) 6e3 is the same number too", k_exp, k_int)

    # (b) non-ASCII: raw UTF-8 in idem's payload, \uXXXX in the snippet's.
    args = {"note": "Remboursement accordé — 退款 😀", "ok": True}
    text = json.dumps(args, ensure_ascii=False)
    rc, out, err = run_idem(idem, ["key", "--session", s, "--call", c, "--tool", t,
                                   "--json", text.encode("utf-8")])
    check(rc == 0, f"(b) idem key --json on non-ASCII exits 0 (got {rc}: {err!r})")
    raw_utf8 = snippet_payload(t, args, ensure_ascii=False).encode("utf-8")
    try:
        fp, key, payload = split_json_line(out.rstrip(b"\n"))
    except (ValueError, KeyError) as e:
        check(False, f"(b) --json output unreadable ({e}): {out!r}")
    else:
        check(payload == raw_utf8, "(b) idem's payload holds raw UTF-8", payload, raw_utf8)
        check("é".encode() in payload and b"\\u" not in payload,
              "(b) no \\u escapes in idem's payload", payload, raw_utf8)
        want_fp = hashlib.sha256(raw_utf8).hexdigest()
        check(fp == want_fp, "(b) fingerprint = sha256(raw-UTF-8 payload)", fp, want_fp)
        check(key == f"{s}:{c}:{want_fp[:16]}", "(b) key digest = sha256(raw UTF-8)[:16]",
              key, f"{s}:{c}:{want_fp[:16]}")
        d_ascii = snippet_digest(t, args)
        check(not key.endswith(d_ascii), "(b) the snippet (ensure_ascii) gives a different key",
              key, "not ending in " + d_ascii)

    # (c) long keys: h: + sha256 of the long form; --key-max-len keeps them.
    args_text = '{"amount":1}'
    d = snippet_digest(t, {"amount": 1})
    for total in (254, 255, 256, 300):
        sess = "s" * (total - len(c) - 2 - 16)
        long_form = f"{sess}:{c}:{d}"
        assert len(long_form) == total
        want = long_form if total <= 255 else "h:" + hashlib.sha256(long_form.encode()).hexdigest()
        rc, got = idem_key(idem, sess, c, t, args_text)
        check(rc == 0 and got == want, f"(c) key of {total} characters", got, want)
        rc, got = idem_key(idem, sess, c, t, args_text, "--key-max-len", "1000")
        check(rc == 0 and got == long_form, f"(c) --key-max-len 1000 keeps {total} plain",
              got, long_form)
    # percent-encoding counts towards the length
    sess = "/" * 80  # 240 characters once encoded
    long_form = f"{pct(sess)}:{c}:{d}"
    want = "h:" + hashlib.sha256(long_form.encode()).hexdigest()
    rc, got = idem_key(idem, sess, c, t, args_text)
    check(rc == 0 and got == want, "(c) the encoded length decides", got, want)
    rc, got = idem_key(idem, sess, c, t, args_text, "--key-max-len", "1000")
    check(rc == 0 and got == long_form, "(c) --key-max-len 1000, encoded", got, long_form)

    # (d) --key-arg drops that member before fingerprinting.
    want = f"{s}:{c}:{snippet_digest(t, {'amount': 1, 'currency': 'usd'})}"
    rc, got = idem_key(idem, s, c, t, '{"amount":1,"currency":"usd"}')
    check(rc == 0 and got == want, "(d) key without the member", got, want)
    for model_key in ('"made-up-by-the-model"', '"another"', "12345", "null",
                      '{"nested":true}'):
        rc, got = idem_key(idem, s, c, t,
                           '{"amount":1,"idempotency_key":%s,"currency":"usd"}' % model_key,
                           "--key-arg", "idempotency_key")
        check(rc == 0 and got == want,
              f"(d) --key-arg idempotency_key ignores the value {model_key}", got, want)
    rc, got = idem_key(idem, s, c, t,
                       '{"amount":1,"idempotency_key":"x","currency":"usd"}')
    check(rc == 0 and got != want, "(d) without --key-arg the member counts", got,
          "!= " + want)
    nested = {"amount": 1, "meta": {"idempotency_key": "x"}}
    want_n = f"{s}:{c}:{snippet_digest(t, nested)}"
    rc, got = idem_key(idem, s, c, t, json.dumps(nested), "--key-arg", "idempotency_key")
    check(rc == 0 and got == want_n, "(d) a deeper member of that name is kept", got, want_n)

    # (e) member order and whitespace do not change the key.
    forms = ['{"b":[1,2,{"y":null,"x":true}],"a":"q"}',
             '{"a":"q","b":[1,2,{"x":true,"y":null}]}',
             ' {\n\t"b" : [ 1 ,2, { "x" : true , "y" : null } ] ,\r\n "a":"q" }\n ']
    want = f"{s}:{c}:{snippet_digest(t, json.loads(forms[0]))}"
    for f in forms:
        rc, got = idem_key(idem, s, c, t, f)
        check(rc == 0 and got == want, f"(e) key of {f!r}", got, want)
    # ... and the same through --lines (one line each: no newlines inside),
    # with whitespace around the call too
    text = "".join(' {"args":%s , "tool":"%s","call":"%s","session":"%s"}\t\n'
                   % (f.replace("\r\n", " ").replace("\n", " "), t, c, s)
                   for f in forms)
    rc, out, err = run_idem(idem, ["key", "--lines"], text.encode())
    check(rc == 0 and out.decode().split("\n")[:-1] == [want] * 3,
          "(e) the same keys through --lines", out.decode(), (want + "\n") * 3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--idem", required=True, help="path to the idem binary")
    ap.add_argument("--count", type=int, default=5000, help="generated calls (5000)")
    ap.add_argument("--seed", type=int, default=20261202, help="random seed")
    opt = ap.parse_args()
    try:
        part1(opt.idem, opt.count, opt.seed)
        part2(opt.idem)
    except OSError as e:
        check(False, f"cannot run {opt.idem}: {e}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
