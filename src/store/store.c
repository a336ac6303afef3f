/*
** store.c - choosing the attempt log's backend by URL, and failed stores.
**
**   sqlite:PATH            the embedded store (store/sqlite.c)
**   PATH                   no scheme: a SQLite path too
**   postgres://...         PostgreSQL, any libpq connection URI (store/pg.c)
**   postgresql://...
**
** A scheme is what RFC 3986 calls one: a letter, then letters, digits, '+',
** '-' or '.', then ':'.  So "./a:b" and "/x/y:z" are paths, and "a:b" is an
** unknown scheme (write "./a:b" to mean the file).
**
** A store that cannot be opened is still an object, a failed store
** (common.c) whose errmsg says why.
*/
#include <string.h>

#include "idemInt.h"

/* ---- choosing a backend --------------------------------------------------- */

/* Length of url's scheme (before ':'), 0 when it has none. */
static size_t scheme_len(const char *url) {
  size_t i = 0;
  if (!((url[0] >= 'a' && url[0] <= 'z') || (url[0] >= 'A' && url[0] <= 'Z')))
    return 0;
  for (i = 1; url[i] && url[i] != ':'; i++) {
    char c = url[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.'))
      return 0;
  }
  return url[i] == ':' ? i : 0;
}

static int scheme_is(const char *url, size_t n, const char *name) {
  size_t i;
  if (strlen(name) != n) return 0;
  for (i = 0; i < n; i++) {
    char c = url[i];
    if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
    if (c != name[i]) return 0;
  }
  return 1;
}

int idem__store_open(const char *url, idem__store **out) {
  char buf[300];
  size_t n;
  if (!out) return IDEM_MISUSE;
  *out = NULL;
  if (!url || !*url)
    return idem__store_fail(out, IDEM_INVALID, "no attempt log named");
  n = scheme_len(url);
  if (n == 0) return idem__sqlite_open(url, out);
  if (scheme_is(url, n, "sqlite")) {
    if (!url[n + 1])
      return idem__store_fail(out, IDEM_INVALID,
                              "attempt log \"%s\": no path after sqlite:", url);
    return idem__sqlite_open(url + n + 1, out);
  }
  if (scheme_is(url, n, "postgres") || scheme_is(url, n, "postgresql"))
    return idem__pg_open(url, out);
  return idem__store_fail(out, IDEM_INVALID,
                          "attempt log \"%.200s\": unknown scheme (use "
                          "sqlite:PATH, a plain path or postgres://...)",
                          (idem__store_shown_url(url, buf, sizeof buf), buf));
}
