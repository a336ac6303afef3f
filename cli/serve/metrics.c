/*
** metrics.c - /metrics of `idem serve`, in Prometheus text format 0.0.4
** (docs/CONSOLE.md, "Metrics").  Two sources, named apart:
**
**   idem_actions, idem_in_doubt*, idem_log_*   the log at each scrape:
**       one pass (idem_guard_tally), and the pending actions whose holder
**       is gone (in doubt too, as the page lists them).  Every process's
**       calls, as long as their records are kept; gauges, since gc removes
**       records.
**   idem_process_*, idem_guard_latency_seconds   this process's guards
**       (idem_metrics_read), counters since it started: what the log
**       cannot know, a replay writes nothing.  A console that only serves
**       counts its own verdicts; run the console in the process that
**       serves the calls to see theirs.
**   idem_mcp_*   what the MCP gateway of this process (idem mcp --console)
**       said of its server's tools (notes.c); 0 in idem serve.
*/
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

typedef struct tally_sum {
  cli_outbuf *b;
  int err;
  /* per tool, summed over states, as the rows of one tool come together */
  char *tool;
  long long attempts, checks, late, dedup, verdicts;
  long long in_doubt, oldest; /* over all tools */
  cli_outbuf fam[5];          /* the idem_log_* families, each whole */
} tally_sum;

static const char *const fam_name[5] = {"attempts", "status_checks",
                                        "late_results", "deduplicated",
                                        "operator_verdicts"};
static const char *const fam_help[5] = {
    "Downstream attempts of the log's actions.",
    "Status checks run on the log's actions.",
    "Actions settled by a late result.",
    "Calls answered as another action's repeat (fenced or coalesced).",
    "Actions settled by an operator."};

/* Append a label value, escaped as the format asks (\\, \", \n). */
static int put_label(cli_outbuf *b, const char *v) {
  int err = 0;
  for (; *v && !err; v++) {
    if (*v == '\\' || *v == '"')
      err = cli_outbuf_put(b, "\\", 1) || cli_outbuf_put(b, v, 1);
    else if (*v == '\n')
      err = cli_outbuf_put(b, "\\n", 2);
    else
      err = cli_outbuf_put(b, v, 1);
  }
  return err;
}

static int putf(cli_outbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static int putf(cli_outbuf *b, const char *fmt, ...) {
  va_list ap;
  int n;
  va_start(ap, fmt);
  n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || cli_outbuf_reserve(b, (size_t)n + 1)) return 1;
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return 0;
}

static void flush_tool(tally_sum *t) {
  long long v[] = {t->attempts, t->checks, t->late, t->dedup, t->verdicts};
  size_t i;
  if (!t->tool) return;
  for (i = 0; i < 5; i++)
    t->err |= putf(&t->fam[i], "idem_log_%s{tool=\"", fam_name[i]) ||
              put_label(&t->fam[i], t->tool) ||
              putf(&t->fam[i], "\"} %lld\n", v[i]);
  free(t->tool);
  t->tool = NULL;
  t->attempts = t->checks = t->late = t->dedup = t->verdicts = 0;
}

/* n more actions in doubt, the oldest of them created then. */
static void count_doubt(tally_sum *t, long long n, long long created) {
  t->in_doubt += n;
  if (!t->oldest || created < t->oldest) t->oldest = created;
}

static int tally_row(void *ctx, const idem_tally *r) {
  tally_sum *t = ctx;
  if (!t->tool || strcmp(t->tool, r->tool) != 0) {
    flush_tool(t);
    if (!(t->tool = strdup(r->tool))) return t->err = 1;
  }
  t->attempts += r->attempts;
  t->checks += r->checks;
  if (r->resolution == IDEM_RESOLVED_LATE) t->late += r->records;
  if (r->resolution == IDEM_RESOLVED_OPERATOR) t->verdicts += r->records;
  if (r->state == IDEM_STATE_DEDUPLICATED) t->dedup += r->records;
  if (r->state == IDEM_STATE_IN_DOUBT) count_doubt(t, r->records, r->oldest);
  t->err |= putf(t->b, "idem_actions{tool=\"") || put_label(t->b, r->tool) ||
            putf(t->b, "\",state=\"%s\",resolution=\"%s\"} %lld\n",
                 idem_state_name(r->state),
                 idem_resolution_name(r->resolution), r->records);
  return t->err;
}

/* A pending action whose holder is gone or whose lease ran out: in doubt
** as the page lists it (idem_filter.recoverable), though its state is
** still pending.  Pending actions are the few in flight. */
static int stranded(void *ctx, const idem_record *r) {
  count_doubt(ctx, 1, r->created);
  return 0;
}

/* The log's part; nonzero when it could not be read (msg says why). */
static int log_part(serve *s, cli_outbuf *b, long long now) {
  tally_sum t;
  int rc, i;
  memset(&t, 0, sizeof t);
  t.b = b;
  for (i = 0; i < 5; i++) cli_outbuf_init(&t.fam[i], (size_t)1 << 28);
  t.err |= putf(b, "# HELP idem_actions Actions in the attempt log.\n"
                   "# TYPE idem_actions gauge\n");
  rc = idem_guard_tally(s->g, tally_row, &t);
  flush_tool(&t);
  if (rc == IDEM_OK) {
    idem_filter f;
    memset(&f, 0, sizeof f);
    f.size = sizeof f;
    f.states = 1u << IDEM_STATE_PENDING;
    f.recoverable = 1;
    rc = idem_guard_list(s->g, &f, stranded, &t);
  }
  t.err |= putf(b, "# HELP idem_in_doubt Actions in doubt now: waiting for "
                   "a status check, a late result, settle_ms or a person.\n"
                   "# TYPE idem_in_doubt gauge\n"
                   "idem_in_doubt %lld\n",
                t.in_doubt) ||
           putf(b, "# HELP idem_in_doubt_oldest_age_seconds How long the "
                   "oldest action in doubt has been (0: none).\n"
                   "# TYPE idem_in_doubt_oldest_age_seconds gauge\n"
                   "idem_in_doubt_oldest_age_seconds %.3f\n",
                t.oldest && now > t.oldest ? (double)(now - t.oldest) / 1000
                                           : 0.0);
  for (i = 0; i < 5; i++) {
    t.err |= putf(b, "# HELP idem_log_%s %s\n# TYPE idem_log_%s gauge\n",
                  fam_name[i], fam_help[i], fam_name[i]) ||
             (t.fam[i].len && cli_outbuf_put(b, t.fam[i].p, t.fam[i].len));
    cli_outbuf_free(&t.fam[i]);
  }
  free(t.tool);
  return rc != IDEM_OK ? -1 : t.err ? 1 : 0;
}

static int counter(cli_outbuf *b, const char *name, const char *help,
                   long long v) {
  return putf(b, "# HELP %s %s\n# TYPE %s counter\n%s %lld\n", name, help,
              name, name, v);
}

/* This process's part. */
static int process_part(cli_outbuf *b) {
  static const char *const outcomes[] = {NULL, "applied", "rejected",
                                         "not_applied", "unknown"};
  idem_metrics m;
  int err = 0, i;
  memset(&m, 0, sizeof m);
  m.size = sizeof m;
  if (idem_metrics_read(&m) != IDEM_OK) return 1;
  err |= putf(b, "# HELP idem_process_answers_total Guarded calls answered "
                 "by this process, by answer.\n"
                 "# TYPE idem_process_answers_total counter\n");
  for (i = IDEM_ANSWER_SUCCEEDED; i <= IDEM_ANSWER_INVALID_ARGUMENTS; i++)
    err |= putf(b, "idem_process_answers_total{answer=\"%s\"} %lld\n",
                idem_answer_name(i), m.answers[i]);
  err |= counter(b, "idem_process_replays_total",
                 "Answers replayed from the log, not run.", m.replays) ||
         counter(b, "idem_process_fenced_total",
                 "New calls held back as another action's repeat.",
                 m.fenced) ||
         counter(b, "idem_process_coalesced_total",
                 "Of those, calls of the same model turn.", m.coalesced) ||
         counter(b, "idem_process_attempts_total",
                 "Downstream attempts started.", m.attempts) ||
         counter(b, "idem_process_late_results_total",
                 "Late results recorded.", m.late) ||
         counter(b, "idem_process_verdicts_total",
                 "Operators' verdicts recorded.", m.resolved);
  err |= putf(b, "# HELP idem_process_status_checks_total Status checks, "
                 "by answer.\n"
                 "# TYPE idem_process_status_checks_total counter\n");
  for (i = IDEM_OUTCOME_APPLIED; i <= IDEM_OUTCOME_UNKNOWN; i++)
    err |= putf(b, "idem_process_status_checks_total{answer=\"%s\"} %lld\n",
                outcomes[i], m.checks[i]);
  err |= putf(b, "# HELP idem_guard_latency_seconds From a call's begin to "
                 "its answer, in this process.\n"
                 "# TYPE idem_guard_latency_seconds histogram\n");
  for (i = 0; i < IDEM_LATENCY_BUCKETS && idem_latency_bound_us(i) >= 0; i++)
    err |= putf(b, "idem_guard_latency_seconds_bucket{le=\"%g\"} %lld\n",
                (double)idem_latency_bound_us(i) / 1e6, m.latency_le[i]);
  err |= putf(b,
              "idem_guard_latency_seconds_bucket{le=\"+Inf\"} %lld\n"
              "idem_guard_latency_seconds_sum %.6f\n"
              "idem_guard_latency_seconds_count %lld\n",
              m.latency_count, (double)m.latency_sum_us / 1e6,
              m.latency_count);
  return err;
}

/* The MCP gateway's part. */
static int mcp_part(cli_outbuf *b) {
  long long unnamed, changed;
  serve_notes_count(&unnamed, &changed);
  return putf(b,
              "# HELP idem_mcp_tools_unnamed Tools the server listed that "
              "the policy does not name (classed from their annotations).\n"
              "# TYPE idem_mcp_tools_unnamed gauge\n"
              "idem_mcp_tools_unnamed %lld\n",
              unnamed) ||
         counter(b, "idem_mcp_tool_annotation_changes_total",
                 "Changes of a tool's annotations between tools/list "
                 "answers, each counted once.",
                 changed);
}

void serve_metrics(serve *s, serve_reply *out) {
  cli_outbuf b;
  int rc;
  cli_outbuf_init(&b, (size_t)1 << 30);
  rc = log_part(s, &b, cli_wall_ms());
  if (rc < 0) {
    cli_outbuf_free(&b);
    serve_error(out, 500, "reading the log: %s", idem_guard_errmsg(s->g));
    return;
  }
  if (rc || process_part(&b) || mcp_part(&b) || !b.p) {
    cli_outbuf_free(&b);
    serve_error(out, 500, "out of memory");
    return;
  }
  out->status = 200;
  out->type = "text/plain; version=0.0.4; charset=utf-8";
  out->body = b.p;
  out->len = b.len;
}
