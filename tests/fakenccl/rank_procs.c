#include "rank_procs.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void *shared_scratch(unsigned long bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) abort();
  return p;
}

static void set_int(const char *name, int v) {
  char buf[16];
  snprintf(buf, sizeof buf, "%d", v);
  setenv(name, buf, 1);
}

void run_ranks(int n, int (*body)(int rank, void *arg), void *arg, double limit_s,
               struct rank_result out[]) {
  static unsigned runs;
  char run_id[64];
  snprintf(run_id, sizeof run_id, "test-%d-%u", (int)getpid(), runs++);
  pid_t pid[RANK_PROCS_MAX];
  FILE *err[RANK_PROCS_MAX];
  fflush(NULL);
  double start = now();
  for (int r = 0; r < n; r++) {
    err[r] = tmpfile();
    pid[r] = fork();
    if (pid[r] == 0) {
      dup2(fileno(err[r]), 2);
      setenv("TORCHELASTIC_RUN_ID", run_id, 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", "29500", 1);
      set_int("WORLD_SIZE", n);
      set_int("LOCAL_WORLD_SIZE", n);
      set_int("RANK", r);
      set_int("LOCAL_RANK", r);
      int code = body(r, arg);
      fflush(NULL);
      _exit(code);
    }
  }
  int left = n;
  bool done[RANK_PROCS_MAX] = {false};
  while (left > 0) {
    bool late = now() - start > limit_s;
    for (int r = 0; r < n; r++) {
      if (done[r]) continue;
      if (late) kill(pid[r], SIGKILL);
      int status;
      if (waitpid(pid[r], &status, late ? 0 : WNOHANG) != pid[r]) continue;
      done[r] = true;
      left--;
      out[r].seconds = now() - start;
      out[r].code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    }
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  for (int r = 0; r < n; r++) {
    rewind(err[r]);
    size_t got = fread(out[r].err, 1, sizeof out[r].err - 1, err[r]);
    out[r].err[got] = '\0';
    fclose(err[r]);
  }
}
