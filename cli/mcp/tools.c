/*
** tools.c - what `idem mcp` learns from the server's tools/list answers
** (SPEC §10; docs/MCP.md, "Notices"): the class of each tool the policy
** does not name, and what a person should hear about the listing.
**
** Classes.  A tool's class comes from its annotations (mcp_class_of:
** readOnlyHint true is read_only, anything else guarded) and never weakens
** while the gateway runs: the first listing, or a stronger later one, is
** its floor (w->learned).  A re-list that would weaken it is ignored, in
** one idem: line per tool and weaker class (w->weakened), or a call the
** guard took for an action would pass unrecorded from then on.  A tool the
** policy names is the policy's, whatever its hints.
**
** Notices, each once: a listed tool the policy does not name (per tool),
** and a tool whose annotations differ from its previous listing (per tool
** and new annotations, compared as JSON values: member order is no
** change).  Each is an idem: line on stderr and goes to the console's
** registry (serve_note_tool: /api/info, /metrics).  A weakening that is
** ignored is that change's line.
**
** State (w->tools_seen, made on the first listing): each tool's last
** annotations, and the notices said.  Bounds: names and annotations are
** shown cut and escaped for a terminal; after NOTICES_MAX lines one more
** says the rest are only counted; at most SEEN_MAX tools are watched for
** changes.  Whatever the server lists - names that are not strings,
** annotations that are not objects, huge lists - is read without harm:
** what is not a tool is passed over (it still reaches the client as it
** came).  The state lives as long as the process: it is kept on a list
** of the process's own, where a leak checker sees it held.
*/
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gw.h"
#include "serve/serve.h"

#define NOTICES_MAX 200
#define SEEN_MAX 100000

typedef struct seen {
  json_t *ann;   /* tool name -> its annotations when last listed (null) */
  json_t *said;  /* "unnamed\nNAME", "NAME\nANNOTATIONS" -> true          */
  size_t lines;  /* notices said on stderr                                */
  struct seen *next;
} seen;

static pthread_mutex_t all_mu = PTHREAD_MUTEX_INITIALIZER;
static seen *all; /* every gateway's, for the life of the process */

static seen *seen_of(gw *w) {
  seen *s = w->tools_seen;
  if (s) return s;
  if (!(s = calloc(1, sizeof *s)) || !(s->ann = json_object()) ||
      !(s->said = json_object()))
    gw_oom();
  pthread_mutex_lock(&all_mu);
  s->next = all;
  all = s;
  pthread_mutex_unlock(&all_mu);
  return w->tools_seen = s;
}

/* Text from the server for a line: cut to max bytes, escaped (cli_text). */
static const char *shown(cli_outbuf *o, const char *s, size_t max) {
  size_t n = strlen(s);
  char *c = NULL;
  o->len = 0;
  if (n > max) {
    while (max && ((unsigned char)s[max] & 0xC0) == 0x80) max--;
    if ((c = malloc(max + 4)) != NULL) {
      memcpy(c, s, max);
      memcpy(c + max, "...", 4);
    }
    s = c ? c : "...";
  }
  if (cli_text(o, s, 0) || cli_outbuf_put(o, "", 1)) gw_oom();
  free(c);
  return o->p;
}

/* Annotations as compact JSON with sorted members ("none" for NULL). */
static char *ann_text(const json_t *a) {
  char *t = a ? json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS) : strdup("none");
  if (!t) gw_oom();
  return t;
}

/* Has this notice been said?  If not, it is now (1). */
static int first_time(seen *s, const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  char *k = malloc(la + lb + 2);
  int fresh;
  if (!k) gw_oom();
  memcpy(k, a, la);
  k[la] = '\n';
  memcpy(k + la + 1, b, lb + 1);
  fresh = !json_object_get(s->said, k);
  if (fresh && json_object_set_new(s->said, k, json_true())) gw_oom();
  free(k);
  return fresh;
}

/* One notice: to stderr (until NOTICES_MAX), and to the console. */
static void notice(seen *s, int kind, const char *tool, const char *text) {
  serve_note_tool(kind, tool, text);
  if (s->lines < NOTICES_MAX)
    cli_err("%s", text);
  else if (s->lines == NOTICES_MAX)
    cli_err("more notices on the server's tools are not shown here; the "
            "console counts them (idem mcp --console)");
  s->lines++;
}

static void say_unnamed(seen *s, const char *name, int cls) {
  cli_outbuf o, t;
  if (!first_time(s, "unnamed", name)) return;
  cli_outbuf_init(&o, (size_t)1 << 20);
  cli_outbuf_init(&t, (size_t)1 << 20);
  if (cli_outbuf_str(&t, "tools/list lists ") ||
      cli_outbuf_str(&t, shown(&o, name, 100)) ||
      cli_outbuf_str(&t, ", which the policy does not name: it is ") ||
      cli_outbuf_str(&t, cls == IDEM_CLASS_READ_ONLY
                             ? "read_only (readOnlyHint: true)"
                             : "guarded") ||
      cli_outbuf_str(&t, ", from its annotations; name it in the policy to "
                         "decide (idem mcp --suggest-policy drafts one)") ||
      cli_outbuf_put(&t, "", 1))
    gw_oom();
  notice(s, SERVE_TOOL_UNNAMED, name, t.p);
  cli_outbuf_free(&o);
  cli_outbuf_free(&t);
}

/* The annotations of name changed from before to now (either "none"). */
static void say_change(seen *s, const char *name, const char *before,
                       const char *now, const char *verdict) {
  cli_outbuf o, t;
  cli_outbuf_init(&o, (size_t)1 << 20);
  cli_outbuf_init(&t, (size_t)1 << 20);
  if (cli_outbuf_str(&t, "tools/list changes the annotations of ") ||
      cli_outbuf_str(&t, shown(&o, name, 100)) ||
      cli_outbuf_str(&t, ": ") || cli_outbuf_str(&t, shown(&o, before, 200)) ||
      cli_outbuf_str(&t, " before, ") ||
      cli_outbuf_str(&t, shown(&o, now, 200)) ||
      cli_outbuf_str(&t, " now; ") || cli_outbuf_str(&t, verdict) ||
      cli_outbuf_put(&t, "", 1))
    gw_oom();
  notice(s, SERVE_TOOL_CHANGED, name, t.p);
  cli_outbuf_free(&o);
  cli_outbuf_free(&t);
}

/* Remember name's annotations a; 1 when they differ from its last
** listing's (a first listing is no change), with both texts (free them). */
static int changed(seen *s, const char *name, const json_t *a, char **before,
                   char **now) {
  json_t *was = json_object_get(s->ann, name);
  int differ;
  *before = *now = NULL;
  if (!was && json_object_size(s->ann) >= SEEN_MAX) return 0;
  differ = was && !(json_is_null(was) ? a == NULL : a && json_equal(was, a));
  if (differ) {
    *before = ann_text(json_is_null(was) ? NULL : was);
    *now = ann_text(a);
  }
  if (!was || differ) {
    json_t *copy = a ? json_deep_copy(a) : json_null();
    if (!copy || json_object_set_new(s->ann, name, copy)) gw_oom();
  }
  return differ;
}

void gw_learn_tools(gw *w, const json_t *result) {
  static const char *const word[] = {"", "guarded", "idempotent", "read_only"};
  const json_t *tools = json_object_get(result, "tools"), *t;
  seen *s = seen_of(w);
  size_t i;
  json_array_foreach(tools, i, t) {
    const char *name = json_string_value(json_object_get(t, "name"));
    const json_t *a = json_object_get(t, "annotations");
    json_t *was;
    int cls = mcp_class_of(t), floor, differ;
    char *before, *now;
    idem_tool_info r = {.size = sizeof r};
    if (!name || !*name) continue; /* no tool a call could name */
    if (!json_is_object(a)) a = NULL;
    idem_policy_tool(w->policy, name, &r);
    if (!r.named) say_unnamed(s, name, cls);
    differ = changed(s, name, a, &before, &now);
    was = json_object_get(w->learned, name);
    floor = was ? (int)json_integer_value(was) : 0;
    if (!floor || cls < floor) { /* first seen, or stronger */
      if (json_object_set_new(w->learned, name, json_integer(cls))) gw_oom();
      if (differ && first_time(s, name, now))
        say_change(s, name, before, now,
                   r.named ? "the policy names it, and its class stays the "
                             "policy's"
                           : "it is guarded from now on");
    } else if (cls > floor && !r.named &&
               json_integer_value(json_object_get(w->weakened, name)) != cls) {
      char line[600];
      cli_outbuf o;
      cli_outbuf_init(&o, (size_t)1 << 20);
      if (json_object_set_new(w->weakened, name, json_integer(cls))) gw_oom();
      if (differ) first_time(s, name, now); /* this line says the change */
      snprintf(line, sizeof line,
               "tools/list gives %s readOnlyHint: true; ignored: it was "
               "listed %s before, and a tool's class never weakens while the "
               "gateway runs (annotations are hints; the policy can class it)",
               shown(&o, name, 100), word[floor]);
      notice(s, SERVE_TOOL_CHANGED, name, line);
      cli_outbuf_free(&o);
    } else if (differ && first_time(s, name, now)) {
      char verdict[100];
      snprintf(verdict, sizeof verdict, "%s %s",
               r.named ? "the policy names it, and its class stays"
                       : "its class stays",
               r.named ? "the policy's" : word[floor]);
      say_change(s, name, before, now, verdict);
    }
    free(before);
    free(now);
  }
}
