/*
** replay.c - run a fuzz target over files without libFuzzer.
**
** `replay_X DIR_OR_FILE...` feeds every file to LLVMFuzzerTestOneInput, so
** the committed corpus is a regression suite under CTest in every build,
** including the sanitizer one.  Prints "N passed, 0 failed": a failure is
** a crash or an abort, which ends the run.
*/
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned long ran;

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  uint8_t *buf;
  long n;
  if (!f) {
    perror(path);
    return -1;
  }
  if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 ||
      fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return -1;
  }
  buf = malloc((size_t)n + 1);
  if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    fclose(f);
    return -1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, (size_t)n);
  free(buf);
  ran++;
  return 0;
}

static int run_path(const char *path) {
  struct stat st;
  DIR *d;
  struct dirent *e;
  char sub[4096];
  if (stat(path, &st) != 0) {
    perror(path);
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) return run_file(path);
  if (!(d = opendir(path))) return -1;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
    if (run_path(sub) != 0) {
      closedir(d);
      return -1;
    }
  }
  closedir(d);
  return 0;
}

int main(int argc, char **argv) {
  int i;
  for (i = 1; i < argc; i++)
    if (run_path(argv[i]) != 0) {
      printf("%lu passed, 1 failed\n", ran);
      return 1;
    }
  if (ran == 0) {
    printf("0 passed, 1 failed (no input)\n");
    return 1;
  }
  printf("%lu passed, 0 failed\n", ran);
  return 0;
}
