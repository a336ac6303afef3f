/*
** faultvfs.c - a SQLite VFS that fails on demand, for the tests.
**
** "idem-fault" wraps the default VFS and fails the next N xSync
** (SQLITE_IOERR_FSYNC) or xWrite (SQLITE_IOERR_WRITE) calls, and counts the
** syncs.  A test selects it for the opens that follow with
** idem__sqlite_config(NULL, IDEM__SQLITE_FAULT_VFS, 1) and arms it with
** IDEM__SQLITE_FAIL_SYNC / _FAIL_WRITE: that is how test_store proves that
** a failed sync fails begin and reports nothing durable.  Inert unless
** selected.
*/
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include <sqlite3.h>

#include "idemInt.h"

static sqlite3_vfs *real_vfs;
static sqlite3_vfs fault_vfs;
static pthread_once_t fault_once = PTHREAD_ONCE_INIT;
static atomic_int fault_default;
static atomic_llong fault_sync_left, fault_write_left, fault_syncs;

typedef struct fault_file {
  sqlite3_file base;
  sqlite3_file *real; /* follows this struct in the same allocation */
} fault_file;

#define REAL(f) (((fault_file *)(f))->real)

static int ff_close(sqlite3_file *f) {
  return REAL(f)->pMethods->xClose(REAL(f));
}
static int ff_read(sqlite3_file *f, void *p, int n, sqlite3_int64 off) {
  return REAL(f)->pMethods->xRead(REAL(f), p, n, off);
}
/* Take one from a fault counter: 1 when this call is to fail. */
static int fault_take(atomic_llong *left) {
  long long n = atomic_load(left);
  while (n > 0)
    if (atomic_compare_exchange_weak(left, &n, n - 1)) return 1;
  return 0;
}
static int ff_write(sqlite3_file *f, const void *p, int n, sqlite3_int64 off) {
  if (fault_take(&fault_write_left)) return SQLITE_IOERR_WRITE;
  return REAL(f)->pMethods->xWrite(REAL(f), p, n, off);
}
static int ff_truncate(sqlite3_file *f, sqlite3_int64 size) {
  return REAL(f)->pMethods->xTruncate(REAL(f), size);
}
static int ff_sync(sqlite3_file *f, int flags) {
  atomic_fetch_add(&fault_syncs, 1);
  if (fault_take(&fault_sync_left)) return SQLITE_IOERR_FSYNC;
  return REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int ff_size(sqlite3_file *f, sqlite3_int64 *size) {
  return REAL(f)->pMethods->xFileSize(REAL(f), size);
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
  return REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
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

static const sqlite3_io_methods fault_io = {
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
  fault_file *p = (fault_file *)f;
  int rc;
  (void)v;
  p->real = (sqlite3_file *)(p + 1);
  p->real->pMethods = NULL;
  rc = real_vfs->xOpen(real_vfs, name, p->real, flags, out_flags);
  /* SQLite closes a file whose pMethods is set, even after a failure. */
  p->base.pMethods = p->real->pMethods ? &fault_io : NULL;
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

static void fault_register(void) {
  if (sqlite3_initialize() != SQLITE_OK) return;
  real_vfs = sqlite3_vfs_find(NULL);
  if (!real_vfs || real_vfs->iVersion < 2) return;
  fault_vfs.iVersion = 2;
  fault_vfs.szOsFile = (int)sizeof(fault_file) + real_vfs->szOsFile;
  fault_vfs.mxPathname = real_vfs->mxPathname;
  fault_vfs.zName = "idem-fault";
  fault_vfs.xOpen = fv_open;
  fault_vfs.xDelete = fv_delete;
  fault_vfs.xAccess = fv_access;
  fault_vfs.xFullPathname = fv_full;
  fault_vfs.xDlOpen = fv_dlopen;
  fault_vfs.xDlError = fv_dlerror;
  fault_vfs.xDlSym = fv_dlsym;
  fault_vfs.xDlClose = fv_dlclose;
  fault_vfs.xRandomness = fv_random;
  fault_vfs.xSleep = fv_sleep;
  fault_vfs.xCurrentTime = fv_time;
  fault_vfs.xGetLastError = fv_lasterr;
  fault_vfs.xCurrentTimeInt64 = fv_time64;
  sqlite3_vfs_register(&fault_vfs, 0);
}

const char *idem__fault_vfs_selected(void) {
  return atomic_load(&fault_default) ? "idem-fault" : NULL;
}

int idem__fault_vfs_enable(int on) {
  if (on) {
    pthread_once(&fault_once, fault_register);
    if (!real_vfs) return IDEM_STORE;
  }
  atomic_store(&fault_default, on);
  return IDEM_OK;
}

void idem__fault_arm(int sync, long long n) {
  atomic_store(sync ? &fault_sync_left : &fault_write_left, n);
}

long long idem__fault_syncs(void) { return atomic_load(&fault_syncs); }
