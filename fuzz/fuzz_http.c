/*
** fuzz_http.c - libFuzzer target for the handling of HTTP answers (the
** library's src/http.c), of status results (src/verdict.c), and of the
** templates an HTTP tool fills from its arguments (src/template.c).
**
** Input: byte 0 flags (bit 0: the request was sent; bit 1: the transfer
** failed; bits 2-7: the policy's on_409/on_429/on_5xx), bytes 1-2 the HTTP
** status (0-65535), the rest the response body.  No crash, no leak, and:
** the outcome is one of the four; 2xx is applied; a failure before any
** status is not applied when nothing was sent and unknown otherwise; the
** message is one line.  The body, as a status tool's result, is judged
** under both applied_when forms; as the arguments of a call, it fills a URL
** (nothing left unencoded) and a header value (no line break), or fails
** saying why.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int pick(unsigned bits) {
  static const int v[4] = {IDEM_OUTCOME_UNKNOWN, IDEM_OUTCOME_NOT_APPLIED,
                           IDEM_OUTCOME_REJECTED, IDEM_OUTCOME_UNKNOWN};
  return v[bits & 3];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  idem__http_rule h;
  idem__status_rule s;
  idem__http_answer a;
  idem__buf out;
  char err[512];
  const char *p;
  int o;
  if (size < 3) return 0;
  memset(&h, 0, sizeof h);
  h.on_409 = pick(data[0] >> 2);
  h.on_429 = pick(data[0] >> 4);
  h.on_5xx = pick(data[0] >> 6);
  memset(&a, 0, sizeof a);
  a.status = (long)(data[1] << 8 | data[2]);
  a.body_len = size - 3;
  if (!(a.body = idem__malloc(a.body_len + 1))) return 0;
  memcpy(a.body, data + 3, a.body_len);
  a.body[a.body_len] = '\0';

  idem__http_classify(&h, data[0] & 1, data[0] & 2, "transport error", &a);
  if (a.outcome < IDEM_OUTCOME_APPLIED || a.outcome > IDEM_OUTCOME_UNKNOWN)
    abort();
  if (a.status >= 200 && a.status <= 299 && a.outcome != IDEM_OUTCOME_APPLIED)
    abort();
  if ((data[0] & 2) && a.status == 0 &&
      a.outcome != ((data[0] & 1) ? IDEM_OUTCOME_UNKNOWN
                                  : IDEM_OUTCOME_NOT_APPLIED))
    abort();
  if (memchr(a.error, '\0', sizeof a.error) == NULL) abort();
  for (p = a.error; *p; p++)
    if (*p == '\n' || *p == '\r') abort();

  memset(&s, 0, sizeof s);
  s.applied_when = IDEM__APPLIED_WHEN_KEY_PRESENT;
  o = idem__status_verdict(&s, "sess:call:0123456789abcdef", a.body,
                           a.body_len);
  if (o != IDEM_OUTCOME_APPLIED && o != IDEM_OUTCOME_NOT_APPLIED &&
      o != IDEM_OUTCOME_UNKNOWN)
    abort();
  s.applied_when = IDEM__APPLIED_WHEN_POINTER;
  s.pointer = (char *)"/data/0/status";
  s.equals = (char *)"\"succeeded\"";
  o = idem__status_verdict(&s, NULL, a.body, a.body_len);
  if (o != IDEM_OUTCOME_APPLIED && o != IDEM_OUTCOME_NOT_APPLIED &&
      o != IDEM_OUTCOME_UNKNOWN)
    abort();

  idem__buf_init(&out, 0);
  if (idem__http_fill(&out, "http://127.0.0.1/v1/{order_id}?k={$key}&a={a}", 1,
                      a.body, a.body_len, "s:c:0123", err, sizeof err) ==
      IDEM_OK) {
    for (p = out.p; *p; p++)
      if ((unsigned char)*p <= 0x20 || *p == 0x7f || *p == '{' || *p == '}')
        abort();
  } else if (!err[0]) {
    abort();
  }
  if (idem__http_fill(&out, "Bearer {a}", 0, a.body, a.body_len, NULL, err,
                      sizeof err) == IDEM_OK) {
    if (strchr(out.p, '\n') || strchr(out.p, '\r')) abort();
  } else if (!err[0]) {
    abort();
  }
  idem__buf_free(&out);
  idem__http_answer_free(&a);
  return 0;
}
