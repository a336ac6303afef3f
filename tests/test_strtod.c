/*
** test_strtod.c - checks idem__decimal_to_double() (src/strtod.c), and the
** canonicalizer's numbers through the public API, against glibc strtod().
**
**   test_strtod --random N [--seed S]  N rounds of random literals (below)
**   test_strtod --speed N [--seed S]   ns per literal: strtod_l, the
**                                      conversion alone, idem_canon_json
**
** The oracle is glibc's strtod(), which rounds correctly (ties to even) for
** any number of digits.  Every literal is checked twice:
**
**   - directly: it is split here, independently of canon.c, into its first
**     19 significant digits m, the exponent e10 and a "non-zero digits were
**     dropped" flag; idem__decimal_to_double() must then either return the
**     bits strtod() returns, or 0 (undecided), which is counted;
**   - through the API: "[LITERAL]" canonicalized by idem_canon_json() must
**     give "[" idem__dtoa(strtod(LITERAL)) "]", or IDEM_JSON_OVERFLOW /
**     IDEM_JSON_UNDERFLOW when strtod() gives infinity / zero for non-zero
**     digits.  (An integer literal gets ".0" so that it is not refused as an
**     integer beyond 2^53.)
**
** Each round makes: a random finite bit pattern printed with %.17g, %.16e and
** %.15g; a random string of 1-25 significant digits in one of four layouts
** with an exponent anywhere from 10^-350 to 10^312; either a double near
** DBL_MIN, in the subnormals or near DBL_MAX at a random precision, or a
** prefix of 1-40 digits of an exact threshold (half the least subnormal,
** the least subnormal, the midpoint below DBL_MIN, DBL_MAX and the overflow
** midpoint), perhaps with one digit changed; a double with 20-40
** significant digits; and every eighth round, the exact midpoint between two
** adjacent doubles (exact in a long double, printed exactly with %.800Le)
** plus perturbations: last digit +-1, and cut to 16..40 digits with and
** without a unit added.  The cut thresholds and midpoints are adversarial:
** with more than 19 digits most cannot be decided from 19 and fall back by
** design, so their rate is reported apart from the random categories, which
** must stay under 1%; and complete literals (no non-zero digit after the
** 19th) must never fall back.
*/
#define _GNU_SOURCE /* strtod_l, newlocale */

#include <float.h>
#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "idemInt.h"

/* ---- helpers --------------------------------------------------------- */

static uint64_t rng_state;

/* splitmix64: tiny, seedable, and good enough to cover bit patterns. */
static uint64_t rnd(void) {
  uint64_t z = (rng_state += UINT64_C(0x9e3779b97f4a7c15));

  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static int rnd_int(int lo, int hi) {
  return lo + (int)(rnd() % (uint64_t)(hi - lo + 1));
}

static double from_bits(uint64_t b) {
  double d;

  memcpy(&d, &b, sizeof d);
  return d;
}

static uint64_t to_bits(double d) {
  uint64_t b;

  memcpy(&b, &d, sizeof b);
  return b;
}

static uint64_t rnd_finite_bits(void) {
  uint64_t b;

  do b = rnd();
  while (((b >> 52) & 0x7ff) == 0x7ff);
  return b;
}

/* ---- the literal, split independently of canon.c ---------------------- */

typedef struct split {
  uint64_t m;
  int e10, cut, neg, nonzero;
} split;

/* s is a valid JSON number with an exponent of at most 9 digits. */
static split split_literal(const char *s) {
  split r = {0, 0, 0, 0, 0};
  char digits[1024];
  int n = 0, nfrac = 0, in_frac = 0, i, first, exp = 0, eneg = 0;

  if (*s == '-') r.neg = 1, s++;
  for (; (*s >= '0' && *s <= '9') || *s == '.'; s++) {
    if (*s == '.') {
      in_frac = 1;
      continue;
    }
    if (n < (int)sizeof digits) digits[n++] = *s;
    nfrac += in_frac;
  }
  if (*s == 'e' || *s == 'E') {
    s++;
    if (*s == '+' || *s == '-') eneg = *s++ == '-';
    for (; *s >= '0' && *s <= '9'; s++) exp = exp * 10 + (*s - '0');
  }
  if (eneg) exp = -exp;
  for (first = 0; first < n && digits[first] == '0'; first++) continue;
  r.nonzero = first < n;
  for (i = first; i < n && i < first + 19; i++)
    r.m = r.m * 10 + (uint64_t)(digits[i] - '0');
  /* value = digits * 10^(exp - nfrac); keeping i - first of them */
  r.e10 = exp - nfrac + (n - i);
  for (; i < n; i++) r.cut |= digits[i] != '0';
  return r;
}

/* ---- the checks ------------------------------------------------------ */

enum {
  CAT_G17, /* random bits, %.17g             */
  CAT_E16, /* random bits, %.16e             */
  CAT_G15, /* random bits, %.15g             */
  CAT_DIGITS,
  CAT_EDGE,
  CAT_LONG,
  CAT_THRESH, /* adversarial: cut thresholds  */
  CAT_HALF,   /* adversarial: midpoints       */
  CAT_N
};

static const char *const cat_name[CAT_N] = {
    "%.17g bits", "%.16e bits",   "%.15g bits", "1-25 digits",
    "edges",      "20-40 digits", "thresholds", "midpoints"};

static unsigned long n_cases[CAT_N], n_fallback[CAT_N];
static unsigned long n_complete, n_complete_fallback; /* nothing cut */
static idem_canon *canon;
static unsigned long n_shown;

#define SHOW_MAX 20

static void fail(const char *lit, const char *what, const char *got,
                 const char *want) {
  check_failed++;
  if (n_shown++ < SHOW_MAX)
    fprintf(stderr, "FAIL %s: %s\n  got:      %s\n  expected: %s\n", lit, what,
            got, want);
}

static void check_literal(const char *lit, int cat) {
  double want = strtod(lit, NULL), got;
  uint64_t wb = to_bits(want);
  split sp = split_literal(lit);
  char text[1100], expect[IDEM__DTOA_MAX + 3], a[80], b[80];
  const char *out;
  size_t len, n, out_len;
  int rc, want_rc;

  /* directly */
  n_cases[cat]++;
  if (!sp.cut) n_complete++;
  if (idem__decimal_to_double(sp.m, sp.e10, sp.cut, sp.neg, &got)) {
    if (to_bits(got) == wb)
      check_passed++;
    else {
      snprintf(a, sizeof a, "%.17g (0x%016" PRIx64 ")", got, to_bits(got));
      snprintf(b, sizeof b, "%.17g (0x%016" PRIx64 ")", want, wb);
      fail(lit, "idem__decimal_to_double", a, b);
    }
  } else {
    n_fallback[cat]++;
    if (!sp.cut) n_complete_fallback++;
  }

  /* through idem_canon_json */
  len = strlen(lit);
  if (len + 5 > sizeof text) return;
  text[0] = '[';
  memcpy(text + 1, lit, len);
  n = len + 1;
  if (!strpbrk(lit, ".eE")) {
    memcpy(text + n, ".0", 2);
    n += 2;
  }
  text[n++] = ']';
  want_rc = isinf(want)               ? IDEM_JSON_OVERFLOW
            : want == 0 && sp.nonzero ? IDEM_JSON_UNDERFLOW
                                      : IDEM_OK;
  rc = idem_canon_json(canon, text, n, &out, &out_len);
  if (rc != want_rc) {
    snprintf(a, sizeof a, "status %d", rc);
    snprintf(b, sizeof b, "status %d", want_rc);
    fail(lit, "idem_canon_json", a, b);
    return;
  }
  if (rc != IDEM_OK) {
    check_passed++;
    return;
  }
  expect[0] = '[';
  n = 1 + idem__dtoa(want, expect + 1);
  expect[n++] = ']';
  if (out_len == n && memcmp(out, expect, n) == 0)
    check_passed++;
  else {
    snprintf(a, sizeof a, "%.*s", (int)(out_len < 79 ? out_len : 79), out);
    snprintf(b, sizeof b, "%.*s", (int)n, expect);
    fail(lit, "idem_canon_json", a, b);
  }
}

/* ---- the generators ---------------------------------------------------- */

/* A random significand of nd digits (the first not 0) into d. */
static void rnd_digits(char *d, int nd) {
  int i;

  d[0] = (char)('1' + rnd() % 9);
  for (i = 1; i < nd; i++) d[i] = (char)('0' + rnd() % 10);
  /* sometimes a run of zeros or nines, the hard cases for cut literals */
  if (nd > 3 && rnd() % 4 == 0) {
    int from = rnd_int(1, nd - 1);
    char c = rnd() % 2 ? '0' : '9';

    for (i = from; i < nd; i++) d[i] = c;
    if (rnd() % 2) d[nd - 1] = (char)('1' + rnd() % 9);
  }
}

/*
** Lay out the significand d[0..nd) (value d[0].d[1..] * 10^x) as a JSON
** number in one of four forms, with optional zero padding, into buf.
*/
static void layout(char *buf, size_t size, const char *d, int nd, int x,
                   int neg) {
  int form = (int)(rnd() % 4), pad = rnd() % 4 == 0 ? rnd_int(1, 6) : 0;
  char *p = buf, *end = buf + size - 16;
  int i;

  if (neg) *p++ = '-';
  if (form == 1 && (x < -12 || x > 25)) form = 0;
  if (form == 2 && (x >= 0 || x < -12)) form = 0;
  switch (form) {
  case 0: /* d.ddde+x */
    *p++ = d[0];
    if (nd > 1 || pad) *p++ = '.';
    for (i = 1; i < nd && p < end; i++) *p++ = d[i];
    for (i = 0; i < pad && p < end; i++) *p++ = '0';
    snprintf(p, 16, "e%s%d", x < 0 ? "-" : rnd() % 2 ? "+" : "", abs(x));
    return;
  case 1: /* positional, x >= -12 */
    if (x < 0) {
      *p++ = '0';
      *p++ = '.';
      for (i = 0; i < -x - 1; i++) *p++ = '0';
      for (i = 0; i < nd && p < end; i++) *p++ = d[i];
    } else {
      for (i = 0; i <= x; i++) *p++ = i < nd ? d[i] : '0';
      if (nd > x + 1 || pad) *p++ = '.';
      for (i = x + 1; i < nd && p < end; i++) *p++ = d[i];
    }
    for (i = 0; i < pad && p < end; i++) *p++ = '0';
    *p = '\0';
    return;
  case 2: /* 0.ddd with an exponent: 0.ddd e(x+1) */
    *p++ = '0';
    *p++ = '.';
    for (i = 0; i < nd && p < end; i++) *p++ = d[i];
    snprintf(p, 16, "E%d", x + 1);
    return;
  default: /* all digits as an integer, then the exponent */
    for (i = 0; i < nd && p < end; i++) *p++ = d[i];
    snprintf(p, 16, "e%d", x - (nd - 1));
    return;
  }
}

static void gen_bits(void) {
  char buf[64];
  double v = from_bits(rnd_finite_bits());

  snprintf(buf, sizeof buf, "%.17g", v);
  check_literal(buf, CAT_G17);
  snprintf(buf, sizeof buf, "%.16e", v);
  check_literal(buf, CAT_E16);
  snprintf(buf, sizeof buf, "%.15g", v);
  check_literal(buf, CAT_G15);
}

static void gen_digits(void) {
  char d[64], buf[128];
  int nd = rnd_int(1, 25), x;

  rnd_digits(d, nd);
  x = rnd_int(-350, 312);
  layout(buf, sizeof buf, d, nd, x, (int)(rnd() % 2));
  check_literal(buf, CAT_DIGITS);
}

/* Near the ends of the range, at the thresholds, in the subnormals. */
static void gen_edge(void) {
  static const char *const near[] = {
      "247032822920623272088284396434110686182529901",
      "494065645841246544176568792868221372365059802",
      "222507385850720138309023271733240406421921598",
      "179769313486231570814527423737018217429575939",
      "179769313486231580793728971405303415079934132"};
  static const int near_x[] = {-324, -324, -308, 308, 308};
  char buf[128], d[80];
  uint64_t b;
  int k = (int)(rnd() % 3);

  if (k == 0) { /* a double near the ends, at a random precision */
    switch (rnd() % 5) {
    case 0: b = rnd() & ((UINT64_C(1) << 52) - 1); break; /* subnormal */
    case 1: b = rnd() % 64; break;                        /* tiny ones */
    case 2: b = (UINT64_C(1) << 52) + rnd() % 1024 - 512; break;
    case 3: b = (UINT64_C(0x7fe) << 52) | (rnd() >> 12); break;
    default: b = (UINT64_C(0x7ff) << 52) - 1 - rnd() % 1024; break;
    }
    snprintf(buf, sizeof buf, "%.*e", rnd_int(0, 24), from_bits(b));
  } else { /* a prefix of an exact threshold, perturbed */
    int i = (int)(rnd() % 5), nd = rnd_int(1, 40);

    memcpy(d, near[i], (size_t)nd);
    if (rnd() % 2) {
      int at = rnd_int(0, nd - 1);

      d[at] = (char)('0' + rnd() % 10);
      if (d[0] == '0') d[0] = '1';
    }
    layout(buf, sizeof buf, d, nd, near_x[i], (int)(rnd() % 2));
    check_literal(buf, CAT_THRESH);
    return;
  }
  check_literal(buf, CAT_EDGE);
}

static void gen_long(void) {
  char buf[128];
  /* one rnd() per statement, so that a seed means the same cases with
  ** every compiler (argument order is unspecified) */
  int prec = rnd_int(19, 39);

  snprintf(buf, sizeof buf, "%.*e", prec, from_bits(rnd_finite_bits()));
  check_literal(buf, CAT_LONG);
}

#if LDBL_MANT_DIG >= 55
/* Add one unit in the last place of the digit string d[0..n). */
static void add_unit(char *d, int n) {
  while (n > 0 && d[n - 1] == '9') d[--n] = '0';
  if (n > 0) d[n - 1]++;
}

/* The exact midpoint above a random positive double, and perturbations. */
static void gen_half(void) {
  static char exact[1000];
  char d[1000], buf[1100];
  uint64_t b;
  double v;
  long double mid;
  char *e;
  int nd, x, cut, i;

  switch (rnd() % 4) {
  case 0: b = rnd_finite_bits() & ~(UINT64_C(1) << 63); break;
  case 1: /* binades where midpoints have few digits */
    b = (uint64_t)rnd_int(1023 - 8, 1023 + 70) << 52;
    b |= rnd() >> 12;
    break;
  case 2: b = rnd() >> 12; break; /* subnormal */
  default:
    b = (uint64_t)rnd_int(1, 2046) << 52;
    b |= rnd() >> 12;
    break;
  }
  v = from_bits(b);
  if (v >= DBL_MAX || v < 0) return;
  /* v and the next double up (bits + 1), and their mean, are exact with a
  ** 64-bit significand */
  mid = ((long double)v + (long double)from_bits(b + 1)) / 2;
  snprintf(exact, sizeof exact, "%.800Le", mid);
  /* "D.DDD...e+X": collect the digits, drop trailing zeros */
  e = strchr(exact, 'e');
  x = atoi(e + 1);
  nd = 0;
  for (i = 0; exact + i < e; i++)
    if (exact[i] != '.') d[nd++] = exact[i];
  while (nd > 1 && d[nd - 1] == '0') nd--;

  layout(buf, sizeof buf, d, nd, x, 0);
  check_literal(buf, CAT_HALF); /* exact: a tie, to even */
  d[nd - 1]++;                  /* just above (a non-zero digit < 9?) */
  if (d[nd - 1] <= '9') {
    layout(buf, sizeof buf, d, nd, x, 0);
    check_literal(buf, CAT_HALF);
  }
  d[nd - 1] = (char)(d[nd - 1] - 2); /* just below */
  if (d[nd - 1] >= '0' && !(nd == 1 && d[0] == '0')) {
    layout(buf, sizeof buf, d, nd, x, 0);
    check_literal(buf, CAT_HALF);
  }
  d[nd - 1]++;
  for (cut = 16; cut <= 40; cut += rnd_int(1, 4)) {
    char t[48];

    if (cut >= nd) break;
    memcpy(t, d, (size_t)cut); /* below the midpoint */
    layout(buf, sizeof buf, t, cut, x, 0);
    check_literal(buf, CAT_HALF);
    add_unit(t, cut); /* above it */
    if (t[0] != '0') {
      layout(buf, sizeof buf, t, cut, x, 0);
      check_literal(buf, CAT_HALF);
    }
  }
}
#endif

/* Fixed cases: the thresholds and the classics, in both directions. */
static void fixed_cases(void) {
  static const char *const lits[] = {"0.30000000000000004",
                                     "1.2345678901234567e-89",
                                     "4503599627370496.5",
                                     "4503599627370497.5",
                                     "9007199254740993",
                                     "9007199254740993.0000001",
                                     "1e23",
                                     "8.98846567431158e307",
                                     "2.2250738585072011e-308",
                                     "2.2250738585072012e-308",
                                     "2.2250738585072014e-308",
                                     "4.9406564584124654e-324",
                                     "2.4703282292062327e-324",
                                     "2.4703282292062328e-324",
                                     "2.47032822920623272088e-324",
                                     "1.7976931348623157e308",
                                     "1.7976931348623158e308",
                                     "1.7976931348623159e308",
                                     "179769313486231580793728971405301e276",
                                     "179769313486231580793728971405302e276",
                                     "1e-342",
                                     "9.99e-343",
                                     "9999999999999999999e-343",
                                     "9999999999999999999e-362",
                                     "1e308",
                                     "1e309",
                                     "0.1e310",
                                     "10000000000000000000000e-22",
                                     "0e500",
                                     "-0.0",
                                     "-0e-500",
                                     "1e-400",
                                     "0.000001",
                                     "123456789012345678901234567890e-29",
                                     "7.3177701707893310e+15",
                                     "1.00000000000000011102230246251565404e0",
                                     "1.00000000000000011102230246251565405e0",
                                     "-1.5e-323",
                                     "-2.5e-324"};
  size_t i;

  for (i = 0; i < sizeof lits / sizeof lits[0]; i++)
    check_literal(lits[i], CAT_THRESH);
}

static int mode_random(unsigned long rounds) {
  unsigned long i, total = 0, fb = 0;
  int k;

  fixed_cases();
  for (i = 0; i < rounds; i++) {
    gen_bits();
    gen_digits();
    gen_edge();
    gen_long();
#if LDBL_MANT_DIG >= 55
    if (i % 8 == 0) gen_half();
#endif
  }
  for (k = 0; k < CAT_N; k++) {
    printf("  %-13s %9lu literals, %6lu undecided (%.4f%%)\n", cat_name[k],
           n_cases[k], n_fallback[k],
           n_cases[k] ? 100.0 * (double)n_fallback[k] / (double)n_cases[k]
                      : 0.0);
    if (k < CAT_THRESH) total += n_cases[k], fb += n_fallback[k];
  }
  printf("fallback rate of the random literals: %lu of %lu (%.4f%%); "
         "of complete literals (nothing cut): %lu of %lu\n",
         fb, total, total ? 100.0 * (double)fb / (double)total : 0.0,
         n_complete_fallback, n_complete);
  CHECK(total > 0 && fb * 100 < total);
  CHECK_INT(n_complete_fallback, 0);
  return 0;
}

/* ---- speed ------------------------------------------------------------- */

static double now_ns(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int mode_speed(unsigned long n) {
  char *lits = malloc(n * 32), *text = malloc(n * 32 + 2), *p = text;
  split *sp = malloc(n * sizeof *sp);
  locale_t cl = newlocale(LC_ALL_MASK, "C", (locale_t)0);
  volatile double sink = 0;
  double t0, t1, t2, t3, v = 0;
  const char *out;
  size_t out_len;
  unsigned long i, undecided = 0;
  int rep;

  if (!lits || !text || !sp || cl == (locale_t)0) return 1;
  *p++ = '[';
  for (i = 0; i < n; i++) {
    char *l = lits + i * 32;

    snprintf(l, 32, "%.17g", from_bits(rnd_finite_bits()));
    if (!strpbrk(l, ".e")) memcpy(l + strlen(l), ".0", 3);
    sp[i] = split_literal(l);
    p += snprintf(p, 32, "%s%s", i ? "," : "", l);
  }
  *p++ = ']';
  CHECK_INT(idem_canon_limit(canon, IDEM_LIMIT_BYTES, (size_t)(p - text)),
            IDEM_OK);
  CHECK_INT(idem_canon_json(canon, text, (size_t)(p - text), &out, &out_len),
            IDEM_OK);
  for (rep = 0; rep < 3; rep++) {
    t0 = now_ns();
    for (i = 0; i < n; i++) sink += strtod_l(lits + i * 32, NULL, cl);
    t1 = now_ns();
    for (i = 0; i < n; i++) {
      if (!idem__decimal_to_double(sp[i].m, sp[i].e10, sp[i].cut, sp[i].neg,
                                   &v))
        undecided++;
      sink += v;
    }
    t2 = now_ns();
    idem_canon_json(canon, text, (size_t)(p - text), &out, &out_len);
    t3 = now_ns();
    printf("%lu random %%.17g literals: strtod_l %.1f ns, "
           "idem__decimal_to_double %.1f ns (split done before), "
           "idem_canon_json %.1f ns per number\n",
           n, (t1 - t0) / (double)n, (t2 - t1) / (double)n,
           (t3 - t2) / (double)n);
  }
  CHECK_INT(undecided, 0);
  (void)sink;
  freelocale(cl);
  free(lits);
  free(text);
  free(sp);
  return 0;
}

int main(int argc, char **argv) {
  unsigned long n = 0, seed = 1;
  const char *mode = NULL;
  int i;

  for (i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--seed") == 0)
      seed = strtoul(argv[i + 1], NULL, 10);
    else if (strcmp(argv[i], "--random") == 0 ||
             strcmp(argv[i], "--speed") == 0) {
      mode = argv[i];
      n = strtoul(argv[i + 1], NULL, 10);
    } else
      break;
  }
  if (!mode || i != argc || n == 0) {
    fprintf(stderr, "usage: test_strtod --random N [--seed S] | --speed N "
                    "[--seed S]\n");
    return 2;
  }
  rng_state = seed;
  if (idem_canon_open(&canon) != IDEM_OK) return 1;
  if (strcmp(mode, "--speed") == 0)
    mode_speed(n);
  else
    mode_random(n);
  idem_canon_close(canon);
  return check_done();
}
