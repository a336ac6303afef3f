/*
** notes.c - what the MCP gateway in this process said about its server's
** tools (`idem mcp --console`: cli/mcp/tools.c reports, docs/MCP.md,
** "Notices"), for the console: the list in /api/info, the counts in
** /metrics.
**
** One registry per process, behind a mutex: the gateway's loop reports,
** the console's threads read.  The first NOTES_MAX notices are kept
** (tool, kind, words, when), each string cut to NOTE_BYTES; every notice
** is counted, kept or not.  A process without a gateway has none.
*/
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

#define NOTES_MAX 256
#define NOTE_BYTES 600

typedef struct note {
  int kind;
  long long at;
  char *tool, *what;
} note;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static note notes[NOTES_MAX];
static size_t nnotes;
static long long counts[3]; /* by kind */

/* s cut to NOTE_BYTES at a character, copied; NULL when memory ran out. */
static char *cut(const char *s) {
  size_t n = strlen(s);
  char *c;
  if (n > NOTE_BYTES) {
    n = NOTE_BYTES;
    while (n && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
  }
  if ((c = malloc(n + 1)) != NULL) {
    memcpy(c, s, n);
    c[n] = '\0';
  }
  return c;
}

void serve_note_tool(int kind, const char *tool, const char *what) {
  note n = {kind, cli_wall_ms(), NULL, NULL};
  if (kind != SERVE_TOOL_UNNAMED && kind != SERVE_TOOL_CHANGED) return;
  pthread_mutex_lock(&mu);
  counts[kind]++;
  if (nnotes < NOTES_MAX && (n.tool = cut(tool)) && (n.what = cut(what)))
    notes[nnotes++] = n;
  else {
    free(n.tool);
    free(n.what);
  }
  pthread_mutex_unlock(&mu);
}

void serve_notes_count(long long *unnamed, long long *changed) {
  pthread_mutex_lock(&mu);
  *unnamed = counts[SERVE_TOOL_UNNAMED];
  *changed = counts[SERVE_TOOL_CHANGED];
  pthread_mutex_unlock(&mu);
}

void serve_notes_json(cli_jsonw *w, const char *key) {
  size_t i;
  cli_jsonw_key(w, key);
  w->err |= cli_outbuf_put(&w->b, "[", 1);
  pthread_mutex_lock(&mu);
  for (i = 0; i < nnotes; i++) {
    if (i) w->err |= cli_outbuf_put(&w->b, ",", 1);
    cli_jsonw_open(w);
    cli_jsonw_str(w, "tool", notes[i].tool);
    cli_jsonw_str(w, "kind", notes[i].kind == SERVE_TOOL_UNNAMED
                                 ? "unnamed"
                                 : "annotations_changed");
    cli_jsonw_str(w, "message", notes[i].what);
    cli_jsonw_num(w, "at", notes[i].at);
    cli_jsonw_close(w);
  }
  pthread_mutex_unlock(&mu);
  w->err |= cli_outbuf_put(&w->b, "]", 1);
  w->first = 0;
}
