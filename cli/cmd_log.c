/*
** cmd_log.c - looking after the attempt log: idem ls, show, recover, gc,
** stats (SPEC §9).  Tables for people; --json for one JSON object per line.
*/
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "idemInt.h"

/* ---- the log ------------------------------------------------------------------ */

static const char *log_url(const char *given, char *buf, size_t n) {
  return given ? given : idem__default_log(buf, n);
}

static idem__store *open_store(const char *given) {
  char buf[4200];
  const char *url = log_url(given, buf, sizeof buf);
  idem__store *st = NULL;
  if (idem__store_open(url, &st) != IDEM_OK) {
    cli_err("%s", st ? st->vt->errmsg(st) : "out of memory");
    if (st) st->vt->close(st);
    return NULL;
  }
  return st;
}

static int state_by_name(const char *name) {
  for (int i = IDEM_STATE_PENDING; i <= IDEM_STATE_DEDUPLICATED; i++)
    if (strcmp(idem_state_name(i), name) == 0) return i;
  return 0;
}

/* ---- printing records ------------------------------------------------------------ */

static void put_str(idem__buf *b, const char *k, const char *v, int *first) {
  size_t bad;
  idem__buf_append(b, *first ? "{\"" : ",\"", 2);
  *first = 0;
  idem__buf_append(b, k, strlen(k));
  idem__buf_append(b, "\":", 2);
  if (!v || idem__canon_string(b, v, strlen(v), &bad) != IDEM_OK)
    idem__buf_append(b, "null", 4);
}

static void put_raw(idem__buf *b, const char *k, const char *v, int *first) {
  idem__buf_append(b, *first ? "{\"" : ",\"", 2);
  *first = 0;
  idem__buf_append(b, k, strlen(k));
  idem__buf_append(b, "\":", 2);
  idem__buf_append(b, v ? v : "null", strlen(v ? v : "null"));
}

static void put_num(idem__buf *b, const char *k, long long v, int *first) {
  char num[32];
  snprintf(num, sizeof num, "%lld", v);
  put_raw(b, k, num, first);
}

/* Append the NUL-terminated s as it is (our own text); nonzero when out of
** memory. */
static int put_text(idem__buf *b, const char *s) {
  return idem__buf_append(b, s, strlen(s)) != IDEM_OK;
}

static void print_json(const idem_record *r) {
  idem__buf b;
  int first = 1;
  idem__buf_init(&b, (size_t)1 << 30);
  put_str(&b, "session", r->session, &first);
  put_str(&b, "call_id", r->call_id, &first);
  put_str(&b, "tool", r->tool, &first);
  put_str(&b, "state", idem_state_name(r->state), &first);
  put_num(&b, "attempts", r->attempts, &first);
  put_str(&b, "key", r->key, &first);
  put_str(&b, "fingerprint", r->fingerprint, &first);
  put_raw(&b, "args", r->args, &first);
  put_raw(&b, "result", r->result, &first);
  put_str(&b, "error", r->error, &first);
  put_str(&b, "resolution", idem_resolution_name(r->resolution), &first);
  put_num(&b, "delivered", r->delivered, &first);
  put_str(&b, "duplicate_of", r->duplicate_of, &first);
  put_str(&b, "turn", r->turn, &first);
  put_str(&b, "owner", r->owner, &first);
  put_num(&b, "lease_until", r->lease_until, &first);
  put_num(&b, "token", r->token, &first);
  put_num(&b, "created", r->created, &first);
  put_num(&b, "updated", r->updated, &first);
  put_num(&b, "expires", r->expires, &first);
  put_str(&b, "fence_key", r->fence_key, &first);
  put_str(&b, "executor", r->executor, &first);
  put_num(&b, "pgid", r->pgid, &first);
  put_num(&b, "settle_from", r->settle_from, &first);
  idem__buf_append(&b, "}\n", 2);
  fwrite(b.p, 1, b.len, stdout);
  idem__buf_free(&b);
}

static void when(long long ms, char *buf, size_t n) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  if (ms <= 0) {
    snprintf(buf, n, "-");
    return;
  }
  gmtime_r(&t, &tm);
  strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

typedef struct ls_ctx {
  int json;
  size_t n;
} ls_ctx;

static int ls_row(const idem_record *r, void *arg) {
  ls_ctx *x = arg;
  char created[32], tail[64];
  idem__buf b;
  x->n++;
  if (x->json) {
    print_json(r);
    return 0;
  }
  when(r->created, created, sizeof created);
  snprintf(tail, sizeof tail, " %-12s %3d  %s  ", idem_state_name(r->state),
           r->attempts, created);
  /* the ids and the key (which holds them) are the client's: shown */
  idem__buf_init(&b, (size_t)1 << 30);
  if (cli_text_cell(&b, r->session, 20) || put_text(&b, " ") ||
      cli_text_cell(&b, r->call_id, 20) || put_text(&b, " ") ||
      cli_text_cell(&b, r->tool, 18) || put_text(&b, tail) ||
      cli_text(&b, r->key, 0) || put_text(&b, "\n")) {
    idem__buf_free(&b);
    return 1;
  }
  fwrite(b.p, 1, b.len, stdout);
  idem__buf_free(&b);
  return 0;
}

/* One line of `idem show`: the label, then v shown (cli_text). */
static int show_line(idem__buf *b, const char *label, const char *v, int json) {
  char head[16];
  snprintf(head, sizeof head, "%-14s", label);
  return put_text(b, head) || cli_text(b, v, json) || put_text(b, "\n");
}

static int show_num(idem__buf *b, const char *label, long long v) {
  char num[32];
  snprintf(num, sizeof num, "%lld", v);
  return show_line(b, label, num, 0);
}

static int show_when(idem__buf *b, const char *label, long long ms) {
  char t[32];
  when(ms, t, sizeof t);
  return show_line(b, label, t, 0);
}

/* The record for people; every text of it shown by cli_text. */
static int print_text(const idem_record *r) {
  idem__buf b;
  int rc;
  idem__buf_init(&b, (size_t)1 << 30);
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
       show_when(&b, "settle from", r->settle_from);
  if (!rc) fwrite(b.p, 1, b.len, stdout);
  idem__buf_free(&b);
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
      {NULL, 0, NULL, 0}};
  const char *log = NULL;
  idem__filter f = {NULL, 0, 0};
  ls_ctx x = {0, 0};
  idem__store *st;
  int ch, rc, state;
  while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (ch) {
    case 'L': log = optarg; break;
    case 'j': x.json = 1; break;
    case 's': f.session = optarg; break;
    case 'S':
      if (!(state = state_by_name(optarg)))
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
  if (!(st = open_store(log))) return EXIT_FAIL;
  if (!x.json)
    printf("%-20s %-20s %-18s %-12s %3s  %-20s  %s\n", "SESSION", "CALL",
           "TOOL", "STATE", "TRY", "CREATED", "KEY");
  rc = st->vt->list(st, &f, ls_row, &x);
  if (rc) cli_err("%s", st->vt->errmsg(st));
  st->vt->close(st);
  if (rc) return EXIT_FAIL;
  return cli_flush();
}

int cmd_show(int argc, char **argv) {
  static const struct option opts[] = {LOG_OPTS, {NULL, 0, NULL, 0}};
  const char *log = NULL;
  idem__store *st;
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
  if (!(st = open_store(log))) return EXIT_FAIL;
  rc = st->vt->get(st, argv[optind], argv[optind + 1], &r);
  if (rc == IDEM_NOTFOUND) {
    cli_err("no record of call %s in session %s", argv[optind + 1],
            argv[optind]);
    st->vt->close(st);
    return EXIT_FAIL;
  }
  if (rc) {
    cli_err("%s", st->vt->errmsg(st));
    st->vt->close(st);
    return EXIT_FAIL;
  }
  if (json)
    print_json(r);
  else if (print_text(r)) {
    cli_err("out of memory");
    rc = EXIT_FAIL;
  }
  idem_record_free(r);
  st->vt->close(st);
  if (rc) return rc;
  return cli_flush();
}

int cmd_stats(int argc, char **argv) {
  static const struct option opts[] = {LOG_OPTS, {NULL, 0, NULL, 0}};
  const char *log = NULL;
  long long counts[8] = {0}, total = 0;
  idem__store *st;
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
  if (!(st = open_store(log))) return EXIT_FAIL;
  rc = st->vt->stats(st, counts);
  if (rc) {
    cli_err("%s", st->vt->errmsg(st));
    st->vt->close(st);
    return EXIT_FAIL;
  }
  for (i = IDEM_STATE_PENDING; i <= IDEM_STATE_DEDUPLICATED; i++)
    total += counts[i];
  if (json) {
    printf("{");
    for (i = IDEM_STATE_PENDING; i <= IDEM_STATE_DEDUPLICATED; i++)
      printf("\"%s\":%lld,", idem_state_name(i), counts[i]);
    printf("\"total\":%lld}\n", total);
  } else {
    for (i = IDEM_STATE_PENDING; i <= IDEM_STATE_DEDUPLICATED; i++)
      printf("%-13s %lld\n", idem_state_name(i), counts[i]);
    printf("%-13s %lld\n", "total", total);
  }
  st->vt->close(st);
  return cli_flush();
}

int cmd_gc(int argc, char **argv) {
  static const struct option opts[] = {LOG_OPTS, {NULL, 0, NULL, 0}};
  const char *log = NULL;
  idem__store *st;
  long long now = 0;
  size_t n = 0;
  int ch, json = 0, rc;
  while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (ch) {
    case 'L': log = optarg; break;
    case 'j': json = 1; break;
    case 'h': cli_print_usage(stdout, "gc"); return EXIT_OK;
    default: return bad_opt("gc", ch, argv);
    }
  }
  if (optind < argc) return cli_usage("gc", "too many arguments");
  if (!(st = open_store(log))) return EXIT_FAIL;
  rc = st->vt->now(st, &now);
  if (!rc) rc = st->vt->gc(st, now, &n);
  if (rc) {
    cli_err("%s", st->vt->errmsg(st));
    st->vt->close(st);
    return EXIT_FAIL;
  }
  if (json)
    printf("{\"deleted\":%zu}\n", n);
  else
    printf("deleted %zu expired record%s\n", n, n == 1 ? "" : "s");
  st->vt->close(st);
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

static long long now_wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int collect(const idem_record *r, void *arg) {
  struct {
    doubt *v;
    size_t n, cap;
    long long now; /* the log's clock (a shared log: the server's) */
  } *d = arg;
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 256;
    doubt *v = realloc(d->v, cap * sizeof *v);
    if (!v) return 1;
    d->v = v;
    d->cap = cap;
  }
  if (r->state == IDEM_STATE_PENDING && r->lease_until > d->now &&
      idem__owner_alive(r->owner) != 0)
    return 0; /* still at work: not in doubt */
  memset(&d->v[d->n], 0, sizeof d->v[d->n]);
  d->v[d->n].session = strdup(r->session);
  d->v[d->n].call_id = strdup(r->call_id);
  d->v[d->n].tool = strdup(r->tool);
  d->v[d->n].key = strdup(r->key);
  d->v[d->n].args = strdup(r->args);
  d->v[d->n].token = r->token;
  if (!d->v[d->n].session || !d->v[d->n].call_id || !d->v[d->n].tool ||
      !d->v[d->n].key || !d->v[d->n].args)
    return 1;
  d->n++;
  return 0;
}

/* A --batch status process: one per worker. */
typedef struct batch_proc {
  pid_t pid;
  FILE *in, *out;
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
  return b->in && b->out ? 0 : -1;
}

static void batch_stop(batch_proc *b) {
  int st;
  if (b->in) fclose(b->in);
  if (b->out) fclose(b->out);
  if (b->pid > 0) waitpid(b->pid, &st, 0);
}

/* One request of the batch protocol, as one line into q (reset first). */
static void batch_request(idem__buf *q, const doubt *d, const char *key,
                          const char *args, size_t args_len) {
  size_t bad;
  q->len = 0;
  idem__buf_append(q, "{\"session\":", 11);
  idem__canon_string(q, d->session, strlen(d->session), &bad);
  idem__buf_append(q, ",\"call_id\":", 11);
  idem__canon_string(q, d->call_id, strlen(d->call_id), &bad);
  idem__buf_append(q, ",\"tool\":", 8);
  idem__canon_string(q, d->tool, strlen(d->tool), &bad);
  idem__buf_append(q, ",\"key\":", 7);
  idem__canon_string(q, key, strlen(key), &bad);
  idem__buf_append(q, ",\"args\":", 8);
  idem__buf_append(q, args, args_len);
  idem__buf_append(q, "}\n", 2);
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
  idem__buf q;
  const char *target = idem_step_check_target(s, &tlen);
  int outcome = IDEM_OUTCOME_UNKNOWN;
  *result = NULL;
  idem__buf_init(&q, (size_t)64 << 20);
  batch_request(&q, d, idem_step_check_key(s), target, tlen);
  if (fwrite(q.p, 1, q.len, b->in) == q.len && fflush(b->in) == 0 &&
      fgets(line, sizeof line, b->out))
    outcome = batch_answer(line, result);
  idem__buf_free(&q);
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
  idem__buf q;
  size_t i;
  idem__buf_init(&q, (size_t)64 << 20);
  for (i = 0; i < f->n; i++) {
    const doubt *d = &f->v[i];
    batch_request(&q, d, d->key, d->args, strlen(d->args));
    if (fwrite(q.p, 1, q.len, f->in) != q.len) break;
  }
  idem__buf_free(&q);
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
  batch_proc b = {0, NULL, NULL};
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
      rc = idem_step_resolve(s, outcome, result, result ? strlen(result) : 0);
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
  char buf[4200];
  idem_policy *policy = NULL;
  idem__store *st;
  idem__filter f = {NULL, 0, 0};
  struct {
    doubt *v;
    size_t n, cap;
    long long now;
  } d = {NULL, 0, 0, 0};
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
  log = log_url(log, buf, sizeof buf);
  if (!(st = open_store(log))) {
    idem_policy_free(policy);
    return EXIT_FAIL;
  }
  f.states = 1u << IDEM_STATE_IN_DOUBT | 1u << IDEM_STATE_PENDING;
  if (st->vt->now(st, &d.now) != IDEM_OK) d.now = now_wall();
  if (st->vt->list(st, &f, collect, &d)) {
    cli_err("%s", st->vt->errmsg(st));
    rc = EXIT_FAIL;
  }
  st->vt->close(st);
  if (rc == EXIT_OK && idem_guard_open(log, policy, &j.g) != IDEM_OK) {
    cli_err("%s", idem_guard_errmsg(j.g));
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
