/*
** test_queue.c - the completion queue (idem_queue_*), driven as an event
** loop drives it: one thread, poll(2) on the queue's pipe, the tool run
** "downstream" against a ledger that counts refunds applied per order.
**
**   loop       48 calls submitted at once (16 orders, three identical
**              calls of one turn each): every call answers, each order is
**              refunded exactly once, WAITs are polled on the loop's timer.
**   errors     failures of concurrent operations each carry their own
**              text (bad input, a finish without an EXECUTE, a poll
**              without a WAIT); a conflict is an answer; a second
**              submission on a busy step is refused at once, with words.
**   delivery   IDEM_QUEUE_DELIVER records the delivery in the outcome's
**              commit; without it nothing is told until delivered, and
**              undelivered undoes it.
**   late       a result past the deadline settles the action by token.
**   close      closed with finishes (and begins) in flight, never popped:
**              every outcome is in the log, nothing leaks (ASan build).
**
** Usage: test_queue DIR (a fresh directory for the logs).
*/
#define _POSIX_C_SOURCE 200809L
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "idem.h"

static const char *dir;
static int log_no;

static idem_guard *open_guard(void) {
  char url[4200];
  idem_guard *g = NULL;
  snprintf(url, sizeof url, "sqlite:%s/queue%d.db", dir, ++log_no);
  if (idem_guard_open(url, NULL, &g) != IDEM_OK) {
    fprintf(stderr, "open %s: %s\n", url, idem_guard_errmsg(g));
    exit(1);
  }
  return g;
}

static long long mono_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* The provider: refunds applied, by order, keyed by the idempotency key. */
#define ORDERS 16
static int refunds[ORDERS];
static int applied_total;

typedef struct ctx {
  char session[32], call_id[32], args[96];
  int order;
  idem_step *s;  /* between completions */
  long long due; /* a WAIT's poll, or 0 */
  int answer, done;
} ctx;

static idem_call call_of(ctx *c) {
  idem_call k;
  memset(&k, 0, sizeof k);
  k.size = sizeof k;
  k.session = c->session;
  k.call_id = c->call_id;
  k.tool = "refund";
  k.args = c->args;
  k.args_len = strlen(c->args);
  k.turn = "t1";
  return k;
}

/* Wait until q's fd is readable (or ms pass), then pop what is there. */
static size_t pop_some(idem_queue *q, idem_completion *c, size_t n, int ms) {
  struct pollfd p = {idem_queue_fd(q), POLLIN, 0};
  size_t got = 0;
  if (poll(&p, 1, ms) > 0) {
    c[0].size = sizeof *c;
    CHECK_INT(idem_queue_pop(q, c, n, &got), IDEM_OK);
  }
  return got;
}

/* One loop turn's handling of a completion of the refund calls. */
static void on_completion(idem_queue *q, const idem_completion *c) {
  ctx *x = c->user;
  if (c->rc != IDEM_OK) {
    fprintf(stderr, "%s/%s: rc %d: %s\n", x->session, x->call_id, c->rc,
            c->errmsg);
    CHECK_INT(c->rc, IDEM_OK);
    x->done = 1;
    idem_step_free(c->step);
    return;
  }
  x->s = c->step;
  CHECK_INT(c->next, idem_step_next(c->step));
  switch (c->next) {
  case IDEM_NEXT_EXECUTE:
    refunds[x->order]++;
    applied_total++;
    CHECK_INT(idem_queue_finish(q, x->s, IDEM_OUTCOME_APPLIED,
                                "{\"refund\":\"ok\"}", 15, NULL,
                                IDEM_QUEUE_DELIVER, x),
              IDEM_OK);
    break;
  case IDEM_NEXT_WAIT: x->due = mono_ms() + idem_step_delay_ms(x->s); break;
  case IDEM_NEXT_CHECK:
    CHECK_INT(idem_queue_resolve(q, x->s, IDEM_OUTCOME_UNKNOWN, NULL, 0,
                                 IDEM_QUEUE_DELIVER, x),
              IDEM_OK);
    break;
  default:
    CHECK_INT(c->answer, idem_step_answer(x->s));
    x->answer = c->answer;
    x->done = 1;
    idem_step_free(x->s);
    x->s = NULL;
  }
}

static void test_loop(void) {
  enum { N = 3 * ORDERS };
  static ctx calls[N];
  idem_completion c[16];
  idem_guard *g = open_guard();
  idem_queue *q = NULL;
  int i, done = 0, ok = 0;
  long long until = mono_ms() + 20000;
  CHECK_INT(idem_queue_open(g, &q), IDEM_OK);
  idem_guard_close(g); /* the queue holds it */
  for (i = 0; i < N; i++) {
    ctx *x = &calls[i];
    idem_call k;
    x->order = i / 3;
    snprintf(x->session, sizeof x->session, "s%d", x->order);
    snprintf(x->call_id, sizeof x->call_id, "c%d", i % 3);
    snprintf(x->args, sizeof x->args,
             "{\"order_id\":\"ord_%d\",\"amount_cents\":6000}", x->order);
    k = call_of(x);
    CHECK_INT(idem_queue_begin(q, &k, IDEM_QUEUE_DELIVER, x), IDEM_OK);
  }
  CHECK(idem_queue_pending(q) > 0);
  while (done < N && mono_ms() < until) {
    long long now = mono_ms(), next = now + 50;
    size_t n, j;
    for (i = 0; i < N; i++) {
      ctx *x = &calls[i];
      if (x->due && x->due <= now) {
        x->due = 0;
        CHECK_INT(idem_queue_poll(q, x->s, IDEM_QUEUE_DELIVER, x), IDEM_OK);
      } else if (x->due && x->due < next)
        next = x->due;
    }
    n = pop_some(q, c, 16, (int)(next - now));
    for (j = 0; j < n; j++) on_completion(q, &c[j]);
    for (done = i = 0; i < N; i++) done += calls[i].done;
  }
  CHECK_INT(done, N);
  for (i = 0; i < N; i++)
    ok += calls[i].answer == IDEM_ANSWER_SUCCEEDED ||
          calls[i].answer == IDEM_ANSWER_ALREADY_APPLIED;
  CHECK_INT(ok, N);
  CHECK_INT(applied_total, ORDERS); /* one refund an order, not three */
  for (i = 0; i < ORDERS; i++) CHECK_INT(refunds[i], 1);
  CHECK_INT(idem_queue_pending(q), 0);
  {
    /* level-triggered: nothing waits, so the fd is not readable */
    struct pollfd p = {idem_queue_fd(q), POLLIN, 0};
    CHECK_INT(poll(&p, 1, 0), 0);
  }
  idem_queue_close(q);
}

/* Pop until n completions have come (or 10 s); they land in c, their
** texts copied (a pop's are lent until the next pop). */
static void pop_n(idem_queue *q, idem_completion *c, size_t n) {
  static char texts[64][256];
  size_t have = 0, i;
  long long until = mono_ms() + 10000;
  while (have < n && mono_ms() < until) {
    size_t got = pop_some(q, c + have, n - have, 100);
    for (i = have; i < have + got && i < 64; i++) {
      snprintf(texts[i], sizeof texts[i], "%s", c[i].errmsg);
      c[i].errmsg = texts[i];
    }
    have += got;
  }
  CHECK_INT(have, n);
}

static const char ARGS[] = "{\"order_id\":\"ord_1\",\"amount_cents\":6000}";

static idem_call refund_call(const char *session, const char *call_id,
                             const char *args) {
  idem_call k;
  memset(&k, 0, sizeof k);
  k.size = sizeof k;
  k.session = session;
  k.call_id = call_id;
  k.tool = "refund";
  k.args = args;
  k.args_len = strlen(args);
  return k;
}

static idem_completion *by_user(idem_completion *c, size_t n, void *user) {
  size_t i;
  for (i = 0; i < n; i++)
    if (c[i].user == user) return &c[i];
  CHECK(0);
  return &c[0];
}

static void test_errors(void) {
  idem_guard *g = open_guard();
  idem_queue *q = NULL;
  idem_completion c[8], *e;
  idem_call k;
  idem_step *a, *b;
  int tag[8];
  CHECK_INT(idem_queue_open(g, &q), IDEM_OK);
  /* two steps that answer: one succeeded, one failed */
  k = refund_call("e", "a", ARGS);
  CHECK_INT(idem_queue_begin(q, &k, 0, &tag[0]), IDEM_OK);
  k = refund_call("e", "b", "{\"order_id\":\"ord_2\"}");
  CHECK_INT(idem_queue_begin(q, &k, 0, &tag[1]), IDEM_OK);
  pop_n(q, c, 2);
  a = by_user(c, 2, &tag[0])->step;
  b = by_user(c, 2, &tag[1])->step;
  CHECK_INT(idem_step_next(a), IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_step_next(b), IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_queue_finish(q, a, IDEM_OUTCOME_APPLIED, "{}", 2, NULL,
                              IDEM_QUEUE_DELIVER, &tag[0]),
            IDEM_OK);
  /* a second operation on a busy step: refused now, with words */
  CHECK_INT(idem_queue_poll(q, a, 0, &tag[7]), IDEM_MISUSE);
  CHECK(strstr(idem_guard_errmsg(g), "in flight") != NULL);
  CHECK_INT(idem_queue_finish(q, b, IDEM_OUTCOME_REJECTED, NULL, 0, "no",
                              IDEM_QUEUE_DELIVER, &tag[1]),
            IDEM_OK);
  pop_n(q, c, 2);
  CHECK_INT(by_user(c, 2, &tag[0])->answer, IDEM_ANSWER_SUCCEEDED);
  CHECK_INT(by_user(c, 2, &tag[1])->answer, IDEM_ANSWER_FAILED);
  CHECK_STR(by_user(c, 2, &tag[0])->errmsg, "");

  /* four failures and a conflict at once, each with its own words */
  k = refund_call("e", "c", ARGS);
  k.tool = NULL;
  CHECK_INT(idem_queue_begin(q, &k, 0, &tag[2]), IDEM_OK);
  k = refund_call("e\xff", "d", ARGS);
  CHECK_INT(idem_queue_begin(q, &k, 0, &tag[3]), IDEM_OK);
  CHECK_INT(idem_queue_finish(q, a, IDEM_OUTCOME_APPLIED, NULL, 0, NULL, 0,
                              &tag[4]),
            IDEM_OK);
  CHECK_INT(idem_queue_poll(q, b, 0, &tag[5]), IDEM_OK);
  k = refund_call("e", "a", "{\"order_id\":\"ord_9\"}");
  CHECK_INT(idem_queue_begin(q, &k, IDEM_QUEUE_DELIVER, &tag[6]), IDEM_OK);
  pop_n(q, c, 5);
  e = by_user(c, 5, &tag[2]);
  CHECK_INT(e->rc, IDEM_MISUSE);
  CHECK_STR(e->errmsg, "idem_call.tool is NULL: name the tool");
  CHECK(e->step == NULL);
  e = by_user(c, 5, &tag[3]);
  CHECK_INT(e->rc, IDEM_INVALID);
  CHECK(strstr(e->errmsg, "session id is not valid UTF-8") != NULL);
  idem_step_free(e->step);
  e = by_user(c, 5, &tag[4]);
  CHECK_INT(e->rc, IDEM_MISUSE);
  CHECK_STR(e->errmsg, "finish without an EXECUTE step");
  CHECK(e->step == a);
  e = by_user(c, 5, &tag[5]);
  CHECK_INT(e->rc, IDEM_MISUSE);
  CHECK_STR(e->errmsg, "poll without a WAIT");
  e = by_user(c, 5, &tag[6]);
  CHECK_INT(e->rc, IDEM_OK);
  CHECK_INT(e->answer, IDEM_ANSWER_CONFLICT);
  idem_step_free(e->step);
  /* the host thread's own message is not the workers' */
  CHECK(strstr(idem_guard_errmsg(g), "in flight") != NULL);
  /* misuse of the queue itself */
  CHECK_INT(idem_queue_begin(NULL, &k, 0, NULL), IDEM_MISUSE);
  c[0].size = 8;
  {
    size_t got = 9;
    CHECK_INT(idem_queue_pop(q, c, 1, &got), IDEM_MISUSE);
    CHECK_INT(got, 0);
  }
  CHECK_INT(idem_queue_fd(NULL), -1);
  idem_step_free(a);
  idem_step_free(b);
  idem_queue_close(q);
  idem_queue_close(NULL);
  idem_guard_close(g);
}

static long long delivered(idem_guard *g, const char *session,
                           const char *call_id) {
  idem_record *r = NULL;
  long long d = -1;
  CHECK_INT(idem_guard_record(g, session, call_id, &r), IDEM_OK);
  if (r) d = r->delivered;
  idem_record_free(r);
  return d;
}

/* Begin, then finish APPLIED with flags: the completion of the finish. */
static idem_step *run_once(idem_queue *q, const char *call_id, int flags) {
  idem_completion c[1];
  char args[96];
  idem_call k;
  idem_step *s;
  snprintf(args, sizeof args, "{\"order_id\":\"%s\"}", call_id);
  k = refund_call("d", call_id, args);
  CHECK_INT(idem_queue_begin(q, &k, 0, NULL), IDEM_OK);
  pop_n(q, c, 1);
  s = c[0].step;
  CHECK_INT(c[0].next, IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_queue_finish(q, s, IDEM_OUTCOME_APPLIED, "{}", 2, NULL, flags,
                              NULL),
            IDEM_OK);
  pop_n(q, c, 1);
  CHECK_INT(c[0].rc, IDEM_OK);
  CHECK_INT(c[0].answer, IDEM_ANSWER_SUCCEEDED);
  return s;
}

static void test_delivery(void) {
  idem_guard *g = open_guard();
  idem_queue *q = NULL;
  idem_completion c[1];
  idem_step *s;
  CHECK_INT(idem_queue_open(g, &q), IDEM_OK);
  /* told in the outcome's commit */
  s = run_once(q, "with", IDEM_QUEUE_DELIVER);
  CHECK(delivered(g, "d", "with") > 0);
  idem_step_free(s);
  /* a caller that gave up: not told, until it is; then undone */
  s = run_once(q, "without", 0);
  CHECK_INT(delivered(g, "d", "without"), 0);
  CHECK_INT(idem_queue_delivered(q, s, NULL), IDEM_OK);
  pop_n(q, c, 1);
  CHECK_INT(c[0].op, IDEM_OP_DELIVERED);
  CHECK_INT(c[0].rc, IDEM_OK);
  CHECK(delivered(g, "d", "without") > 0);
  CHECK_INT(idem_queue_undelivered(q, s, NULL), IDEM_OK);
  pop_n(q, c, 1);
  CHECK_INT(c[0].op, IDEM_OP_UNDELIVERED);
  CHECK_INT(delivered(g, "d", "without"), 0);
  idem_step_free(s);
  idem_queue_close(q);
  idem_guard_close(g);
}

/* Past the deadline: outcome_unknown, the step freed; the late result
** through the queue settles the action with the attempt's token. */
static void test_late(void) {
  idem_guard *g = open_guard();
  idem_queue *q = NULL;
  idem_completion c[1];
  idem_call k = refund_call("late", "l1", ARGS);
  idem_record *r = NULL;
  long long token;
  CHECK_INT(idem_queue_open(g, &q), IDEM_OK);
  CHECK_INT(idem_queue_begin(q, &k, IDEM_QUEUE_DELIVER, NULL), IDEM_OK);
  pop_n(q, c, 1);
  token = idem_step_token(c[0].step);
  CHECK(token > 0);
  CHECK_INT(idem_queue_finish(q, c[0].step, IDEM_OUTCOME_UNKNOWN, NULL, 0,
                              "no answer within 10 ms", IDEM_QUEUE_DELIVER,
                              NULL),
            IDEM_OK);
  pop_n(q, c, 1);
  CHECK_INT(c[0].answer, IDEM_ANSWER_OUTCOME_UNKNOWN);
  idem_step_free(c[0].step);
  CHECK_INT(idem_queue_late(q, "late", NULL, token, IDEM_OUTCOME_APPLIED,
                            NULL, 0, NULL, 1, NULL),
            IDEM_MISUSE);
  CHECK_INT(idem_queue_late(q, "late", "l1", token, IDEM_OUTCOME_APPLIED,
                            "{\"refund\":\"late\"}", 17, NULL, 1, &token),
            IDEM_OK);
  pop_n(q, c, 1);
  CHECK_INT(c[0].op, IDEM_OP_LATE);
  CHECK_INT(c[0].rc, IDEM_OK);
  CHECK(c[0].step == NULL && c[0].user == &token);
  CHECK_INT(idem_guard_record(g, "late", "l1", &r), IDEM_OK);
  CHECK_INT(r ? r->state : -1, IDEM_STATE_SUCCEEDED);
  idem_record_free(r);
  idem_queue_close(q);
  idem_guard_close(g);
}

static void test_close_in_flight(void) {
  enum { N = 32 };
  idem_guard *g = open_guard();
  idem_queue *q = NULL;
  idem_completion c[N];
  char id[N][16], args[N][64];
  int i, succeeded = 0;
  CHECK_INT(idem_queue_open(g, &q), IDEM_OK);
  for (i = 0; i < N; i++) {
    idem_call k;
    snprintf(id[i], sizeof id[i], "x%d", i);
    snprintf(args[i], sizeof args[i], "{\"order_id\":\"%d\"}", i);
    k = refund_call("close", id[i], args[i]);
    CHECK_INT(idem_queue_begin(q, &k, IDEM_QUEUE_DELIVER, NULL), IDEM_OK);
  }
  pop_n(q, c, N);
  for (i = 0; i < N; i++) {
    CHECK_INT(c[i].next, IDEM_NEXT_EXECUTE);
    CHECK_INT(idem_queue_finish(q, c[i].step, IDEM_OUTCOME_APPLIED, "{}", 2,
                                NULL, IDEM_QUEUE_DELIVER, NULL),
              IDEM_OK);
  }
  idem_queue_close(q); /* waits for them; frees their steps */
  for (i = 0; i < N; i++) {
    idem_record *r = NULL;
    CHECK_INT(idem_guard_record(g, "close", id[i], &r), IDEM_OK);
    succeeded += r && r->state == IDEM_STATE_SUCCEEDED && r->delivered > 0;
    idem_record_free(r);
  }
  CHECK_INT(succeeded, N);
  /* begins in flight, never popped: their steps go with the queue */
  CHECK_INT(idem_queue_open(g, &q), IDEM_OK);
  for (i = 0; i < N; i++) {
    idem_call k = refund_call("close2", id[i], args[i]);
    CHECK_INT(idem_queue_begin(q, &k, 0, NULL), IDEM_OK);
  }
  idem_guard_close(g);
  idem_queue_close(q);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_queue DIR\n");
    return 2;
  }
  dir = argv[1];
  test_loop();
  test_errors();
  test_delivery();
  test_late();
  test_close_in_flight();
  return check_done();
}
