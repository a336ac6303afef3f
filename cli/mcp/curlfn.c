/*
** curlfn.c - loading libcurl for the command's HTTP peers (curlfn.h).
** IDEM_LIBCURL names another file to load, as for libidem (src/dl.c).
*/
#define CLI_CURLFN_IMPL
#include "curlfn.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

cli_curl_fns cli_curl;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char why[400];
static int ok;

static void load(void) {
  const char *file = secure_getenv("IDEM_LIBCURL");
  void *h = dlopen(file && *file ? file : "libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
  const char *err;
  if (!h) {
    snprintf(why, sizeof why,
             "libcurl (%s); install the package libcurl4", dlerror());
    return;
  }
#define X(f)                                                                   \
  if (!(*(void **)&cli_curl.f = dlsym(h, #f))) {                               \
    err = dlerror();                                                           \
    snprintf(why, sizeof why, "libcurl (%s)", err ? err : #f " missing");      \
    return;                                                                    \
  }
  CLI_CURL_FUNCS(X)
#undef X
  if (cli_curl.curl_global_init(CURL_GLOBAL_DEFAULT)) {
    snprintf(why, sizeof why, "libcurl (curl_global_init failed)");
    return;
  }
  ok = 1;
}

const char *cli_curl_need(void) {
  pthread_once(&once, load);
  return ok ? NULL : why;
}
