/*
** check.h - the assertions of the C tests (after libuv's ASSERT_EQ).
**
** Each failed check prints the expression, both sides and where, and counts;
** check_done() prints the closing "N passed, M failed" line and returns the
** exit status.  A test that checks nothing fails (see check_done).
*/
#ifndef IDEM_CHECK_H
#define IDEM_CHECK_H

#include <stdio.h>
#include <string.h>

static unsigned long check_passed, check_failed;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (cond)                                                                  \
      check_passed++;                                                          \
    else {                                                                     \
      check_failed++;                                                          \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
    }                                                                          \
  } while (0)

#define CHECK_INT(a, b)                                                        \
  do {                                                                         \
    long long a_ = (long long)(a), b_ = (long long)(b);                        \
    if (a_ == b_)                                                              \
      check_passed++;                                                          \
    else {                                                                     \
      check_failed++;                                                          \
      fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__,      \
              __LINE__, #a, #b, a_, b_);                                       \
    }                                                                          \
  } while (0)

/* Compare (pointer, length) bytes with a NUL-terminated expectation. */
#define CHECK_MEM(p, n, s)                                                     \
  do {                                                                         \
    const char *p_ = (const char *)(p), *s_ = (s);                             \
    size_t n_ = (size_t)(n);                                                   \
    if (p_ && n_ == strlen(s_) && memcmp(p_, s_, n_) == 0)                     \
      check_passed++;                                                          \
    else {                                                                     \
      check_failed++;                                                          \
      fprintf(stderr, "%s:%d: %s failed:\n  got:      %.*s\n  expected: %s\n", \
              __FILE__, __LINE__, #p, p_ ? (int)n_ : 6, p_ ? p_ : "(null)",    \
              s_);                                                             \
    }                                                                          \
  } while (0)

#define CHECK_STR(a, b) CHECK_MEM((a), (a) ? strlen(a) : 0, (b))

static int check_done(void) {
  if (check_passed + check_failed == 0) {
    fprintf(stderr, "no check ran\n");
    check_failed = 1;
  }
  printf("%lu passed, %lu failed\n", check_passed, check_failed);
  return check_failed ? 1 : 0;
}

#endif /* IDEM_CHECK_H */
