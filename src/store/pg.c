/*
** pg.c - the shared attempt log: one PostgreSQL database, reached with
** libpq, for harnesses on many machines.
**
** THE URL
**
** Any libpq connection string that store.c hands over: postgres://...,
** postgresql://... (a URI), with everything libpq reads besides it -
** PGPASSWORD, PGPASSFILE (~/.pgpass), PGSSLMODE and the other PG*
** variables, sslmode=verify-full&sslrootcert=... in the query string, a
** service file.  idem adds only defaults that the string overrides:
** connect_timeout=10 (enforced here: connections are made with
** PQconnectStartParams, so that libpq prints nothing),
** fallback_application_name=idem, and TCP keepalives after 30 s idle
** (keepalives_idle=30, _interval=10, _count=3: a server gone silent is
** noticed in about a minute).  The URL is
** never printed as given: a message shows it with any user:password@
** replaced by ***@ (idem__store_shown_url), and any text from libpq has
** the password, where the string holds one, replaced by *** as well.
**
** THE SCHEMA
**
** Two tables in the connection's search_path (use options=-csearch_path=S
** in the URL to keep idem's tables in a schema of their own):
**
**   idem_meta(key PRIMARY KEY, value)   key 'schema_version' = N
**   idem_attempts(session, call_id, tool, fingerprint, key, args,
**                 fence_key, cls, state, attempts, owner, lease_until,
**                 token, result, error, created, updated, expires,
**                 resolution, delivered, duplicate_of, executor, pgid,
**                 settle_from, turn, resolved_by, resolved_at,
**                 check_with, last_check, checked_at, checks, nonce)
**                                       PRIMARY KEY (session, call_id)
**   idem_attempts_fence (fence_key, created) WHERE fence_key IS NOT NULL
**   idem_attempts_live  (state, created) WHERE state IN (1, 5)
**
** The columns are those of the SQLite store (store/sqlite.c; times in ms
** since the epoch), plus `nonce`: the random id of the last write request
** that touched the row (see LOST CONNECTIONS).  Opening takes an advisory
** lock (pg_advisory_xact_lock(0x6964656d), "idem") in a transaction, reads
** the version, and applies the missing entries of migrations[] and the new
** version in that transaction, so concurrent openers migrate once:
**
**   no idem_meta, no idem_attempts     a new database: migrate to latest
**   no idem_meta, an idem_attempts     another application's table: CORRUPT
**   1 .. SCHEMA_VERSION                migrate forward if older
**   > SCHEMA_VERSION                   a newer idem wrote it: CORRUPT
**
** THE CLOCK
**
** Every time the store writes or compares - created and updated of new
** records, updated of changes, the repeat window of the fence - is the
** server's clock (clock_timestamp()), and now() is the server's clock too,
** so leases and deadlines mean the same on every host whatever their
** clocks say.  now() reads it from the server at most once every CLOCK_MS
** (1 s) and in between adds this host's monotonic time elapsed since that
** reading: the guard asks for the time several times per call, and a round
** trip each time would cost more than the rest of the call.  The error is
** half the reading's round trip plus the monotonic clock's drift over a
** second (parts per million) - never the host's wall clock, which may be
** anything.
**
** ATOMIC STEPS
**
** begin is one pipeline (one round trip): BEGIN; when the record has a
** fence key, pg_advisory_xact_lock(hashtextextended(fence_key, 0)); one
** statement that looks the action up, else runs the fence query (one
** indexed query on idem_attempts_fence, newest first), else INSERTs ... ON
** CONFLICT DO NOTHING RETURNING; COMMIT.  The lock serializes begins that
** share a fence key (in READ COMMITTED the statement after it sees every
** begin committed before), so two racing calls of one fence scope never
** both insert; begins of other scopes never wait for each other.  A begin
** whose insert lost a race on the primary key (ON CONFLICT: no row) runs
** again and finds the winner.  change is one UPDATE ... RETURNING whose
** WHERE is the compare-and-set (state mask, token, terminal outcomes kept:
** exactly the SQLite store's condition); when it matches nothing a second
** statement reads the record to say why (IDEM_STALE / IDEM_NOTFOUND).
**
** DURABILITY AND BATCHING
**
** A begin, an insert, gc and a durable change commit with the connection's
** synchronous_commit (set to on at connect when the server's default is
** off): the record is on the server's disk before the call returns.  Other
** changes run as BEGIN; SET LOCAL synchronous_commit TO off; UPDATE;
** COMMIT in one pipeline: committed (visible to every host) before the
** guard answers, flushed by the server's WAL writer a moment later - the
** SQLite store's NORMAL commits.  change_many (idem recover settling a
** backlog) sends up to PIPE_MAX changes in one pipeline and one
** transaction.  Concurrent sessions commit on their own connections and
** the server's WAL flush groups their commits (group commit).
**
** LOST CONNECTIONS
**
** A request that fails because the connection broke (or the server is
** restarting, or it chose the request as a deadlock or serialization
** victim) is sent again on a new connection, with backoff, for up to
** RETRY_MS.  Every write carries a nonce (a random 63-bit id, the same on
** every retry) that it stores in the row it writes, and a change applies
** only to a row whose nonce is not its own.  So a retry of a write whose
** COMMIT did reach the server is recognized, never applied twice: a begin
** that finds its own nonce on the action's record is INSERTED, a change
** that finds it is IDEM_OK with the record.  (Should another request have
** written the row in between, the retry answers as if its request lost a
** race - FOUND or IDEM_STALE with the record as it is - which is what it
** would have seen after its own success and that later write; the guard
** re-decides from it.)  When the server stays away longer - or past the
** deadline of the call the caller is deciding (idem__store_deadline: a
** step's store calls end by then, or IDEM__STORE_MIN_RETRY_MS after they
** began when that is later, and a connection attempt waits no longer
** either) - the call fails IDEM_STORE ("connection lost"): the guard then
** makes no downstream call (begin) or answers without claiming an outcome,
** and the record, if it was written, is settled by reconciliation - never
** executed twice.
**
** LIBPQ, LOADED ON FIRST USE
**
** libpq is not linked: it brings some thirty libraries of its own (Kerberos,
** LDAP, SASL, ...) that every process using libidem would load at start.
** The first postgres:// open loads "libpq.so.5" (or the file $IDEM_LIBPQ
** names) with dlopen, once per process (src/dl.c), into the table pq; the
** #defines after it send this file's PQ* calls through the table.  Without
** it, or with a libpq older than 14 (no pipeline mode), opening fails
** IDEM_STORE with a message naming what is missing and the package
** (libpq5) to install - the store's answer to a server it cannot reach.
**
** THREADS AND PROCESSES
**
** libpq connections are not shared between threads: the store keeps a
** pool of connections (opened on demand, at most MAX_CONNS, each with its
** statements prepared once), and every entry point takes one for the call
** and gives it back - so N sessions in N threads run N requests at once
** on the server and it groups their commits, with no writer thread of our
** own.  Messages are per thread, as in the SQLite store.  After fork() a
** child must open its own store: every entry point answers IDEM_MISUSE
** and close() abandons the handle (the parent's sockets stay the
** parent's).
*/
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "cols.h"
#include "idemInt.h"

/* ---- libpq, loaded on first use (see LIBPQ above, and src/dl.c) ----------- */

#define PQ_FUNCS(X)                                                            \
  X(PQclear) X(PQcmdTuples) X(PQconnectPoll) X(PQconnectStartParams)           \
  X(PQconninfoFree) X(PQconninfoParse) X(PQenterPipelineMode)                  \
  X(PQerrorMessage) X(PQexec) X(PQexecParams) X(PQexecPrepared)                \
  X(PQexitPipelineMode) X(PQfinish) X(PQfreemem) X(PQgetResult)                \
  X(PQgetisnull) X(PQgetvalue) X(PQntuples) X(PQpipelineStatus)                \
  X(PQpipelineSync) X(PQprepare) X(PQresultErrorField)                         \
  X(PQresultErrorMessage) X(PQresultStatus) X(PQsendPrepare)                   \
  X(PQsendQueryPrepared) X(PQserverVersion) X(PQsetNoticeReceiver)             \
  X(PQsetSingleRowMode) X(PQsocket) X(PQstatus) X(PQtransactionStatus)

static IDEM__DL_TABLE(PQ_FUNCS) pq;
static const char *const pq_names[] = {PQ_FUNCS(IDEM__DL_NAME)};
static idem__dl_lib libpq = {.name = "libpq",
                             .file = "libpq.so.5",
                             .env = "IDEM_LIBPQ",
                             .package = "libpq5, version 14 or later",
                             .names = pq_names,
                             .sym = pq.sym,
                             .n = sizeof pq_names / sizeof *pq_names};

#define PQclear pq.f.PQclear
#define PQcmdTuples pq.f.PQcmdTuples
#define PQconnectPoll pq.f.PQconnectPoll
#define PQconnectStartParams pq.f.PQconnectStartParams
#define PQconninfoFree pq.f.PQconninfoFree
#define PQconninfoParse pq.f.PQconninfoParse
#define PQenterPipelineMode pq.f.PQenterPipelineMode
#define PQerrorMessage pq.f.PQerrorMessage
#define PQexec pq.f.PQexec
#define PQexecParams pq.f.PQexecParams
#define PQexecPrepared pq.f.PQexecPrepared
#define PQexitPipelineMode pq.f.PQexitPipelineMode
#define PQfinish pq.f.PQfinish
#define PQfreemem pq.f.PQfreemem
#define PQgetResult pq.f.PQgetResult
#define PQgetisnull pq.f.PQgetisnull
#define PQgetvalue pq.f.PQgetvalue
#define PQntuples pq.f.PQntuples
#define PQpipelineStatus pq.f.PQpipelineStatus
#define PQpipelineSync pq.f.PQpipelineSync
#define PQprepare pq.f.PQprepare
#define PQresultErrorField pq.f.PQresultErrorField
#define PQresultErrorMessage pq.f.PQresultErrorMessage
#define PQresultStatus pq.f.PQresultStatus
#define PQsendPrepare pq.f.PQsendPrepare
#define PQsendQueryPrepared pq.f.PQsendQueryPrepared
#define PQserverVersion pq.f.PQserverVersion
#define PQsetNoticeReceiver pq.f.PQsetNoticeReceiver
#define PQsetSingleRowMode pq.f.PQsetSingleRowMode
#define PQsocket pq.f.PQsocket
#define PQstatus pq.f.PQstatus
#define PQtransactionStatus pq.f.PQtransactionStatus

#define PG_MAGIC 0x1de3b90fu
#define APP_LOCK 0x6964656d /* "idem" */
#define MAX_CONNS 64
#define PIPE_MAX 64    /* changes in one change_many transaction     */
#define RETRY_MS 30000 /* how long a lost connection is retried       */
#define MAX_RACES 100  /* begins re-run after losing a primary-key race */
#define MSG_MAX 512
#define CONNECT_MS 10000 /* connect_timeout, unless the URL sets one */
#define CLOCK_MS 1000    /* the server's clock is read this often    */
#define NPARAMS 28

/* ---- schema ---------------------------------------------------------------- */

/* migrations[i] takes a database from version i to i + 1. */
static const char *const migrations[] = {
    /* 1 */
    "CREATE TABLE IF NOT EXISTS idem_meta("
    " key text PRIMARY KEY, value text NOT NULL);"
    "CREATE TABLE idem_attempts("
    " session text NOT NULL,"
    " call_id text NOT NULL,"
    " tool text NOT NULL,"
    " fingerprint text NOT NULL,"
    " key text NOT NULL,"
    " args text NOT NULL,"
    " fence_key text,"
    " cls integer NOT NULL,"
    " state integer NOT NULL CHECK (state BETWEEN 1 AND 6),"
    " attempts integer NOT NULL DEFAULT 0,"
    " owner text,"
    " lease_until bigint NOT NULL DEFAULT 0,"
    " token bigint NOT NULL DEFAULT 0,"
    " result text,"
    " error text,"
    " created bigint NOT NULL,"
    " updated bigint NOT NULL,"
    " expires bigint NOT NULL DEFAULT 0,"
    " resolution integer NOT NULL DEFAULT 0,"
    " delivered bigint NOT NULL DEFAULT 0,"
    " duplicate_of text,"
    " nonce bigint NOT NULL DEFAULT 0,"
    " PRIMARY KEY (session, call_id));"
    "CREATE INDEX idem_attempts_fence ON idem_attempts(fence_key, created)"
    " WHERE fence_key IS NOT NULL;"
    "CREATE INDEX idem_attempts_live ON idem_attempts(state, created)"
    " WHERE state IN (1, 5);",
    /* 2: the attempt that may still be running (SPEC §6a); a pending or
    ** in-doubt record of version 1 may have one: its owner ran it */
    "ALTER TABLE idem_attempts ADD COLUMN executor text,"
    " ADD COLUMN pgid bigint NOT NULL DEFAULT 0,"
    " ADD COLUMN settle_from bigint NOT NULL DEFAULT 0;"
    "UPDATE idem_attempts SET executor = owner, settle_from = updated"
    " WHERE state IN (1, 5);",
    /* 3: the model turn that issued the call (SPEC §6.4) */
    "ALTER TABLE idem_attempts ADD COLUMN turn text;",
    /* 4: an operator's verdict, who and when (SPEC §9) */
    ("ALTER TABLE idem_attempts ADD COLUMN resolved_by text,"
     " ADD COLUMN resolved_at bigint NOT NULL DEFAULT 0;"),
    /* 5: the status checks of an action in doubt, for its operator */
    ("ALTER TABLE idem_attempts ADD COLUMN check_with text,"
     " ADD COLUMN last_check text,"
     " ADD COLUMN checked_at bigint NOT NULL DEFAULT 0,"
     " ADD COLUMN checks bigint NOT NULL DEFAULT 0;"),
};

#define SCHEMA_VERSION ((int)(sizeof migrations / sizeof *migrations))

/* The server's clock in ms since the epoch. */
#define NOW_MS "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
/* A record not applied that names a call which carried it out or is at it
** (duplicate_of: handed_to in guard.c) fences a call of its turn as that
** call would. */
#define HANDED                                                                 \
  "EXISTS (SELECT 1 FROM idem_attempts x WHERE x.session = a.session"          \
  " AND x.call_id = a.duplicate_of AND x.fence_key = a.fence_key"              \
  " AND x.state IN (1, 2, 5))"
/* IDEM__CLOCK_SLACK_MS, in the SQL text */
#define SLACK_TEXT(ms) #ms
#define SLACK_OF(ms) SLACK_TEXT(ms)
#define SLACK SLACK_OF(IDEM__CLOCK_SLACK_MS)

/*
** The parameters of begin and insert ($1 .. $28): the record's columns
** in C_* order ($1 .. $24; created 0: now) but the last, then $25 the
** repeat window in ms (begin), $26 the nonce, $27 the turn (C_TURN, the
** column added last), $28 the coalescing window in ms (begin).  updated is
** now for a begin, the record's own (or now when 0) for an insert: insert
** passes it as $17.
*/
#define REC_PARAMS                                                             \
  "$1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, "     \
  "$8::integer, $9::integer, $10::integer, $11::text, $12::bigint, "           \
  "$13::bigint, $14::text, $15::text, "                                        \
  "CASE WHEN $16::bigint > 0 THEN $16::bigint ELSE t.now END, "                \
  "CASE WHEN $17::bigint > 0 THEN $17::bigint ELSE t.now END, "                \
  "$18::bigint, $19::integer, $20::bigint, $21::text, $22::text, "           \
  "$23::bigint, $24::bigint, $27::text, $26::bigint"

/* The found CTE: the action itself; what = INSERTED (1) when it carries
** this request's nonce (a retry of a begin that did commit), FOUND (2). */
#define FOUND_CTE                                                              \
  "found AS (SELECT CASE WHEN nonce = $26::bigint THEN 1 ELSE 2 END AS "       \
  "what, " COLS                                                                \
  " FROM idem_attempts WHERE session = $1::text AND call_id = $2::text)"

enum {
  S_BEGIN_TX,
  S_COMMIT,
  S_ROLLBACK,
  S_ASYNC,
  S_LOCK,
  S_BEGIN,
  S_INSERT,
  S_GET,
  S_CHANGE,
  S_GC,
  S_STATS,
  S_NOW,
  S_FENCE,
  S_TALLY,
  N_STMTS
};

static const char *const stmt_sql[N_STMTS] = {
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SET LOCAL synchronous_commit TO off",
    "SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))",
    /* begin: the action, else the fence (idemInt.h), else the insert */
    "WITH t AS (SELECT " NOW_MS " AS now), " FOUND_CTE ","
    " fence AS (SELECT 3 AS what, " COLS " FROM idem_attempts a, t"
    "  WHERE $7::text IS NOT NULL AND fence_key = $7::text"
    "  AND NOT (session = $1::text AND call_id = $2::text)"
    "  AND (state IN (1, 5) OR (state = 2 AND (delivered = 0"
    "   OR (delivered > CASE WHEN $16::bigint > 0 THEN $16::bigint"
    "    ELSE t.now END AND delivered <= t.now + " SLACK ")"
    "   OR ($25::bigint > 0 AND created >= t.now - $25::bigint)))"
    "   OR ((state IN (2, 6) OR (state = 4 AND " HANDED "))"
    "   AND (turn = $27::text"
    "   OR ($28::bigint > 0 AND $27::text IS NULL"
    "    AND abs(created - CASE WHEN $16::bigint > 0 THEN $16::bigint"
    "     ELSE t.now END) <= $28::bigint))))"
    "  AND NOT EXISTS (SELECT 1 FROM found)"
    "  ORDER BY created DESC, session DESC, call_id DESC LIMIT 1),"
    " ins AS (INSERT INTO idem_attempts (" COLS_WRITTEN ", nonce)"
    "  SELECT " REC_PARAMS " FROM t WHERE NOT EXISTS (SELECT 1 FROM found)"
    "  AND NOT EXISTS (SELECT 1 FROM fence)"
    "  ON CONFLICT (session, call_id) DO NOTHING RETURNING 1 AS what, " COLS ")"
    " SELECT * FROM ins UNION ALL SELECT * FROM found"
    " UNION ALL SELECT * FROM fence",
    /* insert as it is (a deduplicated record) */
    "WITH t AS (SELECT " NOW_MS " AS now), " FOUND_CTE ","
    " ins AS (INSERT INTO idem_attempts (" COLS_WRITTEN ", nonce)"
    "  SELECT " REC_PARAMS " FROM t WHERE NOT EXISTS (SELECT 1 FROM found)"
    "  AND $25::bigint = 0 AND $28::bigint = 0"
    "  ON CONFLICT (session, call_id) DO NOTHING RETURNING 1 AS what, " COLS ")"
    " SELECT * FROM ins UNION ALL SELECT * FROM found",
    "SELECT nonce, " COLS
    " FROM idem_attempts WHERE session = $1::text AND call_id = $2::text",
    /* A change (idem__change): $3 state mask, $4 token or -1, $5 state or
    ** 0, $6 attempts to add, $7 the lease (1 take it over, 2 hand it on;
    ** $8 owner, $9 lease_until), $10 result, $11 error, $12 resolution or
    ** 0, $13 delivered or -1, $14 the nonce, $15 the executor (1 set $16
    ** $17 $18, 2 clear, 3 ended without a verdict at $18), $19 a
    ** settle_from to lower to, or 0, $20 duplicate_of or NULL, $21 the
    ** owner the row must still have or NULL, $22 who gave an operator's
    ** verdict or NULL (resolved_at: now), $23 the expiry of a settling
    ** change or 0 (never lowered), $24 check_with or NULL, $25 the answer
    ** of a status check or NULL (checked_at: now, checks + 1).  The
    ** terminal clause is the SQLite store's. */
    "UPDATE idem_attempts SET"
    " state = CASE WHEN $5::integer > 0 THEN $5::integer ELSE state END,"
    " attempts = attempts + $6::integer,"
    " owner = CASE WHEN $7::integer > 0 THEN $8::text ELSE owner END,"
    " lease_until = CASE WHEN $7::integer > 0 THEN $9::bigint"
    "  ELSE lease_until END,"
    " token = token + CASE WHEN $7::integer = 1 THEN 1 ELSE 0 END,"
    " executor = CASE $15::integer WHEN 0 THEN executor WHEN 1 THEN $16::text"
    "  END,"
    " pgid = CASE $15::integer WHEN 0 THEN pgid WHEN 1 THEN $17::bigint"
    "  ELSE 0 END,"
    " settle_from = CASE $15::integer WHEN 1 THEN $18::bigint WHEN 2 THEN 0"
    "  WHEN 3 THEN CASE WHEN settle_from > 0 AND settle_from < $18::bigint"
    "   THEN settle_from ELSE $18::bigint END"
    "  ELSE CASE WHEN $19::bigint > 0 AND executor IS NOT NULL"
    "   AND $19::bigint < settle_from THEN $19::bigint ELSE settle_from END"
    "  END,"
    " result = coalesce($10::text, result),"
    " error = coalesce($11::text, error),"
    " resolution = CASE WHEN $12::integer > 0 THEN $12::integer"
    "  ELSE resolution END,"
    " delivered = CASE WHEN $13::bigint >= 0 THEN $13::bigint"
    "  ELSE delivered END,"
    " expires = CASE WHEN expires > 0 AND $23::bigint > expires"
    "  THEN $23::bigint ELSE expires END,"
    " updated = " NOW_MS ","
    " duplicate_of = coalesce($20::text, duplicate_of),"
    " resolved_by = coalesce($22::text, resolved_by),"
    " resolved_at = CASE WHEN $22::text IS NULL THEN resolved_at"
    "  ELSE " NOW_MS " END,"
    " check_with = coalesce($24::text, check_with),"
    " last_check = coalesce($25::text, last_check),"
    " checked_at = CASE WHEN $25::text IS NULL THEN checked_at"
    "  ELSE " NOW_MS " END,"
    " checks = checks + CASE WHEN $25::text IS NULL THEN 0 ELSE 1 END,"
    " nonce = $14::bigint"
    " WHERE session = $1::text AND call_id = $2::text"
    " AND (($3::bigint >> state) & 1) = 1"
    " AND ($4::bigint < 0 OR token = $4::bigint) AND nonce <> $14::bigint"
    " AND ($21::text IS NULL OR owner = $21::text)"
    " AND (state NOT IN (2, 3, 6) OR ($7::integer = 0 AND $6::integer = 0"
    "  AND $10::text IS NULL AND $11::text IS NULL"
    "  AND $5::integer IN (0, state) AND $12::integer IN (0, resolution)"
    "  AND $15::integer = 0 AND $19::bigint <= 0 AND $20::text IS NULL"
    "  AND $22::text IS NULL AND $24::text IS NULL AND $25::text IS NULL))"
    " RETURNING nonce, " COLS,
    "DELETE FROM idem_attempts WHERE state IN (2, 3, 4, 6)"
    " AND expires > 0 AND expires < $1::bigint",
    "SELECT state, count(*) FROM idem_attempts GROUP BY state",
    "SELECT " NOW_MS,
    /* the fence of an action that exists (begin's rule): $1 fence_key, $2
    ** session, $3 call id, $4 its created, $5 the repeat window or 0, $6
    ** its turn, $7 the coalescing window or 0, $8 1: of its turn only */
    "SELECT nonce, " COLS " FROM idem_attempts a,"
    " (SELECT " NOW_MS " AS now) t WHERE fence_key = $1::text"
    " AND NOT (session = $2::text AND call_id = $3::text)"
    " AND (state IN (1, 5) OR (state = 2 AND (delivered = 0"
    "  OR (delivered > $4::bigint AND delivered <= t.now + " SLACK ")"
    "  OR ($5::bigint > 0 AND created >= t.now - $5::bigint)))"
    "  OR ((state IN (2, 6) OR (state = 4 AND " HANDED "))"
    "  AND (turn = $6::text"
    "  OR ($7::bigint > 0 AND $6::text IS NULL"
    "   AND abs(created - $4::bigint) <= $7::bigint))))"
    " AND ($8::integer = 0 OR (state <> 3 AND (turn = $6::text"
    "  OR ($7::bigint > 0 AND $6::text IS NULL"
    "   AND abs(created - $4::bigint) <= $7::bigint))))"
    " ORDER BY created DESC, session DESC, call_id DESC LIMIT 1",
    IDEM__TALLY_SQL("idem_attempts"),
};

static const char *const stmt_name[N_STMTS] = {
    "idem_tx",     "idem_commit", "idem_rollback", "idem_async",
    "idem_lock",   "idem_begin",  "idem_insert",   "idem_get",
    "idem_change", "idem_gc",     "idem_stats",    "idem_now",
    "idem_fence",  "idem_tally",
};

/* ---- per-thread messages --------------------------------------------------- */

static _Thread_local const void *tls_store;
static _Thread_local char tls_msg[MSG_MAX];

/* ---- the store ------------------------------------------------------------- */

/* The listing statements a connection keeps prepared, by shape
** (idem__filter_shape): the few a process uses; a shape past them is
** prepared unnamed for its call. */
#define LIST_SLOTS 32

typedef struct conn {
  PGconn *db;
  unsigned listed[LIST_SLOTS]; /* the shapes of listings prepared */
  int nlisted;
  struct conn *next;
} conn;

typedef struct pg_store {
  idem__store base;
  unsigned magic;
  pid_t pid;
  char *conninfo;       /* as given: passed to libpq, never printed      */
  char *shown;          /* for messages: without user:password@          */
  char *password;       /* the string's own password, scrubbed from text */
  long long connect_ms; /* connect_timeout, or CONNECT_MS        */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  conn *free_conns;
  int nconns;
  int max_conns; /* MAX_CONNS, less once the server said "too many" */
  int locks_ready;
  unsigned long long nonce_base;
  atomic_ullong nonce_next;
  /* the server's clock: read at server_ms when this host's monotonic
  ** clock said mono_ms (0: never read) */
  pthread_mutex_t clock_mu;
  long long server_ms, mono_at;
} pg_store;

static const idem__store_vt pg_vt;

/* ---- helpers --------------------------------------------------------------- */

/* Replace every copy of the password in msg by "***". */
static void scrub(const pg_store *s, char *msg, size_t n) {
  size_t plen, tail;
  char *p;
  if (!s->password || !(plen = strlen(s->password))) return;
  while ((p = strstr(msg, s->password)) != NULL) {
    tail = strlen(p + plen);
    if (plen >= 3) {
      memcpy(p, "***", 3);
      memmove(p + 3, p + plen, tail + 1);
    } else if ((size_t)(p - msg) + 3 + tail < n) {
      memmove(p + 3, p + plen, tail + 1);
      memcpy(p, "***", 3);
    } else {
      *p = '\0';
    }
  }
}

static void msg_clear(const pg_store *s) {
  tls_store = s;
  tls_msg[0] = '\0';
}

static int msg_set(const pg_store *s, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int msg_set(const pg_store *s, int code, const char *fmt, ...) {
  va_list ap;
  tls_store = s;
  va_start(ap, fmt);
  vsnprintf(tls_msg, sizeof tls_msg, fmt, ap);
  va_end(ap);
  scrub(s, tls_msg, sizeof tls_msg);
  return code;
}

/* libpq's text for a failure, on one line. */
static void pq_text(PGconn *db, const PGresult *res, char *out, size_t n) {
  const char *t = res ? PQresultErrorMessage(res) : "";
  size_t len;
  if (!t || !*t) t = db ? PQerrorMessage(db) : "";
  if (!t || !*t) t = "no error text";
  snprintf(out, n, "%s", t);
  len = strlen(out);
  while (len > 0 && (out[len - 1] == '\n' || out[len - 1] == ' '))
    out[--len] = '\0';
  for (char *p = out; *p; p++)
    if (*p == '\n') *p = ' ';
}

/* What a failure means. */
enum { F_HARD, F_RETRY, F_BUSY };

static int classify(PGconn *db, const PGresult *res) {
  const char *code = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  if (!db || PQstatus(db) != CONNECTION_OK) return F_RETRY;
  if (!code) return res ? F_HARD : F_RETRY;
  if (strncmp(code, "08", 2) == 0 || strcmp(code, "57P01") == 0 ||
      strcmp(code, "57P02") == 0 || strcmp(code, "57P03") == 0 ||
      strcmp(code, "40001") == 0 || strcmp(code, "40P01") == 0)
    return F_RETRY;
  if (strcmp(code, "53300") == 0) return F_BUSY;
  return F_HARD;
}

static int fail_code(const PGresult *res) {
  const char *code = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  if (code && strcmp(code, "53200") == 0) return IDEM_NOMEM;
  if (code && strncmp(code, "53", 2) == 0) return IDEM_BUSY;
  return IDEM_STORE;
}

/* Set this thread's message: "URL: libpq's text (SQLSTATE x, while WHAT)". */
static int msg_pq(pg_store *s, PGconn *db, const PGresult *res,
                  const char *what) {
  char text[MSG_MAX];
  const char *code = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  pq_text(db, res, text, sizeof text);
  if (code)
    return msg_set(s, fail_code(res), "%s: %s (SQLSTATE %s, while %s)",
                   s->shown, text, code, what);
  return msg_set(s, fail_code(res), "%s: %s (while %s)", s->shown, text, what);
}

static pg_store *check(idem__store *st) {
  pg_store *s = (pg_store *)st;
  if (!st || st->vt != &pg_vt || s->magic != PG_MAGIC) return NULL;
  if (s->pid != getpid()) {
    msg_set(s, IDEM_MISUSE,
            "%s: this store was opened by process %ld; after fork() a child "
            "must open its own",
            s->shown, (long)s->pid);
    return NULL;
  }
  msg_clear(s);
  return s;
}

#define CHECK_STORE(s, st)                                                     \
  pg_store *s = check(st);                                                     \
  if (!s) return IDEM_MISUSE

static unsigned long long next_nonce(pg_store *s) {
  unsigned long long n = atomic_fetch_add(&s->nonce_next, 1);
  /* a random start, then a counter mixed (splitmix64), never 0 */
  n += s->nonce_base;
  n ^= n >> 30;
  n *= 0xbf58476d1ce4e5b9ull;
  n ^= n >> 27;
  n *= 0x94d049bb133111ebull;
  n ^= n >> 31;
  n &= 0x7fffffffffffffffull;
  return n ? n : 1;
}

/* Parameters as text. */
typedef struct params {
  const char *v[NPARAMS];
  char num[NPARAMS][24];
  int n;
} params;

static void p_str(params *p, int i, const char *v) {
  p->v[i - 1] = v;
  if (i > p->n) p->n = i;
}

static void p_int(params *p, int i, long long v) {
  snprintf(p->num[i - 1], sizeof p->num[0], "%lld", v);
  p_str(p, i, p->num[i - 1]);
}

/* Copy text field (row, col) into *out (NULL for NULL); 0 when memory ran
** out. */
static int col_str(const PGresult *r, int row, int col, char **out) {
  *out = NULL;
  if (PQgetisnull(r, row, col)) return 1;
  return (*out = idem__strdup(PQgetvalue(r, row, col))) != NULL;
}

static long long col_ll(const PGresult *r, int row, int col) {
  return PQgetisnull(r, row, col) ? 0
                                  : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

/* The record in row `row` of r, columns COLS from column `at`. */
static idem_record *row_record(const PGresult *r, int row, int at) {
  idem_record *rec = idem__malloc(sizeof *rec);
  if (!rec) return NULL;
  memset(rec, 0, sizeof *rec);
  rec->cls = (int)col_ll(r, row, at + C_CLS);
  rec->state = (int)col_ll(r, row, at + C_STATE);
  rec->attempts = (int)col_ll(r, row, at + C_ATTEMPTS);
  rec->lease_until = col_ll(r, row, at + C_LEASE_UNTIL);
  rec->token = col_ll(r, row, at + C_TOKEN);
  rec->created = col_ll(r, row, at + C_CREATED);
  rec->updated = col_ll(r, row, at + C_UPDATED);
  rec->expires = col_ll(r, row, at + C_EXPIRES);
  rec->resolution = (int)col_ll(r, row, at + C_RESOLUTION);
  rec->delivered = col_ll(r, row, at + C_DELIVERED);
  rec->pgid = col_ll(r, row, at + C_PGID);
  rec->settle_from = col_ll(r, row, at + C_SETTLE_FROM);
  rec->resolved_at = col_ll(r, row, at + C_RESOLVED_AT);
  rec->checked_at = col_ll(r, row, at + C_CHECKED_AT);
  rec->checks = col_ll(r, row, at + C_CHECKS);
  if (col_str(r, row, at + C_SESSION, &rec->session) &
      col_str(r, row, at + C_CALL_ID, &rec->call_id) &
      col_str(r, row, at + C_TOOL, &rec->tool) &
      col_str(r, row, at + C_FINGERPRINT, &rec->fingerprint) &
      col_str(r, row, at + C_KEY, &rec->key) &
      col_str(r, row, at + C_ARGS, &rec->args) &
      col_str(r, row, at + C_FENCE_KEY, &rec->fence_key) &
      col_str(r, row, at + C_OWNER, &rec->owner) &
      col_str(r, row, at + C_RESULT, &rec->result) &
      col_str(r, row, at + C_ERROR, &rec->error) &
      col_str(r, row, at + C_DUPLICATE_OF, &rec->duplicate_of) &
      col_str(r, row, at + C_EXECUTOR, &rec->executor) &
      col_str(r, row, at + C_TURN, &rec->turn) &
      col_str(r, row, at + C_RESOLVED_BY, &rec->resolved_by) &
      col_str(r, row, at + C_CHECK_WITH, &rec->check_with) &
      col_str(r, row, at + C_LAST_CHECK, &rec->last_check))
    return rec;
  idem_record_free(rec);
  return NULL;
}

/* The parameters of begin / insert for rec. */
static void rec_params(params *p, const idem_record *rec, int state,
                       long long token, long long updated, long long window,
                       long long coalesce, unsigned long long nonce) {
  memset(p, 0, sizeof *p);
  p_str(p, 1 + C_SESSION, rec->session);
  p_str(p, 1 + C_CALL_ID, rec->call_id);
  p_str(p, 1 + C_TOOL, rec->tool);
  p_str(p, 1 + C_FINGERPRINT, rec->fingerprint);
  p_str(p, 1 + C_KEY, rec->key);
  p_str(p, 1 + C_ARGS, rec->args);
  p_str(p, 1 + C_FENCE_KEY, rec->fence_key);
  p_int(p, 1 + C_CLS, rec->cls);
  p_int(p, 1 + C_STATE, state);
  p_int(p, 1 + C_ATTEMPTS, rec->attempts);
  p_str(p, 1 + C_OWNER, rec->owner);
  p_int(p, 1 + C_LEASE_UNTIL, rec->lease_until);
  p_int(p, 1 + C_TOKEN, token);
  p_str(p, 1 + C_RESULT, rec->result);
  p_str(p, 1 + C_ERROR, rec->error);
  p_int(p, 1 + C_CREATED, rec->created);
  p_int(p, 1 + C_UPDATED, updated);
  p_int(p, 1 + C_EXPIRES, rec->expires);
  p_int(p, 1 + C_RESOLUTION, rec->resolution);
  p_int(p, 1 + C_DELIVERED, rec->delivered);
  p_str(p, 1 + C_DUPLICATE_OF, rec->duplicate_of);
  p_str(p, 1 + C_EXECUTOR, rec->executor);
  p_int(p, 1 + C_PGID, rec->pgid);
  p_int(p, 1 + C_SETTLE_FROM, rec->settle_from);
  p_int(p, 25, window);
  p_int(p, 26, (long long)nonce);
  p_str(p, 27, rec->turn);
  p_int(p, 28, coalesce);
}

/* ---- connections ----------------------------------------------------------- */

static void conn_free(conn *c) {
  if (!c) return;
  if (c->db) PQfinish(c->db);
  idem__free(c);
}

/*
** Run statements in one pipeline (one round trip) and collect each one's
** result into res[i] (NULL when it sent none).  Returns 0, or -1 when the
** pipeline itself failed (the connection; *failed is the result that
** says why, or NULL).  After an error the server skips the rest
** (PGRES_PIPELINE_ABORTED); an explicit transaction left open by it is
** rolled back here.
*/
typedef struct pq_req {
  int stmt;
  const params *p;
} pq_req;

static int pipeline(conn *c, const pq_req *q, int n, PGresult **res) {
  PGresult *r;
  int i = 0, sent, ok = 1, synced = 0;
  for (i = 0; i < n; i++) res[i] = NULL;
  if (!PQenterPipelineMode(c->db)) return -1;
  for (sent = 0; sent < n; sent++) {
    const params *p = q[sent].p;
    if (!PQsendQueryPrepared(c->db, stmt_name[q[sent].stmt], p ? p->n : 0,
                             p ? p->v : NULL, NULL, NULL, 0))
      break;
  }
  if (sent < n || !PQpipelineSync(c->db)) ok = 0;
  /* the results: per query one or more, then NULL; then the sync */
  i = 0;
  while (ok && !synced) {
    r = PQgetResult(c->db);
    if (!r) {
      if (PQstatus(c->db) != CONNECTION_OK)
        ok = 0;
      else if (i < n)
        i++;
      else
        ok = 0; /* nothing more will come */
      continue;
    }
    if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
      synced = 1;
    } else if (i < n && !res[i]) {
      res[i] = r;
      continue;
    } else if (i >= n) {
      ok = 0;
    }
    PQclear(r);
  }
  if (!ok || !PQexitPipelineMode(c->db)) {
    /* the connection broke: conn_put drops it */
    for (i = 0; i < n; i++)
      if (res[i] && PQresultStatus(res[i]) == PGRES_FATAL_ERROR) return 0;
    for (i = 0; i < n; i++) {
      PQclear(res[i]);
      res[i] = NULL;
    }
    return -1;
  }
  if (PQtransactionStatus(c->db) == PQTRANS_INERROR ||
      PQtransactionStatus(c->db) == PQTRANS_INTRANS) {
    PGresult *rb =
        PQexecPrepared(c->db, stmt_name[S_ROLLBACK], 0, NULL, NULL, NULL, 0);
    PQclear(rb);
  }
  return 0;
}

/* Prepare every statement on a new connection, in one pipeline.  *again:
** the failure was the connection's (it is gone, or the server's error says
** it ended it meanwhile), so a new one may succeed; a failure of libpq
** itself with the connection up (no result to classify) is not retried. */
static int conn_prepare(pg_store *s, conn *c, int *again) {
  PGresult *r;
  int i, ok = 1, got = 0;
  *again = 0;
  if (!PQenterPipelineMode(c->db)) {
    *again = PQstatus(c->db) != CONNECTION_OK;
    return msg_pq(s, c->db, NULL, "preparing");
  }
  for (i = 0; i < N_STMTS; i++)
    if (!PQsendPrepare(c->db, stmt_name[i], stmt_sql[i], 0, NULL)) ok = 0;
  if (!ok || !PQpipelineSync(c->db)) {
    PQexitPipelineMode(c->db);
    *again = PQstatus(c->db) != CONNECTION_OK;
    return msg_pq(s, c->db, NULL, "preparing the statements");
  }
  for (;;) {
    r = PQgetResult(c->db);
    if (!r) {
      if (PQstatus(c->db) != CONNECTION_OK || ++got > N_STMTS) break;
      continue;
    }
    if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
      PQclear(r);
      break;
    }
    if (PQresultStatus(r) != PGRES_COMMAND_OK && ok) {
      ok = 0;
      *again = classify(c->db, r) == F_RETRY;
      msg_pq(s, c->db, r, "preparing the statements");
    }
    PQclear(r);
  }
  PQexitPipelineMode(c->db);
  if (PQstatus(c->db) != CONNECTION_OK) {
    *again = 1;
    if (ok) return msg_pq(s, c->db, NULL, "preparing the statements");
  }
  return ok ? IDEM_OK : IDEM_STORE;
}

/* Notices (and the FATAL a server sends to an idle connection it ends)
** are libpq's to print on stderr by default; a library keeps quiet. */
static void quiet(void *arg, const PGresult *res) { (void)arg, (void)res; }

/* Run one fixed statement outside a pipeline (schema and settings); on a
** failure *again (when not NULL) says whether it was the connection's. */
static int exec_fixed(pg_store *s, conn *c, const char *sql, const char *what,
                      PGresult **out, int *again) {
  PGresult *r = PQexecParams(c->db, sql, 0, NULL, NULL, NULL, NULL, 0);
  ExecStatusType t = PQresultStatus(r);
  if (out) *out = NULL;
  if (t != PGRES_COMMAND_OK && t != PGRES_TUPLES_OK) {
    int rc = msg_pq(s, c->db, r, what);
    if (again) *again = classify(c->db, r) == F_RETRY;
    PQclear(r);
    return rc;
  }
  if (out)
    *out = r;
  else
    PQclear(r);
  return IDEM_OK;
}

/* Drive a started connection to OK or BAD within ms (libpq's
** connect_timeout holds only for its blocking connect). */
static void connect_wait(PGconn *db, long long ms) {
  PostgresPollingStatusType st = PGRES_POLLING_WRITING;
  long long deadline = idem__mono_ms() + ms, left;
  struct pollfd p;
  while (PQstatus(db) != CONNECTION_BAD && st != PGRES_POLLING_OK &&
         st != PGRES_POLLING_FAILED) {
    p.fd = PQsocket(db);
    p.events = st == PGRES_POLLING_READING ? POLLIN : POLLOUT;
    p.revents = 0;
    if ((left = deadline - idem__mono_ms()) <= 0) return; /* still not OK */
    if (poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left) < 0 && errno != EINTR)
      return;
    st = PQconnectPoll(db);
  }
}

/* A new connection, its statements prepared when `prepare` (not before
** the schema exists). */
static int conn_open(pg_store *s, conn **out, int *retry, int prepare) {
  static const char *const keys[] = {
      "fallback_application_name", "keepalives_idle", "keepalives_interval",
      "keepalives_count",          "dbname",          NULL};
  const char *vals[6];
  conn *c;
  int rc;
  *out = NULL;
  *retry = 0;
  if (!(c = idem__malloc(sizeof *c)))
    return msg_set(s, IDEM_NOMEM, "%s: out of memory", s->shown);
  memset(c, 0, sizeof *c);
  vals[0] = "idem";
  vals[1] = "30"; /* a server gone silent (not closed) is found out */
  vals[2] = "10"; /* within about a minute, not TCP's two hours   */
  vals[3] = "3";
  vals[4] = s->conninfo;
  vals[5] = NULL;
  /* PQconnectStartParams, so that no notice of the startup (a server
  ** ending the session at once) reaches libpq's default printer */
  c->db = PQconnectStartParams(keys, vals, 1);
  if (!c->db) {
    idem__free(c);
    return msg_set(s, IDEM_NOMEM, "%s: out of memory", s->shown);
  }
  PQsetNoticeReceiver(c->db, quiet, NULL);
  {
    /* a server gone silent is waited for no longer than the call may */
    long long left = idem__store_deadline() - idem__mono_ms();
    if (left < IDEM__STORE_MIN_RETRY_MS) left = IDEM__STORE_MIN_RETRY_MS;
    connect_wait(c->db, idem__store_deadline() > 0 && left < s->connect_ms
                            ? left
                            : s->connect_ms);
  }
  if (PQstatus(c->db) != CONNECTION_OK) {
    char text[MSG_MAX];
    pq_text(c->db, NULL, text, sizeof text);
    /* the server is starting or shutting down: worth another try */
    *retry = strstr(text, "starting up") || strstr(text, "shutting down") ||
                     strstr(text, "in recovery mode")
                 ? 2
             : strstr(text, "Connection refused") ||
                     strstr(text, "No such file or directory") ||
                     strstr(text, "terminating connection")
                 ? 1
                 : 0;
    rc = msg_set(s, strstr(text, "too many") ? IDEM_BUSY : IDEM_STORE,
                 "%s: cannot connect: %s", s->shown, text);
    conn_free(c);
    return rc;
  }
  if (PQserverVersion(c->db) < 110000) {
    rc = msg_set(s, IDEM_STORE,
                 "%s: PostgreSQL %d.%d is too old for the attempt log (11 or "
                 "later)",
                 s->shown, PQserverVersion(c->db) / 10000,
                 PQserverVersion(c->db) / 100 % 100);
    conn_free(c);
    return rc;
  }
  /* a begin must be on disk before the downstream call.  A connection
  ** the server ends meanwhile (it says why first, so libpq may not know
  ** yet that it is gone: classify reads the SQLSTATE) is worth another. */
  if ((rc = exec_fixed(s, c,
                       "SELECT set_config('synchronous_commit', 'on', false)"
                       " WHERE current_setting('synchronous_commit') = 'off'",
                       "setting synchronous_commit", NULL, retry)) != IDEM_OK) {
    conn_free(c);
    return rc;
  }
  if (prepare && (rc = conn_prepare(s, c, retry)) != IDEM_OK) {
    conn_free(c);
    return rc;
  }
  *out = c;
  return IDEM_OK;
}

/* Take a connection from the pool, opening one when none is free. */
static int conn_get(pg_store *s, conn **out, int *retry) {
  conn *c;
  int rc;
  *out = NULL;
  *retry = 0;
  pthread_mutex_lock(&s->mu);
  while (!s->free_conns && s->nconns >= s->max_conns)
    pthread_cond_wait(&s->cv, &s->mu);
  if ((c = s->free_conns) != NULL) {
    s->free_conns = c->next;
    pthread_mutex_unlock(&s->mu);
    *out = c;
    return IDEM_OK;
  }
  s->nconns++;
  pthread_mutex_unlock(&s->mu);
  if ((rc = conn_open(s, &c, retry, 1)) == IDEM_OK) {
    *out = c;
    return IDEM_OK;
  }
  pthread_mutex_lock(&s->mu);
  s->nconns--;
  pthread_cond_signal(&s->cv);
  if (rc == IDEM_BUSY && s->nconns > 0) {
    /* the server has no connection slot for us: share the ones we have
    ** (and open no more than that from now on) */
    s->max_conns = s->nconns;
    while (!s->free_conns && s->nconns > 0) pthread_cond_wait(&s->cv, &s->mu);
    if ((c = s->free_conns) != NULL) {
      s->free_conns = c->next;
      pthread_mutex_unlock(&s->mu);
      msg_clear(s);
      *out = c;
      return IDEM_OK;
    }
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* Give a connection back, or drop it when it is broken. */
static void conn_put(pg_store *s, conn *c) {
  int bad = PQstatus(c->db) != CONNECTION_OK ||
            PQtransactionStatus(c->db) != PQTRANS_IDLE ||
            PQpipelineStatus(c->db) != PQ_PIPELINE_OFF;
  pthread_mutex_lock(&s->mu);
  if (bad) {
    s->nconns--;
  } else {
    c->next = s->free_conns;
    s->free_conns = c;
  }
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  if (bad) conn_free(c);
}

/*
** Retrying.  A request is a function of a connection that returns IDEM_*
** and sets *again when it failed in a way that another connection may
** not (see classify).  run() gives it connections until it succeeds, fails
** for good, or RETRY_MS have passed - or, sooner, the deadline of the call
** the caller is deciding (idem__store_deadline; never less than
** IDEM__STORE_MIN_RETRY_MS) - sleeping 10, 20, 40 ... 1000 ms in between.
** Only requests that are safe to repeat go through run(): reads, and
** writes that carry their nonce.
*/
typedef int (*request_fn)(pg_store *s, conn *c, void *arg, int *again);

/* When a request begun at start gives up retrying. */
static long long retry_until(long long start) {
  long long d = start + RETRY_MS, call = idem__store_deadline();
  if (call > 0 && call < d)
    d = call > start + IDEM__STORE_MIN_RETRY_MS
            ? call
            : start + IDEM__STORE_MIN_RETRY_MS;
  return d;
}

static int run(pg_store *s, request_fn fn, void *arg) {
  long long start = idem__mono_ms(), deadline = retry_until(start);
  long wait = 10;
  int rc, again, tries = 0;
  conn *c;
  for (;;) {
    again = 0;
    rc = conn_get(s, &c, &again);
    if (rc == IDEM_OK) {
      rc = fn(s, c, arg, &again);
      /* a request that failed for the connection leaves it broken or in
      ** a transaction: conn_put drops it */
      conn_put(s, c);
    }
    tries++;
    if (rc == IDEM_OK || !again) return rc;
    if (idem__mono_ms() + wait > deadline) {
      char was[MSG_MAX];
      snprintf(was, sizeof was, "%s", tls_msg);
      return msg_set(s, IDEM_STORE,
                     "connection lost, gave up after %d tries in %.1f s%s; "
                     "the outcome of this request is unknown: %s",
                     tries, (double)(idem__mono_ms() - start) / 1000,
                     deadline < start + RETRY_MS ? " (the call's deadline)"
                                                 : "",
                     was);
    }
    idem__sleep_ms(wait);
    wait = wait * 2 > 1000 ? 1000 : wait * 2;
  }
}

/* A failed result: the message, and whether to try again. */
static int res_fail(pg_store *s, conn *c, PGresult *r, const char *what,
                    int *again) {
  int k = classify(c->db, r);
  *again = k == F_RETRY;
  return msg_pq(s, c->db, r, what);
}

/* ---- schema ---------------------------------------------------------------- */

static int setup(pg_store *s, conn *c) {
  PGresult *r = NULL;
  long long version = 0;
  char sql[256];
  int rc, i, has_meta, has_attempts;
  if ((rc = exec_fixed(s, c, "BEGIN", "opening the attempt log", NULL, NULL)))
    return rc;
  snprintf(sql, sizeof sql, "SELECT pg_advisory_xact_lock(%d)", APP_LOCK);
  if ((rc = exec_fixed(s, c, sql, "locking the schema", NULL, NULL)) ||
      (rc = exec_fixed(s, c,
                       "SELECT to_regclass('idem_meta') IS NOT NULL,"
                       " to_regclass('idem_attempts') IS NOT NULL",
                       "reading the schema", &r, NULL)))
    goto fail;
  has_meta = PQgetvalue(r, 0, 0)[0] == 't';
  has_attempts = PQgetvalue(r, 0, 1)[0] == 't';
  PQclear(r);
  r = NULL;
  if (has_meta) {
    if ((rc = exec_fixed(s, c,
                         "SELECT value FROM idem_meta"
                         " WHERE key = 'schema_version'",
                         "reading the schema version", &r, NULL)))
      goto fail;
    version = PQntuples(r) ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : 0;
    PQclear(r);
    r = NULL;
  }
  if (version == 0 && has_attempts) {
    rc = msg_set(s, IDEM_CORRUPT,
                 "%s: not an idem attempt log (a table idem_attempts without "
                 "idem's schema version)",
                 s->shown);
    goto fail;
  }
  if (version > SCHEMA_VERSION) {
    rc = msg_set(s, IDEM_CORRUPT,
                 "%s: written by a newer idem (schema version %lld; this idem "
                 "knows up to %d)",
                 s->shown, version, SCHEMA_VERSION);
    goto fail;
  }
  if (version < 0) {
    rc = msg_set(s, IDEM_CORRUPT, "%s: schema version %lld", s->shown, version);
    goto fail;
  }
  for (i = (int)version; i < SCHEMA_VERSION; i++) {
    /* several statements: the simple protocol (fixed text, no data) */
    r = PQexec(c->db, migrations[i]);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
      rc = msg_pq(s, c->db, r, "creating the schema");
      goto fail;
    }
    PQclear(r);
    r = NULL;
  }
  if (version < SCHEMA_VERSION) {
    snprintf(sql, sizeof sql,
             "INSERT INTO idem_meta VALUES ('schema_version', '%d')"
             " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
             SCHEMA_VERSION);
    if ((rc = exec_fixed(s, c, sql, "writing the schema version", NULL, NULL)))
      goto fail;
  }
  return exec_fixed(s, c, "COMMIT", "committing the schema", NULL, NULL);
fail:
  PQclear(r);
  PQclear(PQexecParams(c->db, "ROLLBACK", 0, NULL, NULL, NULL, NULL, 0));
  return rc;
}

/* ---- opening --------------------------------------------------------------- */

static void pg_destroy(pg_store *s) {
  conn *c;
  while ((c = s->free_conns) != NULL) {
    s->free_conns = c->next;
    conn_free(c);
  }
  if (s->locks_ready) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->clock_mu);
  }
  if (s->conninfo) {
    memset(s->conninfo, 0, strlen(s->conninfo));
    idem__free(s->conninfo);
  }
  if (s->password) {
    memset(s->password, 0, strlen(s->password));
    idem__free(s->password);
  }
  idem__free(s->shown);
  s->magic = IDEM__MAGIC_DEAD;
  idem__free(s);
}

static unsigned long long random_base(void) {
  unsigned long long v = 0;
  struct timespec t;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (read(fd, &v, sizeof v) != (ssize_t)sizeof v) v = 0;
    close(fd);
  }
  clock_gettime(CLOCK_REALTIME, &t);
  return v ^ ((unsigned long long)t.tv_nsec << 20) ^
         (unsigned long long)t.tv_sec ^ ((unsigned long long)getpid() << 40);
}

static int pg_password_given(const char *url) {
  PQconninfoOption *opts, *o;
  char *err = NULL;
  int given = 0;
  if (idem__dl_need(&libpq) != NULL) return -1;
  if (!(opts = PQconninfoParse(url, &err))) {
    if (err) PQfreemem(err);
    return -1;
  }
  for (o = opts; o->keyword; o++)
    if (strcmp(o->keyword, "password") == 0 && o->val && *o->val) given = 1;
  PQconninfoFree(opts);
  return given;
}

/*
** A PostgreSQL URI's query string may name its password in a spelling the
** words above do not see: libpq decodes percent-escapes in keys, so
** ?%70assword=SECRET is a password.  libpq's own parse says whether the
** string gives one; when it does, the query string is not shown at all
** (nor when libpq cannot tell and the query has escapes).
*/
static int hidden_password(const char *url) {
  const char *q = strchr(url, '?');
  int given;
  if (!q || (strncmp(url, "postgres://", 11) && strncmp(url, "postgresql://", 13)))
    return 0;
  given = pg_password_given(url);
  return given == 1 || (given < 0 && strchr(q, '%'));
}

void idem__pg_shown(const char *url, char *buf, size_t size) {
  idem__store_shown_url(url, buf, size);
  if (hidden_password(url)) {
    char *q = strchr(buf, '?');
    if (q && (size_t)(q - buf) + 5 <= size) memcpy(q, "?***", 5);
  }
}

int idem__pg_open(const char *url, idem__store **out) {
  char shown[300], *err = NULL;
  const char *missing;
  PQconninfoOption *opts, *o;
  pg_store *s;
  conn *c = NULL;
  int rc, retry;
  long wait = 50;
  long long deadline;
  if (!out) return IDEM_MISUSE;
  *out = NULL;
  idem__pg_shown(url, shown, sizeof shown);
  if ((missing = idem__dl_need(&libpq)) != NULL)
    return idem__store_fail(out, IDEM_STORE, "attempt log \"%.200s\" needs %s",
                            shown, missing);
  /* libpq's own parse: bad strings fail here, and the password is known */
  if (!(opts = PQconninfoParse(url, &err))) {
    rc = idem__store_fail(out, IDEM_INVALID,
                          "attempt log \"%.200s\": not a PostgreSQL connection "
                          "string",
                          shown);
    PQfreemem(err);
    return rc;
  }
  if (!(s = idem__malloc(sizeof *s))) {
    PQconninfoFree(opts);
    return idem__store_fail(out, IDEM_NOMEM, "%s: out of memory", shown);
  }
  memset(s, 0, sizeof *s);
  s->base.vt = &pg_vt;
  s->magic = PG_MAGIC;
  s->pid = getpid();
  s->nonce_base = random_base();
  s->max_conns = MAX_CONNS;
  atomic_init(&s->nonce_next, 0);
  s->connect_ms = CONNECT_MS;
  for (o = opts; o->keyword; o++) {
    if (strcmp(o->keyword, "password") == 0 && o->val && *o->val)
      s->password = idem__strdup(o->val);
    if (strcmp(o->keyword, "connect_timeout") == 0 && o->val && *o->val) {
      long long t = strtoll(o->val, NULL, 10);
      s->connect_ms = t <= 0 ? LLONG_MAX / 4 : t < 2 ? 2000 : t * 1000;
    }
  }
  PQconninfoFree(opts);
  s->conninfo = idem__strdup(url);
  s->shown = idem__strdup(shown);
  if (!s->conninfo || !s->shown || pthread_mutex_init(&s->mu, NULL)) {
    pg_destroy(s);
    return idem__store_fail(out, IDEM_NOMEM, "%s: out of memory", shown);
  }
  if (pthread_cond_init(&s->cv, NULL)) {
    pthread_mutex_destroy(&s->mu);
    pg_destroy(s);
    return idem__store_fail(out, IDEM_NOMEM, "%s: out of memory", shown);
  }
  if (pthread_mutex_init(&s->clock_mu, NULL)) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pg_destroy(s);
    return idem__store_fail(out, IDEM_NOMEM, "%s: out of memory", shown);
  }
  s->locks_ready = 1;
  /* The first connection, and the schema; a server that is starting is
  ** waited for as a lost connection is. */
  deadline = idem__mono_ms() + RETRY_MS;
  for (;;) {
    int again = 0;
    rc = conn_open(s, &c, &retry, 0);
    if (rc == IDEM_OK && (rc = setup(s, c)) == IDEM_OK)
      rc = conn_prepare(s, c, &again);
    if (c) {
      retry = rc != IDEM_OK && (again || PQstatus(c->db) != CONNECTION_OK)
                  ? 2
                  : 0;
    }
    /* (a server that is not there at all fails at once: a typo in the
    ** URL should not make the user wait) */
    if (rc == IDEM_OK || retry != 2 || idem__mono_ms() + wait > deadline) break;
    conn_free(c);
    c = NULL;
    idem__sleep_ms(wait);
    wait = wait * 2 > 1000 ? 1000 : wait * 2;
  }
  if (rc != IDEM_OK) {
    char msg[MSG_MAX];
    snprintf(msg, sizeof msg, "%s", tls_msg);
    conn_free(c);
    pg_destroy(s);
    return idem__store_fail(out, rc, "%s", msg);
  }
  s->free_conns = c;
  s->nconns = 1;
  msg_clear(s);
  *out = &s->base;
  return IDEM_OK;
}

/* ---- the requests ---------------------------------------------------------- */

static int pg_now(idem__store *st, long long *ms);

typedef struct now_req {
  long long ms;
} now_req;

static int now_fn(pg_store *s, conn *c, void *arg, int *again) {
  now_req *q = arg;
  PGresult *r = PQexecPrepared(c->db, stmt_name[S_NOW], 0, NULL, NULL, NULL, 0);
  int rc = IDEM_OK;
  if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
    q->ms = col_ll(r, 0, 0);
  else
    rc = res_fail(s, c, r, "reading the server's clock", again);
  PQclear(r);
  return rc;
}

static int pg_now(idem__store *st, long long *ms) {
  now_req q = {0};
  long long t0, t1;
  int rc;
  CHECK_STORE(s, st);
  if (!ms) return IDEM_MISUSE;
  t0 = idem__mono_ms();
  pthread_mutex_lock(&s->clock_mu);
  if (s->mono_at && t0 - s->mono_at < CLOCK_MS) {
    *ms = s->server_ms + (t0 - s->mono_at);
    pthread_mutex_unlock(&s->clock_mu);
    return IDEM_OK;
  }
  pthread_mutex_unlock(&s->clock_mu);
  rc = run(s, now_fn, &q);
  *ms = q.ms;
  if (rc != IDEM_OK) return rc;
  t1 = idem__mono_ms();
  pthread_mutex_lock(&s->clock_mu);
  /* the reading was taken somewhere in [t0, t1]: credit it to the middle */
  s->server_ms = q.ms;
  s->mono_at = t0 + (t1 - t0) / 2;
  pthread_mutex_unlock(&s->clock_mu);
  return IDEM_OK;
}

/* begin and insert */
typedef struct begin_req {
  const idem_record *rec;
  int insert; /* insert as it is */
  long long window, coalesce;
  unsigned long long nonce;
  int what;
  idem_record *out;
} begin_req;

static int begin_fn(pg_store *s, conn *c, void *arg, int *again) {
  begin_req *q = arg;
  const idem_record *rec = q->rec;
  params p, lock;
  pq_req v[4];
  PGresult *res[4];
  int n = 0, i, main_i, rc = IDEM_OK, races;
  rec_params(&p, rec, q->insert ? rec->state : IDEM_STATE_PENDING,
             q->insert ? rec->token : 1, q->insert ? rec->updated : 0,
             q->insert ? 0 : q->window, q->insert ? 0 : q->coalesce, q->nonce);
  memset(&lock, 0, sizeof lock);
  p_str(&lock, 1, rec->fence_key);
  v[n++] = (pq_req){S_BEGIN_TX, NULL};
  if (!q->insert && rec->fence_key) v[n++] = (pq_req){S_LOCK, &lock};
  main_i = n;
  v[n++] = (pq_req){q->insert ? S_INSERT : S_BEGIN, &p};
  v[n++] = (pq_req){S_COMMIT, NULL};
  for (races = 0;; races++) {
    if (pipeline(c, v, n, res) < 0) {
      *again = 1;
      return msg_pq(s, c->db, NULL, "beginning a record");
    }
    for (i = 0; i < n; i++) {
      ExecStatusType t = res[i] ? PQresultStatus(res[i]) : PGRES_FATAL_ERROR;
      if (t != PGRES_COMMAND_OK && t != PGRES_TUPLES_OK) {
        rc = res_fail(s, c, res[i],
                      q->insert ? "inserting a record" : "beginning a record",
                      again);
        break;
      }
    }
    if (rc == IDEM_OK && PQntuples(res[main_i]) > 0) {
      PGresult *r = res[main_i];
      int what = (int)col_ll(r, 0, 0);
      q->what = what == 1   ? IDEM__BEGIN_INSERTED
                : what == 2 ? IDEM__BEGIN_FOUND
                            : IDEM__BEGIN_FENCED;
      if (q->what != IDEM__BEGIN_INSERTED && !(q->out = row_record(r, 0, 1)))
        rc = msg_set(s, IDEM_NOMEM, "%s: out of memory", s->shown);
    } else if (rc == IDEM_OK && races >= MAX_RACES) {
      rc = msg_set(s, IDEM_BUSY,
                   "%s: (%.80s, %.80s) keeps changing under "
                   "begin",
                   s->shown, rec->session, rec->call_id);
    }
    for (i = 0; i < n; i++) PQclear(res[i]);
    if (rc != IDEM_OK || q->what) return rc;
    /* lost a race on the primary key to a begin that committed after our
    ** snapshot: run again, and find it */
  }
}

static int check_record(pg_store *s, const idem_record *rec) {
  const char *missing = idem__record_missing(rec);
  if (missing)
    return msg_set(s, IDEM_INVALID, "%s: a record without %s", s->shown,
                   missing);
  return IDEM_OK;
}

static int do_begin(pg_store *s, const idem_record *rec, int insert,
                    long long window, long long coalesce, int *what,
                    idem_record **found) {
  begin_req q;
  int rc;
  if (found) *found = NULL;
  if (!what) return IDEM_MISUSE;
  *what = 0;
  if ((rc = check_record(s, rec)) != IDEM_OK) return rc;
  if (insert &&
      (rec->state < IDEM_STATE_PENDING || rec->state > IDEM_STATE_DEDUPLICATED))
    return msg_set(s, IDEM_INVALID, "%s: a record in state %d", s->shown,
                   rec->state);
  memset(&q, 0, sizeof q);
  q.rec = rec;
  q.insert = insert;
  q.window = window > 0 ? window : 0;
  q.coalesce = coalesce > 0 ? coalesce : 0;
  q.nonce = next_nonce(s);
  rc = run(s, begin_fn, &q);
  if (rc == IDEM_OK) *what = q.what;
  if (found && rc == IDEM_OK)
    *found = q.out;
  else
    idem_record_free(q.out);
  return rc;
}

static int pg_begin(idem__store *st, const idem_record *rec,
                    long long repeat_window_ms, long long coalesce_ms,
                    int *what, idem_record **found) {
  CHECK_STORE(s, st);
  return do_begin(s, rec, 0, repeat_window_ms, coalesce_ms, what, found);
}

static int pg_insert(idem__store *st, const idem_record *rec, int *what,
                     idem_record **found) {
  CHECK_STORE(s, st);
  return do_begin(s, rec, 1, 0, 0, what, found);
}

/* get */
typedef struct get_req {
  const char *session, *call_id;
  idem_record *out;
  unsigned long long nonce; /* of the row found */
} get_req;

static int get_fn(pg_store *s, conn *c, void *arg, int *again) {
  get_req *q = arg;
  params p;
  PGresult *r;
  int rc = IDEM_OK;
  memset(&p, 0, sizeof p);
  p_str(&p, 1, q->session);
  p_str(&p, 2, q->call_id);
  r = PQexecPrepared(c->db, stmt_name[S_GET], p.n, p.v, NULL, NULL, 0);
  if (PQresultStatus(r) != PGRES_TUPLES_OK)
    rc = res_fail(s, c, r, "reading a record", again);
  else if (PQntuples(r) == 0)
    rc = msg_set(s, IDEM_NOTFOUND, "%s: no record of (%.80s, %.80s)", s->shown,
                 q->session, q->call_id);
  else if (!(q->out = row_record(r, 0, 1)))
    rc = msg_set(s, IDEM_NOMEM, "%s: out of memory", s->shown);
  else
    q->nonce = (unsigned long long)col_ll(r, 0, 0);
  PQclear(r);
  return rc;
}

typedef struct fence_req {
  const idem_record *rec;
  long long window, coalesce;
  int turn_only;
  idem_record *out;
} fence_req;

static int fence_fn(pg_store *s, conn *c, void *arg, int *again) {
  fence_req *q = arg;
  params p;
  PGresult *r;
  int rc = IDEM_OK;
  memset(&p, 0, sizeof p);
  p_str(&p, 1, q->rec->fence_key);
  p_str(&p, 2, q->rec->session);
  p_str(&p, 3, q->rec->call_id);
  p_int(&p, 4, q->rec->created);
  p_int(&p, 5, q->window);
  p_str(&p, 6, q->rec->turn);
  p_int(&p, 7, q->coalesce);
  p_int(&p, 8, q->turn_only);
  r = PQexecPrepared(c->db, stmt_name[S_FENCE], p.n, p.v, NULL, NULL, 0);
  if (PQresultStatus(r) != PGRES_TUPLES_OK)
    rc = res_fail(s, c, r, "checking the fence", again);
  else if (PQntuples(r) == 0)
    rc = msg_set(s, IDEM_NOTFOUND, "%s: nothing fences (%.80s, %.80s)",
                 s->shown, q->rec->session, q->rec->call_id);
  else if (!(q->out = row_record(r, 0, 1)))
    rc = msg_set(s, IDEM_NOMEM, "%s: out of memory", s->shown);
  PQclear(r);
  return rc;
}

static int pg_fence(idem__store *st, const idem_record *rec, long long window,
                    long long coalesce, int turn_only, idem_record **out) {
  fence_req q;
  int rc;
  CHECK_STORE(s, st);
  if (!out || !rec) return IDEM_MISUSE;
  *out = NULL;
  if (!rec->fence_key)
    return msg_set(s, IDEM_NOTFOUND, "%s: no fence", s->shown);
  memset(&q, 0, sizeof q);
  q.rec = rec;
  q.window = window;
  q.coalesce = coalesce > 0 ? coalesce : 0;
  q.turn_only = turn_only;
  rc = run(s, fence_fn, &q);
  *out = q.out;
  return rc;
}

static int pg_get(idem__store *st, const char *session, const char *call_id,
                  idem_record **out) {
  get_req q;
  int rc;
  CHECK_STORE(s, st);
  if (!out) return IDEM_MISUSE;
  *out = NULL;
  if (!session || !call_id)
    return msg_set(s, IDEM_INVALID, "%s: get without session or call id",
                   s->shown);
  memset(&q, 0, sizeof q);
  q.session = session;
  q.call_id = call_id;
  rc = run(s, get_fn, &q);
  *out = q.out;
  return rc;
}

/* change */
static void change_params(params *p, const idem__change *ch,
                          unsigned long long nonce) {
  memset(p, 0, sizeof *p);
  p_str(p, 1, ch->session);
  p_str(p, 2, ch->call_id);
  p_int(p, 3, (long long)ch->from);
  p_int(p, 4, ch->expect_token < 0 ? -1 : ch->expect_token);
  p_int(p, 5, ch->state);
  p_int(p, 6, ch->attempts_add);
  p_int(p, 7, ch->take_lease);
  p_str(p, 8, ch->owner);
  p_int(p, 9, ch->lease_until);
  p_str(p, 10, ch->result);
  p_str(p, 11, ch->error);
  p_int(p, 12, ch->resolution);
  p_int(p, 13, ch->delivered < 0 ? -1 : ch->delivered);
  p_int(p, 14, (long long)nonce);
  p_int(p, 15, ch->exec_set);
  p_str(p, 16, ch->executor);
  p_int(p, 17, ch->pgid);
  p_int(p, 18, ch->settle_from);
  p_int(p, 19, ch->settle_cap);
  p_str(p, 20, ch->duplicate_of);
  p_str(p, 21, ch->expect_owner);
  p_str(p, 22, ch->resolved_by);
  p_int(p, 23, ch->expires);
  p_str(p, 24, ch->check_with);
  p_str(p, 25, idem__check_name(ch->check));
}

/* The change did not apply: why, with the record as it is now - or it did,
** on an earlier try (the row holds our nonce). */
static int change_why(pg_store *s, conn *c, const idem__change *ch,
                      unsigned long long nonce, idem_record **now, int *again) {
  get_req g;
  int rc;
  memset(&g, 0, sizeof g);
  g.session = ch->session;
  g.call_id = ch->call_id;
  rc = get_fn(s, c, &g, again);
  if (rc == IDEM_OK) {
    if (g.nonce == nonce) {
      msg_clear(s);
    } else {
      rc = msg_set(s, IDEM_STALE,
                   "%s: the record of (%.80s, %.80s) is %s with token %lld; "
                   "the change expected another state or token",
                   s->shown, ch->session, ch->call_id,
                   idem_state_name(g.out->state), g.out->token);
    }
    *now = g.out;
  }
  return rc;
}

typedef struct change_req {
  const idem__change *ch;
  unsigned long long nonce;
  idem_record *out;
} change_req;

static int change_fn(pg_store *s, conn *c, void *arg, int *again) {
  change_req *q = arg;
  params p;
  pq_req v[4];
  PGresult *res[4];
  int n = 0, i, main_i, rc = IDEM_OK, applied = 0;
  change_params(&p, q->ch, q->nonce);
  if (!q->ch->durable) {
    v[n++] = (pq_req){S_BEGIN_TX, NULL};
    v[n++] = (pq_req){S_ASYNC, NULL};
  }
  main_i = n;
  v[n++] = (pq_req){S_CHANGE, &p};
  if (!q->ch->durable) v[n++] = (pq_req){S_COMMIT, NULL};
  if (pipeline(c, v, n, res) < 0) {
    *again = 1;
    return msg_pq(s, c->db, NULL, "changing a record");
  }
  for (i = 0; i < n; i++) {
    ExecStatusType t = res[i] ? PQresultStatus(res[i]) : PGRES_FATAL_ERROR;
    if (t != PGRES_COMMAND_OK && t != PGRES_TUPLES_OK) {
      rc = res_fail(s, c, res[i], "changing a record", again);
      break;
    }
  }
  if (rc == IDEM_OK && PQntuples(res[main_i]) > 0) {
    applied = 1;
    if (!(q->out = row_record(res[main_i], 0, 1)))
      rc = msg_set(s, IDEM_NOMEM, "%s: out of memory", s->shown);
  }
  for (i = 0; i < n; i++) PQclear(res[i]);
  if (rc != IDEM_OK || applied) return rc;
  return change_why(s, c, q->ch, q->nonce, &q->out, again);
}

static int check_change(pg_store *s, const idem__change *ch) {
  if (!ch || !ch->session || !ch->call_id)
    return msg_set(s, IDEM_INVALID, "%s: a change without its action",
                   s->shown);
  if (!idem__change_in_range(ch))
    return msg_set(s, IDEM_INVALID, "%s: a change to state %d, resolution %d",
                   s->shown, ch->state, ch->resolution);
  return IDEM_OK;
}

static int pg_change(idem__store *st, const idem__change *ch,
                     idem_record **now) {
  change_req q;
  int rc;
  CHECK_STORE(s, st);
  if (now) *now = NULL;
  if ((rc = check_change(s, ch)) != IDEM_OK) return rc;
  memset(&q, 0, sizeof q);
  q.ch = ch;
  q.nonce = next_nonce(s);
  rc = run(s, change_fn, &q);
  if (now && (rc == IDEM_OK || rc == IDEM_STALE))
    *now = q.out;
  else
    idem_record_free(q.out);
  return rc;
}

/*
** change_many: up to PIPE_MAX changes per transaction, in one pipeline.
** A change that matched nothing is settled afterwards one by one (why it
** did not apply).  When the batch fails for another reason than the
** connection, each of its changes runs alone, so one bad change fails
** alone.
*/
typedef struct many_req {
  const idem__change *chs;
  const unsigned long long *nonces;
  size_t n;
  int *rcs;
  int hard; /* a change failed on its own: not the connection */
} many_req;

static int many_fn(pg_store *s, conn *c, void *arg, int *again) {
  many_req *q = arg;
  params *ps;
  pq_req *v;
  PGresult **res;
  size_t i, n = q->n;
  int rc = IDEM_OK, k;
  ps = idem__malloc(n * sizeof *ps);
  v = idem__malloc((n + 3) * sizeof *v);
  res = idem__malloc((n + 3) * sizeof *res);
  if (!ps || !v || !res) {
    idem__free(ps);
    idem__free(v);
    idem__free(res);
    return msg_set(s, IDEM_NOMEM, "%s: out of memory", s->shown);
  }
  v[0] = (pq_req){S_BEGIN_TX, NULL};
  v[1] = (pq_req){S_ASYNC, NULL};
  for (i = 0; i < n; i++) {
    change_params(&ps[i], &q->chs[i], q->nonces[i]);
    v[i + 2] = (pq_req){S_CHANGE, &ps[i]};
  }
  v[n + 2] = (pq_req){S_COMMIT, NULL};
  for (i = 0; i < n; i++) q->rcs[i] = -1; /* unknown yet */
  if (pipeline(c, v, (int)n + 3, res) < 0) {
    *again = 1;
    rc = msg_pq(s, c->db, NULL, "changing records");
  } else {
    for (k = 0; k < (int)n + 3; k++) {
      ExecStatusType t = res[k] ? PQresultStatus(res[k]) : PGRES_FATAL_ERROR;
      if (t != PGRES_COMMAND_OK && t != PGRES_TUPLES_OK) {
        rc = res_fail(s, c, res[k], "changing records", again);
        q->hard = !*again;
        break;
      }
    }
    if (rc == IDEM_OK)
      for (i = 0; i < n; i++)
        if (PQntuples(res[i + 2]) > 0) q->rcs[i] = IDEM_OK;
    for (k = 0; k < (int)n + 3; k++) PQclear(res[k]);
  }
  idem__free(ps);
  idem__free(v);
  idem__free(res);
  if (rc != IDEM_OK) return rc;
  /* the ones that matched nothing: say why (or find them applied) */
  for (i = 0; i < n; i++) {
    idem_record *now = NULL;
    int why;
    if (q->rcs[i] == IDEM_OK) continue;
    why = change_why(s, c, &q->chs[i], q->nonces[i], &now, again);
    idem_record_free(now);
    if (why != IDEM_OK && why != IDEM_STALE && why != IDEM_NOTFOUND) {
      q->rcs[i] = -1;
      return why;
    }
    q->rcs[i] = why;
  }
  return IDEM_OK;
}

static int pg_change_many(idem__store *st, const idem__change *chs, size_t n,
                          int *rcs) {
  unsigned long long *nonces;
  int *tmp, rc = IDEM_OK, first = IDEM_OK, alone = 0;
  char first_msg[MSG_MAX] = "";
  size_t i, at, m;
  many_req q;
  CHECK_STORE(s, st);
  if (n && !chs) return IDEM_MISUSE;
  if (n == 0) return IDEM_OK;
  /* a bad change fails alone: then every change runs on its own */
  for (i = 0; i < n; i++)
    if (!chs[i].session || !chs[i].call_id || !idem__change_in_range(&chs[i]))
      alone = 1;
  if (n > SIZE_MAX / sizeof *nonces ||
      !(nonces = idem__malloc(n * sizeof *nonces)))
    return msg_set(s, IDEM_NOMEM, "%s: out of memory", s->shown);
  if (!(tmp = idem__malloc(n * sizeof *tmp))) {
    idem__free(nonces);
    return msg_set(s, IDEM_NOMEM, "%s: out of memory", s->shown);
  }
  for (i = 0; i < n; i++) nonces[i] = next_nonce(s);
  for (at = 0; at < n; at += m) {
    m = n - at < PIPE_MAX ? n - at : PIPE_MAX;
    q.chs = chs + at;
    q.nonces = nonces + at;
    q.n = m;
    q.rcs = tmp + at;
    q.hard = 0;
    rc = alone ? IDEM_INVALID : run(s, many_fn, &q);
    if (rc != IDEM_OK && (alone || q.hard)) {
      /* not the connection: one at a time, so a bad change fails alone */
      for (i = 0; i < m; i++) {
        change_req one;
        memset(&one, 0, sizeof one);
        one.ch = &chs[at + i];
        one.nonce = nonces[at + i];
        tmp[at + i] = check_change(s, one.ch);
        if (tmp[at + i] == IDEM_OK) tmp[at + i] = run(s, change_fn, &one);
        idem_record_free(one.out);
        if (tmp[at + i] != IDEM_OK && tmp[at + i] != IDEM_STALE &&
            first == IDEM_OK) {
          first = tmp[at + i];
          snprintf(first_msg, sizeof first_msg, "%s", tls_msg);
        }
      }
    } else if (rc != IDEM_OK) {
      for (i = 0; i < m; i++)
        if (tmp[at + i] == -1) tmp[at + i] = rc;
      if (first == IDEM_OK) {
        first = rc;
        snprintf(first_msg, sizeof first_msg, "%s", tls_msg);
      }
    }
  }
  /* the first failure other than IDEM_STALE (idemInt.h) */
  for (i = 0; i < n && first == IDEM_OK; i++)
    if (tmp[i] != IDEM_OK && tmp[i] != IDEM_STALE) {
      first = tmp[i];
      snprintf(first_msg, sizeof first_msg, "%s: %s (%.80s, %.80s)", s->shown,
               first == IDEM_NOTFOUND ? "no record of" : "could not change",
               chs[i].session, chs[i].call_id);
    }
  if (rcs) memcpy(rcs, tmp, n * sizeof *tmp);
  idem__free(tmp);
  idem__free(nonces);
  if (first != IDEM_OK) return msg_set(s, first, "%s", first_msg);
  msg_clear(s);
  return IDEM_OK;
}

/* list */
typedef struct list_req {
  const idem__filter *f;
  unsigned mask;
  idem__record_cb cb;
  void *ctx;
  int stopped;
  size_t given; /* records handed to the callback */
} list_req;

static int list_fn(pg_store *s, conn *c, void *arg, int *again) {
  list_req *q = arg;
  char sql[1200], name[40];
  unsigned shape = idem__filter_shape(q->f);
  idem__list_params p;
  int i, rc = IDEM_OK, row, cached = 0;
  PGresult *r;
  idem_record *rec;
  for (i = 0; i < c->nlisted && !cached; i++) cached = c->listed[i] == shape;
  /* past LIST_SLOTS shapes: the unnamed statement, for this call */
  if (cached || c->nlisted < LIST_SLOTS)
    snprintf(name, sizeof name, "idem_list_%u", shape);
  else
    name[0] = '\0';
  if (!cached) {
    if (idem__list_sql(sql, sizeof sql, shape, COLS, "idem_attempts", '$',
                       "::text", "::bigint"))
      return msg_set(s, IDEM_RANGE, "%s: a listing too long to build",
                     s->shown);
    r = PQprepare(c->db, name, sql, 0, NULL);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
      rc = res_fail(s, c, r, "preparing a listing", again);
      PQclear(r);
      return rc;
    }
    PQclear(r);
    if (name[0]) c->listed[c->nlisted++] = shape;
  }
  idem__list_params_of(q->f, &p);
  if (!PQsendQueryPrepared(c->db, name, p.n, p.v, NULL, NULL, 0)) {
    *again = 1;
    return msg_pq(s, c->db, NULL, "listing records");
  }
  PQsetSingleRowMode(c->db);
  /* rows one at a time; once the callback stops, drain the rest */
  while ((r = PQgetResult(c->db)) != NULL) {
    ExecStatusType t = PQresultStatus(r);
    if (t == PGRES_SINGLE_TUPLE && rc == IDEM_OK && !q->stopped) {
      for (row = 0; row < PQntuples(r) && !q->stopped; row++) {
        if (!(rec = row_record(r, row, 0))) {
          rc = msg_set(s, IDEM_NOMEM, "%s: out of memory", s->shown);
          break;
        }
        q->given++;
        q->stopped = q->cb(rec, q->ctx) != 0;
        idem_record_free(rec);
      }
    } else if (t != PGRES_SINGLE_TUPLE && t != PGRES_TUPLES_OK &&
               rc == IDEM_OK) {
      rc = res_fail(s, c, r, "listing records", again);
      /* records given to the callback must not be given twice */
      if (q->given) *again = 0;
    }
    PQclear(r);
  }
  return rc;
}

static int pg_list(idem__store *st, const idem__filter *f, idem__record_cb cb,
                   void *ctx) {
  idem__filter all;
  list_req q;
  CHECK_STORE(s, st);
  if (!cb) return IDEM_MISUSE;
  memset(&all, 0, sizeof all);
  if (!f) f = &all;
  memset(&q, 0, sizeof q);
  q.f = f;
  q.mask = f->states & 0x7eu; /* bits 1 .. 6 */
  q.cb = cb;
  q.ctx = ctx;
  if (f->states && !q.mask) return IDEM_OK;
  return run(s, list_fn, &q);
}

/* gc */
typedef struct gc_req {
  long long now;
  size_t n;
} gc_req;

static int gc_fn(pg_store *s, conn *c, void *arg, int *again) {
  gc_req *q = arg;
  params p;
  PGresult *r;
  int rc = IDEM_OK;
  memset(&p, 0, sizeof p);
  p_int(&p, 1, q->now);
  r = PQexecPrepared(c->db, stmt_name[S_GC], p.n, p.v, NULL, NULL, 0);
  if (PQresultStatus(r) == PGRES_COMMAND_OK)
    q->n += (size_t)strtoull(PQcmdTuples(r), NULL, 10);
  else
    rc = res_fail(s, c, r, "deleting expired records", again);
  PQclear(r);
  return rc;
}

static int pg_gc(idem__store *st, long long now, size_t *n) {
  gc_req q;
  int rc;
  CHECK_STORE(s, st);
  if (n) *n = 0;
  q.now = now;
  q.n = 0;
  rc = run(s, gc_fn, &q); /* deleting again deletes nothing more */
  if (n) *n = q.n;
  return rc;
}

/* stats */
static int stats_fn(pg_store *s, conn *c, void *arg, int *again) {
  long long *counts = arg;
  PGresult *r =
      PQexecPrepared(c->db, stmt_name[S_STATS], 0, NULL, NULL, NULL, 0);
  int rc = IDEM_OK, i, state;
  memset(counts, 0, 8 * sizeof *counts);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) {
    rc = res_fail(s, c, r, "counting records", again);
  } else {
    for (i = 0; i < PQntuples(r); i++) {
      state = (int)col_ll(r, i, 0);
      if (state >= 1 && state <= 7) counts[state] = col_ll(r, i, 1);
      counts[0] += col_ll(r, i, 1);
    }
  }
  PQclear(r);
  return rc;
}

static int pg_stats(idem__store *st, long long counts[8]) {
  CHECK_STORE(s, st);
  if (!counts) return IDEM_MISUSE;
  return run(s, stats_fn, counts);
}

/* tally */
typedef struct tally_req {
  idem_tally_fn cb;
  void *ctx;
} tally_req;

static int tally_fn(pg_store *s, conn *c, void *arg, int *again) {
  tally_req *q = arg;
  PGresult *r =
      PQexecPrepared(c->db, stmt_name[S_TALLY], 0, NULL, NULL, NULL, 0);
  idem_tally t;
  int rc = IDEM_OK, i;
  if (PQresultStatus(r) != PGRES_TUPLES_OK) {
    rc = res_fail(s, c, r, "counting records", again);
  } else {
    for (i = 0; i < PQntuples(r); i++) {
      memset(&t, 0, sizeof t);
      t.size = sizeof t;
      t.tool = PQgetvalue(r, i, 0);
      t.state = (int)col_ll(r, i, 1);
      t.resolution = (int)col_ll(r, i, 2);
      t.records = col_ll(r, i, 3);
      t.attempts = col_ll(r, i, 4);
      t.checks = col_ll(r, i, 5);
      t.oldest = col_ll(r, i, 6);
      if (q->cb(q->ctx, &t)) break;
    }
  }
  PQclear(r);
  return rc;
}

static int pg_tally(idem__store *st, idem_tally_fn cb, void *ctx) {
  tally_req q;
  CHECK_STORE(s, st);
  if (!cb) return IDEM_MISUSE;
  q.cb = cb;
  q.ctx = ctx;
  return run(s, tally_fn, &q);
}

static const char *pg_errmsg(idem__store *st) {
  return st && tls_store == (const void *)st ? tls_msg : "";
}

static void pg_close(idem__store *st) {
  pg_store *s = (pg_store *)st;
  if (!st || st->vt != &pg_vt || s->magic != PG_MAGIC) return;
  if (s->pid != getpid()) return; /* a forked child: abandon */
  pg_destroy(s);
}

static const idem__store_vt pg_vt = {
    .scheme = "postgres",
    .now = pg_now,
    .begin = pg_begin,
    .insert = pg_insert,
    .get = pg_get,
    .fence = pg_fence,
    .change = pg_change,
    .change_many = pg_change_many,
    .list = pg_list,
    .gc = pg_gc,
    .stats = pg_stats,
    .tally = pg_tally,
    .errmsg = pg_errmsg,
    .close = pg_close,
};
