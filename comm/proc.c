#include "comm/proc.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Reads the state letter and start time of /proc/PID/stat. The command name in field 2 may
 * hold spaces and parentheses, so parsing starts after its last ')'. */
static bool read_stat(int32_t pid, char *state, uint64_t *start) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f) return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  if (!p) return false;
  unsigned long long st = 0;
  /* fields 3..22: state, then 18 numbers we skip, then starttime */
  if (sscanf(p + 1, " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
             state, &st) != 2)
    return false;
  *start = st;
  return true;
}

struct psc_proc psc_proc_self(void) {
  struct psc_proc me = {.pid = (int32_t)getpid(), .start = 0};
  char state;
  uint64_t start;
  if (read_stat(me.pid, &state, &start)) me.start = start;
  return me;
}

bool psc_proc_alive(int32_t pid, uint64_t start) {
  if (pid <= 0) return false;
  char state;
  uint64_t st;
  if (!read_stat(pid, &state, &st)) return false;
  if (state == 'Z' || state == 'X') return false;
  return start == 0 || st == start;
}
