/*
** main.c - the idem command: dispatch to a verb, help and version.
*/
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const struct {
  const char *name;
  int (*run)(int argc, char **argv);
} verbs[] = {
    {"canon", cmd_canon}, {"key", cmd_key},         {"policy", cmd_policy},
    {"exec", cmd_exec},   {"call", cmd_call},       {"demo", cmd_demo},
    {"mcp", cmd_mcp},     {"__run", cmd_run},       {"ls", cmd_ls},
    {"show", cmd_show},   {"recover", cmd_recover}, {"gc", cmd_gc},
    {"stats", cmd_stats}, {"bench", cmd_bench},     {"resolve", cmd_resolve},
    {"serve", cmd_serve},
    {NULL, NULL}};

/*
** The heap of this program.  Each write transaction of the SQLite log makes
** SQLite allocate and free blocks of 64-90 KiB (the page cache's bulk, the
** b-tree balancer's scratch).  With glibc's initial thresholds those come
** from the top of the heap and every free trims it: a brk() shrink and a
** TLB shootdown on every CPU, then page faults to grow it again - on a
** virtual machine that costs more than the fdatasync we pay for.  glibc
** raises its mmap threshold to the size of a freed mmapped block, and its
** trim threshold to twice that, unless the program set them (mallopt(3),
** "dynamic mmap threshold"); so one 1 MiB block allocated and freed once
** settles the heap.  That is a choice for a program about its whole
** process, so the command makes it here; the library makes none
** (docs/PERFORMANCE.md says what a host program may do).
*/
static void settle_heap(void) {
#if defined(__GLIBC__)
  void *volatile p = malloc(1u << 20);
  free(p);
#endif
}

int main(int argc, char **argv) {
  int i;
  const char *verb = argc > 1 ? argv[1] : NULL;
  settle_heap();
  opterr = 0; /* the verbs print their own one-line "idem: ..." errors */
  if (!verb) {
    cli_print_help(stderr);
    return EXIT_USAGE;
  }
  if (strcmp(verb, "--version") == 0 || strcmp(verb, "version") == 0) {
    printf("idem %s\n", idem_version());
    return cli_flush();
  }
  if (strcmp(verb, "help") == 0 || strcmp(verb, "--help") == 0 ||
      strcmp(verb, "-h") == 0) {
    if (argc > 2) {
      if (cli_print_usage(stdout, argv[2]) == 0) return cli_flush();
      cli_err("no verb '%s' (try 'idem help')", argv[2]);
      return EXIT_USAGE;
    }
    cli_print_help(stdout);
    return cli_flush();
  }
  for (i = 0; verbs[i].name; i++)
    if (strcmp(verbs[i].name, verb) == 0)
      return verbs[i].run(argc - 1, argv + 1);
  cli_err("no verb '%s' (try 'idem help')", verb);
  return EXIT_USAGE;
}
