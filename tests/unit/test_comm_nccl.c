/* comm/: psshim's NCCL communicator among forked ranks, on the fake NCCL (device buffers are
 * host memory there, and collectives finish at call time). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/nccl_table.h"
#include "core/core.h"
#include "comm/node.h"
#include "rank_procs.h"

#define MIB (1ull << 20)

static CUresult stream_done(CUstream s) {
  (void)s;
  return CUDA_SUCCESS;
}
static CUresult stream_stuck(CUstream s) {
  (void)s;
  return CUDA_ERROR_NOT_READY;
}

/* What the children tell the parent. */
struct scratch {
  unsigned char unique_id[RANK_PROCS_MAX][128];
  bool replicated[RANK_PROCS_MAX][64];
};
static struct scratch *scratch;

static int setup(void **state) {
  (void)state;
  memset(scratch, 0, sizeof *scratch);
  unsetenv("PSSHIM_COMM_TIMEOUT_S");
  unsetenv("PSSHIM_NCCL");
  ps_options_parse(NULL, 0); /* comm reads them from the options table */
  return 0;
}

static int start(CUresult (*query)(CUstream)) {
  struct psc_config cfg = {48 * MIB, 0, 0, "auto"}; /* 2, 3, 4 shards */
  if (psc_node_join(&cfg, 0) != PSC_GROUP) return 10;
  if (!psc_comm_init(query)) return 11;
  return 0;
}

static unsigned char pattern(size_t i) { return (unsigned char)(i * 131 + (i >> 9)); }

/* A chunk of several fake-NCCL staging steps: each rank starts with only its own shard. */
static int gather(int rank, void *arg) {
  (void)arg;
  int rc = start(stream_done);
  if (rc) return rc;
  memcpy(scratch->unique_id[rank], psc_state.node->unique_id, 128);
  size_t bytes = 3 * MIB + 4 * 1024;
  unsigned char *buf = malloc(bytes);
  memset(buf, 0xee, bytes);
  struct psc_shard s = psc_shard_of(bytes, psc_nranks(), rank);
  for (size_t i = s.offset; i < s.offset + s.len; i++) buf[i] = pattern(i);
  if (!psc_allgather_inplace((CUdeviceptr)(uintptr_t)buf, bytes, NULL)) return 12;
  if (!psc_stream_wait(NULL)) return 13;
  for (size_t i = 0; i < bytes; i++)
    if (buf[i] != pattern(i)) return 14;
  /* and from another root, a broadcast */
  memset(buf, rank == 2 ? 0x5a : 0, 4096);
  if (!psc_broadcast((CUdeviceptr)(uintptr_t)buf, 4096, 2, NULL)) return 15;
  for (size_t i = 0; i < 4096; i++)
    if (buf[i] != 0x5a) return 16;
  free(buf);
  psc_node_leave();
  return 0;
}

static void allgather_in_place(void **state) {
  (void)state;
  struct rank_result res[4];
  run_ranks(4, gather, NULL, 60, res);
  for (int r = 0; r < 4; r++) {
    assert_int_equal(res[r].code, 0);
    assert_string_equal(res[r].err, "");
    /* the id rank 0 made reached every rank */
    assert_memory_equal(scratch->unique_id[r], scratch->unique_id[0], 128);
  }
  static const unsigned char zero[128];
  assert_memory_not_equal(scratch->unique_id[0], zero, 128);
}

/* 40 checksums: those at multiples of 3 or 7 differ on one rank (i % 4), the rest agree. */
static bool diverges(int i) { return i % 3 == 0 || i % 7 == 0; }

static int checksums(int rank, void *arg) {
  (void)arg;
  int rc = start(stream_done);
  if (rc) return rc;
  enum { N = 40 };
  uint64_t mins[N], maxs[N];
  for (int i = 0; i < N; i++) {
    uint64_t sum = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
    if (diverges(i) && rank == i % 4) sum ^= 1ull << (i % 64);
    mins[i] = maxs[i] = sum;
  }
  if (!psc_checksums_minmax((CUdeviceptr)(uintptr_t)mins, (CUdeviceptr)(uintptr_t)maxs, N, NULL))
    return 12;
  if (!psc_stream_wait(NULL)) return 13;
  for (int i = 0; i < N; i++) scratch->replicated[rank][i] = mins[i] == maxs[i];
  psc_node_leave();
  return 0;
}

static void checksum_agreement(void **state) {
  (void)state;
  struct rank_result res[4];
  run_ranks(4, checksums, NULL, 60, res);
  for (int r = 0; r < 4; r++) {
    assert_int_equal(res[r].code, 0);
    for (int i = 0; i < 40; i++) assert_int_equal(scratch->replicated[r][i], !diverges(i));
  }
}

/* The fake's reductions psshim does not use yet, straight through the loaded table. */
static int reductions(int rank, void *arg) {
  (void)arg;
  int rc = start(stream_done);
  if (rc) return rc;
  ncclComm_t comm = psc_state.comm;
  enum { N = 70000 }; /* more than one staging step of the fake */
  static float f[N], fsum[N], fmax[N];
  static uint64_t u[N];
  for (int i = 0; i < N; i++) {
    f[i] = (float)(rank + 1) * 0.5f + (float)i;
    u[i] = (uint64_t)i << rank;
  }
  /* The communicator is non-blocking: each call is settled before the next. */
  if (!psc_settle(psc_nccl.ncclAllReduce(f, fsum, N, ncclFloat32, ncclSum, comm, NULL), "sum")) return 12;
  if (!psc_settle(psc_nccl.ncclAllReduce(f, fmax, N, ncclFloat32, ncclMax, comm, NULL), "max")) return 13;
  if (!psc_settle(psc_nccl.ncclAllReduce(f, f, N, ncclFloat32, ncclMin, comm, NULL), "min")) return 14;
  if (!psc_settle(psc_nccl.ncclAllReduce(u, u, N, ncclUint64, ncclSum, comm, NULL), "u64 sum")) return 15;
  for (int i = 0; i < N; i++) {
    if (fsum[i] != 5.0f + 4.0f * (float)i) return 16; /* (1+2+3+4)/2 + 4i */
    if (fmax[i] != 2.0f + (float)i || f[i] != 0.5f + (float)i) return 17;
    if (u[i] != (uint64_t)i * 15) return 18; /* i * (1+2+4+8) */
  }
  psc_node_leave();
  return 0;
}

static void fake_reductions(void **state) {
  (void)state;
  struct rank_result res[4];
  run_ranks(4, reductions, NULL, 60, res);
  for (int r = 0; r < 4; r++) assert_int_equal(res[r].code, 0);
}

/* Rank 2 SIGKILLs itself inside its second collective (the fake's fault injection), after
 * the others handed in their shards. */
static int killed_mid_collective(int rank, void *arg) {
  (void)arg;
  setenv("PSSHIM_COMM_TIMEOUT_S", "3", 1);
  ps_options_parse(NULL, 0); /* comm reads them from the options table */
  if (rank == 2) setenv("FAKENCCL_KILL_IN_OP", "2", 1);
  int rc = start(stream_done);
  if (rc) return rc;
  size_t bytes = 4 * 4096;
  unsigned char *buf = calloc(1, bytes);
  if (!psc_allgather_inplace((CUdeviceptr)(uintptr_t)buf, bytes, NULL)) return 12;
  bool ok = psc_allgather_inplace((CUdeviceptr)(uintptr_t)buf, bytes, NULL);
  /* aborted: later calls fail at once, without another line */
  bool again = psc_allgather_inplace((CUdeviceptr)(uintptr_t)buf, bytes, NULL);
  psc_node_leave();
  return ok || again ? 13 : 0;
}

static void killed_rank_fails_the_others(void **state) {
  (void)state;
  struct rank_result res[4];
  run_ranks(4, killed_mid_collective, NULL, 60, res);
  assert_int_equal(res[2].code, -SIGKILL);
  for (int r = 0; r < 4; r++) {
    if (r == 2) continue;
    assert_int_equal(res[r].code, 0);
    assert_true(res[r].seconds < 3 + 2.0);
    static const char head[] = "psshim: ncclAllGather failed: remote process exited or there "
                               "was a network error (rank 2, pid ";
    assert_true(strncmp(res[r].err, head, strlen(head)) == 0);
    assert_non_null(strstr(res[r].err, ", is gone)\n"));
    assert_null(strchr(strchr(res[r].err, '\n') + 1, '\n')); /* one line */
  }
}

/* A stream that never completes: every rank gives up after the timeout. */
static int stuck(int rank, void *arg) {
  (void)rank;
  (void)arg;
  setenv("PSSHIM_COMM_TIMEOUT_S", "1", 1);
  ps_options_parse(NULL, 0); /* comm reads them from the options table */
  int rc = start(stream_stuck);
  if (rc) return rc;
  bool ok = psc_stream_wait(NULL);
  psc_node_leave();
  return ok ? 12 : 0;
}

static void stuck_stream_times_out(void **state) {
  (void)state;
  struct rank_result res[2];
  run_ranks(2, stuck, NULL, 60, res);
  static const char timed_out[] =
      "psshim: a collective did not finish within 1s (PSSHIM_COMM_TIMEOUT_S)\n";
  int first = strcmp(res[0].err, timed_out) == 0 ? 0 : 1; /* the first to time out */
  assert_string_equal(res[first].err, timed_out);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(res[r].code, 0);
    assert_true(res[r].seconds < 1 + 2.0);
    char stopped[128];
    snprintf(stopped, sizeof stopped, "psshim: a collective failed: rank %d stopped first (its "
                                      "own log says why)\n", first);
    /* the other timed out too, or saw the first one stop */
    if (r != first && strcmp(res[r].err, timed_out) != 0) assert_string_equal(res[r].err, stopped);
  }
}

/* Rank 1 dies while the others wait on a stream: noticed long before the timeout. */
static int dies_while_waiting(int rank, void *arg) {
  (void)arg;
  setenv("PSSHIM_COMM_TIMEOUT_S", "60", 1);
  ps_options_parse(NULL, 0); /* comm reads them from the options table */
  int rc = start(stream_stuck);
  if (rc) return rc;
  if (rank == 1) raise(SIGKILL);
  bool ok = psc_stream_wait(NULL);
  psc_node_leave();
  return ok ? 12 : 0;
}

static void dead_rank_ends_stream_wait(void **state) {
  (void)state;
  struct rank_result res[3];
  run_ranks(3, dies_while_waiting, NULL, 60, res);
  for (int r = 0; r < 3; r += 2) {
    assert_int_equal(res[r].code, 0);
    assert_true(res[r].seconds < 5);
    assert_non_null(strstr(res[r].err, "psshim: rank 1 (pid "));
    assert_non_null(strstr(res[r].err, ") died during a collective\n"));
  }
}

/* Rank 1 gives up on its stream (a shorter timeout) and exits: the others, with a long
 * timeout, stop at once, and do not call its exit a death. */
static int gives_up_while_waiting(int rank, void *arg) {
  (void)arg;
  setenv("PSSHIM_COMM_TIMEOUT_S", rank == 1 ? "0.5" : "60", 1);
  ps_options_parse(NULL, 0); /* comm reads them from the options table */
  int rc = start(stream_stuck);
  if (rc) return rc;
  bool ok = psc_stream_wait(NULL);
  if (rank == 1) return ok ? 12 : 0; /* exits without leaving */
  psc_node_leave();
  return ok ? 12 : 0;
}

static void peer_giving_up_ends_stream_wait(void **state) {
  (void)state;
  struct rank_result res[3];
  run_ranks(3, gives_up_while_waiting, NULL, 60, res);
  assert_string_equal(res[1].err, "psshim: a collective did not finish within 0.5s "
                                  "(PSSHIM_COMM_TIMEOUT_S)\n");
  for (int r = 0; r < 3; r++) {
    assert_int_equal(res[r].code, 0);
    assert_true(res[r].seconds < 5);
    if (r != 1)
      assert_string_equal(res[r].err, "psshim: a collective failed: rank 1 stopped first (its "
                                      "own log says why)\n");
  }
}

/* Rank 1 cannot load NCCL: it says so, and the others stop at once instead of waiting. */
static int no_nccl_on_rank_1(int rank, void *arg) {
  (void)arg;
  setenv("PSSHIM_COMM_TIMEOUT_S", "60", 1);
  if (rank == 1) setenv("PSSHIM_NCCL", "/nonexistent/libnccl.so.2", 1);
  ps_options_parse(NULL, 0); /* comm reads them from the options table */
  int rc = start(stream_done);
  psc_node_leave();
  return rc == 11 ? 0 : 1;
}

static void missing_nccl_refused(void **state) {
  (void)state;
  struct rank_result res[3];
  run_ranks(3, no_nccl_on_rank_1, NULL, 60, res);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(res[r].code, 0);
    assert_true(res[r].seconds < 5);
  }
  assert_string_equal(res[1].err, "psshim: cannot load NCCL (/nonexistent/libnccl.so.2) for "
                                  "psshim's own communicator: /nonexistent/libnccl.so.2: cannot "
                                  "open shared object file: No such file or directory; set "
                                  "PSSHIM_NCCL to libnccl.so.2's path\n");
  assert_string_equal(res[0].err, "psshim: rank 1 gave up before the NCCL unique id exchange "
                                  "(its own log says why)\n");
  assert_string_equal(res[2].err, res[0].err);
}

int main(void) {
  scratch = shared_scratch(sizeof *scratch);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(allgather_in_place, setup),
      cmocka_unit_test_setup(checksum_agreement, setup),
      cmocka_unit_test_setup(fake_reductions, setup),
      cmocka_unit_test_setup(killed_rank_fails_the_others, setup),
      cmocka_unit_test_setup(stuck_stream_times_out, setup),
      cmocka_unit_test_setup(dead_rank_ends_stream_wait, setup),
      cmocka_unit_test_setup(peer_giving_up_ends_stream_wait, setup),
      cmocka_unit_test_setup(missing_nccl_refused, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
