/* A process's identity as seen by its peers on the same node: pid plus the kernel's start
 * time, so a recycled pid is never mistaken for the peer that died. Shared with the fake
 * NCCL in tests/fakenccl/ (hidden symbols, so each library keeps its own copy). */
#ifndef PSSHIM_COMM_PROC_H
#define PSSHIM_COMM_PROC_H

#include <stdbool.h>
#include <stdint.h>

struct psc_proc {
  int32_t pid;
  uint64_t start; /* /proc/PID/stat field 22, clock ticks since boot; 0 = unknown */
};

/* This process's identity. */
struct psc_proc psc_proc_self(void);
/* False when the process is gone: no such pid, a zombie (killed but not yet reaped, which
 * kill(pid, 0) alone would call alive), or a different process under a recycled pid.
 * start == 0 compares the pid only. */
bool psc_proc_alive(int32_t pid, uint64_t start);

#endif
