/*
** guard.c - deciding a call (SPEC §6).
**
** A step walks one call through these phases; each ends by telling the
** caller what to do next (enum idem_next):
**
**   classify   refused -> ANSWER; read_only/idempotent -> PASS (EXECUTE,
**              nothing recorded); guarded -> mint the key, look up.
**   lookup     the action (session, call id) exists -> EXISTING; else an
**              identical call of this turn that ended without an effect
**              and whose decision was handed on (turn_kin, carrier) ->
**              FENCE with the call that carries it out; else the store's
**              atomic begin: INSERTED (the pending record is durable now)
**              -> EXECUTE; FOUND -> EXISTING; FENCED -> FENCE.
**   EXISTING   another fingerprint -> conflict.  succeeded / failed /
**              deduplicated -> replay.  pending under a live owner -> WAIT
**              (bounded by wait_ms, then in_progress).  pending with a dead
**              owner or an expired lease, or in_doubt -> take the lease
**              over (the token grows) and RECONCILE.  not_applied -> the
**              call it was handed to decides, as FENCE (duplicate_of: the
**              call that fenced it, or that released it and went ahead;
**              handed_to, kin_search), else a call of its turn, else the
**              fence as of its first issue, else take over durably and
**              EXECUTE again with the same key.
**   FENCE      the earlier action is succeeded and not yet told, or is a
**              call of this turn that succeeded or was answered
**              already_applied -> record this call deduplicated (of the
**              call that ran), answer already_applied.  In flight
**              -> WAIT, then look again.  In doubt -> take it over and
**              CHECK it; applied -> already_applied; not applied and none
**              of its attempts can still land -> release it to this call
**              (it names this call) and begin this call: if this call goes
**              ahead, it carries that action out; else outcome_unknown
**              naming it (and this call is
**              recorded not_applied, fenced by it).
**   EXECUTE    the caller calls downstream and reports the outcome: applied
**              -> succeeded; rejected -> failed; not applied -> retry with
**              backoff (durably pending again first); unknown -> in_doubt,
**              then retry with the same key when the provider dedupes on
**              it, else RECONCILE.
**   RECONCILE  a status check when the policy names one (CHECK), else
**              outcome_unknown.  "Not applied" proves only that no attempt
**              has landed YET (SPEC §6a): it runs the action again only
**              when no attempt can still land (may_land: the record's
**              executor, pgid and settle_from), else the action stays in
**              doubt - outcome_unknown, or in_progress on a resume while
**              the executor lives.
**   UNRECORDED an outcome (of the tool or a check) that the log cannot
**              take - the disk filled while the call ran - is answered
**              outcome_unknown in words that say so, never failed.  The
**              record stays as it was under our live lease; the guard
**              remembers it (orphans), so that a later call of it in this
**              process takes it over as from an owner that is gone.
**
** Ended is not finished (§6a).  An attempt FINISHES only on a verdict: the
** outcome applied, rejected or not applied, from the tool itself or a
** check.  An attempt that ENDED without one (the function returned
** "unknown" or raised, the command exited with an unknown status, the
** server answered isError, an HTTP 5xx) has handed its request on for all
** anyone knows: its record keeps settle_from (IDEM__EXEC_ENDED), and it
** may land until the tool's settle_ms has passed since.  Only settle_ms 0
** (effects end with the executor) makes the end itself a finish.
**
** Invariants.  No EXECUTE is handed out unless the store has durably
** recorded the action as pending with this step's token (begin, or a
** durable change).  Every write is a compare-and-set on state and token, so
** a step that lost its lease can only resolve an in_doubt record (a late
** result) and never overwrite a terminal one; a step that finds it lost a
** race re-reads the record and decides again.  Each attempt has a token of
** its own, so a late word of an earlier attempt settles a later one only
** when it says "applied".  A record never says "nothing can land" of an
** action some attempt of which still may.  Crash points (SPEC §11) sit at
** the four places where a crash leaves a different trace.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "canon.h"

#define GUARD_MAGIC 0x1de36a2du
#define STEP_MAGIC 0x1de35e9au
#define BIT(state) (1u << (state))
#define ALL_STATES 0xFEu
#define POLL_MS 25
#define RACE_LIMIT 16 /* re-decisions after lost races before giving up */
#define ORPHANS 16    /* unrecorded outcomes remembered (answer_unrecorded) */

#define CANON_POOL 64
#define WORKER_IDLE_S 30 /* an idle worker of idem_guard_call lives this long */
/* How long a hand-off to or from a tool worker is waited for awake (yielding
** the CPU) before sleeping on a condition variable: see "hand-offs" below. */
#define WORKER_SPIN_US 250 /* an idle worker, for the next job */
#define CALLER_SPIN_US 50  /* a caller, for its tool's answer */

typedef struct workers workers;

/* A record this process left pending under its own lease because the
** outcome of its attempt could not be written: nobody holds it any more,
** though its owner (this process) is alive. */
typedef struct orphan {
  char *session, *call_id;
  long long token;
} orphan;

struct idem_guard {
  unsigned magic;
  pthread_mutex_t mu;
  int refs; /* the user's, one per live step, one per tool run in flight */
  idem__store *st;
  const idem_policy *policy;
  char owner[128];
  char *log; /* the log's URL, as given or defaulted */
  /* idem_canon workspaces that steps have given back: a step takes one
  ** rather than opening its own, so a replay allocates almost nothing and
  ** never fetches SHA-256 from libcrypto again */
  idem_canon *pool[CANON_POOL];
  int npool;
  workers *workers; /* idem_guard_call's tool threads, made on first use */
  pthread_mutex_t emu;   /* guards errs                                  */
  struct err_slot *errs; /* the last failure's words, per thread         */
  int defer_start;  /* a runner hands itself in as each attempt's executor */
  long long pgid;   /* the process group our attempts run in, or 0       */
  orphan orphans[ORPHANS]; /* the last ones, a ring (under mu)            */
  int norphan;
};

enum phase {
  PH_ANSWERED = 0,
  PH_PASS,          /* EXECUTE of a tool that is not guarded      */
  PH_EXEC,          /* EXECUTE of our own action                  */
  PH_CHECK_OWN,     /* CHECK of our own action                    */
  PH_CHECK_EARLIER, /* CHECK of the action that fences this call  */
  PH_WAIT           /* WAIT, then decide again from the lookup    */
};

struct idem_step {
  unsigned magic;
  idem_guard *g;
  const idem__tool_rule *rule;
  idem__tool_rule scratch;
  idem_canon *c;
  char *session, *call_id, *tool;
  char *turn; /* the model turn that issued the call, or NULL */
  char *key, *fingerprint, *args, *send_args, *fence_key;
  char *fence_v0[2]; /* fence keys of an earlier idem, where they differ */
                     /* (make_fence_key); NULL otherwise                 */
  size_t args_len, send_len;
  char *check_args; /* status-check arguments, canonical */
  size_t check_len;
  int phase, next, answer;
  int attempt;     /* the coming or last downstream attempt (1, 2, ...) */
  long long token; /* our fencing token while we hold the lease         */
  long long delay_ms, wait_until;
  long long started; /* when the call was made: its record's created */
  long long deadline; /* when the caller expects an answer (monotonic):  */
                      /* a lost log is retried no longer (store.c)       */
  int fresh;          /* this call made its record: never a replay       */
  int races;
  int late_ok;          /* an execute timed out: a late finish is recorded   */
  int doubted;          /* this EXECUTE retries an attempt whose outcome is  */
                        /* unknown: "not applied" says nothing of that one   */
  int recover;          /* idem_guard_recover: check, never execute          */
  int auto_deliver;     /* idem_guard_call: the answer goes to the model now  */
  int queued;           /* an operation of a queue holds it (atomic)         */
  int told;             /* the delivery is recorded already                  */
  int stamped;          /* ... and this step recorded it: undelivered undoes */
  struct {              /* the earlier action this call was answered with */
    char *session;      /* (deduplicate): the record it fenced with, and  */
    char *call_id;      /* the call that ran when that one is a duplicate */
    long long was;      /* its delivered before this step stamped it      */
    int stamped;        /* this step stamped it                           */
  } dup[2];
  int own_check;        /* the caller runs a status check of its own         */
  int ended;            /* the attempt being finished has ended: nothing of  */
                        /* it runs, yet without a verdict it may land (§6a) */
  idem_record *earlier; /* the fencing action, in FENCE and its CHECK     */
  char *why; /* what left our own action in doubt, in the executor's words */
             /* ("no answer within 5000 ms"); said to the model, or NULL  */
  long long t0; /* when it began (idem__mono_us): its answer's latency     */
  int counted;  /* its answer is counted (metrics.c)                      */
  int no_check; /* the CHECK is answered unknown without running one     */
  idem__buf env;
};

/* ---- errors --------------------------------------------------------------- */

/*
** A failure's message belongs to the guard and to the thread that made the
** failing call: each thread that has failed on g has a slot of its own, so
** one thread's failure never rewrites the text another thread is reading.
** Slots are found by thread id and never freed before the guard; a thread
** id the system reuses takes over its slot.  The list is as long as the
** number of threads that ever failed on g at once, in practice a pool's.
*/
typedef struct err_slot {
  struct err_slot *next;
  pthread_t tid;
  char msg[512];
} err_slot;

static err_slot *err_find(const idem_guard *g, pthread_t self) {
  err_slot *e;
  for (e = g->errs; e; e = e->next)
    if (pthread_equal(e->tid, self)) return e;
  return NULL;
}

static int gfail(idem_guard *g, int rc, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int gfail_v(idem_guard *g, int rc, const char *fmt, va_list ap)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 0)))
#endif
    ;
static int gfail_v(idem_guard *g, int rc, const char *fmt, va_list ap) {
  pthread_t self = pthread_self();
  err_slot *e;
  if (!g) return rc;
  pthread_mutex_lock(&g->emu);
  if (!(e = err_find(g, self)) && (e = idem__malloc(sizeof *e)) != NULL) {
    e->tid = self;
    e->next = g->errs;
    g->errs = e;
  }
  pthread_mutex_unlock(&g->emu);
  if (e) vsnprintf(e->msg, sizeof e->msg, fmt, ap); /* else no room even */
  return rc;                                         /* for the message   */
}

static int gfail(idem_guard *g, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  rc = gfail_v(g, rc, fmt, ap);
  va_end(ap);
  return rc;
}

static int store_fail(idem_guard *g, int rc) {
  return gfail(g, rc, "attempt log: %s", g->st->vt->errmsg(g->st));
}

const char *idem_guard_errmsg(const idem_guard *g) {
  const err_slot *e;
  if (!g || g->magic != GUARD_MAGIC) return "bad idem_guard handle";
  pthread_mutex_lock((pthread_mutex_t *)&g->emu);
  e = err_find(g, pthread_self());
  pthread_mutex_unlock((pthread_mutex_t *)&g->emu);
  return e ? e->msg : "";
}

/* ---- small helpers -------------------------------------------------------- */

static long long now_ms(idem_step *s) {
  long long t = 0;
  if (s->g->st->vt->now(s->g->st, &t) != IDEM_OK) t = idem__wall_ms();
  return t;
}

/* Until when a record of tool rule r settled at now is kept (SPEC §5: its
** retention counts from its last settlement; idem__change.expires). */
static long long kept_until(const idem__tool_rule *r, long long now) {
  return now + r->retention_s * 1000;
}

/* The delay before retry n (1, 2, ...): backoff_ms doubling, capped at a
** minute so that no shift overflows. */
static long long backoff(const idem__tool_rule *r, int n) {
  long long d = r->backoff_ms;
  while (--n > 0 && d < 60000) d *= 2;
  return d < 60000 ? d : 60000;
}

/* Is there a status check: the policy's, or the caller's own function? */
static int has_check(const idem_step *s) {
  const idem__tool_rule *r = s->rule;
  return s->own_check ||
         (r->has_status && (r->status.tool || r->status.command));
}

/* ---- attempts still in flight (SPEC §6a) ------------------------------------ */

/* Is r's executor at work: its process lives (this machine), or it is on
** another machine and still renews the lease it holds? */
static int executor_live(const idem_record *r, long long now) {
  int alive;
  if (!r->executor) return 0;
  alive = idem__owner_alive(r->executor);
  if (alive >= 0) return alive;
  return r->owner && strcmp(r->owner, r->executor) == 0 && r->lease_until > now;
}

/* Would a new attempt with r's key be harmless: the provider dedupes on
** it, and the key is younger than the provider keeps keys? */
static int dedupe_covers(idem_step *s, const idem_record *r) {
  return s->rule->provider_dedupes &&
         r->created + s->rule->provider_key_ttl_s * 1000 > now_ms(s);
}

/* Can an earlier attempt of r still land?  Not when none started since
** the last verdict (no executor, settle_from 0).  An attempt that stopped
** being watched - its deadline passed, it ended without a verdict, its
** executor died - may land until settle_ms has passed since settle_from,
** whether its executor lives or not (a runner kills the command then);
** with settle_ms 0 (effects end with the executor), until nothing of it
** runs: its executor gone or done, and its own process group empty. */
static int may_land_by(const idem__tool_rule *rule, const idem_record *r,
                       long long now) {
  if (!r->executor && !r->settle_from) return 0;
  if (r->executor) {
    int alive = idem__owner_alive(r->executor);
    long long group = r->pgid < 0 ? -r->pgid : r->pgid;
    int group_gone = group > 0 && idem_process_group_empty(group);
    /* something of its own process group still runs: a runner that lives
    ** ends it itself when settle_ms is up; with settle_ms 0, it is the
    ** effect still at work */
    if (r->pgid > 0 && !group_gone && (alive == 1 || rule->settle_ms == 0))
      return 1;
    /* its executor died and nothing of the group is left: it has ended
    ** without a verdict, which with settle_ms 0 is the end of it */
    if (rule->settle_ms == 0 && alive == 0 && (group == 0 || group_gone))
      return 0;
  }
  if (rule->settle_ms < 0) return 1;
  return now < r->settle_from + rule->settle_ms;
}

static int may_land(idem_step *s, const idem_record *r) {
  return may_land_by(s->rule, r, now_ms(s));
}

/* Does something of r's last attempt still run: its executor at work, or
** its own process group not empty? */
static int still_runs(const idem_record *r, long long now) {
  if (!r->executor) return 0;
  if (r->pgid > 0 && !idem_process_group_empty(r->pgid)) return 1;
  return executor_live(r, now);
}

/* May this action be tried again with its own key, without a verdict on
** its last attempt?  Only under a provider that dedupes on the key, with
** retries left, once nothing of the attempt still runs: one that ended
** without a verdict, or whose executor died, may land, harmlessly then.
** (The record tracks one attempt: none starts while one still runs.) */
static int dedupe_retry(idem_step *s, const idem_record *r) {
  return dedupe_covers(s, r) && r->attempts < s->rule->retries + 1 &&
         (!still_runs(r, now_ms(s)) || !may_land(s, r));
}

/* ---- answers -------------------------------------------------------------- */

/* Finish the step with an envelope. */
static int answer(idem_step *s, int ans, int replayed, int attempts,
                  const char *result, const char *dup_of, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 7, 8)))
#endif
    ;
static int answer(idem_step *s, int ans, int replayed, int attempts,
                  const char *result, const char *dup_of, const char *fmt,
                  ...) {
  char msg[1024];
  idem__env e;
  int rc;
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
  }
  memset(&e, 0, sizeof e);
  e.answer = ans;
  e.tool = s->tool;
  e.call_id = s->call_id;
  e.key = s->key;
  e.replayed = replayed;
  e.attempts = attempts;
  e.result = result;
  e.message = fmt ? msg : NULL;
  e.duplicate_of = dup_of;
  if (ans == IDEM_ANSWER_OUTCOME_UNKNOWN && s->rule->has_status &&
      s->rule->status.tool) {
    e.check_tool = s->rule->status.tool;
    e.check_args = s->check_args;
  }
  s->phase = PH_ANSWERED;
  s->next = IDEM_NEXT_ANSWER;
  s->answer = ans;
  if (!s->counted) {
    s->counted = 1;
    idem__metric_answer(ans, replayed, dup_of && !replayed,
                        idem__mono_us() - s->t0);
  }
  if ((rc = idem__envelope(&s->env, &e)))
    return gfail(s->g, IDEM_NOMEM, "out of memory building the envelope");
  return IDEM_OK;
}

/* The one safe next move after an unknown outcome. */
static const char *check_hint(idem_step *s, char *buf, size_t n) {
  const idem__tool_rule *r = s->rule;
  if (r->has_status && r->status.tool)
    snprintf(buf, n,
             "Do not call %s again before checking: call %s with %s first.",
             s->tool, r->status.tool, s->check_args ? s->check_args : "{}");
  else if ((r->has_status && r->status.command) || s->own_check)
    snprintf(buf, n,
             "Do not call %s again; the status check could not settle it, "
             "so tell the user the outcome is not yet known.",
             s->tool);
  else
    snprintf(buf, n,
             "Do not call %s again for this; there is no status check for "
             "it, so tell the user the outcome is not yet known.",
             s->tool);
  return buf;
}

static void note_fenced(idem_step *s, const char *whose);

/* Why an action pending under an owner that is gone is in doubt. */
static const char OWNER_GONE[] =
    "the process running it stopped before recording an outcome";
/* Why an action whose outcome this process could not record is. */
static const char UNRECORDED[] =
    "it ran, but the attempt log could not record its outcome";

/* Remember what left our own action in doubt (the record's error). */
static void set_why(idem_step *s, const char *why) {
  char *w = why ? idem__strdup(why) : NULL;
  idem__free(s->why);
  s->why = w; /* out of memory: the answer is still true, with fewer words */
}

static int answer_unknown(idem_step *s, const char *whose) {
  char hint[512];
  if (whose) note_fenced(s, whose);
  if (whose)
    return answer(s, IDEM_ANSWER_OUTCOME_UNKNOWN, 0, 0, NULL, whose,
                  "An identical %s call (call id %s) is unresolved: it is not "
                  "known whether it took effect, so this call was not run. %s",
                  s->tool, whose, check_hint(s, hint, sizeof hint));
  /* the executor's words say what happened: a deadline, a server that
  ** exited, an HTTP 500 - the status is the same, the reason is not */
  return answer(s, IDEM_ANSWER_OUTCOME_UNKNOWN, 0, s->attempt, NULL, NULL,
                "It is not known whether the %s call took effect%s%.300s%s. "
                "%s",
                s->tool, s->why ? " (" : "", s->why ? s->why : "",
                s->why ? ")" : "", check_hint(s, hint, sizeof hint));
}

/* An attempt ran - its executor (or, checked != 0, a status check)
** reported outcome (enum idem_outcome) - but the log could not record
** that (a full disk, a lost connection): the record stays as it was, under
** our lease, and the answer says what is known.  Never failed, never "safe
** to call again": the effect may be there, and nothing in the log says so.
** The guard remembers the record as orphaned: nobody holds it (orphaned()).
** The log's error stays idem_guard_errmsg(). */
static int answer_unrecorded(idem_step *s, int outcome, const char *error,
                             int checked) {
  char hint[512], why[512];
  const char *said = outcome == IDEM_OUTCOME_APPLIED    ? "it took effect"
                     : outcome == IDEM_OUTCOME_REJECTED ? "it was rejected"
                     : outcome == IDEM_OUTCOME_NOT_APPLIED
                         ? "it did not take effect"
                         : "its outcome is unknown";
  orphan *o;
  snprintf(why, sizeof why, "%s", idem_guard_errmsg(s->g));
  pthread_mutex_lock(&s->g->mu);
  o = &s->g->orphans[s->g->norphan];
  s->g->norphan = (s->g->norphan + 1) % ORPHANS;
  idem__free(o->session);
  idem__free(o->call_id);
  o->session = idem__strdup(s->session);
  o->call_id = idem__strdup(s->call_id);
  o->token = s->token;
  pthread_mutex_unlock(&s->g->mu);
  return answer(s, IDEM_ANSWER_OUTCOME_UNKNOWN, 0, s->attempt, NULL, NULL,
                "The %s call ran and %s that %s%s%.200s%s, but the attempt "
                "log could not record this (%.300s). %s",
                s->tool, checked ? "a status check found" : "its executor "
                "reported", said, error ? " (" : "", error ? error : "",
                error ? ")" : "", why, check_hint(s, hint, sizeof hint));
}

/* The status check did not find the action, but an attempt of it may
** still land (SPEC §6a): it stays in doubt.  A resume whose executor is
** still at work hears in_progress; everyone else outcome_unknown, never
** "failed" or "safe to call again". */
static int answer_pending_landing(idem_step *s, const idem_record *r,
                                  const char *whose) {
  char hint[512];
  if (!whose && !s->late_ok && executor_live(r, now_ms(s)))
    return answer(s, IDEM_ANSWER_IN_PROGRESS, 0, r->attempts, NULL, NULL,
                  "This %s call is still being carried out: its attempt has "
                  "not ended, and its result will be recorded when it does. "
                  "Do not call it again with a new call id; repeat this same "
                  "call later to get its outcome.",
                  s->tool);
  if (whose) note_fenced(s, whose);
  if (whose)
    return answer(s, IDEM_ANSWER_OUTCOME_UNKNOWN, 0, 0, NULL, whose,
                  "An identical %s call (call id %s) has not finished: it "
                  "may still take effect, though a status check does not "
                  "show it yet, so this call was not run. %s",
                  s->tool, whose, check_hint(s, hint, sizeof hint));
  return answer(s, IDEM_ANSWER_OUTCOME_UNKNOWN, 0, r->attempts, NULL, NULL,
                "The %s call has not finished%s%.300s%s: it may still take "
                "effect, though a status check does not show it yet. %s",
                s->tool, r->error ? " (" : "", r->error ? r->error : "",
                r->error ? ")" : "", check_hint(s, hint, sizeof hint));
}

/* Answer with the outcome a terminal record holds. */
static int answer_outcome(idem_step *s, const idem_record *r, int replayed) {
  switch (r->state) {
  case IDEM_STATE_SUCCEEDED:
    return answer(s, IDEM_ANSWER_SUCCEEDED, replayed, r->attempts, r->result,
                  NULL, NULL);
  case IDEM_STATE_FAILED:
    return answer(s, IDEM_ANSWER_FAILED, replayed, r->attempts, r->result, NULL,
                  "The %s call was rejected and did not take effect%s%s. Do "
                  "not repeat it unchanged; fix the arguments or ask the "
                  "user.",
                  s->tool, r->error ? ": " : "", r->error ? r->error : "");
  default: /* IDEM_STATE_DEDUPLICATED */
    return answer(s, IDEM_ANSWER_ALREADY_APPLIED, replayed, r->attempts,
                  r->result, r->duplicate_of,
                  "This %s action was already carried out by call %s and was "
                  "not repeated; its result is included. Do not call it "
                  "again.",
                  s->tool, r->duplicate_of ? r->duplicate_of : "?");
  }
}

/* ---- the record of this call ---------------------------------------------- */

static void fill_record(idem_step *s, idem_record *r, long long now) {
  memset(r, 0, sizeof *r);
  r->session = s->session;
  r->call_id = s->call_id;
  r->tool = s->tool;
  r->turn = s->turn;
  r->fingerprint = s->fingerprint;
  r->key = s->key;
  r->args = s->args;
  r->fence_key = s->fence_key;
  r->cls = IDEM_CLASS_GUARDED;
  r->state = IDEM_STATE_PENDING;
  r->owner = s->g->owner;
  r->lease_until = now + idem__lease_ms(s->rule);
  r->token = 1;
  /* the attempt about to run (SPEC §6a); a runner records itself when it
  ** is about to start the command: until then nothing has started */
  r->executor = s->g->defer_start ? NULL : s->g->owner;
  r->pgid = s->g->defer_start ? 0 : s->g->pgid;
  r->settle_from = s->g->defer_start ? 0 : now + s->rule->timeout_ms;
  r->created = s->started ? s->started : now;
  r->updated = now;
  r->expires = kept_until(s->rule, now);
}

/* A new call that the fence held back - answered outcome_unknown or
** in_progress, naming the earlier call whose - is recorded: not_applied
** (it never ran), fenced by whose.  Its replay then meets the fence as of
** its first issue, instead of counting as a new decision once whose's
** outcome has been told (the harness resuming the turn of a re-issue).
** Best effort: without the record the answer stays honest. */
static void note_fenced(idem_step *s, const char *whose) {
  idem_record rec, *found = NULL;
  int what = 0;
  fill_record(s, &rec, now_ms(s));
  rec.state = IDEM_STATE_NOT_APPLIED;
  rec.owner = NULL;
  rec.lease_until = 0;
  rec.executor = NULL;
  rec.settle_from = 0;
  rec.duplicate_of = (char *)(uintptr_t)whose;
  if (s->g->st->vt->insert(s->g->st, &rec, &what, &found) == IDEM_OK)
    idem_record_free(found); /* FOUND: its record is there already */
}

/* A compare-and-set on a record: of this call by default. */
static void change_init(idem_step *s, idem__change *ch, const idem_record *r) {
  memset(ch, 0, sizeof *ch);
  ch->session = r ? r->session : s->session;
  ch->call_id = r ? r->call_id : s->call_id;
  ch->expect_token = -1;
  ch->delivered = -1;
}

static int decide(idem_step *s);
static int decide_existing(idem_step *s, idem_record *r);
static int decide_fenced(idem_step *s, idem_record *e);

/* We lost a race on the record: read it again and decide anew.  Callers
** of one action racing each other (transport retries of one call id, each
** with its status check) can change it under us again and again; after
** RACE_LIMIT of them the others are at work on it, and that is what this
** caller hears: in_progress, to repeat the same call for its outcome.
** Never a failure, nor a word that the log could not record it: a harness
** maps a failure to "failed", and its re-issue is then a new decision
** while the action may well have succeeded (issue 35). */
static int lost_race(idem_step *s, idem_record *now) {
  idem_record_free(now);
  if (++s->races > RACE_LIMIT)
    return answer(s, IDEM_ANSWER_IN_PROGRESS, 0, 0, NULL, NULL,
                  "This %s call is being carried out by other callers of "
                  "the same call id right now. Do not call it again with a "
                  "new call id; repeat this same call (same call id) in a "
                  "moment to get its outcome.",
                  s->tool);
  return decide(s);
}

static int to_execute(idem_step *s, long long delay) {
  idem__metric_add(IDEM__M_ATTEMPTS);
  s->deadline = idem__mono_ms() + delay + s->rule->timeout_ms;
  s->ended = 0;
  s->phase = PH_EXEC;
  s->next = IDEM_NEXT_EXECUTE;
  s->delay_ms = delay;
  return IDEM_OK;
}

/* Apply ch to the log: the record after it, or NULL and *rc is what the
** step ends with - a fresh decision after a lost race, or a failure of the
** log. */
static idem_record *apply(idem_step *s, const idem__change *ch, int *rc) {
  idem_record *now = NULL;
  *rc = s->g->st->vt->change(s->g->st, ch, &now);
  if (*rc == IDEM_OK) return now;
  if (*rc == IDEM_STALE)
    *rc = lost_race(s, now);
  else {
    idem_record_free(now);
    *rc = store_fail(s->g, *rc);
  }
  return NULL;
}

/* ch starts a new attempt: its executor is this process (or the runner
** that will hand itself in), its deadline delay + timeout_ms from now.
** (No attempt starts while an earlier one may still land, not even under
** a provider that dedupes: the record tracks one attempt, exactly.) */
static void new_attempt(idem_step *s, idem__change *ch, long long delay) {
  ch->exec_set = IDEM__EXEC_SET;
  ch->executor = s->g->defer_start ? NULL : s->g->owner;
  ch->pgid = s->g->defer_start ? 0 : s->g->pgid;
  ch->settle_from =
      s->g->defer_start ? 0 : now_ms(s) + delay + s->rule->timeout_ms;
}

/* Our record, in_doubt or not_applied and held by us, goes back to pending
** durably before the next attempt (no downstream call without a durable
** record of it).  The token grows: it names the attempt, so that a late
** word from the earlier one cannot settle this one.  check: the answer of
** the status check that sends it back (recorded with it), or 0. */
static int repend(idem_step *s, int from_state, long long delay, int check) {
  idem__change ch;
  idem_record *now = NULL;
  int rc;
  change_init(s, &ch, NULL);
  ch.check = check;
  ch.from = BIT(from_state);
  ch.expect_token = s->token;
  ch.state = IDEM_STATE_PENDING;
  ch.durable = 1;
  ch.take_lease = IDEM__LEASE_TAKE;
  ch.owner = s->g->owner;
  ch.lease_until = now_ms(s) + idem__lease_ms(s->rule);
  new_attempt(s, &ch, delay);
  if (!(now = apply(s, &ch, &rc))) return rc;
  s->token = now->token;
  idem_record_free(now);
  idem_crash_point("after_pending_commit");
  return to_execute(s, delay);
}

/* The change that takes record r's lease over (its token grows), leaving it
** in state (IN_DOUBT to reconcile, PENDING to execute). */
static void lease_change(idem_step *s, idem__change *ch, const idem_record *r,
                         int state, int durable) {
  long long now = now_ms(s);
  change_init(s, ch, r);
  ch->from = BIT(IDEM_STATE_PENDING) | BIT(IDEM_STATE_IN_DOUBT) |
             BIT(IDEM_STATE_NOT_APPLIED);
  ch->expect_token = r->token;
  ch->state = state;
  ch->take_lease = IDEM__LEASE_TAKE;
  ch->owner = s->g->owner;
  ch->lease_until = now + idem__lease_ms(s->rule);
  ch->durable = durable;
  /* a pending record is taken from the holder it was judged by, not from
  ** whoever holds it now (a hand-over keeps the token) */
  if (r->state == IDEM_STATE_PENDING) ch->expect_owner = r->owner;
  if (state == IDEM_STATE_PENDING)
    new_attempt(s, ch, 0); /* we execute next: nothing can land */
  else if (r->executor && !executor_live(r, now))
    ch->settle_cap = now; /* its executor's death is seen now (§6a) */
}

/* Take r over (r is consumed): the record as it is now, ours; or NULL with
** *rc as apply() says. */
static idem_record *seize(idem_step *s, idem_record *r, int state, int durable,
                          int *rc) {
  idem__change ch;
  idem_record *now;
  lease_change(s, &ch, r, state, durable);
  now = apply(s, &ch, rc);
  idem_record_free(r);
  return now;
}

/* ---- status-check arguments ------------------------------------------------ */

/* The canonical value of top-level argument name in s->args, into *v (a
** pointer into s->c's output) or "null". */
static void arg_value(idem_step *s, const char *name, size_t n, const char **v,
                      size_t *vlen) {
  if (!idem__tmpl_arg(s->c, name, n, v, vlen)) {
    *v = "null";
    *vlen = 4;
  }
}

/* Fill the template of the status arguments (template.c): a string
** "{name}" becomes the value of argument name, "{$key}" the key. */
static int build_check_args(idem_step *s, const char *args, size_t args_len,
                            const char *key) {
  const char *t = s->rule->status.arguments;
  idem__buf out;
  int rc;
  idem__free(s->check_args);
  s->check_args = NULL;
  if (!s->rule->has_status || !s->rule->status.tool) return IDEM_OK;
  if ((rc = idem__tmpl_args(s->c, args, args_len))) return rc;
  idem__buf_init(&out, s->c->out.cap);
  rc = idem__tmpl_json(s->c, &out, t ? t : "{}", key);
  if (!rc) {
    s->check_args = idem__strndup(out.p, out.len);
    s->check_len = out.len;
    if (!s->check_args) rc = IDEM_NOMEM;
  }
  idem__buf_free(&out);
  return rc ? gfail(s->g, rc, "cannot build the status-check arguments")
            : IDEM_OK;
}

/* ---- reconciliation ------------------------------------------------------- */

/* Our own action is in doubt and held by us (s->token): check, retry or
** answer unknown. */
static int reconcile_own(idem_step *s, const idem_record *r) {
  s->attempt = r->attempts;
  set_why(s, r->error ? r->error : s->why);
  if (has_check(s)) {
    int rc = build_check_args(s, s->args, s->args_len, s->key);
    if (rc) return rc;
    s->phase = PH_CHECK_OWN;
    s->deadline = idem__mono_ms() + s->rule->reconcile_timeout_ms;
    s->next = IDEM_NEXT_CHECK;
    s->delay_ms = 0;
    return IDEM_OK;
  }
  /* the provider dedupes: the same key again is harmless - once the
  ** attempt in doubt has ended (one attempt in flight at a time) */
  if (dedupe_retry(s, r)) {
    s->attempt = r->attempts + 1;
    return repend(s, IDEM_STATE_IN_DOUBT, 0, 0);
  }
  return answer_unknown(s, NULL);
}

/* ---- deciding ------------------------------------------------------------- */

/* Wait for another owner, up to wait_ms from the first wait (a duration
** of this process: the monotonic clock, which no step moves). */
static int wait_or(idem_step *s, const char *whose) {
  long long now = idem__mono_ms();
  if (!s->wait_until) s->wait_until = now + s->rule->wait_ms;
  if (now < s->wait_until) {
    s->phase = PH_WAIT;
    s->next = IDEM_NEXT_WAIT;
    s->delay_ms = POLL_MS;
    return IDEM_OK;
  }
  if (whose) note_fenced(s, whose);
  if (whose)
    return answer(s, IDEM_ANSWER_IN_PROGRESS, 0, 0, NULL, whose,
                  "An identical %s call (call id %s) is still running, so "
                  "this one was not run. Do not call it again; check its "
                  "outcome in a moment.",
                  s->tool, whose);
  return answer(s, IDEM_ANSWER_IN_PROGRESS, 0, 0, NULL, NULL,
                "This %s call is still being carried out by another worker. "
                "Do not call it again with a new call id; repeat this same "
                "call (same call id) in a moment to get its outcome.",
                s->tool);
}

/* Is a pending record's holder still at work? */
static int holder_live_at(const idem_record *r, long long now) {
  if (r->lease_until <= now) return 0;
  return idem__owner_alive(r->owner) != 0;
}

/* Did this guard leave r pending, its outcome unrecorded?  Then nobody
** holds it, though its owner lives. */
static int orphaned(idem_guard *g, const idem_record *r) {
  int found = 0;
  if (!r->owner || strcmp(r->owner, g->owner) != 0) return 0;
  pthread_mutex_lock(&g->mu);
  for (int i = 0; i < ORPHANS && !found; i++) {
    const orphan *o = &g->orphans[i];
    found = o->session && o->call_id && o->token == r->token &&
            !strcmp(o->session, r->session) && !strcmp(o->call_id, r->call_id);
  }
  pthread_mutex_unlock(&g->mu);
  return found;
}

static int holder_live(idem_step *s, const idem_record *r) {
  return holder_live_at(r, now_ms(s)) && !orphaned(s->g, r);
}

/* The one rule of which actions a recovery takes over (idem_guard_recover,
** and idem_guard_list's recoverable filter): in doubt, or pending under a
** holder that is gone or whose lease has run out by the log's clock. */
static int recoverable(const idem_record *r, long long now) {
  return r->state == IDEM_STATE_IN_DOUBT ||
         (r->state == IDEM_STATE_PENDING && !holder_live_at(r, now));
}

/* Who carries out a not_applied action r, by the calls it names
** (duplicate_of): the call that held it back (note_fenced: that call's
** fate is r's, wherever it leads), or the call that released it (a
** release hands the action only to a call that goes ahead).
**   HANDED_TO    *out, a call that went ahead: in flight, in doubt or
**                succeeded - it decides, as the fence does;
**   HANDED_NONE  no one: the decision ended without an effect (rejected,
**                told not applied), or its release went to a call that
**                did not go ahead - r runs again, with its own key;
**   HANDED_UNKNOWN  the names lead to no record of this session, or to
**                an action not applied that was never told: the fence as
**                of r's first issue decides (a re-issue may have gone
**                ahead unfenced). */
enum { HANDED_UNKNOWN, HANDED_TO, HANDED_NONE };

/* Released - or run again by its own replay after it was named on (the
** provider said "not applied"): either way it is carried out only by a
** call that went ahead, not by one its name reached that did not. */
static int released(const idem_record *r) {
  return r->state == IDEM_STATE_NOT_APPLIED &&
         (r->resolution == IDEM_RESOLVED_RECONCILED ||
          (r->resolution == IDEM_RESOLVED_EXECUTED && r->duplicate_of));
}

static int handed_to(idem_step *s, const idem_record *r, idem_record **out,
                     int *how, char **end) {
  idem_record *x = NULL, *prev = NULL;
  const char *link = r->duplicate_of;
  int hops, rc = IDEM_OK, by_release = released(r), told = r->delivered != 0;
  *out = NULL;
  *end = NULL;
  *how = HANDED_UNKNOWN;
  for (hops = 0; hops < 8; hops++) {
    if (!link || !*link) {
      *how = told ? HANDED_NONE : HANDED_UNKNOWN;
      if (told && prev) *end = idem__strdup(prev->call_id);
      break;
    }
    if (strcmp(link, s->call_id) == 0) { /* back to this call */
      *how = HANDED_NONE;
      break;
    }
    rc = s->g->st->vt->get(s->g->st, r->session, link, &x);
    if (rc != IDEM_OK) {
      rc = rc == IDEM_NOTFOUND ? IDEM_OK : store_fail(s->g, rc);
      break;
    }
    if (!x->fence_key || !r->fence_key || strcmp(x->fence_key, r->fence_key))
      break; /* another action under that call id (another scope) */
    if (x->state == IDEM_STATE_PENDING || x->state == IDEM_STATE_IN_DOUBT ||
        x->state == IDEM_STATE_SUCCEEDED) {
      *out = x;
      x = NULL;
      *how = HANDED_TO;
      break;
    }
    if (x->state == IDEM_STATE_FAILED ||
        (x->state == IDEM_STATE_DEDUPLICATED && by_release)) {
      *how = HANDED_NONE;
      if (x->state == IDEM_STATE_FAILED) *end = idem__strdup(x->call_id);
      break;
    }
    /* deduplicated: the call that ran carried it out; not applied: its
    ** own names go on */
    by_release = released(x);
    told = x->delivered != 0 && x->state == IDEM_STATE_NOT_APPLIED;
    idem_record_free(prev);
    prev = x; /* link points into it */
    x = NULL;
    link = prev->duplicate_of;
  }
  idem_record_free(x);
  idem_record_free(prev);
  return rc;
}

/* Note session/call_id, told at `was` (0: not yet), as the i-th earlier
** record this call's answer tells of. */
static int dup_note(idem_step *s, int i, const char *session,
                    const char *call_id, long long was) {
  idem__free(s->dup[i].session);
  idem__free(s->dup[i].call_id);
  s->dup[i].session = idem__strdup(session);
  s->dup[i].call_id = idem__strdup(call_id);
  s->dup[i].was = was;
  if (!s->dup[i].session || !s->dup[i].call_id)
    return gfail(s->g, IDEM_NOMEM, "out of memory");
  return IDEM_OK;
}

/* The same for the record session/call_id as the log has it now (none:
** nothing to note). */
static int dup_read(idem_step *s, int i, const char *session,
                    const char *call_id) {
  idem_record *x = NULL;
  int rc = s->g->st->vt->get(s->g->st, session, call_id, &x);
  if (rc == IDEM_OK)
    rc = dup_note(s, i, x->session, x->call_id, x->delivered);
  else
    rc = rc == IDEM_NOTFOUND ? IDEM_OK : store_fail(s->g, rc);
  idem_record_free(x);
  return rc;
}

/* The calls that `by` (r, or the call its names end at) held back are one
** decision with r, and so are the calls of their turns and of by's own:
** when `by` ended without an effect, one of those that went ahead (in
** flight, in doubt or succeeded; the newest) carries r's decision.  A
** held-back call's turn counts only when its first identical call is one
** that `by` held back: a turn whose decision was made before (a call that
** went ahead, then a replay held back by `by` in flight) is that decision,
** not by's.  Three scans of the records of r's fence key in r's session
** (the fence's index: a few), made only on this rare path. */
#define KIN_TURNS 16 /* turns looked at; a model rarely spreads one   */
                     /* decision over more                          */
typedef struct kin {
  const idem_record *r;
  const char *self, *by;
  char *turns[KIN_TURNS];
  char first[KIN_TURNS]; /* 1: its first call seen; 2: and not held */
  char own[KIN_TURNS];   /* by's own turn: counts whatever came first */
  int nturns, pass;
  char *best;
  long long best_created;
} kin;

static int went_ahead(const idem_record *y) {
  return y->state == IDEM_STATE_PENDING || y->state == IDEM_STATE_IN_DOUBT ||
         y->state == IDEM_STATE_SUCCEEDED;
}

static int kin_one(const idem_record *y, void *arg) {
  kin *k = arg;
  int held, i, of_turn = 0, t = -1;
  if (!y->fence_key || strcmp(y->fence_key, k->r->fence_key) != 0) return 0;
  held = (y->duplicate_of && strcmp(y->duplicate_of, k->by) == 0) ||
         strcmp(y->call_id, k->by) == 0;
  for (i = 0; i < k->nturns && y->turn; i++)
    if (strcmp(k->turns[i], y->turn) == 0) t = i;
  if (k->pass == 1) { /* records come oldest first: a turn's first call */
    if (t >= 0 && !k->first[t]) k->first[t] = held ? 1 : 2;
    return 0;
  }
  if (strcmp(y->call_id, k->r->call_id) == 0 ||
      strcmp(y->call_id, k->self) == 0)
    return 0;
  if (k->pass == 0) {
    if (held && y->turn && t < 0 && k->nturns < KIN_TURNS &&
        (k->turns[k->nturns] = idem__strdup(y->turn)) != NULL)
      t = k->nturns++;
    if (t >= 0 && strcmp(y->call_id, k->by) == 0) k->own[t] = 1;
    return 0;
  }
  of_turn = t >= 0 && (k->own[t] || k->first[t] == 1);
  if ((held || of_turn) && went_ahead(y) &&
      (!k->best || y->created > k->best_created)) {
    char *c = idem__strdup(y->call_id);
    if (c) {
      idem__free(k->best);
      k->best = c;
      k->best_created = y->created;
    }
  }
  return 0;
}

static int kin_search(idem_step *s, const idem_record *r, const char *by,
                      idem_record **out) {
  idem__filter f;
  kin k;
  int rc = IDEM_OK, i;
  *out = NULL;
  memset(&k, 0, sizeof k);
  memset(&f, 0, sizeof f);
  k.r = r;
  k.self = s->call_id;
  k.by = by;
  f.session = r->session;
  f.fence_key = r->fence_key; /* kin_one looks at no other */
  f.states = 0; /* all: a turn's first call may have been deduplicated */
  for (k.pass = 0; !rc && k.pass < 3; k.pass++)
    rc = s->g->st->vt->list(s->g->st, &f, kin_one, &k);
  if (!rc && k.best) {
    rc = s->g->st->vt->get(s->g->st, r->session, k.best, out);
    if (rc == IDEM_NOTFOUND) rc = IDEM_OK;
  }
  for (i = 0; i < k.nturns; i++) idem__free(k.turns[i]);
  idem__free(k.best);
  return rc ? store_fail(s->g, rc) : IDEM_OK;
}

/* The call that carries out the decision of r, an action that did not
** take effect (not applied, or failed: rejected), or NULL: the call it was
** handed to (handed_to); else, when it was handed to no one, the calls
** that r - or the call its names end at - held back, and their turns
** (kin_search).  A failed r ran itself: only the calls it held back.  The
** replay of r asks it (decide_existing), and so does a new call of r's
** turn (turn_kin): one decision, answered alike.  *how as handed_to's. */
static int carrier(idem_step *s, const idem_record *r, idem_record **out,
                   int *how) {
  char *end = NULL;
  int rc = IDEM_OK;
  *out = NULL;
  *how = HANDED_NONE;
  if (r->state == IDEM_STATE_NOT_APPLIED)
    rc = handed_to(s, r, out, how, &end);
  if (!rc && !*out && *how == HANDED_NONE && r->fence_key)
    rc = kin_search(s, r, end ? end : r->call_id, out);
  idem__free(end);
  return rc;
}

/* Before a new call begins: an identical call of its turn that ended
** without an effect (not applied, or failed) is its decision, and that
** decision may have been handed on (carrier): the call that carries it
** out decides, as the fence does (*out), else nothing (*out NULL) and the
** call begins.  One read of the fence key's records (the fence's index;
** a few), and a longer look only for such a call.  A call that begins
** between this read and our begin is pending or was told after this call
** was made: begin's fence holds this call on it. */
#define TURN_KIN 4 /* such calls of one turn looked at, newest first */
typedef struct turn_kin_ctx {
  const idem_step *s;
  char *sess[TURN_KIN], *call[TURN_KIN];
  int n; /* a ring of the newest */
} turn_kin_ctx;

static int same_turn(const idem_step *s, const idem_record *e);

static int turn_kin_one(const idem_record *y, void *arg) {
  turn_kin_ctx *k = arg;
  int i = k->n % TURN_KIN;
  if (!same_turn(k->s, y)) return 0;
  idem__free(k->sess[i]);
  idem__free(k->call[i]);
  k->sess[i] = idem__strdup(y->session);
  k->call[i] = idem__strdup(y->call_id);
  k->n++;
  return 0;
}

static int turn_kin(idem_step *s, idem_record **out) {
  idem__filter f;
  turn_kin_ctx k;
  int rc, i, j, how;
  *out = NULL;
  if (!s->fence_key || (!s->turn && s->rule->coalesce_ms <= 0))
    return IDEM_OK;
  memset(&f, 0, sizeof f);
  memset(&k, 0, sizeof k);
  k.s = s;
  f.fence_key = s->fence_key;
  f.states = BIT(IDEM_STATE_FAILED) | BIT(IDEM_STATE_NOT_APPLIED);
  rc = s->g->st->vt->list(s->g->st, &f, turn_kin_one, &k);
  if (rc) rc = store_fail(s->g, rc);
  for (j = 0; !rc && !*out && j < TURN_KIN && j < k.n; j++) {
    idem_record *r = NULL;
    i = (k.n - 1 - j) % TURN_KIN; /* newest first */
    if (!k.sess[i] || !k.call[i]) {
      rc = gfail(s->g, IDEM_NOMEM, "out of memory");
      break;
    }
    rc = s->g->st->vt->get(s->g->st, k.sess[i], k.call[i], &r);
    if (rc == IDEM_NOTFOUND) {
      rc = IDEM_OK;
      continue;
    }
    if (rc) {
      rc = store_fail(s->g, rc);
      break;
    }
    if (r->state == IDEM_STATE_FAILED || r->state == IDEM_STATE_NOT_APPLIED)
      rc = carrier(s, r, out, &how);
    idem_record_free(r);
  }
  for (i = 0; i < TURN_KIN; i++) {
    idem__free(k.sess[i]);
    idem__free(k.call[i]);
  }
  return rc;
}

static int decide_existing(idem_step *s, idem_record *r) {
  idem_record *now = NULL;
  int rc, how = HANDED_UNKNOWN;
  if (strcmp(r->fingerprint, s->fingerprint) != 0) {
    idem_record_free(r);
    return answer(s, IDEM_ANSWER_CONFLICT, 0, 0, NULL, NULL,
                  "The call id %s was already used for a %s call with "
                  "different arguments. Nothing was run. For a new action "
                  "use a new call id; to learn the outcome of the earlier "
                  "one, repeat it with its original arguments.",
                  s->call_id, s->tool);
  }
  switch (r->state) {
  case IDEM_STATE_SUCCEEDED:
  case IDEM_STATE_FAILED:
  case IDEM_STATE_DEDUPLICATED:
    s->told = r->delivered != 0; /* a replay of what the model was told */
    rc = IDEM_OK;
    if (!s->told && r->state == IDEM_STATE_DEDUPLICATED && r->duplicate_of)
      /* untold: once told, so is the call that ran (in this session) */
      rc = dup_read(s, 0, s->session, r->duplicate_of);
    /* this call's own record, settled meanwhile (a late result recorded
    ** while its finish was held up): its outcome, not a replay */
    if (!rc) rc = answer_outcome(s, r, !s->fresh);
    idem_record_free(r);
    return rc;
  case IDEM_STATE_PENDING:
    if (holder_live(s, r)) {
      idem_record_free(r);
      return wait_or(s, NULL);
    }
    /* the owner is gone or its lease ran out, or it could not record */
    set_why(s, orphaned(s->g, r) ? UNRECORDED : OWNER_GONE);
    IDEM__FALLTHROUGH;
  case IDEM_STATE_IN_DOUBT:
    if (!(now = seize(s, r, IDEM_STATE_IN_DOUBT, 0, &rc))) return rc;
    s->token = now->token;
    rc = reconcile_own(s, now);
    idem_record_free(now);
    return rc;
  case IDEM_STATE_NOT_APPLIED:
    /* before it runs again: did a later call carry the action out, or
    ** is one at it?  (The model re-issued it while it was in doubt, the
    ** re-issue found it not applied and went ahead; then this call was
    ** replayed.)  Then that one decides, as the fence does for a new call:
    ** the call it was handed to, else the fence as of its first issue */
    {
      idem_record *x = NULL;
      rc = carrier(s, r, &x, &how);
      if (rc || x) {
        idem_record_free(r);
        return rc ? rc : decide_fenced(s, x);
      }
    }
    /* handed to no one, its own turn still holds it: an identical call of
    ** its turn that was carried out is its decision */
    if (r->fence_key) {
      idem_record *e = NULL;
      char *recorded = r->fence_key;
      int turn_only = 1;
      /* its turn first; then, unless it was handed to no one, the fence */
      for (rc = IDEM_NOTFOUND; rc == IDEM_NOTFOUND && turn_only >= 0 &&
                               (turn_only || how != HANDED_NONE);
           turn_only--) {
        r->fence_key = recorded;
        rc = s->g->st->vt->fence(s->g->st, r, s->rule->repeat_window_s * 1000,
                                 s->rule->coalesce_ms, turn_only, &e);
        if (rc == IDEM_NOTFOUND && s->fence_key &&
            strcmp(recorded, s->fence_key) != 0) {
          /* recorded under an earlier idem's key (make_fence_key): the
          ** call that went ahead since has today's */
          r->fence_key = s->fence_key;
          rc = s->g->st->vt->fence(s->g->st, r,
                                   s->rule->repeat_window_s * 1000,
                                   s->rule->coalesce_ms, turn_only, &e);
        }
      }
      r->fence_key = recorded;
      if (rc == IDEM_OK) {
        idem_record_free(r);
        return decide_fenced(s, e);
      }
      if (rc != IDEM_NOTFOUND) {
        idem_record_free(r);
        return store_fail(s->g, rc);
      }
    }
    if (!(now = seize(s, r, IDEM_STATE_PENDING, 1, &rc))) return rc;
    s->token = now->token;
    s->attempt = now->attempts + 1;
    idem_record_free(now);
    idem_crash_point("after_pending_commit");
    return to_execute(s, 0);
  default:
    idem_record_free(r);
    return gfail(s->g, IDEM_CORRUPT, "record %s/%s has an unknown state",
                 s->session, s->call_id);
  }
}

/* Was e issued in the same model turn as this call (SPEC §6.4)?  This
** call names its turn and e names the same; or it names none, and e began
** within the tool's coalesce_ms before it or after it (a racing call of
** the same burst) - not further after it: a record from the "future" was
** written before the clock stepped back, in another turn for all anyone
** knows.  A harness that names turns names them all, so a call that names
** one is in no unnamed turn. */
static int same_turn(const idem_step *s, const idem_record *e) {
  long long apart = e->created - s->started;
  if (s->turn) return e->turn && strcmp(s->turn, e->turn) == 0;
  return s->rule->coalesce_ms > 0 && apart >= -s->rule->coalesce_ms &&
         apart <= s->rule->coalesce_ms;
}

/* Record this call as a duplicate of the earlier action e (succeeded, or
** a call of this turn answered already_applied: a duplicate of the call
** that ran) and answer already_applied. */
static int deduplicate(idem_step *s, const idem_record *e) {
  idem_record rec, *found = NULL;
  idem__change ch;
  long long now = now_ms(s);
  int what = 0, rc;
  const char *ran = e->state == IDEM_STATE_DEDUPLICATED && e->duplicate_of
                        ? e->duplicate_of
                        : e->call_id;
  fill_record(s, &rec, now);
  rec.state = IDEM_STATE_DEDUPLICATED;
  rec.owner = NULL;
  rec.lease_until = 0;
  rec.result = e->result;
  rec.resolution = IDEM_RESOLVED_REPLAYED;
  rec.duplicate_of = (char *)(uintptr_t)ran;
  rc = s->g->st->vt->insert(s->g->st, &rec, &what, &found);
  if (rc) return store_fail(s->g, rc);
  if (what == IDEM__BEGIN_FOUND && found->state == IDEM_STATE_NOT_APPLIED &&
      strcmp(found->fingerprint, s->fingerprint) == 0) {
    /* this call's own action, not applied, was carried out by e: it
    ** becomes a duplicate of e rather than running again */
    change_init(s, &ch, found);
    ch.from = BIT(IDEM_STATE_NOT_APPLIED);
    ch.expect_token = found->token;
    ch.state = IDEM_STATE_DEDUPLICATED;
    ch.result = e->result;
    ch.resolution = IDEM_RESOLVED_REPLAYED;
    ch.duplicate_of = ran;
    ch.exec_set = IDEM__EXEC_CLEAR;
    ch.expires = kept_until(s->rule, now);
    {
      idem_record *was = found; /* ch points into it */
      found = NULL;
      rc = s->g->st->vt->change(s->g->st, &ch, &found);
      idem_record_free(was);
    }
    if (rc == IDEM_STALE) return lost_race(s, found);
    idem_record_free(found);
    if (rc) return store_fail(s->g, rc);
  } else if (what == IDEM__BEGIN_FOUND)
    return decide_existing(s, found);
  /* when the model is told (idem_step_delivered), the earlier action is
  ** told too, and fences no more: e, and the call that ran when e is its
  ** duplicate - unless told before: that first delivery stays, for a later
  ** one would say the model learnt of it after calls it made knowing it */
  if ((rc = dup_note(s, 0, e->session, e->call_id, e->delivered)))
    return rc;
  if (ran != e->call_id && (rc = dup_read(s, 1, e->session, ran))) return rc;
  if (same_turn(s, e)) idem__metric_add(IDEM__M_COALESCED);
  if (e->state == IDEM_STATE_DEDUPLICATED && same_turn(s, e))
    return answer(s, IDEM_ANSWER_ALREADY_APPLIED, 0, e->attempts, e->result,
                  ran,
                  "The same %s call was already made in this turn (call id "
                  "%s); it had been carried out by call %s, whose result is "
                  "included. This one was not run, so nothing was done "
                  "twice. Do not call %s again for this.",
                  s->tool, e->call_id, ran, s->tool);
  if (same_turn(s, e))
    return answer(s, IDEM_ANSWER_ALREADY_APPLIED, 0, e->attempts, e->result,
                  ran,
                  "The same %s call was already made in this turn (call id "
                  "%s) and it went through; its result is included. This "
                  "one was not run, so nothing was done twice. Do not call "
                  "%s again for this.",
                  s->tool, ran, s->tool);
  return answer(s, IDEM_ANSWER_ALREADY_APPLIED, 0, e->attempts, e->result, ran,
                "This %s action was already carried out by call %s, so it "
                "was not repeated; its result is included. Do not call it "
                "again for the same purpose.",
                s->tool, ran);
}

/* The earlier action e fences this call. */
static int decide_fenced(idem_step *s, idem_record *e) {
  idem_record *now = NULL;
  int rc;
  switch (e->state) {
  case IDEM_STATE_SUCCEEDED:
  case IDEM_STATE_DEDUPLICATED: /* a call of this turn, answered so */
    rc = deduplicate(s, e);
    idem_record_free(e);
    return rc;
  case IDEM_STATE_NOT_APPLIED: { /* of this turn: who carries it out */
    idem_record *x = NULL;
    char *end = NULL;
    int how;
    rc = handed_to(s, e, &x, &how, &end);
    idem__free(end);
    idem_record_free(e);
    if (rc) return rc;
    return x ? decide_fenced(s, x) : lost_race(s, NULL); /* it changed */
  }
  case IDEM_STATE_PENDING:
    if (holder_live(s, e)) {
      char who[256];
      snprintf(who, sizeof who, "%s", e->call_id);
      idem_record_free(e);
      return wait_or(s, who);
    }
    IDEM__FALLTHROUGH;
  default: /* IDEM_STATE_IN_DOUBT */
    if (!(now = seize(s, e, IDEM_STATE_IN_DOUBT, 0, &rc))) return rc;
    idem_record_free(s->earlier);
    s->earlier = now;
    if (!has_check(s)) return answer_unknown(s, now->call_id);
    if ((rc = build_check_args(s, now->args, strlen(now->args), now->key)))
      return rc;
    s->phase = PH_CHECK_EARLIER;
    s->deadline = idem__mono_ms() + s->rule->reconcile_timeout_ms;
    s->next = IDEM_NEXT_CHECK;
    s->delay_ms = 0;
    return IDEM_OK;
  }
}

/* From the lookup on: what the log says decides. */
static int decide(idem_step *s) {
  idem__store *st = s->g->st;
  idem_record *r = NULL, rec;
  long long now;
  int rc, what = 0, i;
  rc = st->vt->get(st, s->session, s->call_id, &r);
  if (rc == IDEM_OK) return decide_existing(s, r);
  if (rc != IDEM_NOTFOUND) return store_fail(s->g, rc);
  now = now_ms(s);
  fill_record(s, &rec, now);
  for (i = 0; i < 2; i++) {
    /* an action recorded under a key of an earlier idem fences this call
    ** as well (make_fence_key); no idem writes those keys any more, so
    ** asking before begin misses no action begun meanwhile */
    if (!s->fence_v0[i]) continue;
    rec.fence_key = s->fence_v0[i];
    rc = st->vt->fence(st, &rec, s->rule->repeat_window_s * 1000,
                       s->rule->coalesce_ms, 0, &r);
    if (rc == IDEM_OK) return decide_fenced(s, r);
    if (rc != IDEM_NOTFOUND) return store_fail(s->g, rc);
  }
  /* an identical call of this turn that did not take effect: its decision
  ** may have been carried out by a call it held back (turn_kin) */
  if ((rc = turn_kin(s, &r))) return rc;
  if (r) return decide_fenced(s, r);
  rec.fence_key = s->fence_key;
  rc = st->vt->begin(st, &rec, s->rule->repeat_window_s * 1000,
                     s->rule->coalesce_ms, &what, &r);
  if (rc) return store_fail(s->g, rc);
  switch (what) {
  case IDEM__BEGIN_INSERTED:
    idem_crash_point("after_pending_commit");
    s->fresh = 1;
    s->token = 1;
    s->attempt = 1;
    return to_execute(s, 0);
  case IDEM__BEGIN_FOUND: return decide_existing(s, r);
  default: return decide_fenced(s, r);
  }
}

/* ---- keys, fences, arguments ---------------------------------------------- */

/* The arguments to send: the canonical ones with the key in key_arg. */
static int make_send_args(idem_step *s) {
  const char *ka = s->rule->key_arg;
  idem__buf b;
  size_t bad;
  int rc = 0;
  if (!ka) {
    s->send_args = idem__strndup(s->args, s->args_len);
    s->send_len = s->args_len;
    return s->send_args ? IDEM_OK : IDEM_NOMEM;
  }
  /* {"key_arg":"KEY",<the rest>} and canonicalize to put it in its place */
  idem__buf_init(&b, s->c->out.cap);
  rc = idem__buf_append(&b, "{", 1);
  if (!rc) rc = idem__canon_string(&b, ka, strlen(ka), &bad);
  if (!rc) rc = idem__buf_append(&b, ":", 1);
  if (!rc) rc = idem__canon_string(&b, s->key, strlen(s->key), &bad);
  if (!rc && s->args_len > 2) rc = idem__buf_append(&b, ",", 1);
  if (!rc) rc = idem__buf_append(&b, s->args + 1, s->args_len - 1);
  if (!rc) {
    idem__canon_opt opt = {0, NULL, 0, 0, 0};
    opt.max_depth = s->c->max_depth;
    rc = idem__canon_run(s->c, b.p, b.len, &opt);
    if (!rc) {
      s->send_args = idem__strndup(s->c->out.p, s->c->out.len);
      s->send_len = s->c->out.len;
      if (!s->send_args) rc = IDEM_NOMEM;
    }
  }
  idem__buf_free(&b);
  return rc;
}

static idem_canon *pool_take(idem_guard *g);
static void pool_give(idem_guard *g, idem_canon *c);

/* How the fence scope writes a fence field's value (fence_scope). */
enum {
  FENCE_TEXT,    /* today's: compared by its text                      */
  FENCE_V0,      /* an earlier idem's: every value as its canonical JSON */
  FENCE_V0_BARE, /* the same, of the call that held as a number, true,  */
                 /* false or null each string whose text is one        */
};

/* Is the string value [v, v+n) (canonical JSON) the text of a number,
** true, false or null, written canonically?  *t and *tn: that text. */
static int scalar_text(idem_guard *g, const char *v, size_t n, const char **t,
                       size_t *tn) {
  idem_canon *tc;
  const char *out;
  size_t outn;
  int is = 0;
  if (n < 3 || memchr(v, '\\', n)) return 0;
  *t = v + 1;
  *tn = n - 2;
  if ((*tn == 4 && (!memcmp(*t, "true", 4) || !memcmp(*t, "null", 4))) ||
      (*tn == 5 && !memcmp(*t, "false", 5)))
    return 1;
  if (**t != '-' && (**t < '0' || **t > '9')) return 0;
  /* a second workspace (the step's holds the arguments v points into) */
  if ((tc = pool_take(g)) && idem_canon_json(tc, *t, *tn, &out, &outn) == 0)
    is = outn == *tn && memcmp(out, *t, outn) == 0;
  pool_give(g, tc);
  return is;
}

/* The fence scope: session (or "*" when global), tool, and the fingerprint
** or the values of the fence fields, into b.  A fence field's value is
** compared by its TEXT (SPEC §6.4): a scalar goes in as the JSON string of
** its text - a string's characters, a number's canonical RFC 8785 text,
** true, false, null (a field the call lacks counts as null) - so 1001 and
** "1001" are one order, as a tool that formats either into its request
** sees them; an object or an array as its canonical JSON (it has no text,
** and its JSON never begins with a quote).  A string's canonical JSON is
** already the JSON string of its characters, so only a number, true, false
** or null is written otherwise than an earlier idem wrote it (every value
** as its canonical JSON: FENCE_V0, for the actions recorded then;
** make_fence_key). */
static int fence_scope(idem_step *s, idem__buf *b, int how) {
  const idem__tool_rule *r = s->rule;
  size_t i, bad;
  int rc;
  rc = idem__canon_string(b, r->fence_global ? "*" : s->session,
                          strlen(r->fence_global ? "*" : s->session), &bad);
  if (!rc) rc = idem__buf_append(b, "\n", 1);
  if (!rc) rc = idem__canon_string(b, s->tool, strlen(s->tool), &bad);
  if (!rc) rc = idem__buf_append(b, "\n", 1);
  if (!rc && r->nfence == 0) rc = idem__buf_append(b, s->fingerprint, 64);
  for (i = 0; !rc && i < r->nfence; i++) {
    const char *v, *t;
    size_t vlen, tn;
    int quote = 0;
    arg_value(s, r->fence[i], strlen(r->fence[i]), &v, &vlen);
    if (how == FENCE_TEXT)
      quote = *v != '"' && *v != '{' && *v != '[';
    else if (how == FENCE_V0_BARE && *v == '"' &&
             scalar_text(s->g, v, vlen, &t, &tn)) {
      v = t; /* the string "1001" as the number 1001 */
      vlen = tn;
    }
    rc = idem__canon_string(b, r->fence[i], strlen(r->fence[i]), &bad);
    if (!rc) rc = idem__buf_append(b, quote ? "=\"" : "=", quote ? 2 : 1);
    if (!rc) rc = idem__buf_append(b, v, vlen);
    if (!rc) rc = idem__buf_append(b, quote ? "\"\n" : "\n", quote ? 2 : 1);
  }
  return rc;
}

/* s->fence_key, the SHA-256 of the fence scope; and s->fence_v0[], the
** keys an earlier idem (values as canonical JSON) would have given this
** call, and the call that held its numeric or true/false/null strings as
** such, where they differ from it: an action recorded then, still in
** doubt, must go on fencing its re-issues - as they were, or typed the
** other way (decide).  (A re-issue that retypes some fields and not
** others is not looked up: the forms would grow as 2^fields.) */
static int make_fence_key(idem_step *s) {
  const idem__tool_rule *r = s->rule;
  idem__buf b[3];
  char hex[65];
  int rc = 0, how, i;
  for (how = 0; how < 3; how++) idem__buf_init(&b[how], s->c->out.cap);
  if (r->nfence) {
    idem__canon_opt opt = {0, NULL, 0, 0, 0};
    opt.max_depth = s->c->max_depth;
    rc = idem__canon_run(s->c, s->args, s->args_len, &opt);
  }
  for (how = 0; !rc && how < (r->nfence ? 3 : 1); how++)
    rc = fence_scope(s, &b[how], how);
  for (how = 0; !rc && how < (r->nfence ? 3 : 1); how++) {
    char **to = how ? &s->fence_v0[how - 1] : &s->fence_key;
    for (i = 0; i < how; i++) /* a form the same as one before: no key */
      if (b[i].len == b[how].len && !memcmp(b[i].p, b[how].p, b[how].len))
        break;
    if (i < how) continue;
    if ((rc = idem__sha256_hex(s->c, b[how].p, b[how].len, hex))) break;
    if (!(*to = idem__strdup(hex))) rc = IDEM_NOMEM;
  }
  for (how = 0; how < 3; how++) idem__buf_free(&b[how]);
  return rc;
}

/* ---- the public face ------------------------------------------------------ */

const char *idem__default_log(char *buf, size_t n) {
  const char *env = getenv("IDEM_LOG"), *xdg = getenv("XDG_STATE_HOME");
  const char *home = getenv("HOME");
  if (env && *env) return env;
  if (xdg && *xdg)
    snprintf(buf, n, "sqlite:%s/idem/attempts.db", xdg);
  else
    snprintf(buf, n, "sqlite:%s/.local/state/idem/attempts.db",
             home && *home ? home : ".");
  return buf;
}

int idem_guard_open(const char *log_url, const idem_policy *policy,
                    idem_guard **out) {
  idem_guard *g;
  char path[4096];
  int rc;
  if (!out) return IDEM_MISUSE;
  *out = g = idem__malloc(sizeof *g);
  if (!g) return IDEM_NOMEM;
  memset(g, 0, sizeof *g);
  g->magic = GUARD_MAGIC;
  g->refs = 1;
  g->policy = policy;
  pthread_mutex_init(&g->mu, NULL);
  pthread_mutex_init(&g->emu, NULL);
  idem__owner_self(g->owner, sizeof g->owner);
  if (!log_url) log_url = idem__default_log(path, sizeof path);
  if (!(g->log = idem__strdup(log_url))) {
    idem__free(g);
    *out = NULL;
    return IDEM_NOMEM;
  }
  rc = idem__store_open(log_url, &g->st);
  if (rc) {
    if (g->st) {
      gfail(g, rc, "%s", g->st->vt->errmsg(g->st));
      g->st->vt->close(g->st);
      g->st = NULL;
    } else
      gfail(g, rc, "cannot open the attempt log %s", log_url);
  }
  return rc;
}

static void workers_release(workers *w);

static void guard_unref(idem_guard *g) {
  int last;
  pthread_mutex_lock(&g->mu);
  last = --g->refs == 0;
  pthread_mutex_unlock(&g->mu);
  if (!last) return;
  if (g->st) g->st->vt->close(g->st);
  while (g->npool > 0) idem_canon_close(g->pool[--g->npool]);
  workers_release(g->workers);
  while (g->errs) {
    err_slot *e = g->errs;
    g->errs = e->next;
    idem__free(e);
  }
  for (int i = 0; i < ORPHANS; i++) {
    idem__free(g->orphans[i].session);
    idem__free(g->orphans[i].call_id);
  }
  pthread_mutex_destroy(&g->emu);
  pthread_mutex_destroy(&g->mu);
  idem__free(g->log);
  g->magic = IDEM__MAGIC_DEAD;
  idem__free(g);
}

/* A workspace from g's pool, or a new one (NULL: out of memory). */
static idem_canon *pool_take(idem_guard *g) {
  idem_canon *c = NULL;
  pthread_mutex_lock(&g->mu);
  if (g->npool > 0) c = g->pool[--g->npool];
  pthread_mutex_unlock(&g->mu);
  if (!c && idem_canon_open(&c) != IDEM_OK) c = NULL;
  return c;
}

/* Give workspace c (or NULL) back to g's pool, or close it when full. */
static void pool_give(idem_guard *g, idem_canon *c) {
  pthread_mutex_lock(&g->mu);
  if (c && g->npool < CANON_POOL) {
    g->pool[g->npool++] = c;
    c = NULL;
  }
  pthread_mutex_unlock(&g->mu);
  idem_canon_close(c);
}

/* A new step holds the guard, and a workspace from its pool. */
static int step_attach(idem_step *s, idem_guard *g) {
  pthread_mutex_lock(&g->mu);
  g->refs++;
  pthread_mutex_unlock(&g->mu);
  s->g = g;
  s->c = pool_take(g);
  return s->c ? IDEM_OK : IDEM_NOMEM;
}

static void step_detach(idem_step *s) {
  pool_give(s->g, s->c);
  guard_unref(s->g);
}

void idem_guard_close(idem_guard *g) {
  if (!g || g->magic != GUARD_MAGIC) return;
  guard_unref(g);
}

int idem__guard_hold(idem_guard *g) {
  if (!g || g->magic != GUARD_MAGIC || !g->st) return IDEM_MISUSE;
  pthread_mutex_lock(&g->mu);
  g->refs++;
  pthread_mutex_unlock(&g->mu);
  return IDEM_OK;
}

void idem__guard_release(idem_guard *g) { guard_unref(g); }

void idem__guard_errclear(idem_guard *g) {
  err_slot *e;
  pthread_mutex_lock(&g->emu);
  e = err_find(g, pthread_self());
  pthread_mutex_unlock(&g->emu);
  if (e) e->msg[0] = '\0';
}

int idem__guard_told(idem_guard *g, const char *session,
                     const char *call_id) {
  idem_record *r = NULL;
  int yes;
  if (!session || !call_id || g->st->vt->get(g->st, session, call_id, &r))
    return 0;
  /* decide_existing answers these from the record, and a delivery stamp
  ** of a told one changes nothing: begin only reads */
  yes = (r->state == IDEM_STATE_SUCCEEDED || r->state == IDEM_STATE_FAILED ||
         r->state == IDEM_STATE_DEDUPLICATED) &&
        r->delivered != 0;
  idem_record_free(r);
  return yes;
}

int idem__step_claim(idem_step *s, const idem_guard *g) {
  if (!s || s->magic != STEP_MAGIC || s->g != g) return IDEM_MISUSE;
  return __atomic_exchange_n(&s->queued, 1, __ATOMIC_ACQ_REL) ? IDEM_MISUSE
                                                              : IDEM_OK;
}

void idem__step_unclaim(idem_step *s) {
  __atomic_store_n(&s->queued, 0, __ATOMIC_RELEASE);
}

void idem__step_deliver_with_outcome(idem_step *s, int on) {
  s->auto_deliver = on != 0;
}

static int step_ok(const idem_step *s) {
  return s && s->magic == STEP_MAGIC && s->g->st;
}

/* Is s valid UTF-8 (NULL is)?  Ids go into keys, records and envelopes,
** all JSON. */
static int utf8_ok(const char *s) {
  return !s || idem__utf8_text(s, strlen(s));
}

/* The caller's idem_call as this version's (the ABI rule), its size ours
** for what it is handed on to. */
static int call_copy(idem_guard *g, const idem_call *call, idem_call *cur) {
  if (idem__abi_in(cur, sizeof *cur, call, IDEM__CALL_MIN))
    return gfail(g, IDEM_MISUSE,
                 "idem_call.size is %zu: set it to sizeof(idem_call)",
                 call ? call->size : 0);
  cur->size = sizeof *cur;
  return IDEM_OK;
}

int idem_guard_begin(idem_guard *g, const idem_call *call_in, idem_step **out) {
  idem_step *s;
  idem_key k;
  idem_keyspec spec;
  idem_call cur;
  const idem_call *call = &cur;
  int rc;
  if (out) *out = NULL;
  if (!g || g->magic != GUARD_MAGIC || !out) return IDEM_MISUSE;
  if ((rc = call_copy(g, call_in, &cur))) return rc;
  if (!call->tool)
    return gfail(g, IDEM_MISUSE, "idem_call.tool is NULL: name the tool");
  if (!call->args && call->args_len)
    return gfail(g, IDEM_MISUSE, "idem_call.args is NULL, args_len %zu",
                 call->args_len);
  if (!g->st) return gfail(g, IDEM_MISUSE, "the guard has no attempt log");
  if (!(s = idem__malloc(sizeof *s)))
    return gfail(g, IDEM_NOMEM, "out of memory");
  memset(s, 0, sizeof *s);
  s->magic = STEP_MAGIC;
  s->t0 = idem__mono_us();
  idem__buf_init(&s->env, (size_t)64 << 20);
  *out = s;
  s->session = idem__strdup(call->session ? call->session : "");
  s->call_id = idem__strdup(call->call_id ? call->call_id : "");
  s->tool = idem__strdup(call->tool);
  s->turn = call->turn ? idem__strdup(call->turn) : NULL;
  s->own_check = call->own_check != 0;
  if (step_attach(s, g) || !s->session || !s->call_id || !s->tool ||
      (call->turn && !s->turn))
    return gfail(g, IDEM_NOMEM, "out of memory");
  if (call->turn && !*call->turn)
    return gfail(g, IDEM_MISUSE,
                 "the turn id is empty: give the model turn's "
                 "id, or none");
  {
    const char *bad = !utf8_ok(call->session)   ? "session id"
                      : !utf8_ok(call->call_id) ? "call id"
                      : !utf8_ok(call->tool)    ? "tool name"
                      : !utf8_ok(call->turn)    ? "turn id"
                                                : NULL;
    if (bad)
      return gfail(g, IDEM_INVALID,
                   "the %s is not valid UTF-8; nothing was run or recorded",
                   bad);
  }
  s->rule = idem__policy_rule(g->policy, s->tool, &s->scratch);

  if (s->rule->cls == IDEM_CLASS_REFUSED)
    return answer(s, IDEM_ANSWER_REFUSED, 0, 0, NULL, NULL,
                  "The tool %s is not allowed by this agent's policy and was "
                  "not run. Do not call it again; use another tool or ask "
                  "the user.",
                  s->tool);
  spec.size = sizeof spec;
  spec.key_arg = s->rule->key_arg;
  spec.key_max_len = s->rule->key_max_len;
  rc = idem_key_mint(s->c, call, &spec, &k);
  if (rc == IDEM_NOMEM) return gfail(g, rc, "out of memory");
  if (rc)
    return answer(s, IDEM_ANSWER_INVALID_ARGUMENTS, 0, 0, NULL, NULL,
                  "The arguments of this %s call are not valid: %s. Nothing "
                  "was run or recorded. Fix the arguments and call again.",
                  s->tool, idem_canon_errmsg(s->c));
  s->key = idem__strndup(k.key, k.key_len);
  s->fingerprint = idem__strdup(k.fingerprint);
  s->args = idem__strndup(k.args, k.args_len);
  s->args_len = k.args_len;
  if (!s->key || !s->fingerprint || !s->args || make_send_args(s))
    return gfail(g, IDEM_NOMEM, "out of memory");
  if (s->rule->cls != IDEM_CLASS_GUARDED) {
    s->attempt = 1;
    s->phase = PH_PASS;
    s->next = IDEM_NEXT_EXECUTE;
    return IDEM_OK;
  }
  if (make_fence_key(s) || build_check_args(s, s->args, s->args_len, s->key))
    return gfail(g, IDEM_NOMEM, "out of memory");
  /* from when it began (one reading of the clock: a replay's path) */
  s->deadline = s->t0 / 1000 + s->rule->timeout_ms;
  idem__store_deadline_set(s->deadline);
  s->started = now_ms(s);
  rc = decide(s);
  idem__store_deadline_set(0);
  return rc;
}

int idem_step_next(const idem_step *s) {
  return s && s->magic == STEP_MAGIC ? s->next : 0;
}

/* A result that came after we answered outcome_unknown: record it on the
** in_doubt record whoever holds it now (SPEC §6.6). */
static char *result_json(idem_canon *c, const char *result, size_t len);

/* Apply ch, the settlement of the attempt under ch->expect_token: on a
** pending record that attempt's end was never recorded, so it counts now
** (attempts + 1); on one in doubt it was counted then.  *now as change()
** gives it (may be NULL). */
static int settle_apply(idem_guard *g, idem__change *ch, idem_record **now) {
  idem_record *was = NULL;
  int rc;
  ch->from = BIT(IDEM_STATE_IN_DOUBT); /* the usual case: one write */
  ch->attempts_add = 0;
  rc = g->st->vt->change(g->st, ch, &was);
  if (rc == IDEM_STALE && was && was->state == IDEM_STATE_PENDING) {
    idem_record_free(was);
    was = NULL;
    ch->from = BIT(IDEM_STATE_PENDING);
    ch->attempts_add = 1;
    rc = g->st->vt->change(g->st, ch, &was);
  }
  if (now)
    *now = was;
  else
    idem_record_free(was);
  return rc;
}

static int settle(idem_guard *g, const char *session, const char *call_id,
                  long long token, int outcome, const char *result,
                  const char *error, int resolution, int strict, int ended,
                  const idem__tool_rule *rule) {
  idem__change ch;
  idem_record *now = NULL;
  int rc;
  if (outcome == IDEM_OUTCOME_UNKNOWN && !ended) return IDEM_OK;
  memset(&ch, 0, sizeof ch);
  ch.session = session;
  ch.call_id = call_id;
  ch.delivered = -1;
  ch.expect_token = token;
  ch.exec_set = IDEM__EXEC_CLEAR; /* a verdict: nothing of it can land */
  if (rule) { /* NULL: the action is gone */
    if ((rc = g->st->vt->now(g->st, &ch.expires))) return store_fail(g, rc);
    ch.expires = kept_until(rule, ch.expires);
  }
  if (outcome == IDEM_OUTCOME_UNKNOWN) {
    /* it ended without a verdict: still in doubt, and it may land until
    ** settle_ms from now (§6a) - the attempt under our token, no other */
    ch.state = IDEM_STATE_IN_DOUBT;
    ch.error = error;
    ch.exec_set = IDEM__EXEC_ENDED;
    if ((rc = g->st->vt->now(g->st, &ch.settle_from))) return store_fail(g, rc);
    rc = settle_apply(g, &ch, NULL);
    return rc == IDEM_OK || rc == IDEM_STALE || rc == IDEM_NOTFOUND
               ? IDEM_OK
               : store_fail(g, rc);
  }
  ch.state = outcome == IDEM_OUTCOME_APPLIED    ? IDEM_STATE_SUCCEEDED
             : outcome == IDEM_OUTCOME_REJECTED ? IDEM_STATE_FAILED
                                                : IDEM_STATE_NOT_APPLIED;
  ch.result = result;
  ch.error = error;
  ch.resolution = resolution;
  rc = settle_apply(g, &ch, strict ? NULL : &now);
  if (!strict && rc == IDEM_STALE && now && now->state == IDEM_STATE_IN_DOUBT &&
      outcome == IDEM_OUTCOME_APPLIED) {
    /* a late result that it applied settles an in-doubt action whoever
    ** holds it now; any other word speaks for its own attempt only (a
    ** later one may still land) */
    idem_record_free(now);
    now = NULL;
    ch.from = BIT(IDEM_STATE_IN_DOUBT);
    ch.expect_token = -1;
    ch.attempts_add = 0;
    rc = g->st->vt->change(g->st, &ch, &now);
  }
  idem_record_free(now);
  if (rc == IDEM_OK && resolution == IDEM_RESOLVED_LATE)
    idem__metric_add(IDEM__M_LATE);
  if (rc == IDEM_STALE)
    return strict ? gfail(g, rc, "the action changed meanwhile")
                  : IDEM_OK; /* settled already */
  return rc ? store_fail(g, rc) : IDEM_OK;
}

/* A result that came after we answered outcome_unknown: record it on the
** in_doubt record whoever holds it now (SPEC §6.6). */
static int finish_late(idem_step *s, int outcome, const char *result,
                       const char *error) {
  s->late_ok = 0;
  return settle(s->g, s->session, s->call_id, s->token, outcome, result, error,
                IDEM_RESOLVED_LATE, 0, s->ended, s->rule);
}

/* Can an attempt of the action v settles still land?  (A log that cannot
** say is taken for yes: the safe direction.)  *expires: until when the
** action is kept once settled now (0 when the log cannot say). */
static int still_landing(idem_guard *g, const idem_settlement *v,
                         long long *expires) {
  idem__tool_rule scratch;
  const idem__tool_rule *rule;
  idem_record *r = NULL;
  long long now = 0;
  int rc = g->st->vt->get(g->st, v->session, v->call_id, &r), yes;
  *expires = 0;
  if (rc == IDEM_NOTFOUND) return 0;
  if (rc || g->st->vt->now(g->st, &now)) {
    idem_record_free(r);
    return 1;
  }
  rule = idem__policy_rule(g->policy, r->tool, &scratch);
  yes = may_land_by(rule, r, now);
  *expires = kept_until(rule, now);
  idem_record_free(r);
  return yes;
}

/* Element i of a caller's array of sized structs, stride bytes apart. */
#define AT(v, i, stride)                                                       \
  ((idem_settlement *)(void *)((char *)(v) + (i) * (stride)))

int idem_guard_settle_many(idem_guard *g, idem_settlement *given, size_t n) {
  idem__change *chs = NULL;
  idem_settlement *v = NULL;
  char **res = NULL;
  int *rcs = NULL, rc = IDEM_OK;
  idem_canon *c = NULL;
  size_t i, stride = 0;
  if (!g || g->magic != GUARD_MAGIC || !g->st || (n && !given))
    return IDEM_MISUSE;
  if (n) stride = given->size; /* v[0].size is the stride */
  if (n && stride < IDEM__ABI_MIN(idem_settlement))
    return gfail(g, IDEM_MISUSE,
                 "idem_settlement.size is %zu: set it to "
                 "sizeof(idem_settlement)",
                 stride);
  v = idem__malloc((n ? n : 1) * sizeof *v);
  chs = idem__malloc((n ? n : 1) * sizeof *chs);
  res = idem__malloc((n ? n : 1) * sizeof *res);
  rcs = idem__malloc((n ? n : 1) * sizeof *rcs);
  if (!v || !chs || !res || !rcs || idem_canon_open(&c) != IDEM_OK) {
    rc = gfail(g, IDEM_NOMEM, "out of memory");
    goto done;
  }
  for (i = 0; i < n; i++) {
    (void)idem__abi_in(&v[i], sizeof v[i], AT(given, i, stride), stride);
    if (!v[i].session || !v[i].call_id || v[i].outcome < IDEM_OUTCOME_APPLIED ||
        v[i].outcome > IDEM_OUTCOME_UNKNOWN) {
      rc = IDEM_MISUSE;
      goto done;
    }
  }
  for (i = 0; i < n; i++) {
    int out = v[i].outcome == IDEM_OUTCOME_REJECTED ? IDEM_OUTCOME_NOT_APPLIED
                                                    : v[i].outcome;
    long long expires = 0;
    /* "not applied" while an attempt may still land changes nothing: the
    ** action stays in doubt, and its rc says IDEM_STALE (§6a) */
    if (out != IDEM_OUTCOME_UNKNOWN && still_landing(g, &v[i], &expires) &&
        out == IDEM_OUTCOME_NOT_APPLIED)
      out = IDEM_OUTCOME_UNKNOWN;
    res[i] = v[i].result ? result_json(c, v[i].result, v[i].result_len) : NULL;
    memset(&chs[i], 0, sizeof chs[i]);
    chs[i].session = v[i].session;
    chs[i].call_id = v[i].call_id;
    chs[i].delivered = -1;
    chs[i].from = BIT(IDEM_STATE_IN_DOUBT) | BIT(IDEM_STATE_PENDING);
    chs[i].expect_token = v[i].token;
    chs[i].check = v[i].outcome; /* as the check said it */
    idem__metric_check(v[i].outcome);
    if (out == IDEM_OUTCOME_UNKNOWN) continue; /* the check alone */
    chs[i].exec_set = IDEM__EXEC_CLEAR;
    chs[i].state = out == IDEM_OUTCOME_APPLIED ? IDEM_STATE_SUCCEEDED
                                               : IDEM_STATE_NOT_APPLIED;
    chs[i].result = res[i];
    chs[i].resolution = IDEM_RESOLVED_RECONCILED;
    chs[i].expires = expires;
  }
  if (g->st->vt->change_many)
    rc = g->st->vt->change_many(g->st, chs, n, rcs);
  else
    for (i = 0; i < n; i++) {
      rcs[i] = g->st->vt->change(g->st, &chs[i], NULL);
      if (rcs[i] && rcs[i] != IDEM_STALE && rc == IDEM_OK) rc = rcs[i];
    }
  for (i = 0; i < n; i++) {
    /* an answer that settled nothing: UNKNOWN is no error; "not applied"
    ** while an attempt may land changed nothing of the action (STALE) */
    if (!chs[i].state && rcs[i] == IDEM_OK)
      rcs[i] = v[i].outcome == IDEM_OUTCOME_UNKNOWN ? IDEM_OK : IDEM_STALE;
    AT(given, i, stride)->rc =
        v[i].outcome == IDEM_OUTCOME_UNKNOWN ? IDEM_OK : rcs[i];
    idem__free(res[i]);
  }
  if (rc) rc = store_fail(g, rc);
done:
  idem_canon_close(c);
  idem__free(v);
  idem__free(chs);
  idem__free(res);
  idem__free(rcs);
  return rc;
}

/* What an operator's verdict may settle: an action in doubt, or pending
** under a holder that is gone (the recoverable ones, recoverable()). */
static int recoverable(const idem_record *r, long long now);

/* An operator's verdict refused: r (NULL: gone) is not in doubt. */
static int not_in_doubt(idem_guard *g, const char *call_id,
                        const idem_record *r, const char *when) {
  const char *by = r ? r->resolved_by : NULL;
  return gfail(g, IDEM_STALE,
               "the %s%saction of call %s is not in doubt%s: it is %s%s%s%s; "
               "nothing was changed",
               r ? r->tool : "", r ? " " : "", call_id, when,
               r ? idem_state_name(r->state) : "gone",
               by ? " (resolved by " : "", by ? by : "", by ? ")" : "");
}

int idem_guard_resolve(idem_guard *g, const char *session, const char *call_id,
                       int outcome, const char *result, size_t result_len,
                       const char *reason, const char *by) {
  idem__change ch;
  idem_record *r = NULL, *now_rec = NULL;
  idem__tool_rule scratch;
  idem_canon *c = NULL;
  const char *out;
  char *res = NULL;
  size_t olen;
  long long now = 0;
  int rc;
  if (!g || g->magic != GUARD_MAGIC || !g->st || !session || !call_id ||
      (outcome != IDEM_OUTCOME_APPLIED &&
       outcome != IDEM_OUTCOME_NOT_APPLIED) ||
      (!result && result_len))
    return IDEM_MISUSE;
  if (outcome == IDEM_OUTCOME_NOT_APPLIED && (!reason || !*reason))
    return gfail(g, IDEM_MISUSE,
                 "a verdict of not applied needs a reason (what the provider "
                 "said)");
  if (!by || !*by) by = g->owner;
  if (result) {
    if (idem_canon_open(&c) != IDEM_OK)
      return gfail(g, IDEM_NOMEM, "out of memory");
    rc = idem_canon_json(c, result, result_len, &out, &olen);
    if (rc == IDEM_OK && !(res = idem__strndup(out, olen))) rc = IDEM_NOMEM;
    idem_canon_close(c);
    if (rc == IDEM_NOMEM) return gfail(g, rc, "out of memory");
    if (rc) return gfail(g, IDEM_INVALID, "the result is not JSON text");
  }
  rc = g->st->vt->get(g->st, session, call_id, &r);
  if (rc == IDEM_OK) rc = g->st->vt->now(g->st, &now);
  if (rc) {
    idem__free(res);
    idem_record_free(r);
    return rc == IDEM_NOTFOUND
               ? gfail(g, rc, "no action of call %s in session %s", call_id,
                       session)
               : store_fail(g, rc);
  }
  if (!recoverable(r, now)) {
    rc = not_in_doubt(g, call_id, r, "");
    idem__free(res);
    idem_record_free(r);
    return rc;
  }
  memset(&ch, 0, sizeof ch);
  ch.session = session;
  ch.call_id = call_id;
  ch.delivered = -1;
  ch.from = BIT(r->state);
  ch.expect_token = r->token;
  if (r->state == IDEM_STATE_PENDING) ch.expect_owner = r->owner;
  ch.state = outcome == IDEM_OUTCOME_APPLIED ? IDEM_STATE_SUCCEEDED
                                             : IDEM_STATE_NOT_APPLIED;
  ch.result = res;
  ch.error = reason;
  ch.resolution = IDEM_RESOLVED_OPERATOR;
  ch.exec_set = IDEM__EXEC_CLEAR; /* a verdict: nothing of it can land */
  ch.resolved_by = by;
  ch.durable = 1;
  ch.expires =
      kept_until(idem__policy_rule(g->policy, r->tool, &scratch), now);
  rc = g->st->vt->change(g->st, &ch, &now_rec);
  idem__free(res);
  idem_record_free(r);
  if (rc == IDEM_STALE) {
    /* someone settled it between our read and our write */
    rc = not_in_doubt(g, call_id, now_rec, " any more");
    idem_record_free(now_rec);
    return rc;
  }
  idem_record_free(now_rec);
  if (rc) return store_fail(g, rc);
  idem__metric_add(IDEM__M_RESOLVED);
  return IDEM_OK;
}

int idem_guard_settle(idem_guard *g, const char *session, const char *call_id,
                      long long token, int outcome, const char *result,
                      size_t result_len) {
  idem_settlement one = {sizeof one, session, call_id,    token,
                         outcome,    result,  result_len, 0};
  int rc = idem_guard_settle_many(g, &one, 1);
  if (rc) return rc;
  if (one.rc == IDEM_STALE)
    return gfail(g, IDEM_STALE, "the action changed meanwhile");
  return one.rc ? store_fail(g, one.rc) : IDEM_OK;
}

/* A result as JSON for the record and the envelope: canonical when it is a
** JSON text, else a JSON string of it (so a tool's odd output can never
** break the envelope).  A result is kept up to IDEM__MAX_RESULT bytes of
** JSON, whatever the limit on arguments; past it, and for bytes that are
** not UTF-8, the record says what it was instead.  NULL when there is none
** or memory ran out. */
static char *result_json(idem_canon *c, const char *result, size_t len) {
  idem_canon *big = NULL;
  const char *out;
  size_t olen, bad;
  idem__buf b;
  char *r = NULL, *z;
  int rc = IDEM_RANGE;
  if (!result) return NULL;
  if (len > c->max_bytes && len <= IDEM__MAX_RESULT) {
    if (idem_canon_open(&big) != IDEM_OK) return NULL;
    idem_canon_limit(big, IDEM_LIMIT_BYTES, IDEM__MAX_RESULT);
    c = big;
  }
  if (idem_canon_json(c, result, len, &out, &olen) == IDEM_OK &&
      olen <= IDEM__MAX_RESULT) {
    r = idem__strndup(out, olen);
    idem_canon_close(big);
    return r;
  }
  idem_canon_close(big);
  idem__buf_init(&b, IDEM__MAX_RESULT * 6 + 2);
  if (!(z = idem__strndup(result, len))) return NULL;
  if (len <= IDEM__MAX_RESULT) rc = idem__canon_string(&b, z, len, &bad);
  if (rc == IDEM_OK && b.len > IDEM__MAX_RESULT) rc = IDEM_RANGE;
  idem__free(z);
  if (rc == IDEM_OK) {
    r = idem__strndup(b.p, b.len);
  } else if (rc != IDEM_NOMEM) { /* describe it rather than lose it */
    char what[128];
    if (rc == IDEM_JSON_UTF8)
      snprintf(what, sizeof what, "\"(a result that is not UTF-8 text)\"");
    else
      snprintf(what, sizeof what,
               "\"(a result of %zu bytes, not kept: larger than %u MiB)\"",
               len, (unsigned)(IDEM__MAX_RESULT >> 20));
    r = idem__strndup(what, strlen(what));
  }
  idem__buf_free(&b);
  return r;
}

static int step_finish(idem_step *s, int outcome, const char *result,
                       size_t result_len, const char *error) {
  idem__change ch;
  idem_record *now = NULL;
  char *res = NULL;
  int rc, state, answered = 0;
  if (!step_ok(s) || outcome < IDEM_OUTCOME_APPLIED ||
      outcome > IDEM_OUTCOME_UNKNOWN)
    return IDEM_MISUSE;
  if (result && !(res = result_json(s->c, result, result_len)))
    return gfail(s->g, IDEM_NOMEM, "out of memory");
  if (s->phase == PH_ANSWERED && s->late_ok) {
    rc = finish_late(s, outcome, res, error);
    idem__free(res);
    return rc;
  }
  if (s->phase == PH_PASS) {
    const idem__tool_rule *r = s->rule;
    if (outcome == IDEM_OUTCOME_APPLIED)
      rc = answer(s, IDEM_ANSWER_SUCCEEDED, 0, s->attempt, res, NULL, NULL);
    else if (outcome == IDEM_OUTCOME_REJECTED)
      rc = answer(s, IDEM_ANSWER_FAILED, 0, s->attempt, res, NULL,
                  "The %s call failed%s%s.", s->tool, error ? ": " : "",
                  error ? error : "");
    else if (r->cls == IDEM_CLASS_IDEMPOTENT && s->attempt < r->retries + 1) {
      s->delay_ms = backoff(r, s->attempt);
      s->attempt++;
      rc = IDEM_OK; /* next stays EXECUTE */
    } else
      rc = answer(s, IDEM_ANSWER_FAILED, 0, s->attempt, NULL, NULL,
                  "The %s call did not complete%s%s. It is safe to call it "
                  "again.",
                  s->tool, error ? ": " : "", error ? error : "");
    idem__free(res);
    return rc;
  }
  if (s->phase != PH_EXEC) {
    idem__free(res);
    return gfail(s->g, IDEM_MISUSE, "finish without an EXECUTE step");
  }
  idem_crash_point("after_downstream_return");
  /* A retry that did not take effect (refused, rate-limited, rejected)
  ** tells nothing of the earlier attempt it repeats, which may have: still
  ** in doubt. */
  if (s->doubted && (outcome == IDEM_OUTCOME_NOT_APPLIED ||
                     outcome == IDEM_OUTCOME_REJECTED)) {
    outcome = IDEM_OUTCOME_UNKNOWN;
    answered = 1; /* the retry has a verdict, the attempt it repeats none */
  }
  state = outcome == IDEM_OUTCOME_APPLIED       ? IDEM_STATE_SUCCEEDED
          : outcome == IDEM_OUTCOME_REJECTED    ? IDEM_STATE_FAILED
          : outcome == IDEM_OUTCOME_NOT_APPLIED ? IDEM_STATE_NOT_APPLIED
                                                : IDEM_STATE_IN_DOUBT;
  change_init(s, &ch, NULL);
  ch.from = BIT(IDEM_STATE_PENDING);
  ch.expect_token = s->token;
  ch.state = state;
  ch.attempts_add = 1;
  ch.result = res;
  ch.error = error;
  ch.expires = kept_until(s->rule, now_ms(s));
  if (state != IDEM_STATE_IN_DOUBT) ch.resolution = IDEM_RESOLVED_EXECUTED;
  /* an attempt with a verdict cannot land later; one that ended without
  ** one may until settle_ms from now - so may the earlier one a retry
  ** under provider_dedupes repeated, when the retry's own verdict is "not
  ** applied" (its end is lost to the retry's record: now is the later,
  ** safe count); one that did not answer in time may, and its executor
  ** stays (§6a) */
  if (state != IDEM_STATE_IN_DOUBT) {
    ch.exec_set = IDEM__EXEC_CLEAR;
  } else if (s->ended || answered) {
    ch.exec_set = IDEM__EXEC_ENDED;
    ch.settle_from = now_ms(s);
  }
  if (s->auto_deliver &&
      (state == IDEM_STATE_SUCCEEDED || state == IDEM_STATE_FAILED)) {
    /* the synchronous API hands the answer over at once: record the
    ** delivery with the outcome, one write instead of two */
    ch.delivered = now_ms(s);
    s->told = s->stamped = 1;
  }
  idem_crash_point("before_outcome_commit");
  /* when someone took the action over meanwhile, what it is now decides */
  now = apply(s, &ch, &rc);
  idem__free(res);
  if (!now)
    return rc && s->phase != PH_ANSWERED
               ? answer_unrecorded(s, outcome, error, 0)
               : rc;
  idem_crash_point("after_outcome_commit");
  s->attempt = now->attempts;
  switch (state) {
  case IDEM_STATE_SUCCEEDED:
  case IDEM_STATE_FAILED: rc = answer_outcome(s, now, 0); break;
  case IDEM_STATE_NOT_APPLIED:
    if (now->attempts < s->rule->retries + 1) {
      s->attempt = now->attempts + 1;
      rc = repend(s, IDEM_STATE_NOT_APPLIED, backoff(s->rule, now->attempts),
                  0);
    } else
      rc = answer(s, IDEM_ANSWER_FAILED, 0, now->attempts, NULL, NULL,
                  "The %s call did not take effect: it could not be carried "
                  "out after %d attempts%s%s. It is safe to call it again "
                  "later with the same arguments.",
                  s->tool, now->attempts, error ? "; last error: " : "",
                  error ? error : "");
    break;
  default: /* IDEM_STATE_IN_DOUBT */
    s->late_ok = 1;
    /* the provider dedupes: retry with the same key at once - when this
    ** attempt has ended (an answer we cannot read, a 5xx, a 409); one that
    ** may still land is reconciled instead, so that the record tracks the
    ** one attempt in flight exactly */
    if (dedupe_retry(s, now)) {
      s->attempt = now->attempts + 1;
      s->doubted = 1;
      rc = repend(s, IDEM_STATE_IN_DOUBT, backoff(s->rule, now->attempts), 0);
    } else
      rc = reconcile_own(s, now);
  }
  idem_record_free(now);
  return rc;
}

/* The attempt has ended (§6a): with the outcome UNKNOWN that follows, it is
** still in doubt, and settle_ms counts from now. */
int idem_step_attempt_ended(idem_step *s) {
  if (!step_ok(s)) return IDEM_MISUSE;
  s->ended = 1;
  return IDEM_OK;
}

int idem_guard_set(idem_guard *g, int option, long long value) {
  if (!g || g->magic != GUARD_MAGIC) return IDEM_MISUSE;
  switch (option) {
  case IDEM_GUARD_EXECUTOR_HANDS_IN:
    if (value != 0 && value != 1) break;
    g->defer_start = (int)value;
    return IDEM_OK;
  case IDEM_GUARD_SHARED_PGID:
    if (value <= 1) break;
    g->pgid = -value; /* shared by every attempt: recorded negative */
    return IDEM_OK;
  default: return gfail(g, IDEM_RANGE, "idem_guard_set: no option %d", option);
  }
  return gfail(g, IDEM_RANGE,
               "idem_guard_set: %lld is not a value of option %d", value,
               option);
}

const char *idem_guard_owner(const idem_guard *g) {
  return g && g->magic == GUARD_MAGIC ? g->owner : NULL;
}

int idem__guard_policy(const idem_guard *g, const idem_policy **p) {
  if (!g || g->magic != GUARD_MAGIC) return IDEM_MISUSE;
  *p = g->policy;
  return IDEM_OK;
}

idem_guard *idem__step_guard(const idem_step *s) {
  return s && s->magic == STEP_MAGIC ? s->g : NULL;
}

int idem__guard_fail(idem_guard *g, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  rc = gfail_v(g, rc, fmt, ap);
  va_end(ap);
  return rc;
}

const char *idem_guard_log(const idem_guard *g) {
  return g && g->magic == GUARD_MAGIC ? g->log : NULL;
}

int idem_guard_executor_lease(idem_guard *g, const char *session,
                              const char *call_id, long long token,
                              long long lease_ms, long long pgid,
                              long long timeout_ms, const char *owner) {
  idem__change ch;
  long long now = 0;
  int rc;
  if (!g || g->magic != GUARD_MAGIC || !g->st || !session || !call_id ||
      lease_ms <= 0 || pgid < 0)
    return IDEM_MISUSE;
  if (token == 0) return IDEM_OK; /* a step that records nothing */
  if ((rc = g->st->vt->now(g->st, &now))) return store_fail(g, rc);
  memset(&ch, 0, sizeof ch);
  ch.session = session;
  ch.call_id = call_id;
  ch.expect_token = token;
  ch.delivered = -1;
  ch.take_lease = IDEM__LEASE_HAND;
  ch.owner = owner ? owner : g->owner;
  ch.lease_until = now + lease_ms;
  ch.from = BIT(IDEM_STATE_PENDING) | BIT(IDEM_STATE_IN_DOUBT);
  if (pgid > 0) { /* the hand-over, before the command starts */
    ch.from = BIT(IDEM_STATE_PENDING);
    ch.exec_set = IDEM__EXEC_SET;
    ch.executor = g->owner;
    ch.pgid = pgid;
    ch.settle_from = now + timeout_ms;
    ch.durable = 1; /* the command starts on the strength of this record */
  }
  rc = g->st->vt->change(g->st, &ch, NULL);
  if (rc == IDEM_STALE || rc == IDEM_NOTFOUND)
    return gfail(g, IDEM_STALE, "the action was taken over by another owner");
  return rc ? store_fail(g, rc) : IDEM_OK;
}

/* The check_with the model is told for the action s checks: the envelope's
** text (idem__check_with), or NULL when the policy names no status tool
** (or memory ran out: the record then lacks it, the answer does not). */
static char *check_with_of(idem_step *s) {
  idem__buf b;
  char *out = NULL;
  if (!s->rule->has_status || !s->rule->status.tool) return NULL;
  idem__buf_init(&b, s->env.cap);
  if (idem__check_with(&b, s->rule->status.tool, s->check_args) == IDEM_OK)
    out = idem__strndup(b.p, b.len);
  idem__buf_free(&b);
  return out;
}

/* A status check's answer (check; 0: none ran) that settles nothing - the
** action of e (NULL: this call's own) stays in doubt - recorded with what
** the model is told to check with when the answer tells it: a write of its
** own, on that rare path.  Best effort: the answer is true without it. */
static void note_check(idem_step *s, const idem_record *e, int check) {
  idem__change ch;
  char *with = s->answer == IDEM_ANSWER_OUTCOME_UNKNOWN ? check_with_of(s)
                                                        : NULL;
  if (check || with) {
    change_init(s, &ch, e);
    ch.from = BIT(IDEM_STATE_IN_DOUBT);
    ch.expect_token = e ? e->token : s->token;
    ch.check = check;
    ch.check_with = with;
    (void)s->g->st->vt->change(s->g->st, &ch, NULL);
  }
  idem__free(with);
}

static int step_resolve(idem_step *s, int outcome, const char *result,
                        size_t result_len) {
  idem__change ch;
  idem__tool_rule scratch;
  idem_record *now = NULL, *e;
  char *res = NULL;
  int rc, check;
  if (!step_ok(s) || outcome < IDEM_OUTCOME_APPLIED ||
      outcome > IDEM_OUTCOME_UNKNOWN)
    return IDEM_MISUSE;
  if (s->phase != PH_CHECK_OWN && s->phase != PH_CHECK_EARLIER)
    return gfail(s->g, IDEM_MISUSE, "resolve without a CHECK step");
  /* what the check said is recorded as it said it (0: none ran) */
  check = s->no_check ? 0 : outcome;
  if (check) idem__metric_check(check);
  if (outcome == IDEM_OUTCOME_REJECTED) outcome = IDEM_OUTCOME_NOT_APPLIED;
  s->doubted = 0; /* a check answers for the action as a whole */
  if (result && !(res = result_json(s->c, result, result_len)))
    return gfail(s->g, IDEM_NOMEM, "out of memory");
  e = s->phase == PH_CHECK_EARLIER ? s->earlier : NULL;

  if (outcome == IDEM_OUTCOME_UNKNOWN) {
    idem__free(res);
    rc = answer_unknown(s, e ? e->call_id : NULL);
    if (rc == IDEM_OK) note_check(s, e, check);
    return rc;
  }
  if (outcome == IDEM_OUTCOME_NOT_APPLIED) {
    /* "not applied" proves only that no attempt has landed YET (§6a): the
    ** record as it is now says whether one still can.  Then only a new
    ** attempt with the same key that the provider dedupes is harmless; the
    ** action is never told failed (a re-issue would be a new key) */
    idem_record *cur = NULL;
    rc = s->g->st->vt->get(s->g->st, e ? e->session : s->session,
                           e ? e->call_id : s->call_id, &cur);
    if (rc) {
      idem__free(res);
      return rc == IDEM_NOTFOUND ? gfail(s->g, rc, "the record is gone")
                                 : store_fail(s->g, rc);
    }
    /* (its own key again under a provider that dedupes is harmless) */
    if (cur->state == IDEM_STATE_IN_DOUBT && may_land(s, cur) &&
        (e || s->recover || !dedupe_retry(s, cur))) {
      idem__free(res);
      rc = answer_pending_landing(s, cur, e ? e->call_id : NULL);
      idem_record_free(cur);
      if (rc == IDEM_OK) note_check(s, e, check);
      return rc;
    }
    idem_record_free(cur);
  }
  change_init(s, &ch, e);
  ch.from = BIT(IDEM_STATE_IN_DOUBT);
  ch.expect_token = e ? e->token : s->token;
  ch.exec_set = IDEM__EXEC_CLEAR; /* settled: nothing of it can land */
  ch.check = check;
  ch.expires = kept_until(
      e ? idem__policy_rule(s->g->policy, e->tool, &scratch) : s->rule,
      now_ms(s));
  if (outcome == IDEM_OUTCOME_APPLIED) {
    ch.state = IDEM_STATE_SUCCEEDED;
    ch.result = res;
    ch.resolution = IDEM_RESOLVED_RECONCILED;
  } else if (!e && !s->recover && s->attempt < s->rule->retries + 1) {
    /* certainly not applied: execute again, with the same key */
    idem__free(res);
    s->attempt++;
    return repend(s, IDEM_STATE_IN_DOUBT, 0, check);
  } else {
    ch.state = IDEM_STATE_NOT_APPLIED;
    ch.resolution = IDEM_RESOLVED_RECONCILED;
    /* the earlier action is released to this call: if this call goes
    ** ahead, it carries that action out (handed_to) */
    if (e) ch.duplicate_of = s->call_id;
  }
  now = apply(s, &ch, &rc);
  idem__free(res);
  if (!now)
    return rc && !e && s->phase != PH_ANSWERED
               ? answer_unrecorded(s, outcome, NULL, 1)
               : rc;
  if (e) {
    /* the earlier action is settled: dedupe against it, or go on */
    if (now->state == IDEM_STATE_SUCCEEDED)
      rc = deduplicate(s, now);
    else
      rc = decide(s);
  } else if (now->state == IDEM_STATE_SUCCEEDED) {
    /* this call's own timed-out attempt, settled: not a replay; a resumed
    ** action of an earlier run is one */
    rc = answer_outcome(s, now, !s->late_ok);
  } else {
    rc = answer(s, IDEM_ANSWER_FAILED, 0, now->attempts, NULL, NULL,
                "The %s call did not take effect (a status check confirmed "
                "it). It is safe to call it again with the same arguments.",
                s->tool);
  }
  idem_record_free(now);
  return rc;
}

static int step_poll(idem_step *s) {
  if (!step_ok(s)) return IDEM_MISUSE;
  if (s->phase != PH_WAIT)
    return gfail(s->g, IDEM_MISUSE, "poll without a WAIT");
  return decide(s);
}

/* Record session/call_id as told at `when` (0: not told). */
static int stamp(idem_step *s, const char *session, const char *call_id,
                 long long when) {
  idem__change ch;
  int rc;
  change_init(s, &ch, NULL);
  ch.session = session;
  ch.call_id = call_id;
  ch.from = ALL_STATES;
  ch.delivered = when;
  rc = s->g->st->vt->change(s->g->st, &ch, NULL);
  if (rc == IDEM_NOTFOUND || rc == IDEM_STALE) return IDEM_OK;
  return rc ? store_fail(s->g, rc) : IDEM_OK;
}

static int step_delivered(idem_step *s) {
  long long now;
  int rc, i;
  if (!step_ok(s)) return IDEM_MISUSE;
  if (s->phase != PH_ANSWERED || s->rule->cls != IDEM_CLASS_GUARDED)
    return IDEM_OK;
  if (s->answer != IDEM_ANSWER_SUCCEEDED && s->answer != IDEM_ANSWER_FAILED &&
      s->answer != IDEM_ANSWER_ALREADY_APPLIED)
    return IDEM_OK; /* nothing definite was told */
  if (s->told) return IDEM_OK;
  now = now_ms(s);
  if ((rc = stamp(s, s->session, s->call_id, now))) return rc;
  s->told = s->stamped = 1;
  for (i = 0; i < 2; i++) {
    /* the earlier action's outcome is what the model is told */
    if (!s->dup[i].call_id || s->dup[i].was) continue;
    if ((rc = stamp(s, s->dup[i].session, s->dup[i].call_id, now)))
      return rc;
    s->dup[i].stamped = 1;
  }
  return IDEM_OK;
}

static int step_undelivered(idem_step *s) {
  int rc, i;
  if (!step_ok(s)) return IDEM_MISUSE;
  for (i = 0; i < 2; i++) {
    if (!s->dup[i].stamped) continue;
    if ((rc = stamp(s, s->dup[i].session, s->dup[i].call_id, s->dup[i].was)))
      return rc;
    s->dup[i].stamped = 0;
  }
  if (s->stamped) {
    /* a record this step stamped was untold before (a told one replays
    ** as told, and is not stamped again) */
    if ((rc = stamp(s, s->session, s->call_id, 0))) return rc;
    s->stamped = s->told = 0;
  }
  return IDEM_OK;
}

void idem_step_free(idem_step *s) {
  if (!s || s->magic != STEP_MAGIC) return;
  s->magic = IDEM__MAGIC_DEAD;
  if (s->g) step_detach(s);
  idem__free(s->session);
  idem__free(s->call_id);
  idem__free(s->tool);
  idem__free(s->turn);
  idem__free(s->key);
  idem__free(s->fingerprint);
  idem__free(s->args);
  idem__free(s->send_args);
  idem__free(s->fence_key);
  idem__free(s->fence_v0[0]);
  idem__free(s->fence_v0[1]);
  idem__free(s->check_args);
  idem_record_free(s->earlier);
  idem__free(s->why);
  idem__free(s->dup[0].session);
  idem__free(s->dup[0].call_id);
  idem__free(s->dup[1].session);
  idem__free(s->dup[1].call_id);
  idem__buf_free(&s->env);
  idem__free(s);
}

const char *idem_step_key(const idem_step *s) {
  return s && s->magic == STEP_MAGIC ? s->key : NULL;
}

const char *idem_step_args(const idem_step *s, size_t *len) {
  if (!s || s->magic != STEP_MAGIC || !s->send_args) {
    if (len) *len = 0;
    return NULL;
  }
  if (len) *len = s->send_len;
  return s->send_args;
}

const char *idem_step_check_tool(const idem_step *s) {
  if (!s || s->magic != STEP_MAGIC || !s->rule || !s->rule->has_status)
    return NULL;
  return s->rule->status.tool;
}

const char *idem_step_check_args(const idem_step *s, size_t *len) {
  if (len) *len = s && s->magic == STEP_MAGIC ? s->check_len : 0;
  return s && s->magic == STEP_MAGIC ? s->check_args : NULL;
}

const char *idem_step_check_command(const idem_step *s) {
  if (!s || s->magic != STEP_MAGIC || !s->rule || !s->rule->has_status)
    return NULL;
  return s->rule->status.command;
}

const char *idem_step_check_key(const idem_step *s) {
  if (!s || s->magic != STEP_MAGIC) return NULL;
  return s->phase == PH_CHECK_EARLIER && s->earlier ? s->earlier->key : s->key;
}

const char *idem_step_check_target(const idem_step *s, size_t *len) {
  const char *a;
  if (!s || s->magic != STEP_MAGIC) return NULL;
  a = s->phase == PH_CHECK_EARLIER && s->earlier ? s->earlier->args : s->args;
  if (len) *len = a ? strlen(a) : 0;
  return a;
}

int idem_step_attempt(const idem_step *s) {
  return s && s->magic == STEP_MAGIC ? s->attempt : 0;
}

int idem_step_check_verdict(const idem_step *s, const char *result,
                            size_t len) {
  if (!s || s->magic != STEP_MAGIC || !s->rule) return IDEM_OUTCOME_UNKNOWN;
  return idem__status_verdict(&s->rule->status, idem_step_check_key(s), result,
                              len);
}

long long idem_step_deadline_ms(const idem_step *s) {
  if (!s || s->magic != STEP_MAGIC || !s->rule) return 0;
  return s->next == IDEM_NEXT_CHECK ? s->rule->reconcile_timeout_ms
                                    : s->rule->timeout_ms;
}

long long idem_step_delay_ms(const idem_step *s) {
  return s && s->magic == STEP_MAGIC ? s->delay_ms : 0;
}

int idem_step_answer(const idem_step *s) {
  return s && s->magic == STEP_MAGIC ? s->answer : 0;
}

const char *idem_step_envelope(const idem_step *s, size_t *len) {
  if (!s || s->magic != STEP_MAGIC || s->phase != PH_ANSWERED) {
    if (len) *len = 0;
    return NULL;
  }
  if (len) *len = s->env.len;
  return s->env.p;
}

int idem_guard_record(idem_guard *g, const char *session, const char *call_id,
                      idem_record **out) {
  int rc;
  if (out) *out = NULL;
  if (!g || g->magic != GUARD_MAGIC || !g->st || !session || !call_id || !out)
    return IDEM_MISUSE;
  rc = g->st->vt->get(g->st, session, call_id, out);
  if (rc && rc != IDEM_NOTFOUND) return store_fail(g, rc);
  return rc;
}

/* ---- the synchronous API: the tool on a worker thread ---------------------- */

/* One run of a tool function.  Shared by the caller and the worker; the
** last of the two to let go frees it.  A run the caller stopped waiting for
** (abandoned) records its own late result, and only such a run holds the
** guard: a run that ended in time leaves every reference of the guard to
** its caller, so the last one is never dropped on a worker thread while
** the program that closed its guard is already exiting (the store and
** OpenSSL torn down under exit()'s cleanup: found by make tsan). */
typedef struct run_job {
  idem__work work; /* first: what a worker runs */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs, done, abandoned, is_check;
  idem_tool tool;
  char *key, *args;
  size_t args_len;
  int outcome;
  char *result, *error; /* the tool's, from idem_malloc() */
  idem_guard *g;        /* held (refs) once abandoned, for the late record */
  char *session, *call_id;
  long long token;
} run_job;

static void job_unref(run_job *j) {
  int last;
  pthread_mutex_lock(&j->mu);
  last = --j->refs == 0;
  pthread_mutex_unlock(&j->mu);
  if (!last) return;
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->cv);
  idem__free(j->result);
  idem__free(j->error);
  idem__free(j->key);
  idem__free(j->args);
  idem__free(j->session);
  idem__free(j->call_id);
  if (j->abandoned) guard_unref(j->g);
  idem__free(j);
}

static void job_run(idem__work *w) {
  run_job *j = (run_job *)w;
  char *result = NULL, *error = NULL;
  int outcome, abandoned;
  outcome = (j->is_check ? j->tool.check : j->tool.run)(
      j->tool.ctx, j->key, j->args, j->args_len, &result, &error);
  if (outcome < IDEM_OUTCOME_APPLIED || outcome > IDEM_OUTCOME_UNKNOWN)
    outcome = IDEM_OUTCOME_UNKNOWN;
  pthread_mutex_lock(&j->mu);
  j->outcome = outcome;
  j->result = result;
  j->error = error;
  __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE); /* a caller may spin */
  abandoned = j->abandoned;
  pthread_cond_signal(&j->cv);
  pthread_mutex_unlock(&j->mu);
  if (abandoned && !j->is_check) /* late capture: we were not waited for */
    idem_guard_late(j->g, j->session, j->call_id, j->token, outcome, result,
                    result ? strlen(result) : 0, error,
                    1 /* the tool function returned */);
  job_unref(j);
}

/*
** The threads that run tools for idem_guard_call and the operations of
** completion queues (queue.c): a job goes to an idle
** worker when there is one, else to a new thread (a tool that hangs keeps
** its worker, never the next call's).  A worker idle for WORKER_IDLE_S
** seconds ends.  The set outlives its guard until its last thread ends:
** the guard holds one reference, every thread one.
**
** Hand-offs.  A call hands its tool to a worker and takes the answer back:
** two wake-ups of a sleeping thread, each a futex call and, on a virtual
** machine whose other CPU has gone idle, tens of microseconds before the
** thread runs (measured: 40-70 us a call on tmpfs, more than the rest of
** the call).  So each side first waits awake for a moment, yielding the
** CPU: one idle worker at a time for WORKER_SPIN_US for the next job, and
** one caller at a time for CALLER_SPIN_US for its answer; only then do
** they sleep.  At most one thread of each kind spins, so 32 busy sessions
** do not spin against each other; a tool that takes longer than the spin
** costs its caller CALLER_SPIN_US of CPU, once.
*/
struct workers {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  idem__work **queue; /* jobs not yet taken, a ring */
  size_t cap, head;
  size_t n; /* queued: written under mu, read awake without it */
  int idle, refs;
  int sleeping;    /* idle workers asleep on cv (counted in idle) */
  int waking;      /* one of them was signalled and is not up yet */
  int closing;     /* written under mu, read awake without it */
  int spinner;     /* a worker waits awake (counted in idle) */
  int caller_spin; /* a caller waits awake for its answer (atomic) */
};

/* Wait awake, yielding the CPU, until *word is nonzero (read atomically)
** or us microseconds have passed; whether it is. */
static int spin_for(const void *word, int is_size, long long us) {
  long long until = idem__mono_us() + us;
  for (;;) {
    if (is_size ? __atomic_load_n((const size_t *)word, __ATOMIC_ACQUIRE) != 0
                : __atomic_load_n((const int *)word, __ATOMIC_ACQUIRE) != 0)
      return 1;
    if (idem__mono_us() >= until) return 0;
    sched_yield();
  }
}

static void workers_unref_locked(workers *w) {
  if (--w->refs > 0) {
    pthread_mutex_unlock(&w->mu);
    return;
  }
  pthread_mutex_unlock(&w->mu);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  idem__free(w->queue);
  idem__free(w);
}

/* Wake one sleeping worker when jobs wait and none is on its way (under
** w->mu).  A burst of posts costs its poster one wake-up: each worker
** woken wakes the next while jobs remain, so an event loop that submits
** many operations at once does not pay a futex call for each. */
static void wake_one(workers *w) {
  if (w->n > 0 && w->sleeping > 0 && !w->waking) {
    w->waking = 1;
    pthread_cond_signal(&w->cv);
  }
}

static void *worker_main(void *arg) {
  workers *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    idem__work *j;
    if (w->n == 0 && !w->closing && !w->spinner) {
      w->spinner = 1;
      w->idle++; /* a post counts on this worker */
      pthread_mutex_unlock(&w->mu);
      spin_for(&w->n, 1, WORKER_SPIN_US);
      pthread_mutex_lock(&w->mu);
      w->idle--;
      w->spinner = 0;
    }
    if (w->n == 0 && !w->closing) {
      struct timespec until;
      int rc = 0;
      idem__mono_after(WORKER_IDLE_S * 1000LL, &until);
      w->idle++;
      w->sleeping++;
      while (w->n == 0 && !w->closing && rc != ETIMEDOUT) {
        rc = pthread_cond_timedwait(&w->cv, &w->mu, &until);
        w->waking = 0;
      }
      w->sleeping--;
      w->idle--;
    }
    if (w->n == 0) break; /* idle too long, or the guard is gone */
    j = w->queue[w->head];
    w->head = (w->head + 1) % w->cap;
    __atomic_store_n(&w->n, w->n - 1, __ATOMIC_RELEASE);
    wake_one(w); /* more jobs: the next sleeper, from here */
    pthread_mutex_unlock(&w->mu);
    j->run(j);
    pthread_mutex_lock(&w->mu);
  }
  workers_unref_locked(w);
  return NULL;
}

static void workers_release(workers *w) {
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  __atomic_store_n(&w->closing, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&w->cv);
  workers_unref_locked(w);
}

int idem__guard_post(idem_guard *g, idem__work *j) {
  pthread_condattr_t ca;
  pthread_attr_t ta;
  pthread_t th;
  workers *w = __atomic_load_n(&g->workers, __ATOMIC_ACQUIRE);
  int rc = 0;
  if (!w) { /* made once; g->mu only then */
    pthread_mutex_lock(&g->mu);
    if (!g->workers && (w = idem__malloc(sizeof *w))) {
      memset(w, 0, sizeof *w);
      w->refs = 1;
      pthread_condattr_init(&ca);
      pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
      pthread_cond_init(&w->cv, &ca);
      pthread_condattr_destroy(&ca);
      pthread_mutex_init(&w->mu, NULL);
      __atomic_store_n(&g->workers, w, __ATOMIC_RELEASE);
    }
    w = g->workers;
    pthread_mutex_unlock(&g->mu);
    if (!w) return -1;
  }
  pthread_mutex_lock(&w->mu);
  if (w->n == w->cap) { /* grow the ring, keeping its order */
    size_t cap = w->cap ? 2 * w->cap : 8, i;
    idem__work **q = idem__malloc(cap * sizeof *q);
    if (!q) {
      pthread_mutex_unlock(&w->mu);
      return -1;
    }
    for (i = 0; i < w->n; i++) q[i] = w->queue[(w->head + i) % w->cap];
    idem__free(w->queue);
    w->queue = q;
    w->cap = cap;
    w->head = 0;
  }
  if (w->idle <= (int)w->n) { /* every idle worker is spoken for */
    pthread_attr_init(&ta);
    pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &ta, worker_main, w) == 0)
      w->refs++;
    else if (w->idle == 0)
      rc = -1;
    pthread_attr_destroy(&ta);
  }
  if (rc == 0) {
    w->queue[(w->head + w->n) % w->cap] = j;
    __atomic_store_n(&w->n, w->n + 1, __ATOMIC_RELEASE); /* a worker spins */
    /* the spinning worker takes the only job without a wake-up: it sees n
    ** while it spins, or under mu when it stops */
    if (!w->spinner || w->n > 1) wake_one(w);
  }
  pthread_mutex_unlock(&w->mu);
  return rc;
}

/* Run the tool (or its check) for at most deadline_ms.  On time: 0 and the
** outcome; past it: the job is abandoned, UNKNOWN is returned, and the
** worker records the late result itself. */
static int run_tool(idem_step *s, const idem_tool *tool, int is_check,
                    long long deadline_ms, int *outcome, char **result,
                    char **error, int *ended) {
  run_job *j = idem__malloc(sizeof *j);
  pthread_condattr_t ca;
  struct timespec until;
  const char *key = is_check ? idem_step_check_key(s) : s->key;
  size_t alen;
  const char *args = is_check ? idem_step_check_target(s, &alen) : s->send_args;
  int rc = 0;
  *result = *error = NULL;
  *ended = 0;
  if (!j) return IDEM_NOMEM;
  memset(j, 0, sizeof *j);
  if (!is_check) alen = s->send_len;
  j->refs = 2;
  j->is_check = is_check;
  j->tool = *tool;
  j->key = idem__strdup(key);
  j->args = idem__strndup(args, alen);
  j->args_len = alen;
  j->session = idem__strdup(s->session);
  j->call_id = idem__strdup(s->call_id);
  j->token = s->token;
  j->g = s->g;
  if (!j->key || !j->args || !j->session || !j->call_id) {
    idem__free(j->key);
    idem__free(j->args);
    idem__free(j->session);
    idem__free(j->call_id);
    idem__free(j);
    return IDEM_NOMEM;
  }
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&j->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&j->mu, NULL);
  j->work.run = job_run;
  if (idem__guard_post(s->g, &j->work) != 0) {
    j->refs = 1;
    job_unref(j);
    return gfail(s->g, IDEM_ERROR, "cannot start a worker thread");
  }
  {
    /* one caller at a time waits awake a moment: most tools of a fast
    ** path answer within it (the worker set is the guard's, held) */
    workers *w = s->g->workers;
    if (!__atomic_exchange_n(&w->caller_spin, 1, __ATOMIC_ACQ_REL)) {
      spin_for(&j->done, 0,
               deadline_ms * 1000 < CALLER_SPIN_US ? deadline_ms * 1000
                                                   : CALLER_SPIN_US);
      __atomic_store_n(&w->caller_spin, 0, __ATOMIC_RELEASE);
    }
  }
  idem__mono_after(deadline_ms, &until);
  pthread_mutex_lock(&j->mu);
  while (!j->done && rc != ETIMEDOUT)
    rc = pthread_cond_timedwait(&j->cv, &j->mu, &until);
  if (j->done) {
    *outcome = j->outcome;
    *result = j->result;
    *error = j->error;
    j->result = j->error = NULL;
    *ended = 1; /* the tool function returned */
  } else {
    j->abandoned = 1; /* the worker reads it under j->mu, after this */
    pthread_mutex_lock(&s->g->mu);
    s->g->refs++; /* dropped by the job's last reference */
    pthread_mutex_unlock(&s->g->mu);
    *outcome = IDEM_OUTCOME_UNKNOWN;
    /* the reason, for the record and the model's words (freed by the
    ** caller with idem__free(), as a tool's own error is) */
    if ((*error = idem__malloc(48)))
      snprintf(*error, 48, "no answer within %lld ms", deadline_ms);
  }
  pthread_mutex_unlock(&j->mu);
  job_unref(j);
  return IDEM_OK;
}

int idem_guard_call(idem_guard *g, const idem_call *call,
                    const idem_tool *tool_in, char **envelope, size_t *len) {
  idem_step *s = NULL;
  int rc, outcome, ended;
  char *result, *error;
  idem_tool tcur;
  const idem_tool *tool = &tcur;
  idem_call ccur;
  if (envelope) *envelope = NULL;
  if (len) *len = 0;
  if (!g || g->magic != GUARD_MAGIC || !envelope) return IDEM_MISUSE;
  if (idem__abi_in(&tcur, sizeof tcur, tool_in, IDEM__ABI_MIN(idem_tool)))
    return gfail(g, IDEM_MISUSE,
                 "idem_tool.size is %zu: set it to sizeof(idem_tool)",
                 tool_in ? tool_in->size : 0);
  if (!tool->run) return IDEM_MISUSE;
  /* a check function given in code is a status check, whatever the
  ** policy names (a caller's call is copied: it is const) */
  if ((rc = call_copy(g, call, &ccur))) return rc;
  if (tool->check) ccur.own_check = 1;
  if ((rc = idem_guard_begin(g, &ccur, &s))) goto done;
  s->auto_deliver = 1;
  for (;;) {
    switch (s->next) {
    case IDEM_NEXT_EXECUTE:
      idem__sleep_ms(s->delay_ms);
      rc = run_tool(s, tool, 0, idem_step_deadline_ms(s), &outcome, &result,
                    &error, &ended);
      if (!rc && ended) rc = idem_step_attempt_ended(s);
      if (!rc)
        rc = idem_step_finish(s, outcome, result, result ? strlen(result) : 0,
                              error);
      idem__free(result);
      idem__free(error);
      break;
    case IDEM_NEXT_CHECK:
      if (!tool->check) { /* nothing to check with */
        rc = idem_step_no_check(s);
        break;
      }
      rc = run_tool(s, tool, 1, idem_step_deadline_ms(s), &outcome, &result,
                    &error, &ended);
      if (!rc)
        rc = idem_step_resolve(s, outcome, result, result ? strlen(result) : 0);
      idem__free(result);
      idem__free(error);
      break;
    case IDEM_NEXT_WAIT:
      idem__sleep_ms(s->delay_ms);
      rc = idem_step_poll(s);
      break;
    case IDEM_NEXT_ANSWER:
      if (!(*envelope = idem__strndup(s->env.p, s->env.len))) {
        rc = gfail(g, IDEM_NOMEM, "out of memory");
        goto done;
      }
      if (len) *len = s->env.len;
      rc = idem_step_delivered(s);
      goto done;
    default: rc = IDEM_MISUSE;
    }
    if (rc) goto done;
  }
done:
  idem_step_free(s);
  return rc;
}

int idem_guard_recover(idem_guard *g, const char *session, const char *call_id,
                       idem_step **out) {
  idem__change ch;
  idem_step *s;
  idem_record *r = NULL, *now = NULL;
  int rc;
  if (out) *out = NULL;
  if (!g || g->magic != GUARD_MAGIC || !g->st || !session || !call_id || !out)
    return IDEM_MISUSE;
  rc = g->st->vt->get(g->st, session, call_id, &r);
  if (rc) return rc == IDEM_NOTFOUND ? rc : store_fail(g, rc);
  if (!(s = idem__malloc(sizeof *s))) {
    idem_record_free(r);
    return gfail(g, IDEM_NOMEM, "out of memory");
  }
  memset(s, 0, sizeof *s);
  s->magic = STEP_MAGIC;
  s->t0 = idem__mono_us();
  s->recover = 1;
  idem__buf_init(&s->env, (size_t)64 << 20);
  *out = s;
  s->session = idem__strdup(r->session);
  s->call_id = idem__strdup(r->call_id);
  s->tool = idem__strdup(r->tool);
  s->key = idem__strdup(r->key);
  s->fingerprint = idem__strdup(r->fingerprint);
  s->args = idem__strdup(r->args);
  s->args_len = r->args ? strlen(r->args) : 0;
  if (step_attach(s, g) || !s->session || !s->call_id || !s->tool || !s->key ||
      !s->fingerprint || !s->args) {
    idem_record_free(r);
    return gfail(g, IDEM_NOMEM, "out of memory");
  }
  s->rule = idem__policy_rule(g->policy, s->tool, &s->scratch);
  s->attempt = r->attempts;
  if (!recoverable(r, now_ms(s))) {
    /* nothing in doubt: say what it is */
    if (r->state == IDEM_STATE_PENDING)
      rc = answer(s, IDEM_ANSWER_IN_PROGRESS, 0, r->attempts, NULL, NULL,
                  "The %s call is still being carried out.", s->tool);
    else if (r->state == IDEM_STATE_NOT_APPLIED)
      rc = answer(s, IDEM_ANSWER_FAILED, 0, r->attempts, NULL, NULL,
                  "The %s call did not take effect.", s->tool);
    else
      rc = answer_outcome(s, r, 1);
    idem_record_free(r);
    return rc;
  }
  set_why(s, r->error ? r->error : OWNER_GONE);
  lease_change(s, &ch, r, IDEM_STATE_IN_DOUBT, 0);
  rc = g->st->vt->change(g->st, &ch, &now);
  idem_record_free(r);
  if (rc) {
    idem_record_free(now);
    if (rc == IDEM_STALE) return gfail(g, rc, "the record changed meanwhile");
    return store_fail(g, rc);
  }
  s->token = now->token;
  idem_record_free(now);
  if ((rc = build_check_args(s, s->args, s->args_len, s->key))) return rc;
  s->phase = PH_CHECK_OWN;
  s->deadline = idem__mono_ms() + s->rule->reconcile_timeout_ms;
  s->next = IDEM_NEXT_CHECK;
  return IDEM_OK;
}

long long idem_step_token(const idem_step *s) {
  return s && s->magic == STEP_MAGIC ? s->token : 0;
}

int idem_guard_late(idem_guard *g, const char *session, const char *call_id,
                    long long token, int outcome, const char *result,
                    size_t result_len, const char *error, int ended) {
  idem_step late;
  idem_canon *c = NULL;
  idem_record *r = NULL;
  char *res = NULL;
  int rc;
  if (!g || g->magic != GUARD_MAGIC || !g->st || !session || !call_id ||
      outcome < IDEM_OUTCOME_APPLIED || outcome > IDEM_OUTCOME_UNKNOWN)
    return IDEM_MISUSE;
  if (token == 0) return IDEM_OK; /* a step that records nothing */
  if (idem_canon_open(&c) != IDEM_OK ||
      (result && !(res = result_json(c, result, result_len)))) {
    idem_canon_close(c);
    return gfail(g, IDEM_NOMEM, "out of memory");
  }
  idem_canon_close(c);
  memset(&late, 0, sizeof late);
  late.g = g;
  late.session = (char *)(uintptr_t)session;
  late.call_id = (char *)(uintptr_t)call_id;
  late.token = token;
  late.ended = ended != 0;
  /* the tool's rule says how long the action is kept once settled */
  if (g->st->vt->get(g->st, session, call_id, &r) == IDEM_OK)
    late.rule = idem__policy_rule(g->policy, r->tool, &late.scratch);
  rc = finish_late(&late, outcome, res, error);
  idem__free(res);
  idem_record_free(r);
  return rc;
}

/* ---- reading and keeping the log ------------------------------------------- */

typedef struct list_ctx {
  idem_record_fn fn;
  void *ctx;
  long long now; /* the log's clock, for the recoverable filter */
  int recoverable;
  size_t left; /* records still wanted; SIZE_MAX: no limit */
} list_ctx;

static int list_one(const idem_record *r, void *arg) {
  list_ctx *x = arg;
  if (x->recoverable && !recoverable(r, x->now)) return 0;
  if (x->left == 0) return 1;
  if (x->left != SIZE_MAX) x->left--;
  return x->fn(x->ctx, r) ? 1 : 0;
}

int idem_guard_list(idem_guard *g, const idem_filter *f, idem_record_fn fn,
                    void *ctx) {
  idem_filter cur;
  idem__filter sf;
  list_ctx x;
  int rc;
  if (!g || g->magic != GUARD_MAGIC || !g->st || !fn) return IDEM_MISUSE;
  if (!f)
    memset(&cur, 0, sizeof cur);
  else if (idem__abi_in(&cur, sizeof cur, f, IDEM__FILTER_MIN))
    return gfail(g, IDEM_MISUSE,
                 "idem_filter.size is %zu: set it to sizeof(idem_filter)",
                 f->size);
  memset(&x, 0, sizeof x);
  x.fn = fn;
  x.ctx = ctx;
  x.recoverable = cur.recoverable != 0;
  x.left = cur.limit ? cur.limit : SIZE_MAX;
  memset(&sf, 0, sizeof sf);
  sf.session = cur.session;
  sf.states = cur.states;
  sf.limit = cur.limit;
  sf.call_id = cur.call_id;
  sf.key = cur.key;
  sf.tool = cur.tool;
  sf.after_created = cur.after_created;
  sf.after_session = cur.after_session;
  sf.after_call_id = cur.after_call_id;
  if (x.recoverable) {
    /* the limit counts recoverable records, which the store cannot see */
    sf.states = (cur.states ? cur.states : ALL_STATES) &
                (BIT(IDEM_STATE_IN_DOUBT) | BIT(IDEM_STATE_PENDING));
    sf.limit = 0;
    if (!sf.states) return IDEM_OK;
    if ((rc = g->st->vt->now(g->st, &x.now))) return store_fail(g, rc);
  }
  rc = g->st->vt->list(g->st, &sf, list_one, &x);
  return rc ? store_fail(g, rc) : IDEM_OK;
}

int idem_guard_stats(idem_guard *g, idem_stats *out) {
  idem_stats st;
  long long counts[8] = {0};
  int rc, i;
  if (!g || g->magic != GUARD_MAGIC || !g->st) return IDEM_MISUSE;
  if ((rc = g->st->vt->stats(g->st, counts))) return store_fail(g, rc);
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  for (i = IDEM_STATE_PENDING; i <= IDEM_STATE_DEDUPLICATED; i++) {
    st.by_state[i] = counts[i];
    st.records += counts[i];
  }
  if (idem__abi_out(out, &st, sizeof st, IDEM__ABI_MIN(idem_stats)))
    return gfail(g, IDEM_MISUSE,
                 "idem_stats.size is too small: set it to sizeof(idem_stats)");
  return IDEM_OK;
}

int idem_guard_tally(idem_guard *g, idem_tally_fn fn, void *ctx) {
  int rc;
  if (!g || g->magic != GUARD_MAGIC || !g->st || !fn) return IDEM_MISUSE;
  rc = g->st->vt->tally(g->st, fn, ctx);
  return rc ? store_fail(g, rc) : IDEM_OK;
}

int idem_guard_gc(idem_guard *g, size_t *removed) {
  long long now = 0;
  size_t n = 0;
  int rc;
  if (removed) *removed = 0;
  if (!g || g->magic != GUARD_MAGIC || !g->st) return IDEM_MISUSE;
  if ((rc = g->st->vt->now(g->st, &now)) ||
      (rc = g->st->vt->gc(g->st, now, &n)))
    return store_fail(g, rc);
  if (removed) *removed = n;
  return IDEM_OK;
}

/* ---- the caller's deadline --------------------------------------------------
** A step's store calls give up retrying a lost log by the step's deadline
** (idem__store_deadline): the caller is answered then, not held.  Each
** entry point below runs its body between on(s) and off(rc). */

static int on(idem_step *s) {
  if (!step_ok(s)) return 0;
  idem__store_deadline_set(s->deadline);
  return 1;
}

static int off(int rc) {
  idem__store_deadline_set(0);
  return rc;
}

int idem_step_finish(idem_step *s, int outcome, const char *result,
                     size_t result_len, const char *error) {
  return on(s) ? off(step_finish(s, outcome, result, result_len, error))
               : IDEM_MISUSE;
}

int idem_step_resolve(idem_step *s, int outcome, const char *result,
                      size_t result_len) {
  return on(s) ? off(step_resolve(s, outcome, result, result_len))
               : IDEM_MISUSE;
}

int idem_step_no_check(idem_step *s) {
  int rc;
  if (!on(s)) return IDEM_MISUSE;
  s->no_check = 1; /* nothing to check with: no check ran */
  rc = step_resolve(s, IDEM_OUTCOME_UNKNOWN, NULL, 0);
  s->no_check = 0;
  return off(rc);
}

int idem_step_poll(idem_step *s) {
  return on(s) ? off(step_poll(s)) : IDEM_MISUSE;
}

int idem_step_delivered(idem_step *s) {
  return on(s) ? off(step_delivered(s)) : IDEM_MISUSE;
}

int idem_step_undelivered(idem_step *s) {
  return on(s) ? off(step_undelivered(s)) : IDEM_MISUSE;
}
