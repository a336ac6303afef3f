/*
** cols.h - the columns of an attempt-log record, as both stores name and
** number them (store/sqlite.c, store/pg.c): COLS lists them in the order
** of the C_* indexes, which is the order of idem_record's fields.
** COLS_WRITTEN are the ones an insert writes; the ones after them only a
** change sets (an operator's verdict, a status check).
*/
#ifndef IDEM_STORE_COLS_H
#define IDEM_STORE_COLS_H

#define COLS_WRITTEN                                                           \
  "session, call_id, tool, fingerprint, key, args, fence_key, cls, state, "    \
  "attempts, owner, lease_until, token, result, error, created, updated, "     \
  "expires, resolution, delivered, duplicate_of, executor, pgid, settle_from, " \
  "turn"
#define COLS                                                                   \
  COLS_WRITTEN ", resolved_by, resolved_at, check_with, last_check, "          \
               "checked_at, checks"

enum {
  C_SESSION,
  C_CALL_ID,
  C_TOOL,
  C_FINGERPRINT,
  C_KEY,
  C_ARGS,
  C_FENCE_KEY,
  C_CLS,
  C_STATE,
  C_ATTEMPTS,
  C_OWNER,
  C_LEASE_UNTIL,
  C_TOKEN,
  C_RESULT,
  C_ERROR,
  C_CREATED,
  C_UPDATED,
  C_EXPIRES,
  C_RESOLUTION,
  C_DELIVERED,
  C_DUPLICATE_OF,
  C_EXECUTOR,
  C_PGID,
  C_SETTLE_FROM,
  C_TURN,
  C_RESOLVED_BY,
  C_RESOLVED_AT,
  C_CHECK_WITH,
  C_LAST_CHECK,
  C_CHECKED_AT,
  C_CHECKS,
  N_COLS
};

#endif /* IDEM_STORE_COLS_H */
