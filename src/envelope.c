/*
** envelope.c - what the model gets back (SPEC §7).
**
** Every guarded call answers with one JSON object:
**
**   {"status":S,"tool":T,"call_id":C,"idempotency_key":K,"replayed":B,
**    "attempts":N,"result":R,"message":M,"check_with":{...},
**    "duplicate_of":D}
**
** in that order (the order of the SPEC's example, easier to read than
** sorted).  result is the downstream result when known: its JSON text as
** recorded, or a string when the tool's output was not JSON.  message is
** present for every status but succeeded: plain sentences for a model,
** naming what happened and the one safe next move.
*/
#include <stdio.h>
#include <string.h>

#include "canon.h"

static const char *const answer_names[] = {
    NULL,       "succeeded",   "failed",  "outcome_unknown",  "already_applied",
    "conflict", "in_progress", "refused", "invalid_arguments"};

const char *idem_answer_name(int a) {
  return a >= 1 && a <= IDEM_ANSWER_INVALID_ARGUMENTS ? answer_names[a] : "?";
}

/* Append s as a JSON string.  Text that is not UTF-8 (a tool's error
** output, say) is still delivered, its bad bytes as U+FFFD. */
static int str(idem__buf *b, const char *s) {
  size_t n = strlen(s), bad, i;
  idem__buf tmp;
  int rc = idem__canon_string(b, s, n, &bad);
  if (rc != IDEM_JSON_UTF8) return rc;
  idem__buf_init(&tmp, b->cap);
  for (i = 0; i < n && !rc;) {
    const unsigned char *p = (const unsigned char *)s + i;
    size_t k = *p < 0x80 ? 1 : idem__utf8_len(p, (const unsigned char *)s + n);
    if (k) {
      rc = idem__buf_append(&tmp, p, k);
      i += k;
    } else {
      rc = idem__buf_append(&tmp, "\xEF\xBF\xBD", 3);
      i++;
    }
  }
  if (!rc) rc = idem__canon_string(b, tmp.p, tmp.len, &bad);
  idem__buf_free(&tmp);
  return rc;
}

int idem__check_with(idem__buf *b, const char *tool, const char *args) {
  int rc = idem__buf_append(b, "{\"tool\":", 8);
  if (!rc) rc = str(b, tool);
  if (!rc) rc = idem__buf_append(b, ",\"arguments\":", 13);
  if (!args) args = "{}";
  if (!rc) rc = idem__buf_append(b, args, strlen(args));
  if (!rc) rc = idem__buf_append(b, "}", 1);
  return rc;
}

int idem__envelope(idem__buf *b, const idem__env *e) {
  char num[32];
  int rc = 0;
  b->len = 0;
#define PUT(s) (rc = rc ? rc : idem__buf_append(b, (s), strlen(s)))
#define PUTSTR(s) (rc = rc ? rc : str(b, (s)))
  PUT("{\"status\":\"");
  PUT(idem_answer_name(e->answer));
  PUT("\",\"tool\":");
  PUTSTR(e->tool);
  PUT(",\"call_id\":");
  PUTSTR(e->call_id);
  if (e->key) {
    PUT(",\"idempotency_key\":");
    PUTSTR(e->key);
  }
  PUT(e->replayed ? ",\"replayed\":true" : ",\"replayed\":false");
  snprintf(num, sizeof num, ",\"attempts\":%d", e->attempts);
  PUT(num);
  if (e->result) {
    PUT(",\"result\":");
    PUT(e->result);
  }
  if (e->message) {
    PUT(",\"message\":");
    PUTSTR(e->message);
  }
  if (e->check_tool) {
    PUT(",\"check_with\":");
    if (!rc) rc = idem__check_with(b, e->check_tool, e->check_args);
  }
  if (e->duplicate_of) {
    PUT(",\"duplicate_of\":");
    PUTSTR(e->duplicate_of);
  }
  PUT("}");
  if (!rc) rc = idem__buf_append(b, "", 1); /* a NUL, not counted */
  if (!rc) b->len--;
#undef PUT
#undef PUTSTR
  return rc;
}
