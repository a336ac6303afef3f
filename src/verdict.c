/*
** verdict.c - what a status check's result says (docs/POLICY.md,
** "applied_when").
**
** A status tool answers with a JSON result; the policy says how to read
** it: "key_present" (the action's key appears as a string value anywhere
** in the result), {"pointer": P, "key_present": true} (the key appears
** anywhere in the value at the RFC 6901 pointer P), or {"pointer": P,
** "equals": V} (the value at P equals V, compared in RFC 8785 canonical
** form).  A status request that sends the key may get it back as an echo
** of its query, which proves nothing: the policy then refuses the bare
** "key_present" and a pointer of "" (policy.c), so only the records under
** P count.  A result that is not JSON says nothing: the outcome stays
** unknown.  A pointer that leads nowhere means "not applied", as does a
** result without the key - the status tool answered, and did not show the
** action.
*/
#include <string.h>

#include <jansson.h>

#include "idemInt.h"

static int has_string(const json_t *v, const char *key, size_t n) {
  const char *k;
  json_t *e;
  size_t i;
  switch (json_typeof(v)) {
  case JSON_STRING:
    return json_string_length(v) == n &&
           memcmp(json_string_value(v), key, n) == 0;
  case JSON_ARRAY:
    json_array_foreach(v, i, e) if (has_string(e, key, n)) return 1;
    return 0;
  case JSON_OBJECT:
    json_object_foreach((json_t *)(uintptr_t)v, k,
                        e) if (has_string(e, key, n)) return 1;
    return 0;
  default: return 0;
  }
}

/* The value at pointer p (RFC 6901; checked when the policy was loaded),
** or NULL when it leads nowhere. */
static json_t *follow(json_t *v, const char *p) {
  char seg[1024];
  while (v && *p == '/') {
    size_t n = 0;
    for (p++; *p && *p != '/'; p++) {
      char ch = *p;
      if (ch == '~') ch = *++p == '1' ? '/' : '~';
      if (n + 1 >= sizeof seg) return NULL;
      seg[n++] = ch;
    }
    seg[n] = '\0';
    if (json_is_object(v)) {
      v = json_object_getn(v, seg, n);
    } else if (json_is_array(v)) {
      size_t i = 0, k;
      if (n == 0 || (n > 1 && seg[0] == '0')) return NULL;
      for (k = 0; k < n; k++) {
        if (seg[k] < '0' || seg[k] > '9' || i > 100000000) return NULL;
        i = i * 10 + (size_t)(seg[k] - '0');
      }
      v = json_array_get(v, i);
    } else {
      return NULL;
    }
  }
  return v;
}

static int equals_canonical(const json_t *v, const char *want) {
  idem_canon *c = NULL;
  const char *out;
  size_t n;
  char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  int same = 0;
  if (text && idem_canon_open(&c) == IDEM_OK &&
      idem_canon_json(c, text, strlen(text), &out, &n) == IDEM_OK)
    same = n == strlen(want) && memcmp(out, want, n) == 0;
  idem_canon_close(c);
  free(text); /* jansson's allocation */
  return same;
}

int idem__status_verdict(const idem__status_rule *s, const char *key,
                         const char *result, size_t len) {
  json_error_t err;
  json_t *root;
  int applied;
  if (!result) return IDEM_OUTCOME_UNKNOWN;
  root = json_loadb(result, len, JSON_DECODE_ANY, &err);
  if (!root) return IDEM_OUTCOME_UNKNOWN;
  if (s->applied_when == IDEM__APPLIED_WHEN_POINTER) {
    json_t *v = follow(root, s->pointer ? s->pointer : "");
    applied = v && s->equals && equals_canonical(v, s->equals);
  } else if (s->applied_when == IDEM__APPLIED_WHEN_KEY_AT) {
    json_t *v = follow(root, s->pointer ? s->pointer : "");
    applied = v && key && has_string(v, key, strlen(key));
  } else {
    applied = key && has_string(root, key, strlen(key));
  }
  json_decref(root);
  return applied ? IDEM_OUTCOME_APPLIED : IDEM_OUTCOME_NOT_APPLIED;
}
