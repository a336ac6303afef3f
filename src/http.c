/*
** http.c - HTTP tools over libcurl (docs/POLICY.md, "http"), in libidem.
**
** One easy handle per request: a tool call is a rare, slow event next to
** the guard's own work, and a fresh connection makes "was anything sent?"
** a question about this request alone (CURLINFO_REQUEST_SIZE).  Redirects
** are not followed (a redirected POST is a different request); only http
** and https are spoken.  The whole request - connection, sending, waiting,
** reading - is bounded by the guard's deadline (CURLOPT_TIMEOUT_MS).  The
** URL and the header values are the policy's templates, filled by the
** library's one template engine (template.c): an argument goes in as its
** canonical RFC 8785 text, the same text its fingerprint was taken of.  An
** argument never leaves its path segment: the fill refuses "." and ".."
** (libcurl would resolve "/v1/customers/../refunds" to "/v1/refunds"),
** before anything is sent, and the path goes out as it was checked
** (CURLOPT_PATH_AS_IS).  A header value holds no control character but a
** tab.
**
** libcurl is not linked: it brings some thirty libraries of its own that
** every program loading libidem.so would map at start, though few make
** HTTP calls.  The first request (or idem__http_missing) loads
** "libcurl.so.4" (or the file $IDEM_LIBCURL names) with dlopen and runs
** curl_global_init, once per process (src/dl.c), into the table curl; the
** #defines after it send this file's curl_* calls through the table.
** Without it, idem_guard_run fails before its guard begins (no record,
** nothing sent), and a status check over HTTP answers UNKNOWN (the action
** stays in doubt) with the reason.
**
** Built without HTTP support (IDEM_HTTP 0: the CMake option IDEM_HTTP is
** OFF, or libcurl's headers were missing), nothing here includes curl.h:
** the classification stays (the fuzz target drives it), and every request
** fails, before anything is sent, with "built without HTTP support".
*/
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

#if IDEM_HTTP
/* curl.h wraps curl_easy_setopt and curl_easy_getinfo in macros (gcc's
** type checks of the option's value) that call the functions by name; here
** those names are table entries, so the wrappers go (they are #undef'd). */
#define CURL_DISABLE_TYPECHECK
#include <curl/curl.h>

#include "idem_version.h"

/* ---- libcurl, loaded on first use (src/dl.c) ------------------------------- */

#define CURL_FUNCS(X)                                                          \
  X(curl_global_init) X(curl_easy_init) X(curl_easy_setopt)                    \
  X(curl_easy_perform) X(curl_easy_getinfo) X(curl_easy_strerror)              \
  X(curl_easy_cleanup) X(curl_slist_append) X(curl_slist_free_all)

static IDEM__DL_TABLE(CURL_FUNCS) curl;
static const char *const curl_names[] = {CURL_FUNCS(IDEM__DL_NAME)};

static int curl_init(char *err, size_t errn) {
  if (curl.f.curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK) return 0;
  snprintf(err, errn, "libcurl (curl_global_init failed)");
  return -1;
}

static idem__dl_lib libcurl = {.name = "libcurl",
                               .file = "libcurl.so.4",
                               .env = "IDEM_LIBCURL",
                               .package = "libcurl4",
                               .names = curl_names,
                               .sym = curl.sym,
                               .n = sizeof curl_names / sizeof *curl_names,
                               .init = curl_init};

#undef curl_easy_setopt
#undef curl_easy_getinfo
#define curl_easy_init curl.f.curl_easy_init
#define curl_easy_setopt curl.f.curl_easy_setopt
#define curl_easy_perform curl.f.curl_easy_perform
#define curl_easy_getinfo curl.f.curl_easy_getinfo
#define curl_easy_strerror curl.f.curl_easy_strerror
#define curl_easy_cleanup curl.f.curl_easy_cleanup
#define curl_slist_append curl.f.curl_slist_append
#define curl_slist_free_all curl.f.curl_slist_free_all

static pthread_once_t missing_once = PTHREAD_ONCE_INIT;
static char missing[400]; /* written once, under missing_once */

static void find_missing(void) {
  const char *why = idem__dl_need(&libcurl);
  if (why) snprintf(missing, sizeof missing, "HTTP tools need %s", why);
}

const char *idem__http_missing(void) {
  pthread_once(&missing_once, find_missing);
  return missing[0] ? missing : NULL;
}
#else
const char *idem__http_missing(void) {
  return "this libidem was built without HTTP support (the CMake option "
         "IDEM_HTTP was off, or libcurl's headers were missing): rebuild it "
         "with libcurl's headers (libcurl4-openssl-dev) to run HTTP tools";
}
#endif

/* ---- templates (template.c) ------------------------------------------------- */

/* Bind args into c for the fills: 0, or -1 with the reason in err. */
static int bind_args(idem_canon *c, const char *args, size_t args_len,
                     char *err, size_t errn) {
  int rc = idem__tmpl_args(c, args, args_len);
  if (rc == IDEM_NOMEM)
    snprintf(err, errn, "out of memory");
  else if (rc)
    snprintf(err, errn, "the arguments: %s", idem_canon_errmsg(c));
  return rc;
}

/* Append template tmpl filled from the arguments bound in c to b, with a
** NUL; IDEM_RANGE (b's cap) and IDEM_NOMEM are left to the caller to word. */
static int fill_bound(const idem_canon *c, idem__buf *b, const char *tmpl,
                      int url, const char *key, char *err, size_t errn) {
  int rc = idem__tmpl_text(c, b, tmpl, url ? IDEM__TMPL_URL : IDEM__TMPL_HEADER,
                           key, err, errn);
  return rc ? rc : idem__buf_append(b, "", 1);
}

int idem__http_fill(idem__buf *b, const char *tmpl, int url, const char *args,
                    size_t args_len, const char *key, char *err, size_t errn) {
  idem_canon *c = NULL;
  int rc;
  idem__buf_free(b);
  idem__buf_init(b, IDEM__HTTP_MAX_FILLED);
  err[0] = '\0';
  if ((rc = idem_canon_open(&c)) == IDEM_OK &&
      (rc = bind_args(c, args, args_len, err, errn)) == IDEM_OK)
    rc = fill_bound(c, b, tmpl, url, key, err, errn);
  idem_canon_close(c);
  if (rc == IDEM_RANGE)
    snprintf(err, errn, "the template filled is longer than %zu bytes",
             IDEM__HTTP_MAX_FILLED - 1);
  else if (rc == IDEM_NOMEM)
    snprintf(err, errn, "out of memory");
  return rc;
}

/* ---- what an answer means ---------------------------------------------------- */

static const char *outcome_word(int o) {
  switch (o) {
  case IDEM_OUTCOME_NOT_APPLIED: return "not applied";
  case IDEM_OUTCOME_REJECTED: return "rejected";
  default: return "unknown";
  }
}

/* The first line or 200 bytes of the body, printable, for messages. */
static void excerpt(const idem__http_answer *a, char *out, size_t n) {
  size_t i, k = 0;
  for (i = 0; a->body && i < a->body_len && k + 1 < n && i < 200; i++) {
    unsigned char ch = (unsigned char)a->body[i];
    if (ch == '\n' || ch == '\r') break;
    out[k++] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
  }
  out[k] = '\0';
}

void idem__http_classify(const idem__http_rule *h, int sent, int failed,
                         const char *transport_error, idem__http_answer *a) {
  char ex[208];
  long st = a->status;
  a->error[0] = '\0';
  if (failed && st == 0) {
    a->outcome = sent ? IDEM_OUTCOME_UNKNOWN : IDEM_OUTCOME_NOT_APPLIED;
    snprintf(a->error, sizeof a->error, "%s (%s)",
             transport_error ? transport_error : "transport error",
             sent ? "after the request was sent: the outcome is unknown"
                  : "nothing was sent");
    return;
  }
  excerpt(a, ex, sizeof ex);
  if (st >= 200 && st <= 299) {
    a->outcome = IDEM_OUTCOME_APPLIED;
    if (a->truncated)
      snprintf(a->error, sizeof a->error,
               "HTTP %ld: the response was longer than %zu bytes and was cut",
               st, IDEM__HTTP_MAX_BODY);
    return;
  }
  /* a 408, 409, 429 or 5xx ended the exchange but says nothing of the
  ** effect, unless the policy says what it means (SPEC §6a); a 408 has no
  ** on_ of its own: a proxy or the server gave up waiting, and what it had
  ** read may be at work already */
  if (st == 408)
    a->outcome = IDEM_OUTCOME_UNKNOWN;
  else if (st == 409)
    a->outcome = h ? h->on_409 : IDEM_OUTCOME_UNKNOWN;
  else if (st == 429)
    a->outcome = h ? h->on_429 : IDEM_OUTCOME_UNKNOWN;
  else if (st >= 500 && st <= 599)
    a->outcome = h ? h->on_5xx : IDEM_OUTCOME_UNKNOWN;
  else if (st >= 400 && st <= 499)
    a->outcome = IDEM_OUTCOME_REJECTED;
  else
    a->outcome = IDEM_OUTCOME_UNKNOWN;
  snprintf(a->error, sizeof a->error, "HTTP %ld (%s)%s%s%s", st,
           outcome_word(a->outcome), *ex ? ": " : "", ex,
           failed ? "; the connection then failed" : "");
}

void idem__http_answer_free(idem__http_answer *a) {
  if (!a) return;
  idem__free(a->body);
  a->body = NULL;
  a->body_len = 0;
}

/* ---- the request ---------------------------------------------------------- */

#if IDEM_HTTP
/* The header line "NAME: VALUE", the value template tmpl filled from the
** arguments bound in c, into b (reset first), NUL-terminated.  A header
** goes out whole or the request does not go out: a line longer than
** IDEM__HTTP_MAX_HEADER is an error that names the header and the tool,
** before anything is sent. */
static int header_line(const idem_canon *c, idem__buf *b, const char *tool,
                       const char *name, const char *tmpl, const char *key,
                       char *err, size_t errn) {
  int rc;
  idem__buf_free(b);
  idem__buf_init(b, IDEM__HTTP_MAX_HEADER + 1);
  rc = idem__buf_append(b, name, strlen(name));
  if (!rc) rc = idem__buf_append(b, ": ", 2);
  if (!rc) rc = fill_bound(c, b, tmpl, 0, key, err, errn);
  if (rc == IDEM_RANGE)
    snprintf(err, errn,
             "the header %.100s of tool %.100s is longer than %zu bytes "
             "(its name, \": \" and its value): the request was not sent",
             name, tool ? tool : "(none)", IDEM__HTTP_MAX_HEADER);
  else if (rc == IDEM_NOMEM)
    snprintf(err, errn, "out of memory");
  return rc;
}

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
  idem__http_answer *a = ud;
  size_t len = size * n, room = IDEM__HTTP_MAX_BODY - a->body_len;
  char *nb;
  if (len > room) {
    a->truncated = 1;
    len = room;
  }
  if (len) {
    if (!(nb = idem__realloc(a->body, a->body_len + len + 1))) return 0;
    a->body = nb;
    memcpy(a->body + a->body_len, p, len);
    a->body_len += len;
    a->body[a->body_len] = '\0';
  }
  return size * n; /* keep reading (and discarding) past the limit */
}

/* Append a header line to *hdrs; -1 when memory ran out. */
static int add_header(struct curl_slist **hdrs, const char *line) {
  struct curl_slist *nh = curl_slist_append(*hdrs, line);
  if (!nh) return -1;
  *hdrs = nh;
  return 0;
}

int idem__http_request(const idem__http_rule *h, const char *tool,
                       const char *key, const char *args, size_t args_len,
                       long long timeout_ms, idem__http_answer *a) {
  struct curl_slist *hdrs = NULL;
  char cerr[CURL_ERROR_SIZE];
  idem_canon *c = NULL;
  idem__buf url, line;
  const char *why;
  CURL *e = NULL;
  CURLcode rc;
  curl_off_t sent = 0;
  size_t i;
  int failed = 0;

  memset(a, 0, sizeof *a);
  if ((why = idem__http_missing()) != NULL) {
    snprintf(a->error, sizeof a->error, "%s", why);
    a->outcome = IDEM_OUTCOME_NOT_APPLIED; /* nothing sent; may work later */
    return -1;
  }
  a->outcome = IDEM_OUTCOME_REJECTED;
  idem__buf_init(&url, IDEM__HTTP_MAX_FILLED);
  idem__buf_init(&line, 0);
  if (idem_canon_open(&c) != IDEM_OK) goto nomem;
  if (bind_args(c, args, args_len, a->error, sizeof a->error)) goto fail;
  switch (fill_bound(c, &url, h->url, 1, key, a->error, sizeof a->error)) {
  case IDEM_OK: break;
  case IDEM_RANGE:
    snprintf(a->error, sizeof a->error,
             "the URL of tool %.100s filled is longer than %zu bytes: the "
             "request was not sent",
             tool ? tool : "(none)", IDEM__HTTP_MAX_FILLED - 1);
    goto fail;
  case IDEM_NOMEM: goto nomem;
  default: goto fail;
  }
  for (i = 0; i < h->nheaders; i++) {
    if (header_line(c, &line, tool, h->hname[i], h->hvalue[i], key, a->error,
                    sizeof a->error))
      goto fail;
    if (add_header(&hdrs, line.p)) goto nomem;
  }
  if (h->key_header && key) {
    if (header_line(c, &line, tool, h->key_header, "{$key}", key, a->error,
                    sizeof a->error))
      goto fail;
    if (add_header(&hdrs, line.p)) goto nomem;
  }
  if (h->send_body && add_header(&hdrs, "Content-Type: application/json"))
    goto nomem;
  if (add_header(&hdrs, "Accept: application/json")) goto nomem;
  /* no "Expect: 100-continue" round trip for large bodies */
  if (add_header(&hdrs, "Expect:")) goto nomem;

  if (!(e = curl_easy_init())) goto nomem;
  cerr[0] = '\0';
  curl_easy_setopt(e, CURLOPT_URL, url.p);
  /* the path goes out as it was filled and checked: the fill refuses a
  ** dot segment (template.c), and libcurl rewrites none */
  curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 1L);
  curl_easy_setopt(e, CURLOPT_USERAGENT, "idem/" IDEM_VERSION_STRING);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, cerr);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, a);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS,
                   (long)(timeout_ms > 0 ? timeout_ms : 1));
  if (strcmp(h->method, "GET") == 0) {
    curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
  } else if (h->send_body) {
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, args ? args : "{}");
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE,
                     (curl_off_t)(args ? args_len : 2));
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, h->method);
  } else {
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, h->method);
  }
  rc = curl_easy_perform(e);
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &a->status);
  curl_easy_getinfo(e, CURLINFO_REQUEST_SIZE, &sent);
  if (rc != CURLE_OK) {
    failed = 1;
    if (rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_RESOLVE_PROXY ||
        rc == CURLE_COULDNT_CONNECT)
      sent = 0;
  }
  idem__http_classify(h, sent > 0, failed,
                      failed ? (*cerr ? cerr : curl_easy_strerror(rc)) : NULL,
                      a);
  curl_easy_cleanup(e);
  curl_slist_free_all(hdrs);
  idem__buf_free(&url);
  idem__buf_free(&line);
  idem_canon_close(c);
  return 0;
nomem:
  snprintf(a->error, sizeof a->error, "out of memory");
fail:
  curl_slist_free_all(hdrs);
  idem__buf_free(&url);
  idem__buf_free(&line);
  idem_canon_close(c);
  idem__http_answer_free(a);
  a->outcome = IDEM_OUTCOME_REJECTED;
  return -1;
}
#else
int idem__http_request(const idem__http_rule *h, const char *tool,
                       const char *key, const char *args, size_t args_len,
                       long long timeout_ms, idem__http_answer *a) {
  (void)h, (void)tool, (void)key, (void)args, (void)args_len, (void)timeout_ms;
  memset(a, 0, sizeof *a);
  snprintf(a->error, sizeof a->error, "%s", idem__http_missing());
  a->outcome = IDEM_OUTCOME_NOT_APPLIED; /* nothing sent */
  return -1;
}
#endif
