/*
** record.c - attempt-log records (idem_record): names, copies, release.
**
** A record owns every string it points at, each a separate allocation from
** idem__malloc, so code that builds or edits a record may replace one field
** (free the old string, store a new one) and idem_record_free() still
** releases exactly what is there.  Optional strings are NULL when absent.
*/
#include <string.h>

#include "idemInt.h"

const char *idem_state_name(int state) {
  switch (state) {
  case IDEM_STATE_PENDING: return "pending";
  case IDEM_STATE_SUCCEEDED: return "succeeded";
  case IDEM_STATE_FAILED: return "failed";
  case IDEM_STATE_NOT_APPLIED: return "not_applied";
  case IDEM_STATE_IN_DOUBT: return "in_doubt";
  case IDEM_STATE_DEDUPLICATED: return "deduplicated";
  default: return "?";
  }
}

const char *idem_resolution_name(int resolution) {
  switch (resolution) {
  case IDEM_RESOLVED_NONE: return "none";
  case IDEM_RESOLVED_EXECUTED: return "executed";
  case IDEM_RESOLVED_RECONCILED: return "reconciled";
  case IDEM_RESOLVED_LATE: return "late";
  case IDEM_RESOLVED_REPLAYED: return "replayed";
  case IDEM_RESOLVED_OPERATOR: return "operator";
  default: return "?";
  }
}

void idem_record_free(idem_record *r) {
  if (!r) return;
  idem__free(r->session);
  idem__free(r->call_id);
  idem__free(r->tool);
  idem__free(r->fingerprint);
  idem__free(r->key);
  idem__free(r->args);
  idem__free(r->fence_key);
  idem__free(r->owner);
  idem__free(r->result);
  idem__free(r->error);
  idem__free(r->duplicate_of);
  idem__free(r->executor);
  idem__free(r->turn);
  idem__free(r->resolved_by);
  idem__free(r->check_with);
  idem__free(r->last_check);
  idem__free(r);
}

/* Copy s into *dst (NULL stays NULL); 0 when memory ran out. */
static int dup_str(char **dst, const char *s) {
  *dst = idem__strdup(s);
  return !s || *dst;
}

idem_record *idem__record_dup(const idem_record *r) {
  idem_record *d;
  if (!r || !(d = idem__malloc(sizeof *d))) return NULL;
  *d = *r; /* the scalars; every pointer is replaced below */
  if (dup_str(&d->session, r->session) & dup_str(&d->call_id, r->call_id) &
      dup_str(&d->tool, r->tool) & dup_str(&d->fingerprint, r->fingerprint) &
      dup_str(&d->key, r->key) & dup_str(&d->args, r->args) &
      dup_str(&d->fence_key, r->fence_key) & dup_str(&d->owner, r->owner) &
      dup_str(&d->result, r->result) & dup_str(&d->error, r->error) &
      dup_str(&d->duplicate_of, r->duplicate_of) &
      dup_str(&d->executor, r->executor) & dup_str(&d->turn, r->turn) &
      dup_str(&d->resolved_by, r->resolved_by) &
      dup_str(&d->check_with, r->check_with) &
      dup_str(&d->last_check, r->last_check))
    return d;
  idem_record_free(d);
  return NULL;
}
