/*
** jsonrpc.c - JSON-RPC lines for the MCP gateway (see mcp.h).
**
** Two readings of every line.  jansson parses it, to tell requests,
** notifications and responses apart and to read what the gateway acts on
** (method, params, tools/list results).  A small scanner finds the byte
** spans of the few members the gateway rewrites (the top-level "id", a
** cancellation's "requestId", a result's "_meta"), so that everything else
** is forwarded byte for byte.  The scanner runs only on text jansson has
** accepted, except on the prefix of an oversized line, where it may meet
** the cut: every loop is bounded by n and reports the cut as "not found".
**
** Numbers: integers are parsed as reals (JSON_DECODE_INT_AS_REAL) so that
** an integer beyond the range of long long is still a valid message here;
** the gateway never re-serializes a number of a forwarded message.
*/
#include <stdlib.h>
#include <string.h>

#include "idem.h"
#include "mcp.h"

/* ---- lines -------------------------------------------------------------------- */

void mcp_lines_init(mcp_lines *l, size_t max) {
  cli_outbuf_init(&l->b, max + 1);
  l->max = max;
  l->skipping = 0;
}

void mcp_lines_free(mcp_lines *l) { cli_outbuf_free(&l->b); }

static void emit(const char *p, size_t n, mcp_line_fn fn, void *ctx) {
  if (n && p[n - 1] == '\r') n--;
  if (n) fn(ctx, p, n, 0);
}

int mcp_lines_feed(mcp_lines *l, const char *p, size_t n, mcp_line_fn fn,
                   void *ctx) {
  while (n) {
    const char *nl = memchr(p, '\n', n);
    size_t take = nl ? (size_t)(nl - p) : n;
    if (l->skipping) {
      /* the rest of an oversized line: drop it */
      if (nl) l->skipping = 0;
    } else if (l->b.len + take > l->max) {
      /* the line is too long: hand over its prefix once, skip the rest */
      size_t keep = l->b.len < MCP_PREFIX ? MCP_PREFIX - l->b.len : 0;
      if (keep > take) keep = take;
      if (keep > l->max - l->b.len) keep = l->max - l->b.len;
      if (keep) cli_outbuf_put(&l->b, p, keep);
      fn(ctx, l->b.p ? l->b.p : "", l->b.len, 1);
      l->b.len = 0;
      l->skipping = nl == NULL;
    } else if (nl && l->b.len == 0) {
      emit(p, take, fn, ctx); /* the common case: no copy */
    } else {
      if (cli_outbuf_put(&l->b, p, take)) return -1;
      if (nl) {
        emit(l->b.p, l->b.len, fn, ctx);
        l->b.len = 0;
      }
    }
    if (!nl) break;
    p = nl + 1;
    n -= take + 1;
  }
  return 0;
}

void mcp_lines_end(mcp_lines *l, mcp_line_fn fn, void *ctx) {
  if (!l->skipping && l->b.len) emit(l->b.p, l->b.len, fn, ctx);
  l->b.len = 0;
  l->skipping = 0;
}

/* ---- the raw scanner ---------------------------------------------------------- */

#define CUT ((size_t)-1)

static size_t ws(const char *p, size_t n, size_t i) {
  while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r'))
    i++;
  return i;
}

/* p[i] is the opening quote: the index after the closing one. */
static size_t skip_string(const char *p, size_t n, size_t i) {
  for (i++; i < n; i++) {
    if (p[i] == '\\') {
      i++;
    } else if (p[i] == '"') {
      return i + 1;
    }
  }
  return CUT;
}

size_t mcp_skip_value(const char *p, size_t n, size_t i) {
  size_t depth = 0;
  i = ws(p, n, i);
  if (i >= n) return CUT;
  do {
    if (i >= n) return CUT;
    switch (p[i]) {
    case '"':
      if ((i = skip_string(p, n, i)) == CUT) return CUT;
      break;
    case '{':
    case '[':
      depth++;
      i++;
      break;
    case '}':
    case ']':
      if (depth == 0) return CUT;
      depth--;
      i++;
      break;
    case ',':
    case ':':
    case ' ':
    case '\t':
    case '\n':
    case '\r':
      if (depth == 0) return CUT;
      i++;
      break;
    default: { /* a literal or a number: up to the next delimiter */
      size_t from = i;
      while (i < n && p[i] && !strchr(",:]} \t\r\n\"{[", p[i])) i++;
      if (i == from) return CUT; /* a NUL byte: not JSON */
      break;
    }
    }
  } while (depth > 0);
  return i;
}

int mcp_member(const char *p, size_t n, const char *name, size_t *vs,
               size_t *ve) {
  size_t i = ws(p, n, 0), nlen = strlen(name);
  if (i >= n || p[i] != '{') return -1;
  i = ws(p, n, i + 1);
  if (i < n && p[i] == '}') return 0;
  while (i < n) {
    size_t ks, ke, e;
    if (p[i] != '"') return -1;
    ks = i + 1;
    if ((i = skip_string(p, n, i)) == CUT) return -1;
    ke = i - 1;
    i = ws(p, n, i);
    if (i >= n || p[i] != ':') return -1;
    i = ws(p, n, i + 1);
    if ((e = mcp_skip_value(p, n, i)) == CUT) return -1;
    if (ke - ks == nlen && memcmp(p + ks, name, nlen) == 0) {
      *vs = i;
      *ve = e;
      return 1;
    }
    i = ws(p, n, e);
    if (i < n && p[i] == '}') return 0;
    if (i >= n || p[i] != ',') return -1;
    i = ws(p, n, i + 1);
  }
  return -1;
}

/* ---- messages ------------------------------------------------------------------ */

int mcp_msg_parse(const char *line, size_t len, mcp_msg *m, char *err,
                  size_t errn) {
  json_error_t je;
  json_t *v;
  const char *nul = memchr(line, '\0', len);
  memset(m, 0, sizeof m[0]);
  /* a NUL byte is never JSON (jansson would stop reading at it, and the
  ** bytes after it would still be forwarded) */
  if (nul) {
    snprintf(err, errn, "a NUL byte at byte %zu", (size_t)(nul - line));
    return -1;
  }
  /* duplicate names are refused: the scanner and a peer could otherwise
  ** read different members (jansson keeps the last, the scanner the first) */
  m->root = json_loadb(line, len,
                       JSON_DECODE_INT_AS_REAL | JSON_REJECT_DUPLICATES, &je);
  if (!m->root) {
    snprintf(err, errn, "%s at byte %d", je.text, je.position);
    return -1;
  }
  m->kind = MCP_INVALID;
  if (!json_is_object(m->root)) return 0;
  v = json_object_get(m->root, "jsonrpc");
  if (!json_is_string(v) || strcmp(json_string_value(v), "2.0") != 0) return 0;
  m->id = json_object_get(m->root, "id");
  v = json_object_get(m->root, "method");
  m->method = json_is_string(v) ? json_string_value(v) : NULL;
  m->params = json_object_get(m->root, "params");
  if (m->id && !json_is_string(m->id) && !json_is_number(m->id) &&
      !(json_is_null(m->id) && !m->method))
    return 0;
  if (m->id && mcp_member(line, len, "id", &m->id_s, &m->id_e) != 1)
    return 0; /* an id spelt with escapes: not one we can splice */
  if (m->method) {
    m->kind = m->id ? MCP_REQUEST : MCP_NOTIFY;
    if (m->params && !json_is_object(m->params)) m->kind = MCP_INVALID;
  } else if (m->id && (json_object_get(m->root, "result") ||
                       json_object_get(m->root, "error"))) {
    m->kind = MCP_RESPONSE;
  }
  return 0;
}

void mcp_msg_free(mcp_msg *m) {
  json_decref(m->root);
  m->root = NULL;
}

int mcp_prefix_id(const char *p, size_t n, size_t *vs, size_t *ve) {
  return mcp_member(p, n, "id", vs, ve) == 1;
}

const char *mcp_json_kind(const json_t *v) {
  return !v                  ? "missing"
         : json_is_string(v) ? "a string"
         : json_is_number(v) ? "a number"
         : json_is_object(v) ? "an object"
         : json_is_array(v)  ? "an array"
         : json_is_null(v)   ? "null"
                             : "true or false";
}

int mcp_splice(cli_outbuf *out, const char *line, size_t len, size_t vs,
               size_t ve, const char *repl, size_t rlen) {
  size_t mark = out->len;
  if (cli_outbuf_put(out, line, vs) || cli_outbuf_put(out, repl, rlen) ||
      cli_outbuf_put(out, line + ve, len - ve) ||
      cli_outbuf_put(out, "\n", 1)) {
    out->len = mark;
    return -1;
  }
  return 0;
}

int mcp_put_error(cli_outbuf *out, const char *id, size_t idlen, int code,
                  const char *message) {
  json_t *e = json_pack("{s:i,s:s}", "code", code, "message", message);
  char *msg = e ? json_dumps(e, JSON_COMPACT) : NULL;
  char head[64];
  size_t mark = out->len;
  int rc = -1;
  json_decref(e);
  if (!msg) return -1;
  snprintf(head, sizeof head, "{\"jsonrpc\":\"2.0\",\"id\":");
  if (!cli_outbuf_str(out, head) &&
      !(id ? cli_outbuf_put(out, id, idlen) : cli_outbuf_str(out, "null")) &&
      !cli_outbuf_str(out, ",\"error\":") && !cli_outbuf_str(out, msg) &&
      !cli_outbuf_str(out, "}\n"))
    rc = 0;
  if (rc) out->len = mark;
  free(msg);
  return rc;
}

int mcp_put_with_meta(cli_outbuf *out, const char *obj, size_t len,
                      const json_t *add) {
  size_t vs = 0, ve = 0, mark = out->len;
  json_t *meta = NULL;
  char *dump = NULL;
  int found = mcp_member(obj, len, "_meta", &vs, &ve), rc = -1;
  if (found < 0) return -1;
  if (found)
    meta = json_loadb(obj + vs, ve - vs, JSON_DECODE_INT_AS_REAL, NULL);
  if (!json_is_object(meta)) {
    json_decref(meta);
    meta = json_object();
  }
  if (!meta || json_object_update(meta, (json_t *)(size_t)add) ||
      !(dump = json_dumps(meta, JSON_COMPACT)))
    goto out;
  if (found) {
    rc = cli_outbuf_put(out, obj, vs) || cli_outbuf_str(out, dump) ||
                 cli_outbuf_put(out, obj + ve, len - ve)
             ? -1
             : 0;
  } else {
    /* insert "_meta" as the first member */
    size_t open = ws(obj, len, 0) + 1, next = ws(obj, len, open);
    int empty = next < len && obj[next] == '}';
    rc = cli_outbuf_put(out, obj, open) || cli_outbuf_str(out, "\"_meta\":") ||
                 cli_outbuf_str(out, dump) ||
                 (!empty && cli_outbuf_put(out, ",", 1)) ||
                 cli_outbuf_put(out, obj + open, len - open)
             ? -1
             : 0;
  }
out:
  if (rc) out->len = mark;
  free(dump);
  json_decref(meta);
  return rc;
}

/* ---- tools ---------------------------------------------------------------------- */

/* Annotations are the server's hints (SPEC §10, as amended 2026-12-06):
** readOnlyHint true makes a tool read_only; idempotentHint alone never
** makes it idempotent - a refund tool that wrongly claimed it would be
** retried and left unrecorded.  Only the policy makes a tool idempotent. */
int mcp_class_of(const json_t *tool) {
  const json_t *a = json_object_get(tool, "annotations");
  if (json_is_object(a) && json_is_true(json_object_get(a, "readOnlyHint")))
    return IDEM_CLASS_READ_ONLY;
  return IDEM_CLASS_GUARDED;
}

int mcp_verdict(const json_t *result, const char *raw, size_t len,
                mcp_verdict_fn fn, void *ctx) {
  const json_t *content = json_object_get(result, "content");
  size_t vs, ve, i;
  if (!json_is_object(result)) return IDEM_OUTCOME_NOT_APPLIED;
  if (fn(ctx, raw, len) == IDEM_OUTCOME_APPLIED) return IDEM_OUTCOME_APPLIED;
  if (mcp_member(raw, len, "structuredContent", &vs, &ve) == 1 &&
      fn(ctx, raw + vs, ve - vs) == IDEM_OUTCOME_APPLIED)
    return IDEM_OUTCOME_APPLIED;
  for (i = 0; i < json_array_size(content); i++) {
    const json_t *item = json_array_get(content, i);
    const char *t = json_string_value(json_object_get(item, "text"));
    if (t && fn(ctx, t, json_string_length(json_object_get(item, "text"))) ==
                 IDEM_OUTCOME_APPLIED)
      return IDEM_OUTCOME_APPLIED;
  }
  return IDEM_OUTCOME_NOT_APPLIED;
}
