/* Runs a test body as N ranks of one node, each a forked process with torchrun's variables
 * (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and a
 * TORCHELASTIC_RUN_ID unique to the run) and its stderr captured. */
#ifndef PSSHIM_TESTS_RANK_PROCS_H
#define PSSHIM_TESTS_RANK_PROCS_H

#include <stdbool.h>

#define RANK_PROCS_MAX 16

struct rank_result {
  int code;       /* exit code, or -signal if killed */
  double seconds; /* from the start of the run to this rank's end */
  char err[4096]; /* what it wrote to stderr */
};

/* body(rank, arg) runs in each child (it may setenv first) and returns its exit code.
 * Children still running after limit_s are killed (code -SIGKILL). */
void run_ranks(int n, int (*body)(int rank, void *arg), void *arg, double limit_s,
               struct rank_result out[]);
/* A shared anonymous mapping the children can all write: bytes, zeroed. */
void *shared_scratch(unsigned long bytes);

#endif
