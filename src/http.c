/*
** http.c - HTTP tools over libcurl (docs/POLICY.md, "http").
**
** One easy handle per request: a tool call is a rare, slow event next to
** the guard's own work, and a fresh connection makes "was anything sent?"
** a question about this request alone (CURLINFO_REQUEST_SIZE).  Redirects
** are not followed (a redirected POST is a different request); only http
** and https are spoken.  The whole request - connection, sending, waiting,
** reading - is bounded by the guard's deadline (CURLOPT_TIMEOUT_MS).
**
** libcurl is not linked: it brings some thirty libraries of its own that
** every start of idem would load, though few commands make HTTP calls.
** The first request loads "libcurl.so.4" (or the file $IDEM_LIBCURL names)
** with dlopen and runs curl_global_init, once per process (src/dl.c), into
** the table curl; the #defines after it send this file's curl_* calls
** through the table.  Without it, `idem call` fails before its guard
** begins (cli_http_load: no record, nothing sent), and a status check
** over HTTP answers UNKNOWN (the action stays in doubt) with the reason.
*/
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* curl.h wraps curl_easy_setopt and curl_easy_getinfo in macros (gcc's
** type checks of the option's value) that call the functions by name; here
** those names are table entries, so the wrappers go (they are #undef'd). */
#define CURL_DISABLE_TYPECHECK
#include <curl/curl.h>
#include <jansson.h>

#include "http.h"
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

int cli_http_load(char *err, size_t errn) {
  const char *missing = idem__dl_need(&libcurl);
  if (!missing) return 0;
  snprintf(err, errn, "HTTP tools need %s", missing);
  return -1;
}

/* ---- templates ------------------------------------------------------------- */

static int put(idem__buf *b, const char *p, size_t n) {
  return idem__buf_append(b, p, n);
}

static int put_pct(idem__buf *b, const char *p, size_t n) {
  static const char hex[] = "0123456789ABCDEF";
  size_t i;
  int rc = 0;
  for (i = 0; i < n && !rc; i++) {
    unsigned char ch = (unsigned char)p[i];
    if (isalnum(ch) || ch == '-' || ch == '.' || ch == '_' || ch == '~') {
      rc = put(b, p + i, 1);
    } else {
      char e[3] = {'%', hex[ch >> 4], hex[ch & 15]};
      rc = put(b, e, 3);
    }
  }
  return rc;
}

/* Append value v, percent-encoded for a URL or checked for a header. */
static int put_value(idem__buf *b, const char *v, size_t n, int url,
                     const char *what, char *err, size_t errn) {
  size_t i;
  if (url) return put_pct(b, v, n);
  for (i = 0; i < n; i++)
    if (v[i] == '\r' || v[i] == '\n' || v[i] == '\0') {
      snprintf(err, errn, "%s holds a line break, which cannot go in a header",
               what);
      return -1;
    }
  return put(b, v, n);
}

/* Append template tmpl filled to b (whose cap bounds it: IDEM_RANGE);
** 0, or nonzero with the reason in err (except for IDEM_RANGE and
** IDEM_NOMEM, which the caller words). */
static int fill_into(idem__buf *b, const char *tmpl, int url, const char *args,
                     size_t args_len, const char *key, char *err, size_t errn) {
  json_t *obj = NULL;
  const char *p = tmpl, *open, *close;
  char what[300];
  int rc = 0;
  while (!rc && (open = strchr(p, '{')) && (close = strchr(open, '}'))) {
    const char *name = open + 1;
    size_t n = (size_t)(close - name);
    rc = put(b, p, (size_t)(open - p));
    p = close + 1;
    if (rc) break;
    snprintf(what, sizeof what, "{%.*s}", (int)(n < 200 ? n : 200), name);
    if (n == 4 && memcmp(name, "$key", 4) == 0) {
      if (!key) {
        snprintf(err, errn, "%s: this call has no key", what);
        rc = -1;
      } else {
        rc = put_value(b, key, strlen(key), url, what, err, errn);
      }
    } else if (n > 5 && memcmp(name, "$env:", 5) == 0) {
      char var[256];
      const char *v;
      snprintf(var, sizeof var, "%.*s", (int)(n - 5), name + 5);
      if (!(v = getenv(var))) {
        snprintf(err, errn, "%s: the environment variable %s is not set", what,
                 var);
        rc = -1;
      } else {
        rc = put_value(b, v, strlen(v), 0, what, err, errn);
      }
    } else {
      json_t *v;
      char *text = NULL;
      if (!obj) {
        json_error_t jerr;
        obj = json_loadb(args ? args : "{}", args ? args_len : 2, 0, &jerr);
        if (!json_is_object(obj)) {
          snprintf(err, errn, "the arguments are not a JSON object");
          rc = -1;
          break;
        }
      }
      v = json_object_getn(obj, name, n);
      if (!v) {
        snprintf(err, errn, "%s: the call has no argument of that name", what);
        rc = -1;
      } else if (json_is_string(v)) {
        rc = put_value(b, json_string_value(v), json_string_length(v), url,
                       what, err, errn);
      } else if (json_is_object(v) || json_is_array(v)) {
        snprintf(err, errn,
                 "%s: the argument is an %s; only a string, a "
                 "number, true, false or null fills a template",
                 what, json_is_object(v) ? "object" : "array");
        rc = -1;
      } else if (!(text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT))) {
        rc = IDEM_NOMEM;
      } else {
        rc = put_value(b, text, strlen(text), url, what, err, errn);
        free(text);
      }
    }
  }
  if (!rc) rc = put(b, p, strlen(p));
  json_decref(obj);
  return rc;
}

char *cli_http_fill(const char *tmpl, int url, const char *args,
                    size_t args_len, const char *key, char *err, size_t errn) {
  idem__buf b;
  char *out = NULL;
  int rc;
  idem__buf_init(&b, CLI_HTTP_MAX_FILLED);
  rc = fill_into(&b, tmpl, url, args, args_len, key, err, errn);
  if (!rc) rc = put(&b, "", 1);
  if (rc == IDEM_RANGE)
    snprintf(err, errn, "the template filled is longer than %zu bytes",
             CLI_HTTP_MAX_FILLED - 1);
  else if (rc == IDEM_NOMEM || (!rc && !(out = malloc(b.len))))
    snprintf(err, errn, "out of memory");
  else if (!rc)
    memcpy(out, b.p, b.len);
  idem__buf_free(&b);
  return out;
}

/* The header line "NAME: VALUE", the value template tmpl filled, into b
** (reset first), NUL-terminated.  A header goes out whole or the request
** does not go out: a line longer than CLI_HTTP_MAX_HEADER is an error
** that names the header and the tool, before anything is sent. */
static int header_line(idem__buf *b, const char *tool, const char *name,
                       const char *tmpl, const char *args, size_t args_len,
                       const char *key, char *err, size_t errn) {
  int rc;
  idem__buf_free(b);
  idem__buf_init(b, CLI_HTTP_MAX_HEADER + 1);
  rc = put(b, name, strlen(name));
  if (!rc) rc = put(b, ": ", 2);
  if (!rc) rc = fill_into(b, tmpl, 0, args, args_len, key, err, errn);
  if (!rc) rc = put(b, "", 1);
  if (rc == IDEM_RANGE)
    snprintf(err, errn,
             "the header %.100s of tool %.100s is longer than %zu bytes "
             "(its name, \": \" and its value): the request was not sent",
             name, tool ? tool : "(none)", CLI_HTTP_MAX_HEADER);
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
static void excerpt(const cli_http_answer *a, char *out, size_t n) {
  size_t i, k = 0;
  for (i = 0; a->body && i < a->body_len && k + 1 < n && i < 200; i++) {
    unsigned char ch = (unsigned char)a->body[i];
    if (ch == '\n' || ch == '\r') break;
    out[k++] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
  }
  out[k] = '\0';
}

void cli_http_classify(const idem__http_rule *h, int sent, int failed,
                       const char *transport_error, cli_http_answer *a) {
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
               st, CLI_HTTP_MAX_BODY);
    return;
  }
  if (st == 409)
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

/* ---- the request ---------------------------------------------------------- */

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
  cli_http_answer *a = ud;
  size_t len = size * n, room = CLI_HTTP_MAX_BODY - a->body_len;
  char *nb;
  if (len > room) {
    a->truncated = 1;
    len = room;
  }
  if (len) {
    if (!(nb = realloc(a->body, a->body_len + len + 1))) return 0;
    a->body = nb;
    memcpy(a->body + a->body_len, p, len);
    a->body_len += len;
    a->body[a->body_len] = '\0';
  }
  return size * n; /* keep reading (and discarding) past the limit */
}

int cli_http_request(const idem__http_rule *h, const char *tool,
                     const char *key, const char *args, size_t args_len,
                     long long timeout_ms, cli_http_answer *a) {
  struct curl_slist *hdrs = NULL, *nh;
  char *url, cerr[CURL_ERROR_SIZE];
  idem__buf line;
  CURL *e = NULL;
  CURLcode rc;
  curl_off_t sent = 0;
  size_t i;
  int failed = 0;

  memset(a, 0, sizeof *a);
  if (cli_http_load(a->error, sizeof a->error)) {
    a->outcome = IDEM_OUTCOME_NOT_APPLIED; /* nothing sent; may work later */
    return -1;
  }
  a->outcome = IDEM_OUTCOME_REJECTED;
  url =
      cli_http_fill(h->url, 1, args, args_len, key, a->error, sizeof a->error);
  if (!url) return -1;
  idem__buf_init(&line, 0);
  for (i = 0; i < h->nheaders; i++) {
    if (header_line(&line, tool, h->hname[i], h->hvalue[i], args, args_len, key,
                    a->error, sizeof a->error))
      goto fail;
    if (!(nh = curl_slist_append(hdrs, line.p))) goto nomem;
    hdrs = nh;
  }
  if (h->key_header && key) {
    if (header_line(&line, tool, h->key_header, "{$key}", NULL, 0, key,
                    a->error, sizeof a->error))
      goto fail;
    if (!(nh = curl_slist_append(hdrs, line.p))) goto nomem;
    hdrs = nh;
  }
  idem__buf_free(&line);
  if (h->send_body) {
    if (!(nh = curl_slist_append(hdrs, "Content-Type: application/json")))
      goto nomem;
    hdrs = nh;
  }
  if (!(nh = curl_slist_append(hdrs, "Accept: application/json"))) goto nomem;
  hdrs = nh;
  /* no "Expect: 100-continue" round trip for large bodies */
  if (!(nh = curl_slist_append(hdrs, "Expect:"))) goto nomem;
  hdrs = nh;

  if (!(e = curl_easy_init())) goto nomem;
  cerr[0] = '\0';
  curl_easy_setopt(e, CURLOPT_URL, url);
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
  cli_http_classify(h, sent > 0, failed,
                    failed ? (*cerr ? cerr : curl_easy_strerror(rc)) : NULL, a);
  curl_easy_cleanup(e);
  curl_slist_free_all(hdrs);
  free(url);
  return 0;
nomem:
  snprintf(a->error, sizeof a->error, "out of memory");
fail:
  idem__buf_free(&line);
  curl_easy_cleanup(e);
  curl_slist_free_all(hdrs);
  free(url);
  a->outcome = IDEM_OUTCOME_REJECTED;
  return -1;
}

void cli_http_answer_free(cli_http_answer *a) {
  if (!a) return;
  free(a->body);
  a->body = NULL;
  a->body_len = 0;
}
