/*
** gw.h - the inside of `idem mcp`, one way round: gateway.c (the loop,
** ids, the child process) uses call.c (guarded calls: their steps through
** the guard, the worker threads, the answers) and peers.c (output queues,
** pending requests, the server's state, tool classes); call.c uses
** peers.c; peers.c uses neither.  jsonrpc.c (mcp.h) is the message layer
** under all three.  See gateway.c for the design.
*/
#ifndef IDEM_MCP_GW_H
#define IDEM_MCP_GW_H

#include <pthread.h>
#include <sys/types.h>

#include "cli.h"
#include "run/run.h"
#include "mcp.h"
#include "front.h"
#include "up.h"

#define DEFAULT_MAX_MESSAGE ((size_t)4 << 20)
#define WORKERS 4
#define BUCKETS 1024
#define QUEUE_HIGH ((size_t)16 << 20) /* stop reading the other side */
#define GRACE_MS 2000 /* after the client's EOF, before SIGTERM, SIGKILL */

enum { P_FWD = 1, P_EXEC, P_CHECK, P_LATE, P_DROP };
enum { T_NONE = 0, T_DELAY, T_WAIT, T_DEADLINE };
enum { J_BEGIN = 1, J_FINISH, J_RESOLVE, J_POLL, J_DELIVER, J_LATE, J_CMD };

typedef struct gw gw;
typedef struct gcall gcall;

/* A request the gateway sent to the server, by the id it gave it. */
typedef struct pend {
  long long gid;
  int kind;       /* P_*                                      */
  char *cid;      /* P_FWD: the client's id, raw JSON text    */
  size_t cidlen;  /*                                          */
  json_t *cidv;   /* P_FWD: the client's id, parsed           */
  int tools_list; /* P_FWD: a tools/list, whose result we learn */
  gcall *c;       /* P_EXEC, P_CHECK: the call; P_LATE: the late */
  gw_who *who;    /* P_FWD: who sent it (HTTP clients), or NULL  */
  struct pend *next;
} pend;

/* One guarded call (or, with s == NULL, one late result to record). */
struct gcall {
  gw *gw;
  idem_guard *g;
  char *cid;
  size_t cidlen;
  json_t *cidv;
  char *session, *call_id, *tool;
  char *turn; /* _meta "io.idem/turn", or NULL */
  gw_who *who; /* who called (an HTTP client), or NULL: stdio */
  char *args;
  size_t args_len;
  json_t *meta; /* the client's _meta, sent on downstream */
  idem_step *s;
  /* the worker's job: its inputs, its status and message */
  int job, rc, deliver;
  int stamp; /* deliver, and the client is there: record it told (SPEC   */
             /* §10): undone when its answer's write fails               */
  unsigned long long out_end; /* held: the client's output written up to */
                              /* here holds its whole answer              */
  gcall *hnext;
  int outcome;
  int ended; /* the server answered this execute: the attempt has ENDED -  */
             /* finished only when the outcome is a verdict; an UNKNOWN     */
             /* (isError under the default on_is_error, -32603, no tool    */
             /* result) may still land until settle_ms from now (SPEC §6a) */
  char *result, *error;
  size_t result_len;
  char errmsg[512];
  long long token; /* the lease token of the execute in flight */
  /* the server's own answer to this call's last execute */
  int fresh;          /* IDEM_OUTCOME_APPLIED / _REJECTED, or 0 */
  int checked;        /* this call's own status check found it applied */
  int fresh_is_error; /* fresh_text is a JSON-RPC error object */
  char *fresh_text;   /* its "result" or "error" member, raw */
  size_t fresh_len;
  long long gid; /* the server request in flight, or 0 */
  int timer;
  long long due;
  int cancelled; /* the client cancelled it: no answer */
  gcall *prev, *next, *qnext;
};

struct gw {
  idem_policy *policy;  /* the user's                                */
  idem_policy *gpolicy; /* the same with unknown_tools "guard"       */
  idem_guard *g_user, *g_guarded;
  const char *session;
  size_t max_message;
  json_t *learned;  /* tool name -> class, from tools/list: a floor */
  json_t *weakened; /* tool name -> the weaker class last ignored  */
  pid_t child;
  int to_srv, from_srv;
  int child_done, child_status, we_killed;
  int output_closed;    /* the server closed its stdout and lived on */
  const char *gone_why; /* why nothing more reaches the server, or NULL */
  char nonce[24];       /* this process's: scopes JSON-RPC ids as call ids */
  long long grace_at;
  int grace_stage;
  mcp_lines cin, sin;
  cli_outbuf cout, sout;
  int cin_eof, sin_eof, cout_dead, sout_closed;
  unsigned long long cout_out; /* bytes written to the client in all */
  gcall *held; /* answered, recorded told, the answer not yet written */
  pend *buckets[BUCKETS];
  long long next_gid;
  gcall *live;
  int nlive;
  /* workers */
  pthread_t th[WORKERS];
  int nth;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  gcall *qhead, *qtail, *done;
  int busy; /* jobs a worker is running */
  int stop;
  int wake[2], sig[2];
  /* the HTTP sides (SPEC §10b): NULL where the peer is stdio */
  front *front;      /* --listen: the clients                           */
  upstream *up;      /* -- URL: the server                              */
  gw_who *who;       /* who sent the client message being handled       */
  long long rel;     /* the request the server message being handled    */
                     /* came about (its answer stream's), or 0          */
  const char *rel_sid; /* else the idem session whose stream it came on */
  const char **id_keys; /* _meta members that name a call (--call-id-meta) */
  int nid_keys;
  void *tools_seen; /* tools.c: what tools/list said before */
};

/* ---- peers.c: the loop's services, for gateway.c and call.c ------------- */

/* Milliseconds of the monotonic clock. */
/* A copy of n bytes, NUL-terminated; NULL when memory ran out. */
char *gw_dupn(const char *p, size_t n);
/* Out of memory in the gateway: say so and exit (the child follows). */
void gw_oom(void);
/* Queue one whole message (or its pieces, in order) to a peer. */
void gw_to_client(gw *w, const char *p, size_t n);
void gw_to_server(gw *w, const char *p, size_t n);
/* Hand what is queued for an HTTP server, whole lines, to the upstream
** client on behalf of w->who (a no-op for a stdio server). */
void gw_server_push(gw *w);
/* Write what both peers take now of what is queued for them. */
void gw_flush(gw *w);
/* (call.c) Hold c, answered and recorded told, until its answer (the last
** thing queued for the client) is written. */
void gw_hold(gw *w, gcall *c);
/* (call.c) Settle the held calls after a flush: an answer written whole
** stays told, one whose write failed (the client is gone) is told no more;
** at_end: the gateway ends, and an answer not yet written never will be. */
void gw_settle(gw *w, int at_end);
/* Queue a JSON-RPC error response to the client (id is raw JSON text). */
void gw_client_error(gw *w, const char *id, size_t idlen, int code,
                     const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
/* A request to the server under a new id of the gateway's; by its id. */
pend *gw_pend_add(gw *w, int kind);
pend *gw_pend_find(gw *w, long long gid);
void gw_pend_remove(gw *w, pend *p);
/* The server's stdout or stdin is closed: nothing more can be sent; and
** why, in words ("the server closed its output"). */
int gw_server_gone(gw *w);
const char *gw_gone_why(const gw *w);
/* Forward a client request to the server under a new id. */
void gw_forward_request(gw *w, const char *line, size_t len, const mcp_msg *m);
/* A tool's class: the policy's, else its annotations', else unknown_tools. */
int gw_tool_class(gw *w, const char *tool);

/* ---- call.c: guarded calls, for gateway.c ---------------------------------- */

/* The worker threads' body, and handing a call's next job to them. */
void *gw_worker(void *arg);
void gw_submit(gw *w, gcall *c, int job);
/* Set the input of a call's next job: an outcome, a result, an error. */
void gw_set_input(gcall *c, int outcome, const char *result, size_t len,
                  const char *error);
/* A job came back from a worker: take the call's next step. */
void gw_job_done(gw *w, gcall *c);
/* A tools/call of a guarded (or refused) tool from the client. */
void gw_handle_call(gw *w, const char *line, size_t len, const mcp_msg *m);
/* The server answered an execute (on time, or late: gw_take_answer). */
void gw_on_exec_answer(gw *w, gcall *c, const mcp_msg *m, const char *line,
                       size_t len);
int gw_take_answer(gcall *c, const mcp_msg *m, const char *line, size_t len,
                   const char **text, size_t *tlen, int *is_error);
/* The server answered a status check. */
void gw_on_check_answer(gw *w, gcall *c, const mcp_msg *m, const char *line,
                        size_t len);
/* A call's timer is due: send the delayed execute, poll, or give up. */
void gw_fire(gw *w, gcall *c);
/* The calls in flight (w->live), and freeing one. */
void gw_live_add(gw *w, gcall *c);
void gw_live_remove(gw *w, gcall *c);
void gw_gcall_free(gcall *c);
/* (tools.c) Learn a tools/list result: the classes of the tools it lists
** (floors: a class never weakens), and the notices on them (docs/MCP.md). */
void gw_learn_tools(gw *w, const json_t *result);

#endif /* IDEM_MCP_GW_H */
