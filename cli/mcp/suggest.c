/*
** suggest.c - `idem mcp --suggest-policy`: ask an MCP server for its tools
** and print a draft policy (draft.c) for a person to read and edit.
**
**   idem mcp --suggest-policy -- COMMAND [ARGS...]
**   idem mcp --suggest-policy [--header 'Name: value']... -- URL
**
** A short conversation of its own, not the gateway's: initialize, then
** notifications/initialized, then tools/list page by page (nextCursor)
** until the last, then goodbye.  The draft goes to stdout, a summary and
** every complaint to stderr.  Nothing is recorded and no tool is called.
**
** Over stdio the server is a child with pipes on its stdin and stdout (its
** stderr is ours), one JSON-RPC message per line.  A ping from the server
** is answered, any other request refused (-32601), notifications and
** stray answers passed over.  Goodbye closes its stdin; a server that has
** not exited GRACE_MS later gets SIGTERM, and SIGKILL after as long again.
**
** Over HTTP (MCP's Streamable HTTP transport) every message is a POST of
** its JSON text with "Accept: application/json, text/event-stream"; an
** answer comes as a JSON body or as the data of the events of an SSE body,
** where it is the message whose id is the request's (other messages on the
** stream are passed over).  The Mcp-Session-Id the initialize answer gives
** goes on every later request with MCP-Protocol-Version, and goodbye is a
** DELETE of the session.  libcurl is loaded the first time a URL is asked
** for (curlfn.h: it maps some thirty libraries that every other run of
** idem should not pay for).  One easy handle, one request at a time;
** redirects are not followed; a URL's user and query are not shown in
** messages.
**
** --header values may hold {$env:NAME}, expanded from the environment
** here (an unset NAME is an error that names it).  A header's value is
** never printed: not in an error about it, and not in the excerpt of an
** HTTP error's body, which is left out when it holds one.
**
** Bounds: every answer within DEADLINE_MS, at most MAX_MESSAGE bytes each;
** at most MAX_PAGES pages and MAX_TOOLS tools; a cursor that comes twice
** is an error (the pages would not end).  Whatever the server sends, the
** draft is a valid policy or there is an error (draft.c).
**
** Exit status: 0 with the draft printed; 2 for a bad command line or a
** header that cannot be filled; 65 when the server's answers are not MCP
** (not JSON, not JSON-RPC, not a list of tools); 1 for anything else (the
** server cannot be started or reached, exits, answers an error or an HTTP
** status other than 2xx, says nothing in time).
*/
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "curlfn.h"
#include "mcp.h"

#define DEADLINE_MS 30000
#define GRACE_MS 2000
#define MAX_MESSAGE ((size_t)16 << 20)
#define MAX_PAGES 1000
#define MAX_TOOLS 100000
#define MAX_HEADERS 64
#define PROTOCOL "2025-06-18"

typedef struct conn {
  const char *where;  /* the server, in words, for messages */
  char where_buf[600];
  const char *method; /* the request being answered, for messages */
  long long next_id;
  int code;           /* the exit status of the error said, or 0 */
  /* stdio */
  pid_t pid;
  int to, from;
  cli_outbuf in;
  /* http */
  int http;
  const char *url;
  char **hdr;         /* "Name: value", filled */
  int nhdr;
  const char *vals[MAX_HEADERS]; /* the values, never to be shown */
  char sid[512];      /* Mcp-Session-Id, or "" */
  char proto[64];
  void *easy;
  cli_outbuf body;
  char ctype[128];
} conn;

/* Say one line (cli_err) and remember its exit status; returns -1. */
static int fail(conn *c, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int fail(conn *c, int code, const char *fmt, ...) {
  char msg[1200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  cli_err("%s", msg);
  c->code = code;
  return -1;
}

/* Text from the server, cut to max bytes and made safe for a terminal. */
static const char *shown(cli_outbuf *o, const char *s, size_t max) {
  char cut[256];
  size_t n = strlen(s);
  if (max > sizeof cut - 4) max = sizeof cut - 4;
  if (n > max) {
    while (max && ((unsigned char)s[max] & 0xC0) == 0x80) max--;
    snprintf(cut, sizeof cut, "%.*s...", (int)max, s);
    s = cut;
  }
  o->len = 0;
  if (cli_text(o, s, 0) || cli_outbuf_put(o, "", 1)) return "?";
  return o->p;
}

/* ---- one answer ------------------------------------------------------------- */

/* What a message the server sent means for the request id: 1 when it is
** its answer (*result set, a new reference), 0 when it is something else,
** -1 after an error was said. */
static int take(conn *c, const char *text, size_t len, long long id,
                json_t **result) {
  mcp_msg m;
  char err[300];
  cli_outbuf o;
  const json_t *e;
  int rc = 0;
  if (mcp_msg_parse(text, len, &m, err, sizeof err))
    return fail(c, EXIT_DATA, "%s answered %s with a message that is not "
                "JSON (%s)", c->where, c->method, err);
  if (m.kind == MCP_INVALID) {
    mcp_msg_free(&m);
    return fail(c, EXIT_DATA, "%s answered %s with JSON that is not a "
                "JSON-RPC 2.0 message", c->where, c->method);
  }
  if (m.kind != MCP_RESPONSE || !json_is_number(m.id) ||
      json_number_value(m.id) != (double)id) {
    if (m.kind == MCP_REQUEST && !c->http) { /* ping, or refused */
      int bad;
      cli_outbuf_init(&o, MAX_MESSAGE);
      if (strcmp(m.method, "ping") == 0)
        bad = cli_outbuf_str(&o, "{\"jsonrpc\":\"2.0\",\"id\":") ||
              cli_outbuf_put(&o, text + m.id_s, m.id_e - m.id_s) ||
              cli_outbuf_str(&o, ",\"result\":{}}\n");
      else
        bad = mcp_put_error(&o, text + m.id_s, m.id_e - m.id_s, -32601,
                            "Method not found: idem mcp --suggest-policy "
                            "answers no requests");
      /* a write that fails: the server is gone, and the read says so */
      if (!bad) (void)cli_write_all(c->to, o.p, o.len);
      cli_outbuf_free(&o);
    }
    mcp_msg_free(&m);
    return 0;
  }
  cli_outbuf_init(&o, 4096);
  if ((e = json_object_get(m.root, "error")) != NULL) {
    const char *msg = json_string_value(json_object_get(e, "message"));
    fail(c, EXIT_FAIL, "%s answered %s with error %lld: %s", c->where,
         c->method,
         (long long)json_number_value(json_object_get(e, "code")),
         msg ? shown(&o, msg, 200) : "(no message)");
    rc = -1;
  } else if (!json_is_object(json_object_get(m.root, "result"))) {
    fail(c, EXIT_DATA, "%s answered %s with a result that is %s, not an "
         "object", c->where, c->method,
         mcp_json_kind(json_object_get(m.root, "result")));
    rc = -1;
  } else {
    *result = json_incref(json_object_get(m.root, "result"));
    rc = 1;
  }
  cli_outbuf_free(&o);
  mcp_msg_free(&m);
  return rc;
}

/* ---- stdio -------------------------------------------------------------------- */

extern char **environ;

/* Start argv with pipes on its stdin and stdout (spawn.c); 0 or an errno. */
static int spawn(conn *c, char **argv) {
  return mcp_spawn(argv, &c->pid, &c->to, &c->from);
}

/* The server's output ended: say how, in words. */
static int server_gone(conn *c) {
  int st = 0;
  pid_t r = 0;
  for (int i = 0; i < 200 && (r = waitpid(c->pid, &st, WNOHANG)) == 0; i++)
    usleep(1000); /* an exiting process closes its files a moment before */
  if (r == c->pid) {
    c->pid = 0;
    if (WIFSIGNALED(st))
      return fail(c, EXIT_FAIL, "%s was killed by signal %d before it "
                  "answered %s", c->where, WTERMSIG(st), c->method);
    return fail(c, EXIT_FAIL, "%s exited with status %d before it answered "
                "%s", c->where, WEXITSTATUS(st), c->method);
  }
  return fail(c, EXIT_FAIL, "%s closed its output before it answered %s",
              c->where, c->method);
}

/* Send one message, and for a request read lines until its answer. */
static int stdio_rpc(conn *c, const char *msg, size_t len, long long id,
                     json_t **result) {
  long long until = cli_mono_ms() + DEADLINE_MS;
  if (cli_write_all(c->to, msg, len) || cli_write_all(c->to, "\n", 1))
    return server_gone(c);
  if (!id) return 0;
  for (;;) {
    char buf[65536], *nl;
    struct pollfd pf = {c->from, POLLIN, 0};
    long long left = until - cli_mono_ms();
    ssize_t k;
    while ((nl = c->in.len ? memchr(c->in.p, '\n', c->in.len) : NULL)) {
      size_t n = (size_t)(nl - c->in.p), line = n;
      int rc;
      if (line && c->in.p[line - 1] == '\r') line--;
      rc = line ? take(c, c->in.p, line, id, result) : 0;
      cli_outbuf_consume(&c->in, n + 1);
      if (rc) return rc < 0 ? -1 : 0;
    }
    if (left <= 0)
      return fail(c, EXIT_FAIL, "%s did not answer %s within %d s", c->where,
                  c->method, DEADLINE_MS / 1000);
    if (poll(&pf, 1, (int)left) < 0 && errno != EINTR)
      return fail(c, EXIT_FAIL, "poll: %s", strerror(errno));
    if (!pf.revents) continue;
    k = read(c->from, buf, sizeof buf);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return server_gone(c);
    if (cli_outbuf_put(&c->in, buf, (size_t)k))
      return fail(c, EXIT_DATA, "%s sent a line longer than %zu bytes in "
                  "answer to %s", c->where, MAX_MESSAGE, c->method);
  }
}

/* Close its stdin, then SIGTERM, then SIGKILL, each after GRACE_MS (a
** server that is gone already: just the pipes). */
static void stdio_end(conn *c) {
  if (c->to >= 0) close(c->to);
  c->to = -1;
  for (int stage = 0; c->pid && stage < 3; stage++) {
    long long until = cli_mono_ms() + GRACE_MS;
    if (stage) kill(c->pid, stage == 1 ? SIGTERM : SIGKILL);
    while (c->pid && (stage == 2 || cli_mono_ms() < until)) {
      pid_t r = waitpid(c->pid, NULL, stage == 2 ? 0 : WNOHANG);
      if (r == c->pid || (r < 0 && errno != EINTR))
        c->pid = 0;
      else if (r == 0)
        usleep(10000);
    }
  }
  if (c->from >= 0) close(c->from);
  c->from = -1;
}

/* ---- HTTP ----------------------------------------------------------------------- */

/* Append a header line to *h; 0, or -1 when memory ran out (*h kept). */
static int add_header(struct curl_slist **h, const char *line) {
  struct curl_slist *t = curl_slist_append(*h, line);
  if (!t) return -1;
  *h = t;
  return 0;
}

static size_t on_body(char *p, size_t size, size_t n, void *ctx) {
  conn *c = ctx;
  return cli_outbuf_put(&c->body, p, size * n) ? 0 : size * n;
}

/* Keep the headers of the answer that matter: the session, the type. */
static size_t on_header(char *p, size_t size, size_t n, void *ctx) {
  conn *c = ctx;
  size_t len = size * n, k;
  char *dst = NULL;
  size_t cap = 0;
  if (len > 15 && strncasecmp(p, "Mcp-Session-Id:", 15) == 0 &&
      strcmp(c->method, "initialize") == 0) {
    dst = c->sid, cap = sizeof c->sid, p += 15, len -= 15;
  } else if (len > 13 && strncasecmp(p, "Content-Type:", 13) == 0) {
    dst = c->ctype, cap = sizeof c->ctype, p += 13, len -= 13;
  }
  if (!dst) return size * n;
  while (len && (*p == ' ' || *p == '\t')) p++, len--;
  while (len && (p[len - 1] == '\r' || p[len - 1] == '\n' ||
                 p[len - 1] == ' '))
    len--;
  k = len < cap - 1 ? len : cap - 1;
  memcpy(dst, p, k);
  dst[k] = '\0';
  return size * n;
}

/* The answer's body, first line, printable, unless it holds a header's
** value (a server may echo the request). */
static const char *excerpt(conn *c, char *out, size_t n) {
  size_t i, k = 0;
  for (i = 0; i < c->body.len && k + 1 < n && i < 200; i++) {
    unsigned char ch = (unsigned char)c->body.p[i];
    if (ch == '\n' || ch == '\r') break;
    out[k++] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
  }
  out[k] = '\0';
  for (int h = 0; h < c->nhdr; h++)
    if (c->vals[h][0] && c->body.len &&
        memmem(c->body.p, c->body.len, c->vals[h], strlen(c->vals[h])))
      return "(the body is not shown: it holds a --header value)";
  return k ? out : "(an empty body)";
}

/* One request: POST msg (or with msg NULL, DELETE); the status, or -1
** after an error was said. */
static long http_do(conn *c, const char *msg, size_t len) {
  struct curl_slist *h = NULL;
  char sid[600], proto[100], cerr[CURL_ERROR_SIZE];
  long status = 0;
  CURLcode rc;
  int err = 0;
  CURL *e = c->easy;
  c->body.len = 0;
  c->ctype[0] = '\0';
  cerr[0] = '\0';
  snprintf(sid, sizeof sid, "Mcp-Session-Id: %s", c->sid);
  snprintf(proto, sizeof proto, "MCP-Protocol-Version: %s", c->proto);
  for (int i = 0; i < c->nhdr; i++) err |= add_header(&h, c->hdr[i]);
  if (msg)
    err |= add_header(&h, "Content-Type: application/json") ||
           add_header(&h, "Accept: application/json, text/event-stream");
  if (c->sid[0]) err |= add_header(&h, sid);
  if (c->proto[0]) err |= add_header(&h, proto);
  err |= add_header(&h, "Expect:"); /* no 100-continue round trip */
  if (err) {
    curl_slist_free_all(h);
    return fail(c, EXIT_FAIL, "out of memory");
  }
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, cerr);
  if (msg) {
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, NULL);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, msg);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
  } else {
    curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "DELETE");
  }
  rc = curl_easy_perform(e);
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, NULL);
  curl_slist_free_all(h);
  if (rc == CURLE_WRITE_ERROR)
    return fail(c, EXIT_DATA, "%s answered %s with more than %zu bytes",
                c->where, c->method, MAX_MESSAGE);
  if (rc != CURLE_OK)
    return fail(c, EXIT_FAIL, "%s did not answer %s: %s", c->where,
                c->method, *cerr ? cerr : curl_easy_strerror(rc));
  return status;
}

/* The status says no: in words. */
static int http_refused(conn *c, long status) {
  char ex[220];
  if (status == 401 || status == 403)
    return fail(c, EXIT_FAIL, "%s answered %s with HTTP %ld: %s", c->where,
                c->method, status,
                c->nhdr ? "a credential given with --header was refused"
                        : "it wants a credential: give it with --header "
                          "'Authorization: Bearer {$env:TOKEN}'");
  if (status >= 300 && status < 400)
    return fail(c, EXIT_FAIL, "%s answered %s with HTTP %ld: redirects are "
                "not followed; give the URL it names", c->where, c->method,
                status);
  return fail(c, EXIT_FAIL, "%s answered %s with HTTP %ld: %s", c->where,
              c->method, status, excerpt(c, ex, sizeof ex));
}

/* The events of an SSE body: the message that answers id, if any. */
static int from_events(conn *c, long long id, json_t **result) {
  cli_outbuf data;
  const char *p = c->body.p ? c->body.p : "", *end = p + c->body.len;
  int rc = 0, other = 0;
  cli_outbuf_init(&data, MAX_MESSAGE);
  while (p <= end && !rc) {
    const char *eol = p;
    size_t n;
    while (eol < end && *eol != '\n' && *eol != '\r') eol++;
    n = (size_t)(eol - p);
    if (n == 0) { /* a blank line (or the end): the event is whole */
      if (data.len && !other) rc = take(c, data.p, data.len - 1, id, result);
      data.len = 0;
      other = 0;
    } else if (n >= 5 && memcmp(p, "data:", 5) == 0) {
      size_t skip = n > 5 && p[5] == ' ' ? 6 : 5;
      if (cli_outbuf_put(&data, p + skip, n - skip) ||
          cli_outbuf_put(&data, "\n", 1))
        rc = fail(c, EXIT_FAIL, "out of memory");
    } else if (n >= 6 && memcmp(p, "event:", 6) == 0) {
      const char *v = p + 6 + (n > 6 && p[6] == ' ');
      other = !((size_t)(eol - v) == 7 && memcmp(v, "message", 7) == 0);
    }
    if (eol >= end) {
      if (data.len && !other && !rc)
        rc = take(c, data.p, data.len - 1, id, result);
      break;
    }
    p = eol + (eol[0] == '\r' && eol + 1 < end && eol[1] == '\n' ? 2 : 1);
  }
  cli_outbuf_free(&data);
  if (rc == 0)
    return fail(c, EXIT_DATA, "%s ended its event stream without the answer "
                "to %s", c->where, c->method);
  return rc < 0 ? -1 : 0;
}

static int http_rpc(conn *c, const char *msg, size_t len, long long id,
                    json_t **result) {
  long status = http_do(c, msg, len);
  if (status < 0) return -1;
  if (status < 200 || status > 299) return http_refused(c, status);
  if (!id) return 0; /* a notification: 202 Accepted, or any 2xx */
  if (strncasecmp(c->ctype, "text/event-stream", 17) == 0)
    return from_events(c, id, result);
  if (strncasecmp(c->ctype, "application/json", 16) == 0) {
    int rc = take(c, c->body.p ? c->body.p : "", c->body.len, id, result);
    return rc > 0 ? 0
           : rc < 0
               ? -1
               : fail(c, EXIT_DATA, "%s answered %s with a message that is "
                      "not its answer", c->where, c->method);
  }
  return fail(c, EXIT_DATA, "%s answered %s with HTTP %ld and Content-Type "
              "\"%s\", not JSON or an event stream", c->where, c->method,
              status, c->ctype[0] ? c->ctype : "(none)");
}

static int http_start(conn *c) {
  const char *why = cli_curl_need();
  CURL *e;
  if (why) return fail(c, EXIT_FAIL, "a URL needs %s", why);
  if (!(e = curl_easy_init())) return fail(c, EXIT_FAIL, "out of memory");
  c->easy = e;
  curl_easy_setopt(e, CURLOPT_URL, c->url);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)DEADLINE_MS);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, c);
  {
    char ua[64];
    snprintf(ua, sizeof ua, "idem/%s", idem_version());
    curl_easy_setopt(e, CURLOPT_USERAGENT, ua); /* copied by libcurl */
  }
  return 0;
}

static void http_end(conn *c) {
  if (!c->easy) return;
  if (c->sid[0]) { /* goodbye; any answer will do (405: no DELETE here) */
    int code = c->code;
    c->method = "the end of the session (DELETE)";
    curl_easy_setopt(c->easy, CURLOPT_TIMEOUT_MS, (long)GRACE_MS);
    http_do(c, NULL, 0);
    c->code = code; /* said, but the draft stands */
  }
  curl_easy_cleanup(c->easy);
  c->easy = NULL;
}

/* ---- the conversation ------------------------------------------------------------- */

/* Send method with params (a reference taken; NULL: none); for a request
** (note 0) *result is its answer's result. */
static int rpc(conn *c, const char *method, json_t *params, int note,
               json_t **result) {
  long long id = note ? 0 : ++c->next_id;
  json_t *m = json_pack("{s:s,s:s}", "jsonrpc", "2.0", "method", method);
  char *text;
  int rc;
  if (m && !note) json_object_set_new(m, "id", json_integer(id));
  if (m && params) json_object_set_new(m, "params", params);
  else json_decref(params);
  text = m ? json_dumps(m, JSON_COMPACT) : NULL;
  json_decref(m);
  if (!text) return fail(c, EXIT_FAIL, "out of memory");
  c->method = method;
  rc = c->http ? http_rpc(c, text, strlen(text), id, result)
               : stdio_rpc(c, text, strlen(text), id, result);
  free(text);
  return rc;
}

static int initialize(conn *c) {
  json_t *r = NULL;
  const char *v;
  json_t *p = json_pack("{s:s,s:{},s:{s:s,s:s}}", "protocolVersion", PROTOCOL,
                        "capabilities", "clientInfo", "name",
                        "idem-suggest-policy", "version", idem_version());
  if (rpc(c, "initialize", p, 0, &r)) return -1;
  v = json_string_value(json_object_get(r, "protocolVersion"));
  snprintf(c->proto, sizeof c->proto, "%s",
           v && strlen(v) < sizeof c->proto && !strpbrk(v, "\r\n") ? v
                                                                   : PROTOCOL);
  json_decref(r);
  return rpc(c, "notifications/initialized", NULL, 1, NULL);
}

/* Every page of tools/list, their tools in one array (*all). */
static int list_tools(conn *c, json_t **all) {
  json_t *seen = json_object(); /* the cursors given so far */
  char *cursor = NULL;
  int pages = 0, rc = -1;
  if (!(*all = json_array()) || !seen) {
    json_decref(seen);
    return fail(c, EXIT_FAIL, "out of memory");
  }
  for (;;) {
    json_t *r = NULL, *tools, *next;
    const char *why = NULL;
    if (rpc(c, "tools/list", cursor ? json_pack("{s:s}", "cursor", cursor)
                                    : NULL, 0, &r))
      break;
    tools = json_object_get(r, "tools");
    next = json_object_get(r, "nextCursor");
    if (!json_is_array(tools))
      fail(c, EXIT_DATA, "%s answered tools/list without a list of tools "
           "(\"tools\" is %s)", c->where, mcp_json_kind(tools));
    else if (json_array_size(*all) + json_array_size(tools) > MAX_TOOLS)
      fail(c, EXIT_DATA, "%s lists more than %d tools", c->where, MAX_TOOLS);
    else if (json_array_extend(*all, tools))
      fail(c, EXIT_FAIL, "out of memory");
    else if (!next || json_is_null(next))
      rc = 0; /* the last page */
    else if (!json_is_string(next))
      why = "a nextCursor that is not a string";
    else if (++pages >= MAX_PAGES)
      why = "more than 1000 pages";
    else if (json_object_get(seen, json_string_value(next)))
      why = "a nextCursor that came before";
    else {
      free(cursor);
      if (!(cursor = strdup(json_string_value(next))) ||
          json_object_set(seen, cursor, json_true()))
        fail(c, EXIT_FAIL, "out of memory");
      else {
        json_decref(r);
        continue;
      }
    }
    if (why)
      fail(c, EXIT_DATA, "%s gives tools/list pages that do not end (%s)",
           c->where, why);
    json_decref(r);
    break;
  }
  free(cursor);
  json_decref(seen);
  return rc;
}

/* ---- the command --------------------------------------------------------------------- */

/* Fill a --header: check its name, expand {$env:NAME} in its value.  0, or
** an error said (naming the header and the variable, never a value). */
static int fill_header(conn *c, const char *arg, char **out,
                       const char **val) {
  static const char *const OURS[] = {
      "content-type", "accept",     "mcp-session-id",    "mcp-protocol-version",
      "content-length", "host", "transfer-encoding", "connection", "expect",
      NULL};
  const char *colon = strchr(arg, ':'), *v, *p;
  cli_outbuf b;
  size_t nlen, i;
  char name[128];
  if (!colon || colon == arg)
    return fail(c, EXIT_USAGE, "--header wants 'Name: value'; one has no "
                "name before a colon");
  nlen = (size_t)(colon - arg);
  for (i = 0; i < nlen; i++)
    if (!strchr("!#$%&'*+-.^_`|~", arg[i]) &&
        !((arg[i] >= '0' && arg[i] <= '9') || (arg[i] >= 'a' && arg[i] <= 'z') ||
          (arg[i] >= 'A' && arg[i] <= 'Z')))
      return fail(c, EXIT_USAGE, "--header: a header name is a token "
                  "(letters, digits, -), and one holds byte %zu that is not",
                  i + 1);
  snprintf(name, sizeof name, "%.*s", (int)(nlen < 100 ? nlen : 100), arg);
  for (i = 0; OURS[i]; i++)
    if (strlen(OURS[i]) == nlen && strncasecmp(arg, OURS[i], nlen) == 0)
      return fail(c, EXIT_USAGE, "--header %s: idem sets this header itself",
                  name);
  for (v = colon + 1; *v == ' ' || *v == '\t'; v++) {
  }
  cli_outbuf_init(&b, 65536);
  if (cli_outbuf_put(&b, arg, nlen) || cli_outbuf_str(&b, ": ")) goto nomem;
  for (p = v; *p;) {
    const char *end;
    if (strncmp(p, "{$env:", 6) != 0) {
      if (cli_outbuf_put(&b, p++, 1)) goto nomem;
      continue;
    }
    if (!(end = strchr(p + 6, '}')) || end == p + 6) {
      cli_outbuf_free(&b);
      return fail(c, EXIT_USAGE, "--header %s: a {$env:NAME} without its "
                  "NAME or its closing brace", name);
    }
    {
      char var[256];
      const char *e;
      size_t vl = (size_t)(end - p - 6);
      snprintf(var, sizeof var, "%.*s", (int)(vl < 200 ? vl : 200), p + 6);
      if (!(e = getenv(var))) {
        cli_outbuf_free(&b);
        return fail(c, EXIT_USAGE, "--header %s: the environment variable "
                    "%s is not set", name, var);
      }
      if (cli_outbuf_str(&b, e)) goto nomem;
    }
    p = end + 1;
  }
  if (cli_outbuf_put(&b, "", 1)) goto nomem;
  for (p = b.p + nlen + 2; *p; p++)
    if (((unsigned char)*p < 0x20 && *p != '\t') || *p == 0x7f) {
      cli_outbuf_free(&b);
      return fail(c, EXIT_USAGE, "--header %s: its value holds a control "
                  "character (a line break?); it was not sent", name);
    }
  *out = b.p;
  *val = b.p + nlen + 2;
  return 0;
nomem:
  cli_outbuf_free(&b);
  return fail(c, EXIT_USAGE, "--header %s: its value is longer than 64 KiB",
              name);
}

/* A URL as shown: scheme, host and path; no user, password or query. */
static void show_url(const char *url, char *out, size_t n) {
  const char *s = strstr(url, "://"), *host, *at, *end;
  size_t len;
  if (!s) {
    snprintf(out, n, "the server");
    return;
  }
  host = s + 3;
  end = host + strcspn(host, "/?#");
  if ((at = memchr(host, '@', (size_t)(end - host))) != NULL) host = at + 1;
  len = strcspn(host, "?#");
  snprintf(out, n, "the server at %.*s%.*s", (int)(s + 3 - url), url,
           (int)(len < 300 ? len : 300), host);
}

static int is_url(const char *s) {
  return strncasecmp(s, "http://", 7) == 0 ||
         strncasecmp(s, "https://", 8) == 0;
}

int mcp_suggest(int argc, char **argv) {
  static const struct option opts[] = {
      {"suggest-policy", no_argument, NULL, 'S'},
      {"header", required_argument, NULL, 'H'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  conn c;
  const char *given[MAX_HEADERS];
  int ngiven = 0, ch, rc;
  json_t *tools = NULL, *draft = NULL;
  mcp_draft_info info;
  char *text = NULL;
  int drafted = 0;

  memset(&c, 0, sizeof c);
  memset(&info, 0, sizeof info);
  c.to = c.from = -1;
  cli_outbuf_init(&c.in, MAX_MESSAGE);
  cli_outbuf_init(&c.body, MAX_MESSAGE);
  optind = 1;
  while ((ch = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
    switch (ch) {
    case 'S': break;
    case 'H':
      if (ngiven == MAX_HEADERS)
        return cli_usage("mcp", "at most %d --header", MAX_HEADERS);
      given[ngiven++] = optarg;
      break;
    case 'h': cli_print_usage(stdout, "mcp"); return EXIT_OK;
    case ':':
      return cli_usage("mcp", "option '%s' needs a value", argv[optind - 1]);
    default:
      return cli_usage("mcp", "--suggest-policy takes only --header (no "
                       "option '%s')", argv[optind - 1]);
    }
  }
  if (optind >= argc)
    return cli_usage("mcp", "the server is missing (after --): a command, "
                     "or an http:// or https:// URL");
  c.http = is_url(argv[optind]);
  if (c.http && optind + 1 < argc)
    return cli_usage("mcp", "a URL takes no arguments after it");
  if (!c.http && ngiven)
    return cli_usage("mcp", "--header is for a server at an http:// or "
                     "https:// URL");
  if (!(c.hdr = calloc((size_t)ngiven + 1, sizeof *c.hdr))) {
    cli_err("out of memory");
    return EXIT_FAIL;
  }
  for (int i = 0; i < ngiven; i++, c.nhdr++)
    if (fill_header(&c, given[i], &c.hdr[i], &c.vals[i])) goto out;
  signal(SIGPIPE, SIG_IGN);
  if (c.http) {
    c.url = argv[optind];
    show_url(c.url, c.where_buf, sizeof c.where_buf);
    c.where = c.where_buf;
    if (http_start(&c)) goto out;
  } else {
    cli_outbuf o;
    cli_outbuf_init(&o, 4096);
    snprintf(c.where_buf, sizeof c.where_buf, "the server (%s)",
             shown(&o, argv[optind], 200));
    cli_outbuf_free(&o);
    c.where = c.where_buf;
    if ((rc = spawn(&c, argv + optind)) != 0) {
      fail(&c, EXIT_FAIL, "cannot run %s: %s", argv[optind], strerror(rc));
      goto out;
    }
  }
  if (initialize(&c) || list_tools(&c, &tools)) goto out;
  if (!(draft = mcp_draft_policy(tools, &info)) ||
      !(text = json_dumps(draft, JSON_INDENT(2)))) {
    fail(&c, EXIT_FAIL, "out of memory");
    goto out;
  }
out:
  if (c.http)
    http_end(&c);
  else
    stdio_end(&c);
  if (text) {
    if (info.skipped)
      cli_err("%s listed %zu entr%s without a name (a non-empty string); "
              "left out", c.where, info.skipped,
              info.skipped == 1 ? "y" : "ies");
    if (info.repeated)
      cli_err("%s listed %zu tool%s again under a name it had listed; the "
              "draft has the first of each", c.where, info.repeated,
              info.repeated == 1 ? "" : "s");
    printf("%s\n", text);
    cli_err("a draft policy for the %zu tools of %s: %zu guarded (%zu with a "
            "status check proposed), %zu read_only; read each note, then "
            "idem policy check FILE",
            info.tools, c.where, info.guarded, info.with_status,
            info.read_only);
    c.code = cli_flush();
    drafted = 1;
  }
  free(text);
  json_decref(draft);
  json_decref(tools);
  for (int i = 0; i < c.nhdr; i++) free(c.hdr[i]);
  free(c.hdr);
  cli_outbuf_free(&c.in);
  cli_outbuf_free(&c.body);
  return c.code ? c.code : drafted ? EXIT_OK : EXIT_FAIL;
}
