/* psshim's collectives on its own NCCL communicator, and the bounded waits that keep a dead
 * or stuck peer from hanging this rank. */
#include "comm/nccl_table.h"
#include "comm/node.h"

/* How often a wait looks at NCCL's asynchronous error and the peers' processes. */
#define PSC_POLL_PERIOD_S 0.05

static struct psg_group *group(void) { return &psc_state.node->group; }
static int me(void) { return psc_state.ranks.local_rank; }

bool psc_comm_abort(const struct psg_failure *cause) {
  /* Its result changes nothing: the communicator is given up either way. */
  if (psc_state.comm) (void)psc_nccl.ncclCommAbort(psc_state.comm);
  psc_state.comm = NULL;
  psc_state.comm_aborted = true;
  struct psg_failure mine = {PSG_GAVE_UP, me(), 0};
  psg_fail(group(), me(), cause ? cause : &mine);
  return false;
}

/* One line for an NCCL failure, naming a peer that is gone if there is one. */
static bool nccl_failed(const char *what, ncclResult_t r) {
  struct psg_failure dead = psg_check_alive(group(), me(), UINT64_MAX);
  if (dead.kind == PSG_DEAD) {
    psc_errorf("%s failed: %s (rank %d, pid %d, is gone)", what, psc_nccl.ncclGetErrorString(r),
               dead.who, (int)dead.pid);
    psc_comm_abort(&dead);
  } else {
    psc_errorf("%s failed: %s", what, psc_nccl.ncclGetErrorString(r));
    psc_comm_abort(NULL);
  }
  return false;
}

/* Shared by every bounded wait: false (after its line and the abort) once NCCL reports an
 * error, a peer is gone or gave up, or the wait has lasted longer than the timeout. */
static bool still_waiting(const char *what, double start) {
  ncclResult_t async = ncclSuccess;
  psc_nccl.ncclCommGetAsyncError(psc_state.comm, &async);
  if (async != ncclSuccess && async != ncclInProgress) return nccl_failed(what, async);
  int by;
  struct psg_failure seen = psg_recorded(group(), &by);
  struct psg_failure dead = seen.kind == PSG_DEAD ? seen : psg_check_alive(group(), me(), UINT64_MAX);
  if (seen.kind != PSG_OK && seen.kind != PSG_DEAD) {
    psc_errorf("%s failed: rank %d stopped first (its own log says why)", what, by);
    psc_comm_abort(&seen);
    return false;
  }
  if (dead.kind == PSG_DEAD) {
    psc_errorf("rank %d (pid %d) died during %s", dead.who, (int)dead.pid, what);
    psc_comm_abort(&dead);
    return false;
  }
  if (psg_now() - start >= psc_state.ranks.timeout_s) {
    psc_errorf("%s did not finish within %gs (PSSHIM_COMM_TIMEOUT_S)", what,
               psc_state.ranks.timeout_s);
    psc_comm_abort(NULL);
    return false;
  }
  return true;
}

bool psc_settle(int r, const char *what) {
  double start = psg_now(), next = start + PSC_POLL_PERIOD_S;
  unsigned round = 0;
  while (r == ncclInProgress) {
    psg_backoff(&round);
    /* Asked at every turn: a call settles in microseconds, and asking only every poll
     * period would add up to a poll period to each gathered chunk. */
    ncclResult_t state = ncclInProgress;
    psc_nccl.ncclCommGetAsyncError(psc_state.comm, &state);
    r = state;
    if (r != ncclInProgress || psg_now() < next) continue;
    next = psg_now() + PSC_POLL_PERIOD_S;
    if (!still_waiting(what, start)) return false;
  }
  return r == ncclSuccess || nccl_failed(what, (ncclResult_t)r);
}

/* A communicator to enqueue on, or false: before psc_comm_init, or after an abort (whose
 * line was already written). */
static bool ready(const char *what) {
  if (psc_state.comm) return true;
  if (!psc_state.comm_aborted) psc_errorf("%s before psc_comm_init", what);
  return false;
}

bool psc_allgather_inplace(CUdeviceptr buf, size_t bytes, CUstream stream) {
  if (!ready("psc_allgather_inplace")) return false;
  size_t n = (size_t)psc_state.node->nranks;
  if (bytes % n) {
    psc_errorf("psc_allgather_inplace: %zu bytes do not split into %zu shards", bytes, n);
    return false;
  }
  size_t shard = bytes / n;
  char *base = (char *)(uintptr_t)buf;
  return psc_settle(psc_nccl.ncclAllGather(base + (size_t)me() * shard, base, shard, ncclUint8,
                                           psc_state.comm, stream),
                    "ncclAllGather");
}

bool psc_checksums_minmax(CUdeviceptr mins, CUdeviceptr maxs, size_t count, CUstream stream) {
  if (!ready("psc_checksums_minmax")) return false;
  void *lo = (void *)(uintptr_t)mins, *hi = (void *)(uintptr_t)maxs;
  /* One group: both reductions are launched together, one synchronisation. */
  if (!psc_settle(psc_nccl.ncclGroupStart(), "ncclGroupStart")) return false;
  ncclResult_t a = psc_nccl.ncclAllReduce(lo, lo, count, ncclUint64, ncclMin, psc_state.comm, stream);
  ncclResult_t b = psc_nccl.ncclAllReduce(hi, hi, count, ncclUint64, ncclMax, psc_state.comm, stream);
  ncclResult_t end = psc_nccl.ncclGroupEnd();
  if (a != ncclSuccess && a != ncclInProgress) return nccl_failed("ncclAllReduce (min)", a);
  if (b != ncclSuccess && b != ncclInProgress) return nccl_failed("ncclAllReduce (max)", b);
  return psc_settle(end, "ncclGroupEnd (checksum min/max)");
}

bool psc_broadcast(CUdeviceptr buf, size_t bytes, int root, CUstream stream) {
  if (!ready("psc_broadcast")) return false;
  if (root < 0 || root >= psc_state.node->nranks) {
    psc_errorf("psc_broadcast: root %d is not a rank of %d", root, psc_state.node->nranks);
    return false;
  }
  void *p = (void *)(uintptr_t)buf;
  return psc_settle(psc_nccl.ncclBroadcast(p, p, bytes, ncclUint8, root, psc_state.comm, stream),
                    "ncclBroadcast");
}

bool psc_stream_wait(CUstream stream) {
  if (!ready("psc_stream_wait")) return false;
  double start = psg_now(), next = start + PSC_POLL_PERIOD_S;
  unsigned round = 0;
  for (;;) {
    CUresult q = psc_state.stream_query(stream);
    if (q == CUDA_SUCCESS) return true;
    if (q != CUDA_ERROR_NOT_READY) {
      psc_errorf("a stream with psshim's collectives failed (CUresult %d)", (int)q);
      psc_comm_abort(NULL);
      return false;
    }
    if (psg_now() >= next) {
      next = psg_now() + PSC_POLL_PERIOD_S;
      if (!still_waiting("a collective", start)) return false;
    }
    psg_backoff(&round);
  }
}
