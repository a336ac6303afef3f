/*
** cmd_log.c - looking after the attempt log: idem ls, show, recover, gc,
** stats (SPEC §9).  Tables for people; --json for one JSON object per line.
*/
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <spawn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "run/run.h"

/* ---- the log ------------------------------------------------------------------ */

/* The log named (NULL: the default one), through a guard without a policy:
** what any C program that uses libidem would do. */
static idem_guard *open_log(const char *given) {
  idem_guard *g = NULL;
  if (idem_guard_open(given, NULL, &g) != IDEM_OK) {
    cli_err("%s", g ? idem_guard_errmsg(g) : "out of memory");
    idem_guard_close(g);
    return NULL;
  }
  return g;
}

/* ---- printing records ------------------------------------------------------------ */

/* Append the NUL-terminated s as it is (our own text); nonzero when out of
** memory. */
static int put_text(cli_outbuf *b, const char *s) {
  return cli_outbuf_str(b, s);
}

/* A record as one JSON object on its own line. */
static int print_json(const idem_record *r, idem_canon *c) {
  cli_jsonw w;
  cli_jsonw_init(&w, c, (size_t)1 << 30);
  cli_jsonw_open(&w);
  cli_jsonw_record(&w, r);
  cli_jsonw_close(&w);
  w.err |= cli_outbuf_put(&w.b, "\n", 1);
  if (!w.err) fwrite(w.b.p, 1, w.b.len, stdout);
  cli_outbuf_free(&w.b);
  return w.err;
}

typedef struct ls_ctx {
  int json, failed;
  size_t n;
  idem_canon *c;
} ls_ctx;

static int ls_row(void *arg, const idem_record *r) {
  ls_ctx *x = arg;
  char created[32], tail[64];
  cli_outbuf b;
  x->n++;
  if (x->json) return x->failed = print_json(r, x->c);
  cli_when(r->created, created, sizeof created);
  snprintf(tail, sizeof tail, " %-12s %3d  %s  ", idem_state_name(r->state),
           r->attempts, created);
  /* the ids and the key (which holds them) are the client's: shown */
  cli_outbuf_init(&b, (size_t)1 << 30);
  if (cli_text_cell(&b, r->session, 20) || put_text(&b, " ") ||
      cli_text_cell(&b, r->call_id, 20) || put_text(&b, " ") ||
      cli_text_cell(&b, r->tool, 18) || put_text(&b, tail) ||
      cli_text(&b, r->key, 0) || put_text(&b, "\n")) {
    cli_outbuf_free(&b);
    return x->failed = 1;
  }
  fwrite(b.p, 1, b.len, stdout);
  cli_outbuf_free(&b);
  return 0;
}

/* One line of `idem show`: the label, then v shown (cli_text). */
static int show_line(cli_outbuf *b, const char *label, const char *v,
                     int json) {
  char head[16];
  snprintf(head, sizeof head, "%-14s", label);
  return put_text(b, head) || cli_text(b, v, json) || put_text(b, "\n");
}

static int show_num(cli_outbuf *b, const char *label, long long v) {
  char num[32];
  snprintf(num, sizeof num, "%lld", v);
  return show_line(b, label, num, 0);
}

static int show_when(cli_outbuf *b, const char *label, long long ms) {
  char t[32];
  cli_when(ms, t, sizeof t);
  return show_line(b, label, t, 0);
}

/* The record for people; every text of it shown by cli_text. */
static int print_text(const idem_record *r) {
  cli_outbuf b;
  int rc;
  cli_outbuf_init(&b, (size_t)1 << 30);
  rc = show_line(&b, "session", r->session, 0) ||
       show_line(&b, "call", r->call_id, 0) ||
       show_line(&b, "tool", r->tool, 0) ||
       show_line(&b, "state", idem_state_name(r->state), 0) ||
       show_line(&b, "resolution", idem_resolution_name(r->resolution), 0) ||
       show_num(&b, "attempts", r->attempts) ||
       show_line(&b, "key", r->key, 0) ||
       show_line(&b, "fingerprint", r->fingerprint, 0) ||
       show_line(&b, "args", r->args, 1) ||
       show_line(&b, "result", r->result, 1) ||
       show_line(&b, "error", r->error, 0) ||
       show_line(&b, "turn", r->turn, 0) ||
       show_line(&b, "duplicate of", r->duplicate_of, 0) ||
       show_when(&b, "delivered", r->delivered) ||
       show_line(&b, "owner", r->owner, 0) ||
       show_when(&b, "lease until", r->lease_until) ||
       show_num(&b, "token", r->token) ||
       show_when(&b, "created", r->created) ||
       show_when(&b, "updated", r->updated) ||
       show_when(&b, "expires", r->expires) ||
       show_line(&b, "executor", r->executor, 0) ||
       show_num(&b, "pgid", r->pgid) ||
       show_when(&b, "settle from", r->settle_from) ||
       (r->resolved_by && (show_line(&b, "resolved by", r->resolved_by, 0) ||
                           show_when(&b, "resolved at", r->resolved_at))) ||
       (r->check_with && show_line(&b, "check with", r->check_with, 1)) ||
       (r->last_check && (show_line(&b, "last check", r->last_check, 0) ||
                          show_when(&b, "checked at", r->checked_at) ||
                          show_num(&b, "checks", r->checks)));
  if (!rc) fwrite(b.p, 1, b.len, stdout);
  cli_outbuf_free(&b);
  return rc;
}

/* ---- the verbs ------------------------------------------------------------------ */

#define LOG_OPTS                                                               \
  {"log", required_argument, NULL, 'L'}, {"json", no_argument, NULL, 'j'}, {   \
    "help", no_argument, NULL, 'h'                                             \
  }

static int bad_opt(const char *verb, int ch, char **argv) {
  if (ch == ':')
    return cli_usage(verb, "option '%s' needs a value", argv[optind - 1]);
  return cli_usage(verb, "no option '%s' for %s", argv[optind - 1], verb);
}

int cmd_ls(int argc, char **argv) {
  static const struct option opts[] = {
      LOG_OPTS,
      {"session", required_argument, NULL, 's'},
      {"state", required_argument, NULL, 'S'},
      {"limit", required_argument, NULL, 'n'},
      {"in-doubt", no_argument, NULL, 'D'},
      {NULL, 0, NULL, 0}};
  const char *log = NULL;
  idem_filter f = {.size = sizeof f};
  ls_ctx x = {0, 0, 0, NULL};
  idem_guard *g;
  int ch, rc, state;
  while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (ch) {
    case 'L': log = optarg; break;
    case 'j': x.json = 1; break;
    case 's': f.session = optarg; break;
    case 'D': f.recoverable = 1; break;
    case 'S':
      if (!(state = cli_state_by_name(optarg)))
        return cli_usage("ls", "no state '%s'", optarg);
      f.states |= 1u << state;
      break;
    case 'n':
      if (cli_parse_size("--limit", optarg, 1, SIZE_MAX, &f.limit))
        return EXIT_USAGE;
      break;
    case 'h': cli_print_usage(stdout, "ls"); return EXIT_OK;
    default: return bad_opt("ls", ch, argv);
    }
  }
  if (optind < argc) return cli_usage("ls", "too many arguments");
  if (idem_canon_open(&x.c) != IDEM_OK) {
    cli_err("out of memory");
    return EXIT_FAIL;
  }
  if (!(g = open_log(log))) {
    idem_canon_close(x.c);
    return EXIT_FAIL;
  }
  if (!x.json)
    printf("%-20s %-20s %-18s %-12s %3s  %-20s  %s\n", "SESSION", "CALL",
           "TOOL", "STATE", "TRY", "CREATED", "KEY");
  rc = idem_guard_list(g, &f, ls_row, &x);
  if (rc)
    cli_err("%s", idem_guard_errmsg(g));
  else if (x.failed)
    cli_err("out of memory");
  idem_guard_close(g);
  idem_canon_close(x.c);
  if (rc || x.failed) return EXIT_FAIL;
  return cli_flush();
}

int cmd_show(int argc, char **argv) {
  static const struct option opts[] = {LOG_OPTS, {NULL, 0, NULL, 0}};
  const char *log = NULL;
  idem_guard *g;
  idem_canon *c = NULL;
  idem_record *r = NULL;
  int ch, rc, json = 0;
  while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (ch) {
    case 'L': log = optarg; break;
    case 'j': json = 1; break;
    case 'h': cli_print_usage(stdout, "show"); return EXIT_OK;
    default: return bad_opt("show", ch, argv);
    }
  }
  if (argc - optind != 2)
    return cli_usage("show", "SESSION and CALL are required");
  if (!(g = open_log(log))) return EXIT_FAIL;
  rc = idem_guard_record(g, argv[optind], argv[optind + 1], &r);
  if (rc == IDEM_NOTFOUND) {
    cli_err("no record of call %s in session %s", argv[optind + 1],
            argv[optind]);
    idem_guard_close(g);
    return EXIT_FAIL;
  }
  if (rc) {
    cli_err("%s", idem_guard_errmsg(g));
    idem_guard_close(g);
    return EXIT_FAIL;
  }
  if (json ? idem_canon_open(&c) != IDEM_OK || print_json(r, c)
           : print_text(r)) {
    cli_err("out of memory");
    rc = EXIT_FAIL;
  }
  idem_canon_close(c);
  idem_record_free(r);
  idem_guard_close(g);
  if (rc) return rc;
  return cli_flush();
}

/* USER@HOST of whoever runs the command, for --by. */
static void whoami(char *buf, size_t n) {
  char host[256] = "localhost";
  const char *user = getenv("USER");
  if (!user || !*user) user = getenv("LOGNAME");
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
  host[sizeof host - 1] = '\0';
  snprintf(buf, n, "%s@%s", user && *user ? user : "uid", host);
}

int cmd_resolve(int argc, char **argv) {
  static const struct option opts[] = {
      LOG_OPTS,
      {"applied", no_argument, NULL, 'a'},
      {"not-applied", no_argument, NULL, 'N'},
      {"result", required_argument, NULL, 'r'},
      {"reason", required_argument, NULL, 'R'},
      {"by", required_argument, NULL, 'b'},
      {NULL, 0, NULL, 0}};
  const char *log = NULL, *result = NULL, *reason = NULL, *by = NULL;
  char me[300];
  idem_guard *g;
  idem_record *r = NULL;
  int ch, rc, outcome = 0, json = 0;
  while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (ch) {
    case 'L': log = optarg; break;
    case 'j': json = 1; break;
    case 'a':
    case 'N':
      if (outcome)
        return cli_usage("resolve", "give one of --applied and --not-applied");
      outcome = ch == 'a' ? IDEM_OUTCOME_APPLIED : IDEM_OUTCOME_NOT_APPLIED;
      break;
    case 'r': result = optarg; break;
    case 'R': reason = optarg; break;
    case 'b': by = optarg; break;
    case 'h': cli_print_usage(stdout, "resolve"); return EXIT_OK;
    default: return bad_opt("resolve", ch, argv);
    }
  }
  if (argc - optind != 2)
    return cli_usage("resolve", "SESSION and CALL are required");
  if (!outcome)
    return cli_usage("resolve", "give the verdict: --applied or --not-applied");
  if (outcome == IDEM_OUTCOME_NOT_APPLIED && (!reason || !*reason))
    return cli_usage("resolve", "--not-applied needs --reason TEXT (what the "
                                "provider said)");
  if (outcome == IDEM_OUTCOME_NOT_APPLIED && result)
    return cli_usage("resolve", "--result goes with --applied");
  if (by && !*by) return cli_usage("resolve", "--by is empty");
  if (!by) {
    whoami(me, sizeof me);
    by = me;
  }
  if (!(g = open_log(log))) return EXIT_FAIL;
  rc = idem_guard_resolve(g, argv[optind], argv[optind + 1], outcome, result,
                          result ? strlen(result) : 0, reason, by);
  if (rc == IDEM_INVALID) {
    cli_err("--result is not JSON text; nothing was changed");
    idem_guard_close(g);
    return EXIT_USAGE;
  }
  if (rc) {
    cli_err("%s", idem_guard_errmsg(g));
    idem_guard_close(g);
    return EXIT_FAIL;
  }
  rc = idem_guard_record(g, argv[optind], argv[optind + 1], &r);
  if (!rc && json) {
    idem_canon *c = NULL;
    if (idem_canon_open(&c) != IDEM_OK || print_json(r, c)) rc = EXIT_FAIL;
    idem_canon_close(c);
  } else if (!rc)
    rc = print_text(r) ? EXIT_FAIL : EXIT_OK;
  idem_record_free(r);
  idem_guard_close(g);
  if (rc) {
    cli_err("resolved, but the record could not be read back");
    return EXIT_FAIL;
  }
  return cli_flush();
}

int cmd_stats(int argc, char **argv) {
  static const struct option opts[] = {LOG_OPTS, {NULL, 0, NULL, 0}};
  const char *log = NULL;
  idem_stats st = {sizeof st, 0, {0}};
  idem_guard *g;
  int ch, json = 0, rc, i;
  while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (ch) {
    case 'L': log = optarg; break;
    case 'j': json = 1; break;
    case 'h': cli_print_usage(stdout, "stats"); return EXIT_OK;
    default: return bad_opt("stats", ch, argv);
    }
  }
  if (optind < argc) return cli_usage("stats", "too many arguments");
  if (!(g = open_log(log))) return EXIT_FAIL;
  rc = idem_guard_stats(g, &st);
  if (rc) {
    cli_err("%s", idem_guard_errmsg(g));
    idem_guard_close(g);
    return EXIT_FAIL;
  }
  if (json) {
    printf("{");
    for (i = IDEM_STATE_PENDING; i <= IDEM_STATE_DEDUPLICATED; i++)
      printf("\"%s\":%lld,", idem_state_name(i), st.by_state[i]);
    printf("\"total\":%lld}\n", st.records);
  } else {
    for (i = IDEM_STATE_PENDING; i <= IDEM_STATE_DEDUPLICATED; i++)
      printf("%-13s %lld\n", idem_state_name(i), st.by_state[i]);
    printf("%-13s %lld\n", "total", st.records);
  }
  idem_guard_close(g);
  return cli_flush();
}

int cmd_gc(int argc, char **argv) {
  static const struct option opts[] = {LOG_OPTS, {NULL, 0, NULL, 0}};
  const char *log = NULL;
  idem_guard *g;
  size_t n = 0;
  int ch, json = 0;
  while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (ch) {
    case 'L': log = optarg; break;
    case 'j': json = 1; break;
    case 'h': cli_print_usage(stdout, "gc"); return EXIT_OK;
    default: return bad_opt("gc", ch, argv);
    }
  }
  if (optind < argc) return cli_usage("gc", "too many arguments");
  if (!(g = open_log(log))) return EXIT_FAIL;
  if (idem_guard_gc(g, &n) != IDEM_OK) {
    cli_err("%s", idem_guard_errmsg(g));
    idem_guard_close(g);
    return EXIT_FAIL;
  }
  if (json)
    printf("{\"deleted\":%zu}\n", n);
  else
    printf("deleted %zu expired record%s\n", n, n == 1 ? "" : "s");
  idem_guard_close(g);
  return cli_flush();
}

/* ---- recover -------------------------------------------------------------------- */

/*
** recover lists the actions in doubt, then settles them on several worker
** threads at once (the log's group commit batches their writes).  A status
** check is either a command run once per record (sh -c CMD, IDEM_KEY in
** its environment, the arguments on stdin), or with --batch one process
** per worker that answers a stream of requests - the way to settle a large
** backlog, since starting a process costs a millisecond:
**
**   request  (one line) {"session":S,"call_id":C,"tool":T,"key":K,"args":{...}}
**   answer   (one line)  applied [RESULT-JSON] | not_applied | unknown
*/

typedef struct doubt {
  char *session, *call_id;
  char *tool, *key, *args; /* for --batch */
  long long token;
  int outcome;  /* --batch: the check's answer */
  char *result; /* --batch: its result, or NULL */
} doubt;

typedef struct recover_job {
  idem_guard *g;
  const idem_policy *policy;
  const char *status; /* --status CMD, or NULL for the policy's */
  int batch;
  doubt *v;
  size_t n;
  pthread_mutex_t mu;
  size_t next; /* the next record to take */
  size_t applied, not_applied, unknown, errors;
  char err[512];
} recover_job;

/* The actions in doubt, as idem_guard_list() gives them. */
typedef struct doubts {
  doubt *v;
  size_t n, cap;
  int failed; /* memory ran out */
} doubts;

static int collect(void *arg, const idem_record *r) {
  doubts *d = arg;
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 256;
    doubt *v = realloc(d->v, cap * sizeof *v);
    if (!v) return d->failed = 1;
    d->v = v;
    d->cap = cap;
  }
  memset(&d->v[d->n], 0, sizeof d->v[d->n]);
  d->v[d->n].session = strdup(r->session);
  d->v[d->n].call_id = strdup(r->call_id);
  d->v[d->n].tool = strdup(r->tool);
  d->v[d->n].key = strdup(r->key);
  d->v[d->n].args = strdup(r->args);
  d->v[d->n].token = r->token;
  d->n++; /* counted even when incomplete, so that it is freed */
  if (!d->v[d->n - 1].session || !d->v[d->n - 1].call_id ||
      !d->v[d->n - 1].tool || !d->v[d->n - 1].key || !d->v[d->n - 1].args)
    return d->failed = 1;
  return 0;
}

/* A --batch status process: one per worker. */
typedef struct batch_proc {
  pid_t pid;
  FILE *in, *out;
  idem_canon *c; /* the requests' strings */
} batch_proc;

static int batch_start(batch_proc *b, const char *cmd) {
  int to[2], from[2];
  posix_spawn_file_actions_t fa;
  char *argv[] = {(char *)"sh", (char *)"-c", (char *)cmd, NULL};
  extern char **environ;
  memset(b, 0, sizeof *b);
  if (pipe2(to, O_CLOEXEC) || pipe2(from, O_CLOEXEC)) return -1;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from[1], 1);
  errno = posix_spawn(&b->pid, "/bin/sh", &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(to[0]);
  close(from[1]);
  if (errno) {
    close(to[1]);
    close(from[0]);
    return -1;
  }
  b->in = fdopen(to[1], "w");
  b->out = fdopen(from[0], "r");
  return b->in && b->out && idem_canon_open(&b->c) == IDEM_OK ? 0 : -1;
}

static void batch_stop(batch_proc *b) {
  int st;
  if (b->in) fclose(b->in);
  if (b->out) fclose(b->out);
  idem_canon_close(b->c);
  if (b->pid > 0) waitpid(b->pid, &st, 0);
}

/* One request of the batch protocol, as one line into q (reset first), its
** strings made with c; nonzero when memory ran out. */
static int batch_request(cli_outbuf *q, idem_canon *c, const doubt *d,
                         const char *key, const char *args, size_t args_len) {
  q->len = 0;
  return cli_outbuf_str(q, "{\"session\":") ||
         cli_outbuf_json(q, c, d->session) ||
         cli_outbuf_str(q, ",\"call_id\":") ||
         cli_outbuf_json(q, c, d->call_id) || cli_outbuf_str(q, ",\"tool\":") ||
         cli_outbuf_json(q, c, d->tool) || cli_outbuf_str(q, ",\"key\":") ||
         cli_outbuf_json(q, c, key) || cli_outbuf_str(q, ",\"args\":") ||
         cli_outbuf_put(q, args, args_len) || cli_outbuf_put(q, "}\n", 2);
}

/* One answer line of the batch protocol: the outcome, and *result (malloc)
** when "applied" carries one. */
static int batch_answer(char *line, char **result) {
  *result = NULL;
  line[strcspn(line, "\r\n")] = '\0';
  if (strncmp(line, "applied", 7) == 0 && (!line[7] || line[7] == ' ')) {
    if (line[7] == ' ') *result = strdup(line + 8);
    return IDEM_OUTCOME_APPLIED;
  }
  if (strcmp(line, "not_applied") == 0) return IDEM_OUTCOME_NOT_APPLIED;
  return IDEM_OUTCOME_UNKNOWN;
}

/* Ask the worker's status process about one record, in lockstep. */
static int check_batch(batch_proc *b, idem_step *s, const doubt *d,
                       char **result) {
  char line[1 << 16];
  size_t tlen;
  cli_outbuf q;
  const char *target = idem_step_check_target(s, &tlen);
  int outcome = IDEM_OUTCOME_UNKNOWN;
  *result = NULL;
  cli_outbuf_init(&q, (size_t)64 << 20);
  if (!batch_request(&q, b->c, d, idem_step_check_key(s), target, tlen) &&
      fwrite(q.p, 1, q.len, b->in) == q.len && fflush(b->in) == 0 &&
      fgets(line, sizeof line, b->out))
    outcome = batch_answer(line, result);
  cli_outbuf_free(&q);
  return outcome;
}

/* ---- --batch: a stream of checks, then the settling on many threads ------ */

typedef struct feed {
  FILE *in;
  doubt *v;
  size_t n;
} feed;

/* Write every request to the status process (its own thread, so that the
** answers can be read while requests are still going out). */
static void *feed_main(void *arg) {
  feed *f = arg;
  cli_outbuf q;
  idem_canon *c = NULL;
  size_t i;
  cli_outbuf_init(&q, (size_t)64 << 20);
  for (i = 0; i < f->n && (c || idem_canon_open(&c) == IDEM_OK); i++) {
    const doubt *d = &f->v[i];
    if (batch_request(&q, c, d, d->key, d->args, strlen(d->args)) ||
        fwrite(q.p, 1, q.len, f->in) != q.len)
      break; /* the answers that do not come stay unknown */
  }
  idem_canon_close(c);
  cli_outbuf_free(&q);
  fclose(f->in); /* end of requests */
  f->in = NULL;
  return NULL;
}

static int recover_stream(recover_job *j) {
  batch_proc b;
  feed f;
  pthread_t th;
  char line[1 << 16];
  size_t i, k;
  if (batch_start(&b, j->status) != 0) {
    cli_err("cannot start the status command: %s", strerror(errno));
    return -1;
  }
  f.in = b.in;
  f.v = j->v;
  f.n = j->n;
  b.in = NULL;
  if (pthread_create(&th, NULL, feed_main, &f) != 0) {
    fclose(f.in);
    batch_stop(&b);
    return -1;
  }
  for (i = 0; i < j->n; i++) {
    doubt *d = &j->v[i];
    d->outcome = IDEM_OUTCOME_UNKNOWN;
    if (!fgets(line, sizeof line, b.out)) break; /* the check ended early */
    d->outcome = batch_answer(line, &d->result);
  }
  pthread_join(th, NULL);
  batch_stop(&b);
  /* settle in chunks, each in few transactions */
  for (i = 0; i < j->n; i += 8192) {
    size_t m = j->n - i < 8192 ? j->n - i : 8192;
    idem_settlement *sv = calloc(m, sizeof *sv);
    if (!sv) {
      cli_err("out of memory");
      return -1;
    }
    for (k = 0; k < m; k++) {
      doubt *d = &j->v[i + k];
      sv[k].size = sizeof sv[k];
      sv[k].session = d->session;
      sv[k].call_id = d->call_id;
      sv[k].token = d->token;
      sv[k].outcome = d->outcome;
      sv[k].result = d->result;
      sv[k].result_len = d->result ? strlen(d->result) : 0;
    }
    if (idem_guard_settle_many(j->g, sv, m) != IDEM_OK) {
      j->errors++;
      snprintf(j->err, sizeof j->err, "%s", idem_guard_errmsg(j->g));
    }
    for (k = 0; k < m; k++) {
      if (sv[k].rc == IDEM_STALE || sv[k].outcome == IDEM_OUTCOME_UNKNOWN)
        j->unknown++; /* still open, or settled by someone else meanwhile */
      else if (sv[k].rc)
        j->errors++;
      else if (sv[k].outcome == IDEM_OUTCOME_APPLIED)
        j->applied++;
      else
        j->not_applied++;
    }
    free(sv);
  }
  return 0;
}

static void *recover_worker(void *arg) {
  recover_job *j = arg;
  batch_proc b = {0, NULL, NULL, NULL};
  int have_batch = 0;
  for (;;) {
    idem_step *s = NULL;
    char *result = NULL;
    const char *cmd;
    size_t i;
    int rc, outcome, ans;
    pthread_mutex_lock(&j->mu);
    i = j->next++;
    pthread_mutex_unlock(&j->mu);
    if (i >= j->n) break;
    rc = idem_guard_recover(j->g, j->v[i].session, j->v[i].call_id, &s);
    if (rc == IDEM_NOTFOUND) continue; /* collected away meanwhile */
    if (rc == IDEM_OK && idem_step_next(s) == IDEM_NEXT_CHECK) {
      cmd = j->status ? j->status : idem_step_check_command(s);
      outcome = IDEM_OUTCOME_UNKNOWN;
      if (cmd && j->batch) {
        if (!have_batch && batch_start(&b, cmd) == 0) have_batch = 1;
        if (have_batch) outcome = check_batch(&b, s, &j->v[i], &result);
      } else {
        outcome = cli_check(j->policy, s, cmd, j->v[i].session, j->v[i].call_id,
                            j->v[i].tool, &result);
      }
      rc = cli_resolve(s, outcome, result);
      free(result);
    }
    ans = idem_step_answer(s);
    pthread_mutex_lock(&j->mu);
    if (rc) {
      j->errors++;
      snprintf(j->err, sizeof j->err, "%s", idem_guard_errmsg(j->g));
    } else if (ans == IDEM_ANSWER_SUCCEEDED)
      j->applied++;
    else if (ans == IDEM_ANSWER_FAILED)
      j->not_applied++;
    else
      j->unknown++;
    pthread_mutex_unlock(&j->mu);
    idem_step_free(s);
  }
  if (have_batch) batch_stop(&b);
  return NULL;
}

int cmd_recover(int argc, char **argv) {
  static const struct option opts[] = {
      LOG_OPTS,
      {"policy", required_argument, NULL, 'p'},
      {"status", required_argument, NULL, 'S'},
      {"batch", no_argument, NULL, 'b'},
      {"workers", required_argument, NULL, 'w'},
      {NULL, 0, NULL, 0}};
  const char *log = NULL, *policy_path = NULL;
  idem_policy *policy = NULL;
  /* the recoverable ones */
  idem_filter f = {.size = sizeof f, .recoverable = 1};
  doubts d = {NULL, 0, 0, 0};
  recover_job j;
  pthread_t th[64];
  size_t i, workers = 8;
  int ch, json = 0, rc = EXIT_OK, k, started = 0;
  memset(&j, 0, sizeof j);
  while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (ch) {
    case 'L': log = optarg; break;
    case 'j': json = 1; break;
    case 'p': policy_path = optarg; break;
    case 'S': j.status = optarg; break;
    case 'b': j.batch = 1; break;
    case 'w':
      if (cli_parse_size("--workers", optarg, 1, 64, &workers))
        return EXIT_USAGE;
      break;
    case 'h': cli_print_usage(stdout, "recover"); return EXIT_OK;
    default: return bad_opt("recover", ch, argv);
    }
  }
  if (optind < argc) return cli_usage("recover", "too many arguments");
  if (policy_path && idem_policy_load(policy_path, &policy) != IDEM_OK) {
    cli_err("%s: %s", policy_path,
            policy ? idem_policy_errmsg(policy) : "out of memory");
    idem_policy_free(policy);
    return EXIT_DATA;
  }
  if (idem_guard_open(log, policy, &j.g) != IDEM_OK) {
    cli_err("%s", j.g ? idem_guard_errmsg(j.g) : "out of memory");
    rc = EXIT_FAIL;
  } else if (idem_guard_list(j.g, &f, collect, &d) != IDEM_OK || d.failed) {
    cli_err("%s", d.failed ? "out of memory" : idem_guard_errmsg(j.g));
    rc = EXIT_FAIL;
  }
  if (rc == EXIT_OK) {
    j.policy = policy;
    j.v = d.v;
    j.n = d.n;
    pthread_mutex_init(&j.mu, NULL);
    if (j.batch && j.status) {
      if (recover_stream(&j) != 0) rc = EXIT_FAIL;
    } else {
      if (workers > d.n) workers = d.n ? d.n : 1;
      for (k = 1; k < (int)workers; k++)
        if (pthread_create(&th[k], NULL, recover_worker, &j) != 0) break;
      started = k;
      recover_worker(&j);
      for (k = 1; k < started; k++) pthread_join(th[k], NULL);
    }
    pthread_mutex_destroy(&j.mu);
    if (j.errors) {
      cli_err("%zu record%s could not be settled: %s", j.errors,
              j.errors == 1 ? "" : "s", j.err);
      rc = EXIT_FAIL;
    }
  }
  for (i = 0; i < d.n; i++) {
    free(d.v[i].session);
    free(d.v[i].call_id);
    free(d.v[i].tool);
    free(d.v[i].key);
    free(d.v[i].args);
    free(d.v[i].result);
  }
  free(d.v);
  idem_guard_close(j.g);
  idem_policy_free(policy);
  if (json)
    printf("{\"applied\":%zu,\"not_applied\":%zu,\"unknown\":%zu}\n", j.applied,
           j.not_applied, j.unknown);
  else
    printf("recovered: %zu applied, %zu not applied, %zu still unknown\n",
           j.applied, j.not_applied, j.unknown);
  if (cli_flush() != EXIT_OK) return EXIT_FAIL;
  return rc;
}
