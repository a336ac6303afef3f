/*
** ledger.c - the refunds the simulated provider applied, on disk and in memory.
**
** The file is the truth: one JSON object per line, in the order applied,
**
**   {"id":"re_000001","idempotency_key":"k1","order_id":"ord_1",
**    "amount_cents":6000,"reason":null,"created_ms":1764698400000}
**
** (idempotency_key and reason are null when the request had none).  A line
** is written with one write() and fdatasync()ed before the request that
** applied it is answered, so a refund the client was told about is always
** there, and one it never heard of may be (that is the point).
**
** At start the file is read back whole: every key applied before is bound
** again (the same key gets the same answer after a crash) and ids continue
** after the highest.  A crash mid-write can only leave the LAST line without
** its newline; such a line is dropped (cut off the file) with a warning if
** it does not parse, and kept if it does.  Anything else that does not parse
** -- a bad line before the last, ids out of order, a key applied twice -- is
** an error: the simulator will not guess at its own history.  The one
** exception: a simulator that does not dedupe (--no-dedupe) applies a key
** as often as it is sent, so it reads such a ledger back (the key then
** names its first refund).
**
** The file is flock()ed while open, so two simulators never share one.
*/
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "paysim.h"

static char *dupstr(const char *s) {
  size_t n;
  char *p;
  if (!s) return NULL;
  n = strlen(s) + 1;
  p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

static void free_refund(paysim_refund *r) {
  free(r->key);
  free(r->order_id);
  free(r->reason);
}

void paysim_refund_id(const paysim_refund *r, char *buf, size_t len) {
  snprintf(buf, len, "re_%06lld", r->num);
}

json_t *paysim_refund_json(const paysim_refund *r) {
  char id[32];
  paysim_refund_id(r, id, sizeof id);
  return json_pack("{s:s, s:s, s:s, s:s, s:I, s:s?, s:s?, s:I}", "id", id,
                   "object", "refund", "status", "succeeded", "order_id",
                   r->order_id, "amount_cents", (json_int_t)r->amount_cents,
                   "reason", r->reason, "idempotency_key", r->key, "created_ms",
                   (json_int_t)r->created_ms);
}

static json_t *record_json(const paysim_refund *r) {
  char id[32];
  paysim_refund_id(r, id, sizeof id);
  return json_pack("{s:s, s:s?, s:s, s:I, s:s?, s:I}", "id", id,
                   "idempotency_key", r->key, "order_id", r->order_id,
                   "amount_cents", (json_int_t)r->amount_cents, "reason",
                   r->reason, "created_ms", (json_int_t)r->created_ms);
}

/* R's ledger line with its newline, to go out in one write(), so a crash
** cuts at most the last line, which load() knows how to drop. */
static char *record_line(const paysim_refund *r, size_t *len) {
  json_t *rec = record_json(r);
  char *text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
  char *line = text ? malloc((*len = strlen(text)) + 2) : NULL;
  if (line) {
    memcpy(line, text, *len);
    memcpy(line + (*len)++, "\n", 2);
  }
  free(text);
  json_decref(rec);
  return line;
}

static int reserve(paysim_ledger *l) {
  paysim_refund *v;
  size_t cap;
  if (l->n < l->cap) return 0;
  cap = l->cap ? l->cap * 2 : 64;
  if (cap > ((size_t)-1) / sizeof *v) return -1;
  v = realloc(l->v, cap * sizeof *v);
  if (!v) return -1;
  l->v = v;
  l->cap = cap;
  return 0;
}

/* Takes ownership of R's strings, also on failure. */
static int push(paysim_ledger *l, paysim_refund *r, char *err, size_t errlen) {
  int bound = r->key && json_object_get(l->by_key, r->key);
  if (bound && !l->dup_keys) {
    snprintf(err, errlen, "idempotency key \"%s\" applied twice", r->key);
    goto fail;
  }
  if (reserve(l) != 0 ||
      (r->key && !bound &&
       json_object_set_new(l->by_key, r->key,
                           json_integer((json_int_t)l->n)) != 0)) {
    snprintf(err, errlen, "out of memory");
    goto fail;
  }
  l->v[l->n++] = *r;
  if (r->num >= l->next_num) l->next_num = r->num + 1;
  return 0;
fail:
  free_refund(r);
  return -1;
}

static const char *opt_string(json_t *o, const char *name, int *ok) {
  json_t *v = json_object_get(o, name);
  if (json_is_string(v)) return json_string_value(v);
  if (!json_is_null(v)) *ok = 0;
  return NULL;
}

/* One line of the file into the table, or -1 with the reason in ERR. */
static int load_record(paysim_ledger *l, const char *line, size_t len,
                       char *err, size_t errlen) {
  json_error_t je;
  json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
  json_t *id, *order, *amount, *created;
  const char *key, *reason, *ids;
  char *end;
  paysim_refund r;
  int ok = 1, rc = -1;
  if (!o) {
    snprintf(err, errlen, "not JSON: %s", je.text);
    return -1;
  }
  id = json_object_get(o, "id");
  order = json_object_get(o, "order_id");
  amount = json_object_get(o, "amount_cents");
  created = json_object_get(o, "created_ms");
  key = opt_string(o, "idempotency_key", &ok);
  reason = opt_string(o, "reason", &ok);
  ids = json_string_value(id);
  if (!ok || !ids || strncmp(ids, "re_", 3) != 0 || !json_is_string(order) ||
      !json_is_integer(amount) || !json_is_integer(created)) {
    snprintf(err, errlen, "not a refund record");
    goto done;
  }
  memset(&r, 0, sizeof r);
  errno = 0;
  r.num = strtoll(ids + 3, &end, 10);
  if (errno || end == ids + 3 || *end || r.num <= 0) {
    snprintf(err, errlen, "bad refund id \"%s\"", ids);
    goto done;
  }
  if (r.num < l->next_num) {
    snprintf(err, errlen, "refund id %s out of order", ids);
    goto done;
  }
  r.amount_cents = (long long)json_integer_value(amount);
  r.created_ms = (long long)json_integer_value(created);
  r.key = dupstr(key);
  r.order_id = dupstr(json_string_value(order));
  r.reason = dupstr(reason);
  if ((key && !r.key) || !r.order_id || (reason && !r.reason)) {
    free_refund(&r);
    snprintf(err, errlen, "out of memory");
    goto done;
  }
  rc = push(l, &r, err, errlen);
done:
  json_decref(o);
  return rc;
}

static int write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* A new file's name is durable only once its directory is synced. */
static void sync_dir_of(const char *path) {
  char *copy = dupstr(path);
  int fd;
  if (!copy) return;
  fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
  free(copy);
}

static char *read_whole(int fd, size_t *len, char *err, size_t errlen) {
  struct stat st;
  char *buf;
  size_t got = 0;
  if (fstat(fd, &st) != 0) {
    snprintf(err, errlen, "%s", strerror(errno));
    return NULL;
  }
  if (st.st_size > PAYSIM_MAX_LEDGER) {
    snprintf(err, errlen, "larger than %ld bytes", PAYSIM_MAX_LEDGER);
    return NULL;
  }
  buf = malloc((size_t)st.st_size + 1);
  if (!buf) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  while (got < (size_t)st.st_size) {
    ssize_t r = pread(fd, buf + got, (size_t)st.st_size - got, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  *len = got;
  return buf;
}

static int load(paysim_ledger *l, char *err, size_t errlen) {
  char why[200];
  size_t len = 0, pos = 0;
  int line = 1, rc = 0;
  char *buf = read_whole(l->fd, &len, why, sizeof why);
  if (!buf) {
    snprintf(err, errlen, "ledger %s: %s", l->path, why);
    return -1;
  }
  while (pos < len && rc == 0) {
    char *nl = memchr(buf + pos, '\n', len - pos);
    size_t end = nl ? (size_t)(nl - buf) : len;
    if (load_record(l, buf + pos, end - pos, why, sizeof why) == 0) {
      /* A whole record whose newline did not make it: keep it, finish it. */
      if (!nl && write_all(l->fd, "\n", 1) != 0) {
        snprintf(err, errlen, "ledger %s: %s", l->path, strerror(errno));
        rc = -1;
      }
    } else if (!nl) {
      fprintf(stderr,
              "paysim: warning: ledger %s:%d: dropping a truncated last line "
              "(%zu bytes, %s)\n",
              l->path, line, end - pos, why);
      if (ftruncate(l->fd, (off_t)pos) != 0) {
        snprintf(err, errlen, "ledger %s: %s", l->path, strerror(errno));
        rc = -1;
      }
    } else {
      snprintf(err, errlen, "ledger %s:%d: %s", l->path, line, why);
      rc = -1;
    }
    pos = end + 1;
    line++;
  }
  free(buf);
  if (rc == 0 && fdatasync(l->fd) != 0) {
    snprintf(err, errlen, "ledger %s: %s", l->path, strerror(errno));
    rc = -1;
  }
  return rc;
}

int paysim_ledger_open(paysim_ledger *l, const char *path, int dup_keys,
                       char *err, size_t errlen) {
  int created = 1;
  memset(l, 0, sizeof *l);
  l->next_num = 1;
  l->dup_keys = dup_keys;
  l->path = dupstr(path);
  l->by_key = json_object();
  if (!l->path || !l->by_key) {
    snprintf(err, errlen, "out of memory");
    l->fd = -1;
    return -1;
  }
  l->fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (l->fd < 0 && errno == EEXIST) {
    created = 0;
    l->fd = open(path, O_RDWR | O_APPEND | O_CLOEXEC);
  }
  if (l->fd < 0) {
    snprintf(err, errlen, "ledger %s: %s", path, strerror(errno));
    return -1;
  }
  if (created) sync_dir_of(path);
  if (flock(l->fd, LOCK_EX | LOCK_NB) != 0) {
    snprintf(err, errlen, "ledger %s: %s", path,
             errno == EWOULDBLOCK ? "in use by another idem-paysim"
                                  : strerror(errno));
    return -1;
  }
  return load(l, err, errlen);
}

void paysim_ledger_close(paysim_ledger *l) {
  size_t i;
  for (i = 0; i < l->n; i++) free_refund(&l->v[i]);
  free(l->v);
  json_decref(l->by_key);
  free(l->path);
  if (l->fd >= 0) close(l->fd);
  memset(l, 0, sizeof *l);
  l->fd = -1;
}

long paysim_ledger_find_key(const paysim_ledger *l, const char *key) {
  json_t *i = key ? json_object_get(l->by_key, key) : NULL;
  return i ? (long)json_integer_value(i) : -1;
}

long paysim_ledger_append(paysim_ledger *l, const char *key,
                          const char *order_id, long long amount_cents,
                          const char *reason, char *err, size_t errlen) {
  struct timespec ts;
  paysim_refund r;
  char *line;
  size_t n = 0;
  off_t at;
  /* Without dedupe a key can come again: it stays bound to its first. */
  int bind = key && !json_object_get(l->by_key, key);
  memset(&r, 0, sizeof r);
  clock_gettime(CLOCK_REALTIME, &ts);
  r.num = l->next_num;
  r.amount_cents = amount_cents;
  r.created_ms = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  r.key = dupstr(key);
  r.order_id = dupstr(order_id);
  r.reason = dupstr(reason);
  line = r.order_id ? record_line(&r, &n) : NULL;
  /* Everything that can fail for memory fails before the write, so a line
  ** on disk is always in the table too. */
  if ((key && !r.key) || (reason && !r.reason) || !line || reserve(l) != 0 ||
      (bind && json_object_set_new(l->by_key, key,
                                   json_integer((json_int_t)l->n)) != 0)) {
    snprintf(err, errlen, "out of memory");
    goto fail;
  }
  at = lseek(l->fd, 0, SEEK_END);
  if (at < 0 || write_all(l->fd, line, n) != 0 || fdatasync(l->fd) != 0) {
    snprintf(err, errlen, "ledger %s: %s", l->path, strerror(errno));
    if (bind) json_object_del(l->by_key, key);
    /* Cut back a partial line; if even that fails load() drops it later. */
    if (at >= 0 && ftruncate(l->fd, at) != 0) at = -1;
    goto fail;
  }
  free(line);
  l->v[l->n++] = r;
  l->next_num = r.num + 1;
  return (long)(l->n - 1);
fail:
  free(line);
  free_refund(&r);
  return -1;
}
