/*
** key.c - fingerprints and idempotency keys (SPEC §3).
**
**   payload     = canonical {"args": ARGS, "tool": TOOL}   ("args" < "tool")
**   fingerprint = hex(SHA-256(payload))
**   key         = pct(SESSION) ":" pct(CALL) ":" fingerprint[0..16]
**                 or "h:" hex(SHA-256(that)) when longer than key_max_len
**
** The payload is assembled, not canonicalized again: the arguments are
** already canonical (idem__canon_run), "args" sorts before "tool", and the
** tool name is a canonical string.  A key_arg is dropped by the
** canonicalizer itself while it orders the top-level members.
**
** Everything minted lives in c->aux: payload, NUL, key, NUL.  Line mode
** (idem_key_mint_json) decodes the session and call id into c->tmp, which
** the canonicalizer no longer needs once it has returned.
*/
#include <string.h>

#include <openssl/evp.h>

#include "canon.h"

static const char HEX_LOWER[] = "0123456789abcdef";
static const char HEX_UPPER[] = "0123456789ABCDEF";

static void to_hex(const unsigned char *d, size_t n, char *out) {
  size_t i;
  for (i = 0; i < n; i++) {
    out[2 * i] = HEX_LOWER[d[i] >> 4];
    out[2 * i + 1] = HEX_LOWER[d[i] & 15];
  }
}

/* RFC 3986 unreserved characters pass unchanged; every other byte is %XX. */
static const unsigned char UNRESERVED[256] = {
    ['-'] = 1, ['.'] = 1, ['_'] = 1, ['~'] = 1, ['0'] = 1, ['1'] = 1, ['2'] = 1,
    ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1, ['8'] = 1, ['9'] = 1,
    ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1,
    ['H'] = 1, ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1,
    ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1, ['U'] = 1,
    ['V'] = 1, ['W'] = 1, ['X'] = 1, ['Y'] = 1, ['Z'] = 1, ['a'] = 1, ['b'] = 1,
    ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1, ['h'] = 1, ['i'] = 1,
    ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1,
    ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1, ['w'] = 1,
    ['x'] = 1, ['y'] = 1, ['z'] = 1};

static int append_pct(idem__buf *b, const char *id) {
  const unsigned char *p = (const unsigned char *)id;
  size_t n = strlen(id), i = 0;
  char *w;
  int rc;
  if (n > (SIZE_MAX - b->len) / 3) return IDEM_RANGE;
  if ((rc = idem__buf_reserve(b, n * 3)) != IDEM_OK) return rc;
  w = b->p + b->len;
  while (i < n && UNRESERVED[p[i]]) i++; /* the common case: all plain */
  memcpy(w, p, i);
  w += i;
  for (; i < n; i++) {
    if (UNRESERVED[p[i]]) {
      *w++ = (char)p[i];
    } else {
      *w++ = '%';
      *w++ = HEX_UPPER[p[i] >> 4];
      *w++ = HEX_UPPER[p[i] & 15];
    }
  }
  b->len = (size_t)(w - b->p);
  return IDEM_OK;
}

/* The workspace's state_free: the digest state this module keeps on it. */
static void digest_free(idem_canon *c) {
  EVP_MD_CTX_free(c->mdctx);
  EVP_MD_free(c->md);
  c->mdctx = NULL;
  c->md = NULL;
}

/*
** SHA-256 through a digest fetched once per handle and a reused context:
** OpenSSL 3's one-shot SHA256() fetches the algorithm on every call, under
** a lock, which costs more than hashing a typical payload.
*/
static int sha256(idem_canon *c, const void *p, size_t n,
                  unsigned char out[32]) {
  unsigned int len = 0;
  if (!c->md) {
    c->state_free = digest_free;
    c->md = EVP_MD_fetch(NULL, "SHA256", NULL);
    c->mdctx = EVP_MD_CTX_new();
    if (!c->md || !c->mdctx) goto fail;
  }
  if (EVP_DigestInit_ex2(c->mdctx, c->md, NULL) == 1 &&
      EVP_DigestUpdate(c->mdctx, p, n) == 1 &&
      EVP_DigestFinal_ex(c->mdctx, out, &len) == 1 && len == 32)
    return IDEM_OK;
fail:
  return idem__canon_fail(c, IDEM_NOMEM, IDEM__NO_OFFSET,
                          "SHA-256 is not available from libcrypto");
}

int idem__sha256_hex(idem_canon *c, const void *p, size_t n, char out[65]) {
  unsigned char d[32];
  int rc = sha256(c, p, n, d);
  if (rc) return rc;
  to_hex(d, 32, out);
  out[64] = '\0';
  return IDEM_OK;
}

static int fail_nomem(idem_canon *c, int rc) {
  return idem__canon_fail(c, rc, IDEM__NO_OFFSET,
                          rc == IDEM_NOMEM ? "out of memory"
                                           : "key material too large");
}

/* Build payload, fingerprint and key from parts that are all ready:
** session and call raw, tool and args canonical. */
static int mint_tail(idem_canon *c, const char *session, const char *call,
                     const char *tool_json, size_t tool_len, const char *args,
                     size_t args_len, size_t key_max_len, idem_key *out) {
  idem__buf *a = &c->aux;
  unsigned char digest[32];
  size_t key_at;
  int rc;

  a->len = 0;
  if ((rc = idem__buf_append(a, "{\"args\":", 8)) ||
      (rc = idem__buf_append(a, args, args_len)) ||
      (rc = idem__buf_append(a, ",\"tool\":", 8)) ||
      (rc = idem__buf_append(a, tool_json, tool_len)) ||
      (rc = idem__buf_append(a, "}", 2))) /* with its NUL */
    return fail_nomem(c, rc);
  if ((rc = sha256(c, a->p, a->len - 1, digest))) return rc;
  to_hex(digest, sizeof digest, out->fingerprint);
  out->fingerprint[64] = '\0';

  key_at = a->len;
  if ((rc = append_pct(a, session)) || (rc = idem__buf_append(a, ":", 1)) ||
      (rc = append_pct(a, call)) || (rc = idem__buf_append(a, ":", 1)) ||
      (rc = idem__buf_append(a, out->fingerprint, 16)))
    return fail_nomem(c, rc);
  if (a->len - key_at > key_max_len) {
    /* the "h:" form is 66 bytes, never longer than the long form it hides */
    if ((rc = sha256(c, a->p + key_at, a->len - key_at, digest))) return rc;
    a->p[key_at] = 'h';
    a->p[key_at + 1] = ':';
    to_hex(digest, sizeof digest, a->p + key_at + 2);
    a->len = key_at + 66;
  }
  if ((rc = idem__buf_append(a, "", 1))) return fail_nomem(c, rc);

  out->payload = a->p;
  out->payload_len = key_at - 1;
  out->args = a->p + 8;
  out->args_len = args_len;
  out->key = a->p + key_at;
  out->key_len = a->len - 1 - key_at;
  return IDEM_OK;
}

static int spec_check(idem_canon *c, const idem_keyspec *spec,
                      size_t *max_len) {
  *max_len =
      spec && spec->key_max_len ? spec->key_max_len : IDEM_DEFAULT_KEY_MAX_LEN;
  if (*max_len < 66)
    return idem__canon_fail(c, IDEM_RANGE, IDEM__NO_OFFSET,
                            "key_max_len must be at least 66, the length of "
                            "the h: form");
  if (spec && spec->key_arg && !spec->key_arg[0])
    return idem__canon_fail(c, IDEM_INVALID, IDEM__NO_OFFSET,
                            "key_arg must not be empty");
  return IDEM_OK;
}

static const char *json_kind(char first) {
  switch (first) {
  case '[': return "an array";
  case '"': return "a string";
  case 't':
  case 'f': return "a boolean";
  case 'n': return "null";
  default: return "a number";
  }
}

/* The caller's sized structs (idem.h, ABI) as this version's. */
static int call_in(idem_canon *c, const idem_call *call, idem_call *cur) {
  if (idem__abi_in(cur, sizeof *cur, call, IDEM__CALL_MIN))
    return idem__canon_fail(c, IDEM_MISUSE, IDEM__NO_OFFSET,
                            "idem_call.size is %zu: set it to "
                            "sizeof(idem_call)",
                            call ? call->size : 0);
  return IDEM_OK;
}

static int spec_in(idem_canon *c, const idem_keyspec *spec, idem_keyspec *cur) {
  if (!spec) { /* the defaults */
    memset(cur, 0, sizeof *cur);
    return IDEM_OK;
  }
  if (idem__abi_in(cur, sizeof *cur, spec, IDEM__ABI_MIN(idem_keyspec)))
    return idem__canon_fail(c, IDEM_MISUSE, IDEM__NO_OFFSET,
                            "idem_keyspec.size is %zu: set it to "
                            "sizeof(idem_keyspec)",
                            spec->size);
  return IDEM_OK;
}

int idem_key_mint(idem_canon *c, const idem_call *call_in_,
                  const idem_keyspec *spec_in_, idem_key *out) {
  idem__canon_opt opt = {0, NULL, 0, 1, 0};
  idem_call cur;
  idem_keyspec spec_cur;
  const idem_call *call = &cur;
  const idem_keyspec *spec = &spec_cur;
  size_t max_len, bad = 0;
  int rc;
  if (out) memset(out, 0, sizeof *out);
  if (!c || c->magic != IDEM__CANON_MAGIC || !out) return IDEM_MISUSE;
  if ((rc = call_in(c, call_in_, &cur)) ||
      (rc = spec_in(c, spec_in_, &spec_cur)))
    return rc;
  if (!call->args && call->args_len) return IDEM_MISUSE;
  if ((rc = spec_check(c, spec, &max_len))) return rc;
  if (!call->session || !call->session[0])
    return idem__canon_fail(c, IDEM_INVALID, IDEM__NO_OFFSET,
                            "the session id is empty");
  if (!call->call_id || !call->call_id[0])
    return idem__canon_fail(c, IDEM_INVALID, IDEM__NO_OFFSET,
                            "the call id is empty");
  if (!call->tool || !call->tool[0])
    return idem__canon_fail(c, IDEM_INVALID, IDEM__NO_OFFSET,
                            "the tool name is empty");

  opt.max_depth = c->max_depth;
  if (spec && spec->key_arg) {
    opt.drop_name = spec->key_arg;
    opt.drop_len = strlen(spec->key_arg);
  }
  if ((rc = idem__canon_run(c, call->args ? call->args : "", call->args_len,
                            &opt)))
    return rc;
  if (c->out.p[0] != '{') {
    size_t at = 0;
    while (at < call->args_len &&
           (call->args[at] == ' ' || call->args[at] == '\t' ||
            call->args[at] == '\n' || call->args[at] == '\r'))
      at++;
    return idem__canon_fail(c, IDEM_NOT_OBJECT, at,
                            "tool arguments must be a JSON object, not %s",
                            json_kind(c->out.p[0]));
  }
  c->tmp.len = 0;
  rc = idem__canon_string(&c->tmp, call->tool, strlen(call->tool), &bad);
  if (rc == IDEM_JSON_UTF8)
    return idem__canon_fail(c, IDEM_INVALID, IDEM__NO_OFFSET,
                            "the tool name is not UTF-8 (byte %zu)", bad);
  if (rc) return fail_nomem(c, rc);
  return mint_tail(c, call->session, call->call_id, c->tmp.p, c->tmp.len,
                   c->out.p, c->out.len, max_len, out);
}

/* The members of a call object, in their canonical order. */
enum { M_ARGS, M_CALL, M_SESSION, M_TOOL, M_COUNT };
static const char *const member_names[M_COUNT] = {"args", "call", "session",
                                                  "tool"};

int idem_key_mint_json(idem_canon *c, const char *text, size_t len,
                       const idem_keyspec *spec_in_, idem_key *out) {
  idem_keyspec spec_cur;
  const idem_keyspec *spec = &spec_cur;
  idem__canon_opt opt = {0, NULL, 0, 2, 1}; /* the call's own order is kept:
                                              only its members are used */
  const idem__member *found[M_COUNT] = {NULL, NULL, NULL, NULL};
  size_t max_len, i, session_at;
  int rc, k;
  if (out) memset(out, 0, sizeof *out);
  if (!c || c->magic != IDEM__CANON_MAGIC || !out || (!text && len))
    return IDEM_MISUSE;
  if ((rc = spec_in(c, spec_in_, &spec_cur))) return rc;
  if ((rc = spec_check(c, spec, &max_len))) return rc;
  opt.max_depth = c->max_depth + 1; /* the call object wraps the arguments */
  if (spec && spec->key_arg) {
    opt.drop_name = spec->key_arg;
    opt.drop_len = strlen(spec->key_arg);
  }
  if ((rc = idem__canon_run(c, text ? text : "", len, &opt))) return rc;
  if (c->out.p[0] != '{')
    return idem__canon_fail(c, IDEM_INVALID, 0,
                            "a call must be a JSON object with session, call, "
                            "tool and args, not %s",
                            json_kind(c->out.p[0]));

  for (i = 0; i < c->top_members; i++) {
    const idem__member *m = &c->mem[i];
    char first = c->out.p[m->colon + 1];
    for (k = 0; k < M_COUNT; k++)
      if (idem__member_is(c, m, member_names[k], strlen(member_names[k])))
        break;
    if (k == M_COUNT)
      return idem__canon_fail(
          c, IDEM_INVALID, m->in_off,
          "unknown member %.*s in a call (expected "
          "session, call, tool and args)",
          (int)(m->colon - m->start > 40 ? 40 : m->colon - m->start),
          c->out.p + m->start);
    if (k == M_ARGS && first != '{')
      return idem__canon_fail(c, IDEM_NOT_OBJECT, m->in_off,
                              "\"args\" must be a JSON object, not %s",
                              json_kind(first));
    if (k != M_ARGS && (first != '"' || m->end - m->colon == 3))
      return idem__canon_fail(c, IDEM_INVALID, m->in_off,
                              "\"%s\" must be a non-empty string",
                              member_names[k]);
    found[k] = m;
  }
  for (k = 0; k < M_COUNT; k++)
    if (!found[k])
      return idem__canon_fail(c, IDEM_INVALID, IDEM__NO_OFFSET,
                              "the call has no \"%s\" member", member_names[k]);

  /* session and call id, decoded, NUL-terminated, into tmp */
  c->tmp.len = 0;
  for (k = M_CALL; k <= M_SESSION; k++) {
    const idem__member *m = found[k];
    size_t at = c->tmp.len;
    if ((rc = idem__canon_unstring(&c->tmp, c->out.p + m->colon + 1,
                                   m->end - m->colon - 1)))
      return fail_nomem(c, rc);
    if (strlen(c->tmp.p + at) != c->tmp.len - at - 1)
      return idem__canon_fail(c, IDEM_INVALID, m->in_off,
                              "\"%s\" must not contain a NUL character",
                              member_names[k]);
  }
  session_at = strlen(c->tmp.p) + 1;
  return mint_tail(c, c->tmp.p + session_at, c->tmp.p,
                   c->out.p + found[M_TOOL]->colon + 1,
                   found[M_TOOL]->end - found[M_TOOL]->colon - 1,
                   c->out.p + found[M_ARGS]->colon + 1,
                   found[M_ARGS]->end - found[M_ARGS]->colon - 1, max_len, out);
}
