/*
** paysim.h - the payment-provider simulator's ledger, shared by its two files.
**
** ledger.c owns the refunds: the in-memory table, the index by idempotency
** key, and the file they are appended to.  paysim.c serves them over HTTP.
** Nothing here locks: the server holds its one mutex around every call.
*/
#ifndef PAYSIM_H
#define PAYSIM_H

#include <stddef.h>

#include <jansson.h>

/* Limits, checked before anything is stored. */
#define PAYSIM_MAX_KEY 255             /* Idempotency-Key, bytes (Stripe's) */
#define PAYSIM_MAX_ORDER 255           /* order_id, bytes */
#define PAYSIM_MAX_REASON 1000         /* reason, bytes */
#define PAYSIM_MAX_AMOUNT 10000000LL   /* amount_cents */
#define PAYSIM_MAX_LEDGER (256L << 20) /* ledger file read at start, bytes */

typedef struct paysim_refund {
  long long num; /* the id is "re_%06lld" of this */
  char *key;     /* NULL when the request carried no Idempotency-Key */
  char *order_id;
  long long amount_cents;
  char *reason;         /* NULL when the request carried none */
  long long created_ms; /* wall clock, ms since the epoch */
  int pending;          /* the request that applied it has not answered yet */
} paysim_refund;

typedef struct paysim_ledger {
  char *path;
  int fd;           /* O_APPEND, flock()ed for the life of the process */
  paysim_refund *v; /* in ledger order */
  size_t n, cap;
  json_t *by_key; /* key -> index into v (its first refund), JSON integer */
  long long next_num;
  int dup_keys; /* a key may be applied more than once (--no-dedupe) */
} paysim_ledger;

/* Read PATH (created if missing) and open it for appending.  A last line
** cut short by a crash is dropped with a warning on stderr; any other bad
** line is an error, and so is a key applied twice unless DUP_KEYS (the
** simulator runs with --no-dedupe).  On failure returns -1 with a message
** in ERR. */
int paysim_ledger_open(paysim_ledger *l, const char *path, int dup_keys,
                       char *err, size_t errlen);
void paysim_ledger_close(paysim_ledger *l);

/* Append one refund and make it durable (write + fdatasync) before
** returning its index in l->v (KEY, when bound already, stays bound to its
** first refund: only without dedupe does that happen); -1 with a message in ERR when the line could
** not be written (the file is then cut back to where it was). */
long paysim_ledger_append(paysim_ledger *l, const char *key,
                          const char *order_id, long long amount_cents,
                          const char *reason, char *err, size_t errlen);

/* Index of the (first) refund applied under KEY, or -1. */
long paysim_ledger_find_key(const paysim_ledger *l, const char *key);

/* The refund object of the API: {"id","object","status","order_id",
** "amount_cents","reason","idempotency_key","created_ms"}, always in that
** order, so the same refund always serializes to the same bytes. */
json_t *paysim_refund_json(const paysim_refund *r);

/* "re_000042" into BUF. */
void paysim_refund_id(const paysim_refund *r, char *buf, size_t len);

#endif
