/*
** test_canon.c - unit tests of the canonicalizer and key API: misuse,
** limits, hostile sizes, UTF-16 member order, keys, and failing allocations.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "canon.h" /* idem__canon_simd */
#include "check.h"
#include "idem.h"

static idem_canon *open_canon(void) {
  idem_canon *c = NULL;
  CHECK_INT(idem_canon_open(&c), IDEM_OK);
  return c;
}

static void test_misuse(void) {
  const char *out = "x";
  size_t n = 9;
  idem_key k;
  idem_call call = {sizeof call, "s", "c", "t", "{}", 2, NULL, 0};
  CHECK_INT(idem_canon_open(NULL), IDEM_MISUSE);
  CHECK_INT(idem_canon_json(NULL, "1", 1, &out, &n), IDEM_MISUSE);
  CHECK(out == NULL && n == 0);
  CHECK_INT(idem_canon_limit(NULL, IDEM_LIMIT_DEPTH, 5), IDEM_MISUSE);
  CHECK_INT(idem_key_mint(NULL, &call, NULL, &k), IDEM_MISUSE);
  CHECK(idem_canon_errmsg(NULL) != NULL);
  CHECK_INT(idem_canon_erroffset(NULL), 0);
  idem_canon_close(NULL);
  CHECK_STR(idem_status_name(IDEM_JSON_DUPLICATE), "duplicate");
  CHECK_STR(idem_strerror(IDEM_OK), "not an error");
  CHECK_STR(idem_status_name(9999), "unknown");
  CHECK_STR(idem_version(), IDEM_VERSION_STRING);
  CHECK_INT(idem_version_number(), IDEM_VERSION_NUMBER);
}

static void test_limits(void) {
  idem_canon *c = open_canon();
  const char *out;
  size_t n;
  CHECK_INT(idem_canon_limit(c, IDEM_LIMIT_DEPTH, 0), IDEM_RANGE);
  CHECK_INT(idem_canon_limit(c, IDEM_LIMIT_BYTES, 0), IDEM_RANGE);
  CHECK_INT(idem_canon_limit(c, 77, 5), IDEM_INVALID);
  CHECK_INT(idem_canon_limit(c, IDEM_LIMIT_DEPTH, 3), IDEM_OK);
  CHECK_INT(idem_canon_json(c, "[[[1]]]", 7, &out, &n), IDEM_OK);
  CHECK_INT(idem_canon_json(c, "[[[{}]]]", 8, &out, &n), IDEM_JSON_DEPTH);
  CHECK_INT(idem_canon_erroffset(c), 3);
  CHECK(strstr(idem_canon_errmsg(c), "deeper than 3") != NULL);
  CHECK_INT(idem_canon_limit(c, IDEM_LIMIT_BYTES, 10), IDEM_OK);
  CHECK_INT(idem_canon_json(c, "[1,2,3,4,5]", 11, &out, &n), IDEM_JSON_TOOBIG);
  CHECK_INT(idem_canon_erroffset(c), 10);
  CHECK_INT(idem_canon_json(c, "[1,2,3,45]", 10, &out, &n), IDEM_OK);
  CHECK_MEM(out, n, "[1,2,3,45]");
  CHECK_STR(idem_canon_errmsg(c), "");
  idem_canon_close(c);
}

/* 100,000-deep nesting: refused at the default limit, and - the explicit
** stack, not recursion, holds it - accepted when the limit allows it. */
static void test_deep(void) {
  idem_canon *c = open_canon();
  size_t depth = 100000, n, i;
  char *text = malloc(2 * depth);
  const char *out;
  for (i = 0; i < depth; i++) {
    text[i] = '[';
    text[2 * depth - 1 - i] = ']';
  }
  CHECK_INT(idem_canon_json(c, text, 2 * depth, &out, &n), IDEM_JSON_DEPTH);
  CHECK_INT(idem_canon_erroffset(c), 128);
  CHECK_INT(idem_canon_limit(c, IDEM_LIMIT_DEPTH, depth), IDEM_OK);
  CHECK_INT(idem_canon_json(c, text, 2 * depth, &out, &n), IDEM_OK);
  CHECK(n == 2 * depth && memcmp(out, text, n) == 0);
  /* objects too: {"a":{"a":...1...}} */
  free(text);
  text = malloc(6 * depth + 1);
  for (i = 0; i < depth; i++) {
    memcpy(text + 5 * i, "{\"a\":", 5);
    text[5 * depth + 1 + i] = '}';
  }
  text[5 * depth] = '1';
  CHECK_INT(idem_canon_json(c, text, 6 * depth + 1, &out, &n), IDEM_OK);
  CHECK(n == 6 * depth + 1 && memcmp(out, text, n) == 0);
  free(text);
  idem_canon_close(c);
}

/* A 2 MiB text is refused by default and accepted with a larger limit. */
static void test_big(void) {
  idem_canon *c = open_canon();
  size_t len = 2u << 20, i, n;
  char *text = malloc(len);
  const char *out;
  text[0] = '[';
  for (i = 1; i + 1 < len; i += 2) {
    text[i] = '7';
    text[i + 1] = ',';
  }
  text[len - 1] = ']';
  if (text[len - 2] == ',') text[len - 2] = '7';
  CHECK_INT(idem_canon_json(c, text, len, &out, &n), IDEM_JSON_TOOBIG);
  CHECK_INT(idem_canon_erroffset(c), 1u << 20);
  CHECK_INT(idem_canon_limit(c, IDEM_LIMIT_BYTES, 4u << 20), IDEM_OK);
  CHECK_INT(idem_canon_json(c, text, len, &out, &n), IDEM_OK);
  CHECK(n == len && memcmp(out, text, len) == 0);
  free(text);
  idem_canon_close(c);
}

/* ---- member order by UTF-16 code units, against a reference ------------- */

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint64_t next_rand(void) {
  uint64_t z = (rng += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

typedef struct name {
  uint32_t cp[6];
  int n;
} name;

static uint32_t random_cp(void) {
  static const uint32_t lo[] = {0x20,   0x7f,    0x400,   0xd7f0,  0xe000,
                                0xfff0, 0x10000, 0x1f600, 0x10fff0};
  static const uint32_t span[] = {0x5f, 0x100, 0x100, 0x10, 0x100,
                                  0x0e, 0x100, 0x50,  0x10};
  int k = (int)(next_rand() % 9);
  uint32_t cp = lo[k] + (uint32_t)(next_rand() % span[k]);
  if (cp == '"' || cp == '\\') cp = 'q';
  return cp;
}

/* UTF-16 code units of a name, for the reference order. */
static int utf16(const name *a, uint16_t *u) {
  int i, n = 0;
  for (i = 0; i < a->n; i++) {
    uint32_t cp = a->cp[i];
    if (cp >= 0x10000) {
      u[n++] = (uint16_t)(0xD800 + ((cp - 0x10000) >> 10));
      u[n++] = (uint16_t)(0xDC00 + ((cp - 0x10000) & 0x3FF));
    } else
      u[n++] = (uint16_t)cp;
  }
  return n;
}

static int ref_cmp(const void *x, const void *y) {
  uint16_t a[12], b[12];
  int na = utf16(x, a), nb = utf16(y, b), i;
  for (i = 0; i < na && i < nb; i++)
    if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
  return na - nb;
}

static size_t put_utf8(char *w, uint32_t cp) {
  if (cp < 0x80) {
    w[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    w[0] = (char)(0xC0 | cp >> 6);
    w[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    w[0] = (char)(0xE0 | cp >> 12);
    w[1] = (char)(0x80 | (cp >> 6 & 0x3F));
    w[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  w[0] = (char)(0xF0 | cp >> 18);
  w[1] = (char)(0x80 | (cp >> 12 & 0x3F));
  w[2] = (char)(0x80 | (cp >> 6 & 0x3F));
  w[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

static size_t put_name(char *w, const name *a) {
  size_t k = 0;
  int i;
  w[k++] = '"';
  for (i = 0; i < a->n; i++) k += put_utf8(w + k, a->cp[i]);
  w[k++] = '"';
  return k;
}

static void test_utf16_order(void) {
  idem_canon *c = open_canon();
  enum { N = 40, ROUNDS = 300 };
  name names[N];
  char in[N * 40], exp[N * 40];
  int r, i, j, bad = 0;
  for (r = 0; r < ROUNDS; r++) {
    size_t ni = 0, ne = 0, n;
    const char *out;
    for (i = 0; i < N; i++) {
      do {
        names[i].n = 1 + (int)(next_rand() % 3);
        for (j = 0; j < names[i].n; j++) names[i].cp[j] = random_cp();
        for (j = 0; j < i; j++)
          if (ref_cmp(&names[i], &names[j]) == 0) break;
      } while (j < i); /* unique names */
    }
    in[ni++] = '{';
    for (i = 0; i < N; i++) {
      if (i) in[ni++] = ',';
      ni += put_name(in + ni, &names[i]);
      ni += (size_t)snprintf(in + ni, 16, ":%d", i);
    }
    in[ni++] = '}';
    qsort(names, N, sizeof names[0], ref_cmp);
    /* the expected text: names in reference order, each with its value */
    exp[ne++] = '{';
    for (i = 0; i < N; i++) {
      char key[40];
      size_t kl = put_name(key, &names[i]);
      const char *at = in;
      if (i) exp[ne++] = ',';
      memcpy(exp + ne, key, kl);
      ne += kl;
      /* find this name's value in the input */
      while ((at = strstr(at, "\"")) != NULL) {
        if (memcmp(at, key, kl) == 0 && at[kl] == ':') break;
        at++;
      }
      if (!at) {
        bad++;
        break;
      }
      at += kl;
      while (*at != ',' && *at != '}') exp[ne++] = *at++;
    }
    exp[ne++] = '}';
    if (idem_canon_json(c, in, ni, &out, &n) != IDEM_OK || n != ne ||
        memcmp(out, exp, n) != 0) {
      if (!bad)
        fprintf(stderr, "utf16 order:\n in:  %.*s\n got: %.*s\n exp: %.*s\n",
                (int)ni, in, (int)n, out ? out : "", (int)ne, exp);
      bad++;
    }
  }
  CHECK_INT(bad, 0);
  idem_canon_close(c);
}

/* ---- strings sixteen bytes at a time against byte by byte ---------------- */

/* Pieces of string content: valid characters of every length at the edges
** of Table 3-7, escapes, and each kind of invalid UTF-8. */
static const char *const good_piece[] = {
    "a", "Zq", " ", "0123456789", "plain text ", "\xc3\xa9", "\xce\xa9",
    "\xc2\x80", "\xdf\xbf", "\xe2\x82\xac", "\xe4\xb8\xad", "\xe0\xa0\x80",
    "\xed\x9f\xbf", "\xee\x80\x80", "\xef\xbf\xbf", "\xf0\x90\x80\x80",
    "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf", "caf\xc3\xa9 d\xc3\xa9j\xc3\xa0 ",
    "\\n", "\\\"", "\\\\", "\\/", "\\u00e9", "\\u001f", "\\ud83d\\ude00"};
static const char *const bad_piece[] = {
    "\xc0\x80", "\xc1\xbf", "\xe0\x80\x80", "\xe0\x9f\xbf", "\xed\xa0\x80",
    "\xed\xbf\xbf", "\xf0\x80\x80\x80", "\xf0\x8f\xbf\xbf",
    "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xff", "\xfe", "\x80", "\xbf",
    "\xc3", "\xe2\x82", "\xf0\x9f\x98", "\x01", "\x1f", "\\x", "\\u12"};

static void test_simd_strings(void) {
  idem_canon *v = open_canon(), *b = open_canon();
  enum { ROUNDS = 60000 };
  static const char *const wrap[3][2] = {
      {"\"", "\""},
      {"[\"", "\",\"0123456789abcdef0123\"]"},
      {"{\"", "\":1,\"pad\":\"................\"}"}};
  char body[400], text[480];
  int r, diff = 0, ok = 0, bad = 0;
  idem__canon_simd(v, 1);
  idem__canon_simd(b, 0);
  for (r = 0; r < ROUNDS; r++) {
    size_t n = 0, tn;
    int pieces = (int)(next_rand() % 40), i, w = r % 3;
    const char *ov, *ob;
    size_t lv = 0, lb = 0;
    int rv, rb;
    for (i = 0; i < pieces; i++) {
      const char *pc = next_rand() % 64 == 0
                           ? bad_piece[next_rand() % (sizeof bad_piece /
                                                      sizeof *bad_piece)]
                           : good_piece[next_rand() % (sizeof good_piece /
                                                       sizeof *good_piece)];
      size_t pl = strlen(pc);
      if (n + pl >= sizeof body) break;
      memcpy(body + n, pc, pl);
      n += pl;
    }
    tn = (size_t)snprintf(text, sizeof text, "%s%.*s%s", wrap[w][0], (int)n,
                          body, wrap[w][1]);
    rv = idem_canon_json(v, text, tn, &ov, &lv);
    rb = idem_canon_json(b, text, tn, &ob, &lb);
    if (rb == IDEM_OK) ok++;
    else bad++;
    if (rv != rb || (rv == IDEM_OK && (lv != lb || memcmp(ov, ob, lv) != 0)) ||
        (rv != IDEM_OK &&
         (idem_canon_erroffset(v) != idem_canon_erroffset(b) ||
          strcmp(idem_canon_errmsg(v), idem_canon_errmsg(b)) != 0))) {
      if (diff++ < 5)
        fprintf(stderr, "simd %d / bytes %d on %s: %s / %s\n", rv, rb, text,
                idem_canon_errmsg(v), idem_canon_errmsg(b));
    }
  }
  CHECK_INT(diff, 0);
  /* both outcomes are common, or the comparison says little */
  CHECK(ok > ROUNDS / 4 && bad > ROUNDS / 10);
  idem_canon_close(v);
  idem_canon_close(b);
}

/* ---- keys ----------------------------------------------------------------- */

static void test_keys(void) {
  idem_canon *c = open_canon();
  idem_key k;
  idem_keyspec spec = {sizeof spec, NULL, 0};
  idem_call call = {sizeof call,
                    "sess_1",
                    "toolu_7",
                    "refund_payment",
                    "{\"order_id\":\"ord_1\",\"amount_cents\":6000}",
                    0,
                    NULL, 0};
  char long_id[300];
  call.args_len = strlen(call.args);

  /* the reference snippet of SPEC §3 gives this key for this call */
  CHECK_INT(idem_key_mint(c, &call, NULL, &k), IDEM_OK);
  CHECK_MEM(k.key, k.key_len, "sess_1:toolu_7:a280fb850f483293");
  CHECK_STR(k.fingerprint, "a280fb850f483293e8592049eb6e72df"
                           "f3f80a29ead05e3e560a1aecd6ece61a");
  CHECK_MEM(k.payload, k.payload_len,
            "{\"args\":{\"amount_cents\":6000,\"order_id\":\"ord_1\"},"
            "\"tool\":\"refund_payment\"}");
  CHECK_MEM(k.args, k.args_len,
            "{\"amount_cents\":6000,\"order_id\":\"ord_1\"}");
  CHECK(k.key[k.key_len] == '\0' && k.payload[k.payload_len] == '\0');

  /* 6000.0, another order and whitespace: the same action */
  call.args = " { \"amount_cents\" : 6000.0 , \"order_id\" : \"ord_1\" } ";
  call.args_len = strlen(call.args);
  CHECK_INT(idem_key_mint(c, &call, NULL, &k), IDEM_OK);
  CHECK_MEM(k.key, k.key_len, "sess_1:toolu_7:a280fb850f483293");

  /* key_arg: the member is removed before fingerprinting */
  spec.key_arg = "idempotency_key";
  call.args = "{\"idempotency_key\":\"model-made\",\"order_id\":\"ord_1\","
              "\"amount_cents\":6000}";
  call.args_len = strlen(call.args);
  CHECK_INT(idem_key_mint(c, &call, &spec, &k), IDEM_OK);
  CHECK_MEM(k.key, k.key_len, "sess_1:toolu_7:a280fb850f483293");
  /* ... only at the top level */
  call.args = "{\"x\":{\"idempotency_key\":1},\"order_id\":\"ord_1\","
              "\"amount_cents\":6000}";
  call.args_len = strlen(call.args);
  CHECK_INT(idem_key_mint(c, &call, &spec, &k), IDEM_OK);
  CHECK_MEM(k.args, k.args_len,
            "{\"amount_cents\":6000,\"order_id\":\"ord_1\",\"x\":{"
            "\"idempotency_key\":1}}");
  spec.key_arg = NULL;

  /* percent-encoding of ids */
  call.session = "a b/\xc3\xbc";
  call.call_id = "call_~.-_Z9";
  call.args = "{}";
  call.args_len = 2;
  CHECK_INT(idem_key_mint(c, &call, NULL, &k), IDEM_OK);
  CHECK(k.key_len > 24 &&
        memcmp(k.key, "a%20b%2F%C3%BC:call_~.-_Z9:", 27) == 0);

  /* the h: form past key_max_len */
  memset(long_id, 'x', 250);
  long_id[250] = '\0';
  call.session = long_id;
  CHECK_INT(idem_key_mint(c, &call, NULL, &k), IDEM_OK);
  CHECK_INT(k.key_len, 66);
  CHECK(memcmp(k.key, "h:", 2) == 0);
  spec.key_max_len = 1000;
  CHECK_INT(idem_key_mint(c, &call, &spec, &k), IDEM_OK);
  CHECK(k.key_len > 255 && k.key[0] == 'x');
  spec.key_max_len = 65;
  CHECK_INT(idem_key_mint(c, &call, &spec, &k), IDEM_RANGE);
  spec.key_max_len = 0;
  call.session = "s";

  /* bad calls: nothing minted, a message that says why */
  call.args = " [1]";
  call.args_len = 4;
  CHECK_INT(idem_key_mint(c, &call, NULL, &k), IDEM_NOT_OBJECT);
  CHECK_INT(idem_canon_erroffset(c), 1);
  CHECK(strstr(idem_canon_errmsg(c), "not an array") != NULL);
  CHECK(k.key == NULL);
  call.args = "{\"a\":1,\"a\":2}";
  call.args_len = strlen(call.args);
  CHECK_INT(idem_key_mint(c, &call, NULL, &k), IDEM_JSON_DUPLICATE);
  call.args = "{}";
  call.args_len = 2;
  call.session = "";
  CHECK_INT(idem_key_mint(c, &call, NULL, &k), IDEM_INVALID);
  call.session = "s";
  call.tool = "bad\xff";
  CHECK_INT(idem_key_mint(c, &call, NULL, &k), IDEM_INVALID);
  CHECK(strstr(idem_canon_errmsg(c), "UTF-8") != NULL);
  call.tool = "say \"hi\"";
  CHECK_INT(idem_key_mint(c, &call, NULL, &k), IDEM_OK);
  CHECK_MEM(k.payload, k.payload_len,
            "{\"args\":{},\"tool\":\"say \\\"hi\\\"\"}");
  idem_canon_close(c);
}

static void test_key_json(void) {
  idem_canon *c = open_canon();
  idem_key k;
  idem_keyspec spec = {sizeof spec, "idempotency_key", 0};
  const char *line = "{\"tool\":\"refund_payment\",\"session\":\"sess_1\","
                     "\"args\":{\"order_id\":\"ord_1\",\"amount_cents\":6000,"
                     "\"idempotency_key\":\"x\"},\"call\":\"toolu_7\"}";
  CHECK_INT(idem_key_mint_json(c, line, strlen(line), &spec, &k), IDEM_OK);
  CHECK_MEM(k.key, k.key_len, "sess_1:toolu_7:a280fb850f483293");
  line = "{\"tool\":\"t\",\"session\":\"s\",\"call\":\"c\"}";
  CHECK_INT(idem_key_mint_json(c, line, strlen(line), NULL, &k), IDEM_INVALID);
  CHECK(strstr(idem_canon_errmsg(c), "\"args\"") != NULL);
  line =
      "{\"tool\":\"t\",\"session\":\"s\",\"call\":\"c\",\"args\":{},\"x\":1}";
  CHECK_INT(idem_key_mint_json(c, line, strlen(line), NULL, &k), IDEM_INVALID);
  CHECK_INT(idem_canon_erroffset(c), 47);
  line = "{\"tool\":\"t\",\"session\":5,\"call\":\"c\",\"args\":{}}";
  CHECK_INT(idem_key_mint_json(c, line, strlen(line), NULL, &k), IDEM_INVALID);
  line =
      "{\"tool\":\"t\",\"session\":\"a\\u0000b\",\"call\":\"c\",\"args\":{}}";
  CHECK_INT(idem_key_mint_json(c, line, strlen(line), NULL, &k), IDEM_INVALID);
  line = "{\"tool\":\"t\",\"session\":\"s\\n\",\"call\":\"c\",\"args\":{}}";
  CHECK_INT(idem_key_mint_json(c, line, strlen(line), NULL, &k), IDEM_OK);
  CHECK(k.key_len > 4 && memcmp(k.key, "s%0A:c:", 7) == 0);
  line = "[1]";
  CHECK_INT(idem_key_mint_json(c, line, strlen(line), NULL, &k), IDEM_INVALID);
  { /* the call object is not reordered, yet a repeated member is refused
    ** exactly as canonicalizing it would: the same code, the same first
    ** second occurrence */
    static const char *const dups[] = {
        "{\"session\":\"s\",\"call\":\"c\",\"tool\":\"t\",\"args\":{},"
        "\"call\":\"d\"}",
        "{\"tool\":\"t\",\"session\":\"s\",\"tool\":\"u\",\"call\":\"c\","
        "\"args\":{},\"session\":\"x\"}",
        "{\"args\":{},\"args\":{},\"args\":{},\"session\":\"s\",\"call\":"
        "\"c\",\"tool\":\"t\"}",
        "{\"session\":\"s\",\"call\":\"c\",\"tool\":\"t\",\"args\":{\"a\":1,"
        "\"a\":2}}"};
    idem_canon *c2 = open_canon();
    const char *out;
    size_t n, i;
    for (i = 0; i < sizeof dups / sizeof *dups; i++) {
      CHECK_INT(idem_key_mint_json(c, dups[i], strlen(dups[i]), NULL, &k),
                IDEM_JSON_DUPLICATE);
      CHECK_INT(idem_canon_json(c2, dups[i], strlen(dups[i]), &out, &n),
                IDEM_JSON_DUPLICATE);
      CHECK_INT(idem_canon_erroffset(c), idem_canon_erroffset(c2));
      CHECK_STR(idem_canon_errmsg(c), idem_canon_errmsg(c2));
    }
    idem_canon_close(c2);
  }
  idem_canon_close(c);
}

/* ---- failing allocations -------------------------------------------------- */

static long alloc_budget = -1; /* allocations left before failing; -1: none */
static long alloc_live;

static void *chaos_malloc(size_t n) {
  void *p;
  if (alloc_budget == 0) return NULL;
  if (alloc_budget > 0) alloc_budget--;
  p = malloc(n);
  if (p) alloc_live++;
  return p;
}
static void *chaos_realloc(void *p, size_t n) {
  void *q;
  if (alloc_budget == 0) return NULL;
  if (alloc_budget > 0) alloc_budget--;
  q = realloc(p, n);
  if (q && !p) alloc_live++;
  return q;
}
static void chaos_free(void *p) {
  if (p) alloc_live--;
  free(p);
}

/* Fail the 1st, 2nd, ... allocation of a whole workload until it passes:
** each failure must be IDEM_NOMEM (never a crash), and nothing may leak. */
static void test_alloc_failures(void) {
  long n;
  int done = 0;
  char big[4000];
  size_t i, len = 0;
  big[len++] = '{';
  for (i = 0; i < 200; i++) /* reverse order forces the sort path */
    len += (size_t)snprintf(big + len, sizeof big - len, "%s\"k%03zu\":%s",
                            i ? "," : "", 199 - i,
                            i % 2 ? "1.5e-300" : "[\"\\u00e9\"]");
  big[len++] = '}';
  idem_set_alloc_funcs(chaos_malloc, chaos_realloc, chaos_free);
  for (n = 0; n < 1000 && !done; n++) {
    idem_canon *c = NULL;
    const char *out;
    size_t olen;
    idem_key k;
    idem_call call = {sizeof call, "s", "c", "t", big, len, NULL, 0};
    int rc;
    alloc_budget = n;
    alloc_live = 0;
    rc = idem_canon_open(&c);
    if (rc == IDEM_OK) rc = idem_canon_json(c, big, len, &out, &olen);
    if (rc == IDEM_OK) rc = idem_key_mint(c, &call, NULL, &k);
    if (rc == IDEM_OK)
      done = 1;
    else if (rc != IDEM_NOMEM) {
      fprintf(stderr, "allocation %ld failed with %s: %s\n", n,
              idem_status_name(rc), idem_canon_errmsg(c));
      check_failed++;
    }
    idem_canon_close(c);
    if (alloc_live != 0) {
      fprintf(stderr, "allocation %ld: %ld blocks leaked\n", n, alloc_live);
      check_failed++;
    }
  }
  idem_set_alloc_funcs(NULL, NULL, NULL);
  alloc_budget = -1;
  CHECK(done);
  CHECK(n > 3); /* the workload did allocate several times */
}

int main(void) {
  test_misuse();
  test_limits();
  test_deep();
  test_big();
  test_utf16_order();
  test_simd_strings();
  test_keys();
  test_key_json();
  test_alloc_failures();
  return check_done();
}
