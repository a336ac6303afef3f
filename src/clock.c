/*
** clock.c - the library's one reading of the clocks, and its one sleep.
**
** Wall time (milliseconds since the epoch) is what records carry, so that
** every process and host reads them alike; monotonic time is what waits
** and deadlines count in, so that a clock step never shortens or stretches
** one.
*/
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <time.h>

#include "idemInt.h"

long long idem__wall_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

long long idem__mono_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

long long idem__mono_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

void idem__mono_after(long long ms, struct timespec *at) {
  clock_gettime(CLOCK_MONOTONIC, at);
  at->tv_sec += (time_t)(ms / 1000);
  at->tv_nsec += (long)(ms % 1000) * 1000000L;
  if (at->tv_nsec >= 1000000000L) {
    at->tv_sec++;
    at->tv_nsec -= 1000000000L;
  }
}

void idem__sleep_ms(long long ms) {
  struct timespec ts;
  if (ms <= 0) return;
  ts.tv_sec = (time_t)(ms / 1000);
  ts.tv_nsec = (long)(ms % 1000) * 1000000L;
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}
