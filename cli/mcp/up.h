/*
** up.h - the two HTTP sides of `idem mcp` (MCP Streamable HTTP): the
** upstream client (upstream.c, over libcurl) and the front server
** (front.c, over libmicrohttpd), and who a message came from (gw_who),
** which both carry.  See upstream.c and front.c for their designs.
*/
#ifndef IDEM_MCP_UP_H
#define IDEM_MCP_UP_H

#include <stddef.h>

/* Who sent a client message, as the HTTP front saw it: held by reference
** by whatever keeps the message's request (a pending request, a guarded
** call) and by the upstream while it sends on its behalf.  NULL: the
** stdio client (one client, no credential of its own). */
typedef struct gw_who {
  int refs;
  char *sid;        /* its MCP session at idem (Mcp-Session-Id), or NULL */
  char *scope;      /* what its JSON-RPC ids are unique within: the session,
                    ** or for a request without one a nonce of its own */
  char caller[33];  /* a digest of the credential it presented, or "" */
  char *auth;       /* its Authorization, to pass upstream, or NULL */
  char *proto;      /* its MCP-Protocol-Version header, or NULL */
  long long frid;   /* the front request that carried it, or 0 */
  char *id;         /* that request's JSON-RPC id as the client sent it */
} gw_who;

gw_who *gw_who_ref(gw_who *w);
void gw_who_unref(gw_who *w);

/* ---- the upstream (upstream.c) ------------------------------------------------ */

typedef struct upstream upstream;

typedef struct up_opts {
  const char *url;
  char **headers;      /* "Name: value", filled ({$env:...} expanded) */
  int nheaders;
  int own_auth;        /* headers hold an Authorization: a client's is not passed */
  size_t max_message;  /* one answer's bound */
  const char *nonce;   /* marks the answers the upstream client made up */
  int wake_fd;         /* a byte is written here when messages are ready */
} up_opts;

/* A message from the upstream, as one line.  rel: the gateway's id of the
** request on whose answer stream it came (0: none, or unknown). */
typedef struct up_msg {
  struct up_msg *next;
  long long rel;
  char sid[48]; /* the idem session whose upstream session sent it, or "" */
  size_t len;
  char line[];
} up_msg;

/* Start the upstream client's thread; NULL with the reason in err. */
upstream *up_start(const up_opts *o, char *err, size_t errn);
/* Send one JSON-RPC message (no newline) on behalf of who. */
void up_send(upstream *u, const char *msg, size_t len, gw_who *who);
/* The session of who at idem ended: end its upstream session. */
void up_session_end(upstream *u, const char *sid);
/* Every message ready, oldest first (free each); *eof set once the
** upstream client has stopped (after up_close) and nothing more comes. */
up_msg *up_take(upstream *u, int *eof);
/* Stop: no more sends; the transfers in flight may finish for grace_ms,
** then the rest are answered as ended without a verdict, the sessions
** deleted (DELETE), and eof comes. */
void up_close(upstream *u, int grace_ms);
void up_free(upstream *u);

/* The JSON-RPC error member name under which the upstream client puts
** what HTTP said when it made up an answer: {"status", "sent",
** "headers":{...}, "body", "gateway": nonce}. */
#define UP_HTTP_KEY "io.idem/http"

#endif /* IDEM_MCP_UP_H */
