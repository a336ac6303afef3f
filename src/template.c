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
**          may hold the scheme and host).  A header value must hold no
**          line break or NUL, wherever it came from.
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

/* Append the value [v, v+n) of placeholder what: percent-encoded (pct), or
** as is after checking that it can go in a header line. */
static int put_value(idem__buf *b, const char *v, size_t n, int pct,
                     const char *what, char *err, size_t errn) {
  if (pct) return put_pct(b, v, n);
  if (memchr(v, '\r', n) || memchr(v, '\n', n) || memchr(v, '\0', n)) {
    snprintf(err, errn, "%s holds a line break, which cannot go in a header",
             what);
    return IDEM_INVALID;
  }
  return idem__buf_append(b, v, n);
}

/* Append argument [name, name+n) in its canonical text. */
static int put_arg(const idem_canon *c, idem__buf *b, const char *name,
                   size_t n, int how, const char *what, char *err,
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
    return put_value(b, v, vlen, how == IDEM__TMPL_URL, what, err, errn);
  idem__buf_init(&s, vlen + 1); /* decoding never lengthens a string */
  rc = idem__canon_unstring(&s, v, vlen);
  if (!rc)
    rc = put_value(b, s.p, s.len - 1, how == IDEM__TMPL_URL, what, err, errn);
  idem__buf_free(&s);
  return rc;
}

int idem__tmpl_text(const idem_canon *c, idem__buf *b, const char *tmpl,
                    int how, const char *key, char *err, size_t errn) {
  const char *p = tmpl, *open, *close;
  char what[300];
  int rc = IDEM_OK;
  err[0] = '\0';
  while (!rc && (open = strchr(p, '{')) && (close = strchr(open, '}'))) {
    const char *name = open + 1;
    size_t n = (size_t)(close - name);
    if ((rc = idem__buf_append(b, p, (size_t)(open - p)))) break;
    p = close + 1;
    snprintf(what, sizeof what, "{%.*s}", (int)(n < 200 ? n : 200), name);
    if (n == 4 && memcmp(name, "$key", 4) == 0) {
      if (!key) {
        snprintf(err, errn, "%s: this call has no key", what);
        rc = IDEM_INVALID;
      } else {
        rc = put_value(b, key, strlen(key), how == IDEM__TMPL_URL, what, err,
                       errn);
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
        rc = put_value(b, v, strlen(v), 0, what, err, errn);
      }
    } else {
      rc = put_arg(c, b, name, n, how, what, err, errn);
    }
  }
  if (!rc) rc = idem__buf_append(b, p, strlen(p));
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
