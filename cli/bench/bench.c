/*
** bench.c - `idem bench`: the benchmarks of SPEC §12, side by side with
** their peers, in one run on one machine.
**
** Figures (one JSON object per line on stdout):
**
**   machine      nproc, CPU model and the versions of the peers used.
**   key_lines    100,000 typical refund calls as JSON lines, minted by
**                `idem key --lines` and by python3 running json.loads and
**                the reference snippet of SPEC §3.  Target: 20x.
**   canon_lines  tens of MB of mixed JSON documents, one per line,
**                canonicalized by `idem canon --lines` and by node running
**                the npm package `canonicalize`.  Target: 25x.
**   dtoa         ns per number of the internal shortest round-trip
**                formatter against snprintf("%.17g"), in process.
**
** Both sides of a figure read the same generated file and write their
** output to files, which must be byte-identical: a figure whose outputs
** differ is an error (exit 1), because a fast wrong answer proves nothing.
** The command side runs the very binary that is benchmarking
** (/proc/self/exe) as a child, so process start-up is paid by both sides.
** Each side runs three times and the best wall-clock time counts.
**
** Inputs come from a fixed-seed PRNG, so every run measures the same bytes.
** They hold only what both sides must agree on: printable-ASCII keys and
** integers below 2^53 for the key figure (SPEC §3's compatibility
** property); for canon also floats, non-ASCII text, escapes and unsorted
** keys, but nothing that either side is allowed to reject.
**
** A peer that is not installed (python3, node, the npm package) makes its
** figure "skipped" with the reason; that is not a failure.  The inputs
** live in --dir DIR (kept) or a fresh directory under $TMPDIR (removed).
*/
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* The library's formatter (src/idemInt.h): not API, but the command links
** libidem statically, so the dtoa figure can call it directly. */
size_t idem__dtoa(double v, char *buf);

#define BEST_OF 5
#define DTOA_BUF 48 /* more than the formatter's 32 and %.17g's 25 */
#define KEY_TARGET 20
#define CANON_TARGET 25

/* ---- a seeded PRNG (splitmix64) ------------------------------------------ */

typedef struct rng {
  uint64_t s;
} rng;

static uint64_t rng_next(rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

/* Uniform in [0, n). */
static unsigned rng_below(rng *r, unsigned n) {
  return (unsigned)(((rng_next(r) >> 32) * (uint64_t)n) >> 32);
}

static double rng_unit(rng *r) {
  return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static double from_bits(uint64_t b) {
  double d;
  memcpy(&d, &b, sizeof d);
  return d;
}

/* ---- writing the inputs ---------------------------------------------------- */

/* A generator: the file being written, the bytes so far, the PRNG. */
typedef struct gen {
  FILE *f;
  size_t n;
  rng r;
} gen;

static void g_puts(gen *g, const char *s) {
  size_t len = strlen(s);
  fwrite(s, 1, len, g->f);
  g->n += len;
}

static void g_printf(gen *g, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void g_printf(gen *g, const char *fmt, ...) {
  va_list ap;
  int k;
  va_start(ap, fmt);
  k = vfprintf(g->f, fmt, ap);
  va_end(ap);
  if (k > 0) g->n += (size_t)k;
}

static const char *pick(gen *g, const char *const *list, size_t n) {
  return list[rng_below(&g->r, (unsigned)n)];
}
#define PICK(g, list) pick((g), (list), sizeof(list) / sizeof((list)[0]))

/* A JSON string of printable ASCII: only '"' and '\' need escaping, and
** both sides escape them the same way. */
static void g_ascii_str(gen *g, const char *s) {
  fputc('"', g->f);
  g->n++;
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') {
      fputc('\\', g->f);
      g->n++;
    }
    fputc(*s, g->f);
    g->n++;
  }
  fputc('"', g->f);
  g->n++;
}

static void g_id(gen *g, const char *prefix, unsigned len) {
  static const char alnum[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  char b[64];
  unsigned i;
  if (len >= sizeof b) len = sizeof b - 1;
  for (i = 0; i < len; i++)
    b[i] = alnum[rng_below(&g->r, (unsigned)(sizeof alnum - 1))];
  b[len] = '\0';
  g_printf(g, "%s%s", prefix, b);
}

/* Append s to the NUL-terminated text in b (capacity cap); never overflows. */
static size_t append(char *b, size_t cap, size_t n, const char *s) {
  size_t len = strlen(s);
  if (n + len >= cap) len = n + 1 < cap ? cap - n - 1 : 0;
  memcpy(b + n, s, len);
  b[n + len] = '\0';
  return n + len;
}

static const char *const first_names[] = {
    "Alice", "Bruno", "Chloe", "Dmitri", "Emma",  "Farid", "Grace", "Hugo",
    "Ines",  "Jamal", "Kenji", "Laura",  "Mateo", "Nina",  "Omar",  "Priya"};
static const char *const last_names[] = {
    "Martin",   "Okafor", "Nguyen", "Schmidt", "Garcia", "OBrien", "Rossi",
    "Kowalski", "Tanaka", "Silva",  "Dubois",  "Haddad", "Larsen", "Patel"};
static const char *const words[] = {
    "item",     "arrived", "damaged",  "late",    "customer",  "requested",
    "refund",   "for",     "order",    "the",     "package",   "was",
    "missing",  "wrong",   "size",     "color",   "duplicate", "charge",
    "billing",  "error",   "goodwill", "gesture", "after",     "delay",
    "courier",  "lost",    "in",       "transit", "partial",   "return",
    "approved", "by",      "support",  "agent",   "per",       "policy"};
static const char *const currencies[] = {"usd", "eur", "gbp", "jpy", "cad"};
static const char *const channels[] = {"chat", "email", "phone", "api"};
static const char *const locales[] = {"en-US", "fr-FR", "de-DE", "ja-JP",
                                      "pt-BR"};

/* A few words of printable ASCII, sometimes with quotes and backslashes. */
static void g_reason(gen *g) {
  char b[256];
  size_t n = 0;
  unsigned i, k = 3 + rng_below(&g->r, 6);
  b[0] = '\0';
  for (i = 0; i < k; i++) {
    if (i) n = append(b, sizeof b, n, " ");
    n = append(b, sizeof b, n, PICK(g, words));
  }
  if (rng_below(&g->r, 5) == 0)
    n = append(b, sizeof b, n, " (customer wrote: \"never got it!\")");
  if (rng_below(&g->r, 10) == 0)
    n = append(b, sizeof b, n, " see C:\\refunds\\queue & {50%} ~ok?");
  g_ascii_str(g, b);
}

/* The arguments of a typical refund_payment call. */
static void g_refund_args(gen *g) {
  unsigned i, nitems = 2 + rng_below(&g->r, 2);
  const char *fn = PICK(g, first_names), *ln = PICK(g, last_names);
  g_printf(g,
           "{\"order_id\":\"ord_%08u\",\"amount_cents\":%u,\"currency\":\"%s\","
           "\"reason\":",
           rng_below(&g->r, 100000000), 50 + rng_below(&g->r, 500000),
           PICK(g, currencies));
  g_reason(g);
  g_printf(
      g, ",\"customer\":{\"email\":\"%s.%s%u@example.com\",\"name\":\"%s %s\"}",
      fn, ln, rng_below(&g->r, 1000), fn, ln);
  g_printf(g,
           ",\"metadata\":{\"channel\":\"%s\",\"agent\":\"support-bot/%u.%u\","
           "\"ticket\":\"T-%u\",\"locale\":\"%s\"},\"items\":[",
           PICK(g, channels), rng_below(&g->r, 4), rng_below(&g->r, 20),
           rng_below(&g->r, 10000000), PICK(g, locales));
  for (i = 0; i < nitems; i++)
    g_printf(g, "%s{\"sku\":\"SKU-%05u\",\"qty\":%u,\"price\":%u}",
             i ? "," : "", rng_below(&g->r, 100000), 1 + rng_below(&g->r, 5),
             99 + rng_below(&g->r, 100000));
  g_puts(g, "]");
  switch (rng_below(&g->r, 4)) {
  case 0: g_puts(g, ",\"notify_customer\":true"); break;
  case 1: g_puts(g, ",\"notify_customer\":false,\"note\":null"); break;
  default: break;
  }
  g_puts(g, "}");
}

static void g_refund_call(gen *g, unsigned long n) {
  rng ses = {0x5e55u + n / 16}; /* sixteen calls per session */
  g_puts(g, "{\"session\":\"sess_");
  g_printf(g, "%012llx", (unsigned long long)(rng_next(&ses) >> 16));
  g_id(g, "\",\"call\":\"toolu_01", 22);
  g_puts(g, "\",\"tool\":\"refund_payment\",\"args\":");
  g_refund_args(g);
  g_puts(g, "}\n");
}

/* A double in one of the literal forms JSON senders use.  An integer
** literal beyond 2^53 is refused by idem by design (SPEC §4), so such
** values are written with an exponent. */
static void g_double(gen *g, double v) {
  char b[48];
  unsigned style = rng_below(&g->r, 5);
  if (style == 0)
    snprintf(b, sizeof b, "%.17e", v);
  else if (style == 1 && v > -1e15 && v < 1e15 && v == (double)(long long)v)
    snprintf(b, sizeof b, "%.1f", v); /* 6000.0 */
  else {
    snprintf(b, sizeof b, "%.17g", v);
    if (!strpbrk(b, ".e") &&
        (v >= 9007199254740992.0 || v <= -9007199254740992.0))
      snprintf(b, sizeof b, "%.17e", v);
  }
  g_puts(g, b);
}

static double rand_double(gen *g) {
  /* clang-format off */
  static const double edge[] = {
      1e21,                    /* the first in exponent form     */
      9.999999999999999e20,    /* the last in plain digits        */
      1e-6, 1e-7, 5e-7,        /* plain / exponent switch below 1 */
      4.9406564584124654e-324, /* the smallest subnormal          */
      2.2250738585072014e-308, /* the smallest normal             */
      1.7976931348623157e308,  /* the largest double              */
      9007199254740992.0,      /* 2^53                            */
      1.2345678901234567e20,   /* long plain digits               */
      0.1, 0.30000000000000004, 333333333.33333331, 1e23, -1.5e-9,
      -0.0, 6000.0};
  /* clang-format on */
  uint64_t b;
  switch (rng_below(&g->r, 6)) {
  case 0: return (rng_unit(&g->r) * 2 - 1) * 1e6;
  case 1: /* any finite bit pattern, subnormals included */
    do b = rng_next(&g->r);
    while (((b >> 52) & 0x7ff) == 0x7ff);
    return from_bits(b);
  case 2: /* around 1e-21 .. 1e21, where the notation switches */
    b = rng_next(&g->r);
    return from_bits((b & 0x800fffffffffffffu) |
                     ((uint64_t)(1023 - 75 + rng_below(&g->r, 150)) << 52));
  case 3: return (double)rng_below(&g->r, 1000000) / 100.0;
  case 4: return (double)rng_below(&g->r, 100000000);
  default:
    return edge[rng_below(&g->r, (unsigned)(sizeof edge / sizeof edge[0]))];
  }
}

static void g_float_doc(gen *g) {
  unsigned i, n = 20 + rng_below(&g->r, 60);
  g_printf(g, "{\"sensor\":\"s-%u\",\"readings\":[", rng_below(&g->r, 1000));
  for (i = 0; i < n; i++) {
    if (i) g_puts(g, ",");
    g_double(g, rand_double(g));
  }
  g_puts(g, "],\"summary\":{\"max\":");
  g_double(g, rand_double(g));
  g_puts(g, ",\"min\":");
  g_double(g, rand_double(g));
  g_puts(g, ",\"mean\":");
  g_double(g, rand_double(g));
  g_puts(g, "},\"scale\":");
  g_double(g, rand_double(g));
  g_puts(g, "}\n");
}

/* String contents, already escaped as JSON: raw UTF-8 and escapes. */
static const char *const texts[] = {
    "Remboursement accordé à la cliente ; colis jamais arrivé, déjà signalé.",
    "Ça coûte 12,50 € — voilà, c'est réglé. Où est l'œuvre ?",
    "退款已处理，请查收。订单号：二〇二四。",
    "返金処理が完了しました。ご確認ください。",
    "환불이 완료되었습니다. 감사합니다.",
    ("Thanks! 👍🎉💸 family 👨‍👩‍👧 flag 🇫🇷 math "
     "𝔸𝔹"),
    "line1\\nline2\\ttab \\\"quoted\\\" back\\\\slash \\/ slash",
    "\\u00e9t\\u00e9 \\ud83d\\ude00 \\u0001\\u001f \\b\\f\\r \\u00E9",
    "separators \\u2028 and \\u2029, DEL \\u007f, raw \u2028 too",
    "caf\\u00e9 na\\u00efve \\uD834\\uDD1E \\uFB01le \\uffff end",
    "Ελληνικά, русский, עברית, العربية, हिन्दी",
    "plain ASCII with {braces} [brackets] and 100% \\\"quotes\\\""};

/* Member names, some of which order differently by UTF-16 code units and
** by bytes (U+FB01 and U+FF46 come before an emoji in UTF-8, after it in
** UTF-16), some escaped.  All distinct after unescaping. */
static const char *const uni_names[] = {"é",
                                        "ﬁle",
                                        "😀",
                                        "z",
                                        "Ä",
                                        "日本",
                                        "a",
                                        "\\u00e9x",
                                        "€",
                                        "ｆｕｌｌ",
                                        "\\ud83d\\ude01",
                                        "A",
                                        "_",
                                        "~",
                                        "ä",
                                        "𝔸",
                                        "\\t",
                                        "é "};

static void shuffle(gen *g, unsigned *ix, unsigned n) {
  unsigned i, j, t;
  for (i = 0; i < n; i++) ix[i] = i;
  for (i = n; i > 1; i--) {
    j = rng_below(&g->r, i);
    t = ix[i - 1];
    ix[i - 1] = ix[j];
    ix[j] = t;
  }
}

static void g_unicode_doc(gen *g) {
  unsigned ix[32], i, k;
  g_printf(
      g,
      "{\"title\":\"%s\",\"body\":\"%s\",\"tags\":[\"%s\",\"%s\"],\"labels\":{",
      PICK(g, texts), PICK(g, texts), PICK(g, texts), PICK(g, texts));
  k = (unsigned)(sizeof uni_names / sizeof uni_names[0]);
  shuffle(g, ix, k);
  k = 3 + rng_below(&g->r, k - 3);
  for (i = 0; i < k; i++)
    g_printf(g, "%s\"%s\":\"%s\"", i ? "," : "", uni_names[ix[i]],
             PICK(g, texts));
  g_printf(g, "},\"n\":%u}\n", rng_below(&g->r, 1000));
}

static const char *const ascii_names[] = {
    "zeta",       "alpha",         "Beta",  "_id", "10",        "2",
    "a b",        "key-with-dash", "Z",     "aa",  "a",         "status",
    "created_at", "updatedAt",     "x",     "y",   "\\\"q\\\"", "items",
    "id",         "name",          "value", "01",  "1",         "$ref",
    "@type",      "nested"};

static void g_value(gen *g, unsigned depth);

static void g_object(gen *g, unsigned depth) {
  unsigned ix[32], i,
      k = (unsigned)(sizeof ascii_names / sizeof ascii_names[0]);
  shuffle(g, ix, k);
  k = 1 + rng_below(&g->r, depth > 3 ? 3 : 6);
  g_puts(g, "{");
  for (i = 0; i < k; i++) {
    g_printf(g, "%s\"%s\":", i ? "," : "", ascii_names[ix[i]]);
    g_value(g, depth + 1);
  }
  g_puts(g, "}");
}

static void g_value(gen *g, unsigned depth) {
  unsigned i, k;
  switch (rng_below(&g->r, depth < 5 ? 9 : 6)) {
  case 0: g_printf(g, "\"%s\"", PICK(g, texts)); break;
  case 1: g_printf(g, "%d", (int)rng_below(&g->r, 2000000) - 1000000); break;
  case 2: g_double(g, rand_double(g)); break;
  case 3: g_puts(g, rng_below(&g->r, 2) ? "true" : "false"); break;
  case 4: g_puts(g, "null"); break;
  case 5: g_ascii_str(g, PICK(g, words)); break;
  case 6:
  case 7: g_object(g, depth); break;
  default:
    k = rng_below(&g->r, 5);
    g_puts(g, "[");
    for (i = 0; i < k; i++) {
      if (i) g_puts(g, ",");
      g_value(g, depth + 1);
    }
    g_puts(g, "]");
  }
}

static void g_nested_doc(gen *g) {
  g_object(g, 0);
  g_puts(g, "\n");
}

static void g_int(gen *g) {
  long long v;
  switch (rng_below(&g->r, 4)) {
  case 0: v = (long long)rng_below(&g->r, 1000); break;
  case 1: v = -(long long)rng_below(&g->r, 100000000); break;
  case 2: v = (long long)(rng_next(&g->r) >> 11); break; /* below 2^53 */
  default:
    v = rng_below(&g->r, 2) ? 9007199254740992LL : -9007199254740992LL;
    if (rng_below(&g->r, 2)) v += v > 0 ? -1 : 1;
  }
  g_printf(g, "%lld", v);
}

static void g_int_doc(gen *g) {
  unsigned i, j, n = 30 + rng_below(&g->r, 150), rows = 1 + rng_below(&g->r, 4);
  g_puts(g, "{\"ids\":[");
  for (i = 0; i < n; i++) {
    if (i) g_puts(g, ",");
    g_int(g);
  }
  g_puts(g, "],\"rows\":[");
  for (j = 0; j < rows; j++) {
    g_puts(g, j ? ",[" : "[");
    for (i = 0; i < 8; i++) {
      if (i) g_puts(g, ",");
      g_int(g);
    }
    g_puts(g, "]");
  }
  g_printf(g, "],\"count\":%u}\n", n);
}

/* Write the key input: n refund calls.  0 on success, else errno. */
static int write_key_input(const char *path, unsigned long n, size_t *bytes) {
  gen g;
  unsigned long i;
  g.f = fopen(path, "w");
  if (!g.f) return errno;
  g.n = 0;
  g.r.s = 20261202;
  for (i = 0; i < n; i++) g_refund_call(&g, i);
  *bytes = g.n;
  if (fclose(g.f) != 0) return errno ? errno : EIO;
  return 0;
}

/* Write the canon input: mixed documents up to about `target` bytes. */
static int write_canon_input(const char *path, size_t target, size_t *bytes,
                             unsigned long *docs) {
  gen g;
  unsigned long i;
  g.f = fopen(path, "w");
  if (!g.f) return errno;
  g.n = 0;
  g.r.s = 8785;
  for (i = 0; g.n < target; i++) {
    switch (rng_below(&g.r, 10)) {
    case 0:
    case 1:
    case 2: g_refund_call(&g, i); break;
    case 3:
    case 4: g_float_doc(&g); break;
    case 5:
    case 6: g_unicode_doc(&g); break;
    case 7:
    case 8: g_nested_doc(&g); break;
    default: g_int_doc(&g);
    }
  }
  *bytes = g.n;
  *docs = i;
  if (fclose(g.f) != 0) return errno ? errno : EIO;
  return 0;
}

/* ---- printing the figures -------------------------------------------------- */

/* A JSON string on stdout. */
static void put_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      printf("\\%c", ch);
    else if (ch < 0x20)
      printf("\\u%04x", ch);
    else
      putchar(ch);
  }
  putchar('"');
}

static void put_field_str(const char *name, const char *value) {
  printf(",\"%s\":", name);
  put_str(value);
}

/* ---- running programs -------------------------------------------------------- */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Run argv[0] (searched in PATH when search is set) with stdin, stdout and
** stderr redirected to files; wait for it and time it.  0 and the wait
** status, or the errno of a spawn that failed (ENOENT: not installed). */
static int run_timed(int search, const char *prog, char *const argv[],
                     char *const envp[], const char *in, const char *out,
                     const char *err, double *secs, int *status) {
  posix_spawn_file_actions_t fa;
  pid_t pid;
  double t0;
  int rc;
  if ((rc = posix_spawn_file_actions_init(&fa))) return rc;
  if ((rc = posix_spawn_file_actions_addopen(&fa, 0, in, O_RDONLY, 0)) ||
      (rc = posix_spawn_file_actions_addopen(
           &fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0644)) ||
      (rc = posix_spawn_file_actions_addopen(
           &fa, 2, err, O_WRONLY | O_CREAT | O_TRUNC, 0644))) {
    posix_spawn_file_actions_destroy(&fa);
    return rc;
  }
  /* Empty the files the run before left, off the clock: freeing a 40 MB
  ** output's pages takes 3-10 ms here, which is the file system's work,
  ** not the program's (the child's O_TRUNC then finds nothing to do). */
  if ((truncate(out, 0) != 0 && errno != ENOENT) ||
      (truncate(err, 0) != 0 && errno != ENOENT)) {
    rc = errno;
    posix_spawn_file_actions_destroy(&fa);
    return rc;
  }
  t0 = now_s();
  rc = search ? posix_spawnp(&pid, prog, &fa, NULL, argv, envp)
              : posix_spawn(&pid, prog, &fa, NULL, argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  if (rc) return rc;
  while (waitpid(pid, status, 0) < 0)
    if (errno != EINTR) return errno;
  *secs = now_s() - t0;
  return 0;
}

static int exited_ok(int status) {
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Run argv (searched in PATH) and keep what it prints on stdout and stderr,
** lines and all, in out.  0 on success, else an errno value (ENOENT: not
** installed) or -1 (it failed). */
static int run_capture(char *const argv[], char *out, size_t cap) {
  posix_spawn_file_actions_t fa;
  pid_t pid = 0;
  int p[2], rc, status;
  size_t n = 0;
  ssize_t k;
  out[0] = '\0';
  if (pipe2(p, O_CLOEXEC)) return errno;
  if ((rc = posix_spawn_file_actions_init(&fa))) goto fail;
  if (!(rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY,
                                              0)) &&
      !(rc = posix_spawn_file_actions_adddup2(&fa, p[1], 1)) &&
      !(rc = posix_spawn_file_actions_adddup2(&fa, p[1], 2)))
    rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc) goto fail;
  close(p[1]);
  for (;;) { /* read all, keep what fits */
    char junk[256];
    if (n < cap - 1)
      k = read(p[0], out + n, cap - 1 - n);
    else
      k = read(p[0], junk, sizeof junk);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    if (n < cap - 1) n += (size_t)k;
  }
  close(p[0]);
  out[n] = '\0';
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return errno;
  return exited_ok(status) ? 0 : -1;
fail:
  close(p[0]);
  close(p[1]);
  return rc;
}

/* Ask an interpreter for its version and its real executable, in two
** lines.  The real path matters: a version manager's shim (pyenv's costs
** half a second) would otherwise be timed as if it were the peer. */
static int probe(char *const argv[], char *version, size_t vcap, char *exe,
                 size_t ecap) {
  char text[PATH_MAX + 256], *nl;
  if (run_capture(argv, text, sizeof text)) return -1;
  if (!(nl = strchr(text, '\n'))) return -1;
  *nl++ = '\0';
  nl[strcspn(nl, "\r\n")] = '\0';
  snprintf(version, vcap, "%s", text);
  snprintf(exe, ecap, "%s", *nl == '/' ? nl : argv[0]);
  return 0;
}

/* "exited 65: idem: line 3: ..." from a wait status and a stderr file:
** the last line naming an error (Python and Node print a stack first),
** else the first line. */
static void describe_failure(int status, const char *errpath, char *b,
                             size_t cap) {
  char line[240], cur[240];
  FILE *f = fopen(errpath, "r");
  line[0] = '\0';
  if (f) {
    while (fgets(cur, sizeof cur, f)) {
      cur[strcspn(cur, "\n")] = '\0';
      if (!line[0] || strstr(cur, "Error:")) memcpy(line, cur, sizeof line);
    }
    fclose(f);
  }
  if (WIFEXITED(status))
    snprintf(b, cap, "exited %d%s%s", WEXITSTATUS(status), line[0] ? ": " : "",
             line);
  else if (WIFSIGNALED(status))
    snprintf(b, cap, "killed by signal %d", WTERMSIG(status));
  else
    snprintf(b, cap, "stopped");
}

/* Compare two files line by line.  1 when byte-identical; 0 and a note on
** stderr naming the first differing line; -1 when one cannot be read. */
static int same_output(const char *a, const char *b, const char *what,
                       const char *name_a, const char *name_b) {
  FILE *fa = fopen(a, "r"), *fb = fopen(b, "r");
  char *la = NULL, *lb = NULL;
  size_t ca = 0, cb = 0, lineno = 0;
  ssize_t na, nb;
  int same = 1;
  if (!fa || !fb) {
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return -1;
  }
  for (;;) {
    na = getline(&la, &ca, fa);
    nb = getline(&lb, &cb, fb);
    lineno++;
    if (na < 0 && nb < 0) break;
    if (na != nb || memcmp(la, lb, (size_t)na) != 0) {
      same = 0;
      cli_err("bench %s: outputs differ at line %zu", what, lineno);
      fprintf(stderr, "  %s: %.400s%s", name_a,
              na < 0 ? "(end of output)\n" : la, na > 400 ? "...\n" : "");
      fprintf(stderr, "  %s: %.400s%s", name_b,
              nb < 0 ? "(end of output)\n" : lb, nb > 400 ? "...\n" : "");
      break;
    }
  }
  free(la);
  free(lb);
  fclose(fa);
  fclose(fb);
  return same;
}

/* ---- the run's context ------------------------------------------------------- */

typedef struct bench {
  char dir[PATH_MAX];
  int quick;
  int have_python, have_node;
  char python_version[128], node_version[128];
  char python_exe[PATH_MAX], node_exe[PATH_MAX]; /* real paths, or names */
  char node_path[PATH_MAX]; /* node_modules holding canonicalize, or "" */
  char canon_version[32];
} bench;

static int path_in(const bench *b, const char *name, char *out, size_t cap) {
  int k = snprintf(out, cap, "%s/%s", b->dir, name);
  return k < 0 || (size_t)k >= cap ? -1 : 0;
}

/* Does dir hold the npm package canonicalize?  Sets b->node_path. */
static int try_node_path(bench *b, const char *dir) {
  char p[PATH_MAX + 64], real[PATH_MAX];
  int k;
  if (!dir || !*dir) return 0;
  k = snprintf(p, sizeof p, "%s/canonicalize/package.json", dir);
  if (k < 0 || (size_t)k >= sizeof p || access(p, R_OK) != 0) return 0;
  if (!realpath(dir, real)) return 0;
  snprintf(b->node_path, sizeof b->node_path, "%s", real);
  return 1;
}

/* The "version" of the package.json in node_path/canonicalize. */
static void read_canon_version(bench *b) {
  char p[PATH_MAX + 64], text[4096], *v, *e;
  size_t n;
  FILE *f;
  snprintf(b->canon_version, sizeof b->canon_version, "?");
  snprintf(p, sizeof p, "%s/canonicalize/package.json", b->node_path);
  if (!(f = fopen(p, "r"))) return;
  n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  if (!(v = strstr(text, "\"version\"")) || !(v = strchr(v + 9, '"'))) return;
  if (!(e = strchr(++v, '"')) || (size_t)(e - v) >= sizeof b->canon_version)
    return;
  memcpy(b->canon_version, v, (size_t)(e - v));
  b->canon_version[e - v] = '\0';
}

static void find_node_path(bench *b) {
  char exe[PATH_MAX], p[PATH_MAX + 64], *slash;
  ssize_t n;
  b->node_path[0] = '\0';
  if (try_node_path(b, getenv("IDEM_NODE_PATH"))) goto found;
  n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    if ((slash = strrchr(exe, '/'))) {
      *slash = '\0';
      snprintf(p, sizeof p, "%s/../tests/peers/node_modules", exe);
      if (try_node_path(b, p)) goto found;
    }
  }
#ifdef IDEM_SOURCE_DIR
  if (try_node_path(b, IDEM_SOURCE_DIR "/tests/peers/node_modules")) goto found;
#endif
  return;
found:
  read_canon_version(b);
}

/* environ with NODE_PATH replaced; free with free(). */
static char **node_env(const bench *b, char *slot, size_t cap) {
  size_t n = 0, i, j = 0;
  char **env;
  while (environ[n]) n++;
  if (!(env = malloc((n + 2) * sizeof *env))) return NULL;
  for (i = 0; i < n; i++)
    if (strncmp(environ[i], "NODE_PATH=", 10) != 0) env[j++] = environ[i];
  snprintf(slot, cap, "NODE_PATH=%s", b->node_path);
  env[j++] = slot;
  env[j] = NULL;
  return env;
}

/* One program of a comparison: how to run it, and how it went. */
typedef struct side {
  int search; /* look prog up in PATH */
  const char *prog;
  char *const *argv, *const *envp;
  const char *out, *err; /* where its stdout and stderr go */
  double best;           /* its best time */
  int rc;                /* 0, the spawn errno, or -1: it failed (why) */
  char why[400];
} side;

/*
** Run the n sides in turns, BEST_OF rounds, keeping each one's best time.
** Taking turns matters on a shared host whose speed drifts by half within
** minutes: run one side's rounds and then the other's, and the two best
** times come from different stretches of time; in turns, from the same.
** A side that fails (its rc and why say how) is not run again; when the
** first (idem) fails, nothing is.
*/
static void best_of(side *s, int n, const char *in) {
  int round, k, status = 0;
  for (k = 0; k < n; k++) s[k].rc = 0, s[k].best = 0, s[k].why[0] = '\0';
  for (round = 0; round < BEST_OF && !s[0].rc; round++)
    for (k = 0; k < n && !s[0].rc; k++) {
      side *x = &s[k];
      double t = 0;
      if (x->rc) continue;
      if ((x->rc = run_timed(x->search, x->prog, x->argv, x->envp, in, x->out,
                             x->err, &t, &status))) {
        snprintf(x->why, sizeof x->why, "cannot run %s: %s", x->argv[0],
                 strerror(x->rc));
      } else if (!exited_ok(status)) {
        char d[300];
        describe_failure(status, x->err, d, sizeof d);
        snprintf(x->why, sizeof x->why, "%s %s", x->argv[0], d);
        x->rc = -1;
      } else if (round == 0 || t < x->best)
        x->best = t;
    }
}

static void put_ratio(double idem_s, double peer_s, int target) {
  double ratio = idem_s > 0 ? peer_s / idem_s : 0;
  printf(",\"peer_s\":%.4f,\"ratio\":%.1f", peer_s, ratio);
  if (target)
    printf(",\"target\":%d,\"meets_target\":%s", target,
           ratio >= target ? "true" : "false");
}

/* ---- key_lines ----------------------------------------------------------------- */

static const char key_script[] =
    "import sys, json, hashlib\n"
    "w = sys.stdout.write\n"
    "for line in sys.stdin.buffer:\n"
    "    o = json.loads(line)\n"
    "    t, a = o[\"tool\"], o[\"args\"]\n"
    "    p = json.dumps({\"tool\": t, \"args\": a}, sort_keys=True, "
    "separators=(\",\", \":\"))\n"
    "    d = hashlib.sha256(p.encode()).hexdigest()[:16]\n"
    "    w(f\"{o['session']}:{o['call']}:{d}\\n\")\n";

static int bench_key(const bench *b) {
  char in[PATH_MAX], o1[PATH_MAX], o2[PATH_MAX], e1[PATH_MAX], e2[PATH_MAX];
  char *idem_argv[] = {"idem", "key", "--lines", NULL};
  char *py_argv[] = {"python3", "-c", (char *)key_script, NULL};
  const char *py = b->python_exe;
  unsigned long calls = b->quick ? 10000 : 100000;
  size_t bytes = 0;
  side sd[2];
  int rc, same;

  if (path_in(b, "key_calls.jsonl", in, sizeof in) ||
      path_in(b, "key_idem.out", o1, sizeof o1) ||
      path_in(b, "key_python.out", o2, sizeof o2) ||
      path_in(b, "key_idem.err", e1, sizeof e1) ||
      path_in(b, "key_python.err", e2, sizeof e2)) {
    cli_err("bench: directory name too long");
    return EXIT_FAIL;
  }
  if ((rc = write_key_input(in, calls, &bytes))) {
    cli_err("bench: %s: %s", in, strerror(rc));
    return EXIT_FAIL;
  }
  printf("{\"bench\":\"key_lines\",\"calls\":%lu,\"bytes\":%zu,\"best_of\":%d",
         calls, bytes, BEST_OF);
  sd[0] = (side){0, "/proc/self/exe", idem_argv, environ, o1, e1, 0, 0, ""};
  sd[1] = (side){*py != '/', py, py_argv, environ, o2, e2, 0, 0, ""};
  best_of(sd, b->have_python ? 2 : 1, in);
  if (sd[0].rc) {
    put_field_str("error", sd[0].why);
    puts("}");
    return EXIT_FAIL;
  }
  printf(",\"idem_s\":%.4f", sd[0].best);
  put_field_str("peer", "python3 json.loads+snippet");
  if (!b->have_python) {
    put_field_str("skipped", "python3 not found");
    puts("}");
    return EXIT_OK;
  }
  if ((rc = sd[1].rc)) {
    put_field_str(rc == ENOENT ? "skipped" : "error", sd[1].why);
    puts("}");
    return rc == ENOENT ? EXIT_OK : EXIT_FAIL;
  }
  put_ratio(sd[0].best, sd[1].best, KEY_TARGET);
  same = same_output(o1, o2, "key_lines", "idem   ", "python3");
  printf(",\"outputs_match\":%s}\n", same == 1 ? "true" : "false");
  return same == 1 ? EXIT_OK : EXIT_FAIL;
}

/* ---- canon_lines --------------------------------------------------------------- */

/* Reads all of stdin (as fast as node can), writes in 1 MiB chunks. */
static const char canon_script[] =
    "'use strict';\n"
    "// idem bench peer: the npm package canonicalize, one JSON text per "
    "line.\n"
    "const fs = require('fs');\n"
    "function writeAll(s) {\n"
    "  const b = Buffer.from(s, 'utf8');\n"
    "  for (let o = 0; o < b.length; ) o += fs.writeSync(1, b, o, b.length - "
    "o);\n"
    "}\n"
    "function run(canonicalize) {\n"
    "  const lines = fs.readFileSync(0, 'utf8').split('\\n');\n"
    "  if (lines.length && lines[lines.length - 1] === '') lines.pop();\n"
    "  let out = [], size = 0;\n"
    "  for (const line of lines) {\n"
    "    const s = canonicalize(JSON.parse(line));\n"
    "    out.push(s);\n"
    "    size += s.length;\n"
    "    if (size >= 1048576) {\n"
    "      out.push('');\n"
    "      writeAll(out.join('\\n'));\n"
    "      out = [];\n"
    "      size = 0;\n"
    "    }\n"
    "  }\n"
    "  if (out.length) { out.push(''); writeAll(out.join('\\n')); }\n"
    "}\n"
    "let m;\n"
    "try {\n"
    "  m = require('canonicalize');\n"
    "} catch (e) {\n"
    "  if (e.code !== 'ERR_REQUIRE_ESM') throw e;\n"
    "}\n"
    "if (m) run(typeof m === 'function' ? m : m.default);\n"
    "else "
    "import(require('url').pathToFileURL(require.resolve('canonicalize')).href)"
    "\n"
    "  .then((ns) => run(ns.default));\n";

static int bench_canon(const bench *b) {
  char in[PATH_MAX], o1[PATH_MAX], o2[PATH_MAX], e1[PATH_MAX], e2[PATH_MAX];
  char js[PATH_MAX], why[400] = "", peer[64], slot[PATH_MAX + 16];
  char *idem_argv[] = {"idem", "canon", "--lines", NULL};
  char *node_argv[] = {"node", js, NULL};
  char **env = NULL;
  size_t bytes = 0, target = b->quick ? (size_t)4 << 20 : (size_t)40 << 20;
  unsigned long docs = 0;
  side sd[2];
  int rc, same, peers = 0;
  FILE *f;

  if (path_in(b, "canon_docs.jsonl", in, sizeof in) ||
      path_in(b, "canon_idem.out", o1, sizeof o1) ||
      path_in(b, "canon_node.out", o2, sizeof o2) ||
      path_in(b, "canon_idem.err", e1, sizeof e1) ||
      path_in(b, "canon_node.err", e2, sizeof e2) ||
      path_in(b, "canon_peer.js", js, sizeof js)) {
    cli_err("bench: directory name too long");
    return EXIT_FAIL;
  }
  if ((rc = write_canon_input(in, target, &bytes, &docs))) {
    cli_err("bench: %s: %s", in, strerror(rc));
    return EXIT_FAIL;
  }
  printf("{\"bench\":\"canon_lines\",\"docs\":%lu,\"bytes\":%zu,\"best_of\":%d",
         docs, bytes, BEST_OF);
  /* the peer takes turns with idem when it can run at all */
  if (b->have_node && b->node_path[0]) {
    if (!(f = fopen(js, "w")) || fputs(canon_script, f) < 0 || fclose(f) != 0)
      snprintf(why, sizeof why, "cannot write %.200s: %s", js,
               strerror(errno));
    else if (!(env = node_env(b, slot, sizeof slot)))
      snprintf(why, sizeof why, "out of memory");
    else
      peers = 1;
  }
  sd[0] = (side){0, "/proc/self/exe", idem_argv, environ, o1, e1, 0, 0, ""};
  sd[1] = (side){*b->node_exe != '/', b->node_exe, node_argv, env, o2, e2,
                 0, 0, ""};
  best_of(sd, 1 + peers, in);
  free(env);
  if (sd[0].rc) {
    put_field_str("error", sd[0].why);
    puts("}");
    return EXIT_FAIL;
  }
  printf(",\"idem_s\":%.4f", sd[0].best);
  if (b->have_node && b->node_path[0])
    snprintf(peer, sizeof peer, "node canonicalize@%s", b->canon_version);
  else
    snprintf(peer, sizeof peer, "node canonicalize");
  put_field_str("peer", peer);
  if (!b->have_node) {
    put_field_str("skipped", "node not found");
    puts("}");
    return EXIT_OK;
  }
  if (!b->node_path[0]) {
    put_field_str(
        "skipped",
        "npm package canonicalize not found; run npm install in tests/peers");
    puts("}");
    return EXIT_OK;
  }
  if (!peers) {
    put_field_str("error", why);
    puts("}");
    return EXIT_FAIL;
  }
  if ((rc = sd[1].rc)) {
    put_field_str(rc == ENOENT ? "skipped" : "error", sd[1].why);
    puts("}");
    return rc == ENOENT ? EXIT_OK : EXIT_FAIL;
  }
  put_ratio(sd[0].best, sd[1].best, CANON_TARGET);
  same = same_output(o1, o2, "canon_lines", "idem", "node");
  printf(",\"outputs_match\":%s}\n", same == 1 ? "true" : "false");
  return same == 1 ? EXIT_OK : EXIT_FAIL;
}

/* ---- dtoa ------------------------------------------------------------------------ */

static int bench_dtoa(const bench *b) {
  size_t n = b->quick ? 100000 : 1000000, i, bad = 0;
  double *v, t0, t_idem = 0, t_printf = 0, t;
  volatile size_t sink = 0;
  char buf[DTOA_BUF];
  rng r = {53};
  uint64_t bits;
  int round, k;

  if (!(v = malloc(n * sizeof *v))) {
    cli_err("bench: out of memory");
    return EXIT_FAIL;
  }
  for (i = 0; i < n; i++) {
    do bits = rng_next(&r);
    while (((bits >> 52) & 0x7ff) == 0x7ff);
    v[i] = from_bits(bits);
  }
  /* Correctness first: every text must read back as the same double. */
  for (i = 0; i < n; i++) {
    size_t len = idem__dtoa(v[i], buf);
    buf[len] = '\0';
    if (strtod(buf, NULL) != v[i]) bad++;
  }
  for (round = 0; round < BEST_OF; round++) {
    size_t s = 0;
    t0 = now_s();
    for (i = 0; i < n; i++) s += idem__dtoa(v[i], buf);
    t = now_s() - t0;
    sink += s;
    if (round == 0 || t < t_idem) t_idem = t;
    s = 0;
    t0 = now_s();
    for (i = 0; i < n; i++) {
      k = snprintf(buf, sizeof buf, "%.17g", v[i]);
      s += (size_t)k;
    }
    t = now_s() - t0;
    sink += s;
    if (round == 0 || t < t_printf) t_printf = t;
  }
  (void)sink; /* written only so that neither loop is optimized away */
  free(v);
  printf(
      "{\"bench\":\"dtoa\",\"numbers\":%zu,\"inputs\":\"random finite bit "
      "patterns\",\"best_of\":%d,\"idem_ns\":%.1f,\"peer\":\"snprintf %%.17g\","
      "\"peer_ns\":%.1f,\"ratio\":%.1f,\"round_trip_errors\":%zu}\n",
      n, BEST_OF, t_idem * 1e9 / (double)n, t_printf * 1e9 / (double)n,
      t_idem > 0 ? t_printf / t_idem : 0, bad);
  return bad ? EXIT_FAIL : EXIT_OK;
}

/* ---- the verb ---------------------------------------------------------------- */

static void cpu_model(char *out, size_t cap) {
  static const char *const keys[] = {"model name", "Hardware", "cpu model",
                                     "Processor", "cpu"};
  char line[512], *colon;
  size_t i;
  FILE *f = fopen("/proc/cpuinfo", "r");
  snprintf(out, cap, "unknown");
  if (!f) return;
  for (i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    rewind(f);
    while (fgets(line, sizeof line, f)) {
      size_t kl = strlen(keys[i]);
      if (strncmp(line, keys[i], kl) != 0 || !(colon = strchr(line, ':')))
        continue;
      if (line[kl] != ' ' && line[kl] != '\t' && line[kl] != ':') continue;
      colon++;
      while (*colon == ' ' || *colon == '\t') colon++;
      colon[strcspn(colon, "\n")] = '\0';
      snprintf(out, cap, "%s", colon);
      fclose(f);
      return;
    }
  }
  fclose(f);
}

/* Remove the files of a directory this run created, then the directory. */
static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  if (d) {
    while ((e = readdir(d)))
      if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
        unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
  }
  if (rmdir(dir) != 0)
    cli_err("bench: cannot remove %s: %s", dir, strerror(errno));
}

int cmd_bench(int argc, char **argv) {
  static const struct option opts[] = {{"quick", no_argument, NULL, 'q'},
                                       {"only", required_argument, NULL, 'o'},
                                       {"dir", required_argument, NULL, 'd'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  static char *py_probe[] = {
      "python3", "-c",
      "import sys; print(sys.version.split()[0]); print(sys.executable)", NULL};
  static char *node_probe[] = {
      "node", "-p", "process.versions.node + '\\n' + process.execPath", NULL};
  const char *only = NULL, *dir = NULL, *tmp;
  char cpu[256];
  int ch, rc = EXIT_OK, fresh = 0, k;
  bench b;

  memset(&b, 0, sizeof b);
  while ((ch = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
    switch (ch) {
    case 'q': b.quick = 1; break;
    case 'o': only = optarg; break;
    case 'd': dir = optarg; break;
    case 'h': cli_print_usage(stdout, "bench"); return EXIT_OK;
    case ':':
      return cli_usage("bench", "option '%s' needs a value", argv[optind - 1]);
    default:
      return cli_usage("bench", "no option '%s' for bench", argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage("bench", "too many arguments");
  if (only && strcmp(only, "key") != 0 && strcmp(only, "canon") != 0 &&
      strcmp(only, "dtoa") != 0 && strcmp(only, "guard") != 0)
    return cli_usage("bench",
                     "--only takes key, canon, dtoa or guard, not '%s'", only);

  if (dir) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
      cli_err("bench: cannot create %s: %s", dir, strerror(errno));
      return EXIT_FAIL;
    }
    k = snprintf(b.dir, sizeof b.dir, "%s", dir);
  } else {
    tmp = getenv("TMPDIR");
    k = snprintf(b.dir, sizeof b.dir, "%s/idem-bench-XXXXXX",
                 tmp && *tmp ? tmp : "/tmp");
    if (k > 0 && (size_t)k < sizeof b.dir && !mkdtemp(b.dir)) {
      cli_err("bench: cannot create a directory like %s: %s", b.dir,
              strerror(errno));
      return EXIT_FAIL;
    }
    fresh = 1;
  }
  if (k < 0 || (size_t)k >= sizeof b.dir) {
    cli_err("bench: directory name too long");
    return EXIT_FAIL;
  }

  /* The peers: present when they answer. */
  b.have_python = probe(py_probe, b.python_version, sizeof b.python_version,
                        b.python_exe, sizeof b.python_exe) == 0;
  b.have_node = probe(node_probe, b.node_version, sizeof b.node_version,
                      b.node_exe, sizeof b.node_exe) == 0;
  if (b.have_node) find_node_path(&b);

  cpu_model(cpu, sizeof cpu);
  printf("{\"bench\":\"machine\",\"nproc\":%ld", sysconf(_SC_NPROCESSORS_ONLN));
  put_field_str("cpu", cpu);
  put_field_str("idem", idem_version());
  if (b.have_python) {
    put_field_str("python3", b.python_version);
    put_field_str("python3_exe", b.python_exe);
  } else
    printf(",\"python3\":null");
  if (b.have_node) {
    put_field_str("node", b.node_version);
    put_field_str("node_exe", b.node_exe);
  } else
    printf(",\"node\":null");
  if (b.node_path[0])
    put_field_str("canonicalize", b.canon_version);
  else
    printf(",\"canonicalize\":null");
  printf(",\"quick\":%s}\n", b.quick ? "true" : "false");
  fflush(stdout);

  if (!only || strcmp(only, "key") == 0) {
    rc |= bench_key(&b);
    fflush(stdout);
  }
  if (!only || strcmp(only, "canon") == 0) {
    rc |= bench_canon(&b);
    fflush(stdout);
  }
  if (!only || strcmp(only, "dtoa") == 0) rc |= bench_dtoa(&b);
  if (!only || strcmp(only, "guard") == 0) {
    fflush(stdout);
    rc |= bench_guard(b.dir, b.quick);
  }

  if (fresh) remove_dir(b.dir);
  if (cli_flush()) return EXIT_FAIL;
  return rc ? EXIT_FAIL : EXIT_OK;
}
