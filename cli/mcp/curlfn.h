/*
** curlfn.h - libcurl for `idem mcp`, loaded on first use (curlfn.c).
**
** libcurl brings some thirty shared libraries with it; linking it would
** make every idem process (idem exec is on the latency path of every
** call) map them at start.  So, as libidem does (src/dl.c), the command
** loads it with dlopen() the first time an HTTP peer needs it and calls
** it through a table of pointers typed from curl.h.  A file that uses
** libcurl includes this header instead of curl.h and calls
** cli_curl_need() before its first libcurl call; the calls themselves
** read as plain libcurl.
*/
#ifndef IDEM_CLI_CURLFN_H
#define IDEM_CLI_CURLFN_H

#define CURL_DISABLE_TYPECHECK 1 /* its checking macros would hide the table */
#include <curl/curl.h>

#define CLI_CURL_FUNCS(X)                                                      \
  X(curl_global_init)                                                          \
  X(curl_easy_init)                                                            \
  X(curl_easy_setopt)                                                          \
  X(curl_easy_perform)                                                         \
  X(curl_easy_getinfo)                                                         \
  X(curl_easy_cleanup)                                                         \
  X(curl_easy_strerror)                                                        \
  X(curl_slist_append)                                                         \
  X(curl_slist_free_all)                                                       \
  X(curl_multi_init)                                                           \
  X(curl_multi_add_handle)                                                     \
  X(curl_multi_remove_handle)                                                  \
  X(curl_multi_perform)                                                        \
  X(curl_multi_poll)                                                           \
  X(curl_multi_wakeup)                                                         \
  X(curl_multi_info_read)                                                      \
  X(curl_multi_cleanup)

typedef struct cli_curl_fns {
#define X(f) __typeof__(f) *f;
  CLI_CURL_FUNCS(X)
#undef X
} cli_curl_fns;

extern cli_curl_fns cli_curl;

/* Load libcurl (once per process); NULL, or why it cannot be used. */
const char *cli_curl_need(void);

#ifndef CLI_CURLFN_IMPL
#undef curl_easy_setopt
#undef curl_easy_getinfo
#define curl_global_init cli_curl.curl_global_init
#define curl_easy_init cli_curl.curl_easy_init
#define curl_easy_setopt cli_curl.curl_easy_setopt
#define curl_easy_perform cli_curl.curl_easy_perform
#define curl_easy_getinfo cli_curl.curl_easy_getinfo
#define curl_easy_cleanup cli_curl.curl_easy_cleanup
#define curl_easy_strerror cli_curl.curl_easy_strerror
#define curl_slist_append cli_curl.curl_slist_append
#define curl_slist_free_all cli_curl.curl_slist_free_all
#define curl_multi_init cli_curl.curl_multi_init
#define curl_multi_add_handle cli_curl.curl_multi_add_handle
#define curl_multi_remove_handle cli_curl.curl_multi_remove_handle
#define curl_multi_perform cli_curl.curl_multi_perform
#define curl_multi_poll cli_curl.curl_multi_poll
#define curl_multi_wakeup cli_curl.curl_multi_wakeup
#define curl_multi_info_read cli_curl.curl_multi_info_read
#define curl_multi_cleanup cli_curl.curl_multi_cleanup
#endif

#endif /* IDEM_CLI_CURLFN_H */
