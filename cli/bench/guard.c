/*
** guard.c - `idem bench --only guard`: the guard on the embedded
** store, side by side with the disk it runs on and with what a user would
** otherwise write (SPEC §12, issue figures):
**
**   fdatasync      one 4 KiB write + fdatasync of this disk (median)
**   sqlite_commit  one row in its own SQLite transaction, WAL and
**                  synchronous=FULL, on the same disk (median): the floor of
**                  any log kept in SQLite, which writes WAL frames (page +
**                  24-byte header) and syncs them
**   guard_call     a guarded call, single session, in process, against
**                  sqlite_commit (target: at most 1.5x) and fdatasync
**   sqlite_commit_tmpfs, guard_call_tmpfs
**                  the same two on tmpfs (/dev/shm), where no sync costs
**                  anything: the CPU around the sync (target: a guarded
**                  call at most 2.5x one SQLite commit of the same row)
**   guard_32       32 sessions at once (threads): calls/s against the single
**                  session rate (target: at least 8x, group commit)
**   replay         a repeated call answered from the log, in process
**                  (target: under 20 us)
**   recover        `idem recover --batch` of 100k in-doubt records with a
**                  trivial status check (target: under 5 s)
**   python_sqlite3 Python's sqlite3 with an idempotency table, a transaction
**                  per step, on the same disk (target: at least 2x slower)
**   guard_call_pg, guard_32_pg
**                  with IDEM_BENCH_PG_URL=postgres://... set: the single
**                  session and the 32 sessions on that PostgreSQL log, side
**                  by side with the figures of the embedded store above
**
** Every log is measured in its steady state, as a long-lived one runs:
** calls (untimed) first until its WAL has been checkpointed and restarted,
** so that the timed commits overwrite blocks the WAL already has.  On a
** fresh log every sync also grows the file and syncs its size (an ext4
** journal commit): on this VM that alone made a guarded call 1.6x slower.
**
** Every figure comes from this one run; nothing here is a pass/fail test of
** speed.
*/
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/magic.h>
#include <sqlite3.h>

#include "cli.h"
#include "idemInt.h"

extern char **environ;

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n ? v[n / 2] : 0;
}

static double fdatasync_us(const char *dir, int n) {
  char path[4200], block[4096];
  double *t = malloc((size_t)n * sizeof *t), m;
  int fd, i;
  snprintf(path, sizeof path, "%s/fdatasync.probe", dir);
  fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
  if (fd < 0 || !t) {
    free(t);
    return -1;
  }
  memset(block, 'x', sizeof block);
  for (i = 0; i < n; i++) {
    double t0 = mono();
    if (pwrite(fd, block, sizeof block, (off_t)(i % 64) * 4096) < 0 ||
        fdatasync(fd) != 0)
      break;
    t[i] = (mono() - t0) * 1e6;
  }
  close(fd);
  unlink(path);
  m = i == n ? median(t, (size_t)n) : -1;
  free(t);
  return m;
}

/* Remove a database an earlier run left in the bench directory (with its
** WAL and index), so every run starts from an empty log: with --dir the
** directory is the user's and outlives the run. */
static void fresh_db(const char *path) {
  static const char *const ext[] = {"", "-wal", "-shm", "-journal"};
  char p[4300];
  size_t i;
  for (i = 0; i < sizeof ext / sizeof *ext; i++) {
    snprintf(p, sizeof p, "%s%s", path, ext[i]);
    unlink(p);
  }
}

/* One INSERT of a 300-byte row per WAL transaction, synchronous=FULL: the
** median commit, in microseconds (-1 when SQLite fails).  The steady state,
** as a long-lived log sees it: a first pass (untimed) grows the WAL, a
** checkpoint restarts it, and the timed pass overwrites blocks the file
** already has (a commit that grows the file also syncs its size). */
static double sqlite_commit_us(const char *dir, int n) {
  char path[4200];
  sqlite3 *db = NULL;
  sqlite3_stmt *ins = NULL;
  double *t = malloc((size_t)n * sizeof *t), m = -1;
  int i = 0;
  snprintf(path, sizeof path, "%s/sqlite_commit.db", dir);
  fresh_db(path);
  if (t && sqlite3_open(path, &db) == SQLITE_OK &&
      sqlite3_exec(db,
                   "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                   "CREATE TABLE t(k TEXT PRIMARY KEY, v TEXT)",
                   NULL, NULL, NULL) == SQLITE_OK &&
      sqlite3_prepare_v2(db, "INSERT INTO t VALUES(?1, printf('%.300c', 'x'))",
                         -1, &ins, NULL) == SQLITE_OK) {
    for (i = 0; i < 2 * n; i++) {
      double t0 = mono();
      int ok =
          sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK &&
          sqlite3_bind_int(ins, 1, i) == SQLITE_OK &&
          sqlite3_step(ins) == SQLITE_DONE && sqlite3_reset(ins) == SQLITE_OK &&
          sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) == SQLITE_OK;
      if (!ok) break;
      if (i >= n)
        t[i - n] = (mono() - t0) * 1e6;
      else if (i == n - 1 &&
               sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_RESTART,
                                         NULL, NULL) != SQLITE_OK)
        break;
    }
    if (i == 2 * n) m = median(t, (size_t)n);
  }
  sqlite3_finalize(ins);
  sqlite3_close(db);
  free(t);
  return m;
}

/* The tool: applied at once, a small result. */
static int trivial_run(void *ctx, const char *key, const char *args, size_t len,
                       char **result, char **error) {
  (void)ctx;
  (void)key;
  (void)args;
  (void)len;
  (void)error;
  static const char res[] = "{\"refund_id\":\"re_1\"}";
  if ((*result = idem_malloc(sizeof res))) memcpy(*result, res, sizeof res);
  return IDEM_OUTCOME_APPLIED;
}

/* A refund of its own order for every call: distinct actions, as a busy
** harness makes them (identical arguments would be one action, fenced). */
static size_t refund_args(char *buf, size_t n, const char *call_id) {
  int k = snprintf(buf, n,
                   "{\"order_id\":\"ord_%s\",\"amount_cents\":6000,"
                   "\"currency\":\"usd\",\"reason\":\"late delivery\"}",
                   call_id);
  return k > 0 && (size_t)k < n ? (size_t)k : 0;
}

static int one_call(idem_guard *g, const char *session, const char *call_id) {
  char args[256];
  idem_call c = {sizeof c, session, call_id, "refund_payment",
                 args,     0,       NULL,    0};
  idem_tool t = {sizeof t, trivial_run, NULL, NULL};
  char *env = NULL;
  size_t len;
  int rc;
  c.args_len = refund_args(args, sizeof args, call_id);
  rc = idem_guard_call(g, &c, &t, &env, &len);
  idem_free(env);
  return rc;
}

/* Calls enough to checkpoint and restart a new log's WAL (CHECKPOINT_PAGES
** in store/sqlite.c, about five pages a call), untimed: the steady state. */
#define WARM_CALLS 500

/* One session, call after call, on g: n calls timed after `warm` untimed
** ones; the mean in microseconds, each call's time in lat[]. */
static double single_session(idem_guard *g, const char *session, int warm,
                             int n, double *lat, int *failed) {
  char call[32], wsession[80];
  double t0;
  int i;
  snprintf(wsession, sizeof wsession, "%s_warm", session);
  for (i = 0; i < warm; i++) {
    snprintf(call, sizeof call, "warm_%d", i);
    if (one_call(g, wsession, call)) ++*failed;
  }
  t0 = mono();
  for (i = 0; i < n; i++) {
    double c0 = mono();
    snprintf(call, sizeof call, "call_%d", i);
    if (one_call(g, session, call)) ++*failed;
    lat[i] = (mono() - c0) * 1e6;
  }
  return (mono() - t0) / n * 1e6;
}

/* sqlite_commit_tmpfs and guard_call_tmpfs: in a directory of its own under
** /dev/shm when that is a tmpfs (skipped, and said, when it is not). */
static void bench_tmpfs(int n1, int warm, double *lat, int *failed) {
  char dir[] = "/dev/shm/idem-bench-XXXXXX", url[128];
  struct statfs fs;
  idem_guard *g = NULL;
  double sq_us, mean;
  if (statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC ||
      !mkdtemp(dir)) {
    printf("{\"bench\":\"guard_call_tmpfs\",\"skipped\":\"no tmpfs at "
           "/dev/shm\"}\n");
    return;
  }
  sq_us = sqlite_commit_us(dir, n1);
  snprintf(url, sizeof url, "sqlite:%s/guard_bench.db", dir);
  if (sq_us > 0 && idem_guard_open(url, NULL, &g) == IDEM_OK) {
    mean = single_session(g, "tmpfs", warm, n1, lat, failed);
    printf("{\"bench\":\"sqlite_commit_tmpfs\",\"dir\":\"%s\","
           "\"median_us\":%.1f}\n",
           dir, sq_us);
    printf("{\"bench\":\"guard_call_tmpfs\",\"calls\":%d,\"mean_us\":%.1f,"
           "\"median_us\":%.1f,\"ratio_to_sqlite_commit\":%.2f,"
           "\"target\":\"<=2.5\"}\n",
           n1, mean, median(lat, (size_t)n1), mean / sq_us);
  } else {
    printf("{\"bench\":\"guard_call_tmpfs\",\"error\":\"%s\"}\n",
           sq_us > 0 ? "cannot open a guard on tmpfs" : "SQLite failed");
    ++*failed;
  }
  idem_guard_close(g);
  fresh_db(url + 7);
  snprintf(url, sizeof url, "%s/sqlite_commit.db", dir);
  fresh_db(url);
  if (rmdir(dir) != 0) cli_err("bench: cannot remove %s", dir);
  fflush(stdout);
}

typedef struct sess {
  idem_guard *g;
  const char *prefix; /* of the session names: unique to the run */
  int id, calls, failed;
} sess;

static void *sess_main(void *arg);

/* The 32 sessions on g: calls per second. */
static double run_32(idem_guard *g, const char *prefix, int per, int *failed) {
  pthread_t th[32];
  sess ss[32];
  double t0 = mono();
  int i;
  for (i = 0; i < 32; i++) {
    ss[i].g = g;
    ss[i].prefix = prefix;
    ss[i].id = i;
    ss[i].calls = per;
    ss[i].failed = 0;
    pthread_create(&th[i], NULL, sess_main, &ss[i]);
  }
  for (i = 0; i < 32; i++) {
    pthread_join(th[i], NULL);
    *failed += ss[i].failed;
  }
  return 32 * per / (mono() - t0);
}

/*
** The same guarded calls on a PostgreSQL log (IDEM_BENCH_PG_URL), beside
** the embedded store's rates from this run.  Sessions are named after the
** run, so a database used before does not turn the calls into replays.
*/
static int bench_guard_pg(const char *url, int n1, int per, double sq_single,
                          double sq_multi) {
  idem_guard *g = NULL;
  char prefix[64], session[80], call[32], shown[300];
  double t0, single, multi;
  int i, failed = 0;
  idem__store_shown_url(url, shown, sizeof shown);
  if (idem_guard_open(url, NULL, &g) != IDEM_OK) {
    cli_err("bench: %s", idem_guard_errmsg(g));
    idem_guard_close(g);
    return EXIT_FAIL;
  }
  snprintf(prefix, sizeof prefix, "%ld_%lld_", (long)getpid(),
           (long long)(mono() * 1e6));
  snprintf(session, sizeof session, "%ssingle", prefix);
  t0 = mono();
  for (i = 0; i < n1; i++) {
    snprintf(call, sizeof call, "call_%d", i);
    if (one_call(g, session, call)) failed++;
  }
  single = n1 / (mono() - t0);
  multi = run_32(g, prefix, per, &failed);
  idem_guard_close(g);
  printf("{\"bench\":\"guard_call_pg\",\"log\":\"%s\",\"calls\":%d,"
         "\"mean_us\":%.1f,\"sqlite_mean_us\":%.1f,\"ratio_to_sqlite\":%.2f,"
         "\"failed\":%d}\n",
         shown, n1, 1e6 / single, 1e6 / sq_single, sq_single / single, failed);
  printf(
      "{\"bench\":\"guard_32_pg\",\"sessions\":32,\"calls\":%d,"
      "\"calls_per_s\":%.0f,\"single_calls_per_s\":%.0f,\"ratio\":%.1f,"
      "\"target\":\">=8\",\"sqlite_calls_per_s\":%.0f,\"ratio_to_sqlite\":%.2f,"
      "\"failed\":%d}\n",
      32 * per, multi, single, multi / single, sq_multi, multi / sq_multi,
      failed);
  fflush(stdout);
  return failed ? EXIT_FAIL : EXIT_OK;
}

static void *sess_main(void *arg) {
  sess *s = arg;
  char session[64], call[32];
  snprintf(session, sizeof session, "%sbench_s%d", s->prefix, s->id);
  for (int i = 0; i < s->calls; i++) {
    snprintf(call, sizeof call, "call_%d", i);
    if (one_call(s->g, session, call)) {
      if (!s->failed) cli_err("bench: %s", idem_guard_errmsg(s->g));
      s->failed++;
    }
  }
  return NULL;
}

/* Insert n in-doubt records, from several threads (no sync per record). */
typedef struct filler {
  idem__store *st;
  int from, to, failed;
} filler;

static void *fill_main(void *arg) {
  filler *f = arg;
  char call[32], key[64];
  idem_record r;
  for (int i = f->from; i < f->to; i++) {
    idem_record *found = NULL;
    int what;
    snprintf(call, sizeof call, "doubt_%d", i);
    snprintf(key, sizeof key, "recover:doubt_%d:0123456789abcdef", i);
    memset(&r, 0, sizeof r);
    r.session = (char *)"recover";
    r.call_id = call;
    r.tool = (char *)"refund_payment";
    r.fingerprint = (char *)"0123456789abcdef0123456789abcdef0123456789abcdef01"
                            "23456789abcdef";
    r.key = key;
    r.args = (char *)"{\"order_id\":\"ord_1\"}";
    r.cls = IDEM_CLASS_GUARDED;
    r.state = IDEM_STATE_IN_DOUBT;
    r.attempts = 1;
    r.owner = (char *)"elsewhere:1:1";
    r.token = 1;
    r.created = r.updated = 1;
    r.expires = 4102444800000LL;
    if (f->st->vt->insert(f->st, &r, &what, &found)) f->failed++;
    idem_record_free(found);
  }
  return NULL;
}

static int spawn_wait(char *const argv[], const char *out, double *secs) {
  pid_t pid;
  int st;
  double t0 = mono();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  if (posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ) != 0) {
    posix_spawn_file_actions_destroy(&fa);
    return -1;
  }
  posix_spawn_file_actions_destroy(&fa);
  if (waitpid(pid, &st, 0) < 0) return -1;
  *secs = mono() - t0;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static const char py_script[] =
    "import sqlite3,sys,time,json\n"
    "path,n,warm=sys.argv[1],int(sys.argv[2]),int(sys.argv[3])\n"
    "c=sqlite3.connect(path,isolation_level=None)\n"
    "c.execute('PRAGMA journal_mode=WAL');c.execute('PRAGMA "
    "synchronous=FULL')\n"
    "c.execute('CREATE TABLE IF NOT EXISTS idem(key TEXT PRIMARY KEY,state "
    "TEXT,result TEXT)')\n"
    "args={'order_id':'ord_1','amount_cents':6000,'currency':'usd',"
    "'reason':'late delivery'}\n"
    "t=0\n"
    "for i in range(-warm,n):\n"
    " if i==0: t=time.perf_counter()\n"
    " key='s:call_%d:'%i+json.dumps(args,sort_keys=True)[:16]\n"
    " c.execute('BEGIN IMMEDIATE')\n"
    " row=c.execute('SELECT state,result FROM idem WHERE key=?',(key,))"
    ".fetchone()\n"
    " if row is None: c.execute('INSERT INTO idem VALUES(?,?,NULL)',"
    "(key,'pending'))\n"
    " c.execute('COMMIT')\n"
    " if row is None:\n"
    "  c.execute('UPDATE idem SET state=?,result=? WHERE key=?',"
    "('succeeded','{\"refund_id\":\"re_1\"}',key))\n"
    "print(time.perf_counter()-t)\n";

int bench_guard(const char *dir, int quick) {
  char url[4200], path[4200], self[4096], num[32], wnum[32];
  int n1 = quick ? 60 : 300, per = quick ? 10 : 40,
      warm = quick ? 0 : WARM_CALLS, nrec = quick ? 10000 : 100000;
  double fsync_us, sq_us, single_us, multi_s, *lat, rec_s = -1, py_s = -1;
  idem_guard *g = NULL;
  pthread_t th[32];
  const char *pg_url;
  int i, failed = 0, rc = EXIT_OK;
  ssize_t sl;

  fsync_us = fdatasync_us(dir, quick ? 50 : 200);
  printf("{\"bench\":\"fdatasync\",\"dir\":\"%s\",\"median_us\":%.1f}\n", dir,
         fsync_us);
  sq_us = sqlite_commit_us(dir, quick ? 50 : 300);
  if (sq_us < 0) {
    printf("{\"bench\":\"sqlite_commit\",\"error\":\"SQLite failed in %s\"}\n",
           dir);
    failed++;
  } else
    printf("{\"bench\":\"sqlite_commit\",\"median_us\":%.1f,"
           "\"ratio_to_fdatasync\":%.2f}\n",
           sq_us, sq_us / fsync_us);
  fflush(stdout);

  snprintf(url, sizeof url, "sqlite:%s/guard_bench.db", dir);
  fresh_db(url + 7);
  if (idem_guard_open(url, NULL, &g) != IDEM_OK) {
    cli_err("bench: %s", idem_guard_errmsg(g));
    idem_guard_close(g);
    return EXIT_FAIL;
  }
  /* one session: call after call, in the log's steady state */
  lat = malloc((size_t)n1 * sizeof *lat);
  single_us = single_session(g, "single", warm, n1, lat, &failed);
  printf("{\"bench\":\"guard_call\",\"calls\":%d,\"mean_us\":%.1f,"
         "\"median_us\":%.1f,\"fdatasync_us\":%.1f,\"ratio_to_fdatasync\":%.2f,"
         "\"target\":\"<=1.5\",\"ratio_to_sqlite_commit\":%.2f,"
         "\"failed\":%d}\n",
         n1, single_us, median(lat, (size_t)n1), fsync_us, single_us / fsync_us,
         single_us / sq_us, failed);
  fflush(stdout);

  /* a replay: the same call again, answered from the log */
  for (i = 0; i < n1; i++) {
    char call[32], args[256];
    idem_call c = {sizeof c, "single", call, "refund_payment",
                   args,     0,        NULL, 0};
    idem_step *s = NULL;
    double c0;
    snprintf(call, sizeof call, "call_%d", i % n1);
    c.args_len = refund_args(args, sizeof args, call);
    c0 = mono();
    if (idem_guard_begin(g, &c, &s) != IDEM_OK ||
        idem_step_answer(s) != IDEM_ANSWER_SUCCEEDED)
      failed++;
    idem_step_delivered(s);
    idem_step_free(s);
    lat[i] = (mono() - c0) * 1e6;
  }
  printf("{\"bench\":\"replay\",\"calls\":%d,\"median_us\":%.1f,"
         "\"target_us\":20}\n",
         n1, median(lat, (size_t)n1));
  fflush(stdout);
  if (!quick) bench_tmpfs(n1, warm, lat, &failed);
  free(lat);

  /* 32 sessions at once */
  multi_s = 32 * per / run_32(g, "", per, &failed);
  printf("{\"bench\":\"guard_32\",\"sessions\":32,\"calls\":%d,"
         "\"calls_per_s\":%.0f,\"single_calls_per_s\":%.0f,"
         "\"ratio\":%.1f,\"target\":\">=8\",\"failed\":%d}\n",
         32 * per, 32 * per / multi_s, 1e6 / single_us,
         (32 * per / multi_s) / (1e6 / single_us), failed);
  fflush(stdout);
  idem_guard_close(g);
  if ((pg_url = getenv("IDEM_BENCH_PG_URL")) != NULL && *pg_url)
    rc |= bench_guard_pg(pg_url, n1, per, 1e6 / single_us, 32 * per / multi_s);

  /* recover: in-doubt records settled by a trivial batch status check */
  {
    idem__store *st = NULL;
    filler f[8];
    snprintf(url, sizeof url, "sqlite:%s/recover_bench.db", dir);
    fresh_db(url + 7);
    if (idem__store_open(url, &st) == IDEM_OK) {
      for (i = 0; i < 8; i++) {
        f[i].st = st;
        f[i].from = nrec / 8 * i;
        f[i].to = i == 7 ? nrec : nrec / 8 * (i + 1);
        f[i].failed = 0;
        pthread_create(&th[i], NULL, fill_main, &f[i]);
      }
      for (i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        failed += f[i].failed;
      }
    }
    if (st) st->vt->close(st);
    sl = readlink("/proc/self/exe", self, sizeof self - 1);
    snprintf(path, sizeof path, "%s/recover.out", dir);
    if (sl > 0) {
      char *argv[] = {self,
                      (char *)"recover",
                      (char *)"--json",
                      (char *)"--log",
                      url,
                      (char *)"--batch",
                      (char *)"--status",
                      (char *)"sed 's/.*/applied/'",
                      NULL};
      self[sl] = '\0';
      if (spawn_wait(argv, path, &rec_s) != 0) rec_s = -1;
    }
    {
      char got[256] = {0}, *a;
      FILE *rf = fopen(path, "r");
      long settled = -1;
      if (rf) {
        if (fgets(got, sizeof got, rf) && (a = strstr(got, "\"applied\":")))
          settled = strtol(a + 10, NULL, 10);
        fclose(rf);
      }
      printf("{\"bench\":\"recover\",\"records\":%d,\"settled\":%ld,"
             "\"status\":\"sed (batch)\",\"seconds\":%.2f,"
             "\"target_s\":5}\n",
             nrec, settled, rec_s);
      if (settled != nrec) failed++;
    }
    fflush(stdout);
  }

  /* what a user would otherwise write: Python sqlite3, same disk */
  snprintf(path, sizeof path, "%s/python_bench.db", dir);
  fresh_db(path);
  snprintf(num, sizeof num, "%d", n1);
  snprintf(wnum, sizeof wnum, "%d", warm);
  {
    char *argv[] = {(char *)"python3",
                    (char *)"-c",
                    (char *)py_script,
                    path,
                    num,
                    wnum,
                    NULL};
    int out[2];
    pid_t pid;
    posix_spawn_file_actions_t fa;
    char buf[64] = {0};
    if (pipe(out) == 0) {
      posix_spawn_file_actions_init(&fa);
      posix_spawn_file_actions_adddup2(&fa, out[1], 1);
      posix_spawn_file_actions_addclose(&fa, out[0]);
      if (posix_spawnp(&pid, "python3", &fa, NULL, argv, environ) == 0) {
        int st;
        ssize_t r;
        close(out[1]);
        r = read(out[0], buf, sizeof buf - 1);
        if (r > 0) py_s = strtod(buf, NULL);
        waitpid(pid, &st, 0);
      } else
        close(out[1]);
      close(out[0]);
      posix_spawn_file_actions_destroy(&fa);
    }
    if (py_s > 0)
      printf("{\"bench\":\"python_sqlite3\",\"calls\":%d,\"mean_us\":%.1f,"
             "\"idem_mean_us\":%.1f,\"idem_vs_python\":%.2f,"
             "\"target\":\">=2\"}\n",
             n1, py_s / n1 * 1e6, single_us, py_s / n1 * 1e6 / single_us);
    else
      printf("{\"bench\":\"python_sqlite3\",\"skipped\":\"python3 not "
             "available\"}\n");
  }
  if (failed) {
    cli_err("bench: %d guarded calls or steps failed (see above)", failed);
    rc = EXIT_FAIL;
  }
  return rc;
}
