/*
** test_seams.c - signals idem trusts, checked against what they prove.
**
**   test_seams LOG_URL    (a fresh store: sqlite:PATH or postgres://...)
**
** A status check that sends the key: the provider (an in-process ledger)
** answers its status query {"client_ref": KEY} the way many APIs do, with
** the query echoed: {"query": {"client_ref": KEY}, "refunds": [...]}.  The
** policy must say where the records are; then a refund that never landed
** is not taken for applied (it is retried and lands once), and one that
** landed is found (and not sent again).  A policy that would count the
** echo is refused.
**
** Results of any size up to the result limit: a tool result of 2 MiB (JSON
** and text) comes back whole on the first answer and on every replay, and
** the record holds it; one past the limit is recorded as a note giving its
** size, never as "not UTF-8".
*/
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "idem.h"

static const char *log_url;

static idem_policy *policy(const char *text) {
  idem_policy *p = NULL;
  if (idem_policy_parse(text, strlen(text), "test", &p) != IDEM_OK) {
    fprintf(stderr, "policy: %s\n", p ? idem_policy_errmsg(p) : "no memory");
    exit(1);
  }
  return p;
}

static idem_guard *open_guard(const idem_policy *p) {
  idem_guard *g = NULL;
  if (idem_guard_open(log_url, p, &g) != IDEM_OK) {
    fprintf(stderr, "open %s: %s\n", log_url, idem_guard_errmsg(g));
    exit(1);
  }
  return g;
}

/* ---- a status query that echoes the key ---------------------------------- */

/* The provider's ledger: the keys of the refunds it applied. */
static char ledger[16][128];
static int nledger;

static int refunds_of(const char *key) {
  int i, n = 0;
  for (i = 0; i < nledger; i++) n += strcmp(ledger[i], key) == 0;
  return n;
}

static void apply(const char *key) {
  if (nledger < 16) snprintf(ledger[nledger++], sizeof ledger[0], "%s", key);
}

/* The status tool: its query echoed, then the refunds made under the key
** it asks about. */
static void status_answer(const char *query, size_t qlen, const char *key,
                          char *out, size_t n) {
  int k = snprintf(out, n, "{\"query\":%.*s,\"refunds\":[", (int)qlen, query);
  int i, first = 1;
  for (i = 0; i < nledger; i++)
    if (strcmp(ledger[i], key) == 0) {
      k += snprintf(out + k, n - (size_t)k,
                    "%s{\"client_ref\":\"%s\",\"id\":\"re_%d\"}",
                    first ? "" : ",", key, i + 1);
      first = 0;
    }
  snprintf(out + k, n - (size_t)k, "]}");
}

static const char *ECHO_POLICY =
    "{\"tools\":{\"refund\":{\"class\":\"guarded\",\"timeout_ms\":300,"
    "\"retries\":1,\"backoff_ms\":1,\"settle_ms\":0,"
    "\"status\":{\"tool\":\"find_refunds\","
    "\"arguments\":{\"client_ref\":\"{$key}\"},"
    "\"applied_when\":{\"pointer\":\"/refunds\",\"key_present\":true}}},"
    "\"find_refunds\":{\"class\":\"read_only\"}}}";

/* Drive one call through the steps.  The first attempt applies the refund
** (landed) or not, and either way its answer is lost: the outcome is
** unknown, and the attempt has ended.  Later attempts apply and answer. */
static int drive(idem_guard *g, const char *call_id, int landed, char *key,
                 int *attempts) {
  static const char ARGS[] = "{\"order_id\":\"ord_1\",\"amount_cents\":6000}";
  idem_call c = {sizeof c, call_id, call_id, "refund",
                 ARGS,     sizeof ARGS - 1, NULL, 0};
  idem_step *s = NULL;
  char answer[2048];
  const char *q;
  size_t qlen;
  int next, verdict, answered, rounds = 0;
  *attempts = 0;
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  if (!s) return -1;
  snprintf(key, 128, "%s", idem_step_key(s));
  while ((next = idem_step_next(s)) != IDEM_NEXT_ANSWER && rounds++ < 10) {
    if (next == IDEM_NEXT_EXECUTE) {
      if (++*attempts == 1) {
        if (landed) apply(idem_step_key(s));
        CHECK_INT(idem_step_attempt_ended(s), IDEM_OK);
        CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_UNKNOWN, NULL, 0,
                                   "connection reset after the request"),
                  IDEM_OK);
      } else {
        apply(idem_step_key(s));
        CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED,
                                   "{\"id\":\"re_x\"}", 13, NULL),
                  IDEM_OK);
      }
    } else if (next == IDEM_NEXT_CHECK) {
      CHECK_STR(idem_step_check_tool(s), "find_refunds");
      q = idem_step_check_args(s, &qlen);
      status_answer(q, qlen, idem_step_check_key(s), answer, sizeof answer);
      verdict = idem_step_check_verdict(s, answer, strlen(answer));
      CHECK_INT(idem_step_resolve(s, verdict, answer, strlen(answer)),
                IDEM_OK);
    } else {
      fprintf(stderr, "%s: unexpected step %d\n", call_id, next);
      check_failed++;
      break;
    }
  }
  answered = idem_step_answer(s);
  idem_step_free(s);
  return answered;
}

static void test_echo(void) {
  idem_policy *p = policy(ECHO_POLICY), *bad = NULL;
  idem_guard *g = open_guard(p);
  char key[128];
  int attempts;
  static const char *WHEN[] = {
      "", ",\"applied_when\":\"key_present\"",
      ",\"applied_when\":{\"pointer\":\"\",\"key_present\":true}"};
  size_t i;

  /* never applied: the echo is no evidence - checked, retried, one refund */
  CHECK_INT(drive(g, "call_1", 0, key, &attempts), IDEM_ANSWER_SUCCEEDED);
  CHECK_INT(refunds_of(key), 1);
  CHECK_INT(attempts, 2);
  /* applied, the answer lost: the check finds it, nothing is sent again */
  CHECK_INT(drive(g, "call_2", 1, key, &attempts), IDEM_ANSWER_SUCCEEDED);
  CHECK_INT(refunds_of(key), 1);
  CHECK_INT(attempts, 1);
  CHECK_INT(nledger, 2);
  idem_guard_close(g);
  idem_policy_free(p);

  /* a rule that would count the echo is refused, naming where */
  for (i = 0; i < sizeof WHEN / sizeof *WHEN; i++) {
    char text[1024];
    snprintf(text, sizeof text,
             "{\"tools\":{\"refund\":{\"class\":\"guarded\","
             "\"status\":{\"tool\":\"find_refunds\","
             "\"arguments\":{\"client_ref\":\"{$key}\"}%s}},"
             "\"find_refunds\":{\"class\":\"read_only\"}}}",
             WHEN[i]);
    CHECK_INT(idem_policy_parse(text, strlen(text), "t", &bad), IDEM_POLICY);
    CHECK(bad && strstr(idem_policy_errmsg(bad),
                        "tools.refund.status.applied_when: the status "
                        "request sends the key"));
    idem_policy_free(bad);
    bad = NULL;
  }
}

/* ---- results larger than the limit on arguments -------------------------- */

static size_t big_len;
static int big_json;

/* A result of big_len bytes: a JSON object, or plain text. */
static int big_run(void *ctx, const char *key, const char *args, size_t len,
                   char **result, char **error) {
  char *r = idem_malloc(big_len + 1);
  (void)ctx;
  (void)key;
  (void)args;
  (void)len;
  (void)error;
  if (!r) return IDEM_OUTCOME_UNKNOWN;
  memset(r, 'x', big_len);
  if (big_json) {
    memcpy(r, "{\"blob\":\"", 9);
    memcpy(r + big_len - 2, "\"}", 2);
  } else {
    r[0] = '<';
  }
  r[big_len] = '\0';
  *result = r;
  return IDEM_OUTCOME_APPLIED;
}

static char *big_call(idem_guard *g, const char *call_id) {
  idem_call c = {sizeof c, call_id, call_id, "export", "{}", 2, NULL, 0};
  idem_tool t = {sizeof t, big_run, NULL, NULL};
  char *env = NULL;
  size_t len = 0;
  CHECK_INT(idem_guard_call(g, &c, &t, &env, &len), IDEM_OK);
  return env;
}

/* env holds the result and replayed as said; the record holds want. */
static void result_is(idem_guard *g, const char *call_id, const char *env,
                      const char *want, int replayed) {
  idem_record *r = NULL;
  CHECK(env && strncmp(env, "{\"status\":\"succeeded\"", 21) == 0);
  CHECK(env && strstr(env, replayed ? "\"replayed\":true"
                                    : "\"replayed\":false"));
  CHECK(env && strstr(env, want));
  CHECK_INT(idem_guard_record(g, call_id, call_id, &r), IDEM_OK);
  CHECK(r && r->result && strcmp(r->result, want) == 0);
  if (r && r->result && strcmp(r->result, want) != 0)
    fprintf(stderr, "  record holds %zu bytes: %.80s...\n", strlen(r->result),
            r->result);
  idem_record_free(r);
}

static void test_big_results(void) {
  idem_policy *p = policy(
      "{\"tools\":{\"export\":{\"class\":\"guarded\",\"timeout_ms\":20000}}}");
  idem_guard *g = open_guard(p);
  char *env, *want;
  int round;

  /* 2 MiB of JSON, then 2 MiB of text: whole, first time and replayed */
  for (round = 0; round < 2; round++) {
    const char *id = round ? "text" : "json";
    big_len = (size_t)2 << 20;
    big_json = !round;
    want = malloc(big_len + 3);
    if (!want) exit(1);
    if (big_json) {
      big_run(NULL, NULL, NULL, 0, &env, NULL);
      memcpy(want, env, big_len + 1);
      idem_free(env);
    } else {
      want[0] = '"';
      want[1] = '<';
      memset(want + 2, 'x', big_len - 1);
      memcpy(want + big_len + 1, "\"", 2);
    }
    env = big_call(g, id);
    result_is(g, id, env, want, 0);
    idem_free(env);
    env = big_call(g, id);
    result_is(g, id, env, want, 1);
    idem_free(env);
    free(want);
  }

  /* past the limit: a note that says what it was */
  big_len = (size_t)17 << 20;
  big_json = 1;
  env = big_call(g, "huge");
  result_is(g, "huge", env,
            "\"(a result of 17825792 bytes, not kept: larger than 16 MiB)\"",
            0);
  CHECK(env && !strstr(env, "not UTF-8"));
  idem_free(env);
  idem_guard_close(g);
  idem_policy_free(p);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_seams LOG_URL\n");
    return 2;
  }
  log_url = argv[1];
  test_echo();
  test_big_results();
  return check_done();
}
