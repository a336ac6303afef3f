/*
** test_seams.c - signals idem trusts, checked against what they prove.
**
**   test_seams LOG_URL    (a fresh store: sqlite:PATH or postgres://...)
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

/* ---- results larger than the limit on arguments ---------------------------- */

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
  test_big_results();
  return check_done();
}
