/*
** common.c - what the backends share, below the choice of one (store.c):
** the failed store, the deadline of the caller's call, the checks both make
** of what they are given, the SQL of a listing, and a URL as messages
** show it.
**
** Opening reports its failure through the store's own errmsg, so a store
** that could not be opened is still an object: a "failed store" whose
** errmsg holds the reason and whose other entry points answer IDEM_MISUSE.
** The caller reads the message and closes it like any other store.
*/
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "idemInt.h"

/* ---- failed stores -------------------------------------------------------- */

typedef struct failed_store {
  idem__store base;
  char msg[400];
} failed_store;

static int f_now(idem__store *st, long long *ms) {
  (void)st;
  if (ms) *ms = 0;
  return IDEM_MISUSE;
}
static int f_begin(idem__store *st, const idem_record *rec, long long w,
                   long long cw, int *what, idem_record **found) {
  (void)st, (void)rec, (void)w, (void)cw;
  if (what) *what = 0;
  if (found) *found = NULL;
  return IDEM_MISUSE;
}
static int f_insert(idem__store *st, const idem_record *rec, int *what,
                    idem_record **found) {
  (void)st, (void)rec;
  if (what) *what = 0;
  if (found) *found = NULL;
  return IDEM_MISUSE;
}
static int f_get(idem__store *st, const char *s, const char *c,
                 idem_record **out) {
  (void)st, (void)s, (void)c;
  if (out) *out = NULL;
  return IDEM_MISUSE;
}
static int f_fence(idem__store *st, const idem_record *rec, long long w,
                   long long cw, int turn_only, idem_record **out) {
  (void)st, (void)rec, (void)w, (void)cw, (void)turn_only;
  if (out) *out = NULL;
  return IDEM_MISUSE;
}
static int f_change(idem__store *st, const idem__change *ch,
                    idem_record **now) {
  (void)st, (void)ch;
  if (now) *now = NULL;
  return IDEM_MISUSE;
}
static int f_list(idem__store *st, const idem__filter *f, idem__record_cb cb,
                  void *ctx) {
  (void)st, (void)f, (void)cb, (void)ctx;
  return IDEM_MISUSE;
}
static int f_gc(idem__store *st, long long now, size_t *n) {
  (void)st, (void)now;
  if (n) *n = 0;
  return IDEM_MISUSE;
}
static int f_stats(idem__store *st, long long counts[8]) {
  (void)st, (void)counts;
  return IDEM_MISUSE;
}
static int f_tally(idem__store *st, idem_tally_fn cb, void *ctx) {
  (void)st, (void)cb, (void)ctx;
  return IDEM_MISUSE;
}
static const char *f_errmsg(idem__store *st) {
  return ((failed_store *)st)->msg;
}
static void f_close(idem__store *st) { idem__free(st); }

static const idem__store_vt failed_vt = {
    .scheme = "failed",
    .now = f_now,
    .begin = f_begin,
    .insert = f_insert,
    .get = f_get,
    .fence = f_fence,
    .change = f_change,
    .list = f_list,
    .gc = f_gc,
    .stats = f_stats,
    .tally = f_tally,
    .errmsg = f_errmsg,
    .close = f_close,
};

int idem__store_fail(idem__store **out, int rc, const char *fmt, ...) {
  failed_store *f = idem__malloc(sizeof *f);
  va_list ap;
  *out = NULL;
  if (!f) return rc;
  f->base.vt = &failed_vt;
  va_start(ap, fmt);
  vsnprintf(f->msg, sizeof f->msg, fmt, ap);
  va_end(ap);
  *out = &f->base;
  return rc;
}

/* ---- the caller's deadline ----------------------------------------------- */

static _Thread_local long long tls_deadline;

void idem__store_deadline_set(long long mono_ms) { tls_deadline = mono_ms; }

long long idem__store_deadline(void) { return tls_deadline; }

/* ---- checks both stores make ----------------------------------------------- */

const char *idem__record_missing(const idem_record *rec) {
  return !rec                ? "the record"
         : !rec->session     ? "session"
         : !rec->call_id     ? "call_id"
         : !rec->tool        ? "tool"
         : !rec->fingerprint ? "fingerprint"
         : !rec->key         ? "key"
         : !rec->args        ? "args"
                             : NULL;
}

int idem__change_in_range(const idem__change *ch) {
  return ch->state >= 0 && ch->state <= IDEM_STATE_DEDUPLICATED &&
         ch->resolution >= 0 && ch->resolution <= IDEM_RESOLVED_OPERATOR &&
         ch->take_lease >= 0 && ch->take_lease <= IDEM__LEASE_HAND &&
         ch->exec_set >= 0 && ch->exec_set <= IDEM__EXEC_ENDED;
}

const char *idem__check_name(int outcome) {
  switch (outcome) {
  case IDEM_OUTCOME_APPLIED: return "applied";
  case IDEM_OUTCOME_REJECTED: return "rejected";
  case IDEM_OUTCOME_NOT_APPLIED: return "not_applied";
  case IDEM_OUTCOME_UNKNOWN: return "unknown";
  default: return NULL;
  }
}

/* ---- listings ------------------------------------------------------------ */

#define LIVE_MASK ((1u << IDEM_STATE_PENDING) | (1u << IDEM_STATE_IN_DOUBT))

unsigned idem__filter_shape(const idem__filter *f) {
  unsigned by = (f->session ? IDEM__BY_SESSION : 0) |
                (f->fence_key ? IDEM__BY_FENCE : 0) |
                (f->call_id ? IDEM__BY_CALL : 0) |
                (f->key ? IDEM__BY_KEY : 0) | (f->tool ? IDEM__BY_TOOL : 0) |
                (f->after_created > 0 ? IDEM__BY_AFTER : 0);
  return by | ((f->states & 0x7eu) >> 1) << 6;
}

/* Append to buf at *at (n bytes) what fmt says; 0, or -1 when it is full. */
static int put(char *buf, size_t n, size_t *at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static int put(char *buf, size_t n, size_t *at, const char *fmt, ...) {
  va_list ap;
  int k;
  if (*at >= n) return -1;
  va_start(ap, fmt);
  k = vsnprintf(buf + *at, n - *at, fmt, ap);
  va_end(ap);
  if (k < 0 || (size_t)k >= n - *at) return -1;
  *at += (size_t)k;
  return 0;
}

/* Parameter i as the store writes it: mark, i, cast ("?3", "$3::text"). */
static const char *param(char *p, size_t n, char mark, int i,
                         const char *cast) {
  snprintf(p, n, "%c%d%s", mark, i, cast);
  return p;
}

/* Append " AND " (or " WHERE " first), then the condition col = param. */
static int put_eq(char *buf, size_t n, size_t *at, int *nc, const char *col,
                  char mark, const char *cast, int *np) {
  char p[32];
  return put(buf, n, at, "%s%s = %s", (*nc)++ ? " AND " : " WHERE ", col,
             param(p, sizeof p, mark, ++*np, cast));
}

int idem__list_sql(char *buf, size_t n, unsigned shape, const char *cols,
                   const char *table, char mark, const char *text_cast,
                   const char *int_cast) {
  unsigned mask = (shape >> 6) << 1;
  size_t at = 0;
  int nc = 0, np = 0, i, first = 1, bad;
  char a[32], b[32], c[32];
  const char *tc = text_cast;
  bad = put(buf, n, &at, "SELECT %s FROM %s", cols, table);
  if (!bad && (shape & IDEM__BY_SESSION))
    bad = put_eq(buf, n, &at, &nc, "session", mark, tc, &np);
  if (!bad && (shape & IDEM__BY_FENCE))
    bad = put_eq(buf, n, &at, &nc, "fence_key", mark, tc, &np) ||
          /* the words of the fence index's WHERE let it be used */
          put(buf, n, &at, " AND fence_key IS NOT NULL");
  if (!bad && (shape & IDEM__BY_CALL))
    bad = put_eq(buf, n, &at, &nc, "call_id", mark, tc, &np);
  if (!bad && (shape & IDEM__BY_KEY))
    bad = put_eq(buf, n, &at, &nc, "key", mark, tc, &np);
  if (!bad && (shape & IDEM__BY_TOOL))
    bad = put_eq(buf, n, &at, &nc, "tool", mark, tc, &np);
  if (!bad && (shape & IDEM__BY_AFTER)) {
    param(a, sizeof a, mark, ++np, int_cast);
    param(b, sizeof b, mark, ++np, tc);
    param(c, sizeof c, mark, ++np, tc);
    bad = put(buf, n, &at, "%s(created, session, call_id) > (%s, %s, %s)",
              nc++ ? " AND " : " WHERE ", a, b, c);
  }
  if (!bad && mask) {
    /* the words of the live index's WHERE let it be used */
    bad = put(buf, n, &at, "%s%sstate IN (", nc++ ? " AND " : " WHERE ",
              mask & ~LIVE_MASK ? "" : "state IN (1, 5) AND ");
    for (i = IDEM_STATE_PENDING; !bad && i <= IDEM_STATE_DEDUPLICATED; i++)
      if (mask & (1u << i)) {
        bad = put(buf, n, &at, "%s%d", first ? "" : ", ", i);
        first = 0;
      }
    if (!bad) bad = put(buf, n, &at, ")");
  }
  param(a, sizeof a, mark, ++np, int_cast);
  if (!bad)
    bad = put(buf, n, &at, " ORDER BY created, session, call_id LIMIT %s", a);
  return bad ? IDEM_RANGE : IDEM_OK;
}

void idem__list_params_of(const idem__filter *f, idem__list_params *p) {
  memset(p, 0, sizeof *p);
  p->after = -1;
  if (f->session) p->v[p->n++] = f->session;
  if (f->fence_key) p->v[p->n++] = f->fence_key;
  if (f->call_id) p->v[p->n++] = f->call_id;
  if (f->key) p->v[p->n++] = f->key;
  if (f->tool) p->v[p->n++] = f->tool;
  if (f->after_created > 0) {
    p->after = p->n;
    p->after_created = f->after_created;
    snprintf(p->num[0], sizeof p->num[0], "%lld", f->after_created);
    p->v[p->n++] = p->num[0];
    p->v[p->n++] = f->after_session ? f->after_session : "";
    p->v[p->n++] = f->after_call_id ? f->after_call_id : "";
  }
  p->limit = f->limit && f->limit < (size_t)LLONG_MAX ? (long long)f->limit
                                                       : -1;
  if (p->limit >= 0)
    snprintf(p->num[1], sizeof p->num[1], "%lld", p->limit);
  p->v[p->n++] = p->limit >= 0 ? p->num[1] : NULL;
}

/* The first "password" in s, in any case, or NULL. */
static const char *find_password(const char *s) {
  for (; *s; s++)
    if (strncasecmp(s, "password", 8) == 0) return s;
  return NULL;
}

/* url for a message, with any user:password@ between "//" and the host
** hidden: a connection string may carry a password.  So may its query
** string (?password=...) or a keyword/value string (password=...): that
** part is cut off. */
static const char *shown(const char *url, char *buf, size_t size) {
  const char *auth = strstr(url, "//"), *at, *end, *pw = find_password(url);
  size_t keep;
  if (!auth) {
    if (!pw) return url;
    snprintf(buf, size, "%.*s***", (int)(pw - url), url);
    return buf;
  }
  auth += 2;
  end = auth + strcspn(auth, "/?#");
  for (at = end; at > auth && at[-1] != '@'; at--) {
  }
  keep = pw ? (size_t)(pw - url) : strlen(url);
  if (at == auth && !pw) return url;
  if (at == auth)
    snprintf(buf, size, "%.*s***", (int)keep, url);
  else if (pw && pw > at)
    snprintf(buf, size, "%.*s***@%.*s***", (int)(auth - url), url,
             (int)(pw - at), at);
  else
    snprintf(buf, size, "%.*s***@%s", (int)(auth - url), url, at);
  return buf;
}

void idem__store_shown_url(const char *url, char *buf, size_t size) {
  const char *s = shown(url, buf, size);
  if (s != buf) snprintf(buf, size, "%s", s);
}
