#!/usr/bin/env python3
"""Generate src/dtoa_table.h for src/dtoa.c, and prove the facts dtoa.c relies on.

Usage:  python3 src/dtoa_table.py > src/dtoa_table.h

Standard library only.  Everything is exact integer arithmetic; floats are
used at most for first guesses that are then checked exactly.

What it emits
  * the three floor-logarithm multipliers dtoa.c uses
    (floor(q log10 2), floor(q log10 2 - log10 4/3), floor(e log2 10)),
    each checked against the exact value over the whole range dtoa.c needs;
  * G[k - K_MIN] = floor(10^-k * 2^(127 - floor(log2 10^-k))) + 1, a 128-bit
    over-approximation of 10^-k normalised into [2^127, 2^128), for every
    decimal exponent k that dtoa.c can pick.

What it proves (and refuses to emit a table unless it holds)
  dtoa.c computes, for multiplicands x (x = 4c-2, 4c-1, 4c or 4c+2) and the
  exact real  X = x * 2^q * 10^-k,  the approximation
      Xc = (x << h) * G / 2^128,       h = q + floor(log2 10^-k) + 1,
  and keeps floor(Xc) plus a sticky bit "the top 64 fraction bits of Xc are
  not all zero".  This equals round-to-odd of the exact X if
    (a) 1 <= h and x << h < 2^64                 (no overflow), and
    (b) with d = Xc - X (0 < d <= x*2^h/2^128):
        frac(X) == 0  ->  d < 2^-64               (sticky stays 0, floor exact)
        frac(X) != 0  ->  2^-64 <= frac(X) and frac(X) + d < 1
  The sticky bit only matters when floor(X) is even (an odd floor already
  has its low bit set), and then frac(X) = 2 frac(X/2); so (b) needs
  frac(X/2) >= 2^-65 only.  For the symmetric interval x is even, x/2 any
  integer up to 2^54 - 1.  Both conditions are checked for every binary
  exponent q over ALL integers 1 <= x <= 2^55 - 2 (resp. x/2 <= 2^54 - 1), a
  superset of the multiplicands that occur, by computing the exact minimum
  and maximum of frac(x * alpha) with a continued-fraction (best one-sided
  approximation) walk, alpha = 2^q 10^-k; the lopsided interval at c = 2^52
  has just three multiplicands per q, checked directly.  (Over all x, without
  the parity argument, the bound fails: e.g. q = 664, x = 4*8887055249355788
  has frac(X) ~ 2^-65.4, but floor(X) is odd there.)
"""

import math
import random
import sys
from fractions import Fraction

# IEEE-754 binary64
P = 53                      # significand bits incl. the hidden one
Q_MIN = -1074               # exponent of the least significant bit, subnormals
Q_MAX = 2046 - 1075         # largest q of a finite double
X_MAX = 4 * (2**P - 1) + 2  # largest multiplicand dtoa.c forms (cbr)


# ---------------------------------------------------------------- exact logs

def floor_log10_frac(v):
    """floor(log10(v)) for a positive Fraction v, exactly."""
    k = math.floor(math.log10(v.numerator) - math.log10(v.denominator))
    while Fraction(10) ** k > v:
        k -= 1
    while Fraction(10) ** (k + 1) <= v:
        k += 1
    return k


def floor_log10_pow2(q):
    return floor_log10_frac(Fraction(2) ** q)


def floor_log10_three_quarters_pow2(q):
    return floor_log10_frac(Fraction(3, 4) * Fraction(2) ** q)


def floor_log2_pow10(e):
    if e >= 0:
        return (10 ** e).bit_length() - 1
    # 10^-e is not a power of two for e < 0, so ceil(log2) = bit_length
    return -((10 ** -e).bit_length())


def find_multiplier(exact, lo, hi, logval, shift, offset_real=0.0):
    """Find integers (m, b) with (n*m - b) >> shift == exact(n) on [lo, hi]."""
    base_m = math.floor(logval * 2 ** shift)
    base_b = math.floor(offset_real * 2 ** shift)
    for m in (base_m, base_m + 1, base_m - 1):
        for b in (base_b, base_b + 1, base_b - 1, base_b + 2):
            if all((n * m - b) >> shift == exact(n) for n in range(lo, hi + 1)):
                return m, b
    raise SystemExit("no multiplier found for shift %d" % shift)


# --------------------------------------------- min/max of x*alpha mod 1

def min_pos_residue(a, m, n):
    """min of (a*x mod m) over 1 <= x <= n, excluding residues 0.

    Requires gcd(a, m) == 1 and 0 < a < m.  Walks the best one-sided
    approximations: P = (xp, rp) with a*xp == rp, Q = (xq, sq) with
    a*xq == -sq (mod m).  (P, Q) is always a lattice basis of determinant m,
    which forces every 0 < x < xp + xq to have a residue outside (-sq, rp);
    so rp is the least positive residue below xp + xq.
    """
    if n >= m - 1:
        return 1            # x = 1 .. m-1 hits every non-zero residue
    xp, rp = 1, a
    xq, sq = 0, m
    while True:
        if rp < sq:
            j = (sq - 1) // rp
            xq, sq = xq + j * xp, sq - j * rp
        else:
            j = (rp - 1) // sq
            jmax = (n - xp) // xq
            if j == 0 or jmax == 0:
                return rp
            if jmax < j:
                return rp - jmax * sq
            xp, rp = xp + j * xq, rp - j * sq


def frac_bounds(alpha, n):
    """(min non-zero, max) of frac(x*alpha) over 1 <= x <= n, or None if all 0."""
    a, m = alpha.numerator % alpha.denominator, alpha.denominator
    if m == 1 or a == 0:
        return None
    lo = Fraction(min_pos_residue(a, m, n), m)
    hi = 1 - Fraction(min_pos_residue(m - a, m, n), m)
    return lo, hi


def self_test_residue():
    rnd = random.Random(1)
    for _ in range(3000):
        m = rnd.randrange(2, 400)
        a = rnd.randrange(1, m)
        if math.gcd(a, m) != 1:
            continue
        n = rnd.randrange(1, 2 * m)
        want = min((a * x) % m for x in range(1, n + 1) if (a * x) % m)
        got = min_pos_residue(a, m, n)
        if want != got:
            raise SystemExit("min_pos_residue self-test failed %r" % ((a, m, n, want, got),))


# ------------------------------------------------------------------- table

def g_of(e):
    """floor(10^e * 2^(127 - floor(log2 10^e))) + 1."""
    s = 127 - floor_log2_pow10(e)
    if e >= 0:
        num, den = 10 ** e, 1
    else:
        num, den = 1, 10 ** -e
    if s >= 0:
        num <<= s
    else:
        den <<= -s
    g = num // den + 1
    assert 2 ** 127 <= g < 2 ** 128, e
    return g


def main():
    self_test_residue()

    qs = range(Q_MIN, Q_MAX + 1)
    m10, _ = find_multiplier(floor_log10_pow2, -1100, 1100, math.log10(2), 22)
    m10b, b10 = find_multiplier(floor_log10_three_quarters_pow2, -1100, 1100,
                                math.log10(2), 22, math.log10(4 / 3))
    assert m10b == m10
    m2, _ = find_multiplier(floor_log2_pow10, -400, 400, math.log2(10), 19)

    uses = []               # (q, k, list of multiplicand ranges)
    for q in qs:
        uses.append((q, floor_log10_pow2(q), "sym"))
        if q > Q_MIN:       # c == 2^52 with a coarser ulp above than below
            uses.append((q, floor_log10_three_quarters_pow2(q), "asym"))
    ks = [k for _, k, _ in uses]
    k_min, k_max = min(ks), max(ks)
    gs = {k: g_of(-k) for k in range(k_min, k_max + 1)}

    worst_lo, worst_gap = Fraction(1), Fraction(1)
    for q, k, kind in uses:
        h = q + floor_log2_pow10(-k) + 1
        assert 1 <= h <= 4, (q, k, h)
        assert X_MAX << h < 2 ** 64
        g = gs[k]
        g_exact = Fraction(10) ** -k * Fraction(2) ** (127 - floor_log2_pow10(-k))
        alpha = Fraction(2) ** q * Fraction(10) ** -k
        d_max = X_MAX * 2 ** h * (g - g_exact) / 2 ** 128
        assert 0 < d_max < Fraction(1, 2 ** 64), (q, k)
        # Floor: every fraction plus the error stays below 1.
        # Sticky: only matters when floor(X) is even (an odd floor already
        # has its last bit set), i.e. when frac(X/2) < 1/2, and then
        # frac(X) = 2 frac(X/2); so it suffices that every non-zero
        # frac(X/2) is >= 2^-65.  For the symmetric interval x is even
        # (4c, 4c +- 2), so X/2 = y * alpha with y = x/2 <= X_MAX/2.
        if kind == "sym":
            b_full = frac_bounds(alpha, X_MAX)
            b_half = frac_bounds(alpha, X_MAX // 2)
            if b_full is None:
                continue
            hi = b_full[1]
            lo = b_half[0] * 2 if b_half is not None else Fraction(1)
        else:
            c = 2 ** (P - 1)
            xs = (4 * c - 1, 4 * c, 4 * c + 2)
            fr = [x * alpha - math.floor(x * alpha) for x in xs]
            half = [x * alpha / 2 - math.floor(x * alpha / 2) for x in xs]
            half = [f for f in half if f]
            hi = max(fr)
            lo = 2 * min(half) if half else Fraction(1)
        worst_lo = min(worst_lo, lo)
        worst_gap = min(worst_gap, 1 - hi - d_max)

    out = sys.stdout
    out.write("/*\n** dtoa_table.h - GENERATED by src/dtoa_table.py; do not edit.\n**\n")
    out.write("** G[k - DTOA_K_MIN] = floor(10^-k * 2^(127 - floor(log2 10^-k))) + 1,\n")
    out.write("** as {high 64 bits, low 64 bits}.  The generator proved, for every\n")
    out.write("** binary exponent, that dtoa.c's round-to-odd products are exact:\n")
    out.write("** smallest non-zero fraction seen 2^%.2f (need >= 2^-64), smallest\n"
              % math.log2(worst_lo))
    out.write("** distance of a fraction plus error from 1: 2^%.2f (need > 0).\n*/\n"
              % math.log2(worst_gap))
    out.write("#ifndef IDEM_DTOA_TABLE_H\n#define IDEM_DTOA_TABLE_H\n\n")
    out.write("#include <stdint.h>\n\n")
    out.write("#define DTOA_K_MIN (%d)\n#define DTOA_K_MAX %d\n" % (k_min, k_max))
    out.write("/* Floor-division (>> as floor) forms, each checked exactly by the generator:\n")
    out.write("**   floor(q log10 2)            = (q * DTOA_LOG10_2) >> 22\n")
    out.write("**   floor(q log10 2 - log10 4/3) = (q * DTOA_LOG10_2 - DTOA_LOG10_4_3) >> 22\n")
    out.write("**                                  for |q| <= 1100\n")
    out.write("**   floor(e log2 10)            = (e * DTOA_LOG2_10) >> 19  for |e| <= 400 */\n")
    out.write("#define DTOA_LOG10_2 %d\n" % m10)
    out.write("#define DTOA_LOG10_4_3 %d\n" % b10)
    out.write("#define DTOA_LOG10_2_SHIFT 22\n")
    out.write("#define DTOA_LOG2_10 %d\n" % m2)
    out.write("#define DTOA_LOG2_10_SHIFT 19\n\n")
    out.write("static const uint64_t dtoa_g[%d][2] = {\n" % (k_max - k_min + 1))
    for k in range(k_min, k_max + 1):
        g = gs[k]
        out.write("    {0x%016xu, 0x%016xu}, /* %d */\n" % (g >> 64, g & (2**64 - 1), k))
    out.write("};\n\n#endif /* IDEM_DTOA_TABLE_H */\n")


if __name__ == "__main__":
    main()
