/*
** alloc.c - all heap use of libidem goes through here.
**
** Keeping one door lets users plug in their own allocator and lets the test
** suite fail the Nth allocation (tests/test_canon.c for the canonicalizer,
** tests/test_policy.c for parsing and explaining a policy), proving that every
** out-of-memory path returns IDEM_NOMEM and leaks nothing.
*/
#include <stdlib.h>
#include <string.h>

#include "idemInt.h"

static idem_malloc_fn g_malloc = malloc;
static idem_realloc_fn g_realloc = realloc;
static idem_free_fn g_free = free;

void idem_set_alloc_funcs(idem_malloc_fn m, idem_realloc_fn r, idem_free_fn f) {
  g_malloc = m ? m : malloc;
  g_realloc = r ? r : realloc;
  g_free = f ? f : free;
}

void *idem__malloc(size_t n) { return g_malloc(n ? n : 1); }

void *idem__realloc(void *p, size_t n) { return g_realloc(p, n ? n : 1); }

void idem__free(void *p) {
  if (p) g_free(p);
}

void *idem_malloc(size_t n) { return idem__malloc(n); }

void idem_free(void *p) { idem__free(p); }

char *idem__strndup(const char *s, size_t n) {
  char *p;
  if (!s || n == SIZE_MAX || !(p = idem__malloc(n + 1))) return NULL;
  memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

char *idem__strdup(const char *s) {
  return s ? idem__strndup(s, strlen(s)) : NULL;
}
