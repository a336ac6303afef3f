/*
** sqlite.c - the embedded attempt log: one SQLite file in WAL mode, one
** writer at a time, group commit.
**
** THE FILE
**
** The log is an ordinary SQLite database (default
** $XDG_STATE_HOME/idem/attempts.db).  When it does not exist it is created
** here with open(O_CREAT|O_EXCL, 0600) - and missing parent directories with
** mode 0700 - then synced with its directory, before SQLite opens it, so
** the records are never readable by other users; SQLite gives the -wal and
** -shm files the same mode.  An existing log is used with its mode, less
** what it grants other users: when this process owns the file, the "other"
** bits of it, then of its -wal and -shm, are taken away before SQLite opens
** it (the records hold tool arguments, and the -wal and -shm SQLite makes
** take the log's mode).  The group's bits stay: a log shared by a group is
** a setup, not a mistake.  A log of another owner is used as it is: its
** mode is its owner's choice.  So is a log, -wal or -shm that is a
** symbolic link: the fix-up never follows one (close_file_to_others).  It is marked as ours by PRAGMA application_id
** = 0x6964656d ("idem") and versioned by PRAGMA user_version:
**
**   user_version 0, no objects        a new file: migrate to the latest
**   user_version 0, some objects      another application's file: CORRUPT
**   application_id neither 0 nor ours another application's file: CORRUPT
**   1 .. SCHEMA_VERSION, ours         migrate forward if older
**   > SCHEMA_VERSION                  a newer idem wrote it: CORRUPT
**
** The checks run once read-only (so a foreign file is never touched, not
** even switched to WAL), then again inside the BEGIN IMMEDIATE transaction
** that applies the missing entries of migrations[] and writes the new
** user_version, so two processes opening a new file at once migrate it
** once.  A newer schema is one more entry in migrations[].  Version 1:
**
**   attempts(session, call_id, tool, fingerprint, key, args, fence_key,
**            cls, state, attempts, owner, lease_until, token, result,
**            error, created, updated, expires, resolution, delivered,
**            duplicate_of)          PRIMARY KEY (session, call_id)
**                                   WITHOUT ROWID
**   attempts_fence  (fence_key, created) WHERE fence_key IS NOT NULL
**   attempts_live   (state, created) WHERE state IN (1, 5)
**   (gc scans the table: it is rare, and an index on expires would cost
**   every insert a page)
**
** Version 2 adds executor TEXT, pgid INTEGER, settle_from INTEGER: the
** attempt that may still be running (SPEC §6a; a pending or in-doubt
** record of version 1 gets its owner as executor and its updated time as
** settle_from).  Version 3 adds turn TEXT: the model turn that issued the
** call (SPEC §6.4), NULL when the harness named none.  Version 4 adds
** resolved_by TEXT, resolved_at INTEGER: who gave an operator's verdict
** (SPEC §9 idem resolve) and when.  Version 5 adds check_with TEXT,
** last_check TEXT, checked_at INTEGER, checks INTEGER: what an operator
** needs to settle an action in doubt by hand - the status check the model
** was told to run, and the answer and time of the last status check and
** how many ran (0 and NULL on older records: none is known).
**
** Columns hold exactly the fields of idem_record (times in ms since the
** epoch).  expires = 0 means "keep forever": gc never deletes such a record.
** A settling change (idem__change.expires) moves expires later, never
** earlier: a record's retention counts from its last settlement.
** The fence query walks attempts_fence newest first; idem recover's scans
** of pending and in-doubt records walk attempts_live, which holds only the
** live records (so finishing a call touches one small, hot index page, not
** an index of every record).  gc and other listings by state scan the
** table.
**
** THE STATE MACHINE (SPEC §5), as the store enforces it
**
**   (none) --begin--> PENDING(token 1) --change--> SUCCEEDED | FAILED
**          --insert-> any (DEDUPLICATED)           | NOT_APPLIED | IN_DOUBT
**   IN_DOUBT, NOT_APPLIED, PENDING --change--> any state
**
** The guard decides transitions; the store applies each as one atomic
** compare-and-set (an UPDATE whose WHERE holds the state mask and the
** token).  Whatever a change's mask admits, a record in a terminal state
** (SUCCEEDED, FAILED, DEDUPLICATED) keeps its outcome: a change that would
** give it another state, take its lease, add attempts, or set its result,
** error or resolution is IDEM_STALE.  Only `delivered` (and `updated`) of a
** terminal record ever change.
**
** DURABILITY AND GROUP COMMIT
**
** Every write (begin, insert, change, gc) is a request queued on the store.
** One thread at a time holds the write connection (the `writing` flag) and
** runs everything queued, up to MAX_BATCH requests, as one batch in ONE
** transaction:
**
**   PRAGMA synchronous = FULL if the batch holds a begin or a durable
**                        change, else NORMAL   (not allowed inside a txn)
**   BEGIN IMMEDIATE                            (the write lock up front)
**   per request, in queue order: SAVEPOINT; apply; RELEASE (or ROLLBACK TO
**     when it failed: a bad request fails alone; a batch of one needs no
**     savepoint)
**   COMMIT                                     (FULL: the WAL is fsynced)
**
** and only then wakes each waiter with its own result.  Who runs a batch:
** a caller that finds the log idle runs its own request at once, in its
** own thread (a lone session pays no thread hand-over); whatever queues
** meanwhile is drained, batch after batch, by the store's writer thread.
** While one batch syncs the next one queues, so N sessions share a sync.
** If a request kills the whole transaction (an I/O error rolls it back) or
** COMMIT fails, every request of the batch fails with that error: nothing
** is reported done, let alone durable, without a commit.  SQLITE_BUSY
** (another process holds the write lock) is waited out up to the busy
** timeout (5000 ms, IDEM__SQLITE_BUSY_TIMEOUT), then the batch fails
** IDEM_BUSY.
**
** In WAL mode with synchronous=FULL a commit appends its frames and fsyncs
** the WAL before other connections can see them; with NORMAL the commit is
** visible at once and reaches the disk with the next FULL commit or
** checkpoint.  So a pending record is on disk before begin returns, and a
** later change lost in a power cut leaves the record pending or in doubt:
** reconciliation settles it, the safe direction.  A process crash (kill -9)
** loses nothing committed: the WAL is in the page cache and the next opener
** recovers it.  An fsync that fails leaves frames that no index points to;
** the batch is rolled back and reported failed.  (Should the process die
** before those frames are overwritten, WAL recovery may still find such a
** pending record; its begin was reported failed, so no downstream call was
** made, and reconciliation finds it not applied - the safe direction too.)
**
** Checkpoints never run inside a commit: automatic checkpoints are off, and
** a checkpointer thread with its own connection copies the WAL into the
** database each time CHECKPOINT_PAGES more pages have been committed (see
** checkpointer_main for how it keeps a steady stream of commits from
** starving it).  The WAL then restarts from its beginning and commits
** overwrite blocks already allocated, so fdatasync need not also write the
** file's metadata; journal_size_limit trims it back to 16 MiB after a burst.
**
** READS AND THREADS
**
** get, list and stats use a pool of read connections (opened on demand,
** at most MAX_READERS), each used by one thread at a time; connections are
** SQLITE_OPEN_NOMUTEX.  WAL readers never block the writer nor each other.
** A get made while the write connection is idle and nothing is queued uses
** that one instead (taken and given back as a batch is): every commit of
** this process leaves the readers' caches stale.
** Statements are prepared once per connection and cached.  A store has two
** threads of its own: the writer and the checkpointer.  The store changes
** nothing of the host process (no heap thresholds, no global SQLite
** configuration beyond its own VFS): the idem command settles its own heap
** (cli/main.c).
**
** ERRORS
**
** SQLite's codes map to IDEM_BUSY (BUSY, LOCKED), IDEM_CORRUPT (CORRUPT,
** NOTADB), IDEM_NOMEM, and IDEM_STORE for everything else, with a message
** naming the file, SQLite's text, the extended code and what was being
** done.  The message is per thread: errmsg(st) is the calling thread's last
** message from st, kept in thread-local storage ("" after a success), so
** threads never race on it; the thread that runs a batch composes each
** request's message and the waiting thread copies it to its own.  A store
** that failed to open is a failed store (store.c) with a fixed message.
**
** FORK
**
** A connection must never be used on both sides of a fork().  A child must
** open its own store: every entry point called on a store opened before the
** fork answers IDEM_MISUSE, and close() in the child only abandons the
** handle (closing the parent's connections could checkpoint and delete the
** WAL under the parent's feet).  Beware that SQLite keeps per-process lock
** state for each open file, which a child inherits without the locks: a
** child should open the same log only if no store of it was open in the
** parent at the fork (fork first, or exec).
**
** THE VFS, AND FAULT INJECTION
**
** Every connection opens through the "idem" VFS (store/vfs.c): the default
** one, but each connection's WAL appends of a commit reach the file in one
** write instead of two per page.  Files opened after
** idem__sqlite_config(NULL, IDEM__SQLITE_FAULT_VFS, 1) can also be made to
** fail the next N xSync (SQLITE_IOERR_FSYNC) or xWrite (SQLITE_IOERR_WRITE)
** calls, and count their syncs; tests use that to prove that a failed sync
** fails begin and reports nothing durable.  IDEM_FULL_WHILE=FILE fails
** every write with SQLITE_FULL while FILE exists: a full disk, for tests
** that run the idem command.
*/
#define _GNU_SOURCE /* O_PATH */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "cols.h"
#include "idemInt.h"

#if SQLITE_VERSION_NUMBER < 3035000
#error "the attempt log needs SQLite 3.35 or later"
#endif

#define SQ_MAGIC 0x1de35417u
#define APP_ID 0x6964656d /* "idem" */
#define DEFAULT_BUSY_MS 5000
#define MAX_BATCH 256
#define CHECKPOINT_PAGES 1000
#define MAX_READERS 64
#define MSG_MAX 400

/* ---- schema ---------------------------------------------------------------- */

/* migrations[i] takes a log from user_version i to i + 1. */
static const char *const migrations[] = {
    /* 1 */
    "CREATE TABLE attempts("
    " session TEXT NOT NULL,"
    " call_id TEXT NOT NULL,"
    " tool TEXT NOT NULL,"
    " fingerprint TEXT NOT NULL,"
    " key TEXT NOT NULL,"
    " args TEXT NOT NULL,"
    " fence_key TEXT,"
    " cls INTEGER NOT NULL,"
    " state INTEGER NOT NULL CHECK (state BETWEEN 1 AND 6),"
    " attempts INTEGER NOT NULL DEFAULT 0,"
    " owner TEXT,"
    " lease_until INTEGER NOT NULL DEFAULT 0,"
    " token INTEGER NOT NULL DEFAULT 0,"
    " result TEXT,"
    " error TEXT,"
    " created INTEGER NOT NULL,"
    " updated INTEGER NOT NULL,"
    " expires INTEGER NOT NULL DEFAULT 0,"
    " resolution INTEGER NOT NULL DEFAULT 0,"
    " delivered INTEGER NOT NULL DEFAULT 0,"
    " duplicate_of TEXT,"
    " PRIMARY KEY (session, call_id)"
    ") WITHOUT ROWID;"
    "CREATE INDEX attempts_fence ON attempts(fence_key, created)"
    " WHERE fence_key IS NOT NULL;"
    "CREATE INDEX attempts_live ON attempts(state, created)"
    " WHERE state IN (1, 5);",
    /* 2: the attempt that may still be running (SPEC §6a).  A pending or
    ** in-doubt record of version 1 may have one: its owner ran it. */
    "ALTER TABLE attempts ADD COLUMN executor TEXT;"
    "ALTER TABLE attempts ADD COLUMN pgid INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE attempts ADD COLUMN settle_from INTEGER NOT NULL DEFAULT 0;"
    "UPDATE attempts SET executor = owner, settle_from = updated"
    " WHERE state IN (1, 5);",
    /* 3: the model turn that issued the call (SPEC §6.4) */
    "ALTER TABLE attempts ADD COLUMN turn TEXT;",
    /* 4: an operator's verdict, who and when (SPEC §9) */
    ("ALTER TABLE attempts ADD COLUMN resolved_by TEXT;"
     "ALTER TABLE attempts ADD COLUMN resolved_at INTEGER NOT NULL DEFAULT 0;"),
    /* 5: the status checks of an action in doubt, for its operator */
    ("ALTER TABLE attempts ADD COLUMN check_with TEXT;"
     "ALTER TABLE attempts ADD COLUMN last_check TEXT;"
     "ALTER TABLE attempts ADD COLUMN checked_at INTEGER NOT NULL DEFAULT 0;"
     "ALTER TABLE attempts ADD COLUMN checks INTEGER NOT NULL DEFAULT 0;"),
};

#define SCHEMA_VERSION ((int)(sizeof migrations / sizeof *migrations))

/* The states a change may not move a record out of (SPEC §5), as a bit mask
** tested with ((TERMINAL_BITS >> state) & 1): an IN list of three or more
** constants is built into an ephemeral B-tree each time the statement
** runs (its own pager and page cache: an 85 KiB block allocated and freed
** per change). */
#define TERMINAL_BITS                                                          \
  ((1 << IDEM_STATE_SUCCEEDED) | (1 << IDEM_STATE_FAILED) |                    \
   (1 << IDEM_STATE_DEDUPLICATED))
#define TERMINAL_BITS_SQL "76"
_Static_assert(TERMINAL_BITS == 76, "TERMINAL_BITS_SQL is TERMINAL_BITS");
/* The states gc may delete: terminal, and not_applied (nothing pending). */
#define GC_SQL "(2, 3, 4, 6)"

/* Cached statements, by id. */
enum {
  S_BEGIN,
  S_COMMIT,
  S_SAVEPOINT,
  S_RELEASE,
  S_ROLLBACK_TO,
  S_SYNC_FULL,
  S_SYNC_NORMAL,
  S_GET,
  S_FENCE,
  S_INSERT,
  S_CHANGE,
  S_GC,
  S_STATS,
  S_TALLY,
  N_STMTS
};

static const char *const stmt_sql[N_STMTS] = {
    "BEGIN IMMEDIATE",
    "COMMIT",
    "SAVEPOINT req",
    "RELEASE req",
    "ROLLBACK TO req",
    "PRAGMA synchronous = FULL",
    "PRAGMA synchronous = NORMAL",
    "SELECT " COLS " FROM attempts WHERE session = ?1 AND call_id = ?2",
    /* The fence (idemInt.h, begin): ?4 is now - repeat window, or a time
    ** after everything when there is no window; ?5 is when the new call was
    ** made - an outcome delivered after that was not known to the model
    ** when it made the call (parallel calls of one turn).  Delivered in
    ** the same millisecond counts as known: a delivery is recorded before
    ** the answer is handed over (idem_step_delivered); one after ?9 (now,
    ** and the slack of IDEM__CLOCK_SLACK_MS) was read before the clock
    ** stepped back, and says nothing of that.  ?6 is the new call's turn
    ** (NULL: none), ?7 and ?8 when the coalescing window around it opens
    ** and closes (?7 a time after everything when there is none): a call
    ** that names no turn shares one with those that began within the
    ** window, before it or after it.  A call of its turn answered
    ** already_applied (state 6) fences it as the call that ran would, and
    ** one not applied (4) that names a call which carried it out or is at
    ** it (duplicate_of: handed_to in guard.c) as that call would.
    ** ?10 = 1: only those of its turn. */
    "SELECT " COLS " FROM attempts a WHERE fence_key = ?1"
    " AND NOT (session = ?2 AND call_id = ?3)"
    " AND (state IN (1, 5) OR (state = 2 AND (delivered = 0"
    " OR (delivered > ?5 AND delivered <= ?9) OR created >= ?4))"
    " OR ((state IN (2, 6) OR (state = 4 AND EXISTS (SELECT 1 FROM"
    " attempts x WHERE x.session = a.session AND x.call_id = a.duplicate_of"
    " AND x.fence_key = a.fence_key AND x.state IN (1, 2, 5))))"
    " AND (turn = ?6 OR (?6 IS NULL AND created >= ?7 AND created <= ?8))))"
    " AND (?10 = 0 OR (state <> 3 AND (turn = ?6"
    " OR (?6 IS NULL AND created >= ?7 AND created <= ?8))))"
    " ORDER BY created DESC, session DESC, call_id DESC LIMIT 1",
    "INSERT INTO attempts (" COLS_WRITTEN ") VALUES (?1, ?2, ?3, ?4, ?5,"
    " ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20,"
    " ?21, ?22, ?23, ?24, ?25)",
    /* A change (idem__change): ?3 state mask, ?4 token or -1, ?5 state or
    ** 0, ?6 attempts to add, ?7 the lease (1 take it over, 2 hand it on;
    ** ?8 owner, ?9 lease_until), ?10 result, ?11 error, ?12 resolution or
    ** 0, ?13 delivered or -1, ?14 now, ?15 the executor (1 set ?16 ?17
    ** ?18, 2 clear, 3 ended without a verdict at ?18), ?19 a settle_from
    ** to lower to, or 0, ?20 duplicate_of or NULL, ?21 the owner the
    ** record must still have or NULL, ?22 who gave an operator's verdict
    ** or NULL (resolved_at is then now), ?23 the expiry of a settling
    ** change or 0 (never lowered), ?24 check_with or NULL, ?25 the answer
    ** of a status check or NULL (checked_at: now, checks + 1).  The last
    ** condition keeps terminal
    ** outcomes.  The record as it is then is read back by S_GET in the
    ** same transaction: RETURNING would hold its rows in an ephemeral
    ** table, a B-tree with its own pager and page cache made and torn down
    ** at every change (an 85 KiB block allocated and freed each time; in a
    ** host whose heap trims, a brk shrink and page faults per change). */
    "UPDATE attempts SET"
    " state = CASE WHEN ?5 > 0 THEN ?5 ELSE state END,"
    " attempts = attempts + ?6,"
    " owner = CASE WHEN ?7 > 0 THEN ?8 ELSE owner END,"
    " lease_until = CASE WHEN ?7 > 0 THEN ?9 ELSE lease_until END,"
    " token = token + (?7 = 1),"
    " executor = CASE ?15 WHEN 0 THEN executor WHEN 1 THEN ?16 END,"
    " pgid = CASE ?15 WHEN 0 THEN pgid WHEN 1 THEN ?17 ELSE 0 END,"
    " settle_from = CASE ?15 WHEN 1 THEN ?18 WHEN 2 THEN 0"
    "  WHEN 3 THEN CASE WHEN settle_from > 0 AND settle_from < ?18"
    "   THEN settle_from ELSE ?18 END"
    "  ELSE CASE WHEN ?19 > 0 AND executor IS NOT NULL AND ?19 < settle_from"
    "   THEN ?19 ELSE settle_from END END,"
    " duplicate_of = coalesce(?20, duplicate_of),"
    " resolved_by = coalesce(?22, resolved_by),"
    " resolved_at = CASE WHEN ?22 IS NULL THEN resolved_at ELSE ?14 END,"
    " check_with = coalesce(?24, check_with),"
    " last_check = coalesce(?25, last_check),"
    " checked_at = CASE WHEN ?25 IS NULL THEN checked_at ELSE ?14 END,"
    " checks = checks + (?25 IS NOT NULL),"
    " result = coalesce(?10, result),"
    " error = coalesce(?11, error),"
    " resolution = CASE WHEN ?12 > 0 THEN ?12 ELSE resolution END,"
    " delivered = CASE WHEN ?13 >= 0 THEN ?13 ELSE delivered END,"
    " expires = CASE WHEN expires > 0 AND ?23 > expires THEN ?23"
    "  ELSE expires END,"
    " updated = ?14"
    " WHERE session = ?1 AND call_id = ?2 AND (?3 >> state) & 1"
    " AND (?4 < 0 OR token = ?4) AND (?21 IS NULL OR owner = ?21)"
    " AND (NOT ((" TERMINAL_BITS_SQL " >> state) & 1) OR (?7 = 0 AND ?6 = 0"
    "  AND ?10 IS NULL AND ?11 IS NULL AND ?5 IN (0, state)"
    "  AND ?12 IN (0, resolution) AND ?15 = 0 AND ?19 <= 0 AND ?20 IS NULL"
    "  AND ?22 IS NULL AND ?24 IS NULL AND ?25 IS NULL))",
    "DELETE FROM attempts WHERE state IN " GC_SQL
    " AND expires > 0 AND expires < ?1",
    "SELECT state, count(*) FROM attempts GROUP BY state",
    IDEM__TALLY_SQL("attempts"),
};


/* ---- per-thread messages --------------------------------------------------- */

static _Thread_local const void *tls_store;
static _Thread_local char tls_msg[MSG_MAX];

/* ---- the store ------------------------------------------------------------- */

/* The listing statements a connection keeps, by shape (idem__filter_shape):
** the few a process uses; a shape past them is prepared for its call. */
#define LIST_SLOTS 32

/* One connection and its statements. */
typedef struct conn {
  sqlite3 *db;
  sqlite3_stmt *stmt[N_STMTS];
  sqlite3_stmt *list[LIST_SLOTS]; /* listings, of the shapes ...   */
  unsigned list_shape[LIST_SLOTS]; /* ... listed here              */
  int nlist;
  int busy_ms;       /* the busy timeout set on db     */
  struct conn *next; /* in the pool of free readers    */
} conn;

/* A write request, on the stack of the thread that waits for it. */
enum { REQ_BEGIN = 1, REQ_INSERT, REQ_CHANGE, REQ_GC };

typedef struct wreq {
  int kind;
  const idem_record *rec; /* BEGIN, INSERT                  */
  long long window;       /* BEGIN: repeat window (ms)      */
  long long coalesce;     /* BEGIN: coalescing window (ms)  */
  const idem__change *ch; /* CHANGE                         */
  long long gc_now;       /* GC                             */
  size_t gc_n;            /* GC: records deleted            */
  int rc;                 /* the outcome ...                */
  int what;               /* ... IDEM__BEGIN_*              */
  idem_record *out;       /* ... found / after              */
  char msg[MSG_MAX];      /* ... and its message            */
  sem_t done;             /* posted when the outcome is in  */
  struct wreq *next;
} wreq;

typedef struct sq_store {
  idem__store base;
  unsigned magic;
  pid_t pid;    /* the process that opened it ...     */
  unsigned gen; /* ... and its fork generation         */
  char *path;
  const char *vfs; /* "idem", NULL: the default VFS */
  atomic_int busy_ms;

  /* The write connection: used only by the thread that set `writing`
  ** (the writer thread or a caller), and by open and close. */
  conn w;
  int sync_full;      /* synchronous now FULL (1), NORMAL (0), unknown */
  int wal_pages;      /* pages in the WAL after the last commit      */
  int next_ckpt;      /* checkpoint when wal_pages reaches this      */
  pthread_mutex_t mu; /* the queue, the flags below, and ...       */
  pthread_cond_t cv;  /* work for the writer thread                 */
  wreq *head, *tail;
  int writing; /* ... who holds the write connection: 1 while    */
               /* a batch runs (in any thread)                 */
  int stopping;
  pthread_t thread;
  int thread_started;

  /* The checkpointer: its own connection and thread, so that copying the
  ** WAL into the database never holds up a commit. */
  conn ck;
  pthread_cond_t ckcv; /* under mu: ckpt_due or stopping      */
  int ckpt_due;
  int ckpt_wait; /* the checkpointer waits for writing to end    */
  pthread_t ckthread;
  int ckthread_started;

  /* The readers. */
  pthread_mutex_t rmu;
  pthread_cond_t rcv;
  conn *free_readers;
  int nreaders;
  int locks_ready;

  atomic_llong batches, requests, checkpoints;
} sq_store;

static const idem__store_vt sqlite_vt;

/* ---- helpers --------------------------------------------------------------- */

static int map_rc(int rc) {
  switch (rc & 0xff) {
  case SQLITE_BUSY:
  case SQLITE_LOCKED: return IDEM_BUSY;
  case SQLITE_CORRUPT:
  case SQLITE_NOTADB: return IDEM_CORRUPT;
  case SQLITE_NOMEM: return IDEM_NOMEM;
  default: return IDEM_STORE;
  }
}

static int is_busy(int rc) {
  return (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED;
}

/* Write "PATH: SQLite's text (SQLite error N, while WHAT)" into msg. */
static int sql_msg(const sq_store *s, sqlite3 *db, int rc, const char *what,
                   char *msg, size_t n) {
  const char *text = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  if ((rc & 0xff) == SQLITE_NOTADB)
    snprintf(msg, n,
             "%s: not an idem attempt log: %s (SQLite error %d, while %s)",
             s->path, text, rc, what);
  else
    snprintf(msg, n, "%s: %s (SQLite error %d, while %s)", s->path, text, rc,
             what);
  return map_rc(rc);
}

static void msg_clear(const sq_store *s) {
  tls_store = s;
  tls_msg[0] = '\0';
}

static int msg_set(const sq_store *s, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int msg_set(const sq_store *s, int code, const char *fmt, ...) {
  va_list ap;
  tls_store = s;
  va_start(ap, fmt);
  vsnprintf(tls_msg, sizeof tls_msg, fmt, ap);
  va_end(ap);
  return code;
}

static int msg_sql(const sq_store *s, sqlite3 *db, int rc, const char *what) {
  tls_store = s;
  return sql_msg(s, db, rc, what, tls_msg, sizeof tls_msg);
}

/* Fork detection without a system call per entry point (getpid() is one):
** a generation bumped in every child by a pthread_atfork() handler. */
static atomic_uint fork_gen;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static int atfork_ok;

static void on_fork_child(void) { atomic_fetch_add(&fork_gen, 1); }

static void atfork_register(void) {
  atfork_ok = pthread_atfork(NULL, NULL, on_fork_child) == 0;
}

static int forked(const sq_store *s) {
  if (IDEM__LIKELY(atfork_ok))
    return s->gen != atomic_load_explicit(&fork_gen, memory_order_relaxed);
  return s->pid != getpid();
}

/* The SQLite store behind st, or NULL (with a message) when st is not one
** that this process may use. */
static sq_store *check(idem__store *st) {
  sq_store *s = (sq_store *)st;
  if (!st || st->vt != &sqlite_vt || s->magic != SQ_MAGIC) return NULL;
  if (forked(s)) {
    msg_set(s, IDEM_MISUSE,
            "%s: this store was opened by process %ld; after fork() a child "
            "must open its own",
            s->path, (long)s->pid);
    return NULL;
  }
  msg_clear(s);
  return s;
}

#define CHECK_STORE(s, st)                                                     \
  sq_store *s = check(st);                                                     \
  if (!s) return IDEM_MISUSE

static int stmt_get(const sq_store *s, conn *c, int id, sqlite3_stmt **out,
                    char *msg, size_t n) {
  int rc;
  if (c->stmt[id]) {
    *out = c->stmt[id];
    return IDEM_OK;
  }
  rc = sqlite3_prepare_v3(c->db, stmt_sql[id], -1, SQLITE_PREPARE_PERSISTENT,
                          &c->stmt[id], NULL);
  if (rc != SQLITE_OK) {
    c->stmt[id] = NULL;
    return sql_msg(s, c->db, rc, "preparing a statement", msg, n);
  }
  *out = c->stmt[id];
  return IDEM_OK;
}

/* Run a statement that returns no rows. */
static int run(sqlite3_stmt *st) {
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

static void bind_str(sqlite3_stmt *st, int i, const char *v) {
  if (v)
    sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
  else
    sqlite3_bind_null(st, i);
}

/* Copy text column i into *out (NULL for NULL); 0 when memory ran out. */
static int col_str(sqlite3_stmt *st, int i, char **out) {
  const unsigned char *t = sqlite3_column_text(st, i);
  size_t n;
  *out = NULL;
  if (!t) return sqlite3_column_type(st, i) == SQLITE_NULL;
  n = (size_t)sqlite3_column_bytes(st, i);
  if (!(*out = idem__malloc(n + 1))) return 0;
  memcpy(*out, t, n);
  (*out)[n] = '\0';
  return 1;
}

/* The record in the current row of st (columns COLS), or NULL (no memory). */
static idem_record *row_record(sqlite3_stmt *st) {
  idem_record *r = idem__malloc(sizeof *r);
  if (!r) return NULL;
  memset(r, 0, sizeof *r);
  r->cls = sqlite3_column_int(st, C_CLS);
  r->state = sqlite3_column_int(st, C_STATE);
  r->attempts = sqlite3_column_int(st, C_ATTEMPTS);
  r->lease_until = sqlite3_column_int64(st, C_LEASE_UNTIL);
  r->token = sqlite3_column_int64(st, C_TOKEN);
  r->created = sqlite3_column_int64(st, C_CREATED);
  r->updated = sqlite3_column_int64(st, C_UPDATED);
  r->expires = sqlite3_column_int64(st, C_EXPIRES);
  r->resolution = sqlite3_column_int(st, C_RESOLUTION);
  r->delivered = sqlite3_column_int64(st, C_DELIVERED);
  r->pgid = sqlite3_column_int64(st, C_PGID);
  r->settle_from = sqlite3_column_int64(st, C_SETTLE_FROM);
  r->resolved_at = sqlite3_column_int64(st, C_RESOLVED_AT);
  r->checked_at = sqlite3_column_int64(st, C_CHECKED_AT);
  r->checks = sqlite3_column_int64(st, C_CHECKS);
  if (col_str(st, C_SESSION, &r->session) &
      col_str(st, C_CALL_ID, &r->call_id) & col_str(st, C_TOOL, &r->tool) &
      col_str(st, C_FINGERPRINT, &r->fingerprint) &
      col_str(st, C_KEY, &r->key) & col_str(st, C_ARGS, &r->args) &
      col_str(st, C_FENCE_KEY, &r->fence_key) &
      col_str(st, C_OWNER, &r->owner) & col_str(st, C_RESULT, &r->result) &
      col_str(st, C_ERROR, &r->error) &
      col_str(st, C_DUPLICATE_OF, &r->duplicate_of) &
      col_str(st, C_EXECUTOR, &r->executor) & col_str(st, C_TURN, &r->turn) &
      col_str(st, C_RESOLVED_BY, &r->resolved_by) &
      col_str(st, C_CHECK_WITH, &r->check_with) &
      col_str(st, C_LAST_CHECK, &r->last_check))
    return r;
  idem_record_free(r);
  return NULL;
}

/* Bind every column of rec to the INSERT, ?1 .. ?25. */
static void bind_record(sqlite3_stmt *st, const idem_record *rec, int state,
                        long long token, long long now) {
  bind_str(st, 1 + C_SESSION, rec->session);
  bind_str(st, 1 + C_CALL_ID, rec->call_id);
  bind_str(st, 1 + C_TOOL, rec->tool);
  bind_str(st, 1 + C_FINGERPRINT, rec->fingerprint);
  bind_str(st, 1 + C_KEY, rec->key);
  bind_str(st, 1 + C_ARGS, rec->args);
  bind_str(st, 1 + C_FENCE_KEY, rec->fence_key);
  sqlite3_bind_int(st, 1 + C_CLS, rec->cls);
  sqlite3_bind_int(st, 1 + C_STATE, state);
  sqlite3_bind_int(st, 1 + C_ATTEMPTS, rec->attempts);
  bind_str(st, 1 + C_OWNER, rec->owner);
  sqlite3_bind_int64(st, 1 + C_LEASE_UNTIL, rec->lease_until);
  sqlite3_bind_int64(st, 1 + C_TOKEN, token);
  bind_str(st, 1 + C_RESULT, rec->result);
  bind_str(st, 1 + C_ERROR, rec->error);
  sqlite3_bind_int64(st, 1 + C_CREATED, rec->created ? rec->created : now);
  sqlite3_bind_int64(st, 1 + C_UPDATED, now);
  sqlite3_bind_int64(st, 1 + C_EXPIRES, rec->expires);
  sqlite3_bind_int(st, 1 + C_RESOLUTION, rec->resolution);
  sqlite3_bind_int64(st, 1 + C_DELIVERED, rec->delivered);
  bind_str(st, 1 + C_DUPLICATE_OF, rec->duplicate_of);
  bind_str(st, 1 + C_EXECUTOR, rec->executor);
  sqlite3_bind_int64(st, 1 + C_PGID, rec->pgid);
  sqlite3_bind_int64(st, 1 + C_SETTLE_FROM, rec->settle_from);
  bind_str(st, 1 + C_TURN, rec->turn);
}

/* Bind the fence query (S_FENCE) for rec: cutoff is when the repeat
** window opened (LLONG_MAX: none), coalesce the coalescing window. */
static void bind_fence(sqlite3_stmt *st, const idem_record *rec,
                       long long cutoff, long long coalesce, long long now,
                       int turn_only) {
  long long made = rec->created > 0 ? rec->created : now;
  bind_str(st, 1, rec->fence_key);
  bind_str(st, 2, rec->session);
  bind_str(st, 3, rec->call_id);
  sqlite3_bind_int64(st, 4, cutoff);
  sqlite3_bind_int64(st, 5, made);
  bind_str(st, 6, rec->turn);
  sqlite3_bind_int64(st, 7, coalesce > 0 ? made - coalesce : LLONG_MAX);
  sqlite3_bind_int64(st, 8, made + (coalesce > 0 ? coalesce : 0));
  sqlite3_bind_int64(st, 9, now + IDEM__CLOCK_SLACK_MS);
  sqlite3_bind_int(st, 10, turn_only != 0);
}

/* ---- connections ----------------------------------------------------------- */

static void conn_close(conn *c) {
  int i;
  for (i = 0; i < N_STMTS; i++) sqlite3_finalize(c->stmt[i]);
  for (i = 0; i < c->nlist; i++) sqlite3_finalize(c->list[i]);
  sqlite3_close(c->db);
  memset(c, 0, sizeof *c);
}

/* What a connection is for. */
enum { CONN_WRITER, CONN_READER, CONN_CHECKPOINTER };

static int conn_open(sq_store *s, conn *c, int kind, char *msg, size_t n) {
  int rc;
  memset(c, 0, sizeof *c);
  rc = sqlite3_open_v2(s->path, &c->db,
                       SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, s->vfs);
  if (rc != SQLITE_OK) {
    rc = sql_msg(s, c->db, rc, "opening", msg, n);
    conn_close(c);
    return rc;
  }
  sqlite3_extended_result_codes(c->db, 1);
  c->busy_ms = atomic_load(&s->busy_ms);
  sqlite3_busy_timeout(c->db, c->busy_ms);
  if (sqlite3_db_readonly(c->db, "main") == 1) {
    snprintf(msg, n, "%s: cannot write to the attempt log (read-only file)",
             s->path);
    conn_close(c);
    return IDEM_STORE;
  }
  /* A reader must not write; a checkpointer must have read the database
  ** once, or SQLite has not opened the WAL on it and its checkpoints do
  ** nothing. */
  if (kind != CONN_WRITER) {
    rc =
        sqlite3_exec(c->db,
                     kind == CONN_READER ? "PRAGMA query_only = 1"
                                         : "SELECT count(*) FROM sqlite_master",
                     NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
      rc = sql_msg(s, c->db, rc, "opening a connection", msg, n);
      conn_close(c);
      return rc;
    }
  }
  return IDEM_OK;
}

static void conn_busy(sq_store *s, conn *c) {
  int ms = atomic_load_explicit(&s->busy_ms, memory_order_relaxed);
  if (c->busy_ms != ms) sqlite3_busy_timeout(c->db, c->busy_ms = ms);
}

/* Take a reader from the pool, opening one when none is free. */
static int reader_get(sq_store *s, conn **out) {
  conn *c;
  char msg[MSG_MAX];
  int rc;
  *out = NULL;
  pthread_mutex_lock(&s->rmu);
  while (!s->free_readers && s->nreaders >= MAX_READERS)
    pthread_cond_wait(&s->rcv, &s->rmu);
  if ((c = s->free_readers) != NULL) {
    s->free_readers = c->next;
    pthread_mutex_unlock(&s->rmu);
    conn_busy(s, c);
    *out = c;
    return IDEM_OK;
  }
  s->nreaders++;
  pthread_mutex_unlock(&s->rmu);
  if ((c = idem__malloc(sizeof *c)) == NULL) {
    rc = msg_set(s, IDEM_NOMEM, "%s: out of memory", s->path);
  } else if ((rc = conn_open(s, c, CONN_READER, msg, sizeof msg)) != IDEM_OK) {
    idem__free(c);
    msg_set(s, rc, "%s", msg);
  } else {
    *out = c;
    return IDEM_OK;
  }
  pthread_mutex_lock(&s->rmu);
  s->nreaders--;
  pthread_cond_signal(&s->rcv);
  pthread_mutex_unlock(&s->rmu);
  return rc;
}

static void reader_put(sq_store *s, conn *c) {
  pthread_mutex_lock(&s->rmu);
  c->next = s->free_readers;
  s->free_readers = c;
  pthread_cond_signal(&s->rcv);
  pthread_mutex_unlock(&s->rmu);
}

/* ---- the writer ------------------------------------------------------------ */

/* Record a SQLite failure on request r. */
static void req_sql(sq_store *s, wreq *r, int rc, const char *what) {
  r->rc = sql_msg(s, s->w.db, rc, what, r->msg, sizeof r->msg);
}

static void req_nomem(sq_store *s, wreq *r) {
  r->rc = IDEM_NOMEM;
  snprintf(r->msg, sizeof r->msg, "%s: out of memory", s->path);
}

/* Look (session, call_id) up inside the transaction: 1 found (r->out set),
** 0 not found, -1 failed (r->rc set). */
static int w_lookup(sq_store *s, wreq *r, const char *session,
                    const char *call_id) {
  sqlite3_stmt *st = NULL;
  int rc;
  if ((r->rc = stmt_get(s, &s->w, S_GET, &st, r->msg, sizeof r->msg)) != 0)
    return -1;
  bind_str(st, 1, session);
  bind_str(st, 2, call_id);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    if (!(r->out = row_record(st))) req_nomem(s, r);
    sqlite3_reset(st);
    return r->out ? 1 : -1;
  }
  if (rc != SQLITE_DONE) req_sql(s, r, rc, "looking up a record");
  sqlite3_reset(st);
  return rc == SQLITE_DONE ? 0 : -1;
}

static void w_insert_row(sq_store *s, wreq *r, int state, long long token,
                         long long now) {
  sqlite3_stmt *st = NULL;
  int rc;
  if ((r->rc = stmt_get(s, &s->w, S_INSERT, &st, r->msg, sizeof r->msg)) != 0)
    return;
  bind_record(st, r->rec, state, token, now);
  rc = sqlite3_step(st);
  if (rc != SQLITE_DONE) req_sql(s, r, rc, "inserting a record");
  sqlite3_reset(st);
}

static void w_begin(sq_store *s, wreq *r) {
  const idem_record *rec = r->rec;
  long long now = idem__wall_ms(), cutoff;
  sqlite3_stmt *st = NULL;
  int rc, found = w_lookup(s, r, rec->session, rec->call_id);
  if (found) {
    if (found > 0) r->what = IDEM__BEGIN_FOUND;
    return;
  }
  if (rec->fence_key) {
    if ((r->rc = stmt_get(s, &s->w, S_FENCE, &st, r->msg, sizeof r->msg)))
      return;
    cutoff = r->window > 0 ? now - r->window : LLONG_MAX;
    bind_fence(st, rec, cutoff, r->coalesce, now, 0);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      if ((r->out = row_record(st)) != NULL)
        r->what = IDEM__BEGIN_FENCED;
      else
        req_nomem(s, r);
    } else if (rc != SQLITE_DONE) {
      req_sql(s, r, rc, "checking the fence");
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return;
  }
  w_insert_row(s, r, IDEM_STATE_PENDING, 1, now);
  if (r->rc == IDEM_OK) r->what = IDEM__BEGIN_INSERTED;
}

static void w_insert(sq_store *s, wreq *r) {
  int found = w_lookup(s, r, r->rec->session, r->rec->call_id);
  if (found) {
    if (found > 0) r->what = IDEM__BEGIN_FOUND;
    return;
  }
  w_insert_row(s, r, r->rec->state, r->rec->token,
               r->rec->updated ? r->rec->updated : idem__wall_ms());
  if (r->rc == IDEM_OK) r->what = IDEM__BEGIN_INSERTED;
}

static void w_change(sq_store *s, wreq *r) {
  const idem__change *ch = r->ch;
  sqlite3_stmt *st = NULL;
  int rc, found, changed;
  if ((r->rc = stmt_get(s, &s->w, S_CHANGE, &st, r->msg, sizeof r->msg)))
    return;
  bind_str(st, 1, ch->session);
  bind_str(st, 2, ch->call_id);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)ch->from);
  sqlite3_bind_int64(st, 4, ch->expect_token < 0 ? -1 : ch->expect_token);
  sqlite3_bind_int(st, 5, ch->state);
  sqlite3_bind_int(st, 6, ch->attempts_add);
  sqlite3_bind_int(st, 7, ch->take_lease);
  bind_str(st, 8, ch->owner);
  sqlite3_bind_int64(st, 9, ch->lease_until);
  bind_str(st, 10, ch->result);
  bind_str(st, 11, ch->error);
  sqlite3_bind_int(st, 12, ch->resolution);
  sqlite3_bind_int64(st, 13, ch->delivered < 0 ? -1 : ch->delivered);
  sqlite3_bind_int64(st, 14, idem__wall_ms());
  sqlite3_bind_int(st, 15, ch->exec_set);
  bind_str(st, 16, ch->executor);
  sqlite3_bind_int64(st, 17, ch->pgid);
  sqlite3_bind_int64(st, 18, ch->settle_from);
  sqlite3_bind_int64(st, 19, ch->settle_cap);
  bind_str(st, 20, ch->duplicate_of);
  bind_str(st, 21, ch->expect_owner);
  bind_str(st, 22, ch->resolved_by);
  sqlite3_bind_int64(st, 23, ch->expires);
  bind_str(st, 24, ch->check_with);
  bind_str(st, 25, idem__check_name(ch->check));
  rc = sqlite3_step(st);
  changed = rc == SQLITE_DONE && sqlite3_changes(s->w.db) > 0;
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) {
    req_sql(s, r, rc, "changing a record");
    return;
  }
  /* The record as it is now: changed, or why the condition failed. */
  found = w_lookup(s, r, ch->session, ch->call_id);
  if (found < 0) return;
  if (changed) {
    if (found == 0) { /* cannot be: it changed in this transaction */
      r->rc = IDEM_STORE;
      snprintf(r->msg, sizeof r->msg,
               "%s: the record of (%.80s, %.80s) changed, then was not found",
               s->path, ch->session, ch->call_id);
    }
    return;
  }
  if (found > 0) {
    r->rc = IDEM_STALE;
    snprintf(r->msg, sizeof r->msg,
             "%s: the record of (%.80s, %.80s) is %s with token %lld; the "
             "change expected another state or token",
             s->path, ch->session, ch->call_id, idem_state_name(r->out->state),
             r->out->token);
  } else if (found == 0) {
    r->rc = IDEM_NOTFOUND;
    snprintf(r->msg, sizeof r->msg, "%s: no record of (%.80s, %.80s)", s->path,
             ch->session, ch->call_id);
  }
}

static void w_gc(sq_store *s, wreq *r) {
  sqlite3_stmt *st = NULL;
  int rc;
  if ((r->rc = stmt_get(s, &s->w, S_GC, &st, r->msg, sizeof r->msg))) return;
  sqlite3_bind_int64(st, 1, r->gc_now);
  rc = sqlite3_step(st);
  if (rc == SQLITE_DONE)
    r->gc_n = (size_t)sqlite3_changes(s->w.db);
  else
    req_sql(s, r, rc, "deleting expired records");
  sqlite3_reset(st);
}

/* Fail every request of a batch with one code and message. */
static void fail_all(wreq *batch, int code, const char *msg) {
  wreq *r;
  for (r = batch; r; r = r->next) {
    idem_record_free(r->out);
    r->out = NULL;
    r->what = 0;
    r->gc_n = 0;
    r->rc = code;
    if (r->msg != msg) snprintf(r->msg, sizeof r->msg, "%s", msg);
  }
}

/* Run a control statement of the writer; on failure fail the batch. */
static int w_control(sq_store *s, int id, wreq *batch, const char *what) {
  sqlite3_stmt *st = NULL;
  char msg[MSG_MAX];
  int rc, code;
  if ((code = stmt_get(s, &s->w, id, &st, msg, sizeof msg)) != IDEM_OK) {
    fail_all(batch, code, msg);
    return code;
  }
  if ((rc = run(st)) == SQLITE_OK) return IDEM_OK;
  code = sql_msg(s, s->w.db, rc, what, msg, sizeof msg);
  fail_all(batch, code, msg);
  return code;
}

/* Step a control statement, retrying SQLITE_BUSY until the deadline. */
static int w_busy_loop(sq_store *s, int id, long long deadline) {
  sqlite3_stmt *st = s->w.stmt[id];
  int rc;
  for (;;) {
    rc = run(st);
    if (!is_busy(rc) || idem__mono_ms() >= deadline) return rc;
    idem__sleep_ms(1);
  }
}

static void run_batch(sq_store *s, wreq *batch) {
  sqlite3_stmt *st = NULL;
  char msg[MSG_MAX];
  int full = 0, rc, code, n = 0;
  int alone = batch->next == NULL; /* the transaction is its savepoint */
  long long deadline;
  wreq *r;
  for (r = batch; r; r = r->next, n++)
    if (r->kind == REQ_BEGIN || (r->kind == REQ_CHANGE && r->ch->durable))
      full = 1;
  conn_busy(s, &s->w);
  if (s->sync_full != full) {
    if (w_control(s, full ? S_SYNC_FULL : S_SYNC_NORMAL, batch,
                  "setting synchronous"))
      return;
    s->sync_full = full;
  }
  if ((code = stmt_get(s, &s->w, S_BEGIN, &st, msg, sizeof msg)) ||
      (code = stmt_get(s, &s->w, S_COMMIT, &st, msg, sizeof msg))) {
    fail_all(batch, code, msg);
    return;
  }
  deadline = idem__mono_ms() + s->w.busy_ms;
  if ((rc = w_busy_loop(s, S_BEGIN, deadline)) != SQLITE_OK) {
    code = sql_msg(s, s->w.db, rc, "beginning a write transaction", msg,
                   sizeof msg);
    fail_all(batch, code, msg);
    return;
  }
  for (r = batch; r; r = r->next) {
    if (!alone && w_control(s, S_SAVEPOINT, batch, "opening a savepoint"))
      goto abort;
    switch (r->kind) {
    case REQ_BEGIN: w_begin(s, r); break;
    case REQ_INSERT: w_insert(s, r); break;
    case REQ_CHANGE: w_change(s, r); break;
    default: w_gc(s, r); break;
    }
    if (r->rc == IDEM_OK || r->rc == IDEM_STALE || r->rc == IDEM_NOTFOUND) {
      if (!alone && w_control(s, S_RELEASE, batch, "releasing a savepoint"))
        goto abort;
      continue;
    }
    idem_record_free(r->out);
    r->out = NULL;
    r->what = 0;
    if (alone || sqlite3_get_autocommit(s->w.db)) {
      /* Alone, or the error rolled the whole transaction back (an I/O
      ** error, a full disk): then the requests before it are gone too. */
      snprintf(msg, sizeof msg, "%s", r->msg);
      fail_all(batch, r->rc, msg);
      goto abort;
    }
    if (w_control(s, S_ROLLBACK_TO, batch, "rolling back a savepoint") ||
        w_control(s, S_RELEASE, batch, "releasing a savepoint"))
      goto abort;
  }
  if ((rc = w_busy_loop(s, S_COMMIT, deadline)) != SQLITE_OK) {
    code = sql_msg(s, s->w.db, rc, "committing", msg, sizeof msg);
    fail_all(batch, code, msg);
    goto abort;
  }
  atomic_fetch_add_explicit(&s->batches, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->requests, n, memory_order_relaxed);
  return;
abort: /* every request has failed already */
  if (!sqlite3_get_autocommit(s->w.db))
    sqlite3_exec(s->w.db, "ROLLBACK", NULL, NULL, NULL);
}

static int wal_hook(void *arg, sqlite3 *db, const char *name, int pages) {
  sq_store *s = arg;
  (void)db, (void)name;
  if (pages < s->wal_pages) s->next_ckpt = CHECKPOINT_PAGES; /* restarted */
  s->wal_pages = pages;
  return SQLITE_OK;
}

/*
** The checkpointer thread, woken whenever a batch leaves CHECKPOINT_PAGES
** more pages in the WAL.  A checkpoint copies WAL frames into the database;
** the WAL starts over from its beginning (reusing its blocks, so commits
** never grow the file) only once every frame has been copied.  So, on its
** own connection:
**   1. a PASSIVE checkpoint beside the writers (SQLite lets one
**      checkpointer and one writer run at once): the bulk of the copying,
**      while commits go on;
**   2. with this process's writes held back (it takes `writing`), a second
**      one for the few frames committed meanwhile, so that the checkpoint
**      completes and the next commit restarts the WAL.
** Without step 2 a steady stream of commits starves the checkpoint and the
** WAL grows without bound.  PASSIVE never waits for a lock; a checkpoint
** that another process's readers or writers hold back is retried at the
** next trigger.
*/
static void *checkpointer_main(void *arg) {
  sq_store *s = arg;
  int log, done;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->ckpt_due && !s->stopping) pthread_cond_wait(&s->ckcv, &s->mu);
    if (s->stopping) break;
    s->ckpt_due = 0;
    pthread_mutex_unlock(&s->mu);
    log = done = 0;
    sqlite3_wal_checkpoint_v2(s->ck.db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log,
                              &done);
    pthread_mutex_lock(&s->mu);
    s->ckpt_wait = 1; /* no new batch starts: the running one ends */
    while (s->writing && !s->stopping) pthread_cond_wait(&s->ckcv, &s->mu);
    s->ckpt_wait = 0;
    if (s->stopping) break;
    s->writing = 1;
    pthread_mutex_unlock(&s->mu);
    sqlite3_wal_checkpoint_v2(s->ck.db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log,
                              &done);
    atomic_fetch_add_explicit(&s->checkpoints, 1, memory_order_relaxed);
    pthread_mutex_lock(&s->mu);
    s->writing = 0;
    if (s->head || s->stopping) pthread_cond_signal(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Under mu: the next batch, up to MAX_BATCH requests in queue order. */
static wreq *take_batch(sq_store *s) {
  wreq *batch = s->head, *last = batch;
  int n;
  for (n = 1; last->next && n < MAX_BATCH; n++) last = last->next;
  s->head = last->next;
  if (!s->head) s->tail = NULL;
  last->next = NULL;
  return batch;
}

/* Under mu: the batch is over; give up the write connection. */
static void end_batch(sq_store *s) {
  if (s->wal_pages >= s->next_ckpt) {
    s->next_ckpt = s->wal_pages + CHECKPOINT_PAGES;
    s->ckpt_due = 1;
  }
  s->writing = 0;
  /* The checkpointer waits for a trigger, or for writing to end.  Wake it
  ** only then: a wake-up for nothing after every commit costs a context
  ** switch per write. */
  if (s->ckpt_due || s->ckpt_wait) pthread_cond_signal(&s->ckcv);
}

/* Under mu: a caller that held the write connection gives it back - to the
** writer thread when requests queued meanwhile, or the store closes. */
static void give_back(sq_store *s) {
  end_batch(s);
  if (s->head || s->stopping) pthread_cond_signal(&s->cv);
}

/* Not under mu (a woken waiter need not wait for it): wake the waiters of
** a batch, but self, who is awake. */
static void wake(wreq *batch, const wreq *self) {
  wreq *r, *next;
  for (r = batch; r; r = next) {
    next = r->next; /* r belongs to its waiter once posted */
    if (r != self) sem_post(&r->done);
  }
}

/*
** The writer thread takes the write connection whenever requests wait and
** nobody else holds it, so a backlog drains batch after batch without a
** hand-over in between.
*/
static void *writer_main(void *arg) {
  sq_store *s = arg;
  wreq *batch;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    if (!s->writing && !s->ckpt_wait && s->head) {
      s->writing = 1;
      batch = take_batch(s);
      pthread_mutex_unlock(&s->mu);
      run_batch(s, batch);
      pthread_mutex_lock(&s->mu);
      end_batch(s);
      pthread_mutex_unlock(&s->mu);
      wake(batch, NULL);
      pthread_mutex_lock(&s->mu);
    } else if (s->stopping && !s->writing) {
      break;
    } else {
      pthread_cond_wait(&s->cv, &s->mu);
    }
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/*
** Queue r and wait for its outcome; the message moves to this thread's
** errmsg.  When nobody holds the write connection the caller runs the
** batch itself (its own request and whatever queued meanwhile): a lone
** session then pays no thread hand-over, which on a busy machine can cost
** more than the sync.  Whatever queues while a batch runs is left to the
** writer thread, which the finishing batch wakes.
*/
static int submit(sq_store *s, wreq *r) {
  wreq *batch;
  r->rc = IDEM_OK;
  r->what = 0;
  r->out = NULL;
  r->gc_n = 0;
  r->msg[0] = '\0';
  r->next = NULL;
  if (sem_init(&r->done, 0, 0) != 0)
    return msg_set(s, IDEM_STORE, "%s: cannot make a semaphore", s->path);
  pthread_mutex_lock(&s->mu);
  if (s->tail)
    s->tail->next = r;
  else
    s->head = r;
  s->tail = r;
  if (!s->writing && !s->ckpt_wait) {
    s->writing = 1;
    batch = take_batch(s);
    pthread_mutex_unlock(&s->mu);
    run_batch(s, batch);
    pthread_mutex_lock(&s->mu);
    give_back(s);
    pthread_mutex_unlock(&s->mu);
    wake(batch, r);
  } else {
    pthread_mutex_unlock(&s->mu);
    while (sem_wait(&r->done) != 0 && errno == EINTR) {
    }
  }
  /* Safe at once: POSIX lets a semaphore be destroyed when no thread is
  ** blocked on it, and glibc's sem_post touches only the futex word after
  ** the waiter may have returned (a stray wake-up, which waiters allow). */
  sem_destroy(&r->done);
  if (r->msg[0]) msg_set(s, r->rc, "%s", r->msg);
  return r->rc;
}

/*
** Queue n requests at once and wait for them all: the writer thread runs
** them in batches of MAX_BATCH, so n changes cost about n / MAX_BATCH
** commits (idem recover settling a backlog).  The message of the first
** failure moves to this thread's errmsg.
*/
static int submit_many(sq_store *s, wreq *v, size_t n) {
  size_t i, made = 0;
  int rc = IDEM_OK;
  for (i = 0; i < n; i++) {
    v[i].rc = IDEM_OK;
    v[i].what = 0;
    v[i].out = NULL;
    v[i].gc_n = 0;
    v[i].msg[0] = '\0';
    v[i].next = i + 1 < n ? &v[i + 1] : NULL;
    if (sem_init(&v[i].done, 0, 0) != 0) break;
    made++;
  }
  if (made < n) {
    for (i = 0; i < made; i++) sem_destroy(&v[i].done);
    return msg_set(s, IDEM_STORE, "%s: cannot make a semaphore", s->path);
  }
  if (n == 0) return IDEM_OK;
  pthread_mutex_lock(&s->mu);
  if (s->tail)
    s->tail->next = &v[0];
  else
    s->head = &v[0];
  s->tail = &v[n - 1];
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  for (i = 0; i < n; i++) {
    while (sem_wait(&v[i].done) != 0 && errno == EINTR) {
    }
    sem_destroy(&v[i].done);
    if (v[i].rc && rc == IDEM_OK && v[i].rc != IDEM_STALE) {
      rc = v[i].rc;
      if (v[i].msg[0]) msg_set(s, v[i].rc, "%s", v[i].msg);
    }
  }
  return rc;
}

static int sq_change_many(idem__store *st, const idem__change *chs, size_t n,
                          int *rcs) {
  wreq *v;
  size_t i;
  int rc;
  CHECK_STORE(s, st);
  if (n && !chs) return IDEM_MISUSE;
  if (n > SIZE_MAX / sizeof *v || !(v = idem__malloc(n * sizeof *v)))
    return msg_set(s, IDEM_NOMEM, "%s: out of memory", s->path);
  for (i = 0; i < n; i++) {
    v[i].kind = REQ_CHANGE;
    v[i].ch = &chs[i];
  }
  rc = submit_many(s, v, n);
  for (i = 0; i < n; i++) {
    if (rcs) rcs[i] = v[i].rc;
    idem_record_free(v[i].out);
  }
  idem__free(v);
  return rc;
}

/* ---- opening --------------------------------------------------------------- */

/* Create the directories above path (mode 0700) that are missing. */
static int make_parents(const char *path, char *msg, size_t n) {
  char dir[PATH_MAX];
  size_t len = strlen(path), i;
  struct stat sb;
  if (len >= sizeof dir) {
    snprintf(msg, n, "%.200s...: path too long", path);
    return IDEM_INVALID;
  }
  memcpy(dir, path, len + 1);
  while (len > 0 && dir[len - 1] != '/') len--;
  while (len > 1 && dir[len - 1] == '/') len--;
  if (len == 0) return IDEM_OK; /* in the current directory */
  dir[len] = '\0';
  if (stat(dir, &sb) == 0) return IDEM_OK;
  for (i = 1; i <= len; i++) {
    if (dir[i] != '/' && dir[i] != '\0') continue;
    dir[i] = '\0';
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
      snprintf(msg, n, "%.150s: cannot create the directory %.150s: %s", path,
               dir, strerror(errno));
      return IDEM_STORE;
    }
    if (i < len) dir[i] = '/';
  }
  return IDEM_OK;
}

/* Sync the directory holding path, so a new entry in it survives. */
static void sync_parent(const char *path) {
  char dir[PATH_MAX];
  size_t len = strlen(path);
  int fd;
  if (len >= sizeof dir) return;
  memcpy(dir, path, len + 1);
  while (len > 0 && dir[len - 1] != '/') len--;
  if (len == 0)
    memcpy(dir, ".", 2);
  else
    dir[len] = '\0';
  if ((fd = open(dir, O_RDONLY | O_CLOEXEC)) >= 0) {
    fsync(fd);
    close(fd);
  }
}

/* Take other users' access away from the regular file at p when this
** process owns it - never from what a symbolic link there points to (one
** planted as a log's -wal or -shm in a directory others can write would
** else have idem change a file of its choosing).  p is opened O_PATH |
** O_NOFOLLOW, so a link is the link itself and is left alone; the checks
** and the change are of that one file (fstat, then chmod through
** /proc/self/fd, as glibc's fchmodat does: fchmod refuses an O_PATH
** descriptor).  Never a descriptor opened for reading: closing one would
** drop the POSIX locks SQLite holds on the file in this process; closing
** an O_PATH one drops none.  Without O_PATH, lstat and chmod by path. */
static void close_file_to_others(const char *p) {
  struct stat sb;
#ifdef O_PATH
  char fdp[64];
  int fd = open(p, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_uid == geteuid() &&
      (sb.st_mode & S_IRWXO)) {
    snprintf(fdp, sizeof fdp, "/proc/self/fd/%d", fd);
    (void)chmod(fdp, sb.st_mode & 07770);
  }
  close(fd);
#else
  if (lstat(p, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_uid == geteuid() &&
      (sb.st_mode & S_IRWXO))
    (void)chmod(p, sb.st_mode & 07770);
#endif
}

/* Take other users' access away from the log and its -wal and -shm, those
** of them this process owns (THE FILE, above).  The log goes first: a -wal
** or -shm SQLite creates meanwhile takes its mode.  Best effort: a mode
** that cannot be changed (a read-only file system, no /proc) is left as it
** is. */
static void close_to_others(const char *path) {
  static const char *const suffix[] = {"", "-wal", "-shm"};
  char p[PATH_MAX];
  size_t i;
  for (i = 0; i < sizeof suffix / sizeof *suffix; i++) {
    int k = snprintf(p, sizeof p, "%s%s", path, suffix[i]);
    if (k < 0 || (size_t)k >= sizeof p) return;
    close_file_to_others(p);
  }
}

/* Make sure the file exists, creating it (and its directories) private;
** an existing one is made no more than group-readable when ours. */
static int prepare_file(const char *path, char *msg, size_t n) {
  struct stat sb;
  int fd, rc;
  if (stat(path, &sb) == 0) {
    if (!S_ISREG(sb.st_mode)) {
      snprintf(msg, n, "%s: not a regular file", path);
      return IDEM_STORE;
    }
    close_to_others(path);
    return IDEM_OK;
  }
  if (errno != ENOENT) {
    snprintf(msg, n, "%s: %s", path, strerror(errno));
    return IDEM_STORE;
  }
  if ((rc = make_parents(path, msg, n)) != IDEM_OK) return rc;
  fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno != EEXIST) {
    snprintf(msg, n, "%s: cannot create the attempt log: %s", path,
             strerror(errno));
    return IDEM_STORE;
  }
  if (fd >= 0) {
    fsync(fd);
    close(fd);
    sync_parent(path);
  }
  return IDEM_OK;
}

/* One integer from a query on the writer's connection. */
static int query_int(sq_store *s, const char *sql, long long *v, char *msg,
                     size_t n) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(s->w.db, sql, -1, &st, NULL);
  if (rc == SQLITE_OK) {
    rc = sqlite3_step(st);
    *v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    if (rc == SQLITE_ROW || rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  if (rc != SQLITE_OK) sql_msg(s, s->w.db, rc, "reading the schema", msg, n);
  sqlite3_finalize(st);
  return rc;
}

/* Is this file an idem log we can use?  Sets *version. */
static int check_schema(sq_store *s, long long *version, char *msg, size_t n) {
  long long app = 0, objects = 0, ours = 0;
  int rc;
  if ((rc = query_int(s, "PRAGMA application_id", &app, msg, n)) ||
      (rc = query_int(s, "PRAGMA user_version", version, msg, n)) ||
      (rc = query_int(s, "SELECT count(*) FROM sqlite_master", &objects, msg,
                      n)) ||
      (rc = query_int(s,
                      "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                      " AND name = 'attempts'",
                      &ours, msg, n)))
    return map_rc(rc);
  if (app != 0 && app != APP_ID) {
    snprintf(msg, n,
             "%s: not an idem attempt log (it belongs to another application,"
             " application_id %lld)",
             s->path, app);
    return IDEM_CORRUPT;
  }
  if (*version == 0 && objects > 0) {
    snprintf(msg, n,
             "%s: not an idem attempt log (it holds another application's "
             "tables)",
             s->path);
    return IDEM_CORRUPT;
  }
  if (*version > SCHEMA_VERSION) {
    snprintf(msg, n,
             "%s: written by a newer idem (schema version %lld; this idem "
             "knows up to %d)",
             s->path, *version, SCHEMA_VERSION);
    return IDEM_CORRUPT;
  }
  if (*version > 0 && (app != APP_ID || !ours)) {
    snprintf(msg, n,
             "%s: not an idem attempt log (user_version %lld without idem's "
             "tables)",
             s->path, *version);
    return IDEM_CORRUPT;
  }
  return IDEM_OK;
}

static int exec_w(sq_store *s, const char *sql, const char *what, char *msg,
                  size_t n) {
  int rc = sqlite3_exec(s->w.db, sql, NULL, NULL, NULL);
  return rc == SQLITE_OK ? IDEM_OK : sql_msg(s, s->w.db, rc, what, msg, n);
}

/* WAL mode, then the schema brought up to date in one transaction. */
static int setup(sq_store *s, char *msg, size_t n) {
  sqlite3_stmt *st = NULL;
  long long version = 0, deadline;
  char sql[64];
  int rc, i, wal = 0;
  if (sqlite3_threadsafe() == 0) {
    snprintf(msg, n, "%s: this SQLite was built without thread support",
             s->path);
    return IDEM_STORE;
  }
  /* One read transaction, so that the checks see one state of a file
  ** that another process may be migrating at this moment. */
  if ((rc = exec_w(s, "BEGIN", "reading the schema", msg, n))) return rc;
  rc = check_schema(s, &version, msg, n);
  sqlite3_exec(s->w.db, "COMMIT", NULL, NULL, NULL);
  if (rc != IDEM_OK) return rc;
  /* A process that switched the file to WAL meanwhile holds a lock that
  ** makes our switch BUSY (and no busy handler runs for it); the next
  ** attempt reads the header again and finds WAL mode already. */
  rc = sqlite3_prepare_v2(s->w.db, "PRAGMA journal_mode = WAL", -1, &st, NULL);
  deadline = idem__mono_ms() + s->w.busy_ms;
  while (rc == SQLITE_OK) {
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      const unsigned char *mode = sqlite3_column_text(st, 0);
      wal = mode && sqlite3_stricmp((const char *)mode, "wal") == 0;
      rc = SQLITE_OK;
      break;
    }
    sqlite3_reset(st);
    if (!is_busy(rc) || idem__mono_ms() >= deadline) break;
    idem__sleep_ms(1);
    rc = SQLITE_OK;
  }
  if (rc != SQLITE_OK) {
    rc = sql_msg(s, s->w.db, rc, "switching to WAL mode", msg, n);
    sqlite3_finalize(st);
    return rc;
  }
  sqlite3_finalize(st);
  if (!wal) {
    snprintf(msg, n, "%s: SQLite would not switch the log to WAL mode",
             s->path);
    return IDEM_STORE;
  }
  /* Keep the WAL's blocks between checkpoints (commits then overwrite,
  ** never grow, the file), but not more than 16 MiB of them after a burst. */
  if ((rc = exec_w(s, "PRAGMA journal_size_limit = 16777216",
                   "limiting the WAL", msg, n)) ||
      (rc = exec_w(s, "PRAGMA synchronous = FULL", "setting synchronous", msg,
                   n)))
    return rc;
  s->sync_full = 1;
  if ((rc = exec_w(s, "BEGIN IMMEDIATE", "locking the log to migrate it", msg,
                   n)))
    return rc;
  /* Again under the lock: another process may have migrated it. */
  if ((rc = check_schema(s, &version, msg, n)) != IDEM_OK) goto fail;
  for (i = (int)version; i < SCHEMA_VERSION; i++)
    if ((rc = exec_w(s, migrations[i], "creating the schema", msg, n)))
      goto fail;
  if (version < SCHEMA_VERSION) {
    snprintf(sql, sizeof sql, "PRAGMA application_id = %d", APP_ID);
    if ((rc = exec_w(s, sql, "marking the log", msg, n))) goto fail;
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", SCHEMA_VERSION);
    if ((rc = exec_w(s, sql, "writing the schema version", msg, n))) goto fail;
  }
  if ((rc = exec_w(s, "COMMIT", "committing the schema", msg, n))) goto fail;
  return IDEM_OK;
fail:
  if (!sqlite3_get_autocommit(s->w.db))
    sqlite3_exec(s->w.db, "ROLLBACK", NULL, NULL, NULL);
  return rc;
}

static void sq_destroy(sq_store *s) {
  conn *c;
  if (s->thread_started || s->ckthread_started) {
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->cv);
    pthread_cond_signal(&s->ckcv);
    pthread_mutex_unlock(&s->mu);
    if (s->thread_started) pthread_join(s->thread, NULL);
    if (s->ckthread_started) pthread_join(s->ckthread, NULL);
  }
  while ((c = s->free_readers) != NULL) {
    s->free_readers = c->next;
    conn_close(c);
    idem__free(c);
  }
  if (s->ck.db) conn_close(&s->ck);
  if (s->w.db) conn_close(&s->w); /* the last: it checkpoints the WAL */
  if (s->locks_ready) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->ckcv);
    pthread_mutex_destroy(&s->rmu);
    pthread_cond_destroy(&s->rcv);
  }
  idem__free(s->path);
  s->magic = IDEM__MAGIC_DEAD;
  idem__free(s);
}

int idem__sqlite_open(const char *path, idem__store **out) {
  char msg[MSG_MAX];
  sq_store *s;
  conn *c;
  size_t len;
  int rc;
  if (!out) return IDEM_MISUSE;
  *out = NULL;
  if (!path || !*path)
    return idem__store_fail(out, IDEM_INVALID, "no attempt log path given");
  if (strcmp(path, ":memory:") == 0)
    return idem__store_fail(out, IDEM_INVALID,
                            "an in-memory attempt log would not be durable");
  if ((rc = prepare_file(path, msg, sizeof msg)) != IDEM_OK)
    return idem__store_fail(out, rc, "%s", msg);
  len = strlen(path);
  if (!(s = idem__malloc(sizeof *s)))
    return idem__store_fail(out, IDEM_NOMEM, "%s: out of memory", path);
  memset(s, 0, sizeof *s);
  s->base.vt = &sqlite_vt;
  s->magic = SQ_MAGIC;
  pthread_once(&atfork_once, atfork_register);
  s->pid = getpid();
  s->gen = atomic_load(&fork_gen);
  s->vfs = idem__vfs();
  s->sync_full = -1;
  s->next_ckpt = CHECKPOINT_PAGES;
  atomic_init(&s->busy_ms, DEFAULT_BUSY_MS);
  atomic_init(&s->batches, 0);
  atomic_init(&s->requests, 0);
  atomic_init(&s->checkpoints, 0);
  if (!(s->path = idem__malloc(len + 1))) {
    sq_destroy(s);
    return idem__store_fail(out, IDEM_NOMEM, "%s: out of memory", path);
  }
  memcpy(s->path, path, len + 1);
  if (pthread_mutex_init(&s->mu, NULL) || pthread_cond_init(&s->cv, NULL) ||
      pthread_cond_init(&s->ckcv, NULL) || pthread_mutex_init(&s->rmu, NULL) ||
      pthread_cond_init(&s->rcv, NULL)) {
    sq_destroy(s);
    return idem__store_fail(out, IDEM_NOMEM, "%s: out of locks", path);
  }
  s->locks_ready = 1;
  if ((rc = conn_open(s, &s->w, CONN_WRITER, msg, sizeof msg)) != IDEM_OK ||
      (rc = setup(s, msg, sizeof msg)) != IDEM_OK)
    goto fail;
  sqlite3_wal_hook(s->w.db, wal_hook, s);
  /* One reader now, so that a broken file fails here and not at the first
  ** get. */
  if (!(c = idem__malloc(sizeof *c))) {
    rc = IDEM_NOMEM;
    snprintf(msg, sizeof msg, "%s: out of memory", path);
    goto fail;
  }
  if ((rc = conn_open(s, c, CONN_READER, msg, sizeof msg)) != IDEM_OK) {
    idem__free(c);
    goto fail;
  }
  c->next = NULL;
  s->free_readers = c;
  s->nreaders = 1;
  if ((rc = conn_open(s, &s->ck, CONN_CHECKPOINTER, msg, sizeof msg)))
    goto fail;
  if (pthread_create(&s->thread, NULL, writer_main, s) != 0) {
    rc = IDEM_STORE;
    snprintf(msg, sizeof msg, "%s: cannot start the writer thread", path);
    goto fail;
  }
  s->thread_started = 1;
  if (pthread_create(&s->ckthread, NULL, checkpointer_main, s) != 0) {
    rc = IDEM_STORE;
    snprintf(msg, sizeof msg, "%s: cannot start the checkpointer", path);
    goto fail;
  }
  s->ckthread_started = 1;
  *out = &s->base;
  return IDEM_OK;
fail:
  sq_destroy(s);
  return idem__store_fail(out, rc, "%s", msg);
}

/* ---- the vtable ------------------------------------------------------------ */

static int sq_now(idem__store *st, long long *ms) {
  CHECK_STORE(s, st);
  (void)s;
  if (!ms) return IDEM_MISUSE;
  *ms = idem__wall_ms();
  return IDEM_OK;
}

/* A record must carry every NOT NULL column. */
static int check_record(sq_store *s, const idem_record *rec) {
  const char *missing = idem__record_missing(rec);
  if (missing)
    return msg_set(s, IDEM_INVALID, "%s: a record without %s", s->path,
                   missing);
  return IDEM_OK;
}

static int sq_begin(idem__store *st, const idem_record *rec,
                    long long repeat_window_ms, long long coalesce_ms,
                    int *what, idem_record **found) {
  wreq r;
  int rc;
  CHECK_STORE(s, st);
  if (found) *found = NULL;
  if (!what) return IDEM_MISUSE;
  *what = 0;
  if ((rc = check_record(s, rec)) != IDEM_OK) return rc;
  r.kind = REQ_BEGIN;
  r.rec = rec;
  r.window = repeat_window_ms;
  r.coalesce = coalesce_ms;
  rc = submit(s, &r);
  *what = r.what;
  if (found)
    *found = r.out;
  else
    idem_record_free(r.out);
  return rc;
}

static int sq_insert(idem__store *st, const idem_record *rec, int *what,
                     idem_record **found) {
  wreq r;
  int rc;
  CHECK_STORE(s, st);
  if (found) *found = NULL;
  if (!what) return IDEM_MISUSE;
  *what = 0;
  if ((rc = check_record(s, rec)) != IDEM_OK) return rc;
  if (rec->state < IDEM_STATE_PENDING || rec->state > IDEM_STATE_DEDUPLICATED)
    return msg_set(s, IDEM_INVALID, "%s: a record in state %d", s->path,
                   rec->state);
  r.kind = REQ_INSERT;
  r.rec = rec;
  rc = submit(s, &r);
  *what = r.what;
  if (found)
    *found = r.out;
  else
    idem_record_free(r.out);
  return rc;
}

static int sq_change(idem__store *st, const idem__change *ch,
                     idem_record **now) {
  wreq r;
  int rc;
  CHECK_STORE(s, st);
  if (now) *now = NULL;
  if (!ch || !ch->session || !ch->call_id)
    return msg_set(s, IDEM_INVALID, "%s: a change without its action", s->path);
  if (!idem__change_in_range(ch))
    return msg_set(s, IDEM_INVALID, "%s: a change to state %d, resolution %d",
                   s->path, ch->state, ch->resolution);
  r.kind = REQ_CHANGE;
  r.ch = ch;
  rc = submit(s, &r);
  if (now)
    *now = r.out;
  else
    idem_record_free(r.out);
  return rc;
}

static int sq_gc(idem__store *st, long long now, size_t *n) {
  wreq r;
  int rc;
  CHECK_STORE(s, st);
  if (n) *n = 0;
  r.kind = REQ_GC;
  r.gc_now = now;
  rc = submit(s, &r);
  if (n) *n = r.gc_n;
  return rc;
}

static int sq_get(idem__store *st, const char *session, const char *call_id,
                  idem_record **out) {
  sqlite3_stmt *q = NULL;
  conn *c;
  char msg[MSG_MAX];
  int rc, step, own_w = 0;
  CHECK_STORE(s, st);
  if (!out) return IDEM_MISUSE;
  *out = NULL;
  if (!session || !call_id)
    return msg_set(s, IDEM_INVALID, "%s: get without session or call id",
                   s->path);
  /* When nobody holds the write connection and nothing waits for it, read
  ** through it: its cache holds what this process last wrote, where a
  ** reader's was made stale by that very write (and its pages are read
  ** from the WAL again).  It is taken like a batch, so no batch runs
  ** meanwhile, and given back like one. */
  pthread_mutex_lock(&s->mu);
  if (!s->writing && !s->ckpt_wait && !s->head && !s->stopping)
    own_w = s->writing = 1;
  pthread_mutex_unlock(&s->mu);
  if (own_w) {
    c = &s->w;
    conn_busy(s, c);
  } else if ((rc = reader_get(s, &c)) != IDEM_OK)
    return rc;
  if ((rc = stmt_get(s, c, S_GET, &q, msg, sizeof msg)) != IDEM_OK) {
    msg_set(s, rc, "%s", msg);
    goto done;
  }
  bind_str(q, 1, session);
  bind_str(q, 2, call_id);
  switch (step = sqlite3_step(q)) {
  case SQLITE_ROW:
    if (!(*out = row_record(q)))
      rc = msg_set(s, IDEM_NOMEM, "%s: out of memory", s->path);
    break;
  case SQLITE_DONE:
    rc = msg_set(s, IDEM_NOTFOUND, "%s: no record of (%.80s, %.80s)", s->path,
                 session, call_id);
    break;
  default: rc = msg_sql(s, c->db, step, "reading a record");
  }
  sqlite3_reset(q);
done:
  if (own_w) {
    pthread_mutex_lock(&s->mu);
    give_back(s);
    pthread_mutex_unlock(&s->mu);
  } else
    reader_put(s, c);
  return rc;
}

static int sq_fence(idem__store *st, const idem_record *rec,
                    long long window, long long coalesce, int turn_only,
                    idem_record **out) {
  sqlite3_stmt *q = NULL;
  conn *c;
  char msg[MSG_MAX];
  int rc, step;
  CHECK_STORE(s, st);
  if (!out || !rec) return IDEM_MISUSE;
  *out = NULL;
  if (!rec->fence_key)
    return msg_set(s, IDEM_NOTFOUND, "%s: no fence", s->path);
  if ((rc = reader_get(s, &c)) != IDEM_OK) return rc;
  if ((rc = stmt_get(s, c, S_FENCE, &q, msg, sizeof msg)) != IDEM_OK) {
    msg_set(s, rc, "%s", msg);
    goto done;
  }
  bind_fence(q, rec, window > 0 ? idem__wall_ms() - window : LLONG_MAX,
             coalesce, idem__wall_ms(), turn_only);
  switch (step = sqlite3_step(q)) {
  case SQLITE_ROW:
    if (!(*out = row_record(q)))
      rc = msg_set(s, IDEM_NOMEM, "%s: out of memory", s->path);
    break;
  case SQLITE_DONE:
    rc = msg_set(s, IDEM_NOTFOUND, "%s: nothing fences (%.80s, %.80s)",
                 s->path, rec->session, rec->call_id);
    break;
  default: rc = msg_sql(s, c->db, step, "checking the fence");
  }
  sqlite3_reset(q);
done:
  reader_put(s, c);
  return rc;
}

/* The listing of f's shape: cached on c (*tmp 0), or, past LIST_SLOTS
** shapes, prepared for this call (*tmp 1: finalize it after). */
static int list_stmt(sq_store *s, conn *c, const idem__filter *f,
                     sqlite3_stmt **out, int *tmp) {
  char sql[1200], msg[MSG_MAX];
  unsigned shape = idem__filter_shape(f);
  int i, rc;
  *tmp = 0;
  for (i = 0; i < c->nlist; i++)
    if (c->list_shape[i] == shape) {
      *out = c->list[i];
      return IDEM_OK;
    }
  if (idem__list_sql(sql, sizeof sql, shape, COLS, "attempts", '?', "", ""))
    return msg_set(s, IDEM_RANGE, "%s: a listing too long to build", s->path);
  *tmp = c->nlist == LIST_SLOTS;
  rc = sqlite3_prepare_v3(c->db, sql, -1,
                          *tmp ? 0 : SQLITE_PREPARE_PERSISTENT, out, NULL);
  if (rc != SQLITE_OK) {
    *out = NULL;
    rc = sql_msg(s, c->db, rc, "preparing a listing", msg, sizeof msg);
    return msg_set(s, rc, "%s", msg);
  }
  if (!*tmp) {
    c->list[c->nlist] = *out;
    c->list_shape[c->nlist++] = shape;
  }
  return IDEM_OK;
}

static int sq_list(idem__store *st, const idem__filter *f, idem__record_cb cb,
                   void *ctx) {
  idem__filter all;
  idem__list_params p;
  sqlite3_stmt *q = NULL;
  idem_record *r;
  conn *c;
  int rc, step, stop, i, tmp = 0;
  CHECK_STORE(s, st);
  if (!cb) return IDEM_MISUSE;
  memset(&all, 0, sizeof all);
  if (!f) f = &all;
  if (f->states && !(f->states & 0x7eu)) return IDEM_OK; /* bits 1 .. 6 */
  if ((rc = reader_get(s, &c)) != IDEM_OK) return rc;
  if ((rc = list_stmt(s, c, f, &q, &tmp)) != IDEM_OK) goto done;
  idem__list_params_of(f, &p);
  for (i = 0; i < p.n - 1; i++)
    if (i == p.after)
      sqlite3_bind_int64(q, i + 1, p.after_created);
    else
      bind_str(q, i + 1, p.v[i]);
  sqlite3_bind_int64(q, p.n, p.limit);
  while ((step = sqlite3_step(q)) == SQLITE_ROW) {
    if (!(r = row_record(q))) {
      rc = msg_set(s, IDEM_NOMEM, "%s: out of memory", s->path);
      break;
    }
    stop = cb(r, ctx);
    idem_record_free(r);
    if (stop) break; /* the caller has seen enough: not an error */
  }
  if (step != SQLITE_ROW && step != SQLITE_DONE)
    rc = msg_sql(s, c->db, step, "listing records");
  if (tmp)
    sqlite3_finalize(q);
  else
    sqlite3_reset(q);
done:
  reader_put(s, c);
  return rc;
}

static int sq_stats(idem__store *st, long long counts[8]) {
  sqlite3_stmt *q = NULL;
  conn *c;
  char msg[MSG_MAX];
  int rc, step, state;
  CHECK_STORE(s, st);
  if (!counts) return IDEM_MISUSE;
  memset(counts, 0, 8 * sizeof *counts);
  if ((rc = reader_get(s, &c)) != IDEM_OK) return rc;
  if ((rc = stmt_get(s, c, S_STATS, &q, msg, sizeof msg)) != IDEM_OK) {
    msg_set(s, rc, "%s", msg);
    goto done;
  }
  while ((step = sqlite3_step(q)) == SQLITE_ROW) {
    state = sqlite3_column_int(q, 0);
    if (state >= 1 && state <= 7) counts[state] = sqlite3_column_int64(q, 1);
    counts[0] += sqlite3_column_int64(q, 1);
  }
  if (step != SQLITE_DONE) rc = msg_sql(s, c->db, step, "counting records");
  sqlite3_reset(q);
done:
  reader_put(s, c);
  return rc;
}

static int sq_tally(idem__store *st, idem_tally_fn cb, void *ctx) {
  sqlite3_stmt *q = NULL;
  idem_tally t;
  conn *c;
  char msg[MSG_MAX];
  int rc, step;
  CHECK_STORE(s, st);
  if (!cb) return IDEM_MISUSE;
  if ((rc = reader_get(s, &c)) != IDEM_OK) return rc;
  if ((rc = stmt_get(s, c, S_TALLY, &q, msg, sizeof msg)) != IDEM_OK) {
    msg_set(s, rc, "%s", msg);
    goto done;
  }
  while ((step = sqlite3_step(q)) == SQLITE_ROW) {
    memset(&t, 0, sizeof t);
    t.size = sizeof t;
    t.tool = (const char *)sqlite3_column_text(q, 0);
    t.state = sqlite3_column_int(q, 1);
    t.resolution = sqlite3_column_int(q, 2);
    t.records = sqlite3_column_int64(q, 3);
    t.attempts = sqlite3_column_int64(q, 4);
    t.checks = sqlite3_column_int64(q, 5);
    t.oldest = sqlite3_column_int64(q, 6);
    if (cb(ctx, &t)) break;
  }
  if (step != SQLITE_ROW && step != SQLITE_DONE)
    rc = msg_sql(s, c->db, step, "counting records");
  sqlite3_reset(q);
done:
  reader_put(s, c);
  return rc;
}

static const char *sq_errmsg(idem__store *st) {
  return st && tls_store == (const void *)st ? tls_msg : "";
}

static void sq_close(idem__store *st) {
  sq_store *s = (sq_store *)st;
  if (!st || st->vt != &sqlite_vt || s->magic != SQ_MAGIC) return;
  if (forked(s)) return; /* a forked child: abandon (see FORK) */
  sq_destroy(s);
}

static const idem__store_vt sqlite_vt = {
    .scheme = "sqlite",
    .now = sq_now,
    .begin = sq_begin,
    .insert = sq_insert,
    .get = sq_get,
    .fence = sq_fence,
    .change = sq_change,
    .change_many = sq_change_many,
    .list = sq_list,
    .gc = sq_gc,
    .stats = sq_stats,
    .tally = sq_tally,
    .errmsg = sq_errmsg,
    .close = sq_close,
};

/* ---- knobs ----------------------------------------------------------------- */

int idem__sqlite_config(idem__store *st, int op, long long value) {
  sq_store *s = (sq_store *)st;
  if (st && (st->vt != &sqlite_vt || s->magic != SQ_MAGIC)) return IDEM_MISUSE;
  switch (op) {
  case IDEM__SQLITE_BUSY_TIMEOUT:
    if (!st) return IDEM_MISUSE;
    if (value < 0 || value > INT_MAX) return IDEM_RANGE;
    atomic_store(&s->busy_ms, (int)value);
    return IDEM_OK;
  case IDEM__SQLITE_FAIL_SYNC:
  case IDEM__SQLITE_FAIL_WRITE:
    if (value < 0) return IDEM_RANGE;
    idem__fault_arm(op == IDEM__SQLITE_FAIL_SYNC, value);
    return IDEM_OK;
  case IDEM__SQLITE_FAULT_VFS:
    if (value != 0 && value != 1) return IDEM_RANGE;
    idem__fault_vfs_enable((int)value);
    return IDEM_OK;
  default: return IDEM_INVALID;
  }
}

long long idem__sqlite_count(idem__store *st, int which) {
  sq_store *s = (sq_store *)st;
  if (which == IDEM__SQLITE_COUNT_SYNCS) return idem__fault_syncs();
  if (which == IDEM__SQLITE_COUNT_WAL_APPENDS) return idem__vfs_wal_count(0);
  if (which == IDEM__SQLITE_COUNT_WAL_WRITES) return idem__vfs_wal_count(1);
  if (!st || st->vt != &sqlite_vt || s->magic != SQ_MAGIC) return -1;
  switch (which) {
  case IDEM__SQLITE_COUNT_BATCHES: return atomic_load(&s->batches);
  case IDEM__SQLITE_COUNT_REQUESTS: return atomic_load(&s->requests);
  case IDEM__SQLITE_COUNT_CHECKPOINTS: return atomic_load(&s->checkpoints);
  default: return -1;
  }
}
