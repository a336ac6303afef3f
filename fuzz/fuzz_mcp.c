/*
** fuzz_mcp.c - libFuzzer target for the MCP gateway's message handling
** (cli/mcp/jsonrpc.c): the line splitter, the JSON-RPC classifier, the raw
** scanner and the id and _meta splices.
**
** The input is a byte stream, fed in chunks whose sizes come from the
** input itself, with a small line limit so that oversized lines happen.
** Invariants: no crash, no leak; a line handed over is never longer than
** the limit and holds no newline; every span the scanner returns lies in
** its text; splicing a new id into a message that parsed gives a JSON text
** whose id is the new one; merging into _meta gives a JSON text whose
** _meta holds the merged member; a tools/list-like value classifies to one
** of the three classes; a status result reads as applied or not applied;
** a policy drafted from a tools/list-like result (draft.c) is one that
** idem_policy_parse accepts.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/mcp/mcp.h"
#include "../src/idemInt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define LIMIT 512

/* The two readings of a status result, as the policy may ask for them. */
static int key_rule(void *ctx, const char *text, size_t len) {
  idem__status_rule r;
  (void)ctx;
  memset(&r, 0, sizeof r);
  r.applied_when = IDEM__APPLIED_WHEN_KEY_PRESENT;
  return idem__status_verdict(&r, "k", text, len);
}

static int pointer_rule(void *ctx, const char *text, size_t len) {
  idem__status_rule r;
  (void)ctx;
  memset(&r, 0, sizeof r);
  r.applied_when = IDEM__APPLIED_WHEN_POINTER;
  r.pointer = (char *)"/a/0~1b";
  r.equals = (char *)"\"x\"";
  return idem__status_verdict(&r, NULL, text, len);
}

static void verdict_of(const json_t *result, const char *raw, size_t len) {
  int a = mcp_verdict(result, raw, len, key_rule, NULL);
  int b = mcp_verdict(result, raw, len, pointer_rule, NULL);
  if ((a != IDEM_OUTCOME_APPLIED && a != IDEM_OUTCOME_NOT_APPLIED) ||
      (b != IDEM_OUTCOME_APPLIED && b != IDEM_OUTCOME_NOT_APPLIED))
    abort();
}

/* Whatever the server listed, --suggest-policy's draft is a valid policy. */
static void draft_of(const json_t *root) {
  const json_t *tools = json_object_get(json_object_get(root, "result"),
                                        "tools");
  mcp_draft_info info;
  json_t *d = mcp_draft_policy(tools ? tools : root, &info);
  char *text = d ? json_dumps(d, JSON_INDENT(2)) : NULL;
  idem_policy *p = NULL;
  if (!text || idem_policy_parse(text, strlen(text), "draft", &p) != IDEM_OK ||
      idem_policy_tool_count(p) != info.tools ||
      info.guarded + info.read_only != info.tools ||
      info.with_status > info.guarded)
    abort();
  idem_policy_free(p);
  free(text);
  json_decref(d);
}

static void check_line(void *ctx, const char *line, size_t len, int oversized) {
  mcp_msg m;
  char err[300];
  size_t vs, ve;
  cli_outbuf out;
  (void)ctx;
  if (len > (oversized ? (size_t)MCP_PREFIX : (size_t)LIMIT)) abort();
  if (!oversized && memchr(line, '\n', len)) abort();
  if (mcp_prefix_id(line, len, &vs, &ve) && (vs > ve || ve > len)) abort();
  if (oversized) return;
  cli_outbuf_init(&out, (size_t)1 << 20);
  if (mcp_msg_parse(line, len, &m, err, sizeof err) == 0) {
    if (m.id_e) {
      json_t *v;
      if (m.id_s >= m.id_e || m.id_e > len) abort();
      if (mcp_splice(&out, line, len, m.id_s, m.id_e, "42", 2)) abort();
      v = json_loadb(out.p, out.len, JSON_DECODE_INT_AS_REAL, NULL);
      if (!v || json_number_value(json_object_get(v, "id")) != 42) abort();
      json_decref(v);
    }
    if (json_is_object(m.root)) {
      json_t *add = json_pack("{s:b}", "io.idem/x", 1), *v;
      out.len = 0;
      if (mcp_put_with_meta(&out, line, len, add) == 0) {
        v = json_loadb(out.p, out.len, JSON_DECODE_INT_AS_REAL, NULL);
        if (!v || !json_is_true(json_object_get(json_object_get(v, "_meta"),
                                                "io.idem/x")))
          abort();
        json_decref(v);
      }
      json_decref(add);
    }
    draft_of(m.root);
    {
      int cls = mcp_class_of(m.params);
      if (cls != IDEM_CLASS_GUARDED && cls != IDEM_CLASS_READ_ONLY &&
          cls != IDEM_CLASS_IDEMPOTENT)
        abort();
    }
    if (mcp_member(line, len, "result", &vs, &ve) == 1) {
      json_t *r = json_object_get(m.root, "result");
      if (vs > ve || ve > len) abort();
      verdict_of(r, line + vs, ve - vs);
    }
    if (mcp_member(line, len, "params", &vs, &ve) == 1 && (vs > ve || ve > len))
      abort();
    mcp_msg_free(&m);
  }
  cli_outbuf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mcp_lines l;
  size_t i = 0;
  mcp_lines_init(&l, LIMIT);
  while (i < size) {
    size_t chunk = 1 + (size_t)data[i] % 97;
    if (chunk > size - i) chunk = size - i;
    if (mcp_lines_feed(&l, (const char *)data + i, chunk, check_line, NULL))
      abort();
    i += chunk;
  }
  mcp_lines_end(&l, check_line, NULL);
  mcp_lines_free(&l);
  return 0;
}
