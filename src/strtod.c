/*
** strtod.c - decimal to double, correctly rounded, by Eisel-Lemire.
**
** The canonicalizer turns every number that is not a small integer into the
** nearest double.  Its parser hands this file the first 19 significant
** digits m and a decimal exponent e (v = m * 10^e) and gets the double back
** without big integers, or "undecided" (0) in rare cases where it must ask
** strtod_l instead.  Algorithm: D. Lemire, "Number Parsing at a Gigabyte per
** Second" (2021), and N. Mushtak, D. Lemire, "Fast number parsing without
** fallback" (2023), written from the papers' description.
**
**  1. 10^e = 5^e * 2^e.  The table (strtod_table.py) holds 5^e = F * 2^b
**     with F real in [2^127, 2^128) as T = floor(F), 128 bits.  T = F for
**     0 <= e <= STRTOD_EXACT_MAX (55); for every other e, 0 < F - T < 1.
**
**  2. Normalise w = m << lz into [2^63, 2^64).  Then v = X * 2^(e + b - lz)
**     with X = w * F in [2^190, 2^192), and the 192-bit product P = w * T
**     (two 64x64 multiplications) satisfies X = P when T is exact and
**     P < X < P + w < P + 2^64 otherwise.  The binary exponent of v is
**     E = 190 + upper + e + b - lz with upper = bit 191 of P, and since
**     e + floor(log2 5^e) = floor(e log2 10) the biased exponent is
**         be = floor(e log2 10) + 1086 + upper - lz        (1086 = 63 + 1023).
**
**  3. Rounding X to 53 bits keeps K = the top 53 bits (P's bits from
**     138 + upper, i.e. p2 >> (10 + upper)), looks at the round bit r just
**     below and at whether anything below that is non-zero.  With T exact
**     this is done on P = X directly, ties to even.  Otherwise X > P, so
**     whenever X stays below H, the next multiple of the round bit's weight
**     above P, its sticky part is non-zero and the answer is K + r.  X can
**     reach H only if every bit of P between the round bit and bit 64 is 1
**     and p0 + w carries (X < P + w).  Then: if r = 1, X either stays in
**     the upper half or passes H = (K + 1) * 2^L, and both round to K + 1,
**     K + r again; if r = 0, H is the midpoint between two doubles and X may
**     lie on either side of it or on it: undecided.  X sits exactly on a
**     midpoint only when v is dyadic, i.e. e < 0 and 5^-e divides m, which
**     needs e >= -27 (5^28 > 2^64); then v = (m / 5^-e) * 2^e is rounded
**     exactly with integers.  Anything else that near a midpoint (about
**     one random input in 2^73) returns 0.  Mushtak and Lemire prove that
**     the corresponding check of the 2021 algorithm never fires for
**     significands of up to 19 digits; this file keeps its check anyway
**     (one branch, rarely taken), so no double it returns depends on that
**     proof, only on the argument above.
**
**  4. Subnormals: when be <= 0 the last kept bit has the weight 2^-1074
**     whatever X's binade, so the round bit moves up by 1 - be and step 3
**     applies unchanged with the wider mask; past bit 191 the value is below
**     half the least subnormal and rounds to 0.  A carry out of K (to 2^53,
**     or 2^52 from a subnormal) is absorbed by writing the bits as
**     ((be - 1) << 52) + K; it is also the right answer when P < 2^191 <= X
**     (P's bits are then all ones, r = 1).  Bits at or above those of
**     infinity mean v rounds to infinity.
**
**  5. Range: for e < STRTOD_E_MIN (-342) every m * 10^e with m <= 2^64 is
**     at most 2^-1075 and rounds to 0; for e > STRTOD_E_MAX (308) every one
**     with m >= 1 is at least 2^1024 - 2^970 and rounds to infinity.  The
**     generator proves both and that they are tight.
**
**  6. Truncated literals: when digits after the 19th were dropped, v lies in
**     [m, m + 1] * 10^e.  Rounding is monotone, so if both ends round to the
**     same double, so does v; otherwise 0 (about 0.2% of random literals
**     of 20-25 digits in tests/test_strtod.c).
*/
#include <string.h>

#include "idemInt.h"
#include "strtod_table.h"

#if defined(__SIZEOF_INT128__) && !defined(IDEM_STRTOD_NO_INT128)
#define STRTOD_INT128 1
#else
#define STRTOD_INT128 0
#endif

#define STRTOD_INF_BITS (UINT64_C(0x7ff) << 52)
#define STRTOD_SIGN_BIT (UINT64_C(1) << 63)
#define STRTOD_EXP_BIAS 1086 /* 63 + 1023, see step 2 */

/* a * b = 2^64 * (return value) + *lo. */
static uint64_t mul_64x64(uint64_t a, uint64_t b, uint64_t *lo) {
#if STRTOD_INT128
  unsigned __int128 x = (unsigned __int128)a * b;

  *lo = (uint64_t)x;
  return (uint64_t)(x >> 64);
#else
  /* Four 32x32 products; the middle sum of three terms below 2^32 each
  ** cannot overflow. */
  uint64_t a0 = (uint32_t)a, a1 = a >> 32, b0 = (uint32_t)b, b1 = b >> 32;
  uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  uint64_t mid = (p00 >> 32) + (uint32_t)p01 + (uint32_t)p10;

  *lo = (mid << 32) | (uint32_t)p00;
  return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
#endif
}

/* Leading zero bits of x != 0. */
static int clz64(uint64_t x) {
#if defined(__GNUC__)
  return __builtin_clzll(x);
#else
  int n = 0;

  while (!(x >> 63)) x <<= 1, n++;
  return n;
#endif
}

/* floor(e log2 10) for |e| <= 400 by multiply and shift (checked by the
** generator).  The bias keeps the shifted value non-negative, so >> is a
** floor without relying on how negative numbers shift. */
static int flog2_pow10(int e) {
  int64_t x = (int64_t)e * STRTOD_LOG2_10 + ((int64_t)1 << 32);

  return (int)(x >> STRTOD_LOG2_10_SHIFT) - (1 << (32 - STRTOD_LOG2_10_SHIFT));
}

/* Bits of the double nearest n * 2^q, for n >= 1 and -27 <= q < 0 (so the
** result is normal): n is rounded to 53 bits by hand, ties to even. */
static uint64_t dyadic_bits(uint64_t n, int q) {
  int s = 64 - clz64(n) - 53;
  uint64_t k;

  if (s <= 0) {
    k = n << -s;
  } else {
    uint64_t half = UINT64_C(1) << (s - 1), rest = n & ((half << 1) - 1);

    k = n >> s;
    if (rest > half || (rest == half && (k & 1))) k++;
  }
  /* k in [2^52, 2^53] times 2^(q + s): biased exponent q + s + 1075 */
  return ((uint64_t)(q + s + 1074) << 52) + k;
}

/*
** The bits of the positive double nearest m * 10^e10, m >= 1: returns 1 and
** sets *bits, or returns 0 when P cannot tell (step 3).
*/
static int eisel_lemire(uint64_t m, int e10, uint64_t *bits) {
  const uint64_t *t;
  uint64_t w, p2, p1, p0, lo, hi, mask, below, k;
  int lz, upper, be, rb, r;

  if (e10 < STRTOD_E_MIN) {
    *bits = 0;
    return 1;
  }
  if (e10 > STRTOD_E_MAX) {
    *bits = STRTOD_INF_BITS;
    return 1;
  }
  t = strtod_pow5[e10 - STRTOD_E_MIN];
  lz = clz64(m);
  w = m << lz;
  p2 = mul_64x64(w, t[0], &lo);
  hi = mul_64x64(w, t[1], &p0);
  p1 = lo + hi;
  p2 += p1 < hi;

  upper = (int)(p2 >> 63);
  be = flog2_pow10(e10) + STRTOD_EXP_BIAS + upper - lz;
  rb = 9 + upper; /* the round bit's position in p2 */
  if (be <= 0) {
    rb += 1 - be;
    be = 1;
    if (rb > 63) {
      *bits = 0;
      return 1;
    }
  }
  k = rb == 63 ? 0 : p2 >> (rb + 1);
  r = (int)(p2 >> rb) & 1;
  mask = (UINT64_C(1) << rb) - 1;
  below = p2 & mask;
  if (e10 >= 0 && e10 <= STRTOD_EXACT_MAX) {
    /* X = P: round it, an exact tie to even. */
    if (r && ((below | p1 | p0) != 0 || (k & 1))) k++;
  } else {
    if (IDEM__UNLIKELY(!r && below == mask && p1 == UINT64_MAX &&
                       p0 + w < p0)) {
      uint64_t p5 = 1;
      int i;

      if (e10 < -27 || e10 >= 0) return 0;
      for (i = 0; i < -e10; i++) p5 *= 5;
      if (m % p5 != 0) return 0;
      *bits = dyadic_bits(m / p5, e10);
      return 1;
    }
    k += (uint64_t)r;
  }
  *bits = ((uint64_t)(be - 1) << 52) + k;
  if (*bits > STRTOD_INF_BITS) *bits = STRTOD_INF_BITS;
  return 1;
}

int idem__decimal_to_double(uint64_t m, int e10, int truncated, int neg,
                            double *out) {
  uint64_t bits = 0, bits_hi;

  if (m != 0) {
    if (!eisel_lemire(m, e10, &bits)) return 0;
    if (truncated && (m == UINT64_MAX || !eisel_lemire(m + 1, e10, &bits_hi) ||
                      bits_hi != bits))
      return 0;
  }
  if (neg) bits |= STRTOD_SIGN_BIT;
  memcpy(out, &bits, sizeof *out);
  return 1;
}
