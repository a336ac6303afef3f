/*
** canon.h - the canonicalizer's workspace and its internal entry points.
**
** The modules that build on the canonicalizer include this: key.c (the
** payload it hashes), guard.c (arguments, templates, fence scopes) and
** envelope.c (strings of the answer).  The dependency runs one way: canon.c
** includes nothing of theirs; key.c's digest state on a workspace is freed
** through the workspace's state_free hook.
*/
#ifndef IDEM_CANON_H
#define IDEM_CANON_H

#include <stdint.h>

#include "idemInt.h"

/* ---- canon.c: the RFC 8785 canonicalizer --------------------------------- */

/* One member of an object being canonicalized: offsets into the output. */
typedef struct idem__member {
  size_t start;  /* the opening quote of the canonical name */
  size_t colon;  /* the ':' after the name                  */
  size_t end;    /* one past the canonical value            */
  size_t in_off; /* the name's offset in the input text     */
  int escaped;   /* the canonical name holds a backslash    */
  uint64_t pfx;  /* its first 8 bytes as a sort key (name_key) */
} idem__member;

/* One open array or object. */
typedef struct idem__frame {
  size_t out_start; /* its opening bracket in the output      */
  size_t mem_base;  /* its first member in the member stack   */
  int is_object;
} idem__frame;

#define IDEM__CANON_MAGIC 0x1de3ca40u

struct idem_canon {
  unsigned magic;
  size_t max_depth, max_bytes;
  idem__buf out;     /* canonical output                       */
  idem__buf aux;     /* key minting: payload, key, decoded ids */
  idem__buf tmp;     /* scratch for reordering members         */
  idem__member *mem; /* member stack, shared by all levels     */
  size_t mem_len, mem_cap;
  idem__frame *stack; /* open containers                        */
  size_t stack_cap;
  size_t top_members; /* members of the outermost object, left  */
                      /* in mem[0..] in canonical order         */
  int simd;           /* strings sixteen bytes at a time (SSSE3) */
  int err;
  size_t err_off;
  char errmsg[200];
  struct evp_md_st *md; /* SHA-256, fetched on first use (key.c) */
  struct evp_md_ctx_st *mdctx;
  /* what a module that keeps state on c (key.c: the digest) frees it
  ** with at idem_canon_close, so the canonicalizer depends on none */
  void (*state_free)(idem_canon *c);
};

/* key.c: hex SHA-256 of [p, p+n) into out (65 bytes with the NUL), with
** the digest state that c keeps for it. */
int idem__sha256_hex(idem_canon *c, const void *p, size_t n, char out[65]);

/* How one canonicalization runs. */
typedef struct idem__canon_opt {
  size_t max_depth;      /* as the limit, or one more for wrappers  */
  const char *drop_name; /* a member name to remove ...             */
  size_t drop_len;
  size_t drop_depth; /* ... from objects at this depth (1 = top)*/
  int top_as_is;     /* the outermost object's members stay in   */
                     /* input order (a duplicate is still refused) */
} idem__canon_opt;

/* Canonicalize text into c->out (reset first).  On success the members of
** an outermost object are left in c->mem[0..c->top_members) in canonical
** order (in input order with opt->top_as_is, for a caller that only picks
** members out of it and never prints it).  On failure c->err/err_off/errmsg
** are set. */
int idem__canon_run(idem_canon *c, const char *text, size_t len,
                    const idem__canon_opt *opt);

/* Canonicalize text as idem_canon_json() does, but onto the end of dst
** (which c borrows for the call), so a caller gathering many answers in one
** buffer copies none of them.  On failure dst keeps its old length.  Not
** for key minting: the members it leaves in c->mem count from dst. */
int idem__canon_append(idem_canon *c, const char *text, size_t len,
                       idem__buf *dst);

/* Strings with SSSE3 where the CPU has it (on, the default), or byte by
** byte (off): the tests run both and compare. */
void idem__canon_simd(idem_canon *c, int on);

/* Is member m's decoded name equal to the bytes [raw, raw+n)? */
int idem__member_is(const idem_canon *c, const idem__member *m, const char *raw,
                    size_t n);

/* Append the canonical JSON string of the UTF-8 bytes [raw, raw+n) to b.
** IDEM_JSON_UTF8 with *bad set to the offending offset when not UTF-8. */
int idem__canon_string(idem__buf *b, const char *raw, size_t n, size_t *bad);

/* Append the decoded content of the canonical JSON string [canon,
** canon+n) (quotes included) to b, followed by a NUL. */
int idem__canon_unstring(idem__buf *b, const char *canon, size_t n);

/* Length of the valid UTF-8 sequence at p (Unicode Table 3-7), 0 if none. */
size_t idem__utf8_len(const unsigned char *p, const unsigned char *end);
/* Is [p, p+n) text: valid UTF-8 without a NUL byte? */
int idem__utf8_text(const char *p, size_t n);

/* For messages that concern no byte of the input. */
#define IDEM__NO_OFFSET ((size_t)-1)

/* Record a failure on c: code, offset and a printf-style message to which
** " at byte N" is appended unless off is IDEM__NO_OFFSET.  Returns code. */
int idem__canon_fail(idem_canon *c, int code, size_t off, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

#endif /* IDEM_CANON_H */
