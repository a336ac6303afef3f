/*
** draft.c - a draft policy for an MCP server, from its tools/list (`idem
** mcp --suggest-policy`, suggest.c), for a person to read and edit.
**
** Input: the tools of every page of the server's tools/list answer, in
** one array, as the server sent them.  Anything may be wrong in it: an
** entry that is not an object or whose name is not a non-empty string is
** skipped, a name listed again keeps its first entry, a schema or
** annotations of the wrong type count as absent.  Output: a policy
** (docs/POLICY.md) that idem_policy_parse accepts whatever the input was
** (fuzz_mcp checks it), with "unknown_tools": "refuse" and one rule per
** tool, in the server's order.
**
** Classes are the gateway's own (mcp_class_of, SPEC §10): readOnlyHint
** true is read_only; anything else - destructive, unannotated, or saying
** only idempotentHint - is guarded.  The draft makes what the gateway would
** do anyway explicit, and adds what it cannot guess alone: a status check.
** For a guarded tool G one is proposed from a read_only tool S when
**
**   - S's name, less a reading verb in front (get, list, fetch, ...), any
**     "by ..." behind and a status word at the end (status, state, ...),
**     names what G acts on: all of G's name, G's name less its first word,
**     or one word of it (refund_payment: refund, payment), in the singular
**     or the plural; and S's name had the verb or the status word; and
**   - S takes an argument named as one of G's id arguments (id, order_id,
**     orderId, refund_number, ...), and every argument S requires is one
**     G takes.
**
** The best fit wins (all of G's name over one word, a status word, a verb
** that reads one thing); its arguments are G's of the same names
** ("order_id": "{order_id}").  applied_when is the default, "key_present",
** written out: whether the status tool's answer shows the key depends on
** the server, so the tool's note says to check it.  An argument whose name
** says idempotency becomes the key_arg.  Every rule gets a "note" saying
** why it has its class and what to check or add.
**
** Bounds: names longer than NAME_MAX bytes take no part in the matching;
** at most BUCKET read_only tools share one subject; past MATCH_MAX tools no
** status check is proposed (the rules are still written).  The work is
** linear in the size of the input.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem.h"
#include "mcp.h"

#define NAME_MAX_ 200
#define BUCKET 16
#define MATCH_MAX 100000
#define SHOWN 80 /* bytes of a server's name quoted in a note */

/* ---- names, in words -------------------------------------------------------- */

static int is_upper(char c) { return c >= 'A' && c <= 'Z'; }
static int is_lower(char c) { return c >= 'a' && c <= 'z'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* name as lowercase words joined by '_' (refundPayment, refund-payment and
** REFUND_PAYMENT all give refund_payment); bytes beyond ASCII are kept as
** letters.  0, or -1 when it is empty or does not fit. */
static int norm(const char *name, char *out, size_t n) {
  size_t k = 0;
  char prev = 0;
  for (; *name; name++) {
    char c = *name;
    int word = is_upper(c) || is_lower(c) || is_digit(c) || (c & 0x80);
    if (!word) {
      if (k && out[k - 1] != '_') {
        if (k + 1 >= n) return -1;
        out[k++] = '_';
      }
    } else {
      if (is_upper(c) && (is_lower(prev) || is_digit(prev)) && k &&
          out[k - 1] != '_') {
        if (k + 1 >= n) return -1;
        out[k++] = '_';
      }
      if (k + 1 >= n) return -1;
      out[k++] = is_upper(c) ? (char)(c - 'A' + 'a') : c;
    }
    prev = word ? c : 0;
  }
  while (k && out[k - 1] == '_') k--;
  out[k] = '\0';
  return k ? 0 : -1;
}

/* The words of a normalized name, in place: pointers into s. */
#define WORDS 16
static int split(char *s, char **w) {
  int n = 0;
  while (*s && n < WORDS) {
    w[n++] = s;
    s = strchr(s, '_');
    if (!s) break;
    *s++ = '\0';
  }
  return n;
}

static int one_of(const char *w, const char *const *list) {
  for (; *list; list++)
    if (strcmp(w, *list) == 0) return 1;
  return 0;
}

static const char *const READ_VERBS[] = {
    "get",  "list",   "fetch", "check",    "find", "lookup",   "read",
    "query", "search", "show", "describe", "view", "retrieve", NULL};
/* verbs that read one thing (a better status check than a search) */
static const char *const ONE_VERBS[] = {"get", "fetch", "check", "lookup",
                                        "read", "retrieve", NULL};
static const char *const STATUS_WORDS[] = {"status", "state", "info",
                                           "details", "detail", NULL};
/* words too general to name what a tool acts on */
static const char *const GENERAL[] = {
    "get", "set", "do",     "run",    "make", "add",  "new",  "create",
    "update", "delete", "remove", "send", "post", "put", "the", "item",
    "items", "data", "tool", "action", NULL};

/* An argument named as an id: its last word is one of these. */
static int id_name(const char *arg) {
  static const char *const IDS[] = {"id", "ids", "ref", "uuid", "number",
                                    "no", NULL};
  char s[NAME_MAX_ + 1], *w[WORDS];
  int n;
  if (norm(arg, s, sizeof s)) return 0;
  n = split(s, w);
  return n > 0 && one_of(w[n - 1], IDS);
}

static int key_name(const char *arg) {
  char s[NAME_MAX_ + 1], *w[WORDS];
  int n, i;
  if (norm(arg, s, sizeof s)) return 0;
  n = split(s, w);
  for (i = 0; i < n; i++)
    if (strcmp(w[i], "idempotency") == 0) return 1;
  return 0;
}

/* The subject of a read_only tool's name as a status check (get_refund_
** status: refund), with its score; -1 when the name has no reading verb
** and no status word. */
static int subject_of(const char *name, char *out, size_t n) {
  char s[NAME_MAX_ + 1], *w[WORDS];
  int nw, from = 0, to, i, score = 0, marked = 0;
  size_t k = 0;
  if (norm(name, s, sizeof s)) return -1;
  nw = split(s, w);
  if (nw > 1 && one_of(w[0], READ_VERBS)) {
    from = 1;
    marked = 1;
    score += one_of(w[0], ONE_VERBS);
  }
  to = nw;
  for (i = from + 1; i < nw; i++)
    if (strcmp(w[i], "by") == 0) {
      to = i;
      break;
    }
  while (to - 1 > from && one_of(w[to - 1], STATUS_WORDS)) {
    to--;
    marked = 1;
    score += 2;
  }
  if (!marked) return -1;
  for (i = from; i < to; i++) {
    size_t l = strlen(w[i]);
    if (k + l + 2 > n) return -1;
    if (k) out[k++] = '_';
    memcpy(out + k, w[i], l);
    k += l;
  }
  out[k] = '\0';
  return k ? score : -1;
}

/* ---- the tools --------------------------------------------------------------- */

typedef struct tool {
  const char *name;
  const json_t *props;    /* inputSchema.properties, an object, or NULL */
  const json_t *required; /* inputSchema.required, an array, or NULL    */
  const json_t *ann;      /* annotations, an object, or NULL            */
  int cls;
  const char *key_arg;
  json_t *rule;
} tool;

static const char *str(const json_t *v) { return json_string_value(v); }

/* Does S require only arguments G takes (none of them the key)? */
static int requires_only(const tool *s, const tool *g) {
  size_t i;
  const json_t *r;
  json_array_foreach(s->required, i, r) {
    const char *a = str(r);
    if (!a) continue; /* not a name: names no argument */
    if (a[0] == '$' || !json_object_get(g->props, a) ||
        (g->key_arg && strcmp(a, g->key_arg) == 0))
      return 0;
  }
  return 1;
}

static int is_required(const tool *s, const char *arg) {
  size_t i;
  const json_t *r;
  json_array_foreach(s->required, i, r) {
    if (str(r) && strcmp(str(r), arg) == 0) return 1;
  }
  return 0;
}

/* The status arguments S gets from a call of G, or NULL when S takes none
** of G's id arguments.  "{$...}" is a placeholder, not an argument: such
** names are left out. */
static json_t *status_args(const tool *s, const tool *g) {
  json_t *args, *v;
  const char *a;
  int ids = 0;
  if (!json_is_object(s->props) || !requires_only(s, g)) return NULL;
  if (!(args = json_object())) return NULL;
  json_object_foreach((json_t *)(size_t)s->props, a, v) {
    int id = id_name(a);
    char fill[NAME_MAX_ + 3];
    (void)v;
    if (a[0] == '$' || !json_object_get(g->props, a) ||
        (g->key_arg && strcmp(a, g->key_arg) == 0) || strlen(a) > NAME_MAX_)
      continue;
    if (!id && !is_required(s, a)) continue;
    ids += id;
    snprintf(fill, sizeof fill, "{%s}", a);
    if (json_object_set_new(args, a, json_string(fill))) {
      json_decref(args);
      return NULL;
    }
  }
  if (!ids) {
    json_decref(args);
    return NULL;
  }
  return args;
}

/* A server's name in a note: at most SHOWN bytes, cut at a character. */
static void put_name(cli_outbuf *b, const char *s) {
  size_t n = strlen(s);
  if (n > SHOWN) {
    n = SHOWN;
    while (n && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
  }
  cli_outbuf_put(b, s, n);
  if (n < strlen(s)) cli_outbuf_str(b, "...");
}

/* Why G is guarded, in words. */
static void put_why(cli_outbuf *b, const tool *g) {
  if (!g->ann)
    cli_outbuf_str(b, "guarded: the server gives no annotations");
  else if (json_is_true(json_object_get(g->ann, "destructiveHint")))
    cli_outbuf_str(b, "guarded: the server says destructiveHint: true");
  else if (json_is_true(json_object_get(g->ann, "idempotentHint")))
    cli_outbuf_str(b, "guarded: the server says idempotentHint: true, "
                      "which idem does not take for a class (docs/MCP.md); "
                      "if a repeat really is harmless, make it \"class\": "
                      "\"idempotent\"");
  else
    cli_outbuf_str(b, "guarded: the server does not say readOnlyHint: true");
  cli_outbuf_str(b, ". ");
}

/* G's id arguments, ": a, b" (at most four); 0 when it has none. */
static int put_ids(cli_outbuf *b, const tool *g) {
  const char *a;
  json_t *v;
  int n = 0;
  json_object_foreach((json_t *)(size_t)g->props, a, v) {
    (void)v;
    if (!id_name(a) || n == 4) continue;
    cli_outbuf_str(b, n++ ? ", " : ": ");
    put_name(b, a);
  }
  return n;
}

/* Set rule member "note" to the text in b; -1 when memory ran out. */
static int set_note(json_t *rule, cli_outbuf *b) {
  json_t *s;
  if (cli_outbuf_put(b, "", 1)) return -1;
  s = json_string(b->p);
  return json_object_set_new(rule, "note", s) ? -1 : 0;
}

static int note_read_only(json_t *rule) {
  json_t *s = json_string("read_only: the server says readOnlyHint: true, "
                          "so calls pass unrecorded; make it guarded if it "
                          "changes anything");
  return json_object_set_new(rule, "note", s) ? -1 : 0;
}

static int note_guarded(json_t *rule, const tool *g, const tool *s) {
  cli_outbuf b;
  int rc;
  cli_outbuf_init(&b, (size_t)1 << 16);
  put_why(&b, g);
  if (s) {
    cli_outbuf_str(&b, "Status check proposed: ");
    put_name(&b, s->name);
    cli_outbuf_str(&b, ", by its name and arguments. Check that its answer "
                       "shows the key idem sends (in _meta \"io.idem/key\"");
    if (g->key_arg) {
      cli_outbuf_str(&b, " and in ");
      put_name(&b, g->key_arg);
    }
    cli_outbuf_str(&b, "); if it does not, give applied_when what shows the "
                       "action applied (docs/POLICY.md, status).");
  } else {
    size_t mark = b.len;
    cli_outbuf_str(&b, "No read-only tool of this server fits as its status "
                       "check: none is named get_X, list_X, X_status or "
                       "get_X_status for it and takes one of its id "
                       "arguments");
    if (!put_ids(&b, g)) {
      b.len = mark;
      cli_outbuf_str(&b, "It takes no argument named as an id (id, "
                         "order_id, ...) by which a status tool could find "
                         "the action");
    }
    cli_outbuf_str(&b, ". Add a \"status\" (docs/POLICY.md) if the server "
                       "can tell whether a call took effect; without one, a "
                       "call whose outcome is unknown stays outcome_unknown "
                       "until a person decides (idem resolve).");
  }
  rc = set_note(rule, &b);
  cli_outbuf_free(&b);
  return rc;
}

/* ---- matching ---------------------------------------------------------------- */

/* subject -> [index of a read_only tool, ...] */
static int index_subjects(json_t *index, tool *t, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) {
    char subj[NAME_MAX_ + 1];
    json_t *list;
    if (t[i].cls != IDEM_CLASS_READ_ONLY ||
        subject_of(t[i].name, subj, sizeof subj) < 0)
      continue;
    if (!(list = json_object_get(index, subj))) {
      if (json_object_set_new(index, subj, list = json_array())) return -1;
    }
    if (json_array_size(list) < BUCKET &&
        json_array_append_new(list, json_integer((json_int_t)i)))
      return -1;
  }
  return 0;
}

/* The best status tool for g among the read_only tools whose subject is
** subj (a candidate of weight w), into *best / *best_score. */
static void try_subject(json_t *index, tool *t, const tool *g, const char *subj,
                        int w, const tool **best, int *best_score) {
  const json_t *list = json_object_get(index, subj), *e;
  size_t i;
  json_array_foreach(list, i, e) {
    const tool *s = &t[json_integer_value(e)];
    char tmp[NAME_MAX_ + 1];
    int score = w + subject_of(s->name, tmp, sizeof tmp);
    json_t *args;
    if (score <= *best_score) continue;
    if (!(args = status_args(s, g))) continue;
    json_decref(args);
    *best = s;
    *best_score = score;
  }
}

/* subj and its singular and plural forms. */
static void try_forms(json_t *index, tool *t, const tool *g, const char *subj,
                      int w, const tool **best, int *best_score) {
  char f[NAME_MAX_ + 4];
  size_t n = strlen(subj);
  if (n > NAME_MAX_) return;
  try_subject(index, t, g, subj, w, best, best_score);
  snprintf(f, sizeof f, "%ss", subj);
  try_subject(index, t, g, f, w, best, best_score);
  snprintf(f, sizeof f, "%ses", subj);
  try_subject(index, t, g, f, w, best, best_score);
  if (n > 3 && subj[n - 1] == 's') {
    snprintf(f, sizeof f, "%.*s", (int)(n - 1), subj);
    try_subject(index, t, g, f, w, best, best_score);
  }
}

static const tool *status_for(json_t *index, tool *t, const tool *g) {
  char s[NAME_MAX_ + 1], *w[WORDS];
  const tool *best = NULL;
  int best_score = -1, n, i;
  if (!json_is_object(g->props) || norm(g->name, s, sizeof s)) return NULL;
  try_forms(index, t, g, s, 8, &best, &best_score);
  n = split(s, w);
  if (n >= 3) { /* all of it less its first word: payment_intent */
    char rest[NAME_MAX_ + 1];
    size_t k = 0;
    for (i = 1; i < n; i++)
      k += (size_t)snprintf(rest + k, sizeof rest - k, "%s%s", k ? "_" : "",
                            w[i]);
    try_forms(index, t, g, rest, 6, &best, &best_score);
  }
  for (i = 0; i < n && n > 1; i++)
    if (strlen(w[i]) >= 3 && !one_of(w[i], GENERAL))
      try_forms(index, t, g, w[i], i == 0 ? 5 : 4, &best, &best_score);
  return best;
}

/* ---- the draft --------------------------------------------------------------- */

static const char *class_word(int cls) {
  return cls == IDEM_CLASS_READ_ONLY ? "read_only" : "guarded";
}

static void read_tool(const json_t *e, tool *t) {
  const json_t *schema = json_object_get(e, "inputSchema"), *v;
  const char *a;
  memset(t, 0, sizeof *t);
  t->name = str(json_object_get(e, "name"));
  t->props = json_object_get(schema, "properties");
  if (!json_is_object(t->props)) t->props = NULL;
  t->required = json_object_get(schema, "required");
  if (!json_is_array(t->required)) t->required = NULL;
  t->ann = json_object_get(e, "annotations");
  if (!json_is_object(t->ann)) t->ann = NULL;
  t->cls = mcp_class_of(e);
  if (t->cls != IDEM_CLASS_GUARDED) return;
  json_object_foreach((json_t *)(size_t)t->props, a, v) {
    (void)v;
    if (*a && key_name(a)) {
      t->key_arg = a;
      break;
    }
  }
}

json_t *mcp_draft_policy(const json_t *tools, mcp_draft_info *info) {
  json_t *root = json_object(), *rules = json_object(), *index = json_object();
  tool *t = NULL;
  size_t n = 0, i;
  const json_t *e;
  int ok = root && rules && index;
  memset(info, 0, sizeof *info);
  if (ok && json_array_size(tools)) {
    t = calloc(json_array_size(tools), sizeof *t);
    ok = t != NULL;
  }
  /* the rules, in the server's order; the first of a name wins */
  json_array_foreach(tools, i, e) {
    const char *name = str(json_object_get(e, "name"));
    if (!ok) break;
    if (!name || !*name) {
      info->skipped++;
      continue;
    }
    if (json_object_get(rules, name)) {
      info->repeated++;
      continue;
    }
    read_tool(e, &t[n]);
    if (!(t[n].rule = json_pack("{s:s}", "class", class_word(t[n].cls))) ||
        json_object_set_new(rules, name, t[n].rule))
      ok = 0;
    if (ok && t[n].key_arg)
      ok = !json_object_set_new(t[n].rule, "key_arg",
                                json_string(t[n].key_arg));
    n++;
  }
  if (ok && n <= MATCH_MAX) ok = !index_subjects(index, t, n);
  for (i = 0; ok && i < n; i++) {
    const tool *s = NULL;
    if (t[i].cls == IDEM_CLASS_READ_ONLY) {
      info->read_only++;
      ok = !note_read_only(t[i].rule);
      continue;
    }
    info->guarded++;
    if (n <= MATCH_MAX && (s = status_for(index, t, &t[i])) != NULL) {
      json_t *st = json_pack("{s:s,s:o,s:s}", "tool", s->name, "arguments",
                             status_args(s, &t[i]), "applied_when",
                             "key_present");
      ok = st && !json_object_set_new(t[i].rule, "status", st);
      info->with_status++;
    }
    ok = ok && !note_guarded(t[i].rule, &t[i], s);
  }
  info->tools = n;
  free(t);
  json_decref(index);
  if (ok && !json_object_set_new(root, "unknown_tools", json_string("refuse")) &&
      !json_object_set(root, "tools", rules)) {
    json_decref(rules);
    return root;
  }
  json_decref(rules);
  json_decref(root);
  return NULL;
}
