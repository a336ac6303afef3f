/*
** serve.h - `idem serve`, the operator's console (docs/CONSOLE.md): what
** its parts share.  serve.c listens and guards every request; api.c answers
** /api/...; metrics.c answers /metrics; reply.c makes the JSON answers
** both use; notes.c keeps what an MCP gateway in the process said about
** its server's tools.  The page's files are embedded by the build (serve_assets.c,
** made by cmake/embed.cmake from cli/serve/assets).
*/
#ifndef IDEM_CLI_SERVE_H
#define IDEM_CLI_SERVE_H

#include <microhttpd.h>

#include "cli.h"

/* A listening socket's names: the Host values that name it (a page of
** another site that made its name resolve to 127.0.0.1 is refused);
** any_host: listening beyond loopback, where every name is its own. */
typedef struct serve_names {
  char origin[300]; /* "http://HOST:PORT" as listened on */
  char hosts[4][300];
  int nhosts, any_host;
  unsigned port;
} serve_names;

/* Bind and listen on HOST:PORT ([V6]:PORT) for cmd's --listen; the socket
** and its names (*v6: an IPv6 one), or -1 after one error line. */
int serve_bind(const char *cmd, const char *listen, serve_names *nm, int *v6);
/* Does Host header h name the socket? */
int serve_host_ok(const serve_names *nm, const char *h);

typedef struct serve {
  idem_guard *g;          /* read, and written only by /api/resolve       */
  idem_policy *policy;    /* --policy, or NULL: settle_ms is not known    */
  int read_only;          /* --read-only: no write route at all           */
  char token[256];        /* what a write's Authorization must carry       */
  char csrf[40];          /* the idem_csrf cookie and X-Idem-CSRF header   */
  char log[1100];         /* the log as shown (a password hidden)          */
  serve_names nm;         /* its address, and the Host values naming it */
  int token_given;        /* the token came from IDEM_SERVE_TOKEN          */
  struct MHD_Daemon *d;
} serve;

/* Where and what to serve. */
typedef struct serve_options {
  const char *log;    /* the attempt log (NULL: the default one)      */
  const char *policy; /* a policy file, or NULL                       */
  const char *listen; /* HOST:PORT (NULL: 127.0.0.1:8787)             */
  int read_only;
} serve_options;

/* Open the log (and the policy) and serve it on the daemon's own threads:
** the console, or NULL after one error line (*usage: a bad option or
** IDEM_SERVE_TOKEN).  `idem serve` runs one; so does `idem mcp
** --console`, whose /metrics then count the gateway's own calls. */
serve *serve_start(const serve_options *o, int *usage);
/* Its address and how writes get their token, a line each, to f. */
void serve_announce(const serve *s, FILE *f);
/* Stop serving and close; NULL is a no-op. */
void serve_stop(serve *s);

/* An answer to one request: its status, media type and body - malloc'd
** (MHD frees it), or page, one of the embedded files. */
typedef struct serve_reply {
  unsigned status;
  const char *type;
  char *body;
  const unsigned char *page;
  size_t len;
  int set_csrf; /* send the idem_csrf cookie */
} serve_reply;

/* One request under /api/ (path after it), its body for a POST. */
void serve_api(serve *s, struct MHD_Connection *c, const char *method,
               const char *path, const char *body, size_t len,
               serve_reply *out);
/* /metrics, Prometheus text format 0.0.4. */
void serve_metrics(serve *s, serve_reply *out);
/* A JSON error answer {"error": text}. */
void serve_error(serve_reply *out, unsigned status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* A JSON answer: start it in w, with a canonicalizer of its own for the
** strings (0; -1 when memory ran out, and out is then the 500), then
** hand it over as out's body (a 500 if w ran out of room) and close w. */
int serve_json_open(serve_reply *out, cli_jsonw *w, size_t cap);
void serve_json_done(serve_reply *out, unsigned status, cli_jsonw *w);
/* Drop w unsent (an answer that became an error). */
void serve_json_drop(cli_jsonw *w);

/* ---- notes.c: the MCP gateway's notices on its server's tools ------------ */

/* A tools/list named a tool the policy does not (UNNAMED), or changed a
** tool's annotations (CHANGED): said by `idem mcp` (cli/mcp/tools.c) once
** per tool and change, in the words of its idem: line.  Any thread. */
enum { SERVE_TOOL_UNNAMED = 1, SERVE_TOOL_CHANGED = 2 };
void serve_note_tool(int kind, const char *tool, const char *what);
/* How many of each were said in this process. */
void serve_notes_count(long long *unnamed, long long *changed);
/* Member key of w: the first 256 notices, oldest first, each
** {"tool", "kind": "unnamed" | "annotations_changed", "message", "at"}. */
void serve_notes_json(cli_jsonw *w, const char *key);

/* The embedded files of the page. */
typedef struct serve_asset {
  const char *path, *type;
  const unsigned char *data;
  size_t len;
} serve_asset;
extern const serve_asset serve_assets[]; /* ends with a NULL path */

#endif /* IDEM_CLI_SERVE_H */
