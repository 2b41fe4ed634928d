/* Ranked locks (core.h): the initializer, and in debug and test builds the checks, after
 * jemalloc's witness.h. Each thread keeps the locks it holds in a small stack; a breach
 * aborts at once with both locks named, before the wrong order can deadlock. Also the one
 * way every debug check fails. */
#include "core/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void ps_mutex_init(ps_mutex *mx, unsigned rank, const char *name)
{
  pthread_mutex_init(&mx->m, NULL);
  mx->rank = rank;
  mx->name = name;
}

#ifdef PS_CHECKS

#define HELD_MAX 24 /* the fork handler holds every device's lock (16) and a few more */

static PS_THREAD_LOCAL struct {
  const void *lock;
  unsigned rank;
  const char *name;
} held[HELD_MAX];
static PS_THREAD_LOCAL unsigned nheld;

void ps_check_failed(const char *fmt, ...)
{
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  size_t len = n < 0 ? 0 : (size_t)n < sizeof line - 1 ? (size_t)n : sizeof line - 2;
  line[len++] = '\n';
  ssize_t w = write(STDERR_FILENO, "psshim: check failed: ", 22);
  w = write(STDERR_FILENO, line, len);
  (void)w;
  abort();
}

void ps_lock_check_take(const void *lock, unsigned rank, const char *name, bool trying)
{
  for (unsigned i = 0; i < nheld; i++) {
    if (held[i].lock == lock)
      ps_check_failed("taking %s (rank %u), which this thread already holds", name, rank);
    if (!trying && held[i].rank >= rank)
      ps_check_failed("taking %s (rank %u) while holding %s (rank %u): locks are taken in rising rank", name, rank,
             held[i].name, held[i].rank);
  }
  if (nheld == HELD_MAX)
    ps_check_failed("taking %s (rank %u) with %u locks held", name, rank, nheld);
  held[nheld].lock = lock;
  held[nheld].rank = rank;
  held[nheld++].name = name;
}

void ps_lock_check_give(const void *lock, const char *name)
{
  for (unsigned i = nheld; i-- > 0;)
    if (held[i].lock == lock) {
      held[i] = held[--nheld];
      return;
    }
  ps_check_failed("releasing %s, which this thread does not hold", name);
}

void ps_lock_check_held(const void *lock, const char *name, const char *why)
{
  for (unsigned i = 0; i < nheld; i++)
    if (held[i].lock == lock)
      return;
  ps_check_failed("%s needs %s held, and this thread does not hold it", why, name);
}

void ps_lock_check_none(const char *why)
{
  if (nheld)
    ps_check_failed("%s while holding %s (rank %u)", why, held[nheld - 1].name, held[nheld - 1].rank);
}

#endif
