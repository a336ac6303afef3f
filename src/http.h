/*
** http.h - HTTP tools (docs/POLICY.md, "http"): one request over libcurl,
** and what its answer means for the guard.
*/
#ifndef IDEM_CLI_HTTP_H
#define IDEM_CLI_HTTP_H

#include <stddef.h>

#include "idemInt.h"

/* The largest response body kept; a longer one is cut (and said so). */
#define CLI_HTTP_MAX_BODY ((size_t)4 << 20)

/* The longest header line sent, "NAME: VALUE" (a signature, a token, a
** value from the arguments): a longer one fails the request, naming the
** header and the tool, and nothing is sent - never a header cut short. */
#define CLI_HTTP_MAX_HEADER ((size_t)64 << 10)

/* The largest filled template (a URL) with its NUL. */
#define CLI_HTTP_MAX_FILLED ((size_t)1 << 20)

/* What one exchange ended with. */
typedef struct cli_http_answer {
  int outcome; /* enum idem_outcome                          */
  long status; /* the HTTP status, 0 when none came          */
  char *body;  /* the response body (malloc, NUL-terminated) */
  size_t body_len;
  int truncated;   /* the body was longer than CLI_HTTP_MAX_BODY */
  char error[512]; /* why, when the outcome is not APPLIED       */
} cli_http_answer;

/*
** Fill a template of the policy: "{name}" becomes argument `name` of args
** (a JSON object text; a string as is, a number, true, false or null as
** its JSON text; percent-encoded when url is set), "{$key}" the key,
** "{$env:NAME}" the environment variable NAME (as is).  Returns a malloc'd
** text, or NULL with the reason in err.
*/
char *cli_http_fill(const char *tmpl, int url, const char *args,
                    size_t args_len, const char *key, char *err, size_t errn);

/*
** Classify an exchange (no I/O: the fuzz target drives it).  sent: any byte
** of the request left this process; failed: the transfer ended in a
** transport error (timeout, reset, refused); status: the HTTP status, 0
** when no status line came.  Sets a->outcome and a->error:
**   refused or unresolved before sending -> NOT_APPLIED;
**   a transport failure after sending    -> UNKNOWN;
**   2xx -> APPLIED; 409, 429, 5xx -> the policy's on_409/on_429/on_5xx
**   (UNKNOWN by default); other 4xx -> REJECTED; anything else -> UNKNOWN.
*/
void cli_http_classify(const idem__http_rule *h, int sent, int failed,
                       const char *transport_error, cli_http_answer *a);

/* Load libcurl (once per process, thread-safe; src/dl.c): 0, or -1 with
** err saying what is missing and what to install ("HTTP tools need libcurl
** (...); install the package libcurl4").  cli_http_request loads it too;
** callers check first to fail before anything is written. */
int cli_http_load(char *err, size_t errn);

/* Make the request of tool rule h (of the tool named tool, for messages)
** with the key and arguments, within timeout_ms; a is filled (free
** a->body).  Returns 0, or -1 when the request could not even be built (a
** template that cannot be filled, a header over CLI_HTTP_MAX_HEADER):
** a->error says why, nothing was sent, a->outcome is REJECTED - the same
** call would fail the same way - or NOT_APPLIED when libcurl could not be
** loaded. */
int cli_http_request(const idem__http_rule *h, const char *tool,
                     const char *key, const char *args, size_t args_len,
                     long long timeout_ms, cli_http_answer *a);

void cli_http_answer_free(cli_http_answer *a);

#endif /* IDEM_CLI_HTTP_H */
