/*
** test_policy.c - the policy file (SPEC §8, docs/POLICY.md).
**
**   test_policy CASES_DIR
**
** Unit tests: the SPEC §8 example and a policy that sets every field, read
** back field by field; the defaults; idem__policy_rule for named and
** unknown tools under each unknown_tools and for no policy; explanations;
** misuse, files and limits; and every allocation failing in turn.  Then the
** data-driven cases: each CASES_DIR/<case>.json must be refused with
** IDEM_POLICY and a message starting with the one line of <case>.err (the
** text is parsed with origin "<case>.json"; idem_policy_load on the file
** must say the same with the path as origin).
*/
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "idem.h"
#include "idemInt.h"

static const char SPEC_EXAMPLE[] =
    "{\n"
    "  \"unknown_tools\": \"refuse\",\n"
    "  \"tools\": {\n"
    "    \"refund_payment\": {\n"
    "      \"class\": \"guarded\", \"timeout_ms\": 8000, \"retries\": 2,\n"
    "      \"provider_dedupes\": true, \"provider_key_ttl_s\": 86400,\n"
    "      \"key_arg\": \"idempotency_key\", \"key_max_len\": 255,\n"
    "      \"fence\": [\"order_id\"], \"fence_scope\": \"session\",\n"
    "      \"status\": {\"tool\": \"get_refund_status\", \"arguments\": "
    "{\"order_id\": \"{order_id}\"},\n"
    "                 \"applied_when\": \"key_present\"},\n"
    "      \"retention_s\": 604800\n"
    "    },\n"
    "    \"get_refund_status\": {\"class\": \"read_only\"}\n"
    "  }\n"
    "}\n";

/* Every field set, none to its default. */
static const char FULL[] =
    "{\"unknown_tools\": \"guard\", \"tools\": {"
    " \"send_email\": {\"class\": \"guarded\", \"timeout_ms\": 1500,"
    "  \"retries\": 0, \"backoff_ms\": 50, \"reconcile_timeout_ms\": 9000,"
    "  \"wait_ms\": 0, \"provider_dedupes\": true,"
    "  \"provider_key_ttl_s\": 3600, \"key_arg\": \"dedupe_id\","
    "  \"key_max_len\": 66, \"fence\": [\"to\", \"subject\"],"
    "  \"fence_scope\": \"global\", \"repeat_window_s\": 600,"
    "  \"retention_s\": 86400,"
    "  \"status\": {\"tool\": \"email_status\","
    "   \"arguments\": {\"z\": [1.50, \"{$key}\"], \"id\": \"{to}\", \"a\": "
    "1e2},"
    "   \"applied_when\": {\"pointer\": \"/result/state\","
    "    \"equals\": {\"ok\": true, \"code\": 2.0}}},"
    "  \"exit_codes\": {\"applied\": [0, 3], \"not_applied\": [75, 100],"
    "   \"rejected\": [1, 2, 64]}},"
    " \"run_job\": {\"class\": \"guarded\","
    "  \"status\": {\"command\": \"job-status \\\"$IDEM_KEY\\\"\"},"
    "  \"exit_codes\": {\"rejected\": []}},"
    " \"email_status\": {\"class\": \"read_only\", \"timeout_ms\": 700,"
    "  \"retries\": 4, \"backoff_ms\": 10},"
    " \"list_inbox\": {\"class\": \"idempotent\", \"timeout_ms\": 2000,"
    "  \"retries\": 5, \"backoff_ms\": 1000}}}";

static idem_policy *parse(const char *text, int want) {
  idem_policy *p = NULL;
  int rc = idem_policy_parse(text, strlen(text), "test", &p);
  CHECK_INT(rc, want);
  if (rc != want) fprintf(stderr, "  message: %s\n", idem_policy_errmsg(p));
  return p;
}

static const idem__tool_rule *rule(const idem_policy *p, const char *name) {
  static idem__tool_rule scratch;
  const idem__tool_rule *r = idem__policy_rule(p, name, &scratch);
  CHECK(r != &scratch); /* named by the policy: borrowed from it */
  return r;
}

static void check_defaults_except_class(const idem__tool_rule *r) {
  CHECK_INT(r->timeout_ms, 30000);
  CHECK_INT(r->retries, 2);
  CHECK_INT(r->backoff_ms, 200);
  CHECK_INT(r->reconcile_timeout_ms, 30000);
  CHECK_INT(r->wait_ms, 2000);
  CHECK_INT(r->provider_dedupes, 0);
  CHECK_INT(r->provider_key_ttl_s, 86400);
  CHECK(r->key_arg == NULL);
  CHECK_INT(r->key_max_len, 255);
  CHECK(r->fence == NULL);
  CHECK_INT(r->nfence, 0);
  CHECK_INT(r->fence_global, 0);
  CHECK_INT(r->repeat_window_s, 0);
  CHECK_INT(r->retention_s, 604800);
  CHECK_INT(r->has_status, 0);
  CHECK(r->status.tool == NULL && r->status.arguments == NULL &&
        r->status.command == NULL && r->status.pointer == NULL &&
        r->status.equals == NULL);
  CHECK_INT(r->n_exit_applied, 1);
  CHECK_INT(r->exit_applied[0], 0);
  CHECK_INT(r->n_exit_not_applied, 1);
  CHECK_INT(r->exit_not_applied[0], 100);
  CHECK_INT(r->n_exit_rejected, 1);
  CHECK_INT(r->exit_rejected[0], 101);
}

static void test_spec_example(void) {
  idem_policy *p = parse(SPEC_EXAMPLE, IDEM_OK);
  const idem__tool_rule *r;
  if (!p) return;
  CHECK_STR(idem_policy_errmsg(p), "");
  CHECK_INT(p->unknown_tools, IDEM_CLASS_REFUSED);
  CHECK_INT(p->ntools, 2);
  CHECK_STR(p->tools[0].name, "get_refund_status"); /* sorted */
  CHECK_STR(p->tools[1].name, "refund_payment");

  r = rule(p, "refund_payment");
  CHECK_STR(r->name, "refund_payment");
  CHECK_INT(r->cls, IDEM_CLASS_GUARDED);
  CHECK_INT(r->timeout_ms, 8000);
  CHECK_INT(r->retries, 2);
  CHECK_INT(r->backoff_ms, 200);
  CHECK_INT(r->reconcile_timeout_ms, 8000); /* = timeout_ms */
  CHECK_INT(r->wait_ms, 2000);
  CHECK_INT(r->provider_dedupes, 1);
  CHECK_INT(r->provider_key_ttl_s, 86400);
  CHECK_STR(r->key_arg, "idempotency_key");
  CHECK_INT(r->key_max_len, 255);
  CHECK_INT(r->nfence, 1);
  if (r->nfence == 1) CHECK_STR(r->fence[0], "order_id");
  CHECK_INT(r->fence_global, 0);
  CHECK_INT(r->repeat_window_s, 0);
  CHECK_INT(r->retention_s, 604800);
  CHECK_INT(r->has_status, 1);
  CHECK_STR(r->status.tool, "get_refund_status");
  CHECK_STR(r->status.arguments, "{\"order_id\":\"{order_id}\"}");
  CHECK(r->status.command == NULL);
  CHECK_INT(r->status.applied_when, IDEM__APPLIED_WHEN_KEY_PRESENT);
  CHECK(r->status.pointer == NULL && r->status.equals == NULL);
  CHECK_INT(r->n_exit_applied, 1);
  CHECK_INT(r->exit_rejected[0], 101);

  r = rule(p, "get_refund_status");
  CHECK_INT(r->cls, IDEM_CLASS_READ_ONLY);
  check_defaults_except_class(r);

  CHECK_INT(idem_policy_class(p, "refund_payment"), IDEM_CLASS_GUARDED);
  CHECK_INT(idem_policy_class(p, "get_refund_status"), IDEM_CLASS_READ_ONLY);
  CHECK_INT(idem_policy_class(p, "delete_account"), IDEM_CLASS_REFUSED);
  idem_policy_free(p);
}

static void test_full(void) {
  idem_policy *p = parse(FULL, IDEM_OK);
  const idem__tool_rule *r;
  if (!p) return;
  CHECK_INT(p->unknown_tools, IDEM_CLASS_GUARDED);
  CHECK_INT(p->ntools, 4);

  r = rule(p, "send_email");
  CHECK_INT(r->cls, IDEM_CLASS_GUARDED);
  CHECK_INT(r->timeout_ms, 1500);
  CHECK_INT(r->retries, 0);
  CHECK_INT(r->backoff_ms, 50);
  CHECK_INT(r->reconcile_timeout_ms, 9000);
  CHECK_INT(r->wait_ms, 0);
  CHECK_INT(r->provider_dedupes, 1);
  CHECK_INT(r->provider_key_ttl_s, 3600);
  CHECK_STR(r->key_arg, "dedupe_id");
  CHECK_INT(r->key_max_len, 66);
  CHECK_INT(r->nfence, 2);
  if (r->nfence == 2) {
    CHECK_STR(r->fence[0], "to"); /* in the file's order */
    CHECK_STR(r->fence[1], "subject");
  }
  CHECK_INT(r->fence_global, 1);
  CHECK_INT(r->repeat_window_s, 600);
  CHECK_INT(r->retention_s, 86400);
  CHECK_INT(r->has_status, 1);
  CHECK_STR(r->status.tool, "email_status");
  /* canonical: members sorted, numbers in ECMAScript form */
  CHECK_STR(r->status.arguments,
            "{\"a\":100,\"id\":\"{to}\",\"z\":[1.5,\"{$key}\"]}");
  CHECK(r->status.command == NULL);
  CHECK_INT(r->status.applied_when, IDEM__APPLIED_WHEN_POINTER);
  CHECK_STR(r->status.pointer, "/result/state");
  CHECK_STR(r->status.equals, "{\"code\":2,\"ok\":true}");
  CHECK_INT(r->n_exit_applied, 2);
  CHECK_INT(r->exit_applied[0], 0);
  CHECK_INT(r->exit_applied[1], 3);
  CHECK_INT(r->n_exit_not_applied, 2);
  CHECK_INT(r->exit_not_applied[0], 75);
  CHECK_INT(r->exit_not_applied[1], 100);
  CHECK_INT(r->n_exit_rejected, 3);
  CHECK_INT(r->exit_rejected[2], 64);

  r = rule(p, "run_job");
  CHECK_INT(r->has_status, 1);
  CHECK(r->status.tool == NULL && r->status.arguments == NULL);
  CHECK_STR(r->status.command, "job-status \"$IDEM_KEY\"");
  CHECK_INT(r->n_exit_applied, 1); /* the lists not given keep defaults */
  CHECK_INT(r->n_exit_not_applied, 1);
  CHECK_INT(r->n_exit_rejected, 0); /* an empty list is allowed */

  r = rule(p, "email_status");
  CHECK_INT(r->cls, IDEM_CLASS_READ_ONLY);
  CHECK_INT(r->timeout_ms, 700);
  CHECK_INT(r->retries, 4);
  CHECK_INT(r->backoff_ms, 10);
  CHECK_INT(r->reconcile_timeout_ms, 700);

  r = rule(p, "list_inbox");
  CHECK_INT(r->cls, IDEM_CLASS_IDEMPOTENT);
  CHECK_INT(r->timeout_ms, 2000);
  CHECK_INT(r->retries, 5);
  CHECK_INT(r->backoff_ms, 1000);
  CHECK(r->key_arg == NULL && r->nfence == 0 && r->has_status == 0);
  idem_policy_free(p);
}

static void test_defaults(void) {
  idem__tool_rule d;
  idem_policy *p;
  const idem__tool_rule *r;
  idem__rule_defaults(&d, "anything");
  CHECK_STR(d.name, "anything");
  CHECK_INT(d.cls, IDEM_CLASS_GUARDED);
  check_defaults_except_class(&d);

  p = parse("{\"tools\": {\"t\": {\"class\": \"guarded\"}}}", IDEM_OK);
  if (!p) return;
  CHECK_INT(p->unknown_tools, IDEM_CLASS_REFUSED); /* the default */
  r = rule(p, "t");
  CHECK_INT(r->cls, IDEM_CLASS_GUARDED);
  check_defaults_except_class(r);
  idem_policy_free(p);

  /* reconcile_timeout_ms follows timeout_ms unless given */
  p = parse("{\"tools\": {\"t\": {\"class\": \"guarded\", \"timeout_ms\": "
            "5000}}}",
            IDEM_OK);
  if (p) CHECK_INT(rule(p, "t")->reconcile_timeout_ms, 5000);
  idem_policy_free(p);
  p = parse("{\"tools\": {\"t\": {\"class\": \"guarded\", "
            "\"reconcile_timeout_ms\": 7, \"timeout_ms\": 5000}}}",
            IDEM_OK);
  if (p) CHECK_INT(rule(p, "t")->reconcile_timeout_ms, 7);
  idem_policy_free(p);

  /* a note is any string, on a tool of any class, and changes nothing */
  p = parse("{\"tools\": {\"t\": {\"class\": \"guarded\", \"note\": "
            "\"add a status check\"}, \"r\": {\"class\": \"read_only\", "
            "\"note\": \"\"}, \"i\": {\"class\": \"idempotent\", "
            "\"note\": \"\\u00e9\"}}}",
            IDEM_OK);
  if (p) {
    check_defaults_except_class(rule(p, "t"));
    check_defaults_except_class(rule(p, "r"));
    CHECK_INT(rule(p, "i")->cls, IDEM_CLASS_IDEMPOTENT);
  }
  idem_policy_free(p);

  /* an empty tools object is a valid policy that names nothing */
  p = parse("{\"tools\": {}}", IDEM_OK);
  if (p) CHECK_INT(p->ntools, 0);
  idem_policy_free(p);
  /* the extremes of each range are accepted */
  p = parse("{\"tools\": {\"g\": {\"class\": \"guarded\", \"timeout_ms\": "
            "86400000, \"retries\": 100, \"backoff_ms\": 3600000, "
            "\"reconcile_timeout_ms\": 1, \"wait_ms\": 86400000, "
            "\"provider_dedupes\": true, \"provider_key_ttl_s\": 31536000, "
            "\"key_max_len\": 65536, \"repeat_window_s\": 31536000, "
            "\"retention_s\": 315360000, \"status\": {\"tool\": \"s\", "
            "\"applied_when\": {\"pointer\": \"\", \"equals\": null}}, "
            "\"exit_codes\": {\"applied\": [255], \"not_applied\": [], "
            "\"rejected\": [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}}, "
            "\"s\": {\"class\": \"read_only\", \"timeout_ms\": 1, "
            "\"retries\": 0, \"backoff_ms\": 0}}}",
            IDEM_OK);
  if (p) {
    r = rule(p, "g");
    CHECK_INT(r->key_max_len, 65536);
    CHECK_STR(r->status.pointer, "");
    CHECK_STR(r->status.equals, "null");
    CHECK_STR(r->status.arguments, "{}"); /* a status tool without them */
    CHECK_INT(r->n_exit_rejected, 16);
  }
  idem_policy_free(p);
}

static void test_rule_lookup(void) {
  static const struct {
    const char *unknown;
    int cls;
  } U[] = {{"", IDEM_CLASS_REFUSED},
           {"\"unknown_tools\": \"refuse\",", IDEM_CLASS_REFUSED},
           {"\"unknown_tools\": \"guard\",", IDEM_CLASS_GUARDED},
           {"\"unknown_tools\": \"pass\",", IDEM_CLASS_READ_ONLY}};
  idem__tool_rule scratch;
  const idem__tool_rule *r;
  size_t i;
  char text[512];
  for (i = 0; i < sizeof U / sizeof U[0]; i++) {
    idem_policy *p;
    snprintf(text, sizeof text,
             "{%s \"tools\": {\"m\": {\"class\": \"idempotent\", "
             "\"retries\": 9}, \"a\": {\"class\": \"read_only\"}, \"z\": "
             "{\"class\": \"guarded\", \"timeout_ms\": 5}}}",
             U[i].unknown);
    p = parse(text, IDEM_OK);
    if (!p) continue;
    r = idem__policy_rule(p, "m", &scratch);
    CHECK(r == &p->tools[1] && r->retries == 9);
    CHECK(idem__policy_rule(p, "a", &scratch) == &p->tools[0]);
    CHECK(idem__policy_rule(p, "z", &scratch) == &p->tools[2]);
    r = idem__policy_rule(p, "unnamed", &scratch);
    CHECK(r == &scratch);
    CHECK_INT(r->cls, U[i].cls);
    CHECK_STR(r->name, "unnamed");
    check_defaults_except_class(r);
    CHECK_INT(idem_policy_class(p, "unnamed"), U[i].cls);
    CHECK_INT(idem_policy_class(p, "n"), U[i].cls); /* between names */
    CHECK_INT(idem_policy_class(p, ""), U[i].cls);
    CHECK_INT(idem_policy_class(p, "zz"), U[i].cls);
    CHECK_INT(idem_policy_class(p, "m"), IDEM_CLASS_IDEMPOTENT);
    CHECK_INT(idem_policy_class(p, "z"), IDEM_CLASS_GUARDED);
    CHECK_INT(idem_policy_class(p, NULL), IDEM_CLASS_REFUSED);
    idem_policy_free(p);
  }
  /* no policy: every tool guarded with the defaults */
  r = idem__policy_rule(NULL, "refund", &scratch);
  CHECK(r == &scratch);
  CHECK_INT(r->cls, IDEM_CLASS_GUARDED);
  CHECK_STR(r->name, "refund");
  check_defaults_except_class(r);
  CHECK_INT(idem_policy_class(NULL, "refund"), IDEM_CLASS_GUARDED);
}

static void test_many_tools(void) {
  /* 300 tools in reverse order: sorted, and each found by binary search */
  size_t cap = 300 * 64 + 64, n = 0;
  char *text = malloc(cap), name[32];
  int i, found = 0;
  idem_policy *p;
  if (!text) return;
  n += (size_t)snprintf(text, cap, "{\"unknown_tools\":\"pass\",\"tools\":{");
  for (i = 299; i >= 0; i--)
    n += (size_t)snprintf(text + n, cap - n, "%s\"t%03d\":{\"class\":\"%s\"}",
                          i == 299 ? "" : ",", i,
                          i % 2 ? "guarded" : "idempotent");
  snprintf(text + n, cap - n, "}}");
  p = parse(text, IDEM_OK);
  if (p) {
    CHECK_INT(p->ntools, 300);
    for (i = 0; i < 300; i++) {
      snprintf(name, sizeof name, "t%03d", i);
      found += idem_policy_class(p, name) ==
               (i % 2 ? IDEM_CLASS_GUARDED : IDEM_CLASS_IDEMPOTENT);
    }
    CHECK_INT(found, 300);
    CHECK_INT(idem_policy_class(p, "t300"), IDEM_CLASS_READ_ONLY);
  }
  idem_policy_free(p);
  free(text);
}

static void expect_in(const char *text, const char *want) {
  if (text && strstr(text, want))
    check_passed++;
  else {
    check_failed++;
    fprintf(stderr, "explain: no \"%s\" in:\n%s\n", want,
            text ? text : "(null)");
  }
}

static void expect_not_in(const char *text, const char *unwanted) {
  if (text && !strstr(text, unwanted))
    check_passed++;
  else {
    check_failed++;
    fprintf(stderr, "explain: unwanted \"%s\" in:\n%s\n", unwanted,
            text ? text : "(null)");
  }
}

static char *explain(const idem_policy *p, const char *tool) {
  char *t = NULL;
  CHECK_INT(idem_policy_explain(p, tool, &t), IDEM_OK);
  CHECK(t != NULL);
  return t;
}

static void test_explain(void) {
  idem_policy *p = parse(SPEC_EXAMPLE, IDEM_OK), *f = parse(FULL, IDEM_OK);
  char *t;
  if (!p || !f) goto done;

  t = explain(p, "refund_payment");
  expect_in(t, "refund_payment is guarded");
  expect_in(t, "same session, the same tool-call id and the same canonical "
               "arguments");
  expect_in(t, "leaving out the argument \"idempotency_key\"");
  expect_in(t, "with a new call id, in the same session, with the same value "
               "of \"order_id\"");
  expect_in(t, "in flight, in doubt, or its outcome has not yet been told");
  expect_in(t, "255 characters");
  expect_in(t, "\"h:\"");
  expect_in(t, "8000 ms to answer");
  expect_in(t, "outcome unknown");
  expect_in(t, "deduplicates on the key for 86400 s (1 day)");
  expect_in(t, "up to 2 times");
  expect_in(t, "status tool get_refund_status");
  expect_in(t, "{\"order_id\":\"{order_id}\"}");
  expect_in(t, "the key appears as a string in its result");
  expect_in(t, "Reconciling gives up after 8000 ms");
  expect_in(t, "2000 ms");
  expect_in(t, "604800 s (7 days)");
  expect_not_in(t, "repeat_window_s");
  expect_in(t, "may still apply at any later time (settle_ms is not set)");
  expect_in(t, "runs again with the same key (the provider deduplicates it)");
  CHECK(t && !strstr(t, "\n\n\n") && t[strlen(t) - 1] == '\n');
  idem_free(t);

  { /* the key under a pointer: read back, and in words */
    idem_policy *q = parse(
        "{\"tools\":{\"a\":{\"class\":\"guarded\",\"status\":{\"tool\":"
        "\"s\",\"arguments\":{\"ref\":\"{$key}\"},\"applied_when\":"
        "{\"key_present\":true,\"pointer\":\"/data\"}}},"
        "\"s\":{\"class\":\"read_only\"}}}",
        IDEM_OK);
    if (q) {
      const idem__tool_rule *r = rule(q, "a");
      CHECK_INT(r->status.applied_when, IDEM__APPLIED_WHEN_KEY_AT);
      CHECK_STR(r->status.pointer, "/data");
      CHECK(r->status.equals == NULL);
      t = explain(q, "a");
      expect_in(t, "the key appears as a string in the value at \"/data\" "
                   "in its result");
      idem_free(t);
    }
    idem_policy_free(q);
  }

  { /* settle_ms (SPEC §6a), bounded and 0, in words */
    idem_policy *q = parse("{\"tools\":{\"a\":{\"class\":\"guarded\","
                           "\"settle_ms\":90000},\"b\":{\"class\":"
                           "\"guarded\",\"settle_ms\":0}}}",
                           IDEM_OK);
    if (q) {
      t = explain(q, "a");
      expect_in(t, "after a timeout or a crash this tool may still apply for "
                   "up to 90000 ms");
      expect_in(t, "until then a retry waits");
      idem_free(t);
      t = explain(q, "b");
      expect_in(t, "its effects end with its executor (settle_ms 0)");
      idem_free(t);
    }
    idem_policy_free(q);
  }

  t = explain(p, "get_refund_status");
  expect_in(t, "get_refund_status is read-only");
  expect_in(t, "records nothing");
  expect_in(t, "30000 ms to answer, and a failed attempt is retried up to 2 "
               "times, first after 200 ms");
  expect_in(t, "status check of refund_payment.");
  idem_free(t);

  t = explain(p, "delete_account");
  expect_in(t, "does not name delete_account");
  expect_in(t, "answered refused, and nothing runs");
  idem_free(t);

  t = explain(f, "send_email");
  expect_in(t, "in any session, with the same values of \"to\" and "
               "\"subject\"");
  expect_in(t, "within 600 s (10 minutes) of the earlier one "
               "(repeat_window_s)");
  expect_in(t, "longer than 66 characters");
  expect_in(t, "up to 0 times");
  expect_in(t, "1500 ms to answer");
  expect_in(t, "the value at \"/result/state\" in its result equals "
               "{\"code\":2,\"ok\":true}");
  expect_in(t, "Reconciling gives up after 9000 ms");
  expect_in(t, "exit status 0 or 3 means applied, 75 or 100 not applied");
  expect_in(t, "1, 2 or 64 rejected");
  expect_in(t, "86400 s (1 day)");
  idem_free(t);

  t = explain(f, "run_job");
  expect_in(t, "status command \"job-status \\\"$IDEM_KEY\\\"\"");
  expect_in(t, "not known to deduplicate");
  expect_in(t, "proves only that the attempt has not landed yet");
  expect_in(t, "no exit status rejected");
  idem_free(t);

  t = explain(f, "list_inbox");
  expect_in(t, "list_inbox is idempotent");
  expect_in(t, "2000 ms");
  expect_in(t, "retried up to 5 times, first after 1000 ms");
  idem_free(t);

  t = explain(f, "mystery"); /* unknown_tools: guard */
  expect_in(t, "does not name mystery, and it guards unknown tools with the "
               "default settings");
  expect_in(t, "mystery is guarded");
  expect_in(t, "30000 ms to answer");
  expect_in(t, "There is no status check");
  expect_in(t, "outcome_unknown");
  idem_free(t);

  t = explain(NULL, "anything");
  expect_in(t, "No policy is loaded");
  expect_in(t, "anything is guarded");
  idem_free(t);

  t = explain(f, "odd name\n\x1b[31m");
  expect_in(t, "\"odd name\\n\\u001b[31m\" is guarded"); /* quoted, safe */
  expect_not_in(t, "\x1b");
  expect_not_in(t, "\x1b");
  idem_free(t);
done:
  idem_policy_free(p);
  idem_policy_free(f);
  {
    idem_policy *pass =
        parse("{\"unknown_tools\": \"pass\", \"tools\": {}}", IDEM_OK);
    t = explain(pass, "lookup");
    expect_in(t, "lets pass unknown tools: lookup runs as a read-only tool");
    idem_free(t);
    idem_policy_free(pass);
  }
}

static void test_misuse(void) {
  idem_policy *p = (idem_policy *)1;
  char *t = (char *)1;
  CHECK_INT(idem_policy_parse("{}", 2, NULL, NULL), IDEM_MISUSE);
  CHECK_INT(idem_policy_load("x", NULL), IDEM_MISUSE);
  CHECK_INT(idem_policy_parse(NULL, 3, NULL, &p), IDEM_MISUSE);
  CHECK(p != NULL && idem_policy_errmsg(p)[0] != '\0');
  idem_policy_free(p);
  CHECK_INT(idem_policy_load(NULL, &p), IDEM_MISUSE);
  idem_policy_free(p);
  CHECK(idem_policy_errmsg(NULL) != NULL);
  idem_policy_free(NULL);
  idem_free(NULL);
  CHECK_INT(idem_policy_explain(NULL, "x", NULL), IDEM_MISUSE);
  CHECK_INT(idem_policy_explain(NULL, NULL, &t), IDEM_MISUSE);
  CHECK(t == NULL);

  /* a policy that failed to load: its message, nothing allowed, no
  ** explanation */
  p = parse("{\"tools\": {\"a\": {\"class\": \"guarded\", \"retries\": -1}}, "
            "\"unknown_tools\": \"guard\"}",
            IDEM_POLICY);
  if (p) {
    CHECK_STR(idem_policy_errmsg(p),
              "tools.a.retries: -1 is out of range (0 to 100)");
    CHECK_INT(p->ntools, 0);
    CHECK_INT(idem_policy_class(p, "a"), IDEM_CLASS_REFUSED);
    CHECK_INT(idem_policy_class(p, "b"), IDEM_CLASS_REFUSED);
    t = (char *)1;
    CHECK_INT(idem_policy_explain(p, "a", &t), IDEM_MISUSE);
    CHECK(t == NULL);
  }
  idem_policy_free(p);

  /* origin: named in syntax errors when given */
  p = parse("{", IDEM_POLICY);
  if (p)
    CHECK(strncmp(idem_policy_errmsg(p), "test: line 1, column ", 21) == 0);
  idem_policy_free(p);
  p = NULL;
  CHECK_INT(idem_policy_parse("{", 1, NULL, &p), IDEM_POLICY);
  if (p) CHECK(strncmp(idem_policy_errmsg(p), "line 1, column ", 15) == 0);
  idem_policy_free(p);
  /* a text that stops early: only its len bytes are read */
  p = NULL;
  CHECK_INT(idem_policy_parse("{\"tools\":{}}garbage", 12, "t", &p), IDEM_OK);
  idem_policy_free(p);
  /* NUL bytes and bad UTF-8 in the text */
  p = NULL;
  CHECK_INT(idem_policy_parse("{\"tools\":{}}\0", 13, "t", &p), IDEM_POLICY);
  idem_policy_free(p);
  p = NULL;
  CHECK_INT(idem_policy_parse("{\"tools\":{\"\xff\":{}}}", 17, "t", &p),
            IDEM_POLICY);
  if (p) CHECK(strchr(idem_policy_errmsg(p), '\xff') == NULL);
  idem_policy_free(p);
}

/* Messages stay one line of valid UTF-8, and long names are cut. */
static void test_messages(void) {
  char text[2048], name[700];
  idem_policy *p;
  const char *m;
  memset(name, 'n', 600);
  memcpy(name + 40, "\xe9\x80\x80", 3); /* a CJK character at the cut */
  name[600] = '\0';
  snprintf(text, sizeof text,
           "{\"tools\": {\"%s x\": {\"class\": \"guarded\", \"fence\": 1}}}",
           name);
  p = parse(text, IDEM_POLICY);
  if (!p) return;
  m = idem_policy_errmsg(p);
  CHECK(strlen(m) < 300);
  CHECK(strncmp(m, "tools[\"nnnn", 11) == 0);
  CHECK(strstr(m, "...\" (602 bytes)].fence: expected an array") != NULL);
  CHECK(strchr(m, '\n') == NULL);
  idem_policy_free(p);

  /* a very long field name: no suggestion, message cut cleanly */
  snprintf(text, sizeof text,
           "{\"tools\": {\"a\": {\"class\": \"guarded\", \"%s\": 1}}}", name);
  p = parse(text, IDEM_POLICY);
  if (p) {
    m = idem_policy_errmsg(p);
    CHECK(strncmp(m, "tools.a[\"nnn", 12) == 0);
    CHECK(strstr(m, ": unknown field") != NULL);
  }
  idem_policy_free(p);
}

/* Tool names that differ only in case or Unicode normalization: a warning
** naming both, for each pair; names cut at 64 bytes with their length. */
static void test_warnings(void) {
  char text[4096], name[700];
  idem_policy *p = parse(
      "{\"tools\": {\"Refund\": {\"class\": \"guarded\"},"
      " \"refund\": {\"class\": \"read_only\"},"
      " \"caf\xc3\xa9\": {\"class\": \"read_only\"}," /* NFC */
      " \"cafe\xcc\x81\": {\"class\": \"guarded\"}," /* NFD */
      " \"stra\xc3\x9f" "e\": {\"class\": \"guarded\"},"
      " \"STRASSE\": {\"class\": \"guarded\"},"
      " \"refunds\": {\"class\": \"guarded\"}}}",
      IDEM_OK);
  const char *w;
  if (p) {
    CHECK_INT(p->ntools, 7);
    w = idem_policy_warning(p, 0);
    CHECK(w && strstr(w, "tools: \"cafe\xcc\x81\" and \"caf\xc3\xa9\" "
                         "(\"cafe\\u0301\" and \"caf\\u00e9\") differ "
                         "only in case or Unicode normalization (NFC)"));
    w = idem_policy_warning(p, 1);
    CHECK(w && strstr(w, "tools: \"Refund\" and \"refund\" differ"));
    w = idem_policy_warning(p, 2);
    CHECK(w && strstr(w, "tools: \"STRASSE\" and \"stra\xc3\x9f"
                         "e\" (\"STRASSE\" and \"stra\\u00dfe\") differ"));
    CHECK(idem_policy_warning(p, 3) == NULL);
  }
  idem_policy_free(p);
  /* beyond the BMP, a character is escaped as a surrogate pair */
  p = parse("{\"tools\": {\"\xf0\x9d\x90\x80x\": {\"class\": \"guarded\"},"
            " \"\xf0\x9d\x90\x80X\": {\"class\": \"guarded\"}}}",
            IDEM_OK);
  w = idem_policy_warning(p, 0);
  CHECK(w && strstr(w, "(\"\\ud835\\udc00X\" and \"\\ud835\\udc00x\")"));
  idem_policy_free(p);
  /* none for distinct names, nor from a handle that is not a policy */
  p = parse(SPEC_EXAMPLE, IDEM_OK);
  CHECK(idem_policy_warning(p, 0) == NULL);
  idem_policy_free(p);
  CHECK(idem_policy_warning(NULL, 0) == NULL);
  /* long names are cut in the warning, and say how long they were */
  memset(name, 'n', 600);
  name[600] = '\0';
  snprintf(text, sizeof text,
           "{\"tools\": {\"%s\": {\"class\": \"guarded\"}, "
           "\"N%s\": {\"class\": \"guarded\"}}}",
           name, name + 1);
  p = parse(text, IDEM_OK);
  w = idem_policy_warning(p, 0);
  CHECK(w && strlen(w) < 400);
  CHECK(w && strstr(w, "tools: \"Nnnn"));
  CHECK(w && strstr(w, "nnn...\" (600 bytes) and \"nnnn"));
  CHECK(w && strstr(w, "nnn...\" (600 bytes) differ only"));
  idem_policy_free(p);
}

static int write_file(const char *path, const char *text, size_t n) {
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(text, 1, n, f) == n;
  if (f && fclose(f) != 0) ok = 0;
  return ok ? 0 : -1;
}

static void test_files(void) {
  char dir[] = "/tmp/idem-policy-XXXXXX", path[128], *big;
  idem_policy *p = NULL;
  size_t n = (16u << 20) + 10, i;
  if (!mkdtemp(dir)) {
    check_failed++;
    perror("mkdtemp");
    return;
  }
  snprintf(path, sizeof path, "%s/ok.json", dir);
  CHECK_INT(write_file(path, SPEC_EXAMPLE, strlen(SPEC_EXAMPLE)), 0);
  CHECK_INT(idem_policy_load(path, &p), IDEM_OK);
  CHECK_STR(idem_policy_errmsg(p), "");
  CHECK_INT(idem_policy_class(p, "refund_payment"), IDEM_CLASS_GUARDED);
  idem_policy_free(p);

  /* a syntax error names the file */
  snprintf(path, sizeof path, "%s/bad.json", dir);
  CHECK_INT(write_file(path, "{\n\"tools\": {},\n}", 16), 0);
  CHECK_INT(idem_policy_load(path, &p), IDEM_POLICY);
  CHECK(strncmp(idem_policy_errmsg(p), path, strlen(path)) == 0);
  CHECK(strstr(idem_policy_errmsg(p), ": line 3, column 1: ") != NULL);
  idem_policy_free(p);

  /* missing, a directory */
  snprintf(path, sizeof path, "%s/missing.json", dir);
  CHECK_INT(idem_policy_load(path, &p), IDEM_IO);
  CHECK(strncmp(idem_policy_errmsg(p), path, strlen(path)) == 0);
  CHECK(strstr(idem_policy_errmsg(p), "No such file") != NULL);
  idem_policy_free(p);
  CHECK_INT(idem_policy_load(dir, &p), IDEM_IO);
  CHECK(strstr(idem_policy_errmsg(p), "directory") != NULL);
  idem_policy_free(p);

  /* larger than 16 MiB: refused before parsing */
  big = malloc(n);
  if (big) {
    memset(big, ' ', n);
    memcpy(big, "{\"tools\":{}}", 12);
    snprintf(path, sizeof path, "%s/big.json", dir);
    CHECK_INT(write_file(path, big, n), 0);
    CHECK_INT(idem_policy_load(path, &p), IDEM_POLICY);
    CHECK(strstr(idem_policy_errmsg(p), "larger than the limit of 16777216 "
                                        "bytes") != NULL);
    idem_policy_free(p);
    /* exactly at the limit: read and parsed */
    CHECK_INT(write_file(path, big, 16u << 20), 0);
    CHECK_INT(idem_policy_load(path, &p), IDEM_OK);
    idem_policy_free(p);
    remove(path);
    free(big);
  }
  for (i = 0; i < 3; i++) {
    static const char *const names[] = {"ok.json", "bad.json", "big.json"};
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    remove(path);
  }
  rmdir(dir);
}

/* ---- failing allocations ----------------------------------------------------- */

static long fail_at = -1, allocs;

static void *count_malloc(size_t n) {
  if (allocs++ == fail_at) return NULL;
  return malloc(n);
}
static void *count_realloc(void *q, size_t n) {
  if (allocs++ == fail_at) return NULL;
  return realloc(q, n);
}

static void test_alloc_failures(void) {
  static const char *const texts[] = {SPEC_EXAMPLE, FULL};
  size_t k;
  for (k = 0; k < 2; k++) {
    long i;
    int done = 0, bad = 0;
    idem_set_alloc_funcs(count_malloc, count_realloc, free);
    for (i = 0; i < 10000 && !done; i++) {
      idem_policy *p = NULL;
      char *t = NULL;
      int rc;
      allocs = 0;
      fail_at = i;
      rc = idem_policy_parse(texts[k], strlen(texts[k]), "t", &p);
      if (rc == IDEM_OK) {
        size_t j;
        for (j = 0; j < p->ntools && rc == IDEM_OK; j++) {
          rc = idem_policy_explain(p, p->tools[j].name, &t);
          if (rc == IDEM_NOMEM && t != NULL) bad++;
          idem_free(t);
          t = NULL;
        }
        if (rc == IDEM_OK) done = allocs <= fail_at;
      } else if (rc != IDEM_NOMEM) {
        bad++;
        fprintf(stderr, "allocation %ld failed: %s (%s)\n", i,
                idem_status_name(rc), idem_policy_errmsg(p));
      } else if (p && strcmp(idem_policy_errmsg(p), "out of memory") != 0) {
        bad++;
      }
      idem_policy_free(p);
    }
    idem_set_alloc_funcs(NULL, NULL, NULL);
    fail_at = -1;
    CHECK_INT(bad, 0);
    CHECK(done); /* reached a run in which no allocation failed */
  }
}

/* ---- the data-driven cases ----------------------------------------------------- */

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  char *buf = NULL;
  long n;
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 &&
      fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) != NULL) {
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
      free(buf);
      buf = NULL;
    } else {
      buf[n] = '\0';
      *len = (size_t)n;
    }
  }
  fclose(f);
  return buf;
}

static int by_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void run_case(const char *dir, const char *file) {
  char path[1024], errpath[1024], origin[256];
  size_t len = 0, elen = 0, base = strlen(file) - 5, olen;
  char *text, *want;
  idem_policy *p = NULL, *q = NULL;
  int rc, rc2;
  snprintf(path, sizeof path, "%s/%s", dir, file);
  snprintf(errpath, sizeof errpath, "%s/%.*s.err", dir, (int)base, file);
  snprintf(origin, sizeof origin, "%s", file);
  text = slurp(path, &len);
  want = slurp(errpath, &elen);
  if (!text || !want) {
    check_failed++;
    fprintf(stderr, "%s: cannot read it or its .err\n", file);
    free(text);
    free(want);
    return;
  }
  want[strcspn(want, "\n")] = '\0';
  rc = idem_policy_parse(text, len, origin, &p);
  if (rc == IDEM_POLICY && want[0] &&
      strncmp(idem_policy_errmsg(p), want, strlen(want)) == 0 && p->ntools == 0)
    check_passed++;
  else {
    check_failed++;
    fprintf(stderr, "%s:\n  want: %s...\n  got:  %s (%s)\n", file, want,
            idem_policy_errmsg(p), idem_status_name(rc));
  }
  /* the same from the file, the path as origin */
  rc2 = idem_policy_load(path, &q);
  olen = strlen(origin);
  if (rc2 == rc && (strcmp(idem_policy_errmsg(q), idem_policy_errmsg(p)) == 0 ||
                    (strncmp(idem_policy_errmsg(p), origin, olen) == 0 &&
                     strncmp(idem_policy_errmsg(q), path, strlen(path)) == 0 &&
                     strcmp(idem_policy_errmsg(q) + strlen(path),
                            idem_policy_errmsg(p) + olen) == 0)))
    check_passed++;
  else {
    check_failed++;
    fprintf(stderr, "%s: load says %s: %s\n", file, idem_status_name(rc2),
            idem_policy_errmsg(q));
  }
  idem_policy_free(p);
  idem_policy_free(q);
  free(text);
  free(want);
}

static void test_cases(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char **names = NULL;
  size_t n = 0, cap = 0, i;
  if (!d) {
    check_failed++;
    perror(dir);
    return;
  }
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      names = realloc(names, cap * sizeof *names);
    }
    names[n] = malloc(len + 1);
    memcpy(names[n++], e->d_name, len + 1);
  }
  closedir(d);
  if (n) qsort(names, n, sizeof *names, by_str);
  for (i = 0; i < n; i++) {
    run_case(dir, names[i]);
    free(names[i]);
  }
  free(names);
  if (n < 30) {
    check_failed++;
    fprintf(stderr, "only %zu cases in %s\n", n, dir);
  }
}

/* HTTP tools: every field read back, and the defaults by class. */
static void test_http(void) {
  idem_policy *p = parse(
      "{\"tools\":{"
      " \"refund\": {\"class\": \"guarded\", \"status\": {\"tool\": \"list\"},"
      "  \"http\": {\"url\": \"https://pay.example/v1/refunds/{order_id}\","
      "   \"headers\": {\"Authorization\": \"Bearer {$env:PAY_KEY}\","
      "                \"X-Ref\": \"{$key}\"},"
      "   \"on_409\": \"not_applied\", \"on_5xx\": \"rejected\"}},"
      " \"cancel\": {\"class\": \"guarded\", \"http\": {\"method\": \"DELETE\","
      "  \"url\": \"http://x/orders/{id}\", \"key_header\": \"X-Request-Id\"}},"
      " \"patch\": {\"class\": \"guarded\", \"http\": {\"method\": \"PATCH\","
      "  \"url\": \"{$env:BASE}/orders\", \"body\": \"none\"}},"
      " \"list\": {\"class\": \"read_only\","
      "  \"http\": {\"url\": \"http://x/v1/refunds?order_id={order_id}\"}}}}",
      IDEM_OK);
  const idem__tool_rule *r = rule(p, "refund");
  CHECK_INT(r->has_http, 1);
  CHECK_STR(r->http.method, "POST");
  CHECK_STR(r->http.url, "https://pay.example/v1/refunds/{order_id}");
  CHECK_INT(r->http.send_body, 1);
  CHECK_STR(r->http.key_header, "Idempotency-Key");
  CHECK_INT((int)r->http.nheaders, 2);
  CHECK_STR(r->http.hname[0], "Authorization");
  CHECK_STR(r->http.hvalue[0], "Bearer {$env:PAY_KEY}");
  CHECK_STR(r->http.hname[1], "X-Ref");
  CHECK_INT(r->http.on_409, IDEM_OUTCOME_NOT_APPLIED);
  CHECK_INT(r->http.on_429, IDEM_OUTCOME_UNKNOWN);
  CHECK_INT(r->http.on_5xx, IDEM_OUTCOME_REJECTED);
  r = rule(p, "cancel");
  CHECK_STR(r->http.method, "DELETE");
  CHECK_INT(r->http.send_body, 0);
  CHECK_STR(r->http.key_header, "X-Request-Id");
  r = rule(p, "patch");
  CHECK_INT(r->http.send_body, 0);
  r = rule(p, "list");
  CHECK_STR(r->http.method, "GET");
  CHECK_INT(r->http.send_body, 0);
  CHECK(r->http.key_header == NULL);
  r = rule(p, "refund");
  CHECK_INT(rule(p, "list")->has_http, 1);
  CHECK_INT(r->has_status, 1);
  idem_policy_free(p);
}

/* Warnings: a guarded tool's retention shorter than an attempt may take to
** land (timeout_ms + settle_ms, 0 when unbounded), one line each, its
** name as in messages; none for a tool not guarded or kept long enough. */
static void test_retention_warnings(void) {
  idem_policy *p = parse(
      "{\"tools\": {\"a b\": {\"class\": \"guarded\", \"retention_s\": 2,"
      " \"timeout_ms\": 1500, \"settle_ms\": 600},"
      " \"c\": {\"class\": \"guarded\", \"retention_s\": 1,"
      " \"timeout_ms\": 1001},"
      " \"d\": {\"class\": \"guarded\", \"retention_s\": 1,"
      " \"timeout_ms\": 1000},"
      " \"e\": {\"class\": \"idempotent\", \"timeout_ms\": 90000}}}",
      IDEM_OK);
  CHECK_STR(idem_policy_warning(p, 0),
            "tools[\"a b\"].retention_s: 2 s is shorter than timeout_ms + "
            "settle_ms (2100 ms), the time an attempt may take to land: "
            "a call retried after waiting that long may find its record "
            "deleted by idem gc, and run again");
  CHECK_STR(idem_policy_warning(p, 1),
            "tools.c.retention_s: 1 s is shorter than timeout_ms + "
            "settle_ms (1001 ms), the time an attempt may take to land: "
            "a call retried after waiting that long may find its record "
            "deleted by idem gc, and run again");
  CHECK(idem_policy_warning(p, 2) == NULL);
  idem_policy_free(p);
  p = parse("{\"tools\": {}}", IDEM_OK);
  CHECK(idem_policy_warning(p, 0) == NULL);
  idem_policy_free(p);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_policy CASES_DIR\n");
    return 2;
  }
  test_spec_example();
  test_full();
  test_defaults();
  test_rule_lookup();
  test_many_tools();
  test_explain();
  test_misuse();
  test_warnings();
  test_messages();
  test_retention_warnings();
  test_files();
  test_alloc_failures();
  test_http();
  test_cases(argv[1]);
  return check_done();
}
