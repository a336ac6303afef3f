/*
** mcp.h - the MCP gateway's message handling (jsonrpc.c), shared by
** `idem mcp` (gateway.c, call.c, peers.c) and its fuzz target
** (fuzz/fuzz_mcp.c).
**
** Messages are lines of JSON-RPC 2.0 (MCP's stdio transport).  A line is
** parsed with jansson to learn what it is, but it is forwarded as the bytes
** it came as: the gateway changes only what it must (a request id) by
** splicing bytes at spans found by a small scanner, so numbers, member
** order and escapes reach the other side exactly as they were sent.
*/
#ifndef IDEM_MCP_H
#define IDEM_MCP_H

#include <jansson.h>
#include <stddef.h>
#include <sys/types.h>

#include "buf.h"

/* Buffers are the command's (buf.h): a cap, and a NUL after the bytes. */

/* ---- lines ------------------------------------------------------------------ */

/* One direction's input: bytes in, whole lines out.  A line longer than
** max is not kept: its first bytes (up to MCP_PREFIX) are handed over once
** with oversized set, so that its id can be recovered, and the rest is
** skipped up to the next newline. */
#define MCP_PREFIX 65536

typedef struct mcp_lines {
  cli_outbuf b;
  size_t max;
  int skipping; /* inside an oversized line */
} mcp_lines;

typedef void (*mcp_line_fn)(void *ctx, const char *line, size_t len,
                            int oversized);

void mcp_lines_init(mcp_lines *l, size_t max);
void mcp_lines_free(mcp_lines *l);
/* Feed bytes; fn is called for every complete non-empty line (without its
** newline and a CR before it).  -1 when memory ran out. */
int mcp_lines_feed(mcp_lines *l, const char *p, size_t n, mcp_line_fn fn,
                   void *ctx);
/* At end of input: a last line without a newline is still a line. */
void mcp_lines_end(mcp_lines *l, mcp_line_fn fn, void *ctx);

/* ---- the raw scanner ---------------------------------------------------------- */

/* The end of the JSON value starting at p[i] (after whitespace), or
** (size_t)-1 when the text is malformed or ends first. */
size_t mcp_skip_value(const char *p, size_t n, size_t i);

/* Find member `name` (compared as raw bytes between the quotes) of the
** object at p[0..n): 1 and its value's span [*vs, *ve), 0 when absent, -1
** when the text is not an object or is cut before the member is found. */
int mcp_member(const char *p, size_t n, const char *name, size_t *vs,
               size_t *ve);

/* ---- messages ------------------------------------------------------------------ */

enum {
  MCP_REQUEST = 1,  /* method and id */
  MCP_NOTIFY = 2,   /* method, no id */
  MCP_RESPONSE = 3, /* id and result or error, no method */
  MCP_INVALID = 4   /* JSON, but not a JSON-RPC message */
};

typedef struct mcp_msg {
  json_t *root;       /* the parsed line (owned)                     */
  int kind;           /* MCP_*                                       */
  const char *method; /* borrowed from root, or NULL                 */
  json_t *id;         /* borrowed from root, or NULL                 */
  size_t id_s, id_e;  /* the id's raw span in the line (id_e > 0)    */
  json_t *params;     /* borrowed, or NULL                           */
} mcp_msg;

/* Parse one line.  0 on success (m->kind says what it is); -1 on a JSON
** error, with the message in err. */
int mcp_msg_parse(const char *line, size_t len, mcp_msg *m, char *err,
                  size_t errn);
void mcp_msg_free(mcp_msg *m);

/* The id found in the first bytes of a line (an oversized one): its raw
** span, or 0 when none was found before the cut. */
int mcp_prefix_id(const char *p, size_t n, size_t *vs, size_t *ve);

/* What kind of JSON value v is, in words for a message: "a string", "a
** number", "an object", "an array", "null", "true or false"; "missing"
** for NULL. */
const char *mcp_json_kind(const json_t *v);

/* Append line with the bytes [vs, ve) replaced by repl, and a newline. */
int mcp_splice(cli_outbuf *out, const char *line, size_t len, size_t vs,
               size_t ve, const char *repl, size_t rlen);

/* Append a JSON-RPC error response: id is raw JSON text (NULL: null). */
int mcp_put_error(cli_outbuf *out, const char *id, size_t idlen, int code,
                  const char *message);

/* Write the object text obj with the members of add merged into its
** "_meta" (created when absent) to out (no newline).  -1 when obj is not
** an object. */
int mcp_put_with_meta(cli_outbuf *out, const char *obj, size_t len,
                      const json_t *add);

/* ---- server-sent events (sse.c) ----------------------------------------------- */

/* One text/event-stream being read.  The last event id stays across
** events (has_id, id): a reader resumes the stream with it. */
typedef struct mcp_sse {
  cli_outbuf line, data;
  char id[256];
  int has_id;
  int has_data, oversized, line_over, cr, started, bom;
} mcp_sse;

/* An event's data (n bytes, NUL after), or with oversized set NULL: an
** event longer than the limit, skipped. */
typedef void (*mcp_sse_fn)(void *ctx, const char *data, size_t n,
                           int oversized);

void mcp_sse_init(mcp_sse *s, size_t max);
void mcp_sse_free(mcp_sse *s);
/* Feed bytes; fn is called for every whole event.  -1: out of memory. */
int mcp_sse_feed(mcp_sse *s, const char *p, size_t n, mcp_sse_fn fn,
                 void *ctx);

/* ---- a server over stdio (spawn.c) ------------------------------------------- */

/* Start argv (found on PATH) with pipes on its stdin (*to) and stdout
** (*from), in a process group of its own, dying with us; 0 or an errno. */
int mcp_spawn(char **argv, pid_t *child, int *to, int *from);

/* ---- tools ------------------------------------------------------------------------- */

/* The class a tool's annotations give it (SPEC §10): readOnlyHint true ->
** read_only; anything else (no annotations at all, idempotentHint alone)
** -> guarded.  Never idempotent: only the policy says that. */
int mcp_class_of(const json_t *tool);

/* Does a status tool's result (the "result" member of its answer: parsed,
** and its raw text) say "applied"?  fn gives the policy's verdict on one
** JSON text (idem_step_check_verdict); the texts asked are the whole
** result, its structuredContent, then each text content item (MCP servers
** often put their JSON there).  IDEM_OUTCOME_APPLIED when one of them
** shows the action, else IDEM_OUTCOME_NOT_APPLIED. */
typedef int (*mcp_verdict_fn)(void *ctx, const char *text, size_t len);
int mcp_verdict(const json_t *result, const char *raw, size_t len,
                mcp_verdict_fn fn, void *ctx);

/* ---- a policy drafted from tools/list (draft.c, suggest.c) ------------------ */

/* What a draft holds, and what of the listing it left out. */
typedef struct mcp_draft_info {
  size_t tools, guarded, read_only; /* rules written                  */
  size_t with_status;               /* guarded rules given a status   */
  size_t skipped;  /* entries without a name (not a non-empty string)  */
  size_t repeated; /* names listed again: the first entry was kept     */
} mcp_draft_info;

/* The draft policy (docs/MCP.md, "Drafting a policy") for the tools a
** server listed: the "tools" arrays of every tools/list page in one array,
** as sent; anything in it may be malformed, and the draft is still a
** policy idem_policy_parse accepts.  A new object (json_decref it), or
** NULL when memory ran out. */
json_t *mcp_draft_policy(const json_t *tools, mcp_draft_info *info);

/* `idem mcp --suggest-policy ... -- COMMAND [ARGS...] | URL`: connect,
** list the tools, print the draft on stdout; an exit status (cli.h). */
int mcp_suggest(int argc, char **argv);

#endif /* IDEM_MCP_H */
