/*
** front.h - `idem mcp --listen`: the gateway's clients over MCP's
** Streamable HTTP (front.c), as the loop (gateway.c, call.c) sees them.
*/
#ifndef IDEM_MCP_FRONT_H
#define IDEM_MCP_FRONT_H

#include <stddef.h>

#include "up.h"

typedef struct front front;

typedef struct front_opts {
  const char *listen;        /* HOST:PORT                                   */
  size_t max_body;           /* one message's bound (--max-message)         */
  int max_connections;
  int request_s;             /* a request arrives whole within this (s)     */
  const char **origins;      /* --allow-origin, beyond loopback's own       */
  int norigins;
  const char *caller_header; /* --caller-header: names the caller, or NULL  */
  const char *token;         /* IDEM_MCP_TOKEN: clients must present it     */
  int pass_auth;             /* clients' Authorization passes upstream      */
  const char *public_url;    /* --public-url, or NULL                       */
  const char *upstream_url;  /* the upstream's URL (for /.well-known/)      */
  const char *nonce;         /* marks the upstream client's made-up answers */
  int wake_fd;               /* a byte is written here when messages wait   */
} front_opts;

enum { FI_MSG = 1, FI_GONE, FI_END_SESSION };

/* What came from the clients, in order.  FI_MSG: one message as a line
** (a request's id is the front's own number, frid); FI_GONE: the client of
** request frid left before its answer; FI_END_SESSION: the session line
** ended (DELETE). */
typedef struct front_in {
  struct front_in *next;
  int kind;
  gw_who *who; /* FI_MSG: who sent it (a reference, the message's) */
  long long frid;
  size_t len;
  char line[];
} front_in;

/* Listen and serve; NULL after an error line. */
front *front_start(const front_opts *o);
const char *front_url(const front *f);
void front_stop(front *f);

front_in *front_take(front *f);
void front_in_free(front_in *m);
/* One whole answer (a response to a request of the front's numbering). */
void front_to_client(front *f, const char *line, size_t len);
/* A server's message about request frid (or, failing that, for session
** sid's GET stream); -1 when no stream can take it. */
int front_server_msg(front *f, long long frid, const char *sid,
                     const char *line, size_t len);
/* Is the client of request frid still there to be answered? */
int front_alive(front *f, long long frid);
/* Keep request frid until front_told has said how its answer went: 1
** written whole, -1 not (the client left), 0 not yet (at_end: -1). */
void front_pin(front *f, long long frid);
int front_told(front *f, long long frid, int at_end);

#endif /* IDEM_MCP_FRONT_H */
