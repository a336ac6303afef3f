/*
** idemInt.h - the one private header of libidem.
**
** Everything declared here is internal: names are idem__ (two underscores),
** symbols are hidden by -fvisibility=hidden, and nothing here is API.  The
** public contract is include/idem.h alone.
*/
#ifndef IDEM_INT_H
#define IDEM_INT_H

#include <stddef.h>
#include <stdint.h>

#include "idem.h"

#define IDEM__MAGIC_DEAD 0xdeadbeefu

/* The largest result kept in a record, as JSON (the envelope's buffer holds
** it with room to spare); a larger one is recorded as a note saying so. */
#define IDEM__MAX_RESULT ((size_t)16 << 20)

#if defined(__GNUC__)
#define IDEM__LIKELY(x) __builtin_expect(!!(x), 1)
#define IDEM__UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define IDEM__LIKELY(x) (x)
#define IDEM__UNLIKELY(x) (x)
#endif

#if defined(__GNUC__) && __GNUC__ >= 7
#define IDEM__FALLTHROUGH __attribute__((fallthrough))
#else
#define IDEM__FALLTHROUGH ((void)0)
#endif

/* ---- alloc.c: the one place all heap use goes through ------------------ */

void *idem__malloc(size_t n);
void *idem__realloc(void *p, size_t n);
void idem__free(void *p);
/* Copies through idem__malloc, NUL-terminated; NULL when s is NULL or
** memory ran out. */
char *idem__strndup(const char *s, size_t n);
char *idem__strdup(const char *s);

/* ---- abi.c: the structs of idem.h that carry their size ----------------- */

/* A sized struct from the caller: *dst (dsize bytes, this version's) is
** zeroed, then what the caller's struct at src holds is copied over it.
** IDEM_MISUSE when src is NULL or its size is below min. */
int idem__abi_in(void *dst, size_t dsize, const void *src, size_t min);
/* A sized struct for the caller: what of src (ssize bytes) fits the
** caller's size is copied to dst, its size field kept.  IDEM_MISUSE when
** dst is NULL or its size is below min. */
int idem__abi_out(void *dst, const void *src, size_t ssize, size_t min);
/* The smallest size of each: its first layout (0.3.0's), which is this
** version's but for idem_call and idem_filter. */
#define IDEM__ABI_MIN(type) sizeof(type)
/* idem_call grew own_check in 0.4.0: its first layout ends before it. */
#define IDEM__CALL_MIN offsetof(idem_call, own_check)
/* idem_filter grew call_id and what follows in 0.5.0. */
#define IDEM__FILTER_MIN offsetof(idem_filter, call_id)

/* ---- clock.c: the clocks and the one sleep -------------------------------- */

struct timespec;
/* Milliseconds since the epoch (CLOCK_REALTIME): what records carry. */
long long idem__wall_ms(void);
/* How far after now a time read from the log may lie and still be taken
** as read on the clock now reads (a shared store's estimate of its
** server's clock is off by half a round trip): further, the clock has
** stepped back since it was written, and the time says nothing of which
** came first (docs/FAILURES.md, "Clock steps"). */
#define IDEM__CLOCK_SLACK_MS 1000
/* Milliseconds of CLOCK_MONOTONIC: what waits and deadlines count in. */
long long idem__mono_ms(void);
/* Microseconds of CLOCK_MONOTONIC: short waits awake. */
long long idem__mono_us(void);
/* *at = CLOCK_MONOTONIC now + ms (for pthread_cond_timedwait on a
** condition variable set to CLOCK_MONOTONIC). */
void idem__mono_after(long long ms, struct timespec *at);
/* Sleep ms milliseconds, through signals. */
void idem__sleep_ms(long long ms);

/* ---- buf.c: growable byte buffers with a hard cap ------------------------ */

/*
** A byte buffer that grows geometrically up to `cap` bytes and never beyond:
** asking for more is IDEM_RANGE, failing to allocate is IDEM_NOMEM, and in
** both cases the contents so far are kept.  (curl's dynbuf is the model.)
*/
typedef struct idem__buf {
  char *p;      /* the bytes (NULL until the first growth)   */
  size_t len;   /* bytes in use                              */
  size_t alloc; /* bytes allocated                           */
  size_t cap;   /* the most this buffer may ever allocate    */
} idem__buf;

void idem__buf_init(idem__buf *b, size_t cap);
void idem__buf_free(idem__buf *b);
/* Make room for `more` bytes past len.  Fast when there is room already. */
int idem__buf_grow(idem__buf *b, size_t more);
static inline int idem__buf_reserve(idem__buf *b, size_t more) {
  return IDEM__LIKELY(b->alloc - b->len >= more) ? IDEM_OK
                                                 : idem__buf_grow(b, more);
}
int idem__buf_append(idem__buf *b, const void *src, size_t n);

/* ---- canon.h: the canonicalizer's workspace, for the modules that build
** on it (key.c, guard.c, envelope.c); the rest of the library sees
** idem_canon as the public header does: opaque. -----------------------------
 */

/* ---- policy.c: the parsed policy ----------------------------------------- */

/* How a status check decides "applied" from its result. */
enum {
  IDEM__APPLIED_WHEN_KEY_PRESENT = 1, /* the key appears as a string value */
  IDEM__APPLIED_WHEN_POINTER = 2,     /* the value at pointer == equals    */
  IDEM__APPLIED_WHEN_KEY_AT = 3       /* the key appears under pointer     */
};

typedef struct idem__status_rule {
  char *tool;       /* status tool (MCP, HTTP), or NULL                   */
  char *arguments;  /* canonical JSON template: a string "{name}" stands  */
                    /* for argument `name`, "{$key}" for the key; or NULL */
  char *command;    /* for idem exec: a shell command, or NULL            */
  int applied_when; /* IDEM__APPLIED_WHEN_*                               */
  char *pointer;    /* RFC 6901 JSON pointer, with _POINTER and _KEY_AT   */
  char *equals;     /* canonical JSON value, with _POINTER                */
  int sends_key;    /* the status request carries "{$key}" (arguments)    */
} idem__status_rule;

#define IDEM__MAX_EXIT_CODES IDEM_MAX_EXIT_CODES

/*
** An HTTP tool (docs/POLICY.md, "http"): the request idem makes for it.
** url and the header values are templates: "{name}" is the call's argument
** `name` (percent-encoded in the URL), "{$key}" the key, "{$env:NAME}" an
** environment variable of the harness.
*/
typedef struct idem__http_rule {
  char *method;  /* "GET", "POST", "PUT", "PATCH" or "DELETE"      */
  char *url;     /* http:// or https:// template                   */
  char **hname;  /* extra headers: names ...                       */
  char **hvalue; /* ... and value templates                        */
  size_t nheaders;
  char *key_header; /* guarded: the header carrying the key, or NULL  */
  int send_body;    /* the arguments are the JSON body                */
  int on_409;       /* enum idem_outcome of 409, 429 and 5xx answers  */
  int on_429;       /* (IDEM_OUTCOME_UNKNOWN unless the policy says)  */
  int on_5xx;
} idem__http_rule;

/* Everything the policy says about one tool, defaults filled in. */
typedef struct idem__tool_rule {
  char *name;
  int cls;                      /* enum idem_class                    */
  int64_t timeout_ms;           /* downstream deadline (30000)        */
  int64_t retries;              /* transport retries (2)              */
  int64_t backoff_ms;           /* first retry delay, doubling (200)  */
  int64_t reconcile_timeout_ms; /* bound on reconciling (timeout_ms)  */
  int64_t wait_ms;              /* waiting on another owner (2000)    */
  int64_t settle_ms;            /* an attempt may land this long after */
                                /* its deadline or executor's death;  */
                                /* -1: no bound (the default)         */
  int provider_dedupes;         /* the provider honours the key (0)   */
  int64_t provider_key_ttl_s;   /* ... for this long (86400)          */
  char *key_arg;                /* argument that carries the key      */
  size_t key_max_len;           /* 255                                */
  char **fence;                 /* argument names scoping the fence;  */
  size_t nfence;                /* none: the whole fingerprint        */
  int fence_global;             /* fence_scope "global" (0: session)  */
  int64_t repeat_window_s;      /* told outcomes still fence (0)      */
  int64_t coalesce_ms;          /* identical calls without a turn id  */
                                /* this close count as one turn (1000) */
  int64_t retention_s;          /* records kept this long (604800)    */
  int has_status;
  idem__status_rule status;
  int on_is_error; /* MCP: a result with isError true means this (an */
                   /* enum idem_outcome; IDEM_OUTCOME_UNKNOWN)       */
  int has_http; /* an HTTP tool: run by `idem call` and `idem demo` */
  idem__http_rule http;
  /* exec: exit codes that mean applied / not applied / rejected */
  int exit_applied[IDEM__MAX_EXIT_CODES], n_exit_applied;         /* 0   */
  int exit_not_applied[IDEM__MAX_EXIT_CODES], n_exit_not_applied; /* 100 */
  int exit_rejected[IDEM__MAX_EXIT_CODES], n_exit_rejected;       /* 101 */
} idem__tool_rule;

#define IDEM__POLICY_MAGIC 0x1de3901cu

struct idem_policy {
  unsigned magic;
  int unknown_tools;      /* IDEM_CLASS_REFUSED/GUARDED/READ_ONLY */
  idem__tool_rule *tools; /* sorted by name                       */
  size_t ntools;
  char **warnings; /* things valid but likely wrong (idem_policy_warning) */
  size_t nwarnings;
  int err;
  char errmsg[300];
};

/* name case folded and in Unicode NFC (fold.c), *len bytes; free with
** idem__free.  NULL when memory ran out. */
char *idem__name_fold(const char *name, size_t *len);

/* What a status tool's result says under the rule's applied_when (verdict.c):
** IDEM_OUTCOME_APPLIED, _NOT_APPLIED, or _UNKNOWN when it is not JSON. */
int idem__status_verdict(const idem__status_rule *s, const char *key,
                         const char *result, size_t len);

/* How long a lease on an action of tool r lasts: every attempt and
** reconciling within it, and ten seconds more. */
long long idem__lease_ms(const idem__tool_rule *r);

/* Fill r with the defaults for a guarded tool called name (not copied). */
void idem__rule_defaults(idem__tool_rule *r, const char *name);

/*
** The rule for tool under p: the policy's own, or for a tool the policy does
** not name, the defaults with the class of unknown_tools (p == NULL: the
** defaults, guarded).  The result is borrowed from p, or is *scratch.
*/
const idem__tool_rule *idem__policy_rule(const idem_policy *p, const char *tool,
                                         idem__tool_rule *scratch);

/* ---- store/: the attempt log behind a small vtable ------------------------ */

/*
** A store keeps records (idem_record) with the semantics of SPEC §5; the
** guard (guard.c) decides, the store only applies atomic steps.  Every
** entry point is safe to call from many threads at once on one store, and
** from many processes on one log.  Backends: store/sqlite.c (sqlite:PATH),
** store/pg.c (postgres://...).  Strings passed in are copied; records returned are
** new (free with idem_record_free).
*/
typedef struct idem__store idem__store;

/* What begin found. */
enum {
  IDEM__BEGIN_INSERTED = 1, /* new pending record, durable on return  */
  IDEM__BEGIN_FOUND = 2,    /* (session, call) exists: *found         */
  IDEM__BEGIN_FENCED = 3    /* an action in the fence scope fences it */
};

/*
** A conditional change of one record (compare-and-set).  It applies only
** when the record's state is in `from` (a bit mask of 1 << IDEM_STATE_*)
** and, if expect_token >= 0, its token equals expect_token.  Fields with
** the "keep" value are left alone.
*/
typedef struct idem__change {
  const char *session, *call_id;
  unsigned from;          /* allowed current states                     */
  long long expect_token; /* -1: any                                    */
  int state;              /* new state, 0: keep                         */
  int attempts_add;       /* added to attempts                          */
  int take_lease;         /* IDEM__LEASE_TAKE: set owner/lease_until and */
  const char *owner;      /* token = token+1; IDEM__LEASE_HAND: set them */
  long long lease_until;  /* alone (a hand-over or a renewal)            */
  const char *result;  /* NULL: keep                                 */
  const char *error;   /* NULL: keep                                 */
  int resolution;      /* 0: keep                                    */
  long long delivered; /* when the model was told; -1: keep */
  int durable;         /* synced before return (else a later sync)   */
  /* The attempt that may still land (SPEC §6a): exec_set IDEM__EXEC_SET
  ** sets executor, pgid and settle_from (an attempt starts);
  ** IDEM__EXEC_CLEAR clears all three (it has a verdict: nothing of it can
  ** land); IDEM__EXEC_ENDED clears executor and pgid and lowers
  ** settle_from to the settle_from given (sets it, when it was 0): the
  ** attempt ended then WITHOUT a verdict and may still land until the
  ** tool's settle_ms has passed.  settle_cap > 0 lowers settle_from to it
  ** while an executor is set (its death was seen then).  There is one
  ** such attempt at most: the guard starts no attempt while an earlier one
  ** may still land. */
  int exec_set;
  const char *executor;
  long long pgid;
  long long settle_from;
  long long settle_cap;
  const char *duplicate_of; /* NULL: keep                                */
  /* Non-NULL: only while the record's owner is still this one.  A takeover
  ** of a pending record whose holder was judged gone names that holder:
  ** a lease handed on meanwhile (a runner giving it back to its front end
  ** before it exits) keeps the token, so the token alone cannot tell. */
  const char *expect_owner;
  /* Non-NULL: an operator's verdict (SPEC §9), given by this person; the
  ** store records when (its own clock).  Refused on a terminal record. */
  const char *resolved_by;
  /* > 0: a settling change (an outcome, a late result, a verdict): the
  ** record is kept until then at least - its retention counts from now
  ** (SPEC §5), and a later expiry stays; 0: keep.  A record kept forever
  ** (expires 0) stays so. */
  long long expires;
  /* Non-NULL: the status check the model is told to run (check_with). */
  const char *check_with;
  /* A status check's answer (an IDEM_OUTCOME_*): last_check is its name
  ** (idem__check_name), checked_at the store's clock, checks grows by
  ** one; 0: keep.  Refused on a terminal record, like a verdict. */
  int check;
} idem__change;

enum { IDEM__LEASE_TAKE = 1, IDEM__LEASE_HAND = 2 };
enum { IDEM__EXEC_SET = 1, IDEM__EXEC_CLEAR = 2, IDEM__EXEC_ENDED = 3 };

/* What to list, in the order created, session, call_id. */
typedef struct idem__filter {
  const char *session; /* NULL: all sessions                         */
  unsigned states;     /* bit mask of 1 << IDEM_STATE_*; 0: all      */
  size_t limit;        /* 0: no limit                                */
  const char *fence_key; /* non-NULL: only that fence key's (the fence's */
                         /* index: a few records, not a session's)       */
  const char *call_id, *key, *tool; /* exact matches; NULL: any        */
  /* after_created > 0: only the records after (after_created,
  ** after_session, after_call_id) in the listing's order (NULL: "") */
  long long after_created;
  const char *after_session, *after_call_id;
} idem__filter;

/* What of a filter shapes a listing's SQL (the stores cache a statement
** per shape): which of the optional conditions it has, and the states. */
enum {
  IDEM__BY_SESSION = 1,
  IDEM__BY_FENCE = 2,
  IDEM__BY_CALL = 4,
  IDEM__BY_KEY = 8,
  IDEM__BY_TOOL = 16,
  IDEM__BY_AFTER = 32
};
/* f's IDEM__BY_* bits, and its states (bits 1 .. 6) shifted past them. */
unsigned idem__filter_shape(const idem__filter *f);
/* The SQL of a listing of that shape into buf (n bytes): SELECT cols FROM
** table WHERE ... ORDER BY created, session, call_id LIMIT p.  Its
** parameters are numbered in the order of idem__list_params, written
** as mark, number, cast: '?' and "" ("?3"), '$' and "::text" ("$3::text")
** for text, int_cast for an integer.  IDEM_RANGE when buf is too small. */
int idem__list_sql(char *buf, size_t n, unsigned shape, const char *cols,
                   const char *table, char mark, const char *text_cast,
                   const char *int_cast);
/* The values of a listing's parameters, in order: text, but for the one
** at index after (after_created; -1: none) and the last (the limit,
** `limit`, -1 for none), whose text is in num (NULL: no limit). */
typedef struct idem__list_params {
  const char *v[9];
  int n, after;
  long long after_created, limit;
  char num[2][24];
} idem__list_params;
void idem__list_params_of(const idem__filter *f, idem__list_params *p);

/* The SQL both stores run for idem_guard_tally, over table. */
#define IDEM__TALLY_SQL(table)                                                 \
  "SELECT tool, state, resolution, count(*), sum(attempts), sum(checks),"      \
  " min(created) FROM " table " GROUP BY tool, state, resolution"             \
  " ORDER BY tool, state, resolution"
/* The name a status check's answer (IDEM_OUTCOME_*) is recorded by, or
** NULL for 0 and any other value. */
const char *idem__check_name(int outcome);

typedef int (*idem__record_cb)(const idem_record *r, void *ctx);

typedef struct idem__store_vt {
  const char *scheme; /* "sqlite" */
  /* The store's clock, milliseconds since the epoch (a shared store uses
  ** the server's clock, so leases mean the same to every host). */
  int (*now)(idem__store *st, long long *ms);
  /*
  ** Atomically: if (rec->session, rec->call_id) exists, FOUND and *found;
  ** else if rec->fence_key is set and another action with that fence_key
  ** is PENDING or IN_DOUBT, or SUCCEEDED and (not
  ** delivered, or delivered after rec->created - the new call was made
  ** before the model was told, as parallel calls of one turn are; in the
  ** same millisecond counts as after, for the answer is handed over only
  ** once its delivery is recorded; a delivery more than
  ** IDEM__CLOCK_SLACK_MS after now does not count, the clock stepped back
  ** since - or created at or after now - repeat_window_ms), or SUCCEEDED
  ** or DEDUPLICATED and of the same model turn (rec names it and it is the
  ** same, or rec names none and it was created within coalesce_ms, when
  ** > 0, of rec->created, before or after), FENCED and
  ** *found = the newest such; else insert rec (state PENDING, token 1) and
  ** sync it to disk before returning INSERTED.
  */
  int (*begin)(idem__store *st, const idem_record *rec,
               long long repeat_window_ms, long long coalesce_ms, int *what,
               idem_record **found);
  /* Insert rec as it is (a DEDUPLICATED record); IDEM__BEGIN_FOUND and
  ** *found when the action exists already. */
  int (*insert)(idem__store *st, const idem_record *rec, int *what,
                idem_record **found);
  int (*get)(idem__store *st, const char *session, const char *call_id,
             idem_record **out); /* IDEM_NOTFOUND */
  /* The action that fences rec, by begin's rule, when rec exists already
  ** (an action about to run again must not repeat one that a later call
  ** carried out): *found, or IDEM_NOTFOUND.  turn_only: only an action of
  ** rec's turn. */
  int (*fence)(idem__store *st, const idem_record *rec,
               long long repeat_window_ms, long long coalesce_ms,
               int turn_only, idem_record **found);
  /* Apply ch if its condition holds: IDEM_OK and *now the record after it;
  ** IDEM_STALE and *now the record as it is; IDEM_NOTFOUND.  now may be
  ** NULL. */
  int (*change)(idem__store *st, const idem__change *ch, idem_record **now);
  /* Apply n changes, each as change would, in as few transactions as the
  ** store can: rcs[i] is each one's result (IDEM_OK / IDEM_STALE / ...).
  ** Returns the first failure other than IDEM_STALE. */
  int (*change_many)(idem__store *st, const idem__change *chs, size_t n,
                     int *rcs);
  int (*list)(idem__store *st, const idem__filter *f, idem__record_cb cb,
              void *ctx);
  /* Delete terminal records whose expires < now; *n deleted. */
  int (*gc)(idem__store *st, long long now, size_t *n);
  /* Count records per state: counts[IDEM_STATE_*]. */
  int (*stats)(idem__store *st, long long counts[8]);
  /* The records grouped by tool, state and resolution, one cb per group
  ** in that order (t->size set; strings borrowed); cb nonzero stops. */
  int (*tally)(idem__store *st, idem_tally_fn fn, void *ctx);
  const char *(*errmsg)(idem__store *st);
  void (*close)(idem__store *st);
} idem__store_vt;

struct idem__store {
  const idem__store_vt *vt;
};

/* Open the store a URL names ("sqlite:PATH"); *out is set even on failure
** when memory allowed, so its errmsg can be read. */
int idem__store_open(const char *url, idem__store **out);
int idem__sqlite_open(const char *path, idem__store **out);
/* store/pg.c: url is any libpq connection string. */
int idem__pg_open(const char *url, idem__store **out);
/* url as messages show it (idem__store_shown_url), and a URI's whole query
** string hidden when libpq's own parse finds a password in it under any
** spelling it reads as one (a percent-escaped key). */
void idem__pg_shown(const char *url, char *buf, size_t size);
/* The NOT NULL field that rec lacks ("the record" when rec is NULL), or
** NULL when it has them all. */
const char *idem__record_missing(const idem_record *rec);
/* Are ch's state and resolution ones a change may set? */
int idem__change_in_range(const idem__change *ch);
/* url as messages show it: a password in it replaced by *** (into buf). */
void idem__store_shown_url(const char *url, char *buf, size_t size);

/* store/vfs.c: the VFS "idem" of the SQLite store (see there).  vfs():
** its name, registered at the first call (NULL when it cannot be, and the
** default VFS serves); fault_vfs_enable(): whether files opened from now on
** take faults; fault_arm(): fail the next n syncs (sync != 0) or writes of
** such files; fault_syncs(): the syncs they have seen; vfs_wal_count(): the
** WAL writes SQLite made (0) or the file got (1), in all stores. */
const char *idem__vfs(void);
void idem__fault_vfs_enable(int on);
void idem__fault_arm(int sync, long long n);
long long idem__fault_syncs(void);
long long idem__vfs_wal_count(int file_writes);

/* The deadline of the call this thread is deciding, on the monotonic
** clock (idem__mono_ms), 0 for none: a store that retries a request on a
** lost connection gives up by then (or IDEM__STORE_MIN_RETRY_MS after the
** request began, when that is later) instead of holding the caller for
** its own limit.  Set by the guard around a step's store calls (store/
** common.c keeps it per thread). */
#define IDEM__STORE_MIN_RETRY_MS 2000
void idem__store_deadline_set(long long mono_ms);
long long idem__store_deadline(void);

/* A store that could not be opened: errmsg says why (printf-style fmt),
** every other entry point fails with IDEM_MISUSE, close frees it.  Sets
** *out (NULL when even that could not be allocated) and returns rc. */
int idem__store_fail(idem__store **out, int rc, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* record.c: a deep copy of r, every string copied; NULL when memory ran
** out.  Free with idem_record_free. */
idem_record *idem__record_dup(const idem_record *r);

/*
** store/sqlite.c: knobs for tests and tuning, not API.
** idem__sqlite_config(st, op, value) sets one.  BUSY_TIMEOUT needs a SQLite
** store; the fault ops are process-wide (the VFS is: st may be NULL) and
** act only on stores opened while FAULT_VFS is on (store/vfs.c).  Returns
** IDEM_OK, IDEM_RANGE, IDEM_INVALID (unknown op) or IDEM_MISUSE.
*/
enum {
  IDEM__SQLITE_BUSY_TIMEOUT = 1, /* ms to wait for another writer (5000) */
  IDEM__SQLITE_FAIL_SYNC = 2,    /* the next N syncs (xSync) fail         */
  IDEM__SQLITE_FAIL_WRITE = 3,   /* the next N writes (xWrite) fail       */
  IDEM__SQLITE_FAULT_VFS = 4     /* st NULL: later opens in this process  */
                                 /* take faults (1) or not (0)            */
};
int idem__sqlite_config(idem__store *st, int op, long long value);

/* Counters of a SQLite store (syncs: process-wide, files with faults only;
** WAL appends and writes: process-wide). */
enum {
  IDEM__SQLITE_COUNT_BATCHES = 1,     /* write transactions committed     */
  IDEM__SQLITE_COUNT_REQUESTS = 2,    /* write requests applied           */
  IDEM__SQLITE_COUNT_SYNCS = 3,       /* xSync calls of files with faults  */
  IDEM__SQLITE_COUNT_CHECKPOINTS = 4, /* WAL checkpoints run by the writer */
  IDEM__SQLITE_COUNT_WAL_APPENDS = 5, /* WAL writes SQLite made (process) */
  IDEM__SQLITE_COUNT_WAL_WRITES = 6   /* ... and the file got (process)   */
};
long long idem__sqlite_count(idem__store *st, int which);

/* ---- owner.c: lease holders and crash points ----------------------------- */

/* "HOST:PID:START" of this process. */
void idem__owner_self(char *buf, size_t n);
/* 1: the owner is a live process; 0: a process of this machine that is
** gone; -1: cannot tell (another machine, a malformed owner). */
int idem__owner_alive(const char *owner);
/* idem_process_group_empty() and idem_crash_point() are public (idem.h). */

/* ---- dl.c: optional libraries, loaded on first use ----------------------- */

/* A library that a module loads with dlopen() (the pattern is in dl.c). */
typedef struct idem__dl_lib {
  const char *name;    /* for messages: "libpq"                          */
  const char *file;    /* what dlopen() loads: "libpq.so.5"              */
  const char *env;     /* a variable naming another file: "IDEM_LIBPQ"   */
  const char *package; /* what to install when it is missing: "libpq5"   */
  const char *const *names; /* the functions to look up, n of them      */
  void **sym;               /* where their addresses go (a table's .sym) */
  size_t n;
  /* run once after loading (curl_global_init): 0, or -1 with the reason */
  int (*init)(char *err, size_t errn);
  int tried;          /* dl.c's, under its lock: loading was tried     */
  char missing[300];  /* why the library cannot be used; "" when it can */
} idem__dl_lib;

/* NULL when lib is loaded, else why not, to follow "needs ": "libpq
** (libpq.so.5: cannot open shared object file: ...); install the package
** libpq5".  The first call loads it; thread-safe; the outcome is kept. */
const char *idem__dl_need(idem__dl_lib *lib);

/* The table of a library's functions that FUNCS(X) lists: .f.NAME is a
** pointer of the function's own type, .sym the same pointers as dl.c
** fills them (the POSIX rule that makes dlsym work: a function pointer and
** a void * have one representation). */
#define IDEM__DL_TABLE(FUNCS)                                                  \
  union {                                                                      \
    struct {                                                                   \
      FUNCS(IDEM__DL_FIELD)                                                    \
    } f;                                                                       \
    void *sym[0 FUNCS(IDEM__DL_ONE)];                                          \
  }
#define IDEM__DL_FIELD(f) __typeof__(f) *f;
#define IDEM__DL_ONE(f) +1
#define IDEM__DL_NAME(f) #f,

/* ---- guard.c: shared with the command ------------------------------------ */

/* The attempt log when none is named: $IDEM_LOG, else
** sqlite:$XDG_STATE_HOME/idem/attempts.db, else under ~/.local/state.
** Returns env's value or buf. */
const char *idem__default_log(char *buf, size_t n);
/* ---- envelope.c: the answer to the model --------------------------------- */

typedef struct idem__env {
  int answer; /* enum idem_answer              */
  const char *tool, *call_id;
  const char *key; /* or NULL                       */
  int replayed, attempts;
  const char *result;       /* JSON text, or NULL            */
  const char *message;      /* or NULL                       */
  const char *check_tool;   /* check_with, or NULL           */
  const char *check_args;   /* canonical JSON object         */
  const char *duplicate_of; /* or NULL                       */
} idem__env;

/* Write the envelope into b (reset first; NUL-terminated, not counted). */
int idem__envelope(idem__buf *b, const idem__env *e);
/* Append the check_with object {"tool":T,"arguments":A} to b, as the
** envelope and the record (idem_record.check_with) carry it: A the
** canonical arguments (NULL: {}). */
int idem__check_with(idem__buf *b, const char *tool, const char *args);

/* ---- metrics.c: this process's counters (idem_metrics_read) ------------- */

enum {
  IDEM__M_ATTEMPTS, /* a downstream attempt of a guarded action starts */
  IDEM__M_COALESCED, /* a call answered as a repeat of one of its turn */
  IDEM__M_LATE,     /* a late result recorded                        */
  IDEM__M_RESOLVED, /* an operator's verdict recorded                */
  IDEM__M_N
};
void idem__metric_add(int which);
/* A status check answered outcome (enum idem_outcome). */
void idem__metric_check(int outcome);
/* A step reached its answer (enum idem_answer) us microseconds after it
** began; replayed, and fenced (it names another call as the one whose
** outcome it is: duplicate_of). */
void idem__metric_answer(int answer, int replayed, int fenced, long long us);

/* ---- dtoa.c: shortest round-trip doubles in ECMAScript form -------------- */

/* Longest text idem__dtoa() writes ("-1.2345678901234567e-308" is 24). */
#define IDEM__DTOA_MAX 32

/*
** Write the ECMAScript Number::toString form of the finite double v into
** buf (at least IDEM__DTOA_MAX bytes, not NUL-terminated) and return its
** length.  The digits are the shortest that round-trip; -0 gives "0".
** v must not be NaN or infinite (the canonicalizer rejects those first).
*/
size_t idem__dtoa(double v, char *buf);

/* strtod.c: the double nearest to m * 10^e10 (m < 10^19 exactly, the
** literal's first 19 significant digits; truncated = 1 when non-zero digits
** were dropped after them), correctly rounded (ties to even); returns 1 and
** sets *out when it could decide, 0 when the caller must fall back to
** strtod_l.  Out-of-range exponents give +-0 or +-inf, exactly. */
int idem__decimal_to_double(uint64_t m, int e10, int truncated, int neg,
                            double *out);

/* ---- template.c: the policy's templates (one engine) ---------------------- */

/* Canonicalize the arguments args (a JSON object text of len bytes; NULL:
** {}) into c, for the fills below, which read them out of c until its next
** use.  IDEM_OK, an IDEM_JSON_* code or IDEM_NOT_OBJECT (the message on c). */
int idem__tmpl_args(idem_canon *c, const char *args, size_t len);

/* The canonical value of the top-level argument [name, name+n) of the
** arguments in c (idem__tmpl_args, or any canonicalization of an object):
** 1 and [*v, *v+*vlen) borrowed from c, or 0 when there is none. */
int idem__tmpl_arg(const idem_canon *c, const char *name, size_t n,
                   const char **v, size_t *vlen);

/* How a text template is filled. */
enum {
  IDEM__TMPL_URL = 1,   /* arguments and the key percent-encoded        */
  IDEM__TMPL_HEADER = 2 /* as is; no control character but a tab       */
};

/* Append text template tmpl, filled, to b: "{name}" is the argument's
** canonical RFC 8785 text (a string's characters; a number, true, false,
** null as written canonically), "{$key}" the key (NULL: none), "{$env:NAME}"
** the environment variable.  IDEM_OK; IDEM_INVALID with the reason in err
** (a missing argument or variable, an object, a control character in a
** header, a "." or ".." path segment of a URL's path);
** IDEM_RANGE past b's cap; IDEM_NOMEM. */
int idem__tmpl_text(const idem_canon *c, idem__buf *b, const char *tmpl,
                    int how, const char *key, char *err, size_t errn);

/* Append the canonical JSON template tmpl (a status tool's "arguments"),
** filled, to b: a string "{name}" is the argument's canonical value (null
** when there is none), "{$key}" the key as a JSON string. */
int idem__tmpl_json(const idem_canon *c, idem__buf *b, const char *tmpl,
                    const char *key);

/* ---- guard.c, for run.c (HTTP tools) -------------------------------------- */

/* The policy of g (NULL: every tool guarded with the defaults);
** IDEM_MISUSE when g is not a guard. */
int idem__guard_policy(const idem_guard *g, const idem_policy **p);
/* The guard s belongs to, or NULL when s is not a step. */
idem_guard *idem__step_guard(const idem_step *s);

/* ---- guard.c, for queue.c (the completion queue) ------------------------ */

/* A job for the guard's worker threads: run(w) is called once, on one of
** them; it owns w from then on.  Embed it first in the job's struct. */
typedef struct idem__work {
  void (*run)(struct idem__work *w);
} idem__work;
/* Hand w to a worker of g (an idle one, else a new thread): 0, or -1 when
** no thread could take it (w untouched). */
int idem__guard_post(idem_guard *g, idem__work *w);
/* Take (IDEM_MISUSE for a closed or bad guard) and drop a reference to g:
** the guard lives while one is held. */
int idem__guard_hold(idem_guard *g);
void idem__guard_release(idem_guard *g);
/* Empty the calling thread's idem_guard_errmsg(g), so that a failure
** that sets no message is not read as an earlier one's. */
void idem__guard_errclear(idem_guard *g);
/* Is session/call_id recorded settled and told, so that a begin of it only
** reads the log (a replay)?  One read; 0 on any doubt. */
int idem__guard_told(idem_guard *g, const char *session, const char *call_id);
/* Mark s as held by a queue: IDEM_MISUSE when s is not a step of g, or one
** is held already.  unclaim gives it back. */
int idem__step_claim(idem_step *s, const idem_guard *g);
void idem__step_unclaim(idem_step *s);
/* The next idem_step_finish(s) records the delivery with a settled
** outcome, in the outcome's commit (what idem_guard_call does). */
void idem__step_deliver_with_outcome(idem_step *s, int on);
/* Set g's message (idem_guard_errmsg) and return rc. */
int idem__guard_fail(idem_guard *g, int rc, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif /* IDEM_INT_H */
