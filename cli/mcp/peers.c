/*
** peers.c - the gateway's two peers as the rest of `idem mcp` sees them:
** output queued whole per line and flushed as each side accepts it, the
** table of requests sent to the server by the gateway's ids, what the
** server's state says, and which class a tool has.  The loop (gateway.c)
** and the guarded calls (call.c) both use these; they use neither.
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gw.h"

char *gw_dupn(const char *p, size_t n) {
  char *q = malloc(n + 1);
  if (q) {
    memcpy(q, p, n);
    q[n] = '\0';
  }
  return q;
}

void gw_oom(void) {
  cli_err("out of memory");
  exit(EXIT_FAIL);
}

/* ---- output --------------------------------------------------------------------- */

void gw_to_client(gw *w, const char *p, size_t n) {
  if (w->cout_dead) return;
  if (cli_outbuf_put(&w->cout, p, n)) gw_oom();
}

void gw_to_server(gw *w, const char *p, size_t n) {
  if (w->sout_closed) return;
  if (cli_outbuf_put(&w->sout, p, n)) gw_oom();
  if (w->up && n && p[n - 1] == '\n') gw_server_push(w);
}

void gw_server_push(gw *w) {
  char *nl;
  if (!w->up) return;
  while (w->sout.len && (nl = memchr(w->sout.p, '\n', w->sout.len))) {
    size_t k = (size_t)(nl - w->sout.p);
    if (!w->sout_closed) up_send(w->up, w->sout.p, k, w->who);
    cli_outbuf_consume(&w->sout, k + 1);
  }
}

/* The client's output, in front mode: each whole line to its request. */
static void flush_front(gw *w) {
  char *nl;
  while (w->cout.len && (nl = memchr(w->cout.p, '\n', w->cout.len))) {
    size_t k = (size_t)(nl - w->cout.p);
    front_to_client(w->front, w->cout.p, k);
    cli_outbuf_consume(&w->cout, k + 1);
    w->cout_out += k + 1;
  }
}

/* Write what fd takes now, counting it in *done; -1 when the peer is
** gone. */
static int flush_fd(int fd, cli_outbuf *b, unsigned long long *done) {
  while (b->len) {
    ssize_t k = write(fd, b->p, b->len);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return -1;
    }
    cli_outbuf_consume(b, (size_t)k);
    *done += (unsigned long long)k;
  }
  return 0;
}

void gw_flush(gw *w) {
  unsigned long long sent = 0;
  if (w->front) flush_front(w);
  if (!w->front && !w->cout_dead && w->cout.len && flush_fd(1, &w->cout, &w->cout_out)) {
    w->cout_dead = 1;
    w->cout.len = 0;
  }
  if (!w->up && !w->sout_closed && w->sout.len && flush_fd(w->to_srv, &w->sout, &sent)) {
    w->sout_closed = 1;
    w->sout.len = 0;
    close(w->to_srv);
  }
}

void gw_client_error(gw *w, const char *id, size_t idlen, int code,
                     const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!w->cout_dead && mcp_put_error(&w->cout, id, idlen, code, msg)) gw_oom();
}

/* ---- pending server requests ------------------------------------------------------- */

pend *gw_pend_add(gw *w, int kind) {
  pend *p = calloc(1, sizeof *p);
  if (!p) gw_oom();
  p->gid = ++w->next_gid;
  p->kind = kind;
  p->next = w->buckets[p->gid % BUCKETS];
  w->buckets[p->gid % BUCKETS] = p;
  return p;
}

pend *gw_pend_find(gw *w, long long gid) {
  pend *p;
  if (gid <= 0) return NULL;
  for (p = w->buckets[gid % BUCKETS]; p; p = p->next)
    if (p->gid == gid) return p;
  return NULL;
}

void gw_pend_remove(gw *w, pend *p) {
  pend **pp = &w->buckets[p->gid % BUCKETS];
  while (*pp != p) pp = &(*pp)->next;
  *pp = p->next;
  free(p->cid);
  json_decref(p->cidv);
  gw_who_unref(p->who);
  free(p);
}

/* ---- workers ------------------------------------------------------------------------ */

/* ---- live calls ------------------------------------------------------------------------ */

/* ---- a guarded call's steps --------------------------------------------------------- */

int gw_server_gone(gw *w) { return w->sin_eof || w->sout_closed; }

const char *gw_gone_why(const gw *w) {
  if (w->gone_why) return w->gone_why;
  return w->child_done ? "the server has exited"
                       : "the server no longer reads its input";
}

/* ---- from the client ------------------------------------------------------------------ */

void gw_forward_request(gw *w, const char *line, size_t len, const mcp_msg *m) {
  char gid[32];
  pend *p;
  if (gw_server_gone(w)) {
    gw_client_error(w, line + m->id_s, m->id_e - m->id_s, -32603, "idem: %s",
                    gw_gone_why(w));
    return;
  }
  p = gw_pend_add(w, P_FWD);
  if (!(p->cid = gw_dupn(line + m->id_s, m->id_e - m->id_s))) gw_oom();
  p->cidlen = m->id_e - m->id_s;
  p->cidv = json_incref(m->id);
  p->tools_list = strcmp(m->method, "tools/list") == 0;
  p->who = gw_who_ref(w->who);
  snprintf(gid, sizeof gid, "%lld", p->gid);
  if (mcp_splice(&w->sout, line, len, m->id_s, m->id_e, gid, strlen(gid)))
    gw_oom();
  gw_server_push(w);
}

int gw_tool_class(gw *w, const char *tool) {
  idem_tool_info r = {.size = sizeof r};
  json_t *l;
  idem_policy_tool(w->policy, tool, &r);
  if (r.named) return r.cls; /* the policy always wins */
  if ((l = json_object_get(w->learned, tool)))
    return (int)json_integer_value(l);
  return r.cls; /* the policy's unknown_tools */
}
