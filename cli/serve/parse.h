/*
** parse.h - what `idem serve` reads from its clients, apart from HTTP
** itself (libmicrohttpd parses that): a listing's cursor and a verdict's
** body.  Neither needs the server, so fuzz/fuzz_serve.c drives both.
*/
#ifndef IDEM_CLI_SERVE_PARSE_H
#define IDEM_CLI_SERVE_PARSE_H

#include <jansson.h>

#include "cli.h"

/* The cursor of the page after the record (created, session, call_id): a
** new NUL-terminated text (free()), or NULL when memory ran out.  Opaque
** to clients: hex of JSON members. */
char *serve_cursor_make(idem_canon *c, long long created, const char *session,
                        const char *call_id);

/* A cursor read back: the filter's after_* (strings held by held). */
typedef struct serve_cursor {
  long long created;
  const char *session, *call_id;
  json_t *held;
} serve_cursor;
/* 0, or -1 when hex is not a cursor this console made. */
int serve_cursor_read(const char *hex, serve_cursor *out);

/* A verdict's body:
**   {"session":S,"call_id":C,"verdict":"applied"|"not_applied",
**    "result":JSON-TEXT,"reason":TEXT,"by":TEXT}
** (result and by optional; reason required with not_applied, which takes
** no result). */
typedef struct serve_verdict {
  const char *session, *call_id, *result, *reason, *by;
  int outcome; /* IDEM_OUTCOME_APPLIED or IDEM_OUTCOME_NOT_APPLIED */
  json_t *held;
} serve_verdict;
/* 0, or -1 with what is wrong in err (the held object freed). */
int serve_verdict_read(const char *body, size_t len, serve_verdict *v,
                       char *err, size_t n);
void serve_verdict_free(serve_verdict *v);

#endif /* IDEM_CLI_SERVE_PARSE_H */
