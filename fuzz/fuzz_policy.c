/*
** fuzz_policy.c - libFuzzer target for policy files (idem_policy_parse).
**
** Any input: no crash, no leak.  A refused text is IDEM_POLICY with a
** one-line message under 300 bytes and leaves a policy that names nothing
** and refuses every tool.  An accepted one keeps the invariants of policy.c
** (sorted unique names, guard-only fields only on guarded tools, status
** tools that are read_only tools of the policy, disjoint exit-code lists),
** and every tool, and one it does not name, can be explained in plain text.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/idemInt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_text(const char *t) {
  size_t n = strlen(t);
  if (n == 0 || t[n - 1] != '\n') abort();
  for (; *t; t++)
    if ((unsigned char)*t < 0x20 && *t != '\n') abort();
}

static int disjoint(const int *a, int na, const int *b, int nb) {
  int i, j;
  for (i = 0; i < na; i++)
    for (j = 0; j < nb; j++)
      if (a[i] == b[j]) return 0;
  return 1;
}

static void check_rule(const idem_policy *p, const idem__tool_rule *r) {
  idem__tool_rule scratch;
  char *text = NULL;
  if (idem__policy_rule(p, r->name, &scratch) != r) abort();
  if (idem_policy_class(p, r->name) != r->cls) abort();
  if (r->cls != IDEM_CLASS_GUARDED &&
      (r->key_arg || r->nfence || r->has_status || r->provider_dedupes))
    abort();
  if (r->key_max_len < 66 || r->timeout_ms < 1 || r->retries > 100) abort();
  if (r->has_status) {
    const idem__tool_rule *s;
    if (!r->status.tool == !r->status.command) abort();
    if (r->status.tool) {
      s = idem__policy_rule(p, r->status.tool, &scratch);
      if (s == &scratch || s == r || s->cls != IDEM_CLASS_READ_ONLY) abort();
      if (!r->status.arguments || r->status.arguments[0] != '{') abort();
    }
    if (r->status.applied_when == IDEM__APPLIED_WHEN_POINTER &&
        (!r->status.pointer || !r->status.equals))
      abort();
    if (r->status.applied_when == IDEM__APPLIED_WHEN_KEY_AT &&
        (!r->status.pointer || r->status.equals))
      abort();
  }
  if (r->n_exit_applied < 1 ||
      !disjoint(r->exit_applied, r->n_exit_applied, r->exit_not_applied,
                r->n_exit_not_applied) ||
      !disjoint(r->exit_applied, r->n_exit_applied, r->exit_rejected,
                r->n_exit_rejected) ||
      !disjoint(r->exit_not_applied, r->n_exit_not_applied, r->exit_rejected,
                r->n_exit_rejected))
    abort();
  if (idem_policy_explain(p, r->name, &text) != IDEM_OK) abort();
  check_text(text);
  idem_free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  idem_policy *p = NULL;
  char *text = NULL;
  const char *msg;
  size_t i;
  int rc = idem_policy_parse((const char *)data, size, "fuzz", &p);
  if (!p) abort();
  msg = idem_policy_errmsg(p);
  if (rc != IDEM_OK) {
    if (rc != IDEM_POLICY || !msg[0] || strlen(msg) >= 300 ||
        strchr(msg, '\n') || p->ntools != 0 ||
        idem_policy_class(p, "refund") != IDEM_CLASS_REFUSED ||
        idem_policy_explain(p, "refund", &text) != IDEM_MISUSE || text)
      abort();
    idem_policy_free(p);
    return 0;
  }
  if (msg[0]) abort();
  for (i = 0; i < p->ntools; i++) {
    if (i > 0 && strcmp(p->tools[i - 1].name, p->tools[i].name) >= 0) abort();
    check_rule(p, &p->tools[i]);
  }
  if (idem_policy_explain(p, "\x01 not named", &text) != IDEM_OK) abort();
  check_text(text);
  idem_free(text);
  idem_policy_free(p);
  return 0;
}
