/*
** http.h - HTTP tools inside libidem (docs/POLICY.md, "http"): one request
** over libcurl, and what its answer means for the guard.  Internal, as
** idemInt.h is: the API is idem.h's "HTTP tools" section (run.c).
*/
#ifndef IDEM_HTTP_H
#define IDEM_HTTP_H

#include <stddef.h>

#include "idemInt.h"

/* Built with HTTP support (CMake option IDEM_HTTP: libcurl's headers were
** found); 0 makes every request fail with "built without HTTP support". */
#ifndef IDEM_HTTP
#define IDEM_HTTP 1
#endif

/* The largest response body kept; a longer one is cut (and said so). */
#define IDEM__HTTP_MAX_BODY ((size_t)4 << 20)

/* The longest header line sent, "NAME: VALUE" (a signature, a token, a
** value from the arguments): a longer one fails the request, naming the
** header and the tool, and nothing is sent - never a header cut short. */
#define IDEM__HTTP_MAX_HEADER ((size_t)64 << 10)

/* The largest filled template (a URL) with its NUL. */
#define IDEM__HTTP_MAX_FILLED ((size_t)1 << 20)

/* What one exchange ended with. */
typedef struct idem__http_answer {
  int outcome; /* enum idem_outcome                               */
  long status; /* the HTTP status, 0 when none came               */
  char *body;  /* the response body (idem__malloc, NUL-terminated) */
  size_t body_len;
  int truncated;   /* the body was longer than IDEM__HTTP_MAX_BODY */
  char error[512]; /* why, when the outcome is not APPLIED         */
} idem__http_answer;

/* NULL when this process can make HTTP requests, else why not, as a
** sentence: "HTTP tools need libcurl (...); install the package libcurl4",
** or "this libidem was built without HTTP support ...".  The first call
** loads libcurl (src/dl.c); thread-safe; static storage. */
const char *idem__http_missing(void);

/*
** Classify an exchange (no I/O: the fuzz target drives it).  sent: any byte
** of the request left this process; failed: the transfer ended in a
** transport error (timeout, reset, refused); a->status: the HTTP status, 0
** when no status line came.  Sets a->outcome and a->error:
**   refused or unresolved before sending -> NOT_APPLIED;
**   a transport failure after sending    -> UNKNOWN;
**   2xx -> APPLIED; 409, 429, 5xx -> the policy's on_409/on_429/on_5xx
**   (UNKNOWN by default); other 4xx -> REJECTED; anything else -> UNKNOWN.
*/
void idem__http_classify(const idem__http_rule *h, int sent, int failed,
                         const char *transport_error, idem__http_answer *a);

/* Fill template tmpl (template.c) with args (a JSON object text; NULL:
** {}) and key (NULL: none), percent-encoding for a URL (url) or checked for
** a header; NUL-terminated into b (reset first, capped at
** IDEM__HTTP_MAX_FILLED).  IDEM_OK, or an error with err saying why. */
int idem__http_fill(idem__buf *b, const char *tmpl, int url, const char *args,
                    size_t args_len, const char *key, char *err, size_t errn);

/* Make the request of tool rule h (of the tool named tool, for messages)
** with the key and arguments, within timeout_ms; a is filled (free it with
** idem__http_answer_free).  Returns 0, or -1 when the request could not
** even be built (a template that cannot be filled, a header over
** IDEM__HTTP_MAX_HEADER): a->error says why, nothing was sent, a->outcome
** is REJECTED - the same call would fail the same way - or NOT_APPLIED
** when HTTP is not available (idem__http_missing). */
int idem__http_request(const idem__http_rule *h, const char *tool,
                       const char *key, const char *args, size_t args_len,
                       long long timeout_ms, idem__http_answer *a);

void idem__http_answer_free(idem__http_answer *a);

#endif /* IDEM_HTTP_H */
