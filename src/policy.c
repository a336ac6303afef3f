/*
** policy.c - the policy file (SPEC §8): which tools are guarded, and how.
**
** Format.  One JSON object (docs/POLICY.md documents every field, its type,
** range and default):
**
**   {"unknown_tools": "refuse" | "guard" | "pass",
**    "tools": {NAME: {"class": "guarded" | "idempotent" | "read_only",
**                     FIELD: VALUE, ...}, ...}}
**
** It is read with jansson (JSON_REJECT_DUPLICATES, no NUL in strings) into a
** tree, validated, and copied into idem__tool_rule structs; the tree is then
** freed.  Validation is strict and happens once, here: an unknown field at
** any level, a wrong type, a value out of range, or a combination that cannot
** mean anything (a key_arg on a read_only tool, a status tool that is not a
** read_only tool of the same policy, an exit status that means two things,
** a status check that sends the key and would count it anywhere in the
** answer, where an echo of the query puts it) is IDEM_POLICY.  The message
** starts with the path of the field,
** `tools.refund.retries: expected an integer, found a string` (a name that
** is not a plain identifier is written as `tools["a b"]`), and reports the
** first problem in document order.  A syntax error keeps jansson's text,
** prefixed by the origin, line and column.
**
** Invariants of a parsed policy, which the guard relies on without checking:
**   - tools[] is sorted by name (strcmp) and names are unique, so lookup is
**     a binary search;
**   - every rule is complete: what the file leaves out has its default
**     (idem__rule_defaults), reconcile_timeout_ms defaults to timeout_ms;
**   - only guarded rules carry key_arg, fence, status, exit codes and the
**     other guard-only fields; other classes keep the defaults;
**   - status.arguments and applied_when.equals are RFC 8785 canonical
**     (idem_canon_json); a status tool has arguments ("{}" when none were
**     given) and names a read_only tool of this policy other than itself;
**   - the three exit-code lists are disjoint and applied is not empty.
**
** Memory.  Everything a policy keeps is allocated through idem__malloc and
** owned by it; jansson's tree (jansson's own allocator, left alone) never
** outlives a call.  A failed allocation is IDEM_NOMEM and leaks nothing.
**
** Failure.  A policy that failed to load keeps its message and no tools,
** and treats every tool as unknown and refused, so that using it by mistake
** runs nothing.  idem_policy_explain() refuses it (IDEM_MISUSE).
*/
#define _POSIX_C_SOURCE 200809L /* strerror_r */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "idemInt.h"

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif

#define MAX_FILE_BYTES (16u << 20) /* a policy file larger is refused     */
#define MAX_FENCE 32               /* argument names in one fence         */
#define MAX_EXPLAIN (64u << 10)    /* the longest explanation             */

/* ---- paths and messages --------------------------------------------------- */

/* The state of one parse: the policy being filled, the path of the field
** being read (for messages), and a canonicalizer opened on first use. */
typedef struct ctx {
  idem_policy *p;
  idem_canon *canon;
  char path[200];
  size_t plen;
} ctx;

static int plain_name(const char *s) {
  if (!*s) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
          (*s >= '0' && *s <= '9') || *s == '_' || *s == '-'))
      return 0;
  return 1;
}

/* Room for a name quoted by quote(s, max). */
#define QUOTED(max) ((max) * 6 + 40)

/* Write s as a JSON string of at most about `max` source bytes into out
** (room for QUOTED(max)), cutting at a UTF-8 boundary with "..." and
** saying how long s was: "aaaa..." (100000 bytes).  Control characters are
** escaped, so the result is safe on a terminal; with ascii, every character
** beyond ASCII is too (\u00e9), so names that look alike show how they
** differ.  s is valid UTF-8 (jansson checked it). */
static size_t quote_as(char *out, const char *s, size_t max, int ascii) {
  size_t n = strlen(s), lim = n > max ? max : n, i, k = 0;
  while (lim < n && lim > 0 && ((unsigned char)s[lim] & 0xC0) == 0x80) lim--;
  out[k++] = '"';
  for (i = 0; i < lim; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ascii && ch >= 0x80) { /* one \u escape per UTF-16 unit */
      size_t len = idem_utf8_char(s + i, lim - i), j;
      unsigned long cp = ch & (0x7Fu >> len);
      for (j = 1; j < len; j++) cp = cp << 6 | ((unsigned char)s[i + j] & 0x3F);
      if (cp >= 0x10000)
        k += (size_t)snprintf(out + k, 13, "\\u%04lx\\u%04lx",
                              0xD800 + ((cp - 0x10000) >> 10),
                              0xDC00 + ((cp - 0x10000) & 0x3FF));
      else
        k += (size_t)snprintf(out + k, 7, "\\u%04lx", cp);
      i += len - 1;
    } else if (ch == '"' || ch == '\\') {
      out[k++] = '\\';
      out[k++] = (char)ch;
    } else if (ch < 0x20 || ch == 0x7f) {
      static const char SHORT[] = "btn\0fr"; /* \b \t \n \f \r as in JSON */
      if (ch >= 8 && ch <= 13 && ch != 11) {
        out[k++] = '\\';
        out[k++] = SHORT[ch - 8];
      } else {
        k += (size_t)snprintf(out + k, 7, "\\u%04x", ch);
      }
    } else {
      out[k++] = (char)ch;
    }
  }
  if (lim < n) {
    memcpy(out + k, "...", 3);
    k += 3;
  }
  out[k++] = '"';
  out[k] = '\0';
  if (lim < n) k += (size_t)snprintf(out + k, 32, " (%zu bytes)", n);
  return k;
}

static size_t quote(char *out, const char *s, size_t max) {
  return quote_as(out, s, max, 0);
}

static void path_add(ctx *c, const char *s, size_t n) {
  size_t room = sizeof c->path - 1 - c->plen;
  if (n > room) n = room;
  memcpy(c->path + c->plen, s, n);
  c->plen += n;
  c->path[c->plen] = '\0';
}

/* Append a member name to the path; returns the length to pop back to. */
static size_t path_push(ctx *c, const char *name) {
  size_t old = c->plen, n = strlen(name);
  if (plain_name(name) && n <= 64) {
    if (c->plen) path_add(c, ".", 1);
    path_add(c, name, n);
  } else {
    char q[QUOTED(48)];
    path_add(c, "[", 1);
    path_add(c, q, quote(q, name, 48));
    path_add(c, "]", 1);
  }
  return old;
}

static size_t path_index(ctx *c, size_t i) {
  size_t old = c->plen;
  char t[32];
  int n = snprintf(t, sizeof t, "[%zu]", i);
  path_add(c, t, (size_t)n);
  return old;
}

static void path_pop(ctx *c, size_t old) {
  c->plen = old;
  c->path[old] = '\0';
}

/* Drop a UTF-8 sequence that snprintf cut at the end of s. */
static void trim_utf8(char *s) {
  size_t n = strlen(s), i = n, need;
  unsigned char b;
  while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80 && n - i < 3) i--;
  if (i == 0) return;
  b = (unsigned char)s[i - 1];
  if (b < 0xC0) return;
  need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  if (n - (i - 1) < need) s[i - 1] = '\0';
}

static int fail(ctx *c, const char *fmt, ...) PRINTF_LIKE(2, 3);
static int fail(ctx *c, const char *fmt, ...) {
  idem_policy *p = c->p;
  va_list ap;
  int n = snprintf(p->errmsg, sizeof p->errmsg,
                   "%s: ", c->plen ? c->path : "(root)");
  if (n >= 0 && (size_t)n < sizeof p->errmsg) {
    va_start(ap, fmt);
    vsnprintf(p->errmsg + n, sizeof p->errmsg - (size_t)n, fmt, ap);
    va_end(ap);
  }
  trim_utf8(p->errmsg);
  p->err = IDEM_POLICY;
  return IDEM_POLICY;
}

static int nomem(ctx *c) {
  snprintf(c->p->errmsg, sizeof c->p->errmsg, "out of memory");
  c->p->err = IDEM_NOMEM;
  return IDEM_NOMEM;
}

static const char *type_name(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a number with a fraction or an exponent";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  case JSON_NULL: return "null";
  }
  return "a value";
}

/* ---- did you mean ----------------------------------------------------------
** Optimal string alignment distance (adjacent transpositions count one),
** after folding case and '-' or ' ' to '_', on names of at most 40 bytes. */
static char fold(char ch) {
  if (ch >= 'A' && ch <= 'Z') return (char)(ch - 'A' + 'a');
  return ch == '-' || ch == ' ' ? '_' : ch;
}

static size_t distance(const char *a, const char *b) {
  size_t row[3][41], na = strlen(a), nb = strlen(b), i, j;
  if (na > 40 || nb > 40) return 99;
  for (j = 0; j <= nb; j++) row[0][j] = j;
  for (i = 1; i <= na; i++) {
    size_t *cur = row[i % 3], *prev = row[(i + 2) % 3],
           *prev2 = row[(i + 1) % 3];
    cur[0] = i;
    for (j = 1; j <= nb; j++) {
      size_t cost = fold(a[i - 1]) != fold(b[j - 1]), best;
      best = prev[j] + 1;
      if (cur[j - 1] + 1 < best) best = cur[j - 1] + 1;
      if (prev[j - 1] + cost < best) best = prev[j - 1] + cost;
      if (i > 1 && j > 1 && fold(a[i - 1]) == fold(b[j - 2]) &&
          fold(a[i - 2]) == fold(b[j - 1]) && prev2[j - 2] + 1 < best)
        best = prev2[j - 2] + 1;
      cur[j] = best;
    }
  }
  return row[na % 3][nb];
}

/* Is s an abbreviation of name: its first letter, then the rest of its
** letters in order ("args" of "arguments", "ttl" of "tool_ttl")? */
static int abbreviates(const char *s, const char *name) {
  if (fold(*s) != fold(*name)) return 0;
  for (; *s && *name; name++)
    if (fold(*s) == fold(*name)) s++;
  return *s == '\0';
}

/* The known name closest to s, if it is close: at most two edits (one for
** names under six bytes), or s an abbreviation of it of at least three
** bytes ("timeout" of "timeout_ms", "args" of "arguments"). */
static const char *suggest(const char *s, const char *const *names) {
  const char *best = NULL;
  size_t best_d = 99, n = strlen(s), i;
  for (i = 0; names[i]; i++) {
    size_t d = distance(s, names[i]), len = strlen(names[i]);
    size_t max = len >= 6 ? 2 : 1;
    if (n >= 3 && n < len && d > max && abbreviates(s, names[i])) d = max;
    if (d <= max && d < best_d) {
      best = names[i];
      best_d = d;
    }
  }
  return best;
}

static int find_name(const char *const *names, const char *s) {
  int i;
  for (i = 0; names[i]; i++)
    if (strcmp(names[i], s) == 0) return i;
  return -1;
}

/* Every member of obj must be one of names. */
static int check_members(ctx *c, json_t *obj, const char *const *names) {
  const char *k;
  json_t *v;
  json_object_foreach(obj, k, v) {
    if (find_name(names, k) < 0) {
      const char *s = suggest(k, names);
      path_push(c, k);
      return s ? fail(c, "unknown field (did you mean %s?)", s)
               : fail(c, "unknown field");
    }
  }
  return IDEM_OK;
}

/* ---- typed values --------------------------------------------------------- */

static int want_int(ctx *c, const json_t *v, long long lo, long long hi,
                    int64_t *out) {
  long long x;
  if (!json_is_integer(v))
    return fail(c, "expected an integer, found %s", type_name(v));
  x = json_integer_value(v);
  if (x < lo || x > hi)
    return fail(c, "%lld is out of range (%lld to %lld)", x, lo, hi);
  *out = (int64_t)x;
  return IDEM_OK;
}

static int want_bool(ctx *c, const json_t *v, int *out) {
  if (!json_is_boolean(v))
    return fail(c, "expected true or false, found %s", type_name(v));
  *out = json_is_true(v);
  return IDEM_OK;
}

/* A non-empty string, copied into *out. */
static int want_name(ctx *c, const json_t *v, const char *what, char **out) {
  if (!json_is_string(v))
    return fail(c, "expected a string (%s), found %s", what, type_name(v));
  if (json_string_length(v) == 0) return fail(c, "empty; expected %s", what);
  *out = idem__strndup(json_string_value(v), json_string_length(v));
  return *out ? IDEM_OK : nomem(c);
}

/* Any string, copied into *out. */
static int want_string(ctx *c, const json_t *v, const char *what, char **out) {
  if (!json_is_string(v))
    return fail(c, "expected a string (%s), found %s", what, type_name(v));
  *out = idem__strndup(json_string_value(v), json_string_length(v));
  return *out ? IDEM_OK : nomem(c);
}

/* One of names (a NULL-terminated list), as its index. */
static int want_enum(ctx *c, const json_t *v, const char *const *names,
                     int *index) {
  char q[QUOTED(40)], list[200];
  const char *s;
  size_t i, n = 0;
  int at;
  for (i = 0; names[i] && n < sizeof list; i++)
    n += (size_t)snprintf(list + n, sizeof list - n, "%s\"%s\"",
                          i ? (names[i + 1] ? ", " : " or ") : "", names[i]);
  if (!json_is_string(v))
    return fail(c, "expected %s, found %s", list, type_name(v));
  if ((at = find_name(names, json_string_value(v))) >= 0) {
    *index = at;
    return IDEM_OK;
  }
  quote(q, json_string_value(v), 40);
  if ((s = suggest(json_string_value(v), names)) != NULL)
    return fail(c, "%s is not %s (did you mean \"%s\"?)", q, list, s);
  return fail(c, "%s is not %s", q, list);
}

/* The RFC 8785 form of any JSON value, copied into *out. */
static int want_canonical(ctx *c, const json_t *v, char **out) {
  const char *cj;
  char *text;
  size_t n;
  int rc;
  if (!c->canon && idem_canon_open(&c->canon) != IDEM_OK) return nomem(c);
  text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  if (!text) return nomem(c);
  rc = idem_canon_json(c->canon, text, strlen(text), &cj, &n);
  free(text); /* jansson's allocation, from jansson's allocator (malloc) */
  if (rc == IDEM_NOMEM) return nomem(c);
  if (rc != IDEM_OK) return fail(c, "%s", idem_strerror(rc));
  *out = idem__strndup(cj, n);
  return *out ? IDEM_OK : nomem(c);
}

/* An RFC 6901 JSON pointer: "" or "/" segments, "~" only as ~0 or ~1. */
static int want_pointer(ctx *c, const json_t *v, char **out) {
  const char *s;
  char q[QUOTED(40)];
  if (!json_is_string(v))
    return fail(c, "expected a string (a JSON pointer), found %s",
                type_name(v));
  s = json_string_value(v);
  quote(q, s, 40);
  if (*s && *s != '/')
    return fail(c,
                "%s is not a JSON pointer (RFC 6901): it must be \"\" or "
                "start with \"/\"",
                q);
  for (; *s; s++)
    if (*s == '~' && s[1] != '0' && s[1] != '1')
      return fail(c,
                  "%s is not a JSON pointer (RFC 6901): \"~\" must be "
                  "followed by 0 or 1",
                  q);
  *out = idem__strndup(json_string_value(v), json_string_length(v));
  return *out ? IDEM_OK : nomem(c);
}

/* ---- rules ------------------------------------------------------------------ */

void idem__rule_defaults(idem__tool_rule *r, const char *name) {
  memset(r, 0, sizeof *r);
  r->name = (char *)name;
  r->cls = IDEM_CLASS_GUARDED;
  r->timeout_ms = 30000;
  r->retries = 2;
  r->backoff_ms = 200;
  r->reconcile_timeout_ms = 30000;
  r->wait_ms = 2000;
  r->settle_ms = -1; /* no bound: an attempt may land at any time */
  r->on_is_error = IDEM_OUTCOME_UNKNOWN;
  r->coalesce_ms = 1000; /* docs/FENCE.md: why one second */
  r->provider_dedupes = 0;
  r->provider_key_ttl_s = 86400;
  r->key_max_len = IDEM_DEFAULT_KEY_MAX_LEN;
  r->retention_s = 604800;
  r->status.applied_when = IDEM__APPLIED_WHEN_KEY_PRESENT;
  r->exit_applied[0] = 0;
  r->n_exit_applied = 1;
  r->exit_not_applied[0] = 100;
  r->n_exit_not_applied = 1;
  r->exit_rejected[0] = 101;
  r->n_exit_rejected = 1;
}

static void rule_free(idem__tool_rule *r) {
  size_t i;
  idem__free(r->name);
  idem__free(r->key_arg);
  for (i = 0; i < r->nfence; i++) idem__free(r->fence[i]);
  idem__free(r->fence);
  idem__free(r->status.tool);
  idem__free(r->status.arguments);
  idem__free(r->status.command);
  idem__free(r->status.pointer);
  idem__free(r->status.equals);
  idem__free(r->http.method);
  idem__free(r->http.url);
  for (i = 0; i < r->http.nheaders; i++) {
    idem__free(r->http.hname[i]);
    idem__free(r->http.hvalue[i]);
  }
  idem__free(r->http.hname);
  idem__free(r->http.hvalue);
  idem__free(r->http.key_header);
}

/* Forget every tool: the state of a policy that failed to load. */
static void policy_clear(idem_policy *p) {
  size_t i;
  for (i = 0; i < p->ntools; i++) rule_free(&p->tools[i]);
  idem__free(p->tools);
  p->tools = NULL;
  p->ntools = 0;
  for (i = 0; i < p->nwarnings; i++) idem__free(p->warnings[i]);
  idem__free(p->warnings);
  p->warnings = NULL;
  p->nwarnings = 0;
  p->unknown_tools = IDEM_CLASS_REFUSED;
}

/* ---- the fields of a tool --------------------------------------------------- */

enum {
  F_CLASS,
  F_TIMEOUT_MS,
  F_RETRIES,
  F_BACKOFF_MS,
  F_RECONCILE_TIMEOUT_MS,
  F_WAIT_MS,
  F_SETTLE_MS,
  F_PROVIDER_DEDUPES,
  F_PROVIDER_KEY_TTL_S,
  F_KEY_ARG,
  F_KEY_MAX_LEN,
  F_FENCE,
  F_FENCE_SCOPE,
  F_REPEAT_WINDOW_S,
  F_RETENTION_S,
  F_STATUS,
  F_EXIT_CODES,
  F_HTTP,
  F_ON_IS_ERROR,
  F_COALESCE_MS,
  F_NOTE
};

static const char *const TOOL_FIELDS[] = {"class",
                                          "timeout_ms",
                                          "retries",
                                          "backoff_ms",
                                          "reconcile_timeout_ms",
                                          "wait_ms",
                                          "settle_ms",
                                          "provider_dedupes",
                                          "provider_key_ttl_s",
                                          "key_arg",
                                          "key_max_len",
                                          "fence",
                                          "fence_scope",
                                          "repeat_window_s",
                                          "retention_s",
                                          "status",
                                          "exit_codes",
                                          "http",
                                          "on_is_error",
                                          "coalesce_ms",
                                          "note",
                                          NULL};

/* What only a guarded tool can have (NULL: any class): there is no record,
** key, fence or reconciliation for the others, so these could only be
** silently ignored. */
static const char *const GUARDED_ONLY[] = {NULL,
                                           NULL,
                                           NULL,
                                           NULL,
                                           "a reconcile_timeout_ms",
                                           "a wait_ms",
                                           "a settle_ms",
                                           "provider_dedupes",
                                           "a provider_key_ttl_s",
                                           "a key_arg",
                                           "a key_max_len",
                                           "a fence",
                                           "a fence_scope",
                                           "a repeat_window_s",
                                           "a retention_s",
                                           "a status check",
                                           "exit_codes",
                                           NULL,
                                           "an on_is_error",
                                           "a coalesce_ms",
                                           NULL,
                                           NULL};

static const char *const CLASS_NAMES[] = {"guarded", "idempotent", "read_only",
                                          NULL};
static const int CLASS_VALUES[] = {IDEM_CLASS_GUARDED, IDEM_CLASS_IDEMPOTENT,
                                   IDEM_CLASS_READ_ONLY};

static const char *class_name(int cls) {
  switch (cls) {
  case IDEM_CLASS_GUARDED: return "guarded";
  case IDEM_CLASS_IDEMPOTENT: return "idempotent";
  case IDEM_CLASS_READ_ONLY: return "read_only";
  default: return "refused";
  }
}

static int parse_fence(ctx *c, const json_t *v, idem__tool_rule *r) {
  size_t n, i, j;
  if (!json_is_array(v))
    return fail(c, "expected an array of argument names, found %s",
                type_name(v));
  if ((n = json_array_size(v)) == 0)
    return fail(c, "empty; leave fence out to fence on the whole arguments");
  if (n > MAX_FENCE) return fail(c, "more than %d names", MAX_FENCE);
  if (!(r->fence = idem__malloc(n * sizeof *r->fence))) return nomem(c);
  for (i = 0; i < n; i++) {
    const json_t *e = json_array_get(v, i);
    size_t at = path_index(c, i);
    int rc = want_name(c, e, "an argument name", &r->fence[i]);
    if (rc) return rc;
    r->nfence++;
    for (j = 0; j < i; j++)
      if (strcmp(r->fence[j], r->fence[i]) == 0) {
        char q[QUOTED(40)];
        quote(q, r->fence[i], 40);
        return fail(c, "%s is named twice", q);
      }
    path_pop(c, at);
  }
  return IDEM_OK;
}

/* A status template may hold "{name}" (argument name) and "{$key}"; any
** other "{$...}" is a typo that would be sent to the provider as is.
** *key is set when "{$key}" is among its values. */
static int check_template(ctx *c, json_t *v, int *key) {
  const char *k, *s;
  json_t *e;
  size_t i, at, n;
  int rc;
  switch (json_typeof(v)) {
  case JSON_OBJECT:
    json_object_foreach(v, k, e) {
      at = path_push(c, k);
      if ((rc = check_template(c, e, key))) return rc;
      path_pop(c, at);
    }
    return IDEM_OK;
  case JSON_ARRAY:
    json_array_foreach(v, i, e) {
      at = path_index(c, i);
      if ((rc = check_template(c, e, key))) return rc;
      path_pop(c, at);
    }
    return IDEM_OK;
  case JSON_STRING:
    s = json_string_value(v);
    n = json_string_length(v);
    if (strcmp(s, "{$key}") == 0) *key = 1;
    if (n >= 3 && s[0] == '{' && s[1] == '$' && s[n - 1] == '}' &&
        strcmp(s, "{$key}") != 0) {
      char q[QUOTED(40)];
      quote(q, s, 40);
      return fail(c,
                  "unknown placeholder %s (\"{$key}\" is the key, "
                  "\"{name}\" the argument name)",
                  q);
    }
    return IDEM_OK;
  default: return IDEM_OK;
  }
}

static const char *const STATUS_FIELDS[] = {"tool", "arguments", "command",
                                            "applied_when", NULL};
static const char *const WHEN_FIELDS[] = {"pointer", "equals", "key_present",
                                          NULL};

static int parse_applied_when(ctx *c, json_t *v, idem__status_rule *s) {
  json_t *ptr, *eq, *kp;
  size_t at;
  int rc;
  if (json_is_string(v)) {
    char q[QUOTED(40)];
    if (strcmp(json_string_value(v), "key_present") == 0) return IDEM_OK;
    quote(q, json_string_value(v), 40);
    return fail(c,
                "%s is not \"key_present\" (to test a value of the "
                "result, use {\"pointer\": ..., \"equals\": ...})",
                q);
  }
  if (!json_is_object(v))
    return fail(c,
                "expected \"key_present\" or an object {\"pointer\", "
                "\"equals\" or \"key_present\"}, found %s",
                type_name(v));
  if ((rc = check_members(c, v, WHEN_FIELDS))) return rc;
  ptr = json_object_get(v, "pointer");
  eq = json_object_get(v, "equals");
  kp = json_object_get(v, "key_present");
  at = path_push(c, "pointer");
  if (!ptr) return fail(c, "missing (the JSON pointer of the value to test)");
  if ((rc = want_pointer(c, ptr, &s->pointer))) return rc;
  path_pop(c, at);
  if (eq && kp)
    return fail(c, "has both equals and key_present; give one");
  if (kp) {
    path_push(c, "key_present");
    if (!json_is_true(kp))
      return fail(c, "expected true (the key appears under the pointer), "
                     "found %s",
                  json_is_false(kp) ? "false" : type_name(kp));
    path_pop(c, at);
    s->applied_when = IDEM__APPLIED_WHEN_KEY_AT;
    return IDEM_OK;
  }
  path_push(c, "equals");
  if (!eq)
    return fail(c, "missing (the value that means applied; or give "
                   "\"key_present\": true)");
  if ((rc = want_canonical(c, eq, &s->equals))) return rc;
  path_pop(c, at);
  s->applied_when = IDEM__APPLIED_WHEN_POINTER;
  return IDEM_OK;
}

static int parse_status(ctx *c, json_t *v, idem__tool_rule *r) {
  idem__status_rule *s = &r->status;
  const char *k;
  json_t *e;
  size_t at;
  int rc;
  if (!json_is_object(v))
    return fail(c,
                "expected an object {\"tool\" or \"command\", ...}, "
                "found %s",
                type_name(v));
  if ((rc = check_members(c, v, STATUS_FIELDS))) return rc;
  r->has_status = 1;
  json_object_foreach(v, k, e) {
    at = path_push(c, k);
    switch (find_name(STATUS_FIELDS, k)) {
    case 0: rc = want_name(c, e, "a status tool", &s->tool); break;
    case 1:
      if (!json_is_object(e))
        rc = fail(c,
                  "expected an object (the status tool's arguments), "
                  "found %s",
                  type_name(e));
      else if (!(rc = want_canonical(c, e, &s->arguments)))
        rc = check_template(c, e, &s->sends_key);
      break;
    case 2: rc = want_name(c, e, "a shell command", &s->command); break;
    default: rc = parse_applied_when(c, e, s); break;
    }
    if (rc) return rc;
    path_pop(c, at);
  }
  if (s->tool && s->command)
    return fail(c, "has both a tool and a command; name one (a tool for MCP "
                   "and HTTP, a command for idem exec)");
  if (!s->tool && !s->command)
    return fail(c, "needs a tool (a status tool, for MCP and HTTP) or a "
                   "command (for idem exec)");
  if (s->command && s->arguments) {
    path_push(c, "arguments");
    return fail(c, "only with a status tool; a status command gets the "
                   "call's environment");
  }
  if (s->command && json_object_get(v, "applied_when")) {
    path_push(c, "applied_when");
    return fail(c, "only with a status tool; a status command answers by "
                   "its exit status");
  }
  if (s->tool && !s->arguments && !(s->arguments = idem__strndup("{}", 2)))
    return nomem(c);
  return IDEM_OK;
}

static const char *const EXIT_LISTS[] = {"applied", "not_applied", "rejected",
                                         NULL};

static int parse_codes(ctx *c, const json_t *v, int *codes, int *n) {
  size_t i;
  int j;
  if (!json_is_array(v))
    return fail(c, "expected an array of exit statuses (0 to 255), found %s",
                type_name(v));
  if (json_array_size(v) > IDEM__MAX_EXIT_CODES)
    return fail(c, "more than %d exit statuses", IDEM__MAX_EXIT_CODES);
  *n = 0;
  for (i = 0; i < json_array_size(v); i++) {
    size_t at = path_index(c, i);
    int64_t x;
    int rc = want_int(c, json_array_get(v, i), 0, 255, &x);
    if (rc) return rc;
    for (j = 0; j < *n; j++)
      if (codes[j] == (int)x) return fail(c, "%d is listed twice", (int)x);
    codes[(*n)++] = (int)x;
    path_pop(c, at);
  }
  return IDEM_OK;
}

static int parse_exit_codes(ctx *c, json_t *v, idem__tool_rule *r) {
  int *codes[3], *counts[3], given[3] = {0, 0, 0}, a, b, i, j, rc;
  const char *k;
  json_t *e;
  codes[0] = r->exit_applied;
  counts[0] = &r->n_exit_applied;
  codes[1] = r->exit_not_applied;
  counts[1] = &r->n_exit_not_applied;
  codes[2] = r->exit_rejected;
  counts[2] = &r->n_exit_rejected;
  if (!json_is_object(v))
    return fail(c,
                "expected an object {\"applied\", \"not_applied\", "
                "\"rejected\"}, found %s",
                type_name(v));
  if ((rc = check_members(c, v, EXIT_LISTS))) return rc;
  json_object_foreach(v, k, e) {
    size_t at = path_push(c, k);
    a = find_name(EXIT_LISTS, k);
    given[a] = 1;
    if ((rc = parse_codes(c, e, codes[a], counts[a]))) return rc;
    if (a == 0 && *counts[0] == 0)
      return fail(c, "empty; some exit status must mean applied");
    path_pop(c, at);
  }
  for (a = 0; a < 3; a++)
    for (b = a + 1; b < 3; b++)
      for (i = 0; i < *counts[a]; i++)
        for (j = 0; j < *counts[b]; j++)
          if (codes[a][i] == codes[b][j])
            return fail(c, "exit status %d means both %s%s and %s%s",
                        codes[a][i], EXIT_LISTS[a],
                        given[a] ? "" : " (the default)", EXIT_LISTS[b],
                        given[b] ? "" : " (the default)");
  return IDEM_OK;
}

/* ---- http: an HTTP tool ------------------------------------------------------ */

static const char *const HTTP_FIELDS[] = {"method",     "url",    "headers",
                                          "key_header", "body",   "on_409",
                                          "on_429",     "on_5xx", NULL};
static const char *const METHODS[] = {"GET",   "POST",   "PUT",
                                      "PATCH", "DELETE", NULL};
static const char *const BODIES[] = {"arguments", "none", NULL};
static const char *const ANSWER_OUTCOMES[] = {"unknown", "not_applied",
                                              "rejected", NULL};
static const int ANSWER_OUTCOME_VALUES[] = {
    IDEM_OUTCOME_UNKNOWN, IDEM_OUTCOME_NOT_APPLIED, IDEM_OUTCOME_REJECTED};

/* An HTTP token (RFC 9110 §5.6.2): what a header name may be. */
static int is_token(const char *s) {
  if (!*s) return 0;
  for (; *s; s++)
    if (!(isalnum((unsigned char)*s) || strchr("!#$%&'*+-.^_`|~", *s)))
      return 0;
  return 1;
}

/* A template of a URL or a header value: every "{...}" is "{$key}",
** "{$env:NAME}" or "{ARGUMENT}"; no control characters (and no spaces in a
** URL, which must be percent-encoded). */
static int check_text_template(ctx *c, const char *s, int url) {
  const char *p, *end;
  char q[QUOTED(40)];
  for (p = s; *p; p++) {
    if ((unsigned char)*p < 0x20 || *p == 0x7f || (url && *p == ' ')) {
      quote(q, s, 40);
      return fail(c, "%s has %s at byte %zu%s", q,
                  *p == ' ' ? "a space" : "a control character",
                  (size_t)(p - s), url ? " (percent-encode it)" : "");
    }
    if (*p == '}') {
      quote(q, s, 40);
      return fail(c, "%s has a \"}\" without its \"{\" at byte %zu", q,
                  (size_t)(p - s));
    }
    if (*p != '{') continue;
    if (!(end = strchr(p + 1, '}')) || memchr(p + 1, '{', (size_t)(end - p))) {
      quote(q, s, 40);
      return fail(c, "%s has a \"{\" without its \"}\" at byte %zu", q,
                  (size_t)(p - s));
    }
    if (end == p + 1) {
      quote(q, s, 40);
      return fail(c, "%s has an empty placeholder \"{}\" at byte %zu", q,
                  (size_t)(p - s));
    }
    if (p[1] == '$') {
      size_t n = (size_t)(end - p - 1), i;
      int ok = n == 4 && memcmp(p + 1, "$key", 4) == 0;
      if (!ok && n > 5 && memcmp(p + 1, "$env:", 5) == 0) {
        ok = !isdigit((unsigned char)p[6]);
        for (i = 6; ok && p + i < end; i++)
          ok = isalnum((unsigned char)p[i]) || p[i] == '_';
      }
      if (!ok) {
        quote(q, s, 40);
        return fail(c,
                    "%s: unknown placeholder at byte %zu (\"{$key}\" is the "
                    "key, \"{$env:NAME}\" an environment variable, "
                    "\"{name}\" an argument)",
                    q, (size_t)(p - s));
      }
    }
    p = end;
  }
  return IDEM_OK;
}

static int parse_headers(ctx *c, json_t *v, idem__http_rule *h) {
  const char *k;
  json_t *e;
  size_t n = json_object_size(v);
  int rc;
  if (!json_is_object(v))
    return fail(c, "expected an object (header names to values), found %s",
                type_name(v));
  if (n > 64) return fail(c, "more than 64 headers");
  if (n && (!(h->hname = idem__malloc(n * sizeof *h->hname)) ||
            !(h->hvalue = idem__malloc(n * sizeof *h->hvalue))))
    return nomem(c);
  json_object_foreach(v, k, e) {
    size_t at = path_push(c, k);
    if (!is_token(k)) return fail(c, "not a header name (an HTTP token)");
    if (!strcasecmp(k, "Content-Length") || !strcasecmp(k, "Host") ||
        !strcasecmp(k, "Transfer-Encoding") || !strcasecmp(k, "Connection"))
      return fail(c, "is set by idem itself");
    if ((rc = want_string(c, e, "a header value", &h->hvalue[h->nheaders])))
      return rc;
    if (!(h->hname[h->nheaders] = idem__strdup(k))) {
      idem__free(h->hvalue[h->nheaders]);
      return nomem(c);
    }
    h->nheaders++;
    if ((rc = check_text_template(c, json_string_value(e), 0))) return rc;
    path_pop(c, at);
  }
  return IDEM_OK;
}

static int parse_http(ctx *c, json_t *v, idem__tool_rule *r) {
  idem__http_rule *h = &r->http;
  const char *k;
  json_t *e;
  size_t at, i;
  int rc, x, body = -1;
  if (!json_is_object(v))
    return fail(c, "expected an object {\"method\", \"url\", ...}, found %s",
                type_name(v));
  if ((rc = check_members(c, v, HTTP_FIELDS))) return rc;
  r->has_http = 1;
  h->on_409 = h->on_429 = h->on_5xx = IDEM_OUTCOME_UNKNOWN;
  json_object_foreach(v, k, e) {
    int f = find_name(HTTP_FIELDS, k);
    at = path_push(c, k);
    if (f >= 3 && f != 4 && r->cls != IDEM_CLASS_GUARDED)
      return fail(c, "only a guarded tool has %s; this one is %s", k,
                  class_name(r->cls));
    switch (f) {
    case 0:
      if (!(rc = want_enum(c, e, METHODS, &x)) &&
          !(h->method = idem__strdup(METHODS[x])))
        rc = nomem(c);
      break;
    case 1:
      if ((rc = want_name(c, e, "a URL", &h->url))) break;
      if (strncmp(h->url, "http://", 7) && strncmp(h->url, "https://", 8) &&
          strncmp(h->url, "{$env:", 6))
        rc = fail(c, "must start with http:// or https:// (or be an "
                     "environment variable, \"{$env:NAME}...\")");
      else
        rc = check_text_template(c, h->url, 1);
      break;
    case 2: rc = parse_headers(c, e, h); break;
    case 3:
      if (!(rc = want_name(c, e, "a header name", &h->key_header)) &&
          !is_token(h->key_header))
        rc = fail(c, "not a header name (an HTTP token)");
      break;
    case 4: rc = want_enum(c, e, BODIES, &body); break;
    default:
      if (!(rc = want_enum(c, e, ANSWER_OUTCOMES, &x)))
        *(f == 5   ? &h->on_409
          : f == 6 ? &h->on_429
                   : &h->on_5xx) = ANSWER_OUTCOME_VALUES[x];
      break;
    }
    if (rc) return rc;
    path_pop(c, at);
  }
  if (!h->url) return fail(c, "needs a \"url\"");
  if (!h->method && !(h->method = idem__strdup(
                          r->cls == IDEM_CLASS_GUARDED ? "POST" : "GET")))
    return nomem(c);
  if (r->cls == IDEM_CLASS_GUARDED && !h->key_header &&
      !(h->key_header = idem__strdup("Idempotency-Key")))
    return nomem(c);
  h->send_body = body >= 0
                     ? body == 0
                     : strcmp(h->method, "GET") && strcmp(h->method, "DELETE");
  if (h->send_body && !strcmp(h->method, "GET")) {
    path_push(c, "body");
    return fail(c, "a GET request has no body; pass the arguments in the "
                   "URL (\"{name}\")");
  }
  for (i = 0; h->key_header && i < h->nheaders; i++)
    if (!strcasecmp(h->hname[i], h->key_header)) {
      path_push(c, "headers");
      path_push(c, h->hname[i]);
      return fail(c, "is the key_header, which idem fills with the key");
    }
  return IDEM_OK;
}

/* The rule of one tool; c->path is "tools.NAME" and r has the defaults. */
static int parse_tool(ctx *c, json_t *obj, idem__tool_rule *r) {
  static const char *const SCOPES[] = {"session", "global", NULL};
  const char *k;
  json_t *v;
  int has_reconcile = 0, has_ttl = 0, i, rc;
  size_t at, n;
  if (!json_is_object(obj))
    return fail(c, "expected an object (the tool's rule), found %s",
                type_name(obj));
  if ((rc = check_members(c, obj, TOOL_FIELDS))) return rc;
  at = path_push(c, "class");
  if (!(v = json_object_get(obj, "class")))
    return fail(c, "missing; one of \"guarded\", \"idempotent\" or "
                   "\"read_only\"");
  if ((rc = want_enum(c, v, CLASS_NAMES, &i))) return rc;
  r->cls = CLASS_VALUES[i];
  path_pop(c, at);

  json_object_foreach(obj, k, v) {
    int f = find_name(TOOL_FIELDS, k);
    int64_t x = 0;
    at = path_push(c, k);
    if (GUARDED_ONLY[f] && r->cls != IDEM_CLASS_GUARDED)
      return fail(c, "only a guarded tool has %s; this one is %s",
                  GUARDED_ONLY[f], class_name(r->cls));
    switch (f) {
    case F_CLASS: rc = IDEM_OK; break;
    case F_TIMEOUT_MS: rc = want_int(c, v, 1, 86400000, &r->timeout_ms); break;
    case F_RETRIES: rc = want_int(c, v, 0, 100, &r->retries); break;
    case F_BACKOFF_MS: rc = want_int(c, v, 0, 3600000, &r->backoff_ms); break;
    case F_RECONCILE_TIMEOUT_MS:
      rc = want_int(c, v, 1, 86400000, &r->reconcile_timeout_ms);
      has_reconcile = 1;
      break;
    case F_WAIT_MS: rc = want_int(c, v, 0, 86400000, &r->wait_ms); break;
    case F_SETTLE_MS:
      rc = want_int(c, v, 0, 2592000000, &r->settle_ms);
      break;
    case F_PROVIDER_DEDUPES: rc = want_bool(c, v, &r->provider_dedupes); break;
    case F_PROVIDER_KEY_TTL_S:
      rc = want_int(c, v, 1, 31536000, &r->provider_key_ttl_s);
      has_ttl = 1;
      break;
    case F_KEY_ARG:
      rc = want_name(c, v, "an argument name", &r->key_arg);
      break;
    case F_KEY_MAX_LEN:
      if (!(rc = want_int(c, v, 66, 65536, &x))) r->key_max_len = (size_t)x;
      break;
    case F_FENCE: rc = parse_fence(c, v, r); break;
    case F_FENCE_SCOPE:
      if (!(rc = want_enum(c, v, SCOPES, &i))) r->fence_global = i == 1;
      break;
    case F_REPEAT_WINDOW_S:
      rc = want_int(c, v, 0, 31536000, &r->repeat_window_s);
      break;
    case F_RETENTION_S:
      rc = want_int(c, v, 1, 315360000, &r->retention_s);
      break;
    case F_STATUS: rc = parse_status(c, v, r); break;
    case F_EXIT_CODES: rc = parse_exit_codes(c, v, r); break;
    case F_COALESCE_MS:
      rc = want_int(c, v, 0, 3600000, &r->coalesce_ms);
      break;
    case F_ON_IS_ERROR:
      if (!(rc = want_enum(c, v, ANSWER_OUTCOMES, &i)))
        r->on_is_error = ANSWER_OUTCOME_VALUES[i];
      break;
    case F_NOTE: /* a person's words (a drafted policy's); never read */
      rc = json_is_string(v) ? IDEM_OK
                             : fail(c, "expected a string (a note for the "
                                       "reader), found %s",
                                    type_name(v));
      break;
    default: rc = parse_http(c, v, r); break;
    }
    if (rc) return rc;
    path_pop(c, at);
  }

  /* combinations */
  if (!has_reconcile) r->reconcile_timeout_ms = r->timeout_ms;
  if (has_ttl && !r->provider_dedupes) {
    path_push(c, "provider_key_ttl_s");
    return fail(c, "only with \"provider_dedupes\": true");
  }
  for (n = 0; r->key_arg && n < r->nfence; n++)
    if (strcmp(r->fence[n], r->key_arg) == 0) {
      path_push(c, "fence");
      path_index(c, n);
      return fail(c, "names the key_arg, which idem overwrites with the key, "
                     "so it cannot tell calls apart");
    }
  if (r->repeat_window_s > r->retention_s) {
    path_push(c, "repeat_window_s");
    return fail(c,
                "%lld s is longer than retention_s (%lld s): the records "
                "would be gone before the window ends",
                (long long)r->repeat_window_s, (long long)r->retention_s);
  }
  if (r->has_http && json_object_get(obj, "exit_codes")) {
    path_push(c, "exit_codes");
    return fail(c, "only for a command run by idem exec; an HTTP tool's "
                   "answers are classified by their HTTP status");
  }
  if (r->status.tool && strcmp(r->status.tool, r->name) == 0) {
    path_push(c, "status");
    path_push(c, "tool");
    return fail(c, "is the tool itself; a status check must be another, "
                   "read_only tool");
  }
  return IDEM_OK;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const idem__tool_rule *)a)->name,
                ((const idem__tool_rule *)b)->name);
}

static const idem__tool_rule *find_rule(const idem_policy *p,
                                        const char *name) {
  size_t lo = 0, hi = p->ntools;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int d = strcmp(name, p->tools[mid].name);
    if (d == 0) return &p->tools[mid];
    if (d < 0)
      hi = mid;
    else
      lo = mid + 1;
  }
  return NULL;
}


/* A status request that carries the key ("{$key}" in its arguments, or in
** an HTTP status tool's URL or headers) may come back in the answer: many
** APIs echo their query.  Then the key anywhere in the result proves
** nothing, and applied_when must say where the provider's records are. */
static int sends_key(const idem__status_rule *st, const idem__tool_rule *s) {
  size_t i;
  if (st->sends_key) return 1;
  if (!s->has_http) return 0;
  if (s->http.url && strstr(s->http.url, "{$key}")) return 1;
  for (i = 0; i < s->http.nheaders; i++)
    if (strstr(s->http.hvalue[i], "{$key}")) return 1;
  return 0;
}

static int check_echo(ctx *c, const idem__status_rule *st,
                      const idem__tool_rule *s) {
  if (!sends_key(st, s)) return IDEM_OK;
  if (st->applied_when == IDEM__APPLIED_WHEN_KEY_PRESENT ||
      (st->applied_when == IDEM__APPLIED_WHEN_KEY_AT && !st->pointer[0])) {
    return fail(c, "the status request sends the key, so the key anywhere in "
                   "the answer may be the query echoed; say where the "
                   "records are, e.g. {\"pointer\": \"/refunds\", "
                   "\"key_present\": true}");
  }
  return IDEM_OK;
}

static int parse_root(ctx *c, json_t *root) {
  static const char *const ROOT_FIELDS[] = {"unknown_tools", "tools", NULL};
  static const char *const UNKNOWN[] = {"refuse", "guard", "pass", NULL};
  static const int UNKNOWN_CLASS[] = {IDEM_CLASS_REFUSED, IDEM_CLASS_GUARDED,
                                      IDEM_CLASS_READ_ONLY};
  idem_policy *p = c->p;
  json_t *tools, *v;
  const char *k;
  size_t at, i, tool_at;
  int rc, u;
  if (!json_is_object(root))
    return fail(c,
                "expected an object {\"unknown_tools\", \"tools\"}, "
                "found %s",
                type_name(root));
  if ((rc = check_members(c, root, ROOT_FIELDS))) return rc;
  if ((v = json_object_get(root, "unknown_tools")) != NULL) {
    at = path_push(c, "unknown_tools");
    if ((rc = want_enum(c, v, UNKNOWN, &u))) return rc;
    p->unknown_tools = UNKNOWN_CLASS[u];
    path_pop(c, at);
  }
  at = path_push(c, "tools");
  if (!(tools = json_object_get(root, "tools")))
    return fail(c, "missing; a policy names its tools (\"tools\": {} names "
                   "none)");
  if (!json_is_object(tools))
    return fail(c, "expected an object (tool names to their rules), found %s",
                type_name(tools));
  if (json_object_size(tools) > 0 &&
      !(p->tools = idem__malloc(json_object_size(tools) * sizeof *p->tools)))
    return nomem(c);
  json_object_foreach(tools, k, v) {
    idem__tool_rule *r = &p->tools[p->ntools];
    tool_at = path_push(c, k);
    if (!*k) return fail(c, "a tool name must not be empty");
    idem__rule_defaults(r, NULL);
    if (!(r->name = idem__strndup(k, strlen(k)))) return nomem(c);
    p->ntools++;
    if ((rc = parse_tool(c, v, r))) return rc;
    path_pop(c, tool_at);
  }
  if (p->ntools) qsort(p->tools, p->ntools, sizeof *p->tools, by_name);

  /* status tools: named by the policy, read_only */
  for (i = 0; i < p->ntools; i++) {
    const idem__tool_rule *r = &p->tools[i], *s;
    char q[QUOTED(40)];
    if (!r->status.tool) continue;
    path_pop(c, at);
    path_push(c, "tools");
    path_push(c, r->name);
    path_push(c, "status");
    tool_at = path_push(c, "tool");
    quote(q, r->status.tool, 40);
    if (!(s = find_rule(p, r->status.tool)))
      return fail(c,
                  "%s is not named in the policy; a status tool must be, "
                  "as read_only",
                  q);
    if (s->cls != IDEM_CLASS_READ_ONLY)
      return fail(c, "%s is %s; a status tool must be read_only", q,
                  class_name(s->cls));
    path_pop(c, tool_at);
    path_push(c, "applied_when");
    if ((rc = check_echo(c, &r->status, s))) return rc;
  }
  return IDEM_OK;
}

/* ---- warnings ------------------------------------------------------------- */

#define MAX_WARNINGS 32 /* a policy keeps this many warnings at most */

typedef struct folded {
  char *text; /* the name case folded and in NFC */
  size_t len;
  const char *name;
} folded;

static int by_folded(const void *a, const void *b) {
  const folded *x = a, *y = b;
  size_t n = x->len < y->len ? x->len : y->len;
  int d = memcmp(x->text, y->text, n);
  if (d) return d;
  if (x->len != y->len) return x->len < y->len ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Keep the warning w (one line); past MAX_WARNINGS, drop it. */
static int warn(ctx *c, const char *w) {
  idem_policy *p = c->p;
  if (p->nwarnings >= MAX_WARNINGS) return IDEM_OK;
  if (!p->warnings &&
      !(p->warnings = idem__malloc(MAX_WARNINGS * sizeof *p->warnings)))
    return nomem(c);
  if (!(p->warnings[p->nwarnings] = idem__strndup(w, strlen(w))))
    return nomem(c);
  p->nwarnings++;
  return IDEM_OK;
}

/* Warn of a guarded tool whose retention_s is shorter than an attempt may
** take to land (timeout_ms + settle_ms, settle_ms counting 0 when it is
** unbounded): a call retried after waiting that long may find its record
** deleted by idem gc, and run again. */
static int check_retention(ctx *c) {
  idem_policy *p = c->p;
  size_t i;
  int rc = IDEM_OK;
  for (i = 0; i < p->ntools && !rc; i++) {
    const idem__tool_rule *r = &p->tools[i];
    long long land = (long long)r->timeout_ms +
                     (r->settle_ms > 0 ? (long long)r->settle_ms : 0);
    char w[sizeof c->path + 240];
    ctx at;
    if (r->cls != IDEM_CLASS_GUARDED || r->retention_s * 1000 >= land)
      continue;
    memset(&at, 0, sizeof at);
    path_push(&at, "tools");
    path_push(&at, r->name);
    path_push(&at, "retention_s");
    snprintf(w, sizeof w,
             "%s: %lld s is shorter than timeout_ms + settle_ms (%lld ms), "
             "the time an attempt may take to land: a call retried after "
             "waiting that long may find its record deleted by idem gc, and "
             "run again",
             at.path, (long long)r->retention_s, land);
    rc = warn(c, w);
  }
  return rc;
}

/* Warn of tool names that are one name to a reader: equal after Unicode
** case folding and NFC (fold.c), though idem matches names byte for byte -
** "Refund" and "refund", or "café" written with a combining accent. */
static int check_names(ctx *c) {
  idem_policy *p = c->p;
  folded *f;
  size_t i;
  int rc = IDEM_OK;
  if (p->ntools < 2) return IDEM_OK;
  if (!(f = idem__malloc(p->ntools * sizeof *f))) return nomem(c);
  memset(f, 0, p->ntools * sizeof *f);
  for (i = 0; i < p->ntools && !rc; i++) {
    f[i].name = p->tools[i].name;
    if (!(f[i].text = idem__name_fold(f[i].name, &f[i].len))) rc = nomem(c);
  }
  if (!rc) qsort(f, p->ntools, sizeof *f, by_folded);
  for (i = 1; i < p->ntools && !rc && p->nwarnings < MAX_WARNINGS; i++) {
    char a[QUOTED(64)], b[QUOTED(64)], ea[QUOTED(64)], eb[QUOTED(64)];
    char esc[2 * QUOTED(64) + 16], w[4 * QUOTED(64) + 200];
    if (f[i].len != f[i - 1].len || memcmp(f[i].text, f[i - 1].text, f[i].len))
      continue;
    quote(a, f[i - 1].name, 64);
    quote(b, f[i].name, 64);
    quote_as(ea, f[i - 1].name, 64, 1);
    quote_as(eb, f[i].name, 64, 1);
    esc[0] = '\0'; /* ASCII names show their difference as they are */
    if (strcmp(a, ea) != 0 || strcmp(b, eb) != 0)
      snprintf(esc, sizeof esc, " (%s and %s)", ea, eb);
    snprintf(w, sizeof w,
             "tools: %s and %s%s differ only in case or Unicode "
             "normalization (NFC); idem tells them apart, so each has its "
             "own rule - name each tool once",
             a, b, esc);
    rc = warn(c, w);
  }
  for (i = 0; i < p->ntools; i++) idem__free(f[i].text);
  idem__free(f);
  return rc;
}

/* Parse text into the empty policy p. */
static int parse_into(idem_policy *p, const char *text, size_t len,
                      const char *origin) {
  json_error_t jerr;
  json_t *root;
  ctx c;
  int rc;
  memset(&c, 0, sizeof c);
  c.p = p;
  root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
  if (!root) {
    char *s;
    if (json_error_code(&jerr) == json_error_out_of_memory) return nomem(&c);
    for (s = jerr.text; *s; s++) /* jansson quotes raw input bytes */
      if ((unsigned char)*s < 0x20 || *s == 0x7f) *s = '?';
    if (jerr.line > 0)
      snprintf(p->errmsg, sizeof p->errmsg, "%s%sline %d, column %d: %s",
               origin ? origin : "", origin ? ": " : "", jerr.line, jerr.column,
               jerr.text);
    else
      snprintf(p->errmsg, sizeof p->errmsg, "%s%s%s", origin ? origin : "",
               origin ? ": " : "", jerr.text);
    trim_utf8(p->errmsg);
    p->err = IDEM_POLICY;
    return IDEM_POLICY;
  }
  rc = parse_root(&c, root);
  if (!rc) rc = check_names(&c);
  if (!rc) rc = check_retention(&c);
  json_decref(root);
  idem_canon_close(c.canon);
  if (rc) policy_clear(p);
  return rc;
}

/* ---- the public face --------------------------------------------------------- */

static int policy_new(idem_policy **out) {
  idem_policy *p;
  if (!out) return IDEM_MISUSE;
  *out = p = idem__malloc(sizeof *p);
  if (!p) return IDEM_NOMEM;
  memset(p, 0, sizeof *p);
  p->magic = IDEM__POLICY_MAGIC;
  p->unknown_tools = IDEM_CLASS_REFUSED;
  return IDEM_OK;
}

static int policy_misuse(idem_policy *p, const char *what) {
  snprintf(p->errmsg, sizeof p->errmsg, "%s", what);
  p->err = IDEM_MISUSE;
  return IDEM_MISUSE;
}

static int io_error(idem_policy *p, const char *path, int e) {
  char why[128];
  if (strerror_r(e, why, sizeof why) != 0)
    snprintf(why, sizeof why, "error %d", e);
  snprintf(p->errmsg, sizeof p->errmsg, "%s: %s", path, why);
  trim_utf8(p->errmsg);
  p->err = IDEM_IO;
  return IDEM_IO;
}

int idem_policy_parse(const char *text, size_t len, const char *origin,
                      idem_policy **out) {
  idem_policy *p;
  int rc = policy_new(out);
  if (rc) return rc;
  p = *out;
  if (!text && len) return policy_misuse(p, "no text");
  if (origin && !*origin) origin = NULL;
  return p->err = parse_into(p, text ? text : "", len, origin);
}

int idem_policy_load(const char *path, idem_policy **out) {
  idem__buf b;
  idem_policy *p;
  FILE *f;
  int rc = policy_new(out), e = 0;
  if (rc) return rc;
  p = *out;
  if (!path || !*path) return policy_misuse(p, "no policy file named");
  if (!(f = fopen(path, "rb"))) return io_error(p, path, errno);
  idem__buf_init(&b, MAX_FILE_BYTES + 1);
  for (;;) {
    size_t n;
    if ((rc = idem__buf_reserve(&b, 65536)) == IDEM_RANGE)
      rc = idem__buf_reserve(&b, b.cap - b.len);
    if (rc == IDEM_NOMEM || b.alloc == b.len) break;
    errno = 0;
    n = fread(b.p + b.len, 1, b.alloc - b.len, f);
    b.len += n;
    if (n == 0) {
      e = ferror(f) ? (errno ? errno : EIO) : 0;
      break;
    }
  }
  fclose(f);
  if (rc == IDEM_NOMEM) {
    snprintf(p->errmsg, sizeof p->errmsg, "out of memory");
    p->err = IDEM_NOMEM;
  } else if (e) {
    io_error(p, path, e);
  } else if (b.len > MAX_FILE_BYTES) {
    snprintf(p->errmsg, sizeof p->errmsg,
             "%s: larger than the limit of %u bytes", path, MAX_FILE_BYTES);
    trim_utf8(p->errmsg);
    p->err = IDEM_POLICY;
  } else {
    p->err = parse_into(p, b.p ? b.p : "", b.len, path);
  }
  idem__buf_free(&b);
  return p->err;
}

void idem_policy_free(idem_policy *p) {
  if (!p || p->magic != IDEM__POLICY_MAGIC) return;
  policy_clear(p);
  p->magic = IDEM__MAGIC_DEAD;
  idem__free(p);
}

const char *idem_policy_errmsg(const idem_policy *p) {
  if (!p || p->magic != IDEM__POLICY_MAGIC) return "bad idem_policy handle";
  return p->err ? p->errmsg : "";
}

const idem__tool_rule *idem__policy_rule(const idem_policy *p, const char *tool,
                                         idem__tool_rule *scratch) {
  const idem__tool_rule *r;
  if (!p) {
    idem__rule_defaults(scratch, tool);
    return scratch;
  }
  if (p->magic == IDEM__POLICY_MAGIC && tool && (r = find_rule(p, tool)))
    return r;
  idem__rule_defaults(scratch, tool);
  scratch->cls = p->magic == IDEM__POLICY_MAGIC && tool ? p->unknown_tools
                                                        : IDEM_CLASS_REFUSED;
  return scratch;
}

long long idem__lease_ms(const idem__tool_rule *r) {
  return r->timeout_ms * (r->retries + 1) + r->reconcile_timeout_ms + 10000;
}

int idem_policy_class(const idem_policy *p, const char *tool) {
  idem__tool_rule scratch;
  return idem__policy_rule(p, tool, &scratch)->cls;
}

static void codes_out(int *dst, int *n, const int *src, int count) {
  memcpy(dst, src, (size_t)count * sizeof *src);
  *n = count;
}

size_t idem_policy_tool_count(const idem_policy *p) {
  return p && p->magic == IDEM__POLICY_MAGIC ? p->ntools : 0;
}

const char *idem_policy_tool_name(const idem_policy *p, size_t i) {
  return i < idem_policy_tool_count(p) ? p->tools[i].name : NULL;
}

const char *idem_policy_warning(const idem_policy *p, size_t i) {
  if (!p || p->magic != IDEM__POLICY_MAGIC) return NULL;
  return i < p->nwarnings ? p->warnings[i] : NULL;
}

int idem_policy_tool(const idem_policy *p, const char *tool,
                     idem_tool_info *out) {
  idem__tool_rule scratch;
  const idem__tool_rule *r;
  idem_tool_info i;
  if (!tool || (p && p->magic != IDEM__POLICY_MAGIC)) return IDEM_MISUSE;
  r = idem__policy_rule(p, tool, &scratch);
  memset(&i, 0, sizeof i);
  i.size = sizeof i;
  i.named = r != &scratch;
  i.cls = r->cls;
  i.timeout_ms = r->timeout_ms;
  i.retries = r->retries;
  i.backoff_ms = r->backoff_ms;
  i.reconcile_timeout_ms = r->reconcile_timeout_ms;
  i.wait_ms = r->wait_ms;
  i.settle_ms = r->settle_ms;
  i.lease_ms = idem__lease_ms(r);
  i.coalesce_ms = r->coalesce_ms;
  i.repeat_window_s = r->repeat_window_s;
  i.retention_s = r->retention_s;
  i.provider_dedupes = r->provider_dedupes;
  /* scratch's strings are the caller's tool name or NULL: none borrowed */
  i.key_arg = i.named ? r->key_arg : NULL;
  i.has_status = r->has_status;
  i.status_tool = r->has_status ? r->status.tool : NULL;
  i.status_command = r->has_status ? r->status.command : NULL;
  i.http = r->has_http;
  i.on_is_error = r->on_is_error;
  codes_out(i.exit_applied, &i.n_exit_applied, r->exit_applied,
            r->n_exit_applied);
  codes_out(i.exit_not_applied, &i.n_exit_not_applied, r->exit_not_applied,
            r->n_exit_not_applied);
  codes_out(i.exit_rejected, &i.n_exit_rejected, r->exit_rejected,
            r->n_exit_rejected);
  return idem__abi_out(out, &i, sizeof i, IDEM__ABI_MIN(idem_tool_info));
}

/* ---- explain ------------------------------------------------------------------
** Plain English, one paragraph per line, paragraphs separated by a blank
** line; the command wraps them for the terminal. */

typedef struct text {
  idem__buf b;
  int rc;
} text;

/* The text said, NUL-terminated, into *out (the caller's to free). */
static int text_done(text *t, char **out) {
  if (!t->rc) t->rc = idem__buf_append(&t->b, "", 1);
  if (t->rc) {
    idem__buf_free(&t->b);
    return t->rc == IDEM_RANGE ? IDEM_NOMEM : t->rc;
  }
  *out = t->b.p;
  return IDEM_OK;
}

static void say(text *t, const char *fmt, ...) PRINTF_LIKE(2, 3);
static void say(text *t, const char *fmt, ...) {
  va_list ap;
  int n;
  if (t->rc) return;
  va_start(ap, fmt);
  n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) {
    t->rc = IDEM_ERROR;
    return;
  }
  if ((t->rc = idem__buf_reserve(&t->b, (size_t)n + 1)) != IDEM_OK) return;
  va_start(ap, fmt);
  vsnprintf(t->b.p + t->b.len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  t->b.len += (size_t)n;
}

/* A tool name as is when it is a plain identifier of at most 64 bytes, else
** as a JSON string cut at 64 bytes; argument names always as JSON strings. */
static void say_name(text *t, const char *name, int always_quote) {
  char q[QUOTED(64)];
  if (!always_quote && plain_name(name) && strlen(name) <= 64)
    say(t, "%s", name);
  else {
    quote(q, name, 64);
    say(t, "%s", q);
  }
}

static void say_human(text *t, long long s) {
  static const struct {
    long long n;
    const char *unit;
  } U[] = {{86400, "day"}, {3600, "hour"}, {60, "minute"}};
  size_t i;
  for (i = 0; i < sizeof U / sizeof U[0]; i++)
    if (s >= U[i].n && s % U[i].n == 0) {
      say(t, " (%lld %s%s)", s / U[i].n, U[i].unit, s == U[i].n ? "" : "s");
      return;
    }
}

static void say_ms(text *t, int64_t ms) {
  say(t, "%lld ms", (long long)ms);
  if (ms >= 60000 && ms % 1000 == 0) say_human(t, ms / 1000);
}

static void say_s(text *t, int64_t s) {
  say(t, "%lld s", (long long)s);
  say_human(t, s);
}

static void say_codes(text *t, const int *codes, int n) {
  int i;
  if (n == 0) say(t, "no exit status");
  for (i = 0; i < n; i++)
    say(t, "%s%d", i == 0 ? "" : i == n - 1 ? " or " : ", ", codes[i]);
}

static void explain_guarded(text *t, const idem__tool_rule *r,
                            const char *tool) {
  const idem__status_rule *s = &r->status;
  size_t i;

  say_name(t, tool, 0);
  say(t, " is guarded: it changes the world, so every call to it goes "
         "through the guard. The call is written to the attempt log before "
         "it goes downstream, and it takes effect at most once.\n\n");

  say(t, "The same action: a call repeats an earlier one when it has the "
         "same session, the same tool-call id and the same canonical "
         "arguments (RFC 8785)");
  if (r->key_arg) {
    say(t, ", leaving out the argument ");
    say_name(t, r->key_arg, 1);
    say(t, ", where idem writes the key");
  }
  say(t, ". A repeat gets the recorded outcome back without a new call "
         "downstream; the same call id with other arguments is a conflict, "
         "and nothing runs.\n\n");

  say(t, "The fence: models re-issue calls under new call ids. A call to ");
  say_name(t, tool, 0);
  say(t, " with a new call id, in %s, with ",
      r->fence_global ? "any session" : "the same session");
  if (r->nfence == 0)
    say(t, "the same fingerprint (the same canonical arguments)");
  else {
    say(t, "the same value%s of ", r->nfence > 1 ? "s" : "");
    for (i = 0; i < r->nfence; i++) {
      if (i) say(t, "%s", i == r->nfence - 1 ? " and " : ", ");
      say_name(t, r->fence[i], 1);
    }
    say(t, " (compared by text, as a tool formats a value into its "
           "request: 1001 and \"1001\" are one value, true and \"true\" "
           "too, and null, \"null\" and a missing argument; an object or "
           "an array must be the same JSON)");
  }
  say(t, ", is held while the earlier call is in flight, in doubt, or its "
         "outcome has not yet been told to the model. idem waits for or "
         "checks the earlier call: if it took effect, the new call is "
         "answered already_applied with its result; if it did not, the new "
         "call goes on. Once the model has been told the outcome, a new call "
         "is a new decision and goes through");
  if (r->repeat_window_s > 0) {
    say(t, ", unless it comes within ");
    say_s(t, r->repeat_window_s);
    say(t, " of the earlier one (repeat_window_s): then it is answered "
           "already_applied too");
  }
  say(t, ".\n\n");

  say(t, "One turn, one action: identical calls the model made in one turn "
         "are one decision. When the harness names the turn, the first "
         "identical call of a turn runs and the others are answered "
         "already_applied with its result, even after it was told. ");
  if (r->coalesce_ms > 0) {
    say(t, "Calls without a turn id count as one turn when they begin "
           "within ");
    say_ms(t, r->coalesce_ms);
    say(t, " of each other (coalesce_ms).\n\n");
  } else
    say(t, "Calls without a turn id have no window (coalesce_ms is 0): "
           "only the fence above holds them.\n\n");

  say(t,
      "The key: idem mints SESSION:CALLID:DIGEST, DIGEST being the first "
      "16 hex digits of the SHA-256 of the canonical "
      "{\"args\":...,\"tool\":...}; a key longer than %zu characters "
      "becomes \"h:\" and 64 hex digits. It travels downstream ",
      r->key_max_len);
  if (r->key_arg) {
    say(t, "in the argument ");
    say_name(t, r->key_arg, 1);
    say(t, " (replacing whatever the model put there), ");
  }
  say(t, "in IDEM_KEY under idem exec and in _meta \"io.idem/key\" through "
         "MCP.\n\n");

  say(t,
      "Retries: a call that certainly did not take effect (not sent, or "
      "refused as retryable) is sent again with the same key up to %lld "
      "time%s, first after ",
      (long long)r->retries, r->retries == 1 ? "" : "s");
  say_ms(t, r->backoff_ms);
  say(t, ", doubling each time.\n\n");

  say(t, "On a timeout: ");
  say_name(t, tool, 0);
  say(t, " has ");
  say_ms(t, r->timeout_ms);
  say(t, " to answer. A timeout or a dropped connection does not mean it "
         "failed: the outcome is unknown and the action is in doubt (outcome "
         "unknown, never failed). ");
  if (r->provider_dedupes) {
    say(t, "The provider deduplicates on the key for ");
    say_s(t, r->provider_key_ttl_s);
    say(t,
        ", so idem may send the call again with the same key, up to %lld "
        "time%s, while the key is younger than that - once the attempt in "
        "doubt has ended (it was answered, if unreadably); one that may "
        "still land is reconciled instead. ",
        (long long)r->retries, r->retries == 1 ? "" : "s");
  } else {
    say(t, "The provider is not known to deduplicate on the key, so idem "
           "never resends a call whose outcome is unknown. ");
  }
  if (r->has_status && s->tool) {
    say(t, "Then idem reconciles: it calls the status tool ");
    say_name(t, s->tool, 0);
    say(t,
        " with the arguments %s (\"{name}\" stands for the call's "
        "argument name, \"{$key}\" for the key), and counts the call as "
        "applied when ",
        s->arguments ? s->arguments : "{}");
    if (s->applied_when == IDEM__APPLIED_WHEN_POINTER) {
      say(t, "the value at ");
      say_name(t, s->pointer, 1);
      say(t, " in its result equals %s", s->equals);
    } else if (s->applied_when == IDEM__APPLIED_WHEN_KEY_AT) {
      say(t, "the key appears as a string in the value at ");
      say_name(t, s->pointer, 1);
      say(t, " in its result");
    } else {
      say(t, "the key appears as a string in its result");
    }
    say(t, ". ");
  } else if (r->has_status && s->command) {
    say(t, "Then idem reconciles: it runs the status command ");
    say_name(t, s->command, 1);
    say(t, " (sh -c, with IDEM_KEY and the call's environment); exit 0 means "
           "applied (its output is the result), 100 not applied, anything "
           "else unknown. ");
  }
  if (r->has_status) {
    say(t, "Reconciling gives up after ");
    say_ms(t, r->reconcile_timeout_ms);
    say(t, ". Applied: the result is recorded and returned. Not applied: ");
    if (r->provider_dedupes)
      say(t, "the call runs again with the same key (the provider "
             "deduplicates it). ");
    else
      say(t, "that proves only that the attempt has not landed yet, so the "
             "call runs again only when no earlier attempt can still land "
             "(see below). ");
    say(t, "Still unknown: the model gets outcome_unknown%s, and is told "
           "not to call ",
        s->tool ? " with the status check to make" : "");
    say_name(t, tool, 0);
    say(t, " again before checking.\n\n");
  } else {
    say(t, "There is no status check in the policy: the model gets "
           "outcome_unknown, and the fence holds every re-issue of this call "
           "until the late result arrives or the action is checked (idem "
           "recover, or idem exec --status).\n\n");
  }

  say(t, "Attempts still in flight: ");
  if (r->settle_ms < 0)
    say(t, "after a timeout or a crash this tool may still apply at any "
           "later time (settle_ms is not set), so a retry waits until the "
           "attempt is known to have ended - its command and process group "
           "exited, its tool function returned, its server answered - or a "
           "status check finds it applied; until then the answer is "
           "outcome_unknown or in_progress.\n\n");
  else if (r->settle_ms == 0)
    say(t, "its effects end with its executor (settle_ms 0): once the "
           "deadline has passed or the executor has died, an attempt that "
           "a status check does not show counts as never landing, and idem "
           "exec kills what is left of its command at the deadline.\n\n");
  else {
    say(t, "after a timeout or a crash this tool may still apply for up "
           "to ");
    say_ms(t, r->settle_ms);
    say(t, " (settle_ms), counted from the attempt's deadline or its "
           "executor's death, whichever came first; until then a retry "
           "waits (the answer is outcome_unknown or in_progress), unless "
           "the attempt is known to have ended. idem exec kills what is "
           "left of the command when that time is up.\n\n");
  }

  say(t, "Another owner: when another process holds this action, idem waits "
         "up to ");
  say_ms(t, r->wait_ms);
  say(t, " for it, then answers in_progress.\n\n");

  if (r->has_http) {
    const idem__http_rule *h = &r->http;
    static const char *const word[] = {"?", "applied", "rejected",
                                       "not applied", "unknown"};
    say(t, "It is an HTTP call (idem call): %s ", h->method);
    say_name(t, h->url, 1);
    say(t,
        ", with the key in the %s header%s. Connection refused before "
        "sending means not applied; a timeout or reset after sending, "
        "unknown; 2xx applied; 409 %s, 429 %s, 5xx %s; any other 4xx "
        "rejected.\n\n",
        h->key_header,
        h->send_body ? " and the arguments as the JSON body" : "",
        word[h->on_409], word[h->on_429], word[h->on_5xx]);
  } else {
    say(t, "Under idem exec, the command's exit status ");
    say_codes(t, r->exit_applied, r->n_exit_applied);
    say(t, " means applied, ");
    say_codes(t, r->exit_not_applied, r->n_exit_not_applied);
    say(t, " not applied (retry allowed), ");
    say_codes(t, r->exit_rejected, r->n_exit_rejected);
    say(t, " rejected; any other exit, a signal or the deadline means "
           "unknown.\n\n");
  }

  if (!r->has_http) {
    say(t, "Under idem mcp, a result with isError true means ");
    if (r->on_is_error == IDEM_OUTCOME_REJECTED)
      say(t, "rejected: nothing applied, and the call is answered failed "
             "(on_is_error \"rejected\").\n\n");
    else if (r->on_is_error == IDEM_OUTCOME_NOT_APPLIED)
      say(t, "not applied: nothing applied, and the call may run again "
             "with the same key (on_is_error \"not_applied\").\n\n");
    else
      say(t, "unknown (the default): the server's own handler may have "
             "applied the action before it failed, so it is reconciled as "
             "after a timeout.\n\n");
  }

  say(t, "Retention: the record of each call is kept ");
  say_s(t, r->retention_s);
  say(t, " after it ends; then idem gc may delete it, and a repeat of that "
         "call would run as a new action.\n");
}

int idem_policy_explain(const idem_policy *p, const char *tool, char **out) {
  const idem__tool_rule *r;
  idem__tool_rule scratch;
  text t;
  size_t i, users = 0;
  if (!out) return IDEM_MISUSE;
  *out = NULL;
  if (!tool || (p && (p->magic != IDEM__POLICY_MAGIC || p->err)))
    return IDEM_MISUSE;
  idem__buf_init(&t.b, MAX_EXPLAIN);
  t.rc = IDEM_OK;
  r = idem__policy_rule(p, tool, &scratch);

  if (!p) {
    say(&t, "No policy is loaded, so every tool is guarded with the default "
            "settings.\n\n");
  } else if (r == &scratch) {
    say(&t, "The policy does not name ");
    say_name(&t, tool, 0);
    say(&t, ", and it %s unknown tools",
        r->cls == IDEM_CLASS_REFUSED   ? "refuses"
        : r->cls == IDEM_CLASS_GUARDED ? "guards"
                                       : "lets pass");
    if (r->cls == IDEM_CLASS_REFUSED) {
      say(&t, ": a call to ");
      say_name(&t, tool, 0);
      say(&t, " is answered refused, and nothing runs. To allow it, add it "
              "to the policy's tools with its class.\n");
    } else if (r->cls == IDEM_CLASS_GUARDED) {
      say(&t, " with the default settings.\n\n");
    } else {
      say(&t, ": ");
      say_name(&t, tool, 0);
      say(&t, " runs as a read-only tool, as it is: nothing is recorded, "
              "and there is no key, no fence and no reconciliation.\n");
    }
  }
  switch (r->cls) {
  case IDEM_CLASS_GUARDED: explain_guarded(&t, r, tool); break;
  case IDEM_CLASS_IDEMPOTENT:
    say_name(&t, tool, 0);
    say(&t, " is idempotent: repeating it is safe, so idem runs it without "
            "a record, a key or a fence. It gets ");
    say_ms(&t, r->timeout_ms);
    say(&t,
        " per attempt, and a failed attempt is retried up to %lld "
        "time%s, first after ",
        (long long)r->retries, r->retries == 1 ? "" : "s");
    say_ms(&t, r->backoff_ms);
    say(&t, ", doubling each time.\n");
    break;
  case IDEM_CLASS_READ_ONLY:
    if (r != &scratch) {
      say_name(&t, tool, 0);
      say(&t, " is read-only: idem runs it as it is and records nothing. It "
              "gets ");
      say_ms(&t, r->timeout_ms);
      say(&t,
          " to answer, and a failed attempt is retried up to %lld "
          "time%s, first after ",
          (long long)r->retries, r->retries == 1 ? "" : "s");
      say_ms(&t, r->backoff_ms);
      say(&t, ", doubling each time. Repeating it is harmless, so there is no "
              "key, no fence and no reconciliation.\n");
    }
    for (i = 0; p && i < p->ntools; i++)
      if (p->tools[i].status.tool && strcmp(p->tools[i].status.tool, tool) == 0)
        users++;
    if (users) {
      say(&t, "\nIt is the status check of ");
      for (i = 0; i < p->ntools; i++)
        if (p->tools[i].status.tool &&
            strcmp(p->tools[i].status.tool, tool) == 0) {
          say_name(&t, p->tools[i].name, 0);
          users--;
          say(&t, "%s", users == 0 ? ".\n" : users == 1 ? " and " : ", ");
        }
    }
    break;
  default: break;
  }

  return text_done(&t, out);
}
