/*
** test_suite.c - data-driven canonicalizer tests.
**
**   test_suite CASES_DIR   each CASES_DIR/<case>/ holds `input` and either
**                          `expected` (the canonical bytes) or `error`
**                          ("<status name> <byte offset>")
**   test_suite --rfc DIR   DIR/input/X.json must canonicalize to
**                          DIR/output/X.json byte for byte (RFC 8785 vectors)
*/
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "idem.h"

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  char *buf = NULL;
  long n;
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 &&
      fseek(f, 0, SEEK_SET) == 0) {
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
      free(buf);
      buf = NULL;
    } else if (buf) {
      buf[n] = '\0';
      *len = (size_t)n;
    }
  }
  fclose(f);
  return buf;
}

static void run_case(idem_canon *c, const char *name, const char *input_path,
                     const char *expected_path, const char *error_path) {
  size_t in_len = 0, exp_len = 0, out_len = 0;
  char *in = slurp(input_path, &in_len), *exp;
  const char *out = NULL;
  int rc;
  if (!in) {
    fprintf(stderr, "%s: cannot read %s\n", name, input_path);
    check_failed++;
    return;
  }
  rc = idem_canon_json(c, in, in_len, &out, &out_len);
  if ((exp = slurp(expected_path, &exp_len)) != NULL) {
    if (rc == IDEM_OK && out_len == exp_len && memcmp(out, exp, exp_len) == 0)
      check_passed++;
    else {
      check_failed++;
      fprintf(stderr, "%s: expected %.*s\n%s: got      %.*s (%s)\n", name,
              (int)exp_len, exp, name, rc ? 0 : (int)out_len, rc ? "" : out,
              rc ? idem_canon_errmsg(c) : "ok");
    }
  } else if ((exp = slurp(error_path, &exp_len)) != NULL) {
    char want[32];
    size_t off;
    if (sscanf(exp, "%31s %zu", want, &off) != 2) {
      fprintf(stderr, "%s: bad error file\n", name);
      check_failed++;
    } else if (rc != IDEM_OK && strcmp(idem_status_name(rc), want) == 0 &&
               idem_canon_erroffset(c) == off && idem_canon_errmsg(c)[0]) {
      check_passed++;
    } else {
      check_failed++;
      fprintf(stderr, "%s: expected error %s at %zu, got %s at %zu: %s\n", name,
              want, off, idem_status_name(rc), idem_canon_erroffset(c),
              rc ? idem_canon_errmsg(c) : "(accepted)");
    }
  } else {
    fprintf(stderr, "%s: neither expected nor error\n", name);
    check_failed++;
  }
  free(exp);
  free(in);
}

int main(int argc, char **argv) {
  int rfc = argc == 3 && strcmp(argv[1], "--rfc") == 0;
  const char *dir = rfc ? argv[2] : argv[1];
  char sub[4096], p1[4200], p2[4200], p3[4200];
  struct dirent *e;
  idem_canon *c;
  DIR *d;
  if (!dir || (!rfc && argc != 2)) {
    fprintf(stderr, "usage: test_suite CASES_DIR | --rfc DIR\n");
    return 2;
  }
  snprintf(sub, sizeof sub, rfc ? "%s/input" : "%s", dir);
  if (!(d = opendir(sub))) {
    perror(sub);
    return 1;
  }
  if (idem_canon_open(&c) != IDEM_OK) return 1;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (rfc) {
      snprintf(p1, sizeof p1, "%s/input/%s", dir, e->d_name);
      snprintf(p2, sizeof p2, "%s/output/%s", dir, e->d_name);
      snprintf(p3, sizeof p3, "%s/none", dir);
    } else {
      snprintf(p1, sizeof p1, "%s/%s/input", dir, e->d_name);
      snprintf(p2, sizeof p2, "%s/%s/expected", dir, e->d_name);
      snprintf(p3, sizeof p3, "%s/%s/error", dir, e->d_name);
    }
    run_case(c, e->d_name, p1, p2, p3);
  }
  closedir(d);
  idem_canon_close(c);
  return check_done();
}
