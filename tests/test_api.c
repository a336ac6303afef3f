/*
** test_api.c - the contract of idem.h as a C program outside the project
** meets it: only the public header, nothing of the internals.
**
**   - the ABI rule: sized structs (a size too small is misuse, named in the
**     message; a caller built against a later, larger struct is served);
**   - one rule for memory: a tool's result crosses through idem_malloc()
**     and the library frees it through the allocator the program set;
**   - errors on the handle: idem_guard_errmsg(g) is the calling thread's
**     last failure on g, never rewritten by another thread;
**   - reading and keeping the log: list (with the recoverable filter that
**     recover uses), record, stats, gc; the policy's view of a tool;
**     options; the executor's lease; the text helpers.
**
**   test_api DIR    (a fresh directory for the SQLite logs)
*/
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "idem.h"

static const char *dir;

static const char *ARGS = "{\"order_id\":\"ord_1\",\"amount_cents\":6000}";

static void log_url(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "sqlite:%s/%s.db", dir, name);
}

/* ---- a tagged allocator: frees of what it did not allocate are caught ---- */

#define TAG 0x1de3a110c8u

/* counted by whichever thread allocates or frees (the guard's workers
** too, even after idem_guard_close), so read atomically as well */
static long long allocs, frees, foreign;

static void *tag_malloc(size_t n) {
  uint64_t *p = malloc(n + 16);
  if (!p) return NULL;
  p[0] = TAG;
  __atomic_add_fetch(&allocs, 1, __ATOMIC_RELAXED);
  return p + 2;
}

static void tag_free(void *q) {
  uint64_t *p;
  if (!q) return;
  p = (uint64_t *)q - 2;
  if (p[0] != TAG) { /* not ours: the library freed a malloc()'d block */
    __atomic_add_fetch(&foreign, 1, __ATOMIC_RELAXED);
    return; /* leak it rather than corrupt the heap */
  }
  p[0] = 0;
  __atomic_add_fetch(&frees, 1, __ATOMIC_RELAXED);
  free(p);
}

static void *tag_realloc(void *q, size_t n) {
  uint64_t *p;
  if (!q) return tag_malloc(n);
  p = realloc((uint64_t *)q - 2, n + 16);
  return p ? p + 2 : NULL;
}

static int applied;

static char *lib_dup(const char *s) {
  char *p = idem_malloc(strlen(s) + 1);
  if (p) strcpy(p, s);
  return p;
}

static int refund_run(void *ctx, const char *key, const char *args, size_t len,
                      char **result, char **error) {
  (void)ctx;
  (void)key;
  (void)args;
  (void)len;
  (void)error;
  __atomic_add_fetch(&applied, 1, __ATOMIC_RELAXED);
  *result = lib_dup("{\"refund_id\":\"re_1\"}");
  return IDEM_OUTCOME_APPLIED;
}

static int failing_run(void *ctx, const char *key, const char *args, size_t len,
                       char **result, char **error) {
  (void)ctx;
  (void)key;
  (void)args;
  (void)len;
  *result = NULL;
  *error = lib_dup("card expired");
  return IDEM_OUTCOME_REJECTED;
}

static void test_memory_rule(void) {
  char url[512];
  idem_guard *g = NULL;
  idem_call c = {.size = sizeof c,
                 .session = "mem",
                 .call_id = "c1",
                 .tool = "refund_payment",
                 .args = ARGS};
  idem_tool t = {.size = sizeof t, .run = refund_run};
  idem_tool bad = {.size = sizeof bad, .run = failing_run};
  char *env = NULL;
  size_t len;
  c.args_len = strlen(ARGS);
  log_url(url, sizeof url, "memory");
  CHECK_INT(idem_guard_open(url, NULL, &g), IDEM_OK);
  CHECK_INT(idem_guard_call(g, &c, &t, &env, &len), IDEM_OK);
  CHECK(env && strstr(env, "\"succeeded\"") && strstr(env, "re_1"));
  idem_free(env);
  c.call_id = "c2"; /* another refund: a failing one */
  c.args = "{\"order_id\":\"ord_2\",\"amount_cents\":100}";
  c.args_len = strlen(c.args);
  CHECK_INT(idem_guard_call(g, &c, &bad, &env, &len), IDEM_OK);
  CHECK(env && strstr(env, "\"failed\"") && strstr(env, "card expired"));
  idem_free(env);
  idem_guard_close(g);
  /* every block the tool handed over went back through tag_free (the
  ** allocator stays: the guard's worker threads outlive it a while) */
  CHECK_INT(__atomic_load_n(&foreign, __ATOMIC_RELAXED), 0);
  CHECK(__atomic_load_n(&allocs, __ATOMIC_RELAXED) > 0);
  CHECK(__atomic_load_n(&frees, __ATOMIC_RELAXED) > 0);
}

/* ---- the ABI rule ------------------------------------------------------ */

/* What a caller compiled against a later version sends: a larger idem_call
** with a field this version does not know. */
typedef struct later_call {
  idem_call now;
  const char *added_later;
} later_call;

static void test_abi(void) {
  char url[512];
  idem_guard *g = NULL;
  idem_canon *cn = NULL;
  idem_step *s = NULL;
  idem_key k;
  idem_call c = {.session = "abi",
                 .call_id = "c1",
                 .tool = "refund_payment",
                 .args = ARGS}; /* size left 0 */
  later_call lc;
  idem_tool_info info;
  idem_stats st;
  c.args_len = strlen(ARGS);
  log_url(url, sizeof url, "abi");
  CHECK_INT(idem_guard_open(url, NULL, &g), IDEM_OK);
  /* size 0: misuse, said in words, nothing recorded */
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_MISUSE);
  CHECK(s == NULL);
  CHECK(strstr(idem_guard_errmsg(g), "idem_call.size is 0") != NULL);
  CHECK_INT(idem_canon_open(&cn), IDEM_OK);
  CHECK_INT(idem_key_mint(cn, &c, NULL, &k), IDEM_MISUSE);
  CHECK(strstr(idem_canon_errmsg(cn), "sizeof(idem_call)") != NULL);
  /* a larger struct from a later header: served, the extra ignored */
  memset(&lc, 0, sizeof lc);
  lc.now = c;
  lc.now.size = sizeof lc;
  lc.added_later = "x";
  CHECK_INT(idem_key_mint(cn, &lc.now, NULL, &k), IDEM_OK);
  CHECK_INT(idem_guard_begin(g, &lc.now, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED, "{}", 2, NULL), IDEM_OK);
  idem_step_free(s);
  /* a caller built against 0.3.0: its idem_call ends before own_check,
  ** and is served - by the key and by the guard */
  {
    idem_call old = c;
    old.size = offsetof(idem_call, own_check);
    old.call_id = "c_030";
    old.args = "{\"order_id\":\"o_030\"}"; /* another action */
    old.args_len = strlen(old.args);
    CHECK_INT(idem_key_mint(cn, &old, NULL, &k), IDEM_OK);
    CHECK_INT(idem_guard_begin(g, &old, &s), IDEM_OK);
    CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
    CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED, "{}", 2, NULL),
              IDEM_OK);
    CHECK_INT(idem_step_answer(s), IDEM_ANSWER_SUCCEEDED);
    idem_step_free(s);
    old.size = offsetof(idem_call, own_check) - 1; /* smaller: misuse */
    CHECK_INT(idem_guard_begin(g, &old, &s), IDEM_MISUSE);
  }
  /* out structs: a size too small is refused, the right one filled */
  memset(&info, 0, sizeof info);
  info.size = 8;
  CHECK_INT(idem_policy_tool(NULL, "refund_payment", &info), IDEM_MISUSE);
  memset(&st, 0xff, sizeof st);
  st.size = sizeof st;
  CHECK_INT(idem_guard_stats(g, &st), IDEM_OK);
  CHECK_INT(st.records, 2);
  CHECK_INT(st.by_state[IDEM_STATE_SUCCEEDED], 2);
  CHECK_INT(st.size, sizeof st);
  idem_canon_close(cn);
  idem_guard_close(g);
}

/* ---- errors on the handle ------------------------------------------------- */

typedef struct err_job {
  idem_guard *g;
  int id;
  int wrong; /* times this thread saw another thread's message */
} err_job;

static void *err_main(void *arg) {
  err_job *j = arg;
  char want[64];
  for (int i = 0; i < 2000; i++) {
    /* a failure whose words name this thread: an option value of its own */
    idem_guard_set(j->g, IDEM_GUARD_SHARED_PGID, -1000 - j->id);
    snprintf(want, sizeof want, "%lld is not a value", -1000LL - j->id);
    if (!strstr(idem_guard_errmsg(j->g), want)) j->wrong++;
  }
  return NULL;
}

static void test_errmsg_per_thread(void) {
  char url[512];
  idem_guard *g = NULL;
  pthread_t th[8];
  err_job jobs[8];
  int i, wrong = 0;
  log_url(url, sizeof url, "errors");
  CHECK_INT(idem_guard_open(url, NULL, &g), IDEM_OK);
  CHECK_STR(idem_guard_errmsg(g), ""); /* no failure yet on this thread */
  for (i = 0; i < 8; i++) {
    jobs[i].g = g;
    jobs[i].id = i;
    jobs[i].wrong = 0;
    CHECK_INT(pthread_create(&th[i], NULL, err_main, &jobs[i]), 0);
  }
  for (i = 0; i < 8; i++) {
    pthread_join(th[i], NULL);
    wrong += jobs[i].wrong;
  }
  CHECK_INT(wrong, 0);
  /* this thread's own slot is still empty: the others' failures are theirs */
  CHECK_STR(idem_guard_errmsg(g), "");
  CHECK_INT(idem_guard_set(g, 99, 1), IDEM_RANGE);
  CHECK(strstr(idem_guard_errmsg(g), "no option 99") != NULL);
  /* the message is g's: a failure on another guard leaves it alone */
  {
    idem_guard *h = NULL;
    char url2[512];
    log_url(url2, sizeof url2, "errors2");
    CHECK_INT(idem_guard_open(url2, NULL, &h), IDEM_OK);
    CHECK_INT(idem_guard_set(h, 77, 1), IDEM_RANGE);
    CHECK(strstr(idem_guard_errmsg(h), "no option 77") != NULL);
    CHECK(strstr(idem_guard_errmsg(g), "no option 99") != NULL);
    idem_guard_close(h);
  }
  idem_guard_close(g);
}

/* ---- reading and keeping the log ---------------------------------------- */

typedef struct seen {
  int n;
  char calls[16][16];
} seen;

static int collect(void *ctx, const idem_record *r) {
  seen *x = ctx;
  if (x->n < 16) snprintf(x->calls[x->n], sizeof x->calls[0], "%s", r->call_id);
  x->n++;
  return 0;
}

static int stop_at_one(void *ctx, const idem_record *r) {
  (void)r;
  ++*(int *)ctx;
  return 1;
}

static void test_log_api(void) {
  char url[512];
  const char *policy_text = "{\"tools\":{\"refund_payment\":{\"class\":"
                            "\"guarded\",\"timeout_ms\":200,"
                            "\"retries\":0,\"retention_s\":1}}}";
  idem_policy *p = NULL;
  idem_guard *g = NULL;
  idem_step *s = NULL;
  idem_call c = {.size = sizeof c,
                 .session = "log",
                 .tool = "refund_payment",
                 .args = ARGS};
  idem_filter f = {.size = sizeof f};
  idem_record *r = NULL;
  idem_stats st = {.size = sizeof st};
  seen x;
  size_t removed = 99;
  int n;
  c.args_len = strlen(ARGS);
  log_url(url, sizeof url, "log");
  CHECK_INT(idem_policy_parse(policy_text, strlen(policy_text), "test", &p),
            IDEM_OK);
  CHECK_INT(idem_guard_open(url, p, &g), IDEM_OK);
  CHECK(strstr(idem_guard_log(g), "log.db") != NULL);
  /* c1 succeeds */
  c.call_id = "c1";
  c.turn = "t1";
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED, "{}", 2, NULL), IDEM_OK);
  CHECK_INT(idem_step_attempt_ended(s), IDEM_OK);
  CHECK_INT(idem_step_delivered(s), IDEM_OK);
  idem_step_free(s);
  /* c2 (another order) is left in doubt: its attempt ended unknown */
  c.call_id = "c2";
  c.turn = "t2";
  c.args = "{\"order_id\":\"ord_2\",\"amount_cents\":100}";
  c.args_len = strlen(c.args);
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  CHECK_INT(idem_step_attempt_ended(s), IDEM_OK);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_UNKNOWN, NULL, 0, "reset"),
            IDEM_OK);
  idem_step_free(s);
  /* c3 (a third order) stays pending under this live process */
  c.call_id = "c3";
  c.turn = "t3";
  c.args = "{\"order_id\":\"ord_3\",\"amount_cents\":100}";
  c.args_len = strlen(c.args);
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);

  memset(&x, 0, sizeof x);
  CHECK_INT(idem_guard_list(g, NULL, collect, &x), IDEM_OK);
  CHECK_INT(x.n, 3);
  CHECK_STR(x.calls[0], "c1"); /* oldest first */
  memset(&x, 0, sizeof x);
  f.states = 1u << IDEM_STATE_IN_DOUBT;
  CHECK_INT(idem_guard_list(g, &f, collect, &x), IDEM_OK);
  CHECK_INT(x.n, 1);
  CHECK_STR(x.calls[0], "c2");
  /* recoverable: the one in doubt, not the one a live owner holds */
  memset(&x, 0, sizeof x);
  f.states = 0;
  f.recoverable = 1;
  CHECK_INT(idem_guard_list(g, &f, collect, &x), IDEM_OK);
  CHECK_INT(x.n, 1);
  CHECK_STR(x.calls[0], "c2");
  /* a callback stops the listing */
  n = 0;
  CHECK_INT(idem_guard_list(g, NULL, stop_at_one, &n), IDEM_OK);
  CHECK_INT(n, 1);
  /* limit and session */
  memset(&x, 0, sizeof x);
  f.recoverable = 0;
  f.limit = 2;
  f.session = "log";
  CHECK_INT(idem_guard_list(g, &f, collect, &x), IDEM_OK);
  CHECK_INT(x.n, 2);
  memset(&x, 0, sizeof x);
  f.session = "nobody";
  CHECK_INT(idem_guard_list(g, &f, collect, &x), IDEM_OK);
  CHECK_INT(x.n, 0);

  CHECK_INT(idem_guard_record(g, "log", "c2", &r), IDEM_OK);
  CHECK(r && r->state == IDEM_STATE_IN_DOUBT);
  idem_record_free(r);
  CHECK_INT(idem_guard_record(g, "log", "nope", &r), IDEM_NOTFOUND);

  CHECK_INT(idem_guard_stats(g, &st), IDEM_OK);
  CHECK_INT(st.records, 3);
  CHECK_INT(st.by_state[IDEM_STATE_SUCCEEDED], 1);
  CHECK_INT(st.by_state[IDEM_STATE_IN_DOUBT], 1);
  CHECK_INT(st.by_state[IDEM_STATE_PENDING], 1);

  /* gc: only the settled record, once its retention (1 s) is over */
  CHECK_INT(idem_guard_gc(g, &removed), IDEM_OK);
  CHECK_INT(removed, 0);
  usleep(1100 * 1000);
  CHECK_INT(idem_guard_gc(g, &removed), IDEM_OK);
  CHECK_INT(removed, 1);
  CHECK_INT(idem_guard_record(g, "log", "c1", &r), IDEM_NOTFOUND);
  CHECK_INT(idem_guard_record(g, "log", "c2", &r), IDEM_OK);
  idem_record_free(r);

  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED, "{}", 2, NULL), IDEM_OK);
  idem_step_free(s);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* ---- the policy's view of a tool, options, the executor's lease -------- */

static void test_tool_info(void) {
  const char *text =
      "{\"tools\":{\"deploy\":{\"class\":\"guarded\",\"timeout_ms\":1000,"
      "\"retries\":1,\"settle_ms\":500,\"key_arg\":\"ref\","
      "\"status\":{\"command\":\"true\"},"
      "\"exit_codes\":{\"applied\":[0,3],\"not_applied\":[100],"
      "\"rejected\":[101,102]}}},\"unknown_tools\":\"refuse\"}";
  idem_policy *p = NULL;
  idem_tool_info i = {.size = sizeof i};
  CHECK_INT(idem_policy_parse(text, strlen(text), "test", &p), IDEM_OK);
  CHECK_INT(idem_policy_tool_count(p), 1);
  CHECK_STR(idem_policy_tool_name(p, 0), "deploy");
  CHECK(idem_policy_tool_name(p, 1) == NULL);
  CHECK_INT(idem_policy_tool_count(NULL), 0);
  CHECK(idem_policy_warning(p, 0) == NULL);
  CHECK(idem_policy_warning(NULL, 0) == NULL);
  CHECK_INT(idem_policy_tool(p, "deploy", &i), IDEM_OK);
  CHECK_INT(i.named, 1);
  CHECK_INT(i.cls, IDEM_CLASS_GUARDED);
  CHECK_INT(i.timeout_ms, 1000);
  CHECK_INT(i.retries, 1);
  CHECK_INT(i.settle_ms, 500);
  CHECK(i.lease_ms > 2 * 1000);
  CHECK_STR(i.key_arg, "ref");
  CHECK_INT(i.has_status, 1);
  CHECK_STR(i.status_command, "true");
  CHECK(i.status_tool == NULL);
  CHECK_INT(i.n_exit_applied, 2);
  CHECK_INT(i.exit_applied[1], 3);
  CHECK_INT(i.n_exit_rejected, 2);
  CHECK_INT(i.exit_rejected[1], 102);
  CHECK_INT(idem_policy_tool(p, "other", &i), IDEM_OK);
  CHECK_INT(i.named, 0);
  CHECK_INT(i.cls, IDEM_CLASS_REFUSED);
  CHECK(i.key_arg == NULL);
  idem_policy_free(p);
  /* no policy: every tool guarded with the defaults */
  CHECK_INT(idem_policy_tool(NULL, "anything", &i), IDEM_OK);
  CHECK_INT(i.cls, IDEM_CLASS_GUARDED);
  CHECK_INT(i.timeout_ms, 30000);
  CHECK_INT(i.settle_ms, -1);
  CHECK_INT(i.n_exit_applied, 1);
  CHECK_INT(i.exit_applied[0], 0);
  CHECK_INT(i.exit_not_applied[0], 100);
}

static void test_options_and_lease(void) {
  char url[512];
  idem_guard *g = NULL, *runner = NULL;
  idem_step *s = NULL;
  idem_record *r = NULL;
  idem_call c = {.size = sizeof c,
                 .session = "exe",
                 .call_id = "c1",
                 .tool = "refund_payment",
                 .args = ARGS};
  c.args_len = strlen(ARGS);
  log_url(url, sizeof url, "executor");
  CHECK_INT(idem_guard_open(url, NULL, &g), IDEM_OK);
  CHECK(idem_guard_owner(g) && strchr(idem_guard_owner(g), ':'));
  CHECK_INT(idem_guard_set(g, IDEM_GUARD_EXECUTOR_HANDS_IN, 2), IDEM_RANGE);
  CHECK_INT(idem_guard_set(g, IDEM_GUARD_SHARED_PGID, 1), IDEM_RANGE);
  CHECK_INT(idem_guard_set(g, IDEM_GUARD_EXECUTOR_HANDS_IN, 1), IDEM_OK);
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  /* the attempt began without an executor: the runner hands itself in */
  CHECK_INT(idem_guard_record(g, "exe", "c1", &r), IDEM_OK);
  CHECK(r && r->executor == NULL);
  idem_record_free(r);
  CHECK_INT(idem_guard_open(idem_guard_log(g), NULL, &runner), IDEM_OK);
  CHECK_INT(idem_guard_executor_lease(runner, "exe", "c1",
                                      idem_step_token(s) + 1, 60000, 4242, 1000,
                                      NULL),
            IDEM_STALE); /* a stale token starts nothing */
  CHECK_INT(idem_guard_executor_lease(runner, "exe", "c1", idem_step_token(s),
                                      60000, 4242, 1000, NULL),
            IDEM_OK);
  CHECK_INT(idem_guard_record(g, "exe", "c1", &r), IDEM_OK);
  CHECK(r && r->executor && strcmp(r->executor, idem_guard_owner(runner)) == 0);
  CHECK(r && r->pgid == 4242);
  idem_record_free(r);
  /* handed back to the front end before the runner reports */
  CHECK_INT(idem_guard_executor_lease(runner, "exe", "c1", idem_step_token(s),
                                      60000, 0, 0, idem_guard_owner(g)),
            IDEM_OK);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED, "{}", 2, NULL), IDEM_OK);
  idem_step_free(s);
  idem_guard_close(runner);
  idem_guard_close(g);
  CHECK_INT(idem_process_group_empty(0), 1);
  CHECK_INT(idem_process_group_empty((long long)getpgrp()), 0);
}

/* ---- text helpers ---------------------------------------------------------- */

static void test_text(void) {
  idem_canon *c = NULL;
  const char *out;
  size_t n;
  CHECK_INT(idem_canon_open(&c), IDEM_OK);
  CHECK_INT(idem_canon_string(c, "a\"b\\\n\x01\xc3\xa9", 8, &out, &n), IDEM_OK);
  CHECK_MEM(out, n, "\"a\\\"b\\\\\\n\\u0001\xc3\xa9\"");
  CHECK_INT(idem_canon_string(c, "", 0, &out, &n), IDEM_OK);
  CHECK_MEM(out, n, "\"\"");
  CHECK_INT(idem_canon_string(c, "ab\xff", 3, &out, &n), IDEM_JSON_UTF8);
  CHECK_INT(idem_canon_erroffset(c), 2);
  CHECK(out == NULL);
  idem_canon_close(c);
  CHECK_INT(idem_utf8_char("a", 1), 1);
  CHECK_INT(idem_utf8_char("\xc3\xa9", 2), 2);
  CHECK_INT(idem_utf8_char("\xc3", 1), 0);         /* cut short */
  CHECK_INT(idem_utf8_char("\xc0\xaf", 2), 0);     /* overlong */
  CHECK_INT(idem_utf8_char("\xed\xa0\x80", 3), 0); /* a surrogate */
  CHECK_INT(idem_utf8_char("\xf0\x9f\x98\x80", 4), 4);
  CHECK_INT(idem_utf8_char("\xf4\x90\x80\x80", 4), 0); /* past U+10FFFF */
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_api DIR\n");
    return 2;
  }
  dir = argv[1];
  /* the program's own allocator, set before any handle, for the whole run */
  idem_set_alloc_funcs(tag_malloc, tag_realloc, tag_free);
  test_memory_rule();
  test_abi();
  test_errmsg_per_thread();
  test_log_api();
  test_tool_info();
  test_options_and_lease();
  test_text();
  CHECK_INT(__atomic_load_n(&foreign, __ATOMIC_RELAXED), 0);
  return check_done();
}
