/*
** common.c - what the backends share, below the choice of one (store.c):
** the failed store, the deadline of the caller's call, the checks both make
** of what they are given, and a URL as messages show it.
**
** Opening reports its failure through the store's own errmsg, so a store
** that could not be opened is still an object: a "failed store" whose
** errmsg holds the reason and whose other entry points answer IDEM_MISUSE.
** The caller reads the message and closes it like any other store.
*/
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

void idem_log_shown(const char *url, char *buf, size_t size) {
  if (!buf || !size) return;
  if (!url) {
    buf[0] = '\0';
    return;
  }
  idem__store_shown_url(url, buf, size);
}
