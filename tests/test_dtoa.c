/*
** test_dtoa.c - checks idem__dtoa() (src/dtoa.c) against independent oracles.
**
**   test_dtoa --random N [--seed S]  N uniform random bit patterns, N/10
**                                    structured ones, and the special cases,
**                                    each against the exact oracle below
**   test_dtoa --es6 FILE             every "HEX,EXPECTED" line, byte for byte
**   test_dtoa --emit N [--seed S]    "HEX,FORMATTED" lines for dtoa_node.js
**   test_dtoa --speed N [--seed S]   ns per call, idem__dtoa vs "%.17g"
**
** The oracle shares no code with dtoa.c.  glibc prints the exact decimal
** expansion of a double ("%.800e" is always exact: a double has at most 767
** significant digits) and its strtod() rounds correctly.  At precision p the
** two p-digit neighbours of v are L = v truncated and H = L + one unit in the
** last place; if any p-digit decimal reads back as v then L or H does (it
** lies between that decimal and v, inside the rounding interval), and every
** other p-digit decimal is farther from v.  So the first p where L or H reads
** back as v is the shortest length; if both do, the one nearer to v wins,
** decided exactly by comparing the dropped digits with 5000...; an exact tie
** takes the even last digit.  That is precisely ECMAScript's choice.  Merely
** taking the shortest correctly rounded "%.*e" would be wrong at powers of
** two, where the rounding interval is lopsided: the nearest p-digit decimal
** may fall outside it while the other neighbour is inside.  As a self-check
** of the decimal arithmetic, the nearer of L and H must equal what "%.*e"
** prints (at the deciding p and at p <= 2 and p >= 15).  The ES layout is
** then rebuilt here with snprintf and compared byte for byte.
*/
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idemInt.h"

#define EXP_MASK (UINT64_C(0x7ff) << 52)
#define FRAC_MASK ((UINT64_C(1) << 52) - 1)
#define SIGN_BIT (UINT64_C(1) << 63)

static unsigned long n_pass, n_fail;

/* ---- helpers --------------------------------------------------------- */

static uint64_t rng_state;

/* splitmix64: tiny, seedable, and good enough to cover bit patterns. */
static uint64_t rnd(void) {
  uint64_t z = (rng_state += UINT64_C(0x9e3779b97f4a7c15));

  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
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

static int finite_bits(uint64_t b) { return (b & EXP_MASK) != EXP_MASK; }

/* ---- the oracle ------------------------------------------------------ */

#define EXACT_DIGITS 800

/* Does "d[0].d[1..p)e<e>" read back as exactly the bits of a? */
static int round_trips(const char *d, int p, int e, double a) {
  char s[64];

  snprintf(s, sizeof s, "%c.%.*se%d", d[0], p - 1, d + 1, e);
  return to_bits(strtod(s, NULL)) == to_bits(a);
}

/* Sign of (digits r[0..len) read as 0.r) - 1/2. */
static int cmp_half(const char *r, int len) {
  int i;

  if (len == 0 || r[0] < '5') return -1;
  if (r[0] > '5') return 1;
  for (i = 1; i < len; i++)
    if (r[i] != '0') return 1;
  return 0;
}

/*
** Shortest closest digits of |a| (a != 0): out (NUL-terminated, no trailing
** zeros), *k their count, *n the ES exponent (value = 0.out * 10^n).
** Returns 0, or -1 if the oracle's own self-check failed.
*/
static int oracle(double a, char *out, int *k, int *n) {
  char s[EXACT_DIGITS + 32], dig[EXACT_DIGITS + 2];
  int e, p, i;

  a = from_bits(to_bits(a) & ~SIGN_BIT);
  snprintf(s, sizeof s, "%.*e", EXACT_DIGITS, a);
  if (s[1] != '.' || s[EXACT_DIGITS + 2] != 'e') return -1;
  dig[0] = s[0];
  memcpy(dig + 1, s + 2, EXACT_DIGITS);
  dig[EXACT_DIGITS + 1] = '\0';
  e = atoi(s + EXACT_DIGITS + 3);
  /* The expansion must have ended well before 800 digits. */
  for (i = EXACT_DIGITS - 20; i <= EXACT_DIGITS; i++)
    if (dig[i] != '0') return -1;

  for (p = 1; p <= 17; p++) {
    char lo[24], hi[24], chk[64], want[64];
    int ehi = e, rest_cmp, rl, rh, j;
    const char *rest = dig + p;
    int rest_len = EXACT_DIGITS + 1 - p;
    const char *pick;
    int epick;

    memcpy(lo, dig, (size_t)p);
    lo[p] = '\0';
    rest_cmp = cmp_half(rest, rest_len);
    for (j = 0; j < rest_len && rest[j] == '0'; j++)
      ;
    if (j == rest_len) {
      /* v itself has p digits: nothing can be closer. */
      pick = lo;
      epick = e;
      goto found;
    }
    memcpy(hi, lo, (size_t)p + 1);
    for (j = p - 1; j >= 0 && hi[j] == '9'; j--) hi[j] = '0';
    if (j >= 0) {
      hi[j]++;
    } else {
      hi[0] = '1'; /* 99..9 + 1 = 10..0: one more decade */
      ehi++;
    }
    rl = round_trips(lo, p, e, a);
    rh = round_trips(hi, p, ehi, a);

    /* Self-check against glibc's correctly rounded p digits: at the p that
    ** decides, and at the ends of the range so every digit position gets
    ** exercised; not at every p, because printf is most of the run time. */
    if (rl || rh || p <= 2 || p >= 15) {
      const char *near = rest_cmp < 0 ? lo
                         : rest_cmp > 0
                             ? hi
                             : ((lo[p - 1] - '0') % 2 == 0 ? lo : hi);
      int enear = near == lo ? e : ehi;

      snprintf(chk, sizeof chk, "%.*e", p - 1, a);
      snprintf(want, sizeof want, "%c%s%.*se%+03d", near[0], p > 1 ? "." : "",
               p - 1, near + 1, enear);
      if (strcmp(chk, want) != 0) {
        printf("ORACLE SELF-CHECK %a p=%d printf=%s mine=%s\n", a, p, chk,
               want);
        return -1;
      }
    }
    if (!rl && !rh) continue;
    if (rl && rh) {
      if (rest_cmp < 0 || (rest_cmp == 0 && (lo[p - 1] - '0') % 2 == 0))
        pick = lo, epick = e;
      else
        pick = hi, epick = ehi;
    } else if (rl) {
      pick = lo, epick = e;
    } else {
      pick = hi, epick = ehi;
    }
  found:
    for (i = p; i > 1 && pick[i - 1] == '0'; i--)
      ;
    memcpy(out, pick, (size_t)i);
    out[i] = '\0';
    *k = i;
    *n = epick + 1;
    return 0;
  }
  return -1; /* 17 digits always round-trip: unreachable */
}

/* ES Number::toString layout, built independently of dtoa.c. */
static void es_format(char *out, size_t cap, int neg, const char *d, int k,
                      int n) {
  const char *sg = neg ? "-" : "";

  if (k <= n && n <= 21)
    snprintf(out, cap, "%s%s%.*s", sg, d, n - k, "000000000000000000000");
  else if (0 < n && n <= 21)
    snprintf(out, cap, "%s%.*s.%s", sg, n, d, d + n);
  else if (-6 < n && n <= 0)
    snprintf(out, cap, "%s0.%.*s%s", sg, -n, "000000", d);
  else
    snprintf(out, cap, "%s%c%s%se%+d", sg, d[0], k > 1 ? "." : "", d + 1,
             n - 1);
}

/* Format v with idem__dtoa into a NUL-terminated string; flags overruns. */
static size_t run_dtoa(double v, char *s) {
  char buf[IDEM__DTOA_MAX + 8];
  size_t len;

  memset(buf, 0x5a, sizeof buf);
  len = idem__dtoa(v, buf);
  if (len == 0 || len > IDEM__DTOA_MAX || buf[IDEM__DTOA_MAX] != 0x5a) {
    printf("BAD LENGTH %zu for %a\n", len, v);
    len = len > IDEM__DTOA_MAX ? IDEM__DTOA_MAX : len;
    n_fail++;
  }
  memcpy(s, buf, len);
  s[len] = '\0';
  return len;
}

static void check(double v) {
  char mine[IDEM__DTOA_MAX + 1], want[64], od[32];
  int k = 0, n = 0, ok;
  uint64_t b = to_bits(v);

  run_dtoa(v, mine);
  if (v == 0) {
    snprintf(want, sizeof want, "0");
    snprintf(od, sizeof od, "0");
  } else if (oracle(v, od, &k, &n) != 0) {
    printf("FAIL %016" PRIx64 " oracle failed, dtoa=%s\n", b, mine);
    n_fail++;
    return;
  } else {
    es_format(want, sizeof want, v < 0, od, k, n);
  }
  ok = strcmp(mine, want) == 0;
  /* Redundant with the string compare, but a clearer diagnosis. */
  if (v != 0 && to_bits(strtod(mine, NULL)) != b) {
    printf("FAIL %016" PRIx64 " %s does not read back\n", b, mine);
    ok = 0;
  }
  if (ok) {
    n_pass++;
  } else {
    printf("FAIL %016" PRIx64 " (%.17g) dtoa=%s oracle=%s (digits %s n=%d)\n",
           b, v, mine, want, od, n);
    n_fail++;
  }
}

static void check_pm(double v) {
  check(v);
  check(-v);
}

/* v and its neighbours up to r ulps away (staying finite). */
static void check_around(double v, int r) {
  uint64_t b = to_bits(v) & ~SIGN_BIT;
  int i;

  for (i = -r; i <= r; i++) {
    uint64_t x = b + (uint64_t)(int64_t)i;

    if ((i < 0 && b < (uint64_t)-i) || !finite_bits(x)) continue;
    check_pm(from_bits(x));
  }
}

/* ---- inputs ---------------------------------------------------------- */

static double pow10_double(int e) {
  char s[16];

  snprintf(s, sizeof s, "1e%d", e);
  return strtod(s, NULL);
}

/* 2^e for -1074 <= e <= 1023, built from bits (no libm needed). */
static double pow2(int e) {
  if (e >= -1022) return from_bits((uint64_t)(e + 1023) << 52);
  return from_bits(UINT64_C(1) << (e + 1074));
}

static uint64_t pow10_u64(unsigned n) {
  uint64_t p = 1;

  while (n--) p *= 10;
  return p;
}

/* A random finite double: uniform bits, or one of the shapes that matter. */
static double gen_mixed(void) {
  for (;;) {
    uint64_t r = rnd(), b;
    unsigned kind = (unsigned)(r % 100);
    double d;

    if (kind < 40) {
      b = rnd();
    } else if (kind < 55) {
      /* Subnormals, many with only a few significant bits. */
      unsigned w = 1 + (unsigned)(rnd() % 52);
      b = rnd() & ((UINT64_C(1) << w) - 1);
      if (b == 0) b = 1;
    } else if (kind < 70) {
      unsigned w = 1 + (unsigned)(rnd() % 53);
      b = to_bits((double)(rnd() >> (64 - w)));
    } else if (kind < 80) {
      int e = -324 + (int)(rnd() % 633);
      b = to_bits(pow10_double(e)) + (rnd() % 7) - 3;
    } else if (kind < 90) {
      /* Short decimals: few digits, any exponent. */
      char s[48];
      unsigned nd = 1 + (unsigned)(rnd() % 15);
      uint64_t m = rnd() % pow10_u64(nd);
      int e = -340 + (int)(rnd() % 650);
      snprintf(s, sizeof s, "%" PRIu64 "e%d", m, e);
      b = to_bits(strtod(s, NULL));
    } else {
      int q = -1074 + (int)(rnd() % 2098);
      b = to_bits(pow2(q)) + (rnd() % 5) - 2;
    }
    b = (b & ~SIGN_BIT) | (rnd() & SIGN_BIT);
    if (!finite_bits(b)) continue;
    d = from_bits(b);
    return d;
  }
}

static double gen_uniform(void) {
  uint64_t b;

  do b = rnd();
  while (!finite_bits(b));
  return from_bits(b);
}

static void specials(void) {
  static const double misc[] = {
      0.1,
      0.2,
      0.3,
      1.0 / 3,
      2.0 / 3,
      123.456,
      1e23,
      9007199254740993.0,
      5e-324,
      1.7976931348623157e308,
      2.2250738585072014e-308,
      2.2250738585072009e-308,
      4.35,
      0.000001,
      0.0000001,
      1e21,
      1e20,
      999999999999999999999.0,
      123e18,
      1.5,
      0.5,
      100,
      1e300 * 1.5,
      4.940656458412e-324,
      9.8813129168249309e-324,
      1.2345678901234567e-308,
      295147905179352825856.0,
      18446744073709551616.0,
      1e22,
      1e-6,
      1e-5,
      0.00001234,
      1.7976931348623157e308 / 3,
      3.0517578125e-05,
      299792458,
  };
  uint64_t c;
  int e, i;

  check(0.0);
  check(-0.0);
  for (i = 0; i < (int)(sizeof misc / sizeof misc[0]); i++)
    check_around(misc[i], 2);
  /* Smallest subnormals exhaustively: tiny significands, few digits. */
  for (c = 1; c <= 5000; c++) check_pm(from_bits(c));
  check_around(from_bits(FRAC_MASK), 3); /* max subnormal */
  check_around(DBL_MIN, 3);              /* min normal */
  check_around(DBL_MAX, 3);
  for (e = -325; e <= 308; e++) check_around(pow10_double(e), 2);
  for (e = -1074; e <= 1023; e++) /* lopsided intervals */
    check_around(pow2(e), 2);
  for (i = -200; i <= 200; i++) {
    check_pm(9007199254740992.0 + i);        /* 2^53 */
    check_pm(4503599627370496.0 + i);        /* 2^52 */
    check_pm(18014398509481984.0 + 2.0 * i); /* 2^54 */
  }
  check_around(1e21, 5); /* plain/exponent switch */
  check_around(1e-7, 5);
  check_around(1e-6, 5);
  for (i = 1; i <= 1000; i++) { /* small integers */
    check_pm((double)i);
    check_pm(i / 1000.0);
    check_pm(i * 1e20);
  }
  for (e = -1074; e <= 971; e++) /* short significands */
    for (c = 1; c <= 7; c++) check_pm((double)c * pow2(e));
}

/* ---- modes ----------------------------------------------------------- */

static int finish(void) {
  printf("%lu passed, %lu failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}

static int mode_random(unsigned long n) {
  unsigned long i;

  specials();
  for (i = 0; i < n; i++) check(gen_uniform());
  for (i = 0; i < n / 10; i++) check(gen_mixed());
  return finish();
}

/* tests/data/rfc8785/numbers-es6-100k.txt: its number of lines */
#define ES6_LINES 100000

static int mode_es6(const char *path) {
  FILE *f = fopen(path, "r");
  char line[256];
  unsigned long lineno = 0;

  if (!f) {
    perror(path);
    return 2;
  }
  while (fgets(line, sizeof line, f)) {
    char mine[IDEM__DTOA_MAX + 1], *comma, *end;
    size_t l = strlen(line);
    uint64_t b;

    lineno++;
    while (l && (line[l - 1] == '\n' || line[l - 1] == '\r')) line[--l] = '\0';
    if (l == 0) continue;
    comma = strchr(line, ',');
    errno = 0;
    b = strtoull(line, &end, 16);
    if (!comma || end != comma || errno) {
      printf("line %lu: malformed: %s\n", lineno, line);
      n_fail++;
      continue;
    }
    run_dtoa(from_bits(b), mine);
    if (strcmp(mine, comma + 1) == 0) {
      n_pass++;
    } else {
      printf("FAIL line %lu %s: dtoa=%s expected=%s\n", lineno, line, mine,
             comma + 1);
      n_fail++;
    }
  }
  fclose(f);
  if (n_pass + n_fail != ES6_LINES) {
    /* the file is the reference's first 100,000 numbers: fewer lines is a
    ** cut or empty file, and proves nothing; more is another file */
    printf("%s: %lu numbers, not the %d of the reference file\n", path,
           (unsigned long)(n_pass + n_fail), ES6_LINES);
    n_fail++;
  }
  return finish();
}

static int mode_emit(unsigned long n) {
  unsigned long i;

  for (i = 0; i < n; i++) {
    char mine[IDEM__DTOA_MAX + 1];
    double v = gen_mixed();

    run_dtoa(v, mine);
    printf("%" PRIx64 ",%s\n", to_bits(v), mine);
  }
  return n_fail ? 1 : 0;
}

static double now_ns(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int mode_speed(unsigned long n) {
  double *dbl = malloc(n * sizeof *dbl), *ints = malloc(n * sizeof *ints);
  const double *sets[2];
  static const char *const names[2] = {"random doubles", "integers < 2^53"};
  unsigned long i;
  int s;
  volatile size_t sink = 0;

  if (!dbl || !ints) return 2;
  for (i = 0; i < n; i++) {
    dbl[i] = gen_uniform();
    ints[i] = (double)(rnd() >> 11);
  }
  sets[0] = dbl;
  sets[1] = ints;
  for (s = 0; s < 2; s++) {
    char buf[IDEM__DTOA_MAX];
    double t0, t1, t2;
    size_t acc = 0;

    t0 = now_ns();
    for (i = 0; i < n; i++) acc += idem__dtoa(sets[s][i], buf);
    t1 = now_ns();
    for (i = 0; i < n; i++)
      acc += (size_t)snprintf(buf, sizeof buf, "%.17g", sets[s][i]);
    t2 = now_ns();
    sink += acc;
    printf("%-16s idem__dtoa %6.1f ns/call   snprintf %%.17g %6.1f ns/call\n",
           names[s], (t1 - t0) / (double)n, (t2 - t1) / (double)n);
  }
  free(dbl);
  free(ints);
  return sink == 0; /* never true; keeps the loops from being elided */
}

static int usage(void) {
  fprintf(stderr, "usage: test_dtoa --random N [--seed S] | --es6 FILE |"
                  " --emit N [--seed S] | --speed N [--seed S]\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *mode, *arg;
  unsigned long n;
  int i;

  if (argc < 3) return usage();
  mode = argv[1];
  arg = argv[2];
  rng_state = 1;
  for (i = 3; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--seed") != 0) return usage();
    rng_state = strtoull(argv[i + 1], NULL, 0);
  }
  if (strcmp(mode, "--es6") == 0) return mode_es6(arg);
  n = strtoul(arg, NULL, 0);
  if (strcmp(mode, "--random") == 0) return mode_random(n);
  if (strcmp(mode, "--emit") == 0) return mode_emit(n);
  if (strcmp(mode, "--speed") == 0) return mode_speed(n);
  return usage();
}
