/*
** test_console.c - what an operator's console reads of the library.
**
**   test_console LOG_URL    (a fresh store: sqlite:PATH or postgres://...)
**
** Through the public API alone: the status checks of an action in doubt as
** its record keeps them (check_with as the model was told it, last_check,
** checked_at, checks - by a step, by idem_guard_settle); listings by call
** id, key and tool, in pages that go on after the last record given, the
** recoverable ones too, and a filter of the size an older caller knows;
** the tally against a listing of everything; this process's counters,
** each scenario's deltas exactly; and idem_owner_alive.
*/
#define _GNU_SOURCE
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <poll.h>
#include <unistd.h>

#include "check.h"
#include "idem.h"

static const char *log_url;

static const char POLICY[] =
    "{\"tools\":{\"refund_payment\":{\"class\":\"guarded\",\"timeout_ms\":300,"
    "\"retries\":1,\"backoff_ms\":1,\"wait_ms\":300,"
    "\"status\":{\"tool\":\"get_refund_status\","
    "\"arguments\":{\"order_id\":\"{order_id}\"}}},"
    "\"get_refund_status\":{\"class\":\"read_only\"}}}";

/* What the model is told to check with for order ord_N. */
static const char *check_with(char *buf, size_t n, int order) {
  snprintf(buf, n,
           "{\"tool\":\"get_refund_status\",\"arguments\":{\"order_id\":"
           "\"ord_%d\"}}",
           order);
  return buf;
}

static const char *args_of(char *buf, size_t n, int order) {
  snprintf(buf, n, "{\"order_id\":\"ord_%d\",\"amount_cents\":6000}", order);
  return buf;
}

/* Begin call_id (order ord_N, in turn) with the two-phase API. */
static idem_step *begin(idem_guard *g, const char *session,
                        const char *call_id, int order, const char *turn) {
  char args[128];
  idem_call c = {sizeof c, session, call_id, "refund_payment", NULL, 0, turn,
                 0};
  idem_step *s = NULL;
  c.args = args_of(args, sizeof args, order);
  c.args_len = strlen(c.args);
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  return s;
}

/* A call whose attempt timed out: in doubt, its step at CHECK. */
static idem_step *timed_out(idem_guard *g, const char *session,
                            const char *call_id, int order, const char *turn) {
  idem_step *s = begin(g, session, call_id, order, turn);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_UNKNOWN, NULL, 0, "timeout"),
            IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  return s;
}

/* A call that ran and succeeded (told when told != 0). */
static void succeeded(idem_guard *g, const char *session, const char *call_id,
                      int order, const char *turn, int told) {
  idem_step *s = begin(g, session, call_id, order, turn);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED, "{\"ok\":1}", 8, NULL),
            IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_SUCCEEDED);
  if (told) CHECK_INT(idem_step_delivered(s), IDEM_OK);
  idem_step_free(s);
}

static idem_record *record(idem_guard *g, const char *session,
                           const char *call_id) {
  idem_record *r = NULL;
  CHECK_INT(idem_guard_record(g, session, call_id, &r), IDEM_OK);
  return r;
}

/* ---- the checks of an action in doubt ------------------------------------ */

static void test_checks(idem_guard *g) {
  char with[160];
  const char *env;
  size_t len;
  long long first;
  idem_record *r;
  idem_step *s = timed_out(g, "ck", "c1", 1, "t1");
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_UNKNOWN, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_OUTCOME_UNKNOWN);
  env = idem_step_envelope(s, &len);
  check_with(with, sizeof with, 1);
  /* the record keeps what the envelope told, byte for byte */
  CHECK(env && strstr(env, "\"check_with\":") &&
        strncmp(strstr(env, "\"check_with\":") + 13, with, strlen(with)) ==
            0);
  idem_step_free(s);
  if ((r = record(g, "ck", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
    CHECK_STR(r->check_with, with);
    CHECK_STR(r->last_check, "unknown");
    CHECK_INT(r->checks, 1);
    /* the store's clock, when the check was recorded */
    CHECK(r->checked_at >= r->created && r->checked_at <= r->updated + 1000);
  }
  first = r ? r->checked_at : 0;
  idem_record_free(r);
  /* the call again: its action is checked, and found applied */
  s = begin(g, "ck", "c1", 1, "t1");
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_APPLIED, "{\"id\":7}", 8),
            IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_SUCCEEDED);
  idem_step_free(s);
  if ((r = record(g, "ck", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_SUCCEEDED);
    CHECK_STR(r->check_with, with); /* what the model was told stays */
    CHECK_STR(r->last_check, "applied");
    CHECK_INT(r->checks, 2);
    CHECK(r->checked_at >= first);
  }
  idem_record_free(r);
  /* a check that found nothing of an action that may still land: it
  ** stays in doubt, the check recorded */
  s = timed_out(g, "ck", "c2", 2, "t2");
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_NOT_APPLIED, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_OUTCOME_UNKNOWN);
  idem_step_free(s);
  if ((r = record(g, "ck", "c2")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
    CHECK_STR(r->last_check, "not_applied");
    CHECK_STR(r->check_with, check_with(with, sizeof with, 2));
    CHECK_INT(r->checks, 1);
  }
  idem_record_free(r);
  /* idem recover --batch's way: the checks it ran, settled at once */
  {
    long long token;
    s = timed_out(g, "ck", "c3", 3, "t3");
    token = idem_step_token(s);
    idem_step_free(s); /* no answer: nothing told, no check_with */
    CHECK_INT(idem_guard_settle(g, "ck", "c3", token, IDEM_OUTCOME_UNKNOWN,
                                NULL, 0),
              IDEM_OK);
    if ((r = record(g, "ck", "c3")) != NULL) {
      CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
      CHECK_STR(r->last_check, "unknown");
      CHECK_INT(r->checks, 1);
      CHECK(r->check_with == NULL);
    }
    idem_record_free(r);
    CHECK_INT(idem_guard_settle(g, "ck", "c3", token, IDEM_OUTCOME_APPLIED,
                                "{}", 2),
              IDEM_OK);
    if ((r = record(g, "ck", "c3")) != NULL) {
      CHECK_INT(r->state, IDEM_STATE_SUCCEEDED);
      CHECK_STR(r->last_check, "applied");
      CHECK_INT(r->checks, 2);
    }
    idem_record_free(r);
  }
  /* an operator's verdict is no check */
  s = timed_out(g, "ck", "c4", 4, "t4");
  idem_step_free(s);
  CHECK_INT(idem_guard_resolve(g, "ck", "c4", IDEM_OUTCOME_APPLIED, NULL, 0,
                               NULL, "ops"),
            IDEM_OK);
  if ((r = record(g, "ck", "c4")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_SUCCEEDED);
    CHECK_INT(r->checks, 0);
    CHECK(r->last_check == NULL);
  }
  idem_record_free(r);
}

/* ---- listings ------------------------------------------------------------ */

typedef struct listed {
  char session[16][16], call[16][16];
  long long created[16];
  int n;
} listed;

static int listed_fn(void *ctx, const idem_record *r) {
  listed *l = ctx;
  if (l->n < 16) {
    snprintf(l->session[l->n], sizeof l->session[0], "%s", r->session);
    snprintf(l->call[l->n], sizeof l->call[0], "%s", r->call_id);
    l->created[l->n] = r->created;
  }
  l->n++;
  return 0;
}

/* A listing of f into *l (NULL: one of its own): how many records. */
static int count(idem_guard *g, const idem_filter *f, listed *l) {
  listed own;
  if (!l) l = &own;
  memset(l, 0, sizeof *l);
  CHECK_INT(idem_guard_list(g, f, listed_fn, l), IDEM_OK);
  return l->n;
}

/* A filter of this header's size: of session (NULL: any). */
static void filter_init(idem_filter *f, const char *session) {
  memset(f, 0, sizeof *f);
  f->size = sizeof *f;
  f->session = session;
}

/* Page through f (limit set) into all: how many pages it took. */
static int page_all(idem_guard *g, idem_filter *f, listed *all) {
  int pages = 0, before;
  memset(all, 0, sizeof *all);
  do {
    before = all->n;
    CHECK_INT(idem_guard_list(g, f, listed_fn, all), IDEM_OK);
    CHECK(all->n - before <= (int)f->limit);
    if (all->n > before && all->n <= 16) {
      f->after_created = all->created[all->n - 1];
      f->after_session = all->session[all->n - 1];
      f->after_call_id = all->call[all->n - 1];
    }
  } while (all->n > before && ++pages < 10);
  return pages;
}

/* Nothing to check with (a front end that cannot call the status tool):
** the step goes on as after unknown, and no check is counted - by the step
** API and by the completion queue (outcome 0). */
static void test_no_check(idem_guard *g) {
  idem_metrics before, after;
  idem_queue *q = NULL;
  idem_completion c;
  idem_record *r;
  idem_step *s;
  size_t got = 0;
  struct pollfd pfd;
  memset(&before, 0, sizeof before);
  before.size = sizeof before;
  after = before;
  CHECK_INT(idem_metrics_read(&before), IDEM_OK);
  s = timed_out(g, "nc", "n1", 41, "t1");
  CHECK_INT(idem_step_no_check(s), IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_OUTCOME_UNKNOWN);
  idem_step_free(s);
  s = timed_out(g, "nc", "n2", 42, "t2");
  CHECK_INT(idem_queue_open(g, &q), IDEM_OK);
  CHECK_INT(idem_queue_resolve(q, s, 0, NULL, 0, 0, NULL), IDEM_OK);
  pfd.fd = idem_queue_fd(q);
  pfd.events = POLLIN;
  CHECK_INT(poll(&pfd, 1, 10000), 1);
  memset(&c, 0, sizeof c);
  c.size = sizeof c;
  CHECK_INT(idem_queue_pop(q, &c, 1, &got), IDEM_OK);
  CHECK_INT((int)got, 1);
  CHECK_INT(c.rc, IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_OUTCOME_UNKNOWN);
  idem_queue_close(q);
  idem_step_free(s);
  CHECK_INT(idem_metrics_read(&after), IDEM_OK);
  for (int i = 0; i < 5; i++)
    CHECK_INT((int)(after.checks[i] - before.checks[i]), 0);
  for (int i = 1; i <= 2; i++) {
    char call[8];
    snprintf(call, sizeof call, "n%d", i);
    if ((r = record(g, "nc", call)) != NULL) {
      CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
      CHECK(r->last_check == NULL);
      CHECK_INT((int)r->checks, 0);
      CHECK(r->check_with != NULL); /* still told what to check with */
    }
    idem_record_free(r);
  }
}

static void test_listings(idem_guard *g) {
  idem_filter f;
  listed all, paged;
  int i;
  char call[16];
  /* 7 actions of session ls: 4 left in doubt (p0, p2, p4, p6) */
  for (i = 0; i < 7; i++) {
    snprintf(call, sizeof call, "p%d", i);
    if (i % 2 == 0)
      idem_step_free(timed_out(g, "ls", call, 100 + i, call));
    else
      succeeded(g, "ls", call, 100 + i, call, 1);
  }
  filter_init(&f, "ls");
  CHECK_INT(count(g, &f, &all), 7);
  f.limit = 3;
  CHECK_INT(page_all(g, &f, &paged), 3); /* 3, 3, 1 */
  CHECK_INT(paged.n, 7);
  for (i = 0; i < 7 && i < paged.n; i++) CHECK_STR(paged.call[i], all.call[i]);
  /* the recoverable ones, two a page: the limit counts them */
  filter_init(&f, "ls");
  f.recoverable = 1;
  f.limit = 2;
  CHECK_INT(page_all(g, &f, &paged), 2);
  CHECK_INT(paged.n, 4);
  for (i = 0; i < 4 && i < paged.n; i++) {
    snprintf(call, sizeof call, "p%d", 2 * i);
    CHECK_STR(paged.call[i], call);
  }
  /* exact matches */
  filter_init(&f, NULL);
  f.call_id = "p3";
  CHECK_INT(count(g, &f, NULL), 1);
  f.call_id = NULL;
  f.key = "ls:p4:"; /* a key is matched whole, never by its prefix */
  CHECK_INT(count(g, &f, NULL), 0);
  {
    idem_record *r = record(g, "ls", "p4");
    f.key = r ? r->key : "?";
    CHECK_INT(count(g, &f, &all), 1);
    CHECK_STR(all.call[0], "p4");
    f.states = 1u << IDEM_STATE_SUCCEEDED; /* p4 is in doubt */
    CHECK_INT(count(g, &f, NULL), 0);
    idem_record_free(r);
  }
  filter_init(&f, "ls");
  f.tool = "refund_payment";
  f.states = 1u << IDEM_STATE_SUCCEEDED;
  CHECK_INT(count(g, &f, NULL), 3);
  f.tool = "get_refund_status";
  CHECK_INT(count(g, &f, NULL), 0);
  /* a caller built against 0.4.0's header: its filter ends before call_id,
  ** and what follows it in ours is never read */
  {
    struct {
      idem_filter f;
      char past[64];
    } old;
    memset(&old, 0xff, sizeof old); /* garbage past the old size */
    old.f.size = offsetof(idem_filter, call_id);
    old.f.session = "ls";
    old.f.states = 0;
    old.f.limit = 0;
    old.f.recoverable = 1;
    CHECK_INT(count(g, &old.f, NULL), 4);
    old.f.size = offsetof(idem_filter, recoverable);
    CHECK_INT(idem_guard_list(g, &old.f, listed_fn, &all), IDEM_MISUSE);
  }
}

/* ---- the tally ----------------------------------------------------------- */

typedef struct group {
  char tool[32];
  int state, resolution;
  long long records, attempts, checks, oldest;
} group;

typedef struct groups {
  group v[64];
  int n, bad;
} groups;

static group *group_of(groups *x, const char *tool, int state, int res) {
  int i;
  for (i = 0; i < x->n; i++)
    if (!strcmp(x->v[i].tool, tool) && x->v[i].state == state &&
        x->v[i].resolution == res)
      return &x->v[i];
  if (x->n == 64) {
    x->bad = 1;
    return &x->v[0];
  }
  memset(&x->v[x->n], 0, sizeof x->v[0]);
  snprintf(x->v[x->n].tool, sizeof x->v[0].tool, "%s", tool);
  x->v[x->n].state = state;
  x->v[x->n].resolution = res;
  return &x->v[x->n++];
}

static int count_fn(void *ctx, const idem_record *r) {
  group *e = group_of(ctx, r->tool, r->state, r->resolution);
  if (!e->records || r->created < e->oldest) e->oldest = r->created;
  e->records++;
  e->attempts += r->attempts;
  e->checks += r->checks;
  return 0;
}

static int tally_fn(void *ctx, const idem_tally *t) {
  groups *x = ctx;
  group *e;
  if (t->size != sizeof *t) x->bad = 1;
  if (x->n) {
    group *p = &x->v[x->n - 1];
    int c = strcmp(p->tool, t->tool);
    if (c > 0 || (c == 0 && (p->state > t->state ||
                             (p->state == t->state &&
                              p->resolution >= t->resolution))))
      x->bad = 1; /* out of order, or a group twice */
  }
  e = group_of(x, t->tool, t->state, t->resolution);
  e->records = t->records;
  e->attempts = t->attempts;
  e->checks = t->checks;
  e->oldest = t->oldest;
  return 0;
}

static int stop_fn(void *ctx, const idem_tally *t) {
  (void)t;
  ++*(int *)ctx;
  return 1;
}

static void test_tally(idem_guard *g) {
  groups want, got;
  int i, j, seen = 0;
  memset(&want, 0, sizeof want);
  memset(&got, 0, sizeof got);
  CHECK_INT(idem_guard_list(g, NULL, count_fn, &want), IDEM_OK);
  CHECK_INT(idem_guard_tally(g, tally_fn, &got), IDEM_OK);
  CHECK_INT(want.bad + got.bad, 0);
  CHECK_INT(got.n, want.n);
  CHECK(want.n >= 3); /* in doubt, succeeded executed, and reconciled */
  for (i = 0; i < want.n; i++) {
    for (j = 0; j < got.n; j++)
      if (!strcmp(got.v[j].tool, want.v[i].tool) &&
          got.v[j].state == want.v[i].state &&
          got.v[j].resolution == want.v[i].resolution)
        break;
    CHECK(j < got.n);
    if (j == got.n) continue;
    CHECK_INT(got.v[j].records, want.v[i].records);
    CHECK_INT(got.v[j].attempts, want.v[i].attempts);
    CHECK_INT(got.v[j].checks, want.v[i].checks);
    CHECK_INT(got.v[j].oldest, want.v[i].oldest);
  }
  CHECK_INT(idem_guard_tally(g, stop_fn, &seen), IDEM_OK);
  CHECK_INT(seen, 1);
  CHECK_INT(idem_guard_tally(NULL, stop_fn, &seen), IDEM_MISUSE);
  CHECK_INT(idem_guard_tally(g, NULL, &seen), IDEM_MISUSE);
}

/* ---- this process's counters --------------------------------------------- */

static idem_metrics now_metrics(void) {
  idem_metrics m;
  memset(&m, 0, sizeof m);
  m.size = sizeof m;
  CHECK_INT(idem_metrics_read(&m), IDEM_OK);
  return m;
}

/* What a scenario should have moved (everything else: nothing). */
typedef struct moved {
  long long answers[9], replays, fenced, coalesced, attempts, late;
  long long checks[5], resolved;
} moved;

static void expect_moved(const idem_metrics *a, const idem_metrics *b,
                         const moved *w, int line) {
  long long answers = 0;
  int i, bad = 0;
  for (i = 0; i < 9; i++) {
    bad |= b->answers[i] - a->answers[i] != w->answers[i];
    answers += b->answers[i] - a->answers[i];
  }
  for (i = 0; i < 5; i++) bad |= b->checks[i] - a->checks[i] != w->checks[i];
  bad |= b->replays - a->replays != w->replays;
  bad |= b->fenced - a->fenced != w->fenced;
  bad |= b->coalesced - a->coalesced != w->coalesced;
  bad |= b->attempts - a->attempts != w->attempts;
  bad |= b->late - a->late != w->late;
  bad |= b->resolved - a->resolved != w->resolved;
  /* every answer once in the histogram */
  bad |= b->latency_count - a->latency_count != answers;
  bad |= b->latency_le[IDEM_LATENCY_BUCKETS - 1] > b->latency_count;
  for (i = 1; i < IDEM_LATENCY_BUCKETS; i++)
    bad |= b->latency_le[i] < b->latency_le[i - 1];
  bad |= b->latency_sum_us < a->latency_sum_us;
  if (bad) {
    fprintf(stderr,
            "test_console.c:%d: counters moved otherwise: answers", line);
    for (i = 0; i < 9; i++)
      fprintf(stderr, " %lld/%lld", b->answers[i] - a->answers[i],
              w->answers[i]);
    fprintf(stderr, "; checks");
    for (i = 0; i < 5; i++)
      fprintf(stderr, " %lld/%lld", b->checks[i] - a->checks[i],
              w->checks[i]);
    fprintf(stderr,
            "; replays %lld/%lld fenced %lld/%lld coalesced %lld/%lld "
            "attempts %lld/%lld late %lld/%lld resolved %lld/%lld "
            "latency count %lld/%lld\n",
            b->replays - a->replays, w->replays, b->fenced - a->fenced,
            w->fenced, b->coalesced - a->coalesced, w->coalesced,
            b->attempts - a->attempts, w->attempts, b->late - a->late, w->late,
            b->resolved - a->resolved, w->resolved,
            b->latency_count - a->latency_count, answers);
    check_failed++;
  } else
    check_passed++;
}
#define EXPECT_MOVED(a, b, w) expect_moved(&(a), &(b), &(w), __LINE__)

static int ok_run(void *ctx, const char *key, const char *args, size_t len,
                  char **result, char **error) {
  (void)ctx, (void)key, (void)args, (void)len, (void)error;
  *result = idem_malloc(12);
  if (*result) memcpy(*result, "{\"ok\":true}", 12);
  return IDEM_OUTCOME_APPLIED;
}

static void guard_call(idem_guard *g, const char *call_id, const char *turn,
                       int want) {
  char args[128];
  idem_call c = {sizeof c, "mx", call_id, "refund_payment", NULL, 0, turn, 0};
  idem_tool t = {sizeof t, ok_run, NULL, NULL};
  char *env = NULL;
  c.args = args_of(args, sizeof args, 500);
  c.args_len = strlen(c.args);
  CHECK_INT(idem_guard_call(g, &c, &t, &env, NULL), IDEM_OK);
  CHECK(env != NULL);
  if (env) {
    char status[64];
    snprintf(status, sizeof status, "{\"status\":\"%s\"",
             want == IDEM_ANSWER_SUCCEEDED ? "succeeded" : "already_applied");
    CHECK(strncmp(env, status, strlen(status)) == 0);
  }
  idem_free(env);
}

/* The next completion of q, waited for up to 10 s: 1, or 0 when none. */
static int pop_one(idem_queue *q, idem_completion *c) {
  size_t got = 0;
  int i;
  for (i = 0; i < 10000 && !got; i++) {
    memset(c, 0, sizeof *c);
    c->size = sizeof *c;
    CHECK_INT(idem_queue_pop(q, c, 1, &got), IDEM_OK);
    if (!got) usleep(1000);
  }
  return got == 1;
}

static void test_metrics(idem_guard *g) {
  idem_metrics a, b;
  moved w;
  idem_step *s;
  long long token;
  /* a first call: one attempt, one answer */
  a = now_metrics();
  guard_call(g, "m1", "mt1", IDEM_ANSWER_SUCCEEDED);
  b = now_metrics();
  memset(&w, 0, sizeof w);
  w.answers[IDEM_ANSWER_SUCCEEDED] = 1;
  w.attempts = 1;
  EXPECT_MOVED(a, b, w);
  /* its replay */
  a = b;
  guard_call(g, "m1", "mt1", IDEM_ANSWER_SUCCEEDED);
  b = now_metrics();
  memset(&w, 0, sizeof w);
  w.answers[IDEM_ANSWER_SUCCEEDED] = w.replays = 1;
  EXPECT_MOVED(a, b, w);
  /* the same call again in the same turn, by another call id: coalesced */
  a = b;
  guard_call(g, "m2", "mt1", IDEM_ANSWER_ALREADY_APPLIED);
  b = now_metrics();
  memset(&w, 0, sizeof w);
  w.answers[IDEM_ANSWER_ALREADY_APPLIED] = w.fenced = w.coalesced = 1;
  EXPECT_MOVED(a, b, w);
  /* a repeat in a later turn of an outcome not yet told: fenced alone */
  a = b;
  succeeded(g, "mx", "m3", 501, "mt2", 0);
  s = begin(g, "mx", "m4", 501, "mt3");
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_ALREADY_APPLIED);
  idem_step_free(s);
  b = now_metrics();
  memset(&w, 0, sizeof w);
  w.answers[IDEM_ANSWER_SUCCEEDED] = w.answers[IDEM_ANSWER_ALREADY_APPLIED] =
      1;
  w.attempts = w.fenced = 1;
  EXPECT_MOVED(a, b, w);
  /* in doubt, a check that cannot tell, then the late result */
  a = b;
  s = timed_out(g, "mx", "m5", 502, "mt4");
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_UNKNOWN, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED, "{}", 2, NULL),
            IDEM_OK);
  idem_step_free(s);
  b = now_metrics();
  memset(&w, 0, sizeof w);
  w.answers[IDEM_ANSWER_OUTCOME_UNKNOWN] = w.attempts = w.late = 1;
  w.checks[IDEM_OUTCOME_UNKNOWN] = 1;
  EXPECT_MOVED(a, b, w);
  /* in doubt, no answer; recovered by a check that finds it applied (a
  ** resumed action's outcome is a replay), another settled by batch */
  a = b;
  s = timed_out(g, "mx", "m6", 503, "mt5");
  idem_step_free(s);
  s = NULL;
  CHECK_INT(idem_guard_recover(g, "mx", "m6", &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_APPLIED, "{}", 2), IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_SUCCEEDED);
  idem_step_free(s);
  s = timed_out(g, "mx", "m7", 504, "mt6");
  token = idem_step_token(s);
  idem_step_free(s);
  CHECK_INT(idem_guard_settle(g, "mx", "m7", token, IDEM_OUTCOME_REJECTED,
                              NULL, 0),
            IDEM_STALE); /* it may still land: nothing settled */
  b = now_metrics();
  memset(&w, 0, sizeof w);
  w.answers[IDEM_ANSWER_SUCCEEDED] = w.replays = 1;
  w.attempts = 2;
  w.checks[IDEM_OUTCOME_APPLIED] = w.checks[IDEM_OUTCOME_REJECTED] = 1;
  EXPECT_MOVED(a, b, w);
  /* an operator's verdict */
  a = b;
  CHECK_INT(idem_guard_resolve(g, "mx", "m7", IDEM_OUTCOME_NOT_APPLIED, NULL,
                               0, "the provider has no such refund", "ops"),
            IDEM_OK);
  b = now_metrics();
  memset(&w, 0, sizeof w);
  w.resolved = 1;
  EXPECT_MOVED(a, b, w);
  {
    idem_record *r = record(g, "mx", "m7");
    if (r) {
      CHECK_STR(r->last_check, "rejected"); /* as the check said it */
      CHECK_INT(r->checks, 1);
      CHECK_INT(r->state, IDEM_STATE_NOT_APPLIED);
    }
    idem_record_free(r);
  }
  /* the completion queue walks the same steps: counted the same */
  {
    idem_queue *q = NULL;
    idem_completion c;
    char args[128];
    idem_call call = {sizeof call, "mx", "m8", "refund_payment", NULL, 0,
                      "mt7", 0};
    call.args = args_of(args, sizeof args, 505);
    call.args_len = strlen(call.args);
    a = b;
    CHECK_INT(idem_queue_open(g, &q), IDEM_OK);
    CHECK_INT(idem_queue_begin(q, &call, 0, NULL), IDEM_OK);
    if (pop_one(q, &c) && c.rc == IDEM_OK && c.next == IDEM_NEXT_EXECUTE) {
      CHECK_INT(idem_queue_finish(q, c.step, IDEM_OUTCOME_APPLIED, "{}", 2,
                                  NULL, IDEM_QUEUE_DELIVER, NULL),
                IDEM_OK);
      CHECK(pop_one(q, &c) && c.answer == IDEM_ANSWER_SUCCEEDED);
      idem_step_free(c.step);
    } else
      check_failed++;
    /* its replay, inline */
    CHECK_INT(idem_queue_begin(q, &call, IDEM_QUEUE_INLINE, NULL), IDEM_OK);
    CHECK(pop_one(q, &c) && c.answer == IDEM_ANSWER_SUCCEEDED);
    idem_step_free(c.step);
    idem_queue_close(q);
    b = now_metrics();
    memset(&w, 0, sizeof w);
    w.answers[IDEM_ANSWER_SUCCEEDED] = 2;
    w.attempts = w.replays = 1;
    EXPECT_MOVED(a, b, w);
  }
  /* the buckets' bounds */
  CHECK_INT(idem_latency_bound_us(0), 100);
  CHECK_INT(idem_latency_bound_us(3), 1000);
  CHECK_INT(idem_latency_bound_us(IDEM_LATENCY_BUCKETS - 1), 10000000);
  CHECK_INT(idem_latency_bound_us(IDEM_LATENCY_BUCKETS), -1);
  CHECK_INT(idem_latency_bound_us(-1), -1);
  {
    /* a caller of a later header: what it has past ours is left alone */
    struct {
      idem_metrics m;
      long long later;
    } big;
    memset(&big, 0, sizeof big);
    big.m.size = sizeof big;
    big.later = -7;
    CHECK_INT(idem_metrics_read(&big.m), IDEM_OK);
    CHECK_INT(big.later, -7);
    CHECK_INT(big.m.size, sizeof big);
    CHECK_INT(big.m.replays, b.replays);
    big.m.size = sizeof big.m - 1; /* no earlier layout than this one */
    CHECK_INT(idem_metrics_read(&big.m), IDEM_MISUSE);
    CHECK_INT(idem_metrics_read(NULL), IDEM_MISUSE);
  }
}

/* ---- owners -------------------------------------------------------------- */

static void test_owner_alive(idem_guard *g) {
  const char *self = idem_guard_owner(g);
  char dead[256];
  const char *c1 = self ? strchr(self, ':') : NULL;
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  CHECK(pid > 0);
  waitpid(pid, NULL, 0);
  CHECK(c1 != NULL);
  if (!c1) return;
  snprintf(dead, sizeof dead, "%.*s:%ld:0", (int)(c1 - self), self,
           (long)pid);
  CHECK_INT(idem_owner_alive(self), 1);
  CHECK_INT(idem_owner_alive(dead), 0);
  CHECK_INT(idem_owner_alive("another-host-0123:1:1"), -1);
  CHECK_INT(idem_owner_alive("no colons"), -1);
  CHECK_INT(idem_owner_alive(NULL), -1);
}

int main(int argc, char **argv) {
  idem_policy *p = NULL;
  idem_guard *g = NULL;
  if (argc != 2) {
    fprintf(stderr, "usage: test_console LOG_URL\n");
    return 2;
  }
  log_url = argv[1];
  if (idem_policy_parse(POLICY, strlen(POLICY), "test", &p) != IDEM_OK ||
      idem_guard_open(log_url, p, &g) != IDEM_OK) {
    fprintf(stderr, "open %s: %s\n", log_url,
            g ? idem_guard_errmsg(g) : p ? idem_policy_errmsg(p) : "?");
    return 1;
  }
  test_checks(g);
  test_no_check(g);
  test_listings(g);
  test_metrics(g);
  test_tally(g);
  test_owner_alive(g);
  idem_guard_close(g);
  idem_policy_free(p);
  return check_done();
}
