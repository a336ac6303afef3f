#!/usr/bin/env python3
"""Generate src/strtod_table.h for src/strtod.c, and check the facts strtod.c relies on.

Usage:  python3 src/strtod_table.py > src/strtod_table.h

Standard library only.  Everything is exact integer arithmetic; floats are
used at most for first guesses that are then checked exactly.  The output
depends on nothing but this file (the model check below is seeded), so it
is reproducible byte for byte.

What it emits
  * STRTOD_E_MIN, STRTOD_E_MAX: the decimal exponents strtod.c must compute.
    Below E_MIN every m * 10^e with 1 <= m <= 2^64 is at most 2^-1075, half
    the least subnormal, so it rounds to zero (a tie goes to the even 0);
    above E_MAX every such value with m >= 1 is at least 2^1024 - 2^970,
    the midpoint between DBL_MAX and 2^1024, so it rounds to infinity.  Both
    bounds are also shown to be tight (one exponent further in, a result is
    neither 0 nor infinity), so the table is no larger than it must be.
  * T[e - E_MIN] = floor(5^e * 2^(127 - floor(log2 5^e))), the power of five
    normalised into [2^127, 2^128) and truncated, for E_MIN <= e <= E_MAX.
    It is exact (T = 5^e * 2^s) exactly for 0 <= e <= STRTOD_EXACT_MAX; for
    every other e the dropped part is strictly between 0 and 1 (5^e is then
    not an integer, or is odd with more than 128 bits).
  * floor(e log2 10) = (e * STRTOD_LOG2_10) >> STRTOD_LOG2_10_SHIFT, checked
    exactly for |e| <= 400 (a superset of the table's range).

What it checks (and refuses to emit a table unless it holds)
  The facts above, exactly; and a Python transcription of strtod.c's
  decision procedure (model() below) against exact rational rounding on
  every threshold case and on a seeded sample of random, subnormal,
  near-overflow and exact-halfway inputs: the model must never return a
  wrong double (it may return "undecided").  This ties the constants strtod.c
  hard-codes (the exponent bias 1086, the round-bit position 9 + upper) to
  the table.  Correctness of strtod.c does not rest on a bound on how often
  it is undecided: that is measured by tests/test_strtod.c.
"""

import math
import random
import sys

# IEEE-754 binary64
P = 53
M_BOUND = 2 ** 64          # strtod.c feeds m and m + 1 with m < 2^64 - 1
OVER = 2 ** 1024 - 2 ** 970  # the least real that rounds to +infinity
INF_BITS = 0x7FF << 52
EXP_BIAS = 63 + 1023       # see strtod.c: be = floor(e log2 10) + 1086 + upper - lz


# ------------------------------------------------------------- exact facts

def floor_log2_pow5(e):
    if e >= 0:
        return (5 ** e).bit_length() - 1
    # 5^-e is not a power of two for e < 0, so ceil(log2 5^-e) = bit_length
    return -((5 ** -e).bit_length())


def floor_log2_pow10(e):
    if e >= 0:
        return (10 ** e).bit_length() - 1
    return -((10 ** -e).bit_length())


def pow5_entry(e):
    """(T, exact) with T = floor(5^e * 2^(127 - floor(log2 5^e)))."""
    s = 127 - floor_log2_pow5(e)
    if e >= 0:
        num, den = 5 ** e, 1
    else:
        num, den = 1, 5 ** -e
    if s >= 0:
        num <<= s
    else:
        den <<= -s
    t, rem = divmod(num, den)
    assert 2 ** 127 <= t < 2 ** 128, e
    return t, rem == 0


def thresholds():
    """(E_MIN, E_MAX) as documented above, with their tightness."""
    # m * 10^e <= 2^-1075 for all m <= M_BOUND  <=>  M_BOUND * 2^1075 <= 10^-e
    e_zero = -1
    while not M_BOUND * 2 ** 1075 <= 10 ** -e_zero:
        e_zero -= 1
    e_min = e_zero + 1
    # tight: with the largest 19-digit m, e_min gives more than half the
    # least subnormal (so it is not always zero)
    assert (10 ** 19 - 1) * 2 ** 1075 > 10 ** -e_min
    # 10^e >= OVER for e > e_max, and 10^e_max < OVER (m = 1 is finite)
    e_max = 0
    while 10 ** (e_max + 1) < OVER:
        e_max += 1
    assert 10 ** (e_max + 1) >= OVER and 10 ** e_max < OVER
    return e_min, e_max


def find_multiplier(exact, lo, hi, logval, shift):
    """m with (n * m) >> shift == exact(n) for every n in [lo, hi]."""
    base = math.floor(logval * 2 ** shift)
    for m in (base, base + 1, base - 1, base + 2):
        if all((n * m) >> shift == exact(n) for n in range(lo, hi + 1)):
            return m
    raise SystemExit("no multiplier found for shift %d" % shift)


# ----------------------------------------------- the model of strtod.c

def exact_bits(num, den):
    """Bits of the double nearest num/den > 0, ties to even (the oracle)."""
    e2 = num.bit_length() - den.bit_length()
    if e2 >= 0:
        if num < den << e2:
            e2 -= 1
    elif num << -e2 < den:
        e2 -= 1
    q = max(e2 - (P - 1), -1074)      # exponent of the last kept bit
    if q >= 0:
        k, rem = divmod(num, den << q)
        half = den << q
    else:
        k, rem = divmod(num << -q, den)
        half = den
    if 2 * rem > half or (2 * rem == half and k & 1):
        k += 1
    bits = ((q + 1074) << 52) + k
    return min(bits, INF_BITS)


def value_bits(m, e):
    if e >= 0:
        return exact_bits(m * 10 ** e, 1)
    return exact_bits(m, 10 ** -e)


class Model:
    def __init__(self, table, e_min, e_max, exact_max, log2_10, shift):
        self.table, self.e_min, self.e_max = table, e_min, e_max
        self.exact_max, self.log2_10, self.shift = exact_max, log2_10, shift

    def core(self, m, e):
        """strtod.c's eisel_lemire(): bits, or None when undecided."""
        if e < self.e_min:
            return 0
        if e > self.e_max:
            return INF_BITS
        t = self.table[e - self.e_min]
        lz = 64 - m.bit_length()
        w = m << lz
        p = w * t                     # the full 192-bit product
        p2, p1, p0 = p >> 128, (p >> 64) & (2 ** 64 - 1), p & (2 ** 64 - 1)
        upper = p2 >> 63
        be = ((e * self.log2_10) >> self.shift) + EXP_BIAS + upper - lz
        rb = 9 + upper
        if be <= 0:
            rb += 1 - be
            be = 1
            if rb > 63:
                return 0
        k = 0 if rb == 63 else p2 >> (rb + 1)
        r = (p2 >> rb) & 1
        below = p2 & ((1 << rb) - 1)
        if 0 <= e <= self.exact_max:
            up = r and (below or p1 or p0 or k & 1)
        else:
            if not r and below == (1 << rb) - 1 and p1 == 2 ** 64 - 1 and \
                    p0 + w >= 2 ** 64:
                if -27 <= e < 0 and m % 5 ** -e == 0:
                    return exact_bits(m // 5 ** -e, 2 ** -e)
                return None
            up = r
        bits = ((be - 1) << 52) + k + (1 if up else 0)
        return min(bits, INF_BITS)

    def decide(self, m, e, truncated):
        if m == 0:
            return 0
        a = self.core(m, e)
        if not truncated or a is None:
            return a
        b = self.core(m + 1, e)
        return a if a == b else None


def model_check(model, e_min, e_max):
    """Returns {truncated: (cases, undecided)}; exits on any wrong answer."""
    rnd = random.Random(20260514)
    cases = []
    for e in (e_min - 2, e_min - 1, e_min, e_min + 1, e_max - 1, e_max, e_max + 1):
        for m in (1, 2, 3, 9, 10 ** 18, 10 ** 19 - 1, 2 ** 63, 2 ** 64 - 2):
            cases.append((m, e, 0))
            cases.append((m, e, 1))
    # around half the least subnormal and the overflow threshold
    for digits in ("24703282292062327", "24703282292062328",
                   "49406564584124654", "22250738585072011",
                   "22250738585072014", "17976931348623157",
                   "17976931348623158", "17976931348623159"):
        for extra in range(0, 3):
            m = int(digits + "0" * extra)
            exp = {"2470": -340, "4940": -340, "2225": -324, "1797": 292}
            cases.append((m, exp[digits[:4]] - extra, 0))
    for _ in range(60000):
        nd = rnd.randint(1, 19)
        m = rnd.randrange(10 ** (nd - 1), 10 ** nd)
        cases.append((m, rnd.randint(e_min - 2, e_max + 2), 0))
    for _ in range(20000):           # a literal cut after 19 digits
        m = rnd.randrange(10 ** 18, 10 ** 19)
        cases.append((m, rnd.randint(e_min - 2, e_max + 2), 1))
    for _ in range(8000):            # subnormal and near DBL_MIN
        m = rnd.randrange(1, 10 ** 19)
        cases.append((m, rnd.randint(-345, -300), 0))
    for _ in range(4000):            # exact halfway points with <= 19 digits
        c = rnd.randrange(2 ** 52, 2 ** 53)
        q = rnd.randint(-4, 12)
        # the midpoint (c + 1/2) 2^q = (2c + 1) 2^(q - 1), as m * 10^e
        num, den = (2 * c + 1) << max(q - 1, 0), 1 << max(1 - q, 0)
        e = 0
        while den > 1:
            num, den, e = num * 5, den // 2, e - 1
        while num % 10 == 0:
            num, e = num // 10, e + 1
        if num < 10 ** 19:
            cases.append((num, e, 0))
            cases.append((num - 1, e, 0))
            cases.append((num + 1, e, 0))
    counts = {0: [0, 0], 1: [0, 0]}
    for m, e, tr in cases:
        got = model.decide(m, e, tr)
        counts[tr][0] += 1
        if got is None:
            counts[tr][1] += 1
            continue
        lo = value_bits(m, e)
        if tr:
            hi = value_bits(m + 1, e)
            ok = lo == hi == got
        else:
            ok = got == lo
        if not ok:
            raise SystemExit("model disagrees: m=%d e=%d truncated=%d" % (m, e, tr))
    return counts


# ------------------------------------------------------------------- main

def main():
    e_min, e_max = thresholds()
    log2_10_shift = 19
    log2_10 = find_multiplier(floor_log2_pow10, -400, 400, math.log2(10),
                              log2_10_shift)
    assert e_min >= -400 and e_max <= 400

    table, exact = [], []
    for e in range(e_min, e_max + 1):
        t, ex = pow5_entry(e)
        table.append(t)
        if ex:
            exact.append(e)
    exact_max = max(exact)
    assert exact == list(range(0, exact_max + 1)), exact
    assert exact_max == 55 and 5 ** 55 < 2 ** 128 <= 5 ** 56

    model = Model(table, e_min, e_max, exact_max, log2_10, log2_10_shift)
    counts = model_check(model, e_min, e_max)

    out = sys.stdout
    out.write("/*\n** strtod_table.h - GENERATED by src/strtod_table.py; do not edit.\n**\n")
    out.write("** strtod_pow5[e - STRTOD_E_MIN] = floor(5^e * 2^(127 - floor(log2 5^e))),\n")
    out.write("** as {high 64 bits, low 64 bits}: 5^e normalised into [2^127, 2^128)\n")
    out.write("** and truncated; exact for 0 <= e <= STRTOD_EXACT_MAX, otherwise short\n")
    out.write("** of the true value by a fraction strictly between 0 and 1.\n")
    out.write("** Checked by the generator: below STRTOD_E_MIN every m * 10^e with\n")
    out.write("** 1 <= m <= 2^64 rounds to 0, above STRTOD_E_MAX every one rounds to\n")
    out.write("** infinity, and both bounds are tight.  A model of strtod.c agreed with\n")
    out.write("** exact rounding on %d complete and %d truncated literals, none wrong\n"
              % (counts[0][0], counts[1][0]))
    out.write("** (undecided: %d and %d).\n*/\n" % (counts[0][1], counts[1][1]))
    out.write("#ifndef IDEM_STRTOD_TABLE_H\n#define IDEM_STRTOD_TABLE_H\n\n")
    out.write("#include <stdint.h>\n\n")
    out.write("#define STRTOD_E_MIN (%d)\n#define STRTOD_E_MAX %d\n" % (e_min, e_max))
    out.write("#define STRTOD_EXACT_MAX %d\n" % exact_max)
    out.write("/* floor(e log2 10) = (e * STRTOD_LOG2_10) >> STRTOD_LOG2_10_SHIFT (a\n")
    out.write("** floor shift), checked exactly for |e| <= 400. */\n")
    out.write("#define STRTOD_LOG2_10 %d\n" % log2_10)
    out.write("#define STRTOD_LOG2_10_SHIFT %d\n\n" % log2_10_shift)
    out.write("static const uint64_t strtod_pow5[%d][2] = {\n" % len(table))
    for e, t in zip(range(e_min, e_max + 1), table):
        out.write("    {0x%016xu, 0x%016xu}, /* %d */\n" % (t >> 64, t & (2 ** 64 - 1), e))
    out.write("};\n\n#endif /* IDEM_STRTOD_TABLE_H */\n")


if __name__ == "__main__":
    main()
