/*
** dl.c - optional libraries, loaded on first use.
**
** libpq (the PostgreSQL store) and libcurl (the HTTP tools, src/http.c)
** each pull in some thirty shared libraries of their own -
** Kerberos, LDAP, SASL, GnuTLS, nghttp2, libssh2 - which the dynamic
** linker would map and relocate at every start of every idem process and
** of every program that loads libidem.so, though most of them never open a
** postgres:// log or make an HTTP call.  So neither is linked: the module
** that needs one loads it with dlopen() the first time it is used, as
** systemd does with its optional libraries, and calls it through a table
** of function pointers.
**
** The pattern, in each user (store/pg.c, http.c):
**
**   - an X-macro lists every function the module calls;
**   - a table (IDEM__DL_TABLE) holds one pointer per function, typed from
**     the library's own header (`__typeof__(PQclear) *`), so each call
**     keeps the library's prototype and the compiler checks it as before;
**   - `#define PQclear pq.f.PQclear` after the table sends the module's
**     calls through it, so the code that uses the library is unchanged;
**   - an idem__dl_lib says what to load, and the first idem__dl_need()
**     loads it (once per process, under a lock), filling the table.  The
**     outcome stays: a process that found the library missing says so on
**     every use and never looks again (installing it needs a new process,
**     as a link would).
**
** Loading is dlopen(RTLD_NOW | RTLD_LOCAL): every symbol of the library
** resolved at once (a broken install fails here, not in the middle of a
** call), and none of them visible to other code of the process, which may
** have loaded another copy or version of its own.  The handle is never
** closed: the pointers stay valid for the life of the process.
**
** An environment variable per library (IDEM_LIBPQ, IDEM_LIBCURL) names
** another file to load instead of the soname - for tests (a file that does
** not exist plays a machine without the package) and for unusual installs.
** secure_getenv() ignores it in set-id programs, as the dynamic linker
** ignores LD_LIBRARY_PATH there.
**
** idem__dl_need() answers why a library cannot be used, in words meant to
** follow "needs":
**
**   libpq (libpq.so.5: cannot open shared object file: No such file or
**   directory); install the package libpq5
*/
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "idemInt.h"

static pthread_mutex_t dl_mu = PTHREAD_MUTEX_INITIALIZER;

static void dl_load(idem__dl_lib *lib) {
  const char *file = lib->env ? secure_getenv(lib->env) : NULL, *why;
  void *h;
  size_t i = 0;
  if (!file || !*file) file = lib->file;
  if ((h = dlopen(file, RTLD_NOW | RTLD_LOCAL)) != NULL) {
    for (i = 0; i < lib->n; i++) {
      (void)dlerror();
      if ((lib->sym[i] = dlsym(h, lib->names[i])) == NULL) break;
    }
    if (i == lib->n) {
      if (lib->init && lib->init(lib->missing, sizeof lib->missing) &&
          !lib->missing[0])
        snprintf(lib->missing, sizeof lib->missing, "%s (it would not start)",
                 lib->name);
      return;
    }
  }
  /* (a symbol found with the value NULL leaves no error: no function of a
  ** C library is at address 0, so name the symbol) */
  if ((why = dlerror()) == NULL) why = h ? lib->names[i] : file;
  snprintf(lib->missing, sizeof lib->missing, "%s (%s); install the package %s",
           lib->name, why, lib->package);
  if (h) dlclose(h);
}

const char *idem__dl_need(idem__dl_lib *lib) {
  pthread_mutex_lock(&dl_mu);
  if (!lib->tried) {
    lib->tried = 1;
    dl_load(lib);
  }
  pthread_mutex_unlock(&dl_mu);
  /* (missing is written once, before tried is seen set under the lock) */
  return lib->missing[0] ? lib->missing : NULL;
}
