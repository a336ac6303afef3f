/*
** template.c - the policy's templates: one engine for every place a policy
** names a call's arguments (docs/POLICY.md).
**
** Two forms, one lookup.  The arguments are canonicalized once into an
** idem_canon (idem__tmpl_args), and every placeholder reads the member it
** names out of that canonical text, so a value means the same wherever it
** goes - the fingerprint, the body, a URL, a header, a status check:
**
**   text   an HTTP tool's URL and header values.  "{name}" becomes the
**          argument's canonical RFC 8785 text: a string as its characters,
**          a number as its canonical form (0.1 -> 0.1, 1e21 -> 1e+21,
**          6000.0 -> 6000), true, false or null as such; an object or an
**          array fills nothing (an error).  "{$key}" is the key,
**          "{$env:NAME}" the environment variable NAME.  In a URL, an
**          argument and the key are percent-encoded (every byte outside
**          A-Z a-z 0-9 - . _ ~); the environment's value goes in as is (it
**          may hold the scheme and host).  An argument or the key must
**          not leave its own path segment: in the URL's path, a value that
**          is "." or "..", or holds one between slashes ("../x", "a/..",
**          a backslash too), is refused, and so is a filled URL whose path
**          has a dot segment at all (".", "..", a dot also as %2E) -
**          libcurl and servers resolve them (RFC 3986 5.2.4), so
**          "/v1/customers/../refunds" would go out as "/v1/refunds", and a
**          server or proxy that decodes %2F first would do the same with
**          "..%2Fx".  A header value must hold no control character but
**          a tab (no line break, NUL, ESC, DEL...), wherever it came from.
**   json   a status tool's "arguments", stored canonical by the policy: a
**          string token that is exactly "{name}" becomes the argument's
**          canonical JSON value (null when the call has none), "{$key}"
**          the key as a JSON string; every other byte is copied.
**
** Errors of the text form are said in words that name the placeholder
** ("{order_id}: the call has no argument of that name"); a filled text
** longer than its buffer's cap is IDEM_RANGE, which the caller words (it
** knows what the text is for).  Nothing here allocates but the buffers.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canon.h"

int idem__tmpl_args(idem_canon *c, const char *args, size_t len) {
  idem__canon_opt opt = {0, NULL, 0, 0, 0};
  int rc;
  if (!args) {
    args = "{}";
    len = 2;
  }
  opt.max_depth = c->max_depth;
  if ((rc = idem__canon_run(c, args, len, &opt))) return rc;
  if (c->out.len == 0 || c->out.p[0] != '{')
    return idem__canon_fail(c, IDEM_NOT_OBJECT, IDEM__NO_OFFSET,
                            "the arguments are not a JSON object");
  return IDEM_OK;
}

int idem__tmpl_arg(const idem_canon *c, const char *name, size_t n,
                   const char **v, size_t *vlen) {
  size_t i;
  for (i = 0; i < c->top_members; i++)
    if (idem__member_is(c, &c->mem[i], name, n)) {
      *v = c->out.p + c->mem[i].colon + 1;
      *vlen = c->mem[i].end - c->mem[i].colon - 1;
      return 1;
    }
  return 0;
}

/* ---- text ------------------------------------------------------------------ */

static int unreserved(unsigned char ch) {
  return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
         (ch >= '0' && ch <= '9') || ch == '-' || ch == '.' || ch == '_' ||
         ch == '~';
}

static int put_pct(idem__buf *b, const char *p, size_t n) {
  static const char hex[] = "0123456789ABCDEF";
  size_t i, run;
  int rc = IDEM_OK;
  for (i = 0; i < n && !rc; i += run) {
    unsigned char ch = (unsigned char)p[i];
    if (unreserved(ch)) {
      for (run = 1; i + run < n && unreserved((unsigned char)p[i + run]);)
        run++;
      rc = idem__buf_append(b, p + i, run);
    } else {
      char e[3] = {'%', hex[ch >> 4], hex[ch & 15]};
      run = 1;
      rc = idem__buf_append(b, e, 3);
    }
  }
  return rc;
}

/* Is [p, p+n) a dot segment, "." or "..", a dot also written %2E? */
static int dot_segment(const char *p, size_t n) {
  size_t i, dots = 0;
  for (i = 0; i < n; dots++)
    if (p[i] == '.')
      i++;
    else if (n - i >= 3 && p[i] == '%' && p[i + 1] == '2' &&
             (p[i + 2] == 'E' || p[i + 2] == 'e'))
      i += 3;
    else
      return 0;
  return dots == 1 || dots == 2;
}

/* Does value [v, v+n) hold a dot segment of its own: is it "." or "..", or
** one of its pieces between slashes (or backslashes, which some servers
** take for slashes)?  Percent-encoded, its slashes would not cut the URL's
** path, but a server or proxy that decodes %2F before resolving would. */
static int dot_piece(const char *v, size_t n) {
  size_t i, at = 0;
  for (i = 0; i <= n; i++)
    if (i == n || v[i] == '/' || v[i] == '\\') {
      if ((i - at == 1 || i - at == 2) && dot_segment(v + at, i - at)) return 1;
      at = i + 1;
    }
  return 0;
}

/* Where a placeholder filled at the end of url [u, u+n) lands: 1 in the
** path (after the scheme and the authority, before any "?" or "#"). */
static int in_path(const char *u, size_t n) {
  const char *p = u, *end = u + n;
  if (n == 0) return 1; /* nothing yet (u may be NULL): as a path */
  if (memchr(u, '?', n) || memchr(u, '#', n)) return 0;
  for (; p + 3 <= end; p++)
    if (memcmp(p, "://", 3) == 0)
      return memchr(p + 3, '/', (size_t)(end - p - 3)) != NULL;
  return 1; /* no scheme yet: take it for a path */
}

/* The first dot segment in the path of url [u, u+n): its offset and
** length, or 0. */
static int path_dot(const char *u, size_t n, size_t *at, size_t *len) {
  size_t i = 0, seg;
  for (; i + 3 <= n; i++)
    if (memcmp(u + i, "://", 3) == 0) break;
  i = i + 3 <= n ? i + 3 : 0;
  while (i < n && u[i] != '/' && u[i] != '?' && u[i] != '#') i++;
  while (i < n && u[i] == '/') {
    for (seg = ++i; i < n && u[i] != '/' && u[i] != '?' && u[i] != '#';) i++;
    if (dot_segment(u + seg, i - seg)) {
      *at = seg;
      *len = i - seg;
      return 1;
    }
  }
  return 0;
}

/* Append the value [v, v+n) of placeholder what: percent-encoded (pct),
** after checking that it stays in its path segment (path); or as is after
** checking that it can go in a header line. */
static int put_value(idem__buf *b, const char *v, size_t n, int pct, int path,
                     const char *what, char *err, size_t errn) {
  size_t i;
  if (pct && path && dot_piece(v, n)) {
    int shown = n <= 40; /* the value itself, when it is short and plain */
    for (i = 0; shown && i < n; i++)
      shown = v[i] >= 0x20 && v[i] < 0x7f && v[i] != '"' && v[i] != '\\';
    snprintf(err, errn,
             "%s: the value%s%.*s%s would leave its path segment (\".\" and "
             "\"..\" are dot segments, which the HTTP client and servers "
             "resolve: /a/../b is /b), so the request would go to another "
             "path",
             what, shown ? " \"" : "", shown ? (int)n : 0, v,
             shown ? "\"" : "");
    return IDEM_INVALID;
  }
  if (pct) return put_pct(b, v, n);
  for (i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)v[i];
    if (ch == '\r' || ch == '\n') {
      snprintf(err, errn, "%s holds a line break, which cannot go in a header",
               what);
      return IDEM_INVALID;
    }
    if ((ch < 0x20 && ch != '\t') || ch == 0x7f) {
      snprintf(err, errn,
               "%s holds the control character 0x%02X, which cannot go in a "
               "header",
               what, ch);
      return IDEM_INVALID;
    }
  }
  return idem__buf_append(b, v, n);
}

/* Append argument [name, name+n) in its canonical text. */
static int put_arg(const idem_canon *c, idem__buf *b, const char *name,
                   size_t n, int how, int path, const char *what, char *err,
                   size_t errn) {
  const char *v;
  size_t vlen;
  idem__buf s;
  int rc;
  if (!idem__tmpl_arg(c, name, n, &v, &vlen)) {
    snprintf(err, errn, "%s: the call has no argument of that name", what);
    return IDEM_INVALID;
  }
  if (*v == '{' || *v == '[') {
    snprintf(err, errn,
             "%s: the argument is an %s; only a string, a number, true, "
             "false or null fills a template",
             what, *v == '{' ? "object" : "array");
    return IDEM_INVALID;
  }
  if (*v != '"') /* a number, true, false, null: its canonical text */
    return put_value(b, v, vlen, how == IDEM__TMPL_URL, path, what, err, errn);
  idem__buf_init(&s, vlen + 1); /* decoding never lengthens a string */
  rc = idem__canon_unstring(&s, v, vlen);
  if (!rc)
    rc = put_value(b, s.p, s.len - 1, how == IDEM__TMPL_URL, path, what, err,
                   errn);
  idem__buf_free(&s);
  return rc;
}

int idem__tmpl_text(const idem_canon *c, idem__buf *b, const char *tmpl,
                    int how, const char *key, char *err, size_t errn) {
  const char *p = tmpl, *open, *close;
  char what[300];
  size_t base = b->len, at, len;
  int rc = IDEM_OK, path;
  err[0] = '\0';
  while (!rc && (open = strchr(p, '{')) && (close = strchr(open, '}'))) {
    const char *name = open + 1;
    size_t n = (size_t)(close - name);
    if ((rc = idem__buf_append(b, p, (size_t)(open - p)))) break;
    p = close + 1;
    path = how == IDEM__TMPL_URL && in_path(b->p + base, b->len - base);
    snprintf(what, sizeof what, "{%.*s}", (int)(n < 200 ? n : 200), name);
    if (n == 4 && memcmp(name, "$key", 4) == 0) {
      if (!key) {
        snprintf(err, errn, "%s: this call has no key", what);
        rc = IDEM_INVALID;
      } else {
        rc = put_value(b, key, strlen(key), how == IDEM__TMPL_URL, path, what,
                       err, errn);
      }
    } else if (n > 5 && memcmp(name, "$env:", 5) == 0) {
      char var[256];
      const char *v;
      snprintf(var, sizeof var, "%.*s", (int)(n - 5), name + 5);
      if (!(v = getenv(var))) {
        snprintf(err, errn, "%s: the environment variable %s is not set", what,
                 var);
        rc = IDEM_INVALID;
      } else {
        rc = put_value(b, v, strlen(v), 0, 0, what, err, errn);
      }
    } else {
      rc = put_arg(c, b, name, n, how, path, what, err, errn);
    }
  }
  if (!rc) rc = idem__buf_append(b, p, strlen(p));
  if (!rc && how == IDEM__TMPL_URL &&
      path_dot(b->p + base, b->len - base, &at, &len)) {
    snprintf(err, errn,
             "the URL filled has the dot segment \"%.*s\" in its path, which "
             "the HTTP client and servers resolve (/a/../b is /b), so the "
             "request would go to another path",
             (int)len, b->p + base + at);
    rc = IDEM_INVALID;
  }
  return rc;
}

/* ---- json ------------------------------------------------------------------ */

int idem__tmpl_json(const idem_canon *c, idem__buf *b, const char *tmpl,
                    const char *key) {
  const char *p;
  int rc = IDEM_OK;
  for (p = tmpl; *p && !rc;) {
    if (*p == '"') { /* a string token of the canonical template */
      const char *q = p + 1;
      while (*q != '"') q += *q == '\\' ? 2 : 1;
      if (q - p > 3 && p[1] == '{' && q[-1] == '}' &&
          !memchr(p, '\\', (size_t)(q - p))) {
        const char *name = p + 2, *v;
        size_t n = (size_t)(q - 1 - name), vlen;
        if (n == 4 && memcmp(name, "$key", 4) == 0) {
          size_t bad;
          rc = idem__canon_string(b, key, strlen(key), &bad);
        } else if (idem__tmpl_arg(c, name, n, &v, &vlen)) {
          rc = idem__buf_append(b, v, vlen);
        } else {
          rc = idem__buf_append(b, "null", 4);
        }
      } else {
        rc = idem__buf_append(b, p, (size_t)(q + 1 - p));
      }
      p = q + 1;
    } else {
      rc = idem__buf_append(b, p++, 1);
    }
  }
  return rc;
}
