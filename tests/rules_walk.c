/*
** rules_walk.c - a model-based random walk of the guard's decision rules.
**
** A seeded walk plays a harness and a model against one attempt log: new
** calls in the current turn or late calls of an earlier one, over three
** argument sets (two of them one order, so one action under the fence on
** order_id), with the provider applying, rejecting, refusing or leaving
** the outcome unknown; crashes before the outcome commit (a process of its
** own begins the call and dies), after it (the answer never delivered),
** or calls left in flight and finished later; replays of any call id; new
** turns; recoveries.  After every step the guard's answer and the
** provider's ledger are checked against a model of the documented rules
** (docs/SAME-ACTION.md, docs/FENCE.md), which says which DECISION each
** call is:
**
**   - a call of a turn in which an identical call (the same order) was
**     made is that call's decision (one turn, one action);
**   - else a call made while a decision of the same order has not been
**     told (nothing definite was delivered: in flight, in doubt, applied
**     but never told) re-issues that decision;
**   - else it is a new decision.  Replays are their call's decision.
**
** and checks:
**
**   at most once  the ledger holds at most one refund per decision;
**   the right one already_applied names a call of this decision, or of
**                 the one that was not yet told when the call was made
**                 (the fence's reading: a re-issue); a late call of an
**                 earlier turn may name any decision carried out;
**   it runs       a new decision whose provider applies and nothing
**                 crashes is carried out: succeeded, its own refund.
**
** A failing walk is shrunk (steps dropped while it still fails, then
** replayed on a fresh log) and printed with its seed.
**
**   rules_walk DIR|POSTGRES-URL [SEEDS [STEPS]]
**
** IDEM_WALK_SEEDS and IDEM_WALK_STEPS override the counts (long runs);
** IDEM_WALK_FIRST starts at that seed (1 unless set): one seed alone is
** IDEM_WALK_FIRST=N IDEM_WALK_SEEDS=1.
*/
#define _GNU_SOURCE
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "idem.h"

extern char **environ;

static const char *POLICY_TEXT =
    "{\"tools\":{\"refund_payment\":{\"class\":\"guarded\",\"timeout_ms\":"
    "5000,\"retries\":0,\"backoff_ms\":1,\"wait_ms\":0,\"settle_ms\":0,"
    "\"coalesce_ms\":0,\"fence\":[\"order_id\"],"
    "\"status\":{\"tool\":\"get_refund_status\","
    "\"arguments\":{\"order_id\":\"{order_id}\"}}},"
    "\"get_refund_status\":{\"class\":\"read_only\"}}}";

#define NARGS 3
static const char *const ARGSET[NARGS] = {
    "{\"order_id\":\"ord_1\",\"amount_cents\":6000}",
    "{\"order_id\":\"ord_1\",\"amount_cents\":7000}",
    "{\"order_id\":\"ord_2\",\"amount_cents\":6000}"};
static const int ORDER[NARGS] = {0, 0, 1};

/* ---- the walk: steps as data, so that a walk can be shrunk and replayed -- */

enum { OP_NEW, OP_REPLAY, OP_TURN, OP_FINISH, OP_RECOVER };
/* what the provider does with the attempt */
enum { PV_APPLY, PV_REJECT, PV_REFUSE, PV_UNKNOWN_APPLIED, PV_UNKNOWN_NOT };
/* where the harness dies */
enum { CR_NONE, CR_BEFORE_COMMIT, CR_AFTER_COMMIT, CR_HOLD };

typedef struct op {
  int kind;
  int args;   /* OP_NEW: the argument set                         */
  int late;   /* OP_NEW: a call of an earlier turn: that many back */
  int target; /* OP_REPLAY/FINISH/RECOVER: the step that made it  */
  int pv, crash;
} op;

static const char *const OP_NAME[] = {"new", "replay", "turn", "finish",
                                      "recover"};
static const char *const PV_NAME[] = {"apply", "reject", "refuse",
                                      "unknown+applied", "unknown"};
static const char *const CR_NAME[] = {"", " crash-before-commit",
                                      " crash-after-commit", " hold"};

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static unsigned long long rng;
static unsigned rnd(unsigned n) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (unsigned)(rng % n);
}

static void make_walk(op *w, int n) {
  int i;
  for (i = 0; i < n; i++) {
    op *o = &w[i];
    unsigned r = rnd(100);
    memset(o, 0, sizeof *o);
    o->target = i > 0 ? (int)rnd((unsigned)i) : 0;
    o->pv = (int)rnd(5);
    o->crash = rnd(10) < 7 ? CR_NONE : (int)(1 + rnd(3));
    if (r < 45) {
      o->kind = OP_NEW;
      o->args = (int)rnd(NARGS);
      o->late = rnd(100) < 15 ? 1 + (int)rnd(3) : 0;
    } else if (r < 65) {
      o->kind = OP_REPLAY;
      if (o->crash == CR_BEFORE_COMMIT || o->crash == CR_HOLD)
        o->crash = CR_NONE;
    } else if (r < 82) {
      o->kind = OP_TURN;
    } else if (r < 92) {
      o->kind = OP_FINISH;
    } else
      o->kind = OP_RECOVER;
  }
}

/* ---- the world: the log, the provider's ledger, the model ---------------- */

#define MAXC 4096
typedef struct callm {
  int exists;    /* made by a step still in the walk */
  char id[16];
  int args, turn, decision;
  int late_of;   /* a late call: the decision it re-issued, or -1 */
  int alt;       /* another decision the rules may read it as, or -1 */
  int failed;    /* its last answer, told: failed (not carried out) */
  int ghost;     /* its harness died before the log had it: not made */
  idem_step *held; /* left in flight by the harness */
  int held_pv;
} callm;

typedef struct decision {
  int order;
  int told; /* something definite was delivered */
} decision;

static struct world {
  const char *dir;
  int run;
  idem_policy *pol;
  idem_guard *g;
  char url[4200];
  int turn;
  callm calls[MAXC];
  decision dec[MAXC];
  int ndec;
  char ledger[MAXC][64]; /* applied keys */
  int napplied;
  char why[512];
  char session[16]; /* each walk's own (a shared PostgreSQL log) */
  int pg;           /* dir is a PostgreSQL URL */
  int trace; /* IDEM_WALK_TRACE: print every answer */
} W;

static int fail(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
static int fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(W.why, sizeof W.why, fmt, ap);
  va_end(ap);
  return 1;
}

static int ledger_has(const char *key) {
  int i;
  for (i = 0; i < W.napplied; i++)
    if (strcmp(W.ledger[i], key) == 0) return 1;
  return 0;
}

static void ledger_apply(const char *key) {
  if (W.napplied < MAXC)
    snprintf(W.ledger[W.napplied++], sizeof W.ledger[0], "%s", key);
}

/* The call a key was minted for: "wRUN:cN:hex". */
static int key_call(const char *key) {
  const char *p = strchr(key, ':');
  return p && p[1] == 'c' ? atoi(p + 2) : -1;
}

static void world_open(void) {
  memset(W.calls, 0, sizeof W.calls);
  W.turn = 1;
  W.ndec = 0;
  W.napplied = 0;
  W.why[0] = '\0';
  snprintf(W.session, sizeof W.session, "w%d", ++W.run);
  if (W.pg)
    snprintf(W.url, sizeof W.url, "%s", W.dir);
  else
    snprintf(W.url, sizeof W.url, "sqlite:%s/walk%d.db", W.dir, W.run);
  if (idem_guard_open(W.url, W.pol, &W.g) != IDEM_OK) {
    fprintf(stderr, "open %s: %s\n", W.url, idem_guard_errmsg(W.g));
    exit(2);
  }
}

static void world_close(void) {
  int i;
  for (i = 0; i < MAXC; i++) {
    idem_step_free(W.calls[i].held);
    W.calls[i].held = NULL;
  }
  idem_guard_close(W.g);
  W.g = NULL;
  if (!W.pg) {
    char path[4300];
    snprintf(path, sizeof path, "%s/walk%d.db", W.dir, W.run);
    unlink(path);
    snprintf(path, sizeof path, "%s/walk%d.db-wal", W.dir, W.run);
    unlink(path);
    snprintf(path, sizeof path, "%s/walk%d.db-shm", W.dir, W.run);
    unlink(path);
  }
}

/* The model: which decision a new call c is; *fresh: a new one. */
static int model_decide(int c, int *fresh) {
  callm *m = &W.calls[c];
  int i, order = ORDER[m->args], same = -1, untold = -1;
  m->late_of = m->alt = -1;
  for (i = 0; i < MAXC; i++) {
    callm *e = &W.calls[i];
    if (i == c || !e->exists || e->ghost || ORDER[e->args] != order)
      continue;
    if (e->turn == m->turn && same < 0) same = e->decision;
    if (e->turn == m->turn && e->decision != same) m->alt = e->decision;
    if (!W.dec[e->decision].told) untold = e->decision;
  }
  *fresh = 0;
  if (same >= 0) {
    if (untold >= 0 && untold != same) m->late_of = untold;
    return same;
  }
  if (untold >= 0) return untold;
  *fresh = 1;
  W.dec[W.ndec].order = order;
  W.dec[W.ndec].told = 0;
  return W.ndec++;
}

/* Check the ledger: at most one refund per decision. */
static int check_ledger(void) {
  static int count[MAXC];
  int i;
  memset(count, 0, sizeof(int) * (size_t)W.ndec);
  for (i = 0; i < W.napplied; i++) {
    int c = key_call(W.ledger[i]);
    if (c < 0 || c >= MAXC || !W.calls[c].exists) continue;
    if (++count[W.calls[c].decision] > 1)
      return fail("decision of %s refunded twice (key %s)", W.calls[c].id,
                  W.ledger[i]);
  }
  return 0;
}

/* ---- the harness --------------------------------------------------------- */

/* Run the provider for step s as pv says: the outcome to finish with. */
static int provide(idem_step *s, int pv) {
  const char *key = idem_step_key(s);
  switch (pv) {
  case PV_APPLY: ledger_apply(key); return IDEM_OUTCOME_APPLIED;
  case PV_REJECT: return IDEM_OUTCOME_REJECTED;
  case PV_REFUSE: return IDEM_OUTCOME_NOT_APPLIED;
  case PV_UNKNOWN_APPLIED: ledger_apply(key); return IDEM_OUTCOME_UNKNOWN;
  default: return IDEM_OUTCOME_UNKNOWN;
  }
}

/* Drive s to its answer; *held when the harness leaves it in flight. */
static int drive(idem_step *s, int pv, int crash, int *held) {
  int n, guard = 0;
  *held = 0;
  while ((n = idem_step_next(s)) != IDEM_NEXT_ANSWER) {
    int rc;
    if (++guard > 50) return fail("a step never answers");
    if (n == IDEM_NEXT_EXECUTE) {
      if (crash == CR_HOLD) {
        *held = 1;
        return 0;
      }
      rc = idem_step_finish(s, provide(s, pv), "{}", 2, NULL);
    } else if (n == IDEM_NEXT_CHECK) {
      const char *key = idem_step_check_key(s);
      rc = idem_step_resolve(s, key && ledger_has(key)
                                    ? IDEM_OUTCOME_APPLIED
                                    : IDEM_OUTCOME_NOT_APPLIED,
                             "{}", 2);
    } else
      rc = idem_step_poll(s);
    if (rc != IDEM_OK)
      return fail("guard error: %s", idem_guard_errmsg(W.g));
  }
  return 0;
}

/* Has the ledger a refund of decision d? */
static int applied_decision(int d) {
  int i;
  for (i = 0; i < W.napplied; i++) {
    int c = key_call(W.ledger[i]);
    if (c >= 0 && c < MAXC && W.calls[c].exists && W.calls[c].decision == d)
      return 1;
  }
  return 0;
}

/* Call m was answered naming call x (already_applied, or held back by
** it): where the model allowed two readings, the rules' is x's. */
static void adopt(callm *m, const callm *x) {
  if (x->decision == m->late_of || x->decision == m->alt)
    m->decision = x->decision;
}

/* Call c was answered already_applied naming the call in dup (text "cN"):
** a call of its decision (or of the one a late call re-issued), whose
** outcome is told now if told (the answer was delivered: a delivery
** marks both records, idem_step_delivered). */
static int check_named(int c, const char *dup, const char *env, int told) {
  callm *m = &W.calls[c];
  int x = dup && dup[0] == 'c' ? atoi(dup + 1) : -1;
  if (x < 0 || x >= MAXC || !W.calls[x].exists)
    return fail("%s: already_applied names no call of the walk: %.300s",
                m->id, env);
  adopt(m, &W.calls[x]);
  if (W.calls[x].decision != m->decision && W.calls[x].late_of != m->decision &&
      W.calls[x].alt != m->decision &&
      !(m->turn < W.turn && applied_decision(W.calls[x].decision)))
    return fail("%s: already_applied names a call of another decision: "
                "%.300s",
                m->id, env);
  if (told) {
    W.dec[W.calls[x].decision].told = 1; /* recorded as told with it */
    W.dec[m->decision].told = 1;
  }
  return 0;
}

/* The answer of s, for call c, against the model. */
static int check_answer(idem_step *s, int c, int fresh, int pv, int crash) {
  callm *m = &W.calls[c];
  size_t len;
  const char *env = idem_step_envelope(s, &len), *d;
  int a = idem_step_answer(s), told = 0, unchanged = 0;
  if (W.trace)
    fprintf(stderr, "    %s (turn %d, decision %d): %.200s\n", m->id, m->turn,
            m->decision, env);
  if (a == IDEM_ANSWER_ALREADY_APPLIED) {
    d = strstr(env, "\"duplicate_of\":\"");
    told = crash != CR_AFTER_COMMIT;
    if (check_named(c, d ? d + 16 : NULL, env, told)) return 1;
    /* not handed over: what the model knows of the decision is as it was */
    if (!told) unchanged = 1;
  } else if (a == IDEM_ANSWER_FAILED) {
    /* a verdict of no effect ends the decision, told or not: what the
    ** model does next is another (the fence holds only what may apply) */
    told = 1;
  } else if (a == IDEM_ANSWER_SUCCEEDED) {
    told = crash != CR_AFTER_COMMIT;
  } else if ((d = strstr(env, "\"duplicate_of\":\"c")) != NULL) {
    int x = atoi(d + 17);
    if (x >= 0 && x < MAXC && W.calls[x].exists) adopt(m, &W.calls[x]);
  }
  m->failed = a == IDEM_ANSWER_FAILED;
  /* a replay of what was told leaves it told; anything else says what
  ** the model knows of the decision now */
  if (told)
    W.dec[m->decision].told = 1;
  else if (!unchanged && !strstr(env, "\"replayed\":true"))
    W.dec[m->decision].told = 0;
  if (a == IDEM_ANSWER_SUCCEEDED && !ledger_has(idem_step_key(s)))
    return fail("%s: succeeded, yet its key was never applied: %.300s", m->id,
                env);
  if (fresh && pv == PV_APPLY && crash == CR_NONE &&
      a != IDEM_ANSWER_SUCCEEDED)
    return fail("%s: a new decision, applied by the provider, did not run: "
                "%.300s",
                m->id, env);
  if (told && crash != CR_AFTER_COMMIT) {
    if (idem_step_delivered(s) != IDEM_OK)
      return fail("delivered: %s", idem_guard_errmsg(W.g));
  }
  return 0;
}

/* A harness of its own begins call c and dies before the outcome commit;
** the provider then applies the attempt or not, as pv says. */
static int crash_before_commit(int c, int pv) {
  callm *m = &W.calls[c];
  char self[4200], turn[16];
  char *argv[] = {self, "--begin-and-die", W.url, m->id, turn,
                  (char *)ARGSET[m->args], W.session, NULL};
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  int status = -1;
  pid_t pid = -1;
  idem_record *r = NULL;
  self[n > 0 ? n : 0] = '\0';
  snprintf(turn, sizeof turn, "t%d", m->turn);
  if (posix_spawn(&pid, self, NULL, NULL, argv, environ) != 0 ||
      waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
    return fail("the crashing harness failed");
  /* exit 0: it was about to execute, and died; else it was answered and
  ** died before handing the answer over: an answer already_applied is
  ** not told (nothing is recorded told before idem_step_delivered) */
  if (W.trace)
    fprintf(stderr, "    %s (turn %d, decision %d): its harness died (%d)\n",
            m->id, m->turn, m->decision, WEXITSTATUS(status));
  if (idem_guard_record(W.g, W.session, m->id, &r) == IDEM_OK) {
    if (WEXITSTATUS(status) == 0 && r->state == IDEM_STATE_PENDING &&
        (pv == PV_APPLY || pv == PV_UNKNOWN_APPLIED))
      ledger_apply(r->key);
    if (r->state == IDEM_STATE_DEDUPLICATED &&
        check_named(c, r->duplicate_of, "(the crashed harness's call)", 0)) {
      idem_record_free(r);
      return 1;
    }
    if (r->state != IDEM_STATE_DEDUPLICATED) W.dec[m->decision].told = 0;
  } else
    m->ghost = 1;
  idem_record_free(r);
  return 0;
}

static int begin_and_die_main(char **argv) {
  idem_policy *p = NULL;
  idem_guard *g = NULL;
  idem_step *s = NULL;
  idem_call c = {sizeof c, argv[5], argv[2], "refund_payment", argv[4],
                 strlen(argv[4]), argv[3], 0};
  if (idem_policy_parse(POLICY_TEXT, strlen(POLICY_TEXT), "walk", &p) ||
      idem_guard_open(argv[1], p, &g) || idem_guard_begin(g, &c, &s))
    _exit(2);
  _exit(idem_step_next(s) == IDEM_NEXT_EXECUTE ? 0 : 3);
}

/* Issue call c (fresh: its first issue). */
static int issue(int c, int fresh, int pv, int crash) {
  callm *m = &W.calls[c];
  char turn[16];
  idem_call call = {sizeof call, W.session, m->id, "refund_payment", ARGSET[m->args],
                    strlen(ARGSET[m->args]), turn, 0};
  idem_step *s = NULL;
  int held = 0, rc;
  snprintf(turn, sizeof turn, "t%d", m->turn);
  if (crash == CR_BEFORE_COMMIT) return crash_before_commit(c, pv);
  if (idem_guard_begin(W.g, &call, &s) != IDEM_OK)
    return fail("begin %s: %s", m->id, idem_guard_errmsg(W.g));
  rc = drive(s, pv, crash, &held);
  if (!rc && held) {
    m->held = s;
    m->held_pv = pv;
    return 0;
  }
  if (!rc) rc = check_answer(s, c, fresh, pv, crash);
  idem_step_free(s);
  return rc;
}

static int play(const op *o, int i) {
  callm *t = &W.calls[o->target];
  switch (o->kind) {
  case OP_NEW: {
    callm *m = &W.calls[i];
    int fresh;
    m->exists = 1;
    snprintf(m->id, sizeof m->id, "c%d", i);
    m->args = o->args;
    m->turn = W.turn - o->late > 0 ? W.turn - o->late : 1;
    m->decision = model_decide(i, &fresh);
    /* a fresh decision runs unless an earlier one is still in flight */
    if (fresh) {
      int k;
      for (k = 0; k < i; k++)
        if (W.calls[k].held && ORDER[W.calls[k].args] == ORDER[m->args])
          fresh = 0;
    }
    return issue(i, fresh, o->pv, o->crash);
  }
  case OP_REPLAY:
    if (!t->exists || t->held) return 0;
    if (t->ghost) { /* never made: made now, in its turn */
      int fresh;
      t->ghost = 0;
      t->decision = model_decide(o->target, &fresh);
      return issue(o->target, 0, o->pv, o->crash);
    }
    if (t->failed) {
      /* told it failed ("safe to call again"): its replay is a new
      ** decision - or, as the turn's identical calls are one, that of a
      ** call of its turn */
      int fresh, turn = model_decide(o->target, &fresh);
      sleep_ms(2);
      W.dec[W.ndec].order = ORDER[t->args];
      W.dec[W.ndec].told = 0;
      t->decision = W.ndec++;
      t->late_of = turn;
    }
    return issue(o->target, 0, o->pv, o->crash);
  case OP_TURN: /* the model was told, and decides again: later, so that
                 ** no delivery shares a millisecond with its calls */
    sleep_ms(2);
    W.turn++;
    return 0;
  case OP_FINISH: {
    int held = 0, rc;
    idem_step *s = t->held;
    if (!t->exists || !s) return 0;
    t->held = NULL;
    if (idem_step_finish(s, provide(s, t->held_pv), "{}", 2, NULL) != IDEM_OK)
      rc = fail("finish %s: %s", t->id, idem_guard_errmsg(W.g));
    else if (!(rc = drive(s, t->held_pv, CR_NONE, &held)))
      rc = check_answer(s, o->target, 0, t->held_pv, CR_NONE);
    idem_step_free(s);
    return rc;
  }
  default: { /* OP_RECOVER: idem recover, told to no one */
    idem_step *s = NULL;
    int held = 0, rc;
    if (!t->exists || t->held) return 0;
    rc = idem_guard_recover(W.g, W.session, t->id, &s);
    if (rc == IDEM_NOTFOUND) return 0;
    if (rc != IDEM_OK)
      return fail("recover %s: %s", t->id, idem_guard_errmsg(W.g));
    rc = drive(s, PV_UNKNOWN_NOT, CR_NONE, &held);
    idem_step_free(s);
    return rc;
  }
  }
}

/* Play walk w (keep[i] says which steps are in it) on a fresh log: the
** index of the step after which a check failed, or -1. */
static int run(const op *w, const char *keep, int n) {
  int i, bad = -1;
  world_open();
  for (i = 0; i < n && bad < 0; i++) {
    if (!keep[i]) continue;
    if (play(&w[i], i) || check_ledger()) bad = i;
  }
  world_close();
  return bad;
}

static void print_walk(const op *w, const char *keep, int n) {
  int i;
  for (i = 0; i < n; i++) {
    const op *o = &w[i];
    if (!keep[i]) continue;
    switch (o->kind) {
    case OP_NEW:
      fprintf(stderr, "  %d: new c%d args %d%s%.0d, provider %s%s\n", i, i,
              o->args, o->late ? " late by " : "", o->late, PV_NAME[o->pv],
              CR_NAME[o->crash]);
      break;
    case OP_REPLAY:
      fprintf(stderr, "  %d: replay c%d, provider %s%s\n", i, o->target,
              PV_NAME[o->pv], CR_NAME[o->crash]);
      break;
    case OP_TURN: fprintf(stderr, "  %d: next turn\n", i); break;
    default:
      fprintf(stderr, "  %d: %s c%d\n", i, OP_NAME[o->kind], o->target);
    }
  }
}

/* Drop steps while the walk still fails: chunks, then single steps. */
static void shrink(const op *w, char *keep, int n) {
  int chunk, i, j, changed = 1;
  for (chunk = n / 2; chunk >= 1; chunk /= 2) {
    for (i = 0; i < n; i += chunk) {
      char save[MAXC];
      int any = 0;
      memcpy(save, keep, (size_t)n);
      for (j = i; j < i + chunk && j < n; j++) {
        any |= keep[j];
        keep[j] = 0;
      }
      if (!any || run(w, keep, n) < 0) memcpy(keep, save, (size_t)n);
    }
  }
  while (changed) {
    changed = 0;
    for (i = n - 1; i >= 0; i--) {
      if (!keep[i]) continue;
      keep[i] = 0;
      if (run(w, keep, n) >= 0)
        changed = 1;
      else
        keep[i] = 1;
    }
  }
}

static int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

int main(int argc, char **argv) {
  static op walk[MAXC];
  static char keep[MAXC];
  int seeds, steps, first, seed, failed = 0;
  long total = 0;
  if (argc == 7 && strcmp(argv[1], "--begin-and-die") == 0)
    return begin_and_die_main(argv + 1);
  if (argc < 2 || argc > 4) {
    fprintf(stderr, "usage: rules_walk DIR|POSTGRES-URL [SEEDS [STEPS]]\n");
    return 2;
  }
  W.dir = argv[1];
  W.pg = strncmp(W.dir, "postgres", 8) == 0;
  seeds = env_int("IDEM_WALK_SEEDS", argc > 2 ? atoi(argv[2]) : 20);
  steps = env_int("IDEM_WALK_STEPS", argc > 3 ? atoi(argv[3]) : 100);
  if (steps < 1 || steps > MAXC) steps = MAXC;
  if (idem_policy_parse(POLICY_TEXT, strlen(POLICY_TEXT), "walk", &W.pol)) {
    fprintf(stderr, "policy: %s\n", idem_policy_errmsg(W.pol));
    return 2;
  }
  first = env_int("IDEM_WALK_FIRST", 1);
  if (first < 1) first = 1;
  for (seed = first; seed < first + seeds; seed++) {
    int bad;
    rng = 0x9e3779b97f4a7c15ULL * (unsigned long long)seed;
    make_walk(walk, steps);
    memset(keep, 1, (size_t)steps);
    bad = run(walk, keep, steps);
    if (bad < 0) {
      total += steps;
      continue;
    }
    total += bad + 1;
    fprintf(stderr, "seed %d: step %d: %s\n", seed, bad, W.why);
    if (++failed > 3) continue; /* shrink the first few */
    shrink(walk, keep, bad + 1);
    W.trace = getenv("IDEM_WALK_TRACE") != NULL;
    bad = run(walk, keep, bad + 1);
    W.trace = 0;
    fprintf(stderr, "seed %d, shrunk to:\n", seed);
    print_walk(walk, keep, bad + 1);
    fprintf(stderr, "  fails with: %s\n", W.why);
  }
  idem_policy_free(W.pol);
  printf("%d seeds, %ld steps checked, %d failing\n", seed - first, total,
         failed);
  return failed ? 1 : 0;
}
