/*
** vfs.c - "idem", the SQLite VFS of the attempt log: the default VFS with
** the WAL's appends coalesced, and with faults on demand for the tests.
**
** COALESCED WAL APPENDS
**
** SQLite appends a commit to the WAL as frames, each written in two calls:
** its 24-byte header, then the page.  A guarded call's commit is three or
** four frames, so six to eight pwrite() calls, and on a virtual machine a
** system call costs 5-10 us.  So the WAL file of each connection keeps the
** appends it recognises in a buffer and writes them with one pwrite() when
** the commit is complete, that is right after the page of a frame whose
** header carries a database size (only a commit frame does).  SQLite makes
** a commit visible to other connections only after that (it then writes the
** WAL index in shared memory), so readers, checkpoints and other processes
** never see a frame that is not in the file yet.
**
** Only the pattern SQLite 3 uses is buffered: the 32-byte WAL header at
** offset 0, a 24-byte frame header, and a page written right after its
** header.  Anything else - a write elsewhere, of another size, or one
** that does not extend the buffer - first writes out what is buffered and
** then goes straight to the file, so an unknown pattern costs speed, never
** order.  The buffer is also written out before every read, sync, truncate,
** size query, file control and close of that file, and past 96 KiB.  A
** failed write-out is the error of the call that caused it
** (SQLITE_IOERR_WRITE), so a commit whose frames cannot be written fails.
** Every WAL handle belongs to one connection, used by one thread at a time,
** so the buffer needs no lock.
**
** FAULTS (tests)
**
** Files opened while idem__fault_vfs_enable(1) is on fail the next N xSync
** (SQLITE_IOERR_FSYNC) or xWrite (SQLITE_IOERR_WRITE) calls once armed
** with idem__fault_arm(), and count their syncs: that is how test_store
** proves that a failed sync fails begin and reports nothing durable.  The
** faults apply to the calls SQLite makes, before any buffering.  Other
** files never fail on purpose.
**
** A full disk, for tests across processes: with IDEM_FULL_WHILE=FILE in
** the environment when the VFS is registered, every write of every file
** fails with SQLITE_FULL while FILE exists - as when the disk fills and is
** freed again.  Reads still work, as they do on a full disk.
*/
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "idemInt.h"

#define WAL_HEADER 32         /* the WAL file's own header */
#define FRAME_HEADER 24       /* before each page */
#define FLUSH_AT (96u << 10)  /* write out a buffer this large */
#define WRITE_MAX (64u << 10) /* bytes per write to the file     */

static sqlite3_vfs *real_vfs;
static sqlite3_vfs idem_vfs;
static pthread_once_t vfs_once = PTHREAD_ONCE_INIT;
static atomic_int fault_default;
static atomic_llong fault_sync_left, fault_write_left, fault_syncs;
static atomic_llong wal_appends, wal_writes; /* SQLite's / the file's */
static const char *full_while; /* IDEM_FULL_WHILE: the disk is full while */
                               /* this file exists                        */

typedef struct idem_file {
  sqlite3_file base;
  sqlite3_file *real; /* follows this struct in the same allocation */
  int faults;         /* opened while faults were enabled */
  int wal;            /* a WAL file: appends are buffered */
  char *buf;          /* the buffered appends, at file offset off */
  size_t len, cap;
  sqlite3_int64 off;
  sqlite3_int64 page_at; /* where the page of the last header goes */
  int commit;            /* that header was a commit frame's */
} idem_file;

#define REAL(f) (((idem_file *)(f))->real)

/* Write the buffered appends out, in pieces below 128 KiB: the unix VFS
** writes at most that much in one call (it masks the length with
** 0x1ffff, since SQLite itself never writes more than a page). */
static int wal_flush(idem_file *p) {
  size_t at = 0;
  int rc = SQLITE_OK;
  while (at < p->len && rc == SQLITE_OK) {
    size_t n = p->len - at < WRITE_MAX ? p->len - at : WRITE_MAX;
    rc = p->real->pMethods->xWrite(p->real, p->buf + at, (int)n,
                                   p->off + (sqlite3_int64)at);
    atomic_fetch_add_explicit(&wal_writes, 1, memory_order_relaxed);
    at += n;
  }
  p->len = 0;
  p->page_at = -1;
  return rc == SQLITE_OK ? SQLITE_OK : SQLITE_IOERR_WRITE;
}

/* Flush f's buffer if it is a WAL file; for the calls that must see the
** file as SQLite wrote it. */
static int flushed(sqlite3_file *f) {
  idem_file *p = (idem_file *)f;
  return p->wal ? wal_flush(p) : SQLITE_OK;
}

/* Append [data, data + n) at off to the buffer: 0 when it does not fit the
** pattern (the caller writes the buffer out, then this write through), 1
** when buffered, 2 when buffered and it ends a commit. */
static int wal_append(idem_file *p, const void *data, int n,
                      sqlite3_int64 off) {
  const unsigned char *b = data;
  int wal_header = off == 0 && n == WAL_HEADER, header = n == FRAME_HEADER;
  int page = !header && n > FRAME_HEADER && off == p->page_at;
  if (!wal_header && !header && !page) return 0;
  if (p->len && off != p->off + (sqlite3_int64)p->len) return 0;
  if (p->len + (size_t)n > p->cap) {
    size_t cap = p->cap ? p->cap : 65536;
    char *q;
    while (cap < p->len + (size_t)n) cap *= 2;
    if (!(q = sqlite3_realloc64(p->buf, cap))) return 0;
    p->buf = q;
    p->cap = cap;
  }
  if (!p->len) p->off = off;
  memcpy(p->buf + p->len, data, (size_t)n);
  p->len += (size_t)n;
  atomic_fetch_add_explicit(&wal_appends, 1, memory_order_relaxed);
  p->page_at = -1;
  if (header) {
    /* bytes 4-7: the database size after a commit, 0 in other frames */
    p->commit = (b[4] | b[5] | b[6] | b[7]) != 0;
    p->page_at = off + FRAME_HEADER;
    return 1;
  }
  return page && p->commit ? 2 : 1;
}

static int ff_close(sqlite3_file *f) {
  idem_file *p = (idem_file *)f;
  int rc = flushed(f), rc2 = REAL(f)->pMethods->xClose(REAL(f));
  sqlite3_free(p->buf);
  p->buf = NULL;
  return rc != SQLITE_OK ? rc : rc2;
}
static int ff_read(sqlite3_file *f, void *p, int n, sqlite3_int64 off) {
  int rc = flushed(f);
  return rc != SQLITE_OK ? rc : REAL(f)->pMethods->xRead(REAL(f), p, n, off);
}
/* Take one from a fault counter: 1 when this call is to fail. */
static int fault_take(atomic_llong *left) {
  long long n = atomic_load(left);
  while (n > 0)
    if (atomic_compare_exchange_weak(left, &n, n - 1)) return 1;
  return 0;
}
static int ff_write(sqlite3_file *f, const void *data, int n,
                    sqlite3_int64 off) {
  idem_file *p = (idem_file *)f;
  int rc;
  if (p->faults && fault_take(&fault_write_left)) return SQLITE_IOERR_WRITE;
  if (full_while && access(full_while, F_OK) == 0) return SQLITE_FULL;
  if (p->wal) {
    if ((rc = wal_append(p, data, n, off)) != 0)
      /* a commit frame's page ends the commit: out it goes */
      return rc == 2 || p->len >= FLUSH_AT ? wal_flush(p) : SQLITE_OK;
    if ((rc = wal_flush(p)) != SQLITE_OK) return rc;
    atomic_fetch_add_explicit(&wal_appends, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&wal_writes, 1, memory_order_relaxed);
  }
  return REAL(f)->pMethods->xWrite(REAL(f), data, n, off);
}
static int ff_truncate(sqlite3_file *f, sqlite3_int64 size) {
  int rc = flushed(f);
  return rc != SQLITE_OK ? rc : REAL(f)->pMethods->xTruncate(REAL(f), size);
}
static int ff_sync(sqlite3_file *f, int flags) {
  idem_file *p = (idem_file *)f;
  int rc = flushed(f);
  if (rc != SQLITE_OK) return rc;
  if (p->faults) {
    atomic_fetch_add(&fault_syncs, 1);
    if (fault_take(&fault_sync_left)) return SQLITE_IOERR_FSYNC;
  }
  return REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int ff_size(sqlite3_file *f, sqlite3_int64 *size) {
  int rc = flushed(f);
  return rc != SQLITE_OK ? rc : REAL(f)->pMethods->xFileSize(REAL(f), size);
}
static int ff_lock(sqlite3_file *f, int lock) {
  return REAL(f)->pMethods->xLock(REAL(f), lock);
}
static int ff_unlock(sqlite3_file *f, int lock) {
  return REAL(f)->pMethods->xUnlock(REAL(f), lock);
}
static int ff_reserved(sqlite3_file *f, int *out) {
  return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out);
}
static int ff_control(sqlite3_file *f, int op, void *arg) {
  int rc = flushed(f);
  return rc != SQLITE_OK ? rc
                         : REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
}
static int ff_sector(sqlite3_file *f) {
  return REAL(f)->pMethods->xSectorSize(REAL(f));
}
static int ff_device(sqlite3_file *f) {
  return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f));
}
static int ff_shm_map(sqlite3_file *f, int i, int size, int extend,
                      void volatile **p) {
  if (REAL(f)->pMethods->iVersion < 2) return SQLITE_IOERR_SHMMAP;
  return REAL(f)->pMethods->xShmMap(REAL(f), i, size, extend, p);
}
static int ff_shm_lock(sqlite3_file *f, int off, int n, int flags) {
  if (REAL(f)->pMethods->iVersion < 2) return SQLITE_IOERR_SHMLOCK;
  return REAL(f)->pMethods->xShmLock(REAL(f), off, n, flags);
}
static void ff_shm_barrier(sqlite3_file *f) {
  if (REAL(f)->pMethods->iVersion >= 2) REAL(f)->pMethods->xShmBarrier(REAL(f));
}
static int ff_shm_unmap(sqlite3_file *f, int del) {
  if (REAL(f)->pMethods->iVersion < 2) return SQLITE_OK;
  return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}
static int ff_fetch(sqlite3_file *f, sqlite3_int64 off, int n, void **p) {
  if (REAL(f)->pMethods->iVersion < 3) {
    *p = NULL;
    return SQLITE_OK;
  }
  return REAL(f)->pMethods->xFetch(REAL(f), off, n, p);
}
static int ff_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p) {
  if (REAL(f)->pMethods->iVersion < 3) return SQLITE_OK;
  return REAL(f)->pMethods->xUnfetch(REAL(f), off, p);
}

static const sqlite3_io_methods idem_io = {
    .iVersion = 3,
    .xClose = ff_close,
    .xRead = ff_read,
    .xWrite = ff_write,
    .xTruncate = ff_truncate,
    .xSync = ff_sync,
    .xFileSize = ff_size,
    .xLock = ff_lock,
    .xUnlock = ff_unlock,
    .xCheckReservedLock = ff_reserved,
    .xFileControl = ff_control,
    .xSectorSize = ff_sector,
    .xDeviceCharacteristics = ff_device,
    .xShmMap = ff_shm_map,
    .xShmLock = ff_shm_lock,
    .xShmBarrier = ff_shm_barrier,
    .xShmUnmap = ff_shm_unmap,
    .xFetch = ff_fetch,
    .xUnfetch = ff_unfetch,
};

static int fv_open(sqlite3_vfs *v, sqlite3_filename name, sqlite3_file *f,
                   int flags, int *out_flags) {
  idem_file *p = (idem_file *)f;
  int rc;
  (void)v;
  memset(p, 0, sizeof *p);
  p->real = (sqlite3_file *)(p + 1);
  p->real->pMethods = NULL;
  p->faults = atomic_load(&fault_default);
  p->wal = (flags & SQLITE_OPEN_WAL) != 0;
  p->page_at = -1;
  rc = real_vfs->xOpen(real_vfs, name, p->real, flags, out_flags);
  /* SQLite closes a file whose pMethods is set, even after a failure. */
  p->base.pMethods = p->real->pMethods ? &idem_io : NULL;
  return rc;
}
static int fv_delete(sqlite3_vfs *v, const char *name, int sync_dir) {
  (void)v;
  return real_vfs->xDelete(real_vfs, name, sync_dir);
}
static int fv_access(sqlite3_vfs *v, const char *name, int flags, int *out) {
  (void)v;
  return real_vfs->xAccess(real_vfs, name, flags, out);
}
static int fv_full(sqlite3_vfs *v, const char *name, int n, char *out) {
  (void)v;
  return real_vfs->xFullPathname(real_vfs, name, n, out);
}
static void *fv_dlopen(sqlite3_vfs *v, const char *name) {
  (void)v;
  return real_vfs->xDlOpen(real_vfs, name);
}
static void fv_dlerror(sqlite3_vfs *v, int n, char *msg) {
  (void)v;
  real_vfs->xDlError(real_vfs, n, msg);
}
static void (*fv_dlsym(sqlite3_vfs *v, void *h, const char *sym))(void) {
  (void)v;
  return real_vfs->xDlSym(real_vfs, h, sym);
}
static void fv_dlclose(sqlite3_vfs *v, void *h) {
  (void)v;
  real_vfs->xDlClose(real_vfs, h);
}
static int fv_random(sqlite3_vfs *v, int n, char *out) {
  (void)v;
  return real_vfs->xRandomness(real_vfs, n, out);
}
static int fv_sleep(sqlite3_vfs *v, int us) {
  (void)v;
  return real_vfs->xSleep(real_vfs, us);
}
static int fv_time(sqlite3_vfs *v, double *out) {
  (void)v;
  return real_vfs->xCurrentTime(real_vfs, out);
}
static int fv_lasterr(sqlite3_vfs *v, int n, char *out) {
  (void)v;
  return real_vfs->xGetLastError ? real_vfs->xGetLastError(real_vfs, n, out)
                                 : 0;
}
static int fv_time64(sqlite3_vfs *v, sqlite3_int64 *out) {
  (void)v;
  return real_vfs->xCurrentTimeInt64(real_vfs, out);
}

static void vfs_register(void) {
  if (sqlite3_initialize() != SQLITE_OK) return;
  if ((full_while = getenv("IDEM_FULL_WHILE")) && !*full_while)
    full_while = NULL;
  real_vfs = sqlite3_vfs_find(NULL);
  if (!real_vfs || real_vfs->iVersion < 2) {
    real_vfs = NULL;
    return;
  }
  idem_vfs.iVersion = 2;
  idem_vfs.szOsFile = (int)sizeof(idem_file) + real_vfs->szOsFile;
  idem_vfs.mxPathname = real_vfs->mxPathname;
  idem_vfs.zName = "idem";
  idem_vfs.xOpen = fv_open;
  idem_vfs.xDelete = fv_delete;
  idem_vfs.xAccess = fv_access;
  idem_vfs.xFullPathname = fv_full;
  idem_vfs.xDlOpen = fv_dlopen;
  idem_vfs.xDlError = fv_dlerror;
  idem_vfs.xDlSym = fv_dlsym;
  idem_vfs.xDlClose = fv_dlclose;
  idem_vfs.xRandomness = fv_random;
  idem_vfs.xSleep = fv_sleep;
  idem_vfs.xCurrentTime = fv_time;
  idem_vfs.xGetLastError = fv_lasterr;
  idem_vfs.xCurrentTimeInt64 = fv_time64;
  if (sqlite3_vfs_register(&idem_vfs, 0) != SQLITE_OK) real_vfs = NULL;
}

const char *idem__vfs(void) {
  pthread_once(&vfs_once, vfs_register);
  return real_vfs ? "idem" : NULL;
}

void idem__fault_vfs_enable(int on) { atomic_store(&fault_default, on); }

void idem__fault_arm(int sync, long long n) {
  atomic_store(sync ? &fault_sync_left : &fault_write_left, n);
}

long long idem__fault_syncs(void) { return atomic_load(&fault_syncs); }

long long idem__vfs_wal_count(int file_writes) {
  return atomic_load(file_writes ? &wal_writes : &wal_appends);
}
