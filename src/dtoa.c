/*
** dtoa.c - shortest round-trip doubles in ECMAScript Number::toString form.
**
** RFC 8785 (JCS) serialises numbers exactly as ECMAScript does: the fewest
** significant decimal digits that read back as the same double, the one
** closest to the exact binary value when several such digit strings exist
** (the even one on an exact tie), laid out as plain digits, a decimal
** fraction, or d.ddde+-x by the rules of ES Number::toString.  printf cannot
** do this, so this file does it itself.
**
** Algorithm: Schubfach (R. Giulietti, "The Schubfach way to render doubles",
** 2020), written from the paper's description.
**
**  1. A finite non-zero double is v = c * 2^q with integer c.  Every real in
**     the rounding interval R = [v - u/2, v + u/2] (u the spacing of doubles
**     around v) reads back as v; the ends belong to R exactly when c is even,
**     because the reader rounds ties to even.  When c = 2^52 and v is not the
**     smallest normal the double below is twice as close, so R is
**     [v - u/4, v + u/2] instead.  Scaled by 4 all three points are the
**     integers cbl < cb < cbr times 2^q (cb = 4c, cbr = 4c + 2, cbl = 4c - 2
**     or 4c - 1).
**
**  2. Pick the decimal exponent k = floor(log10(width of R)): then R scaled
**     by 10^-k has width w with 1 <= w < 10.  Width >= 1 means R holds an
**     integer multiple of 10^k; width < 10 means it holds at most one
**     multiple of 10^(k+1).  So the shortest decimal in R is that multiple
**     of 10^(k+1) if there is one, otherwise one of s*10^k, (s+1)*10^k with
**     s = floor(v * 10^-k): every other candidate is farther from v or longer
**     (one with digits below 10^k is no shorter than s, and as short only if
**     a power of ten, a multiple of 10^(k+1), lies between it and v, hence
**     in R).  Among s and s+1 both inside R the nearer to v wins,
**     s on a tie only if it is even - ECMAScript's own tie rule.
**     The multiple-of-ten step is skipped when s < 10: there s, s + 1 and 10
**     all have one significant digit, so "shorter" no longer decides and the
**     nearest of s, s + 1 is the right answer (10 is never nearer than them).
**     It must not be skipped for 10 <= s < 100 (only tiny subnormals get
**     there): 4.94e-323 has s = 49 and 49, 50 both in R, yet "5e-323" is
**     shorter.
**
**  3. All decisions compare the scaled points vbl, vb, vbr = cb..*2^q*10^-k
**     with multiples of 4 (the candidates times 4) or with 4s + 2 (the
**     midpoint).  Those comparisons stay exact if the scaled points are known
**     only rounded to odd: floor(x) with the low bit forced to 1 when x is
**     not an integer.  That is what round_to_odd() returns.
**
**  4. round_to_odd() multiplies x << h by G, a 128-bit over-approximation of
**     10^-k (table from dtoa_table.py), and keeps the integer part and a
**     sticky bit taken from the top 64 fraction bits.  The over-estimate is
**     positive and below 2^-69, so the result is the exact round-to-odd
**     provided no exact fraction lies within that error of 1, and every
**     non-zero exact fraction whose integer part is even is at least 2^-64
**     (an odd integer part needs no sticky bit).  dtoa_table.py proves both
**     for every binary exponent, over every possible c, with a
**     continued-fraction minimum search, and will not emit a table otherwise.
**
** Invariants used below: 1 <= h <= 4 and cbr << h < 2^59 (no overflow);
** the decimal significand is < 10^17 (at most 17 digits); q in [-1074, 971]
** so k in [DTOA_K_MIN, DTOA_K_MAX].
**
** Integers of magnitude below 2^53 - the common case in JSON - skip all of
** this: their own digits are the unique shortest, closest representation.
*/
#include <string.h>

#include "dtoa_table.h"
#include "idemInt.h"

#if defined(__SIZEOF_INT128__) && !defined(IDEM_DTOA_NO_INT128)
#define DTOA_INT128 1
#else
#define DTOA_INT128 0
#endif

#define DTOA_FRAC_MASK ((UINT64_C(1) << 52) - 1)
#define DTOA_HIDDEN (UINT64_C(1) << 52)

/* floor(x / 2^shift) for |x| < 2^32.  The bias keeps the shifted value
** non-negative, so >> is a floor without relying on how the compiler shifts
** negative numbers. */
static int floor_shift(int64_t x, int shift) {
  return (int)((x + ((int64_t)1 << 32)) >> shift) - (1 << (32 - shift));
}

/* Floor logarithms by multiply and shift; dtoa_table.py checked the
** multipliers exactly over a range wider than doubles need. */
static int flog10_pow2(int q) {
  return floor_shift((int64_t)q * DTOA_LOG10_2, DTOA_LOG10_2_SHIFT);
}

static int flog10_three_quarters_pow2(int q) {
  return floor_shift((int64_t)q * DTOA_LOG10_2 - DTOA_LOG10_4_3,
                     DTOA_LOG10_2_SHIFT);
}

static int flog2_pow10(int e) {
  return floor_shift((int64_t)e * DTOA_LOG2_10, DTOA_LOG2_10_SHIFT);
}

#if !DTOA_INT128
/* 64x64 -> 128 from four 32x32 products; the middle sum cannot overflow
** because each term is below 2^32 and there are three of them. */
static uint64_t mul_64x64(uint64_t a, uint64_t b, uint64_t *lo) {
  uint64_t a0 = (uint32_t)a, a1 = a >> 32, b0 = (uint32_t)b, b1 = b >> 32;
  uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  uint64_t mid = (p00 >> 32) + (uint32_t)p01 + (uint32_t)p10;

  *lo = (mid << 32) | (uint32_t)p00;
  return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}
#endif

/*
** floor(g * cp / 2^128), low bit forced on when the product has a non-zero
** fraction in its top 64 fraction bits.  The bits below those (the low half
** of g[1] * cp) are dropped: the table proof needs only the top 64.
*/
static uint64_t round_to_odd(const uint64_t g[2], uint64_t cp) {
  uint64_t hi, z;
#if DTOA_INT128
  unsigned __int128 x = (unsigned __int128)g[1] * cp;
  unsigned __int128 y = (unsigned __int128)g[0] * cp + (uint64_t)(x >> 64);

  hi = (uint64_t)(y >> 64);
  z = (uint64_t)y;
#else
  uint64_t xlo, ylo;
  uint64_t xhi = mul_64x64(g[1], cp, &xlo);
  uint64_t yhi = mul_64x64(g[0], cp, &ylo);

  (void)xlo;
  z = ylo + xhi;
  hi = yhi + (z < xhi);
#endif
  return hi | (z != 0);
}

/*
** Shortest decimal for c * 2^q: returns the significand f and sets *e10 so
** that f * 10^*e10 is the answer (f may carry trailing zeros).  asym says
** the interval below v is half as wide as above (c = 2^52, not the least
** normal).
*/
static uint64_t schubfach(uint64_t c, int q, int asym, int *e10) {
  /* An even c owns the ends of its interval (ties read back to even). */
  uint64_t out = c & 1;
  uint64_t cb = c << 2, cbr = cb + 2, cbl;
  int k, h;
  const uint64_t *g;
  uint64_t vb, vbl, vbr, s, t;
  int uin, win;

  if (asym) {
    cbl = cb - 1;
    k = flog10_three_quarters_pow2(q);
  } else {
    cbl = cb - 2;
    k = flog10_pow2(q);
  }
  h = q + flog2_pow10(-k) + 1;
  g = dtoa_g[k - DTOA_K_MIN];
  vb = round_to_odd(g, cb << h);
  vbl = round_to_odd(g, cbl << h);
  vbr = round_to_odd(g, cbr << h);

  s = vb >> 2;
  *e10 = k;
  if (s >= 10) {
    /* R is narrower than 10, so these are the only multiples of ten
    ** that can lie in it, and at most one of them does. */
    uint64_t sp10 = s / 10 * 10, tp10 = sp10 + 10;
    int upin = vbl + out <= sp10 << 2;
    int wpin = (tp10 << 2) + out <= vbr;

    if (upin != wpin) return upin ? sp10 : tp10;
  }
  t = s + 1;
  uin = vbl + out <= s << 2;
  win = (t << 2) + out <= vbr;
  if (uin != win) return uin ? s : t;
  /* Both in (never neither: R is at least 1 wide, and exactly 1 wide only
  ** for q = k = 0, where its ends are half-integers).  The nearer wins;
  ** 4s + 2 is the scaled midpoint and rounding to odd kept vb's order
  ** relative to it. */
  if (vb < (s << 2) + 2 || (vb == (s << 2) + 2 && (s & 1) == 0)) return s;
  return t;
}

static const char dtoa_pairs[201] =
    "00010203040506070809101112131415161718192021222324"
    "25262728293031323334353637383940414243444546474849"
    "50515253545556575859606162636465666768697071727374"
    "75767778798081828384858687888990919293949596979899";

/*
** Exactly eight digits of v < 10^8 ending at end, all at once: v splits into
** two halves of four digits, one per 32-bit lane of x, each lane into two
** 16-bit lanes of two digits, and each of those into two bytes, tens first.
** The divisions are multiply-shifts exact for these ranges ((n * 10486) >>
** 20 is n / 100 for n < 10^4, (n * 103) >> 10 is n / 10 for n < 100; all
** 10^8 values checked), and no product carries into the next lane.  The
** bytes go to memory in lane order on little-endian machines; elsewhere
** a loop of pairs.
*/
static void write8(char *end, uint32_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  uint64_t x = v / 10000 | (uint64_t)(v % 10000) << 32, y;

  y = ((x * 10486) >> 20) & UINT64_C(0x0000007F0000007F);
  x = y | (x - y * 100) << 16;
  y = ((x * 103) >> 10) & UINT64_C(0x000F000F000F000F);
  x = (y | (x - y * 10) << 8) + UINT64_C(0x3030303030303030);
  memcpy(end - 8, &x, 8);
#else
  int i;

  for (i = 0; i < 4; i++) {
    uint32_t r = v % 100;

    v /= 100;
    end -= 2;
    memcpy(end, dtoa_pairs + 2 * r, 2);
  }
#endif
}

/* Decimal digits of f > 0 ending at end, no leading zeros; returns start. */
static char *write_digits(char *end, uint64_t f) {
  uint32_t v;

  while (f >= 100000000) {
    write8(end, (uint32_t)(f % 100000000));
    f /= 100000000;
    end -= 8;
  }
  v = (uint32_t)f;
  while (v >= 100) {
    uint32_t r = v % 100;

    v /= 100;
    end -= 2;
    memcpy(end, dtoa_pairs + 2 * r, 2);
  }
  if (v >= 10) {
    end -= 2;
    memcpy(end, dtoa_pairs + 2 * v, 2);
  } else {
    *--end = (char)('0' + v);
  }
  return end;
}

/*
** ES Number::toString layout of the shortest digits d[0..k) (so no trailing
** zeros, and d[0] != '0') with value 0.d1..dk * 10^n.  Returns bytes written
** to p.
*/
static size_t es_layout(char *p, const char *d, int k, int n) {
  char *start = p;

  if (k <= n && n <= 21) {
    memcpy(p, d, (size_t)k);
    p += k;
    memset(p, '0', (size_t)(n - k));
    p += n - k;
  } else if (0 < n && n <= 21) {
    memcpy(p, d, (size_t)n);
    p += n;
    *p++ = '.';
    memcpy(p, d + n, (size_t)(k - n));
    p += k - n;
  } else if (-6 < n && n <= 0) {
    *p++ = '0';
    *p++ = '.';
    memset(p, '0', (size_t)-n);
    p += -n;
    memcpy(p, d, (size_t)k);
    p += k;
  } else {
    int x = n - 1;

    *p++ = d[0];
    if (k > 1) {
      *p++ = '.';
      memcpy(p, d + 1, (size_t)(k - 1));
      p += k - 1;
    }
    *p++ = 'e';
    if (x < 0) {
      *p++ = '-';
      x = -x;
    } else {
      *p++ = '+';
    }
    /* |n - 1| <= 324 for doubles: at most three digits. */
    if (x >= 100) {
      *p++ = (char)('0' + x / 100);
      x %= 100;
      memcpy(p, dtoa_pairs + 2 * x, 2);
      p += 2;
    } else if (x >= 10) {
      memcpy(p, dtoa_pairs + 2 * x, 2);
      p += 2;
    } else {
      *p++ = (char)('0' + x);
    }
  }
  return (size_t)(p - start);
}

size_t idem__dtoa(double v, char *buf) {
  uint64_t bits, t, c, f;
  unsigned be;
  char *p = buf;
  char tmp[24];
  char *end = tmp + sizeof tmp, *d;
  int q, e10, len0, len;

  memcpy(&bits, &v, sizeof bits);
  be = (unsigned)(bits >> 52) & 0x7ff;
  t = bits & DTOA_FRAC_MASK;
  if (be == 0 && t == 0) {
    /* ES prints -0 as "0" too. */
    buf[0] = '0';
    return 1;
  }
  if (bits >> 63) *p++ = '-';

  if (be == 0) {
    c = t;
    q = -1074;
  } else {
    c = t | DTOA_HIDDEN;
    q = (int)be - 1075;
  }

  /* 1 <= |v| < 2^53 with no fraction bits: an integer whose own digits
  ** are the answer, since doubles there are at most 1 apart. */
  if (q <= 0 && q >= -52 && (c & ((UINT64_C(1) << -q) - 1)) == 0) {
    d = write_digits(end, c >> -q);
    len0 = (int)(end - d);
    memcpy(p, d, (size_t)len0);
    return (size_t)(p - buf) + (size_t)len0;
  }

  /* At c = 2^52 the double below is half as far as the one above, except
  ** at the least normal, whose neighbour below is the largest subnormal. */
  f = schubfach(c, q, t == 0 && be > 1, &e10);
  d = write_digits(end, f);
  len0 = (int)(end - d);
  len = len0;
  while (d[len - 1] == '0') len--;
  return (size_t)(p - buf) + es_layout(p, d, len, e10 + len0);
}
