/*
** canon.c - RFC 8785 (JCS) canonical JSON in one pass.
**
** The canonicalizer reads a JSON text once, left to right, and writes the
** canonical form as it goes into c->out.  It never builds a tree:
**
**   - Strings are validated (UTF-8 per Unicode Table 3-7, escapes, surrogate
**     pairs) and re-escaped minimally: \" \\ \b \f \n \r \t, other controls
**     as \u00xx, everything else as raw UTF-8.  Runs of plain ASCII are
**     copied eight bytes at a time.
**   - Numbers: an integer literal (no fraction, no exponent) of magnitude at
**     most 2^53 is already in canonical form except "-0", so its digits are
**     copied.  Any other number is converted to the nearest double (Clinger's
**     exact fast path, else Eisel-Lemire in strtod.c, else strtod_l in the C
**     locale) and printed by idem__dtoa() in ECMAScript form.
**   - Objects: each member is written in input order while its offsets are
**     pushed on a member stack.  When the object closes, the names are
**     checked for order; only if they are out of order (or a member must be
**     dropped) are the members sorted - a stable merge sort by UTF-16 code
**     units - and copied back through a scratch buffer.  The object is the
**     tail of the output at that moment, so this moves nothing else.  Equal
**     neighbours after the sort are duplicate names.
**
** Containers are tracked on an explicit stack, not by recursion, so the
** depth limit (not the C stack) decides how deep a text may nest.
**
** Invariants: at every value and member the output has room for the rest
** of the input plus one number (no token expands by more than a number
** does), so writers need not check capacity byte by byte.  On any failure
** c->err, c->err_off (a byte offset into the input) and c->errmsg say what
** and where; the output is then meaningless.
*/
#define _GNU_SOURCE /* strtod_l, newlocale */
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canon.h"

/* Word-at-a-time tricks (eight bytes in a uint64_t, GCC's bit builtins)
** where the byte order is known to be little-endian; plain loops elsewhere. */
#if defined(__GNUC__) && defined(__BYTE_ORDER__) &&                            \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define CANON_SWAR 1
#endif

/* ---- errors --------------------------------------------------------------- */

int idem__canon_fail(idem_canon *c, int code, size_t off, const char *fmt,
                     ...) {
  va_list ap;
  int n;
  c->err = code;
  c->err_off = off;
  va_start(ap, fmt);
  n = vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
  va_end(ap);
  if (off == IDEM__NO_OFFSET) {
    c->err_off = 0;
    return code;
  }
  if (n >= 0 && (size_t)n < sizeof c->errmsg)
    snprintf(c->errmsg + n, sizeof c->errmsg - (size_t)n, " at byte %zu", off);
  return code;
}

/* A short, printable rendering of the input byte at p for messages. */
static const char *show_byte(const unsigned char *p, const unsigned char *end,
                             char buf[16]) {
  if (p >= end) return "end of text";
  if (*p >= 0x21 && *p < 0x7f)
    snprintf(buf, 16, "'%c'", *p);
  else
    snprintf(buf, 16, "byte 0x%02x", *p);
  return buf;
}

/* ---- small helpers -------------------------------------------------------- */

static inline const unsigned char *skip_ws(const unsigned char *p,
                                           const unsigned char *end) {
  if (p < end && ' ' < *p) return p; /* the common case: none */
  while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
  return p;
}

static inline int is_digit(unsigned char b) { return b >= '0' && b <= '9'; }

static int hex4(const unsigned char *p, unsigned *out) {
  unsigned v = 0;
  int i;
  for (i = 0; i < 4; i++) {
    unsigned char b = p[i];
    unsigned d;
    if (b >= '0' && b <= '9')
      d = (unsigned)(b - '0');
    else if ((b | 0x20) >= 'a' && (b | 0x20) <= 'f')
      d = (unsigned)((b | 0x20) - 'a' + 10);
    else
      return 0;
    v = v << 4 | d;
  }
  *out = v;
  return 1;
}

/*
** Copy the run of plain bytes at q to w and return its length: printable
** ASCII other than '"' and '\\', which a string copies unchanged.  It may
** write up to 15 bytes past the run (never past what the caller reserved:
** a string's output never outgrows its input).  Sixteen bytes at a time with
** SSE2 (a signed compare below 0x20 catches controls and bytes >= 0x80 at
** once), else eight with the classic "has a zero byte" bit tricks; the
** first special byte is the lowest set bit either way.  Never reads at or
** past end.
*/
#if defined(__SSE2__)
#include <emmintrin.h>
static inline size_t copy_run(const unsigned char *q, const unsigned char *end,
                              char *w) {
  const unsigned char *p = q;
  const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\');
  const __m128i space = _mm_set1_epi8(0x20);
  while (end - p >= 16) {
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m128i m = _mm_or_si128(
        _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
        _mm_cmplt_epi8(v, space));
    unsigned mask = (unsigned)_mm_movemask_epi8(m);
    _mm_storeu_si128((__m128i *)(void *)(w + (p - q)), v);
    if (mask) return (size_t)(p - q) + (size_t)__builtin_ctz(mask);
    p += 16;
  }
  while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\')
    w[p - q] = (char)*p, p++;
  return (size_t)(p - q);
}
#else
static inline size_t copy_run(const unsigned char *q, const unsigned char *end,
                              char *w) {
  const unsigned char *p = q;
#ifdef CANON_SWAR
  const uint64_t ones = 0x0101010101010101u, high = 0x8080808080808080u;
  while (end - p >= 8) {
    uint64_t x, q1, b1, m;
    memcpy(&x, p, 8);
    q1 = x ^ (ones * '"');
    b1 = x ^ (ones * '\\');
    m = (((x - ones * 0x20) & ~x) | ((q1 - ones) & ~q1) | ((b1 - ones) & ~b1) |
         x) &
        high;
    memcpy(w + (p - q), &x, 8);
    if (m) return (size_t)(p - q) + (size_t)__builtin_ctzll(m) / 8;
    p += 8;
  }
#endif
  while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\')
    w[p - q] = (char)*p, p++;
  return (size_t)(p - q);
}
#endif

static const char hexdigits[] = "0123456789abcdef";

/* Write code point cp (never a surrogate) canonically at w. */
static inline char *put_cp(char *w, unsigned cp, int *escaped) {
  if (cp < 0x20) {
    *escaped = 1;
    *w++ = '\\';
    switch (cp) {
    case '\b': *w++ = 'b'; break;
    case '\f': *w++ = 'f'; break;
    case '\n': *w++ = 'n'; break;
    case '\r': *w++ = 'r'; break;
    case '\t': *w++ = 't'; break;
    default:
      *w++ = 'u';
      *w++ = '0';
      *w++ = '0';
      *w++ = hexdigits[cp >> 4];
      *w++ = hexdigits[cp & 15];
    }
  } else if (cp == '"' || cp == '\\') {
    *escaped = 1;
    *w++ = '\\';
    *w++ = (char)cp;
  } else if (cp < 0x80) {
    *w++ = (char)cp;
  } else if (cp < 0x800) {
    *w++ = (char)(0xC0 | cp >> 6);
    *w++ = (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *w++ = (char)(0xE0 | cp >> 12);
    *w++ = (char)(0x80 | (cp >> 6 & 0x3F));
    *w++ = (char)(0x80 | (cp & 0x3F));
  } else {
    *w++ = (char)(0xF0 | cp >> 18);
    *w++ = (char)(0x80 | (cp >> 12 & 0x3F));
    *w++ = (char)(0x80 | (cp >> 6 & 0x3F));
    *w++ = (char)(0x80 | (cp & 0x3F));
  }
  return w;
}

/* Length of the valid UTF-8 sequence at p (Unicode Table 3-7: no overlong
** forms, no surrogates, nothing above U+10FFFF), or 0 when invalid. */
static inline size_t utf8_len(const unsigned char *p,
                              const unsigned char *end) {
  unsigned char b = p[0], lo = 0x80, hi = 0xBF;
  size_t n, i;
  if (b < 0xC2) return 0;
  if (b < 0xE0)
    n = 2;
  else if (b < 0xF0) {
    n = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b < 0xF5) {
    n = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else
    return 0;
  if ((size_t)(end - p) < n) return 0;
  if (p[1] < lo || p[1] > hi) return 0;
  for (i = 2; i < n; i++)
    if (p[i] < 0x80 || p[i] > 0xBF) return 0;
  return n;
}

size_t idem__utf8_len(const unsigned char *p, const unsigned char *end) {
  return p < end ? utf8_len(p, end) : 0;
}

int idem__utf8_text(const char *p, size_t n) {
  const unsigned char *q = (const unsigned char *)p, *end = q + n;
  size_t k;
  for (; q < end; q += k)
    if (!(k = *q < 0x80 ? (size_t)(*q != 0) : utf8_len(q, end))) return 0;
  return 1;
}

/*
** Text in other scripts, sixteen bytes at a time (x86-64 with SSSE3, chosen
** at run time: idem_canon_open sets c->simd).  scan_utf8() copies a string's
** content from q to w while it is plain: no '"', no '\\', no control byte,
** and valid UTF-8, which it checks a block at a time with the three
** nibble-table lookups of Keiser and Lemire ("Validating UTF-8 in less than
** one instruction per byte", 2021), worked out here from the Unicode table
** (3-7) the scalar utf8_len() follows.  Each error class is a bit:
** TOO_SHORT a lead byte not followed by a continuation byte, TOO_LONG a
** continuation after ASCII, TWO_CONTS two continuations in a row (allowed
** only as the third or fourth byte of a sequence), OVERLONG_2/3/4 the
** overlong forms (C0, C1; E0 80-9F; F0 80-8F), SURROGATE ED A0-BF,
** TOO_LARGE F4 90-BF and F5-FF.  lo1 and hi1 classify the byte before,
** hi2 the byte itself; a byte is wrong when all three share a bit, except
** that TWO_CONTS is right exactly when the byte two or three back starts a
** three- or four-byte sequence.
**
** It stops at the first special byte (the caller handles it, then calls
** again) or when fewer than 16 bytes are left, backing up to the start of
** a character cut by that point; the scalar loop takes it from there.
** Returns 0, or -1 when some byte is not valid UTF-8: the caller then
** reads the whole string again with the scalar code, which says where.
*/
#if defined(__x86_64__) && defined(__GNUC__)
#define CANON_SSSE3 1
#include <tmmintrin.h>

#define U8_TOO_SHORT 0x01
#define U8_TOO_LONG 0x02
#define U8_OVERLONG_3 0x04
#define U8_TOO_LARGE 0x08
#define U8_SURROGATE 0x10
#define U8_OVERLONG_2 0x20
#define U8_TOO_LARGE_1000 0x40
#define U8_OVERLONG_4 0x40
#define U8_TWO_CONTS 0x80
#define U8_CARRY (U8_TOO_SHORT | U8_TOO_LONG | U8_TWO_CONTS)

__attribute__((target("ssse3"))) static inline __m128i
utf8_block_error(__m128i prev, __m128i v) {
  const __m128i hi1_t = _mm_setr_epi8(
      /* 0-7: ASCII */
      U8_TOO_LONG, U8_TOO_LONG, U8_TOO_LONG, U8_TOO_LONG, U8_TOO_LONG,
      U8_TOO_LONG, U8_TOO_LONG, U8_TOO_LONG,
      /* 8-B: continuation */
      (char)U8_TWO_CONTS, (char)U8_TWO_CONTS, (char)U8_TWO_CONTS,
      (char)U8_TWO_CONTS,
      /* C: two bytes, D: two bytes, E: three, F: four */
      U8_TOO_SHORT | U8_OVERLONG_2, U8_TOO_SHORT,
      U8_TOO_SHORT | U8_OVERLONG_3 | U8_SURROGATE,
      U8_TOO_SHORT | U8_TOO_LARGE | U8_TOO_LARGE_1000 | U8_OVERLONG_4);
  const __m128i lo1_t = _mm_setr_epi8(
      (char)(U8_CARRY | U8_OVERLONG_3 | U8_OVERLONG_2 | U8_OVERLONG_4),
      (char)(U8_CARRY | U8_OVERLONG_2), (char)U8_CARRY, (char)U8_CARRY,
      (char)(U8_CARRY | U8_TOO_LARGE),
      (char)(U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000),
      (char)(U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000),
      (char)(U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000),
      (char)(U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000),
      (char)(U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000),
      (char)(U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000),
      (char)(U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000),
      (char)(U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000),
      (char)(U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000 | U8_SURROGATE),
      (char)(U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000),
      (char)(U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000));
  const __m128i hi2_t = _mm_setr_epi8(
      /* 0-7: ASCII */
      U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT,
      U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT,
      /* 8: 80-8F, 9: 90-9F, A-B: A0-BF */
      (char)(U8_TOO_LONG | U8_OVERLONG_2 | U8_TWO_CONTS | U8_OVERLONG_3 |
             U8_TOO_LARGE_1000 | U8_OVERLONG_4),
      (char)(U8_TOO_LONG | U8_OVERLONG_2 | U8_TWO_CONTS | U8_OVERLONG_3 |
             U8_TOO_LARGE),
      (char)(U8_TOO_LONG | U8_OVERLONG_2 | U8_TWO_CONTS | U8_SURROGATE |
             U8_TOO_LARGE),
      (char)(U8_TOO_LONG | U8_OVERLONG_2 | U8_TWO_CONTS | U8_SURROGATE |
             U8_TOO_LARGE),
      /* C-F: a lead byte */
      U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT);
  const __m128i nib = _mm_set1_epi8(0x0F);
  __m128i p1 = _mm_alignr_epi8(v, prev, 15);
  __m128i p2 = _mm_alignr_epi8(v, prev, 14);
  __m128i p3 = _mm_alignr_epi8(v, prev, 13);
  __m128i sc = _mm_and_si128(
      _mm_and_si128(
          _mm_shuffle_epi8(hi1_t, _mm_and_si128(_mm_srli_epi16(p1, 4), nib)),
          _mm_shuffle_epi8(lo1_t, _mm_and_si128(p1, nib))),
      _mm_shuffle_epi8(hi2_t, _mm_and_si128(_mm_srli_epi16(v, 4), nib)));
  /* the third and fourth bytes of a sequence: saturating subtraction
  ** leaves bit 7 set exactly for a byte >= E0 two back or >= F0 three
  ** back */
  __m128i must = _mm_or_si128(_mm_subs_epu8(p2, _mm_set1_epi8(0x60)),
                              _mm_subs_epu8(p3, _mm_set1_epi8(0x70)));
  return _mm_xor_si128(sc, _mm_and_si128(must, _mm_set1_epi8((char)0x80)));
}

/* Non-zero where the block ends inside a character: a lead byte among its
** last three with too few bytes after it. */
__attribute__((target("ssse3"))) static inline __m128i
utf8_cut(__m128i prev) {
  const __m128i max = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                    -1, -1, -1, (char)0xEF, (char)0xDF,
                                    (char)0xBF);
  return _mm_subs_epu8(prev, max);
}

/* Is any byte of x not zero? */
__attribute__((target("ssse3"))) static inline int any_byte(__m128i x) {
  return _mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_setzero_si128())) != 0xFFFF;
}

__attribute__((target("ssse3"))) static int
scan_utf8(const unsigned char **qp, char **wp, const unsigned char *end) {
  const unsigned char *q = *qp;
  char *w = *wp;
  const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\');
  const __m128i ctl = _mm_set1_epi8(0x1F);
  const __m128i idx =
      _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m128i prev = _mm_setzero_si128(), err = _mm_setzero_si128();
  while (end - q >= 16) {
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)q);
    __m128i sp = _mm_or_si128(
        _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
        _mm_cmpeq_epi8(_mm_max_epu8(v, ctl), ctl));
    unsigned mask = (unsigned)_mm_movemask_epi8(sp);
    _mm_storeu_si128((__m128i *)(void *)w, v);
    if (mask) { /* the content ends at byte k: what follows reads as 0 */
      int k = __builtin_ctz(mask);
      v = _mm_and_si128(v, _mm_cmpgt_epi8(_mm_set1_epi8((char)k), idx));
      err = _mm_or_si128(err, _mm_movemask_epi8(v) == 0
                                  ? utf8_cut(prev)
                                  : utf8_block_error(prev, v));
      if (any_byte(err)) return -1;
      *qp = q + k;
      *wp = w + k;
      return 0;
    }
    if (_mm_movemask_epi8(v) == 0) /* ASCII: nothing may be left open */
      err = _mm_or_si128(err, utf8_cut(prev));
    else
      err = _mm_or_si128(err, utf8_block_error(prev, v));
    prev = v;
    q += 16;
    w += 16;
  }
  if (any_byte(err)) return -1;
  if (any_byte(utf8_cut(prev))) { /* back up to the start of the character
                                  ** that was cut */
    int i = 1;
    while (q[-i] < 0xC0) i++;
    q -= i;
    w -= i;
  }
  *qp = q;
  *wp = w;
  return 0;
}
#endif

/* ---- strings -------------------------------------------------------------- */

/*
** Canonicalize the string whose opening quote is at *pp.  The caller has
** reserved room: a string's canonical form is never longer than its input.
** Sets *escaped when the output holds a backslash (names compare slower).
*/
static int parse_string(idem_canon *c, const unsigned char **pp,
                        const unsigned char *s, const unsigned char *end,
                        int *escaped) {
  const unsigned char *open = *pp, *q = open + 1;
  char *w = c->out.p + c->out.len;
#ifdef CANON_SSSE3
  int simd = c->simd;
#endif
  *w++ = '"';
  for (;;) {
    size_t run = copy_run(q, end, w);
    w += run;
    q += run;
#ifdef CANON_SSSE3
    /* at a byte >= 0x80 with a block's worth left: the rest of the string
    ** in blocks (a string that is all ASCII never gets here) */
    if (simd && q < end && *q >= 0x80 && end - q >= 16) {
      if (scan_utf8(&q, &w, end) != 0) {
        simd = 0; /* start again byte by byte, to say what is wrong where */
        q = open + 1;
        w = c->out.p + c->out.len + 1;
      }
      continue;
    }
#endif
    {
      unsigned char b;
      if (q >= end)
        return idem__canon_fail(c, IDEM_JSON_SYNTAX, (size_t)(open - s),
                                "unterminated string");
      b = *q;
      if (b == '"') {
        *w++ = '"';
        c->out.len = (size_t)(w - c->out.p);
        *pp = q + 1;
        return IDEM_OK;
      }
      if (b >= 0x80) {
        const unsigned char *from = q;
        do { /* text in other scripts comes in runs: check it, copy it once */
          size_t n = utf8_len(q, end);
          if (!n)
            return idem__canon_fail(c, IDEM_JSON_UTF8, (size_t)(q - s),
                                    "invalid UTF-8 byte 0x%02x in a string",
                                    *q);
          q += n;
        } while (q < end && *q >= 0x80);
        memcpy(w, from, (size_t)(q - from));
        w += q - from;
        continue;
      }
      if (b < 0x20)
        return idem__canon_fail(c, IDEM_JSON_SYNTAX, (size_t)(q - s),
                                "unescaped control character 0x%02x in a "
                                "string",
                                b);
      /* b == '\\' */
      if (end - q < 2)
        return idem__canon_fail(c, IDEM_JSON_SYNTAX, (size_t)(open - s),
                                "unterminated string");
      switch (q[1]) {
      case '"': w = put_cp(w, '"', escaped); break;
      case '\\': w = put_cp(w, '\\', escaped); break;
      case '/': *w++ = '/'; break;
      case 'b': w = put_cp(w, '\b', escaped); break;
      case 'f': w = put_cp(w, '\f', escaped); break;
      case 'n': w = put_cp(w, '\n', escaped); break;
      case 'r': w = put_cp(w, '\r', escaped); break;
      case 't': w = put_cp(w, '\t', escaped); break;
      case 'u': {
        unsigned cp, lo;
        if (end - q < 6 || !hex4(q + 2, &cp))
          return idem__canon_fail(c, IDEM_JSON_SYNTAX, (size_t)(q - s),
                                  "\\u must be followed by four hex digits");
        if (cp >= 0xDC00 && cp <= 0xDFFF)
          return idem__canon_fail(c, IDEM_JSON_SURROGATE, (size_t)(q - s),
                                  "unpaired low surrogate \\u%04x", cp);
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (end - q < 12 || q[6] != '\\' || q[7] != 'u' ||
              !hex4(q + 8, &lo) || lo < 0xDC00 || lo > 0xDFFF)
            return idem__canon_fail(c, IDEM_JSON_SURROGATE, (size_t)(q - s),
                                    "unpaired high surrogate \\u%04x", cp);
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          q += 6;
        }
        w = put_cp(w, cp, escaped);
        q += 4; /* the remaining 2 are skipped below */
        break;
      }
      default:
        return idem__canon_fail(c, IDEM_JSON_SYNTAX, (size_t)(q - s),
                                "invalid escape in a string");
      }
      q += 2;
    }
  }
}

/* ---- numbers -------------------------------------------------------------- */

static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;
static locale_t c_locale;

static void c_locale_init(void) {
  c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
}

/*
** Digits eight at a time.  digit_bytes(x): for the eight bytes of x
** (little-endian, so the first byte is the lowest) a word whose byte is 0
** exactly where x holds an ASCII digit - up to and including the first
** byte that is not one; past that it is unreliable (adding 6 may carry
** out of a byte >= 0xFA), which no caller looks at.  digits_value(x, n): the
** number that the first n (1..8) of those digits spell: their values move to
** the top of the word, so the bytes below are leading zeros, then three
** multiply-shift rounds combine pairs, quads and the two halves.
*/
#ifdef CANON_SWAR
static inline uint64_t digit_bytes(uint64_t x) {
  return ((x & 0xF0F0F0F0F0F0F0F0u) |
          (((x + 0x0606060606060606u) & 0xF0F0F0F0F0F0F0F0u) >> 4)) ^
         0x3333333333333333u;
}

static inline uint64_t digits_value(uint64_t x, unsigned n) {
  x -= 0x3030303030303030u; /* a borrow only moves up, past the digits */
  x <<= 8 * (8 - n);
  x = (x * 10 + (x >> 8)) & 0x00FF00FF00FF00FFu;   /* 4 x 2 digits */
  x = (x * 100 + (x >> 16)) & 0x0000FFFF0000FFFFu; /* 2 x 4 digits */
  return (x * 10000 + (x >> 32)) & 0xFFFFFFFFu;    /* 8 digits */
}
#endif

static const uint64_t pow10_u64[9] = {1,      10,      100,      1000,     10000,
                                      100000, 1000000, 10000000, 100000000};

/* The end of the run of digits at q. */
static inline const unsigned char *digits_end(const unsigned char *q,
                                              const unsigned char *end) {
#ifdef CANON_SWAR
  while (end - q >= 8) {
    uint64_t x, nd;
    memcpy(&x, q, 8);
    if ((nd = digit_bytes(x)) != 0) return q + __builtin_ctzll(nd) / 8;
    q += 8;
  }
#endif
  while (q < end && is_digit(*q)) q++;
  return q;
}

/* The run of digits at q: returns its end, adds its length to *n and its
** value to *m (*m = *m * 10^len + value; exact while the digits read into
** *m number at most 19, and wrapping harmlessly past that). */
static inline const unsigned char *scan_digits(const unsigned char *q,
                                               const unsigned char *end,
                                               uint64_t *m, size_t *n) {
#ifdef CANON_SWAR
  while (end - q >= 8) {
    uint64_t x, nd;
    unsigned k;
    memcpy(&x, q, 8);
    nd = digit_bytes(x);
    k = nd ? (unsigned)__builtin_ctzll(nd) / 8 : 8;
    if (k) *m = *m * pow10_u64[k] + digits_value(x, k);
    *n += k;
    q += k;
    if (k < 8) return q;
  }
#endif
  for (; q < end && is_digit(*q); q++, ++*n) *m = *m * 10 + (*q - '0');
  return q;
}

/* The decimal digits of a number literal: the first 19 significant digits
** in m, the power of ten that scales them, whether a dropped digit was not
** 0, and the exponent as written (saturated). */
typedef struct decimal {
  uint64_t m;
  long e10, ex;
  int nsig, cut, neg;
} decimal;

/* Add the digits [q, e) to d one by one; frac: they follow the decimal
** point.  Only for literals with more than 19 significant digits. */
static void add_digits(decimal *d, const unsigned char *q,
                       const unsigned char *e, int frac) {
  if (d->m == 0) /* leading zeros are not significant */
    for (; q < e && *q == '0'; q++)
      if (frac) d->e10--;
  for (; q < e; q++) {
    if (d->nsig < 19) {
      d->m = d->m * 10 + (uint64_t)(*q - '0');
      if (frac) d->e10--;
    } else {
      if (!frac) d->e10++;
      d->cut |= *q != '0';
    }
    d->nsig++;
  }
}

/* Exact powers of ten that a double holds (10^22 is the largest). */
static const double pow10_exact[23] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/*
** The nearest double to the decimal literal [p, end) whose digits are d.
** Clinger's fast path: a mantissa below 2^53 and |exponent| <= 22 makes the
** result one correctly rounded IEEE operation on exact operands.  Everything
** else goes to idem__decimal_to_double() (strtod.c, Eisel-Lemire) with the
** first 19 significant digits, and only when that cannot decide - a
** literal cut in the middle of a rounding boundary, or an exponent too
** long to read - to strtod_l, which glibc rounds correctly.
*/
static int number_value(idem_canon *c, const unsigned char *p,
                        const unsigned char *end, const decimal *d,
                        double *out) {
  long e10 = d->e10;
  if (d->m == 0) {
    *out = 0.0;
    return IDEM_OK;
  }
  if (d->nsig <= 19 && d->m < (UINT64_C(1) << 53) && e10 >= -22 &&
      e10 <= 22 + 15) {
    double v = (double)d->m;
    long k = e10;
    if (k < 0) {
      *out = (d->neg ? -v : v) / pow10_exact[-k];
      return IDEM_OK;
    }
    if (k > 22) { /* 12e30 = 12000000000e22 when that is still exact */
      v *= pow10_exact[k - 22];
      k = 22;
    }
    if (v < 9007199254740992.0) {
      *out = (d->neg ? -v : v) * pow10_exact[k];
      return IDEM_OK;
    }
  }
  /* Beyond +-400 the value is 0 or infinite anyway; a saturated exponent
  ** (over 10^8) is left to strtod_l, which reads it whole. */
  if (e10 < -400) e10 = -400;
  if (e10 > 400) e10 = 400;
  if (d->ex < 100000000 &&
      idem__decimal_to_double(d->m, (int)e10, d->cut, d->neg, out))
    return IDEM_OK;
  {
    size_t n = (size_t)(end - p);
    int rc;
    c->tmp.len = 0;
    if ((rc = idem__buf_reserve(&c->tmp, n + 1)) != IDEM_OK)
      return idem__canon_fail(c, rc, IDEM__NO_OFFSET, "out of memory");
    memcpy(c->tmp.p, p, n);
    c->tmp.p[n] = '\0';
    pthread_once(&c_locale_once, c_locale_init);
    if (c_locale == (locale_t)0)
      return idem__canon_fail(c, IDEM_NOMEM, IDEM__NO_OFFSET,
                              "cannot create the C locale");
    *out = strtod_l(c->tmp.p, NULL, c_locale);
  }
  return IDEM_OK;
}

/* Do the 16 digits at d spell a number above 2^53 = 9007199254740992, the
** largest integer literal that names exactly one double?  Compared as two
** big-endian words, so as to need no call. */
static inline int above_two53(const unsigned char *d) {
#ifdef CANON_SWAR
  const uint64_t hi = 0x3930303731393932u, lo = 0x3534373430393932u;
  uint64_t a, b;
  memcpy(&a, d, 8);
  memcpy(&b, d + 8, 8);
  a = __builtin_bswap64(a);
  b = __builtin_bswap64(b);
  return a > hi || (a == hi && b > lo);
#else
  return memcmp(d, "9007199254740992", 16) > 0;
#endif
}

/*
** Check the grammar of the number at *pp, read its digits in the same pass,
** and write its canonical form.  An integer is copied as written (it is
** canonical once -0 is 0): its digits are only counted, eight per load.
** Any other literal becomes a double and is printed: its digits go into
** one 64-bit significand, eight at a time; only a literal with more than
** 19 significant digits is read again, digit by digit, to round it.
*/
static int parse_number(idem_canon *c, const unsigned char **pp,
                        const unsigned char *s, const unsigned char *end) {
  const unsigned char *start = *pp, *q = start, *digits, *int_end;
  const unsigned char *frac = NULL, *frac_end = NULL;
  char *w = c->out.p + c->out.len;
  char tmp[16];
  decimal d = {0, 0, 0, 0, 0, 0};
  uint64_t m = 0;
  size_t nint = 0, nfrac = 0, nzero = 0;
  if (*q == '-') d.neg = 1, q++;
  digits = q;
  if (q < end && *q == '0') {
    q++; /* a zero integer part adds no significant digit */
    if (q < end && is_digit(*q))
      return idem__canon_fail(c, IDEM_JSON_SYNTAX, (size_t)(q - s),
                              "leading zero in a number");
  } else if (q < end && is_digit(*q)) {
    q = digits_end(q, end); /* an integer needs only its length */
    nint = (size_t)(q - digits);
  } else
    return idem__canon_fail(c, IDEM_JSON_SYNTAX, (size_t)(q - s),
                            "expected a digit, found %s",
                            show_byte(q, end, tmp));
  int_end = q;
  if (q >= end || (*q != '.' && (*q | 0x20) != 'e')) { /* an integer */
    size_t n = (size_t)(q - start);
    *pp = q;
    if (nint > 16 || (nint == 16 && above_two53(digits)))
      return idem__canon_fail(
          c, IDEM_JSON_BIGINT, (size_t)(start - s),
          "integer %.*s%s is beyond 2^53 and cannot be told apart from its "
          "neighbours (send it as a string)",
          (int)(n > 24 ? 24 : n), (const char *)start, n > 24 ? "..." : "");
    if (nint == 0) { /* 0 or -0, which is 0 */
      *w = '0';
      c->out.len++;
      return IDEM_OK;
    }
    /* at most 17 bytes: copied as two words when the input has them (the
    ** output has IDEM__DTOA_MAX bytes to spare past the text's length) */
    if (end - start >= 16 && n <= 16) {
      memcpy(w, start, 8);
      memcpy(w + 8, start + 8, 8);
    } else
      memcpy(w, start, n);
    c->out.len += n;
    return IDEM_OK;
  }
  if (nint) { /* the integer part's value, now that it is needed */
    size_t n = 0;
    scan_digits(digits, end, &m, &n);
  }
  if (*q == '.') {
    if (++q >= end || !is_digit(*q))
      return idem__canon_fail(c, IDEM_JSON_SYNTAX, (size_t)(q - s),
                              "expected a digit after '.'");
    frac = q;
    if (m == 0) /* 0.000123: zeros before the first significant digit */
      while (q < end && *q == '0') q++, nzero++;
    q = scan_digits(q, end, &m, &nfrac);
    frac_end = q;
  }
  if (q < end && (*q | 0x20) == 'e') {
    int eneg = 0;
    q++;
    if (q < end && (*q == '+' || *q == '-')) eneg = *q++ == '-';
    if (q >= end || !is_digit(*q))
      return idem__canon_fail(c, IDEM_JSON_SYNTAX, (size_t)(q - s),
                              "expected a digit in the exponent");
    for (; q < end && is_digit(*q); q++)
      if (d.ex < 100000000) d.ex = d.ex * 10 + (*q - '0');
    d.e10 = eneg ? -d.ex : d.ex;
  }
  *pp = q;
  if (nint + nfrac <= 19) { /* m holds every digit exactly */
    d.m = m;
    d.nsig = (int)(nint + nfrac);
    d.e10 -= (long)(nzero + nfrac);
  } else {
    add_digits(&d, digits, int_end, 0);
    if (frac) add_digits(&d, frac, frac_end, 1);
  }
  {
    double v;
    int rc = number_value(c, start, q, &d, &v);
    if (rc != IDEM_OK) return rc;
    if (isinf(v))
      return idem__canon_fail(c, IDEM_JSON_OVERFLOW, (size_t)(start - s),
                              "number %.*s%s overflows the double range",
                              (int)(q - start > 24 ? 24 : q - start),
                              (const char *)start, q - start > 24 ? "..." : "");
    if (v == 0 && d.m != 0)
      return idem__canon_fail(c, IDEM_JSON_UNDERFLOW, (size_t)(start - s),
                              "non-zero number %.*s%s underflows to zero",
                              (int)(q - start > 24 ? 24 : q - start),
                              (const char *)start, q - start > 24 ? "..." : "");
    c->out.len += idem__dtoa(v, c->out.p + c->out.len);
    return IDEM_OK;
  }
}

/* ---- member names --------------------------------------------------------- */

/* The next byte of a canonical string's content at *pp, unescaping the only
** escapes canonical output holds: \" \\ \b \f \n \r \t \u00xx. */
static inline unsigned next_byte(const unsigned char **pp) {
  const unsigned char *p = *pp;
  unsigned cp;
  if (*p != '\\') {
    *pp = p + 1;
    return *p;
  }
  *pp = p + 2;
  switch (p[1]) {
  case 'b': return '\b';
  case 'f': return '\f';
  case 'n': return '\n';
  case 'r': return '\r';
  case 't': return '\t';
  case 'u': *pp = p + 6; return hex4(p + 2, &cp) ? cp : 0;
  default: return p[1]; /* \" and \\ */
  }
}

/*
** Order of two distinct bytes at the first position where two UTF-8 names
** differ, by UTF-16 code units.  UTF-8 byte order is code point order; the
** two disagree only when a character >= U+10000 (lead byte F0-F4, a
** surrogate pair D800-DBFF in UTF-16) meets one in U+E000-U+FFFF (lead byte
** EE or EF), where UTF-16 puts the surrogate first.  Equal prefixes mean both
** bytes sit at the same position of their characters, so continuation bytes
** (< 0xC0) never trigger the swap.
*/
static inline int utf16_order(unsigned a, unsigned b) {
  if (a >= 0xF0 && (b == 0xEE || b == 0xEF)) return -1;
  if (b >= 0xF0 && (a == 0xEE || a == 0xEF)) return 1;
  return a < b ? -1 : 1;
}

/* name_cmp() past the first eight bytes, or when a name holds escapes. */
static int name_cmp_rest(const char *out, const idem__member *x,
                         const idem__member *y) {
  const unsigned char *a = (const unsigned char *)out + x->start + 1;
  const unsigned char *b = (const unsigned char *)out + y->start + 1;
  const unsigned char *ae = (const unsigned char *)out + x->colon - 1;
  const unsigned char *be = (const unsigned char *)out + y->colon - 1;
  if (!x->escaped && !y->escaped) {
    size_t la = (size_t)(ae - a), lb = (size_t)(be - b), n = la < lb ? la : lb;
    size_t i = 8 < n ? 8 : n; /* the prefixes are equal */
#ifdef CANON_SWAR
    for (; i + 8 <= n; i += 8) { /* the lowest differing byte comes first */
      uint64_t u, v;
      memcpy(&u, a + i, 8);
      memcpy(&v, b + i, 8);
      if (u != v) {
        i += (size_t)__builtin_ctzll(u ^ v) / 8;
        return utf16_order(a[i], b[i]);
      }
    }
#endif
    for (; i < n; i++)
      if (a[i] != b[i]) return utf16_order(a[i], b[i]);
    return la < lb ? -1 : la > lb;
  }
  while (a < ae && b < be) {
    unsigned ca = next_byte(&a), cb = next_byte(&b);
    if (ca != cb) return utf16_order(ca, cb);
  }
  return a < ae ? 1 : b < be ? -1 : 0;
}

/*
** A name's first eight bytes as a number that compares in UTF-16 order:
** big-endian, 0-padded (names shorter than eight bytes sort first; an
** unescaped name holds no 0 byte), with the lead bytes EE and EF (U+E000 -
** U+FFFF) moved to F5 and F6, above the lead bytes F0-F4 of the characters
** that UTF-16 writes as surrogates (utf16_order).  Those bytes are never
** continuation bytes and F5, F6 never occur in UTF-8, so no other order
** changes.
*/
static inline uint64_t name_key(uint64_t v) {
  if (v & 0x8080808080808080u) {
    int sh;
    for (sh = 0; sh < 64; sh += 8) {
      unsigned b = (unsigned)(v >> sh) & 0xFF;
      if (b == 0xEE || b == 0xEF) v += (uint64_t)(0xF5 - 0xEE) << sh;
    }
  }
  return v;
}

/*
** Compare two member names (canonical strings in the output) by UTF-16 code
** units of their decoded content.  Most comparisons end within the first
** eight bytes, kept in pfx (name_key): that test is inline.
*/
static inline int name_cmp(const char *out, const idem__member *x,
                           const idem__member *y) {
  if (x->pfx != y->pfx && !(x->escaped | y->escaped))
    return x->pfx < y->pfx ? -1 : 1;
  return name_cmp_rest(out, x, y);
}

/* Is the member's decoded name equal to the raw bytes [raw, raw+n)? */
static int name_is(const char *out, const idem__member *m, const char *raw,
                   size_t n) {
  const unsigned char *a = (const unsigned char *)out + m->start + 1;
  const unsigned char *ae = (const unsigned char *)out + m->colon - 1;
  const unsigned char *r = (const unsigned char *)raw, *re = r + n;
  if (!m->escaped) return (size_t)(ae - a) == n && memcmp(a, raw, n) == 0;
  while (a < ae && r < re)
    if (next_byte(&a) != *r++) return 0;
  return a == ae && r == re;
}

int idem__member_is(const idem_canon *c, const idem__member *m, const char *raw,
                    size_t n) {
  return name_is(c->out.p, m, raw, n);
}

int idem__canon_string(idem__buf *b, const char *raw, size_t n, size_t *bad) {
  const unsigned char *p = (const unsigned char *)raw, *end = p + n;
  char *w;
  int esc = 0, rc;
  /* the worst case is a control character: 1 byte becomes 6 */
  if (n > (SIZE_MAX - 2) / 6) return IDEM_RANGE;
  if ((rc = idem__buf_reserve(b, n * 6 + 2)) != IDEM_OK) return rc;
  w = b->p + b->len;
  *w++ = '"';
  while (p < end) {
    if (*p < 0x80) {
      w = put_cp(w, *p++, &esc);
    } else {
      size_t k = utf8_len(p, end);
      if (!k) {
        *bad = (size_t)(p - (const unsigned char *)raw);
        return IDEM_JSON_UTF8;
      }
      memcpy(w, p, k);
      w += k;
      p += k;
    }
  }
  *w++ = '"';
  b->len = (size_t)(w - b->p);
  return IDEM_OK;
}

int idem__canon_unstring(idem__buf *b, const char *canon, size_t n) {
  const unsigned char *p = (const unsigned char *)canon + 1;
  const unsigned char *end = (const unsigned char *)canon + n - 1;
  int rc;
  /* decoding never lengthens a string; +1 for the NUL */
  if ((rc = idem__buf_reserve(b, n + 1)) != IDEM_OK) return rc;
  if (!memchr(p, '\\', (size_t)(end - p))) { /* the common case: no escape */
    memcpy(b->p + b->len, p, (size_t)(end - p));
    b->len += (size_t)(end - p);
    p = end;
  }
  while (p < end) b->p[b->len++] = (char)next_byte(&p);
  b->p[b->len++] = '\0';
  return IDEM_OK;
}

/* Stable merge sort of m[0..n) by name, using tmp[0..n) as scratch. */
static void sort_members(const char *out, idem__member *m, idem__member *tmp,
                         size_t n) {
  size_t width, i;
  idem__member *src = m, *dst = tmp;
  if (n < 2) return;
  /* insertion-sort runs of 8 first: objects are small and nearly sorted */
  for (i = 0; i < n; i += 8) {
    size_t hi = i + 8 < n ? i + 8 : n, j;
    for (j = i + 1; j < hi; j++) {
      idem__member t = m[j];
      size_t k = j;
      while (k > i && name_cmp(out, &m[k - 1], &t) > 0) {
        m[k] = m[k - 1];
        k--;
      }
      m[k] = t;
    }
  }
  for (width = 8; width < n; width *= 2) {
    for (i = 0; i < n; i += 2 * width) {
      size_t lo = i, mid = i + width < n ? i + width : n;
      size_t hi = i + 2 * width < n ? i + 2 * width : n;
      size_t a = lo, b = mid, k = lo;
      while (a < mid && b < hi)
        dst[k++] = name_cmp(out, &src[b], &src[a]) < 0 ? src[b++] : src[a++];
      while (a < mid) dst[k++] = src[a++];
      while (b < hi) dst[k++] = src[b++];
    }
    idem__member *t = src;
    src = dst;
    dst = t;
  }
  if (src != m) memcpy(m, src, n * sizeof *m);
}

/* ---- objects -------------------------------------------------------------- */

static int grow_members(idem_canon *c, size_t need) {
  size_t cap = c->mem_cap ? c->mem_cap : 32;
  idem__member *m;
  if (need <= c->mem_cap) return IDEM_OK;
  while (cap < need) {
    if (cap > SIZE_MAX / 2 / sizeof *m) return IDEM_NOMEM;
    cap *= 2;
  }
  m = idem__realloc(c->mem, cap * sizeof *m);
  if (!m) return IDEM_NOMEM;
  c->mem = m;
  c->mem_cap = cap;
  return IDEM_OK;
}

/* Refuse member d, the second occurrence of a name. */
static int fail_duplicate(idem_canon *c, const idem__member *d) {
  size_t len = d->colon - d->start;
  return idem__canon_fail(c, IDEM_JSON_DUPLICATE, d->in_off,
                          "duplicate member name %.*s%s",
                          (int)(len > 60 ? 60 : len), c->out.p + d->start,
                          len > 60 ? "...\"" : "");
}

/*
** The object of frame f has just closed (its '}' written).  Put its members
** in canonical order, dropping the one named opt->drop_name at the drop
** depth, and fail on a duplicate name.
*/
static int close_object(idem_canon *c, const idem__frame *f, size_t depth,
                        const idem__canon_opt *opt) {
  idem__member *m = c->mem + f->mem_base;
  size_t n = c->mem_len - f->mem_base, i, drop = SIZE_MAX;
  int rc;
  if (opt->drop_name && depth == opt->drop_depth) {
    for (i = 0; i < n; i++)
      if (name_is(c->out.p, &m[i], opt->drop_name, opt->drop_len)) {
        drop = i;
        break;
      }
  }
  if (depth == 1 && opt->top_as_is && drop == SIZE_MAX && n <= 16) {
    /* left as it is: only duplicates matter, the first second occurrence
    ** in input order is the one reported, as after a sort */
    size_t j;
    for (j = 1; j < n; j++)
      for (i = 0; i < j; i++)
        if (name_cmp(c->out.p, &m[i], &m[j]) == 0)
          return fail_duplicate(c, &m[j]);
    return IDEM_OK;
  }
  for (i = 1; i < n; i++)
    if (name_cmp(c->out.p, &m[i - 1], &m[i]) >= 0) break;
  if (i < n) {
    size_t dup = SIZE_MAX, dupi = 0;
    if ((rc = grow_members(c, c->mem_len + n)) != IDEM_OK) return rc;
    m = c->mem + f->mem_base;
    sort_members(c->out.p, m, c->mem + c->mem_len, n);
    for (i = 1; i < n; i++)
      if (name_cmp(c->out.p, &m[i - 1], &m[i]) == 0 && m[i].in_off < dup) {
        dup = m[i].in_off;
        dupi = i;
      }
    if (dup != SIZE_MAX) return fail_duplicate(c, &m[dupi]);
    if (drop != SIZE_MAX) /* find it again after the sort */
      for (drop = 0;
           !name_is(c->out.p, &m[drop], opt->drop_name, opt->drop_len); drop++)
        ;
  } else if (drop == SIZE_MAX)
    return IDEM_OK; /* already canonical: the common case */

  /* Rebuild the object in canonical order in tmp, then copy it back. */
  {
    size_t total = c->out.len - f->out_start, k = 0, pos;
    char *t;
    c->tmp.len = 0;
    if ((rc = idem__buf_reserve(&c->tmp, total)) != IDEM_OK) return rc;
    t = c->tmp.p;
    t[k++] = '{';
    for (i = 0; i < n; i++) {
      size_t len = m[i].end - m[i].start;
      if (i == drop) continue;
      if (k > 1) t[k++] = ',';
      memcpy(t + k, c->out.p + m[i].start, len);
      pos = f->out_start + k;
      m[i].colon = pos + (m[i].colon - m[i].start);
      m[i].end = pos + len;
      m[i].start = pos;
      k += len;
    }
    t[k++] = '}';
    memcpy(c->out.p + f->out_start, t, k);
    c->out.len = f->out_start + k;
    if (drop != SIZE_MAX) {
      memmove(&m[drop], &m[drop + 1], (n - drop - 1) * sizeof *m);
      c->mem_len--;
    }
  }
  return IDEM_OK;
}

/* ---- the driver ----------------------------------------------------------- */

static int grow_stack(idem_canon *c, size_t need) {
  size_t cap = c->stack_cap ? c->stack_cap : 16;
  idem__frame *st;
  if (need <= c->stack_cap) return IDEM_OK;
  while (cap < need) cap *= 2;
  st = idem__realloc(c->stack, cap * sizeof *st);
  if (!st) return IDEM_NOMEM;
  c->stack = st;
  c->stack_cap = cap;
  return IDEM_OK;
}

static int nomem(idem_canon *c, int rc, const unsigned char *p,
                 const unsigned char *s) {
  if (rc == IDEM_NOMEM)
    return idem__canon_fail(c, rc, (size_t)(p - s), "out of memory");
  return idem__canon_fail(c, rc, (size_t)(p - s),
                          "canonical output would exceed its buffer cap");
}

/* Canonicalize text onto the end of c->out (the offsets kept in the frames
** and members count from c->out.p, so earlier bytes are never looked at). */
static int canon_onto(idem_canon *c, const char *text, size_t len,
                      const idem__canon_opt *opt) {
  const unsigned char *s = (const unsigned char *)text, *p = s, *end = s + len;
  size_t depth = 0;
  idem__frame *f = NULL;
  char tmp[16];
  int rc;

  c->err = IDEM_OK;
  c->err_off = 0;
  c->errmsg[0] = '\0';
  c->mem_len = 0;
  c->top_members = 0;
  if (len > c->max_bytes)
    return idem__canon_fail(c, IDEM_JSON_TOOBIG, c->max_bytes,
                            "text of %zu bytes is larger than the limit of %zu",
                            len, c->max_bytes);
  if (len >= 3 && s[0] == 0xEF && s[1] == 0xBB && s[2] == 0xBF)
    return idem__canon_fail(c, IDEM_JSON_BOM, 0,
                            "byte-order mark at the start of the text");
  p = skip_ws(p, end);
  if (p == end)
    return idem__canon_fail(c, IDEM_JSON_SYNTAX, len,
                            "expected a JSON value, found end of text");

value:
  if ((rc = idem__buf_reserve(&c->out, (size_t)(end - p) + IDEM__DTOA_MAX)))
    return nomem(c, rc, p, s);
  switch (*p) {
  case '{':
  case '[':
    if (depth >= opt->max_depth)
      return idem__canon_fail(c, IDEM_JSON_DEPTH, (size_t)(p - s),
                              "nesting deeper than %zu", opt->max_depth);
    if ((rc = grow_stack(c, depth + 1))) return nomem(c, rc, p, s);
    f = &c->stack[depth++];
    f->out_start = c->out.len;
    f->mem_base = c->mem_len;
    f->is_object = *p == '{';
    c->out.p[c->out.len++] = (char)*p++;
    p = skip_ws(p, end);
    if (p < end && *p == (f->is_object ? '}' : ']')) {
      c->out.p[c->out.len++] = (char)*p++;
      depth--;
      goto after_value;
    }
    if (f->is_object) goto member;
    if (p == end) goto early_end;
    goto value;
  case '"': {
    int esc = 0;
    if ((rc = parse_string(c, &p, s, end, &esc))) return rc;
    goto after_value;
  }
  case 't':
  case 'f':
  case 'n': {
    const char *lit = *p == 't' ? "true" : *p == 'f' ? "false" : "null";
    size_t n = strlen(lit);
    if ((size_t)(end - p) < n || memcmp(p, lit, n) != 0)
      return idem__canon_fail(c, IDEM_JSON_SYNTAX, (size_t)(p - s),
                              "invalid literal (expected %s)", lit);
    memcpy(c->out.p + c->out.len, lit, n);
    c->out.len += n;
    p += n;
    goto after_value;
  }
  default:
    if (*p == '-' || is_digit(*p)) {
      if ((rc = parse_number(c, &p, s, end))) return rc;
      goto after_value;
    }
    if (*p >= 0x80 && !utf8_len(p, end))
      return idem__canon_fail(c, IDEM_JSON_UTF8, (size_t)(p - s),
                              "invalid UTF-8 byte 0x%02x", *p);
    return idem__canon_fail(c, IDEM_JSON_SYNTAX, (size_t)(p - s),
                            "expected a JSON value, found %s",
                            show_byte(p, end, tmp));
  }

member:
  if (p >= end || *p != '"') {
    if (p == end) goto early_end;
    return idem__canon_fail(c, IDEM_JSON_SYNTAX, (size_t)(p - s),
                            "expected a member name in double quotes, found %s",
                            show_byte(p, end, tmp));
  }
  if ((rc = idem__buf_reserve(&c->out, (size_t)(end - p) + IDEM__DTOA_MAX)))
    return nomem(c, rc, p, s);
  if (c->mem_len == c->mem_cap && (rc = grow_members(c, c->mem_len + 1)))
    return nomem(c, rc, p, s);
  {
    idem__member *m = &c->mem[c->mem_len++];
    m->start = c->out.len;
    m->in_off = (size_t)(p - s);
    m->escaped = 0;
    if ((rc = parse_string(c, &p, s, end, &m->escaped))) return rc;
    { /* the name's first bytes as a number: most comparisons end there */
      const unsigned char *nm = (const unsigned char *)c->out.p + m->start + 1;
      const unsigned char *in = s + m->in_off + 1;
      size_t nl = c->out.len - m->start - 2;
      uint64_t v = 0;
#ifdef CANON_SWAR
      /* Eight bytes are always there to read in the output: the reserve
      ** above left IDEM__DTOA_MAX bytes past what the name can take.  But
      ** the output was just stored, in other pieces, and a load that spans
      ** them waits for the stores; the input holds the same bytes when it
      ** is as long (every escape that canonical form drops shrinks it).
      ** A shorter name's bytes past its end are masked. */
      if (!m->escaped && (size_t)(p - in) == nl + 1 && end - in >= 8) nm = in;
      memcpy(&v, nm, 8);
      v = __builtin_bswap64(v);
      if (nl < 8) v &= ~(~UINT64_C(0) >> 8 * nl);
#else
      size_t i;
      for (i = 0; i < 8; i++) v = v << 8 | (i < nl ? nm[i] : 0);
#endif
      m->pfx = name_key(v);
    }
    p = skip_ws(p, end);
    if (p >= end || *p != ':') {
      if (p == end) goto early_end;
      return idem__canon_fail(c, IDEM_JSON_SYNTAX, (size_t)(p - s),
                              "expected ':' after a member name, found %s",
                              show_byte(p, end, tmp));
    }
    m->colon = c->out.len;
    c->out.p[c->out.len++] = ':';
    p = skip_ws(p + 1, end);
    if (p == end) goto early_end;
    goto value;
  }

after_value:
  if (depth == 0) {
    p = skip_ws(p, end);
    if (p != end)
      return idem__canon_fail(c, IDEM_JSON_TRAILING, (size_t)(p - s),
                              "unexpected %s after the JSON text",
                              show_byte(p, end, tmp));
    return IDEM_OK;
  }
  f = &c->stack[depth - 1];
  if (f->is_object) c->mem[c->mem_len - 1].end = c->out.len;
  p = skip_ws(p, end);
  if (p == end) goto early_end;
  if (*p == ',') {
    c->out.p[c->out.len++] = ',';
    p = skip_ws(p + 1, end);
    if (f->is_object) goto member;
    if (p == end) goto early_end;
    goto value;
  }
  if (*p == (f->is_object ? '}' : ']')) {
    c->out.p[c->out.len++] = (char)*p++;
    if (f->is_object) {
      if ((rc = close_object(c, f, depth, opt))) {
        if (rc == IDEM_NOMEM || rc == IDEM_RANGE) return nomem(c, rc, p, s);
        return rc;
      }
      if (depth == 1) c->top_members = c->mem_len - f->mem_base;
      c->mem_len = f->mem_base;
    }
    depth--;
    goto after_value;
  }
  return idem__canon_fail(c, IDEM_JSON_SYNTAX, (size_t)(p - s),
                          "expected ',' or '%c', found %s",
                          f->is_object ? '}' : ']', show_byte(p, end, tmp));

early_end:
  return idem__canon_fail(
      c, IDEM_JSON_SYNTAX, len, "unexpected end of text inside %s",
      c->stack[depth - 1].is_object ? "an object" : "an array");
}

int idem__canon_run(idem_canon *c, const char *text, size_t len,
                    const idem__canon_opt *opt) {
  c->out.len = 0;
  return canon_onto(c, text, len, opt);
}

void idem__canon_simd(idem_canon *c, int on) {
#ifdef CANON_SSSE3
  __builtin_cpu_init();
  c->simd = on && __builtin_cpu_supports("ssse3");
#else
  (void)on;
#endif
}

int idem__canon_append(idem_canon *c, const char *text, size_t len,
                       idem__buf *dst) {
  idem__canon_opt opt = {0, NULL, 0, 0, 0};
  idem__buf own = c->out;
  size_t base = dst->len;
  int rc;
  opt.max_depth = c->max_depth;
  c->out = *dst;
  /* the same room for this text as in the handle's own buffer */
  c->out.cap = own.cap < SIZE_MAX - base ? base + own.cap : SIZE_MAX;
  if (c->out.cap > dst->cap) c->out.cap = dst->cap;
  rc = canon_onto(c, text, len, &opt);
  if (rc != IDEM_OK) c->out.len = base;
  c->out.cap = dst->cap;
  *dst = c->out;
  c->out = own;
  return rc;
}

/* ---- the public face ------------------------------------------------------ */

int idem_canon_open(idem_canon **out) {
  idem_canon *c;
  if (!out) return IDEM_MISUSE;
  *out = c = idem__malloc(sizeof *c);
  if (!c) return IDEM_NOMEM;
  memset(c, 0, sizeof *c);
  c->magic = IDEM__CANON_MAGIC;
  c->max_depth = IDEM_DEFAULT_MAX_DEPTH;
  c->max_bytes = IDEM_DEFAULT_MAX_BYTES;
  idem__canon_simd(c, 1);
  /* A number may grow from 4 bytes ("1e20") to 21; 8x plus slack bounds
  ** any canonical output, and payloads wrap it in a few dozen bytes. */
  idem__buf_init(&c->out, c->max_bytes * 8 + 4096);
  idem__buf_init(&c->tmp, c->max_bytes * 8 + 4096);
  idem__buf_init(&c->aux, c->max_bytes * 8 + 4096);
  return IDEM_OK;
}

void idem_canon_close(idem_canon *c) {
  if (!c || c->magic != IDEM__CANON_MAGIC) return;
  c->magic = IDEM__MAGIC_DEAD;
  if (c->state_free) c->state_free(c);
  idem__buf_free(&c->out);
  idem__buf_free(&c->tmp);
  idem__buf_free(&c->aux);
  idem__free(c->mem);
  idem__free(c->stack);
  idem__free(c);
}

int idem_canon_limit(idem_canon *c, int which, size_t value) {
  if (!c || c->magic != IDEM__CANON_MAGIC) return IDEM_MISUSE;
  switch (which) {
  case IDEM_LIMIT_DEPTH:
    if (value < 1 || value > 1000000) return IDEM_RANGE;
    c->max_depth = value;
    return IDEM_OK;
  case IDEM_LIMIT_BYTES:
    if (value < 1 || value > SIZE_MAX / 16) return IDEM_RANGE;
    c->max_bytes = value;
    c->out.cap = c->tmp.cap = c->aux.cap = value * 8 + 4096;
    return IDEM_OK;
  default: return IDEM_INVALID;
  }
}

int idem_canon_json(idem_canon *c, const char *text, size_t len,
                    const char **out, size_t *out_len) {
  idem__canon_opt opt = {0, NULL, 0, 0, 0};
  int rc;
  if (out) *out = NULL;
  if (out_len) *out_len = 0;
  if (!c || c->magic != IDEM__CANON_MAGIC || !out || !out_len || (!text && len))
    return IDEM_MISUSE;
  opt.max_depth = c->max_depth;
  rc = idem__canon_run(c, text ? text : "", len, &opt);
  if (rc != IDEM_OK) return rc;
  *out = c->out.p;
  *out_len = c->out.len;
  return IDEM_OK;
}

int idem_canon_string(idem_canon *c, const char *text, size_t len,
                      const char **out, size_t *len_out) {
  size_t bad = 0;
  int rc;
  if (out) *out = NULL;
  if (len_out) *len_out = 0;
  if (!c || c->magic != IDEM__CANON_MAGIC || !out || !len_out || (!text && len))
    return IDEM_MISUSE;
  c->err = IDEM_OK;
  c->errmsg[0] = '\0';
  c->out.len = 0;
  rc = idem__canon_string(&c->out, text ? text : "", len, &bad);
  if (rc == IDEM_JSON_UTF8)
    return idem__canon_fail(c, rc, bad, "invalid UTF-8");
  if (rc != IDEM_OK)
    return idem__canon_fail(c, rc, IDEM__NO_OFFSET, "%s", idem_strerror(rc));
  *out = c->out.p;
  *len_out = c->out.len;
  return IDEM_OK;
}

size_t idem_utf8_char(const char *p, size_t n) {
  if (!p || !n) return 0;
  if (*(const unsigned char *)p < 0x80) return 1;
  return idem__utf8_len((const unsigned char *)p, (const unsigned char *)p + n);
}

const char *idem_canon_errmsg(const idem_canon *c) {
  if (!c || c->magic != IDEM__CANON_MAGIC) return "bad idem_canon handle";
  return c->errmsg;
}

size_t idem_canon_erroffset(const idem_canon *c) {
  return c && c->magic == IDEM__CANON_MAGIC ? c->err_off : 0;
}
