/*
** idem.h - the public interface of libidem.
**
** idem makes the side-effecting tool calls of AI agents take effect at most
** once.  This header is the whole contract of the library: what is not
** declared here is not API.  Its comments are the reference documentation.
**
** Conventions (after SQLite, libuv and jansson):
**   - Fallible functions return an int status: IDEM_OK (0) or one of the
**     IDEM_* codes below.  Codes are append-only and never renumbered.
**   - Handles are opaque, opened by idem_X_open() and released by
**     idem_X_close(), which accepts NULL.  An opener stores the handle even
**     on failure (when memory allowed one) so its message can be read.
**   - Detail about the last failure lives on the handle (idem_canon_errmsg,
**     idem_policy_errmsg, idem_guard_errmsg).  There is no global error.
**   - Bytes travel as (pointer, length); NUL-terminated strings are used only
**     for names and ids.  Returned pointers say how long they are borrowed.
**   - Memory, one rule: what the library hands over is freed with
**     idem_free() (or the free function its type names, idem_record_free);
**     what a caller hands over for the library to free (a tool's result) is
**     allocated with idem_malloc().  Both go through the allocator of
**     idem_set_alloc_funcs().
**   - Threads: an idem_canon or an idem_step belongs to one thread at a
**     time; an idem_policy is read-only once loaded and may be shared; an
**     idem_guard and an idem_queue are safe to share between threads (a
**     step submitted to a queue is the queue's until its completion is
**     popped).  Each section says so again.  Nothing in the library keeps
**     global mutable state except the allocator set by
**     idem_set_alloc_funcs(), and the library changes nothing of the host
**     process (no signal handlers, no heap settings).
**   - ABI: a struct the caller fills (idem_call, idem_keyspec, idem_tool,
**     idem_settlement, idem_filter) or that the library fills for the caller
**     (idem_tool_info, idem_stats, idem_completion) begins with `size_t
**     size`, which the caller sets to sizeof the struct it was compiled
**     with.  A later version appends fields: it reads only the fields
**     within size (the rest count as NULL / 0) and writes only those.  A
**     size smaller than this version's first layout is IDEM_MISUSE.
**     Zero-initialize the struct, set size, then the fields you use:
**
**         idem_call c = {.size = sizeof c, .session = ..., ...};
*/
#ifndef IDEM_H
#define IDEM_H

#include <stddef.h>

#include "idem_version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(IDEM_BUILDING) && defined(__GNUC__)
#define IDEM_API __attribute__((visibility("default")))
#else
#define IDEM_API
#endif

/*
** Status codes.  One table yields the enum, idem_strerror() and
** idem_status_name(): X(SUFFIX, value, name, description).
*/
#define IDEM_STATUS_MAP(X)                                                     \
  X(OK, 0, "ok", "not an error")                                               \
  X(ERROR, 1, "error", "unspecified error")                                    \
  X(NOMEM, 2, "nomem", "out of memory")                                        \
  X(MISUSE, 3, "misuse", "library used incorrectly")                           \
  X(INVALID, 4, "invalid", "invalid argument")                                 \
  X(RANGE, 5, "range", "value out of range")                                   \
  X(IO, 6, "io", "input/output error")                                         \
  X(JSON_SYNTAX, 20, "syntax", "JSON syntax error")                            \
  X(JSON_TRAILING, 21, "trailing", "trailing bytes after the JSON text")       \
  X(JSON_UTF8, 22, "utf8", "invalid UTF-8")                                    \
  X(JSON_SURROGATE, 23, "surrogate", "unpaired surrogate escape")              \
  X(JSON_DUPLICATE, 24, "duplicate", "duplicate member name")                  \
  X(JSON_OVERFLOW, 25, "overflow", "number overflows the double range")        \
  X(JSON_UNDERFLOW, 26, "underflow", "non-zero number underflows to zero")     \
  X(JSON_BIGINT, 27, "bigint", "integer literal beyond 2^53")                  \
  X(JSON_DEPTH, 28, "depth", "nesting too deep")                               \
  X(JSON_TOOBIG, 29, "too_big", "text too large")                              \
  X(JSON_BOM, 30, "bom", "byte-order mark")                                    \
  X(NOT_OBJECT, 31, "not_object", "tool arguments are not a JSON object")      \
  X(POLICY, 40, "policy", "invalid policy")                                    \
  X(NOTFOUND, 41, "notfound", "no such record")                                \
  X(STORE, 42, "store", "the attempt log failed")                              \
  X(BUSY, 43, "busy", "the attempt log is locked")                             \
  X(CORRUPT, 44, "corrupt", "the attempt log is damaged or not a log")         \
  X(STALE, 45, "stale", "a stale fencing token")

typedef enum idem_status {
#define IDEM__ENUM(suffix, value, name, text) IDEM_##suffix = value,
  IDEM_STATUS_MAP(IDEM__ENUM)
#undef IDEM__ENUM
      IDEM__STATUS_END
} idem_status;

/* A sentence describing status code rc ("unknown status" for others).
** Static storage; these name functions are pure and thread-safe. */
IDEM_API const char *idem_strerror(int rc);

/* The short machine name of rc ("duplicate", "too_big", ...), as used in
** JSON error reports; "unknown" for codes this version does not know. */
IDEM_API const char *idem_status_name(int rc);

/* The run-time version: IDEM_VERSION_STRING and IDEM_VERSION_NUMBER of the
** library actually linked, which may differ from the header's. */
IDEM_API const char *idem_version(void);
IDEM_API unsigned idem_version_number(void);

/*
** Memory.  Every allocation of the library goes through these three
** functions.  Replace them before any handle is opened (not thread-safe
** against concurrent use); passing NULLs restores the C library's.  The
** test suite uses this to fail the Nth allocation.
*/
typedef void *(*idem_malloc_fn)(size_t size);
typedef void *(*idem_realloc_fn)(void *ptr, size_t size);
typedef void (*idem_free_fn)(void *ptr);
IDEM_API void idem_set_alloc_funcs(idem_malloc_fn m, idem_realloc_fn r,
                                   idem_free_fn f);

/* Allocate through the library's allocator: what a caller hands over for
** the library to free (a tool's result and error text, idem_tool).  NULL
** when memory ran out.  Thread-safe. */
IDEM_API void *idem_malloc(size_t size);
/* Free what the library handed over, or what idem_malloc() gave.  NULL is
** a no-op.  Thread-safe. */
IDEM_API void idem_free(void *p);

/* ---------------------------------------------------------------------------
** Canonical JSON (RFC 8785).
**
** An idem_canon is a reusable workspace: it owns the output and scratch
** buffers, the limits, and the message of the last failure.  Reusing one
** handle for many texts avoids allocation after the first few.
**
** Threads: a workspace belongs to one thread at a time (use one per
** thread); distinct workspaces are independent.  What a call lends (*out,
** the key's pointers, the message) is the workspace's until its next call.
*/
typedef struct idem_canon idem_canon;

/* Defaults of the two limits. */
#define IDEM_DEFAULT_MAX_DEPTH 128
#define IDEM_DEFAULT_MAX_BYTES (1024u * 1024u)

/* Open a workspace.  *out is set to the handle, or NULL when even that could
** not be allocated (IDEM_NOMEM). */
IDEM_API int idem_canon_open(idem_canon **out);

/* Release a workspace and everything it lent.  NULL is a no-op. */
IDEM_API void idem_canon_close(idem_canon *c);

/* Limits, by idem_canon_limit(c, which, value). */
enum idem_limit {
  IDEM_LIMIT_DEPTH = 1, /* deepest nesting of arrays and objects (128) */
  IDEM_LIMIT_BYTES = 2  /* largest input text in bytes (1 MiB)         */
};

/* Set a limit; value must be at least 1 (IDEM_RANGE otherwise) and at most
** SIZE_MAX / 16 for bytes and 1,000,000 for depth.  Returns IDEM_OK,
** IDEM_RANGE, IDEM_INVALID (unknown `which`) or IDEM_MISUSE. */
IDEM_API int idem_canon_limit(idem_canon *c, int which, size_t value);

/*
** Canonicalize one JSON text (any value, not only objects) of len bytes.
** On IDEM_OK, *out points at the canonical bytes (not NUL-terminated) and
** *out_len is their length; the bytes are borrowed until the next call on c.
** On failure *out is NULL, *out_len 0, and the code is one of the
** IDEM_JSON_* codes (or IDEM_NOMEM / IDEM_MISUSE); idem_canon_errmsg() says
** what and idem_canon_erroffset() at which byte offset (0-based) of text.
*/
IDEM_API int idem_canon_json(idem_canon *c, const char *text, size_t len,
                             const char **out, size_t *out_len);

/* The message of the last failure on c ("" after a success), such as
** `duplicate member name "amount" at byte 31`.  Borrowed until the next
** call on c.  Never NULL, even for c == NULL. */
IDEM_API const char *idem_canon_errmsg(const idem_canon *c);

/* The byte offset (0-based) of the last failure on c, 0 after a success. */
IDEM_API size_t idem_canon_erroffset(const idem_canon *c);

/* The canonical JSON string (RFC 8785 §3.2.2.2) of the UTF-8 text
** [text, text+len): quotes, and the escapes JCS prescribes.  *out points to
** len_out bytes owned by c until its next call.  IDEM_JSON_UTF8 (offset on
** c) when the text is not UTF-8.  Build JSON from ids with it. */
IDEM_API int idem_canon_string(idem_canon *c, const char *text, size_t len,
                               const char **out, size_t *len_out);

/* The length of the UTF-8 character at p, of at most n bytes (Unicode
** Table 3-7: no overlongs, no surrogates, nothing past U+10FFFF); 0 when
** the bytes there are not one.  Pure. */
IDEM_API size_t idem_utf8_char(const char *p, size_t n);

/* ---------------------------------------------------------------------------
** Idempotency keys (SPEC §3).
**
**   payload     = canonical {"args": ARGS, "tool": TOOL}
**   fingerprint = hex(SHA-256(payload)), 64 lowercase hex digits
**   key         = pct(SESSION) ":" pct(CALL) ":" fingerprint[0..16]
**
** pct() percent-encodes every byte outside A-Z a-z 0-9 - . _ ~ as %XX with
** uppercase hex.  A key longer than key_max_len becomes "h:" followed by the
** 64-hex SHA-256 of the long form.  When key_arg is named, that member of
** ARGS is removed before fingerprinting (the caller writes the key there on
** the way downstream).
*/

/* One decision to call a tool, as the harness sees it.  Set size to
** sizeof(idem_call) (the ABI rule above); the strings are borrowed for the
** call that takes the struct.  (0.3.0 added size; code built against an
** earlier version must be rebuilt.) */
typedef struct idem_call {
  size_t size;         /* sizeof(idem_call)                        */
  const char *session; /* the harness's run id, non-empty          */
  const char *call_id; /* the model's tool-call id, non-empty      */
  const char *tool;    /* the tool's name, non-empty UTF-8         */
  const char *args;    /* the arguments: a JSON object text ...    */
  size_t args_len;     /* ... of this many bytes                   */
  /* The model turn that issued the call, or NULL (SPEC §6.4): identical
  ** calls of one turn are one decision, and coalesce into one action even
  ** when the first has finished and been delivered.  Without it, calls
  ** that begin within the tool's coalesce_ms of each other count as one
  ** turn.  Any non-empty text the harness keeps for the turn (the model
  ** response's id, say). */
  const char *turn;
  /* Nonzero: the caller runs a status check of its own (a function given
  ** in code, idem_tool.check), whatever the policy names: the step asks
  ** for it (IDEM_NEXT_CHECK, with idem_step_check_tool() NULL when the
  ** policy names no status tool) before it settles an action in doubt.
  ** (Added in 0.4.0; a caller built against 0.3.0 passes the smaller
  ** size and reads as 0.) */
  int own_check;
} idem_call;

/* How a tool's keys are made; a NULL spec means the defaults. */
typedef struct idem_keyspec {
  size_t size;         /* sizeof(idem_keyspec)                              */
  const char *key_arg; /* member of the arguments holding the key, or NULL */
  size_t key_max_len;  /* 0 means the default, 255                         */
} idem_keyspec;

#define IDEM_DEFAULT_KEY_MAX_LEN 255u

/* A minted key.  Every pointer is borrowed from the idem_canon that minted
** it, until the next call on that handle; key, payload and args are also
** NUL-terminated for convenience. */
typedef struct idem_key {
  const char *key; /* the idempotency key                      */
  size_t key_len;
  const char *payload; /* canonical {"args":...,"tool":...}        */
  size_t payload_len;
  const char *args; /* canonical arguments, key_arg removed     */
  size_t args_len;
  char fingerprint[65]; /* 64 lowercase hex digits and a NUL        */
} idem_key;

/*
** Mint the key of one call.  Fails with IDEM_INVALID (an empty or missing
** session, call id or tool, or a tool name that is not UTF-8), an IDEM_JSON_*
** code for bad arguments, IDEM_NOT_OBJECT when the arguments are valid JSON
** but not an object, or IDEM_NOMEM; the message and offset are on c.
** On failure *out is zeroed.
*/
IDEM_API int idem_key_mint(idem_canon *c, const idem_call *call,
                           const idem_keyspec *spec, idem_key *out);

/*
** Mint the key of a call given as one JSON object text with exactly the
** members "session", "call", "tool" (strings) and "args" (an object) - the
** form `idem key --lines` reads.  Offsets in messages refer to text.
*/
IDEM_API int idem_key_mint_json(idem_canon *c, const char *text, size_t len,
                                const idem_keyspec *spec, idem_key *out);

/* ---------------------------------------------------------------------------
** Policy (SPEC §8): which tools are guarded, and how.  The file format and
** every field are documented in docs/POLICY.md.
**
** Threads: a policy is read-only once loaded: share it between threads and
** guards freely.  A guard borrows it, so free it after the guards that use
** it are closed.  Its strings (idem_tool_info) are borrowed from it.
*/
typedef struct idem_policy idem_policy;

/* How a tool is treated. */
enum idem_class {
  IDEM_CLASS_GUARDED = 1,    /* irreversible: through the guard            */
  IDEM_CLASS_IDEMPOTENT = 2, /* safe to repeat: run with retries, no record */
  IDEM_CLASS_READ_ONLY = 3,  /* run as is, nothing recorded                */
  IDEM_CLASS_REFUSED = 4     /* not allowed (unknown tool, by default)     */
};

/*
** Read and validate a policy from a file (idem_policy_load) or from text
** (idem_policy_parse; origin names it in messages).  Validation is strict:
** unknown fields, wrong types and impossible combinations are IDEM_POLICY
** errors whose message names the field (`tools.refund.timeout_ms: ...`).
** *out is set even on failure (unless memory ran out) so that
** idem_policy_errmsg() can be read; free it with idem_policy_free().
*/
IDEM_API int idem_policy_load(const char *path, idem_policy **out);
IDEM_API int idem_policy_parse(const char *text, size_t len, const char *origin,
                               idem_policy **out);
IDEM_API void idem_policy_free(idem_policy *p);
IDEM_API const char *idem_policy_errmsg(const idem_policy *p);

/* The class of tool under p; a NULL policy guards every tool with the
** default settings (what `idem exec` does without --policy). */
IDEM_API int idem_policy_class(const idem_policy *p, const char *tool);

/* In words: what "the same action" means for tool and what happens on a
** timeout.  *out is a NUL-terminated text; free it with idem_free(). */
IDEM_API int idem_policy_explain(const idem_policy *p, const char *tool,
                                 char **out);

#define IDEM_MAX_EXIT_CODES 16

/* What the policy says about one tool, defaults filled in (docs/POLICY.md
** names each field).  Strings are borrowed from the policy. */
typedef struct idem_tool_info {
  size_t size; /* in: sizeof(idem_tool_info)                          */
  int named;   /* the policy names the tool (else: unknown_tools)     */
  int cls;     /* enum idem_class                                     */
  long long timeout_ms, retries, backoff_ms, reconcile_timeout_ms;
  long long wait_ms;
  long long settle_ms; /* -1: no bound                                 */
  long long lease_ms;  /* how long an owner's lease on its action lasts */
  long long coalesce_ms, repeat_window_s, retention_s;
  int provider_dedupes;
  const char *key_arg;        /* or NULL                                */
  int has_status;             /* a status check is named                */
  const char *status_tool;    /* the status tool, or NULL               */
  const char *status_command; /* idem exec's status command, or NULL    */
  int http;                   /* an HTTP tool (the policy's "http")     */
  int on_is_error;            /* enum idem_outcome of an MCP isError    */
  /* idem exec: the exit codes that mean applied, not applied, rejected */
  int exit_applied[IDEM_MAX_EXIT_CODES], n_exit_applied;
  int exit_not_applied[IDEM_MAX_EXIT_CODES], n_exit_not_applied;
  int exit_rejected[IDEM_MAX_EXIT_CODES], n_exit_rejected;
} idem_tool_info;

/* Fill *out for tool under p (NULL: every tool guarded with the defaults).
** IDEM_MISUSE when out->size is too small. */
IDEM_API int idem_policy_tool(const idem_policy *p, const char *tool,
                              idem_tool_info *out);

/* The tools p names: how many, and the i-th name in byte order (borrowed
** from p; NULL past the end). */
IDEM_API size_t idem_policy_tool_count(const idem_policy *p);
IDEM_API const char *idem_policy_tool_name(const idem_policy *p, size_t i);

/* The i-th warning about a loaded policy: something valid that is likely a
** mistake, in one line naming the field (docs/POLICY.md, "Warnings"): two
** tool names equal after case folding and NFC, which idem tells apart
** (`tools: "Refund" and "refund" differ only in case ...`), or a guarded
** tool's retention_s shorter than its timeout_ms + settle_ms.  Borrowed
** from p; NULL past the end.  Front ends print them (idem policy check,
** idem mcp). */
IDEM_API const char *idem_policy_warning(const idem_policy *p, size_t i);

/* ---------------------------------------------------------------------------
** The attempt log (SPEC §5): one record per action (session, call id).
*/

/* States of an action.  Terminal: SUCCEEDED, FAILED, DEDUPLICATED. */
enum idem_state {
  IDEM_STATE_PENDING = 1,     /* write-ahead record durable, owner leased */
  IDEM_STATE_SUCCEEDED = 2,   /* applied, result recorded                 */
  IDEM_STATE_FAILED = 3,      /* definite failure, nothing applied        */
  IDEM_STATE_NOT_APPLIED = 4, /* certainly not applied; may retry         */
  IDEM_STATE_IN_DOUBT = 5,    /* outcome unknown: reconcile               */
  IDEM_STATE_DEDUPLICATED = 6 /* a new call id the fence resolved to an   */
                              /* earlier action (duplicate_of)            */
};

/* How a record got its outcome. */
enum idem_resolution {
  IDEM_RESOLVED_NONE = 0,
  IDEM_RESOLVED_EXECUTED = 1,   /* the downstream call answered        */
  IDEM_RESOLVED_RECONCILED = 2, /* a status check answered             */
  IDEM_RESOLVED_LATE = 3,       /* a result that came after the deadline */
  IDEM_RESOLVED_REPLAYED = 4,   /* copied from the action it duplicates */
  IDEM_RESOLVED_OPERATOR = 5    /* an operator's verdict (idem resolve) */
};

/* Names of states and resolutions ("in_doubt", "late"); "?" otherwise. */
IDEM_API const char *idem_state_name(int state);
IDEM_API const char *idem_resolution_name(int resolution);

/* One record.  Strings are NUL-terminated and owned by the record; optional
** ones are NULL when absent.  Times are milliseconds since the Unix epoch.
** The library makes records (idem_guard_record) and lends them
** (idem_guard_list's callback); a record made for you is yours: free it
** with idem_record_free().  Fields may be appended in a later version (the
** library allocates records, so a caller's sizeof never matters). */
typedef struct idem_record {
  char *session, *call_id, *tool;
  char *fingerprint;     /* 64 hex                                     */
  char *key;             /* the idempotency key                        */
  char *args;            /* canonical arguments (key_arg removed)      */
  char *fence_key;       /* the fence scope digest, or NULL            */
  int cls;               /* enum idem_class                            */
  int state;             /* enum idem_state                            */
  int attempts;          /* downstream attempts made                   */
  char *owner;           /* "host:pid:start" of the lease holder       */
  long long lease_until; /* when the owner's lease ends                */
  long long token;       /* fencing token, +1 on every takeover        */
  char *result;          /* the downstream result (JSON), or NULL      */
  char *error;           /* error text, or NULL                        */
  long long created, updated, expires;
  int resolution;      /* enum idem_resolution                       */
  long long delivered; /* when the model was told the outcome, or 0 */
  char *duplicate_of;  /* DEDUPLICATED: the call id it repeats       */
  /* The attempt that may still be running (SPEC §6a).  executor is the
  ** "host:pid:start" of the process that runs it - the tool's own process,
  ** or the runner of `idem exec` - and NULL when no attempt of the action
  ** can still be running (none started since the last one that ended). */
  char *executor;
  long long pgid;        /* > 0: the attempt's own process group (the     */
                         /* command of idem exec); < 0: -pgid is a group */
                         /* it shares (the server behind idem mcp); 0    */
  long long settle_from; /* its deadline, or its executor's death if seen */
                         /* first: settle_ms counts from here            */
  char *turn;            /* the model turn of the call, or NULL           */
  /* An operator's verdict (idem_guard_resolve): who gave it and when;
  ** NULL and 0 otherwise.  (Added in 0.4.0.) */
  char *resolved_by;
  long long resolved_at;
  /* What the console shows of an action in doubt (added in 0.5.0):
  ** check_with, the {"tool":T,"arguments":A} the model was told to check
  ** with when the action went in doubt, as the envelope's check_with
  ** gave it (NULL: none was told); last_check, the answer of its last
  ** status check as the check gave it - "applied", "not_applied",
  ** "rejected" or "unknown" - and checked_at, when, by the log's clock
  ** (NULL and 0: none ran); checks, how many status checks ran on it
  ** (through a step's CHECK or idem_guard_settle_many; an operator's
  ** verdict is none). */
  char *check_with;
  char *last_check;
  long long checked_at;
  long long checks;
} idem_record;

/* Free a record the library made for you.  NULL is a no-op. */
IDEM_API void idem_record_free(idem_record *r);

/* ---------------------------------------------------------------------------
** The guard (SPEC §6, §7): every guarded call goes through it.
**
** Two-phase use, without callbacks (front ends and bindings drive it):
**
**   idem_guard_begin(g, &call, &s);
**   for (;;) switch (idem_step_next(s)) {
**   case IDEM_NEXT_EXECUTE:  call the tool downstream with idem_step_key(s)
**                            and idem_step_args(s), within
**                            idem_step_deadline_ms(s), after waiting
**                            idem_step_delay_ms(s); then
**                            idem_step_finish(s, outcome, result, ...);
**   case IDEM_NEXT_CHECK:    run the status check idem_step_check_tool(s) /
**                            idem_step_check_args(s) with the same key; then
**                            idem_step_resolve(s, outcome, result, ...);
**   case IDEM_NEXT_WAIT:     another owner holds the action: sleep
**                            idem_step_delay_ms(s), then idem_step_poll(s);
**   case IDEM_NEXT_ANSWER:   idem_step_delivered(s), then give
**                            idem_step_envelope(s) to the model; done.
**   }
**   idem_step_free(s);
**
** A result that arrives after the caller reported IDEM_OUTCOME_UNKNOWN (a
** late result) is still given to idem_step_finish(), even after ANSWER: the
** guard records it (resolution "late").  idem_guard_call() does all of this
** for a tool given as functions, running the tool on a worker thread so
** that the guard, not the tool, owns the deadline.  An event loop submits
** the same operations to a completion queue instead (idem_queue_*, below):
** nothing then blocks its thread.
**
** A guard is safe to share between threads; a step belongs to one thread.
** A live step holds its guard: closing the guard first is allowed, and the
** guard goes when its last step is freed.
*/
typedef struct idem_guard idem_guard;
typedef struct idem_step idem_step;

/* What a downstream call or a status check says happened. */
enum idem_outcome {
  IDEM_OUTCOME_APPLIED = 1,     /* it took effect (result attached)      */
  IDEM_OUTCOME_REJECTED = 2,    /* definite failure, nothing applied     */
  IDEM_OUTCOME_NOT_APPLIED = 3, /* certainly not applied; may retry      */
  IDEM_OUTCOME_UNKNOWN = 4      /* timeout, reset, crash: nobody knows   */
};

/* The status of an envelope (SPEC §7). */
enum idem_answer {
  IDEM_ANSWER_SUCCEEDED = 1,
  IDEM_ANSWER_FAILED = 2,
  IDEM_ANSWER_OUTCOME_UNKNOWN = 3,
  IDEM_ANSWER_ALREADY_APPLIED = 4,
  IDEM_ANSWER_CONFLICT = 5,
  IDEM_ANSWER_IN_PROGRESS = 6,
  IDEM_ANSWER_REFUSED = 7,
  IDEM_ANSWER_INVALID_ARGUMENTS = 8
};

/* "succeeded", "outcome_unknown", ...; "?" for others. */
IDEM_API const char *idem_answer_name(int answer);

/* What the caller of a step does next. */
enum idem_next {
  IDEM_NEXT_ANSWER = 1,  /* the envelope is ready                      */
  IDEM_NEXT_EXECUTE = 2, /* call the tool downstream                   */
  IDEM_NEXT_CHECK = 3,   /* run the status check                       */
  IDEM_NEXT_WAIT = 4     /* another owner holds it: wait, then poll    */
};

/*
** Open a guard on the attempt log named by log_url ("sqlite:PATH",
** "postgres://...", a libpq keyword string "host=H dbname=D ...", or a
** plain path without such keywords); NULL means $IDEM_LOG, else
** $XDG_STATE_HOME/idem/attempts.db (~/.local/state/idem/attempts.db).
** policy is borrowed and must outlive the guard; NULL guards every tool
** with the default settings.  *out is set even on failure when memory
** allowed, so idem_guard_errmsg() can say why.
*/
IDEM_API int idem_guard_open(const char *log_url, const idem_policy *policy,
                             idem_guard **out);
/* Close a guard.  Tool runs of idem_guard_call() still in flight keep it
** alive until they end and their late results are recorded. */
IDEM_API void idem_guard_close(idem_guard *g);
/* Why the last failing call on g made by the calling thread failed ("" when
** it has had none).  The text belongs to g and to this thread: another
** thread's failures never change it, so reading it is safe while other
** threads use g.  Valid until this thread's next failing call on g, or
** until g is closed. */
IDEM_API const char *idem_guard_errmsg(const idem_guard *g);

/*
** Decide a call.  Returns IDEM_OK when a step was made (whatever its
** answer: a refused tool or bad arguments are answers, not errors), or an
** error when the log failed - then no downstream call may be made.
** *out is set to the step (NULL only for IDEM_NOMEM/IDEM_MISUSE).
*/
IDEM_API int idem_guard_begin(idem_guard *g, const idem_call *call,
                              idem_step **out);
IDEM_API int idem_step_next(const idem_step *s);

/* Report the downstream call's outcome; result is the tool's result as
** JSON text (or NULL), error a message for REJECTED/NOT_APPLIED/UNKNOWN.
** When the log cannot record the outcome (a full disk, a lost connection),
** the step still answers, IDEM_OK: outcome_unknown, in words that say the
** call ran, what was reported and that it could not be recorded (the
** log's error is idem_guard_errmsg()).  The record stays pending; a later
** call of the action, in this process or another, takes it over and
** reconciles it. */
IDEM_API int idem_step_finish(idem_step *s, int outcome, const char *result,
                              size_t result_len, const char *error);
/* Before idem_step_finish(s, IDEM_OUTCOME_UNKNOWN, ...), or before a late
** result: the attempt has ENDED - the command and its process group
** exited, the tool function returned, the server answered - but without a
** verdict (SPEC §6a: ended is not finished): what it sent may sit in the
** provider's queue and land later.  The guard records when it ended; a
** status check that finds it not applied then permits a new execution
** only under provider_dedupes, or once the tool's settle_ms has passed
** since (settle_ms 0: the end is the finish).  An UNKNOWN without it is an
** attempt still running (a timeout): the same, and settle_ms counts from
** its deadline. */
IDEM_API int idem_step_attempt_ended(idem_step *s);
/* Report the status check's outcome (APPLIED with its result, NOT_APPLIED,
** or UNKNOWN when the check itself failed). */
IDEM_API int idem_step_resolve(idem_step *s, int outcome, const char *result,
                               size_t result_len);
/* At CHECK, when the front end has nothing to check with (no status
** command, no tool it can call): the step goes on as after an UNKNOWN
** answer, and no status check is counted or recorded (last_check stays
** as it was). */
IDEM_API int idem_step_no_check(idem_step *s);
/* After IDEM_NEXT_WAIT: look at the other owner's action again. */
IDEM_API int idem_step_poll(idem_step *s);
/* The model is being given the envelope: an outcome it has been told no
** longer fences new calls (SPEC §6.4).  Call it before handing the
** envelope over, so that a call the harness makes the moment it has read
** the answer does not find this one untold and is not fenced as its
** duplicate.  A front end that can tell its reader is gone (its input at
** EOF, its end of the pipe closed) does not call it: an answer nobody
** reads tells the model nothing (SPEC §10, "told"). */
IDEM_API int idem_step_delivered(idem_step *s);
/* The envelope did not reach the model after all (the write failed: the
** reader went away meanwhile): undo the delivery this step recorded - by
** idem_step_delivered, or with the outcome in idem_guard_call's step - so
** that the outcome fences the model's re-issue again (SPEC §6.4).  A
** deduplicated call's earlier action gets back the delivery time it had.
** Nothing to undo (an outcome told before, no delivery recorded): IDEM_OK.
** An undo errs toward the fence: a delivery another front end recorded
** for the same record in between is undone with it. */
IDEM_API int idem_step_undelivered(idem_step *s);
IDEM_API void idem_step_free(idem_step *s);

/* Accessors; strings are borrowed until the next call on s. */
IDEM_API const char *idem_step_key(const idem_step *s);
/* The arguments to send: canonical, the key written into key_arg. */
IDEM_API const char *idem_step_args(const idem_step *s, size_t *len);
/* The status check to run (CHECK): a status tool and its arguments, or a
** command (idem exec); NULL when the policy names none. */
IDEM_API const char *idem_step_check_tool(const idem_step *s);
IDEM_API const char *idem_step_check_args(const idem_step *s, size_t *len);
IDEM_API const char *idem_step_check_command(const idem_step *s);
/* The key and canonical arguments of the action under check: this call's,
** or the earlier identical call's when that one fences this call. */
IDEM_API const char *idem_step_check_key(const idem_step *s);
IDEM_API const char *idem_step_check_target(const idem_step *s, size_t *len);
/* What the result of the status tool (idem_step_check_tool) says under the
** policy's applied_when: IDEM_OUTCOME_APPLIED, IDEM_OUTCOME_NOT_APPLIED
** (the status tool answered without showing the action), or
** IDEM_OUTCOME_UNKNOWN when result is not JSON.  A front end that calls a
** status tool passes its result here, then to idem_step_resolve(). */
IDEM_API int idem_step_check_verdict(const idem_step *s, const char *result,
                                     size_t len);
/* The attempt number of the coming EXECUTE (1, 2, ...). */
IDEM_API int idem_step_attempt(const idem_step *s);
IDEM_API long long idem_step_deadline_ms(const idem_step *s);
IDEM_API long long idem_step_delay_ms(const idem_step *s);
IDEM_API int idem_step_answer(const idem_step *s);
/* The envelope (SPEC §7), a JSON object, once the step answers. */
IDEM_API const char *idem_step_envelope(const idem_step *s, size_t *len);

/* A tool as functions, for idem_guard_call().  run returns an
** idem_outcome and may set *result (JSON text, allocated with
** idem_malloc(); the library frees it) and *error (a NUL-terminated text,
** likewise).  check, when not NULL, is the status check with the same
** contract.  Both get the key and the arguments, borrowed for the call.
** They run on the guard's worker threads, possibly several at once, and
** may outlive idem_guard_call() (a late result): ctx must stay valid until
** the guard is closed and its runs have ended. */
typedef struct idem_tool {
  size_t size; /* sizeof(idem_tool) */
  int (*run)(void *ctx, const char *key, const char *args, size_t args_len,
             char **result, char **error);
  int (*check)(void *ctx, const char *key, const char *args, size_t args_len,
               char **result, char **error);
  void *ctx;
} idem_tool;

/* Guard one call end to end.  The tool runs on a worker thread; past the
** deadline the guard answers without it, and records its late result when
** it comes.  *envelope is the answer: free it with idem_free().  Marks the
** outcome delivered (with the outcome, one write): a caller whose reader
** may be gone drives the step API instead, and calls idem_step_delivered
** and idem_step_undelivered itself (SPEC §10, "told"). */
IDEM_API int idem_guard_call(idem_guard *g, const idem_call *call,
                             const idem_tool *tool, char **envelope,
                             size_t *len);

/*
** Reconcile one recorded action (what `idem recover` does for each): when it
** is in doubt (or pending under a dead owner or an expired lease), the step
** takes the action over and says CHECK: run the policy's status check
** (idem_step_check_command / idem_step_check_tool) or one of your own, and
** resolve it - the record becomes succeeded or not_applied, or stays in
** doubt when resolved UNKNOWN.  A recovery never executes the tool.
** Otherwise the step answers at once with what the record holds.
** IDEM_NOTFOUND when there is no such record.
*/
IDEM_API int idem_guard_recover(idem_guard *g, const char *session,
                                const char *call_id, idem_step **out);

/*
** Settle an action with the outcome of a status check made outside a step
** (`idem recover --batch` checks a stream of records at once): a
** compare-and-set on the token read from the log, so that an action in
** doubt (or pending under that token) becomes succeeded (APPLIED, result
** recorded) or not_applied (NOT_APPLIED), resolution "reconciled".
** UNKNOWN changes nothing.  IDEM_STALE when the action changed meanwhile.
*/
IDEM_API int idem_guard_settle(idem_guard *g, const char *session,
                               const char *call_id, long long token,
                               int outcome, const char *result,
                               size_t result_len);

/* Many settlements at once, in as few transactions as the log allows; each
** one's result lands in its rc (IDEM_OK, IDEM_STALE, ...).  Returns the
** first failure of the log itself. */
typedef struct idem_settlement {
  size_t size; /* sizeof(idem_settlement); v[0].size is the stride of v */
  const char *session, *call_id;
  long long token;    /* as read from the log */
  int outcome;        /* enum idem_outcome    */
  const char *result; /* JSON text, or NULL   */
  size_t result_len;
  int rc; /* out                  */
} idem_settlement;

IDEM_API int idem_guard_settle_many(idem_guard *g, idem_settlement *v,
                                    size_t n);

/* The fencing token this step holds (for idem_guard_late), or 0 for a
** step that records nothing (a read_only or idempotent tool, SPEC §6.1):
** idem_guard_late and idem_guard_executor_lease with token 0 do nothing
** and succeed, so an executor runs such a step without a hand-over. */
IDEM_API long long idem_step_token(const idem_step *s);

/* Record a result that arrived after the deadline, from wherever it
** arrives (another thread, another process): it settles the action if it is
** still in doubt, or still pending under the given token, and is dropped
** when the action was settled meanwhile.  ended != 0 says nothing of the
** attempt runs any more (the tool returned, the command and its process
** group are gone): with an UNKNOWN outcome that is an end without a
** verdict, and it may still land until the tool's settle_ms has passed
** (SPEC §6a, idem_step_attempt_ended). */
IDEM_API int idem_guard_late(idem_guard *g, const char *session,
                             const char *call_id, long long token, int outcome,
                             const char *result, size_t result_len,
                             const char *error, int ended);

/* An operator's verdict on an action in doubt (SPEC §9, `idem resolve`),
** given after checking with the provider by hand: IDEM_OUTCOME_APPLIED,
** with the result as JSON text (or NULL), makes every later call of the
** action replay it, and a re-issue of it answer already_applied;
** IDEM_OUTCOME_NOT_APPLIED, with a reason (required: what the provider
** said), lets the next call run it again with its key.  It is recorded
** with who (by; NULL: the guard's owner id) and when (the log's clock),
** resolution "operator", durably.  Only an action in doubt, or pending
** under a holder that is gone, can be resolved: any other gets
** IDEM_STALE and its state in idem_guard_errmsg() (someone settled it
** meanwhile, say); IDEM_NOTFOUND when there is no such action,
** IDEM_INVALID when result is not JSON.  Say "not applied" only when no
** attempt of it can land any more (the provider cancelled or refused it):
** the guard takes the verdict as given. */
IDEM_API int idem_guard_resolve(idem_guard *g, const char *session,
                                const char *call_id, int outcome,
                                const char *result, size_t result_len,
                                const char *reason, const char *by);

/* ---------------------------------------------------------------------------
** The completion queue: the step API for an event loop (Node, asyncio,
** libuv, epoll).  The operations of a step that write the log - begin,
** finish, resolve, poll, delivered, undelivered, a late result - are
** submitted without blocking and run on the guard's own worker threads
** (the threads of idem_guard_call, so that the log groups the commits of
** every caller that is there at once); each ends in a completion that the
** host pops without blocking.  Readiness is a pipe: idem_queue_fd() is readable
** exactly while completions wait to be popped.  Watch it with the loop
** (Node: new net.Socket({fd}); Python: loop.add_reader; poll(2)); never
** read it or close it yourself.
**
**   idem_queue_open(g, &q);
**   idem_queue_begin(q, &call, 0, user);         -> returns at once
**   ... q's fd is readable ...
**   idem_queue_pop(q, c, 16, &n);                -> c[i].user, .rc, .step,
**   for each c[i], by idem_step_next(c[i].step):    .next, .errmsg
**     EXECUTE: run the tool (the host's own way, within
**              idem_step_deadline_ms), then
**              idem_queue_finish(q, s, outcome, ..., IDEM_QUEUE_DELIVER, u)
**     CHECK:   run the check, then idem_queue_resolve(...)
**     WAIT:    after idem_step_delay_ms(s) (the host's timer),
**              idem_queue_poll(q, s, flags, u)
**     ANSWER:  read idem_step_envelope(s); idem_step_free(s)
**   idem_queue_close(q);
**
** A result that comes after the deadline (the step finished UNKNOWN
** meanwhile) goes to idem_queue_late() with the attempt's token: read
** idem_step_token(s) before that finish, as the step may walk on (a
** retry) or be freed before the result comes.
**
** Each completion carries the return code of its operation and its own
** error text, taken on the worker thread that ran it (not the host
** thread's idem_guard_errmsg, which never sees these failures).
**
** Delivery.  IDEM_QUEUE_DELIVER on a submission records the answer as
** delivered to the model (idem_step_delivered) when the operation ends
** at ANSWER: with the outcome, in the outcome's own commit, when the
** operation writes one (one commit fewer, as idem_guard_call does), else
** just after, on the same thread.  Pass it only while the caller is still
** waiting for the answer; a caller that gave up meanwhile gets
** idem_queue_undelivered(), so that the outcome fences a re-issue again
** (SPEC §6.4, §10 "told").  Without the flag, nothing is marked delivered:
** call idem_queue_delivered() when the answer is handed over.
**
** Ownership and threads.  A queue belongs to one guard, and holds it (the
** guard may be closed first).  From its submission until its completion is
** popped, a step belongs to the queue: do not use it, not even its
** accessors, and do not free it; one operation at a time per step (a second
** submission meanwhile is IDEM_MISUSE).  A popped BEGIN's step (NULL only
** when none could be made) is the caller's to free with idem_step_free().
** The queue's functions are safe from any thread; completions come in the
** order the operations ended.  A step that a queue has handed back may be
** driven by the blocking step API too, and the reverse.
**
** Closing.  idem_queue_close() waits for the operations in flight (each a
** few writes of the log, bounded by its busy timeout: never a tool), so
** no outcome is lost; then it frees the steps of completions never popped,
** closes the pipe and releases the guard.
*/
typedef struct idem_queue idem_queue;

/* The operation a completion reports. */
enum idem_op {
  IDEM_OP_BEGIN = 1,
  IDEM_OP_FINISH = 2,
  IDEM_OP_RESOLVE = 3,
  IDEM_OP_POLL = 4,
  IDEM_OP_DELIVERED = 5,
  IDEM_OP_UNDELIVERED = 6,
  IDEM_OP_LATE = 7 /* idem_queue_late: no step */
};

/* Flags of a submission (or'ed). */
#define IDEM_QUEUE_DELIVER 1 /* record the delivery at ANSWER (above)      */
#define IDEM_QUEUE_ENDED 2   /* finish: idem_step_attempt_ended() first    */
#define IDEM_QUEUE_INLINE 4  /* begin: a replay on the calling thread      */

/* One finished operation, filled by idem_queue_pop().  The caller sets
** size in c[0] only: it is the stride of the array (sizeof(idem_completion)
** as the caller was compiled), and the library writes it into each. */
typedef struct idem_completion {
  size_t size;     /* sizeof(idem_completion); c[0].size is the stride */
  void *user;      /* as submitted                                     */
  idem_step *step; /* the step the operation ran on; for BEGIN the new */
                   /* step, now the caller's (NULL: none was made)     */
  int op;          /* enum idem_op                                     */
  int rc;          /* what the operation returned: IDEM_OK or an error */
  int next;        /* idem_step_next(step) after it; 0 without a step  */
  int answer;      /* idem_step_answer(step) at ANSWER, else 0         */
  /* Why the operation failed, "" when rc is IDEM_OK: borrowed until the
  ** next idem_queue_pop() or idem_queue_close() on the queue. */
  const char *errmsg;
} idem_completion;

/* Open a queue on g (IDEM_IO when no pipe could be made, IDEM_NOMEM).
** *out is NULL on failure; the reason is idem_guard_errmsg(g). */
IDEM_API int idem_queue_open(idem_guard *g, idem_queue **out);
/* Wait for the operations in flight, free what was never popped, close
** the pipe.  NULL is a no-op.  Not from a tool or another thread still
** submitting to q. */
IDEM_API void idem_queue_close(idem_queue *q);
/* The read end of the pipe (non-blocking, close-on-exec): readable while
** completions wait.  -1 for a NULL queue. */
IDEM_API int idem_queue_fd(const idem_queue *q);
/* The number of operations submitted and not yet popped. */
IDEM_API size_t idem_queue_pending(const idem_queue *q);

/*
** Submissions.  Each returns at once: IDEM_OK when the operation was
** queued (it will end in exactly one completion), or IDEM_MISUSE (a NULL
** or closed queue, a step that is not q's guard's or is busy in a queue)
** or IDEM_NOMEM, when it was not (no completion comes; the submitting
** thread's idem_guard_errmsg(g) says why).  Whatever the
** operation itself finds wrong - bad arguments, a finish without an
** EXECUTE, the log's failure - is the completion's rc and errmsg.
** Strings and bytes are copied before the call returns.
*/
/* idem_guard_begin() (call is copied; flags: IDEM_QUEUE_DELIVER,
** IDEM_QUEUE_INLINE).  With IDEM_QUEUE_INLINE the log is read once on the
** calling thread: when it holds this call's outcome settled and already
** told, the begin is a replay that only reads, and it runs right there -
** its completion is ready (the fd readable) when this returns, with no
** thread hand-off; anything else goes to a worker as usual.  For a log
** whose reads do not wait (SQLite in WAL mode: readers never wait for the
** writer); not for PostgreSQL, where that read is a network round trip on
** the host's thread. */
IDEM_API int idem_queue_begin(idem_queue *q, const idem_call *call,
                              int flags, void *user);
/* idem_step_finish(), after idem_step_attempt_ended() with
** IDEM_QUEUE_ENDED; a late result (the step answered already) too. */
IDEM_API int idem_queue_finish(idem_queue *q, idem_step *s, int outcome,
                               const char *result, size_t result_len,
                               const char *error, int flags, void *user);
/* idem_step_resolve(); outcome 0: idem_step_no_check() (nothing to
** check with). */
IDEM_API int idem_queue_resolve(idem_queue *q, idem_step *s, int outcome,
                                const char *result, size_t result_len,
                                int flags, void *user);
/* idem_step_poll(), at once: wait idem_step_delay_ms(s) before submitting. */
IDEM_API int idem_queue_poll(idem_queue *q, idem_step *s, int flags,
                             void *user);
/* idem_step_delivered() / idem_step_undelivered(). */
IDEM_API int idem_queue_delivered(idem_queue *q, idem_step *s, void *user);
IDEM_API int idem_queue_undelivered(idem_queue *q, idem_step *s, void *user);
/* idem_guard_late(): a tool's result that came after the deadline, for
** the attempt that holds token (idem_step_token, read before the step
** was freed) - the step may be gone or walking on meanwhile (a retry). */
IDEM_API int idem_queue_late(idem_queue *q, const char *session,
                             const char *call_id, long long token,
                             int outcome, const char *result,
                             size_t result_len, const char *error, int ended,
                             void *user);

/* Take up to n completions, without blocking; *got says how many (0 when
** none is ready).  IDEM_MISUSE for a NULL queue or c, or a c[0].size
** below this version's first layout.  The fd stays readable while
** completions remain. */
IDEM_API int idem_queue_pop(idem_queue *q, idem_completion *c, size_t n,
                            size_t *got);

/* ---------------------------------------------------------------------------
** Reading and keeping the log (what `idem ls`, `show`, `stats`, `gc` and
** `recover` do).  Any guard reads its log; open one with a NULL policy to
** only read.  Thread-safe, as the guard is.
*/

/* One record (IDEM_NOTFOUND when there is none); free it with
** idem_record_free(). */
IDEM_API int idem_guard_record(idem_guard *g, const char *session,
                               const char *call_id, idem_record **out);

/* Which records idem_guard_list() gives. */
typedef struct idem_filter {
  size_t size;         /* sizeof(idem_filter)                          */
  const char *session; /* NULL: every session                          */
  unsigned states;     /* a mask of 1u << IDEM_STATE_*; 0: every state */
  size_t limit;        /* at most this many; 0: no limit               */
  /* Only the actions that idem_guard_recover() would take over now: in
  ** doubt, or pending under an owner that is gone or whose lease has run
  ** out (by the log's clock).  The one rule the guard itself uses. */
  int recoverable;
  /* Added in 0.5.0: exact matches (NULL: any), and paging.  A page goes
  ** on after the record named by after_created, after_session and
  ** after_call_id (the last one the previous page gave, in the listing's
  ** order: created, session, call_id; a NULL name reads as ""), whether
  ** or not that record is still there; after_created 0: from the start.
  ** A caller of an earlier header sets a size that ends before call_id:
  ** the fields it lacks read as NULL and 0. */
  const char *call_id;
  const char *key;
  const char *tool;
  long long after_created;
  const char *after_session, *after_call_id;
} idem_filter;

/* Called once per record; r is borrowed for the call.  Return 0 to go on,
** nonzero to stop (idem_guard_list() then returns IDEM_OK). */
typedef int (*idem_record_fn)(void *ctx, const idem_record *r);

/* The records under f (NULL: all), oldest first. */
IDEM_API int idem_guard_list(idem_guard *g, const idem_filter *f,
                             idem_record_fn fn, void *ctx);

/* How many records the log holds, in all and per state. */
typedef struct idem_stats {
  size_t size;           /* in: sizeof(idem_stats)                  */
  long long records;     /* all records                             */
  long long by_state[8]; /* indexed by enum idem_state (1..6)       */
} idem_stats;
IDEM_API int idem_guard_stats(idem_guard *g, idem_stats *out);

/* One row of idem_guard_tally(): the records of one tool in one state,
** with one resolution.  Strings are borrowed for the call. */
typedef struct idem_tally {
  size_t size;          /* sizeof(idem_tally)                           */
  const char *tool;
  int state;            /* enum idem_state                              */
  int resolution;       /* enum idem_resolution                         */
  long long records;    /* how many                                     */
  long long attempts;   /* their downstream attempts, summed            */
  long long checks;     /* the status checks run on them, summed        */
  long long oldest;     /* the earliest created among them (ms)         */
} idem_tally;
typedef int (*idem_tally_fn)(void *ctx, const idem_tally *t);
/* The log's records counted by tool, state and resolution, one call of fn
** per group (ordered by tool, state, resolution); fn returns nonzero to
** stop.  One pass over the log: what /metrics of `idem serve` reads. */
IDEM_API int idem_guard_tally(idem_guard *g, idem_tally_fn fn, void *ctx);

/* ---------------------------------------------------------------------------
** This process's counters (SPEC §9): what every guard of the process has
** done since it started - what the log cannot know (a replay writes
** nothing).  Lock-free to keep, and cheap to read.
*/
#define IDEM_LATENCY_BUCKETS 16
typedef struct idem_metrics {
  size_t size;            /* in: sizeof(idem_metrics)                   */
  long long answers[9];   /* calls answered, by enum idem_answer        */
  long long replays;      /* answers replayed from the log              */
  long long fenced;       /* new calls held back as another's repeat    */
  long long coalesced;    /* of those, as a call of the same turn       */
  long long attempts;     /* downstream attempts of guarded actions      */
  long long late;         /* late results recorded                      */
  long long checks[5];    /* status checks, by enum idem_outcome        */
  long long resolved;     /* operators' verdicts recorded               */
  /* The time from a call's begin to its answer: latency_le[i] counts the
  ** calls answered within idem_latency_bound_us(i) (cumulative, as
  ** Prometheus counts them); latency_count and latency_sum_us all of
  ** them. */
  long long latency_le[IDEM_LATENCY_BUCKETS];
  long long latency_count;
  long long latency_sum_us;
} idem_metrics;
/* Copy them into *out: IDEM_MISUSE when out is NULL or out->size is below
** sizeof(idem_metrics) of this header (its first layout). */
IDEM_API int idem_metrics_read(idem_metrics *out);
/* The upper bound of latency bucket i in microseconds; -1 past the
** last. */
IDEM_API long long idem_latency_bound_us(int i);

/* Is the process an owner or executor id names ("HOST:PID:START", as
** records carry them) still running?  1: yes; 0: a process of this
** machine that is gone; -1: cannot tell (another machine, a malformed
** id). */
IDEM_API int idem_owner_alive(const char *owner);

/* Delete the settled records whose retention (the policy's retention_s
** when they were settled, counted from their last settlement: an outcome,
** a late result, a verdict) has run out by the log's clock; *removed (may
** be NULL) says how many.  Actions that are pending or in doubt are kept. */
IDEM_API int idem_guard_gc(idem_guard *g, size_t *removed);

/* The log g was opened on, as given (or as defaulted when NULL was). */
IDEM_API const char *idem_guard_log(const idem_guard *g);

/* A log URL as messages show it: a password in it replaced by *** (into
** buf, NUL-terminated, cut to size). */
IDEM_API void idem_log_shown(const char *url, char *buf, size_t size);

/* ---------------------------------------------------------------------------
** Attempts run by another process (SPEC §6a).  `idem exec` runs each
** attempt in a runner process that outlives the front end, so that a
** front end killed mid-attempt leaves an executor the log knows about; a
** front end of your own that runs attempts elsewhere does the same:
**
**   idem_guard_set(g, IDEM_GUARD_EXECUTOR_HANDS_IN, 1);  before begin
**   EXECUTE: start the executor with the step's session, call id,
**            idem_step_token(s) and idem_guard_owner(g); the executor
**            opens its own guard on idem_guard_log(g) and, before it
**            starts the work, calls idem_guard_executor_lease(pgid > 0),
**            then renews it (pgid 0) while the work runs, and hands the
**            lease back (owner set) before it reports the outcome.
*/
enum idem_guard_option {
  /* value 1: the attempts of g's steps begin without an executor; the
  ** process that runs each one hands itself in with
  ** idem_guard_executor_lease() before it starts */
  IDEM_GUARD_EXECUTOR_HANDS_IN = 1,
  /* value: a process group (> 1) that the attempts of g's steps run in
  ** besides this process (the server behind `idem mcp`): once this process
  ** is gone and that group is empty, nothing of them can land */
  IDEM_GUARD_SHARED_PGID = 2
};
/* Set an option of g before its first step; IDEM_RANGE for an unknown
** option or a bad value. */
IDEM_API int idem_guard_set(idem_guard *g, int option, long long value);

/* g's owner id, "HOST:PID:START" of this process; static for g's life. */
IDEM_API const char *idem_guard_owner(const idem_guard *g);

/*
** The lease of an executor on the action it runs under token.  pgid > 0:
** the hand-over - the caller becomes the pending action's executor and
** lease holder, with the work's process group, durably, before the work
** starts; pgid 0: a renewal while the work runs, or with owner set, the
** lease handed back to that owner (the front end, before the executor
** reports to it: the record is never left pending under an executor that
** is gone while its result is on its way).  lease_ms is the tool's
** (idem_tool_info.lease_ms), timeout_ms the attempt's deadline.
** IDEM_STALE when another owner took the action over: then start nothing,
** or stop renewing.  Token 0 (a step that records nothing): IDEM_OK, and
** nothing is written.
*/
IDEM_API int idem_guard_executor_lease(idem_guard *g, const char *session,
                                       const char *call_id, long long token,
                                       long long lease_ms, long long pgid,
                                       long long timeout_ms, const char *owner);

/* Is process group pgid of this machine empty of live processes (a zombie
** runs nothing)?  The rule the guard applies to a recorded executor's
** group.  1 or 0; a pgid <= 1 is empty. */
IDEM_API int idem_process_group_empty(long long pgid);

/* SIGKILL this process when the environment variable IDEM_CRASH_AT names
** this point: the named crash points of the torture suite (SPEC §11), for
** executors that take part in it.  Does nothing otherwise. */
IDEM_API void idem_crash_point(const char *name);
/* ---------------------------------------------------------------------------
** HTTP tools (docs/POLICY.md, "http"): the library runs them itself.
**
** A tool whose policy entry has an "http" rule is a request libidem makes
** with libcurl: the policy's method and URL, its headers, the key in
** Idempotency-Key (or the rule's key_header), the canonical arguments as
** the JSON body.  In the URL and the header values, "{name}" is the call's
** argument `name` in its canonical RFC 8785 text - a string as its
** characters, a number as its canonical form (0.1 is 0.1, 1e21 is 1e+21) -
** percent-encoded in the URL; "{$key}" is the key, "{$env:NAME}" an
** environment variable.  The answer decides the outcome: a refused
** connection not applied; a timeout or a reset after sending unknown; 2xx
** applied (the body is the result); 409, 429 and 5xx as the rule's on_409,
** on_429, on_5xx (unknown by default); other 4xx rejected.
**
** libcurl is loaded on first use (dlopen of libcurl.so.4, or the file
** $IDEM_LIBCURL names), not linked.  A libidem built without HTTP support
** (the CMake option IDEM_HTTP off, which is the default only when libcurl's
** headers are missing) has these functions all the same: they fail, saying
** so, before anything is recorded or sent.
**
** idem_run_hooks follows the ABI rule (size first); idem_run_event, which
** the library fills, begins with size too, set by the library: fields
** past it are absent.
*/

/* NULL when this process can run HTTP tools (libidem was built with HTTP
** support, and libcurl loads: the first call loads it), else a sentence
** saying why not ("HTTP tools need libcurl (...); install the package
** libcurl4", or that this libidem was built without HTTP support).  Static
** storage, unchanged for the life of the process; thread-safe. */
IDEM_API const char *idem_http_missing(void);

/* 1 when tool has an "http" rule under policy p (idem_guard_run can run
** it), else 0.  A loaded policy is read-only: thread-safe. */
IDEM_API int idem_policy_http(const idem_policy *p, const char *tool);

/* One attempt of an HTTP tool, or one status check over HTTP, as the hooks
** of idem_guard_run see it.  Every pointer is borrowed for the duration of
** the hook's call. */
typedef struct idem_run_event {
  size_t size;        /* sizeof the struct the library filled          */
  const char *tool;   /* the tool requested: the call's, or the status  */
                      /* tool for a check                               */
  const char *method; /* "POST", "GET", ...; "" when none was made      */
  const char *key;    /* the idempotency key sent (a check: the key of  */
                      /* the action under check)                        */
  int attempt;        /* the attempt number, 1, 2, ... (a check: the    */
                      /* attempts of the action so far)                 */
  int outcome;        /* enum idem_outcome: what this attempt or check  */
                      /* says                                           */
  long http_status;   /* the HTTP status answered, 0 when none came     */
  const char *error;  /* why, in words ("HTTP 503 (unknown): ...",      */
                      /* "... (nothing was sent)"); "" when all is well */
} idem_run_event;

/* What idem_guard_run tells its caller as it goes; every member may be
** NULL.  Zero-initialize it and set size = sizeof(idem_run_hooks). */
typedef struct idem_run_hooks {
  size_t size; /* sizeof(idem_run_hooks), set by the caller */
  void *ctx;   /* passed to every hook                      */
  /* After each attempt of the tool, before its outcome is recorded. */
  void (*on_attempt)(void *ctx, const idem_run_event *ev);
  /* After each status check made over HTTP. */
  void (*on_check)(void *ctx, const idem_run_event *ev);
  /* A status check the library cannot make itself: the policy's status
  ** command (idem exec's), or a status tool without an "http" rule.  The
  ** hook makes it and returns its outcome (enum idem_outcome: APPLIED,
  ** NOT_APPLIED, or UNKNOWN when the check failed; 0 when it has nothing
  ** to check with, and no check is counted); for APPLIED it may set
  ** *result to the status tool's answer (JSON text of *result_len bytes),
  ** which stays the hook's and must stay valid until the hook is called
  ** again or idem_guard_run returns (keep it in ctx).  NULL: such a check
  ** is not made, and the action stays in doubt (the model is told
  ** outcome_unknown, with the check to make). */
  int (*check)(void *ctx, const idem_step *s, const char **result,
               size_t *result_len);
  /* Hand the answer over here, at ANSWER, instead of after the run: write
  ** the envelope (len bytes) to the model's reader and record what it was
  ** told - idem_step_delivered(s) just before the write when the reader is
  ** still there, idem_step_undelivered(s) when the write then fails (SPEC
  ** §10, "told").  Return IDEM_OK, or the error of either call (the run
  ** fails with it).  The envelope is returned as well.  NULL: the library
  ** calls idem_step_delivered and the caller hands the envelope over. */
  int (*deliver)(void *ctx, idem_step *s, const char *env, size_t len);
} idem_run_hooks;

/*
** Guard one call of an HTTP tool end to end: decide it (SPEC §6), make its
** request within the tool's timeout_ms, retry with backoff and the same key
** as the policy says, reconcile an unknown outcome with the policy's status
** tool when that is an HTTP tool too, and answer.  A response of any kind
** ends the attempt; only one whose status the policy maps to applied, not
** applied or rejected is a verdict (SPEC §6a: a 5xx, 408, 409 or an
** unreadable answer may still land); a timeout or a reset after sending
** does not even end it.  read_only and idempotent tools run with
** nothing recorded (idempotent ones retried); a refused tool answers
** refused without a request.  *envelope is the answer (SPEC §7), marked
** delivered - or handed over by hooks->deliver, which records what was
** told: free it with idem_free().  hooks may be NULL.
**
** Returns IDEM_OK whenever there is an envelope (whatever its status), or:
**   IDEM_POLICY  the tool is not refused and has no "http" rule (run it
**                with idem_guard_call instead);
**   IDEM_ERROR   HTTP tools cannot run here (idem_http_missing());
**   IDEM_MISUSE  a NULL argument, a bad handle, hooks->size 0;
**   an error of the attempt log (IDEM_STORE, IDEM_BUSY, IDEM_NOMEM, ...).
** In the first three cases nothing was recorded or sent.  The reason is
** idem_guard_errmsg(g), and names the tool.  *envelope is NULL on failure.
**
** Runs on the calling thread (libcurl's own deadline bounds each request:
** no worker thread), and calls the hooks there.  Many threads may run
** calls on one guard at once; each call uses its own connection.
*/
IDEM_API int idem_guard_run(idem_guard *g, const idem_call *call,
                            const idem_run_hooks *hooks, char **envelope,
                            size_t *len);

/*
** The status check of step s (at IDEM_NEXT_CHECK), when the policy's status
** tool (idem_step_check_tool) is an HTTP tool: the request with the
** status arguments (idem_step_check_args) and the key of the action under
** check, within idem_step_deadline_ms(s), its 2xx answer read by the
** policy's applied_when.  For front ends that drive steps themselves
** (`idem recover`, `idem exec` with an HTTP status tool); resolve s with
** what it says: idem_step_resolve(s, *outcome, *result, *result_len).
**
** IDEM_OK and *outcome APPLIED (*result is the status tool's answer),
** NOT_APPLIED, or UNKNOWN - the check could not be made or answered
** otherwise; *error then says why (HTTP tools unavailable, a template that
** cannot be filled, "HTTP 503 ..."), else NULL.  Free *result and *error
** with idem_free().  IDEM_POLICY when the status tool is none or has no
** "http" rule (nothing was sent: make the check another way), IDEM_MISUSE
** when s is not at CHECK.  error may be NULL.
*/
IDEM_API int idem_step_check_http(idem_step *s, int *outcome, char **result,
                                  size_t *result_len, char **error);

#ifdef __cplusplus
}
#endif

#endif /* IDEM_H */
