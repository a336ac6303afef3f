/*
** queue.c - the completion queue: the step API for an event loop.
**
** An operation (struct qop) is made by a submission on the host's thread,
** runs once on one of the guard's worker threads (the threads of
** idem_guard_call, guard.c), and ends on the queue's list of completions,
** which the host pops.  Nothing here waits for the log on the host's
** thread: a submission only copies its arguments and hands the operation
** over; a pop only takes what is there.
**
**   submitted --(a worker runs it)--> done (on the list) --(pop)--> popped
**
** The list and its count live under q->mu.  inflight counts operations
** submitted and not yet done; close waits for it to reach 0, so that no
** operation outlives its queue and no outcome is left half-written.
**
** Readiness.  The pipe holds one byte exactly while the list is not empty
** (q->signalled): the operation that makes the list non-empty writes it,
** the pop that empties it reads it, both under q->mu.  So the read end is
** level-triggered and never fills, whatever the number of completions.
**
** Error text.  A guard keeps the last failure's words per thread
** (idem_guard_errmsg); a worker thread's are nobody's to read.  So an
** operation clears its thread's message first, and a failed one copies it
** into its completion (the status's own description when the failure left
** none).  The text lives with the popped operation until the next pop.
**
** A step belongs to the queue from its submission until its completion is
** popped (idem__step_claim): a second submission meanwhile is misuse.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "idemInt.h"

#define QUEUE_MAGIC 0x1de3c0e5u

typedef struct qop {
  idem__work work; /* first: what the worker runs */
  idem_queue *q;
  struct qop *next;
  int op, flags, rc;
  int here; /* run on the submitting thread (IDEM_QUEUE_INLINE) */
  int outcome, ended; /* LATE: the token is token, the ids in call */
  long long token;
  void *user;
  idem_step *step;
  idem_call call; /* BEGIN: a deep copy of the caller's */
  char *result, *error;
  size_t result_len;
  char *errmsg; /* set when rc != IDEM_OK */
} qop;

struct idem_queue {
  unsigned magic;
  idem_guard *g; /* held */
  pthread_mutex_t mu;
  pthread_cond_t idle; /* inflight reached 0 */
  int fds[2];          /* the pipe: read end, write end */
  int signalled;       /* the pipe holds its byte */
  int closing;
  size_t inflight;    /* submitted, not done (atomic; falls under mu) */
  size_t ready;       /* done, not popped */
  qop *head, *tail;   /* the done ones, oldest first */
  qop *popped;        /* the last pop's: their errmsg is still lent */
};

static void op_free(qop *o) {
  if (!o) return;
  idem__free((char *)(uintptr_t)o->call.session);
  idem__free((char *)(uintptr_t)o->call.call_id);
  idem__free((char *)(uintptr_t)o->call.tool);
  idem__free((char *)(uintptr_t)o->call.args);
  idem__free((char *)(uintptr_t)o->call.turn);
  idem__free(o->result);
  idem__free(o->error);
  idem__free(o->errmsg);
  idem__free(o);
}

static void ops_free(qop *o, int steps_too) {
  while (o) {
    qop *next = o->next;
    if (steps_too) idem_step_free(o->step);
    op_free(o);
    o = next;
  }
}

int idem_queue_open(idem_guard *g, idem_queue **out) {
  idem_queue *q;
  if (!out) return IDEM_MISUSE;
  *out = NULL;
  if (idem__guard_hold(g)) return IDEM_MISUSE;
  if (!(q = idem__malloc(sizeof *q))) {
    idem__guard_release(g);
    return idem__guard_fail(g, IDEM_NOMEM, "out of memory");
  }
  memset(q, 0, sizeof *q);
  if (pipe2(q->fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    int e = errno;
    idem__free(q);
    idem__guard_release(g);
    return idem__guard_fail(g, IDEM_IO, "queue: cannot make a pipe: %s",
                            strerror(e));
  }
  q->magic = QUEUE_MAGIC;
  q->g = g;
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->idle, NULL);
  *out = q;
  return IDEM_OK;
}

void idem_queue_close(idem_queue *q) {
  if (!q || q->magic != QUEUE_MAGIC) return;
  pthread_mutex_lock(&q->mu);
  q->closing = 1;
  while (q->inflight > 0) pthread_cond_wait(&q->idle, &q->mu);
  pthread_mutex_unlock(&q->mu);
  q->magic = IDEM__MAGIC_DEAD;
  ops_free(q->head, 1); /* never popped: their steps go with them */
  ops_free(q->popped, 0);
  close(q->fds[0]);
  close(q->fds[1]);
  pthread_cond_destroy(&q->idle);
  pthread_mutex_destroy(&q->mu);
  idem__guard_release(q->g);
  idem__free(q);
}

int idem_queue_fd(const idem_queue *q) {
  return q && q->magic == QUEUE_MAGIC ? q->fds[0] : -1;
}

size_t idem_queue_pending(const idem_queue *q) {
  size_t n;
  if (!q || q->magic != QUEUE_MAGIC) return 0;
  pthread_mutex_lock((pthread_mutex_t *)&q->mu);
  n = q->inflight + q->ready;
  pthread_mutex_unlock((pthread_mutex_t *)&q->mu);
  return n;
}

/* ---- on a worker thread -------------------------------------------------- */

/* o is done: onto the list, the pipe's byte written if it was empty. */
static void op_done(qop *o) {
  idem_queue *q = o->q;
  pthread_mutex_lock(&q->mu);
  if (q->tail)
    q->tail->next = o;
  else
    q->head = o;
  q->tail = o;
  q->ready++;
  if (!q->signalled) {
    ssize_t w;
    do
      w = write(q->fds[1], "", 1);
    while (w < 0 && errno == EINTR);
    q->signalled = 1;
  }
  if (__atomic_sub_fetch(&q->inflight, 1, __ATOMIC_ACQ_REL) == 0)
    pthread_cond_broadcast(&q->idle);
  pthread_mutex_unlock(&q->mu); /* q may be closed from here on */
}

static void op_run(idem__work *w) {
  qop *o = (qop *)w;
  idem_guard *g = o->q->g;
  idem_step *s = o->step;
  int rc = IDEM_OK, deliver = (o->flags & IDEM_QUEUE_DELIVER) != 0;
  if (!o->here) /* on the host's thread, its own words stay */
    idem__guard_errclear(g);
  switch (o->op) {
  case IDEM_OP_BEGIN:
    rc = idem_guard_begin(g, &o->call, &o->step);
    s = o->step;
    break;
  case IDEM_OP_FINISH:
    if (o->flags & IDEM_QUEUE_ENDED) rc = idem_step_attempt_ended(s);
    if (rc) break;
    idem__step_deliver_with_outcome(s, deliver);
    rc = idem_step_finish(s, o->outcome, o->result, o->result_len, o->error);
    idem__step_deliver_with_outcome(s, 0);
    break;
  case IDEM_OP_RESOLVE:
    rc = o->outcome ? idem_step_resolve(s, o->outcome, o->result,
                                        o->result_len)
                    : idem_step_no_check(s);
    break;
  case IDEM_OP_POLL: rc = idem_step_poll(s); break;
  case IDEM_OP_DELIVERED: rc = idem_step_delivered(s); break;
  case IDEM_OP_UNDELIVERED: rc = idem_step_undelivered(s); break;
  default:
    rc = idem_guard_late(g, o->call.session, o->call.call_id, o->token,
                         o->outcome, o->result, o->result_len, o->error,
                         o->ended);
  }
  /* told at the answer: a no-op when the outcome's commit recorded it */
  if (rc == IDEM_OK && deliver && idem_step_next(s) == IDEM_NEXT_ANSWER)
    rc = idem_step_delivered(s);
  if ((o->rc = rc) != IDEM_OK) {
    const char *m = idem_guard_errmsg(g);
    /* no room for the words: the completion still says rc, with "" */
    o->errmsg = idem__strdup(*m ? m : idem_strerror(rc));
  }
  op_done(o);
}

/* ---- submissions --------------------------------------------------------- */

static qop *op_new(idem_queue *q, int op, int flags, void *user) {
  qop *o;
  if (!q || q->magic != QUEUE_MAGIC || q->closing) return NULL;
  if (!(o = idem__malloc(sizeof *o))) return NULL;
  memset(o, 0, sizeof *o);
  o->work.run = op_run;
  o->q = q;
  o->op = op;
  o->flags = flags;
  o->user = user;
  return o;
}

/* Hand o to a worker (or run it here: inline).  The step (if any) is
** claimed already. */
static int op_submit(qop *o, int inline_) {
  idem_queue *q = o->q;
  /* not under mu: only close waits for it to fall, and close is never
  ** called while submissions are being made */
  __atomic_add_fetch(&q->inflight, 1, __ATOMIC_ACQ_REL);
  if (inline_) {
    o->here = 1;
    op_run(&o->work);
    return IDEM_OK;
  }
  if (idem__guard_post(q->g, &o->work) == 0) return IDEM_OK;
  pthread_mutex_lock(&q->mu);
  if (__atomic_sub_fetch(&q->inflight, 1, __ATOMIC_ACQ_REL) == 0)
    pthread_cond_broadcast(&q->idle);
  pthread_mutex_unlock(&q->mu);
  if (o->step) idem__step_unclaim(o->step);
  op_free(o);
  return IDEM_NOMEM; /* no thread to be had */
}

/* An operation on step s: claimed for the queue, arguments copied. */
static int step_op(idem_queue *q, idem_step *s, int op, int outcome,
                   const char *result, size_t result_len, const char *error,
                   int flags, void *user) {
  qop *o;
  if (!q || q->magic != QUEUE_MAGIC || q->closing) return IDEM_MISUSE;
  if (idem__step_claim(s, q->g))
    return idem__guard_fail(q->g, IDEM_MISUSE,
                            "queue: the step is not of this queue's guard, "
                            "or an operation of it is in flight");
  if (!(o = op_new(q, op, flags, user)) ||
      (result && !(o->result = idem__strndup(result, result_len))) ||
      (error && !(o->error = idem__strdup(error)))) {
    op_free(o);
    idem__step_unclaim(s);
    return IDEM_NOMEM;
  }
  o->step = s;
  o->outcome = outcome;
  o->result_len = result_len;
  return op_submit(o, 0);
}

int idem_queue_begin(idem_queue *q, const idem_call *call, int flags,
                     void *user) {
  qop *o;
  idem_call in, *c;
  if (!q || q->magic != QUEUE_MAGIC || q->closing) return IDEM_MISUSE;
  if (idem__abi_in(&in, sizeof in, call, IDEM__CALL_MIN))
    return idem__guard_fail(
        q->g, IDEM_MISUSE,
        "idem_queue_begin: idem_call.size is %zu: set it to sizeof(idem_call)",
        call ? call->size : 0);
  if (!(o = op_new(q, IDEM_OP_BEGIN, flags, user))) return IDEM_NOMEM;
  c = &o->call;
  c->size = sizeof *c;
  c->own_check = in.own_check;
  c->args_len = in.args_len;
  /* NULLs stay NULL, for begin to name what is missing */
  if ((in.session && !(c->session = idem__strdup(in.session))) ||
      (in.call_id && !(c->call_id = idem__strdup(in.call_id))) ||
      (in.tool && !(c->tool = idem__strdup(in.tool))) ||
      (in.args && !(c->args = idem__strndup(in.args, in.args_len))) ||
      (in.turn && !(c->turn = idem__strdup(in.turn)))) {
    op_free(o);
    return IDEM_NOMEM;
  }
  /* a replay of a told outcome only reads: here, no hand-off */
  return op_submit(o, (flags & IDEM_QUEUE_INLINE) &&
                          idem__guard_told(q->g, c->session, c->call_id));
}

int idem_queue_finish(idem_queue *q, idem_step *s, int outcome,
                      const char *result, size_t result_len, const char *error,
                      int flags, void *user) {
  return step_op(q, s, IDEM_OP_FINISH, outcome, result, result_len, error,
                 flags, user);
}

int idem_queue_resolve(idem_queue *q, idem_step *s, int outcome,
                       const char *result, size_t result_len, int flags,
                       void *user) {
  return step_op(q, s, IDEM_OP_RESOLVE, outcome, result, result_len, NULL,
                 flags, user);
}

int idem_queue_poll(idem_queue *q, idem_step *s, int flags, void *user) {
  return step_op(q, s, IDEM_OP_POLL, 0, NULL, 0, NULL, flags, user);
}

int idem_queue_delivered(idem_queue *q, idem_step *s, void *user) {
  return step_op(q, s, IDEM_OP_DELIVERED, 0, NULL, 0, NULL, 0, user);
}

int idem_queue_undelivered(idem_queue *q, idem_step *s, void *user) {
  return step_op(q, s, IDEM_OP_UNDELIVERED, 0, NULL, 0, NULL, 0, user);
}

int idem_queue_late(idem_queue *q, const char *session, const char *call_id,
                    long long token, int outcome, const char *result,
                    size_t result_len, const char *error, int ended,
                    void *user) {
  qop *o;
  if (!q || q->magic != QUEUE_MAGIC || q->closing) return IDEM_MISUSE;
  if (!session || !call_id)
    return idem__guard_fail(q->g, IDEM_MISUSE,
                            "idem_queue_late: the session and call id are "
                            "required");
  if (!(o = op_new(q, IDEM_OP_LATE, 0, user))) return IDEM_NOMEM;
  if (!(o->call.session = idem__strdup(session)) ||
      !(o->call.call_id = idem__strdup(call_id)) ||
      (result && !(o->result = idem__strndup(result, result_len))) ||
      (error && !(o->error = idem__strdup(error)))) {
    op_free(o);
    return IDEM_NOMEM;
  }
  o->token = token;
  o->outcome = outcome;
  o->result_len = result_len;
  o->ended = ended;
  return op_submit(o, 0);
}

/* ---- completions --------------------------------------------------------- */

int idem_queue_pop(idem_queue *q, idem_completion *c, size_t n,
                   size_t *got) {
  qop *taken = NULL, **end = &taken, *o, *old;
  size_t stride, k = 0;
  if (got) *got = 0;
  if (!q || q->magic != QUEUE_MAGIC || !c || !got) return IDEM_MISUSE;
  stride = c->size;
  if (stride < IDEM__ABI_MIN(idem_completion)) return IDEM_MISUSE;
  pthread_mutex_lock(&q->mu);
  old = q->popped;
  while (k < n && q->head) {
    o = q->head;
    q->head = o->next;
    o->next = NULL;
    *end = o;
    end = &o->next;
    k++;
  }
  if (!q->head) q->tail = NULL;
  q->ready -= k;
  q->popped = taken;
  if (q->ready == 0 && q->signalled) {
    char b;
    ssize_t r;
    do
      r = read(q->fds[0], &b, 1);
    while (r < 0 && errno == EINTR);
    q->signalled = 0;
  }
  pthread_mutex_unlock(&q->mu);
  ops_free(old, 0);
  for (o = taken, k = 0; o; o = o->next, k++) {
    idem_completion v,
        *dst = (idem_completion *)(void *)((char *)c + k * stride);
    memset(&v, 0, sizeof v);
    v.size = stride;
    v.user = o->user;
    v.step = o->step;
    v.op = o->op;
    v.rc = o->rc;
    if (o->step) {
      v.next = idem_step_next(o->step);
      if (v.next == IDEM_NEXT_ANSWER) v.answer = idem_step_answer(o->step);
      if (o->op != IDEM_OP_BEGIN) idem__step_unclaim(o->step);
    }
    v.errmsg = o->rc ? (o->errmsg ? o->errmsg : "") : "";
    dst->size = stride;
    idem__abi_out(dst, &v, sizeof v, IDEM__ABI_MIN(idem_completion));
  }
  *got = k;
  return IDEM_OK;
}
