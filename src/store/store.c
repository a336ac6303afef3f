/*
** store.c - choosing the attempt log's backend by URL, and failed stores.
**
**   sqlite:PATH            the embedded store (store/sqlite.c)
**   PATH                   no scheme: a SQLite path too
**   postgres://...         PostgreSQL, any libpq connection URI (store/pg.c)
**   postgresql://...
**   host=H dbname=D ...    PostgreSQL, a libpq keyword/value string
**
** A scheme is what RFC 3986 calls one: a letter, then letters, digits, '+',
** '-' or '.', then ':'.  So "./a:b" and "/x/y:z" are paths, and "a:b" is an
** unknown scheme (write "./a:b" to mean the file).  A name without a scheme
** in which a word (at the start or after white space) is a libpq keyword
** followed by '=' ("host=", "password = ") is a keyword/value string, never
** a path: taken as a file name it would leave a local log - named after
** the password - where a shared one was meant.  After sqlite: such a name
** is refused; a file that really has such a name is "./host=x".
**
** A store that cannot be opened is still an object, a failed store
** (common.c) whose errmsg says why.
*/
#include <string.h>
#include <strings.h>

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

/* libpq's connection keywords (PostgreSQL 17's, and older ones). */
static const char *const pg_keywords[] = {
    "application_name", "channel_binding", "client_encoding",
    "connect_timeout", "dbname", "fallback_application_name",
    "gssdelegation", "gssencmode", "gsslib", "host", "hostaddr", "keepalives",
    "keepalives_count", "keepalives_idle", "keepalives_interval",
    "krbsrvname", "load_balance_hosts", "options", "passfile", "password",
    "port", "replication", "require_auth", "requirepeer", "requiressl",
    "service", "ssl_max_protocol_version", "ssl_min_protocol_version",
    "sslcert", "sslcertmode", "sslcompression", "sslcrl", "sslcrldir",
    "sslkey", "sslmode", "sslnegotiation", "sslpassword", "sslrootcert",
    "sslsni", "target_session_attrs", "tcp_user_timeout", "user", NULL};

static int is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
         c == '\v';
}

/* Does s start with a libpq keyword and then '=' (spaces allowed)?  In any
** case: "PASSWORD=" is no file name either (libpq refuses it). */
static int keyword_at(const char *s) {
  size_t i, n;
  for (i = 0; pg_keywords[i]; i++) {
    n = strlen(pg_keywords[i]);
    if (strncasecmp(s, pg_keywords[i], n) == 0) {
      while (is_space(s[n])) n++;
      if (s[n] == '=') return 1;
    }
  }
  return 0;
}

/* Is name a libpq keyword/value connection string: a word of it, at the
** start or after white space, a keyword and '='? */
static int is_keyword_string(const char *name) {
  const char *s;
  for (s = name; *s; s++)
    if ((s == name || is_space(s[-1])) && keyword_at(s)) return 1;
  return 0;
}

int idem__store_open(const char *url, idem__store **out) {
  char buf[300];
  size_t n;
  if (!out) return IDEM_MISUSE;
  *out = NULL;
  if (!url || !*url)
    return idem__store_fail(out, IDEM_INVALID, "no attempt log named");
  n = scheme_len(url);
  if (n == 0)
    return is_keyword_string(url) ? idem__pg_open(url, out)
                                  : idem__sqlite_open(url, out);
  if (scheme_is(url, n, "sqlite")) {
    if (!url[n + 1])
      return idem__store_fail(out, IDEM_INVALID,
                              "attempt log \"%s\": no path after sqlite:", url);
    if (is_keyword_string(url + n + 1))
      return idem__store_fail(
          out, IDEM_INVALID,
          "attempt log \"%.200s\": a PostgreSQL connection string, not a "
          "path (drop sqlite: to use PostgreSQL, or write sqlite:./NAME for "
          "a file so named)",
          (idem__store_shown_url(url, buf, sizeof buf), buf));
    return idem__sqlite_open(url + n + 1, out);
  }
  if (scheme_is(url, n, "postgres") || scheme_is(url, n, "postgresql"))
    return idem__pg_open(url, out);
  return idem__store_fail(out, IDEM_INVALID,
                          "attempt log \"%.200s\": unknown scheme (use "
                          "sqlite:PATH, a plain path or postgres://...)",
                          (idem__store_shown_url(url, buf, sizeof buf), buf));
}

void idem_log_shown(const char *url, char *buf, size_t size) {
  if (!buf || !size) return;
  if (!url) {
    buf[0] = '\0';
    return;
  }
  if (!strncmp(url, "postgres://", 11) || !strncmp(url, "postgresql://", 13))
    idem__pg_shown(url, buf, size);
  else
    idem__store_shown_url(url, buf, size);
}
