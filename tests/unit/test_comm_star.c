/* comm/: the socket star that sharding uses, among forked ranks: checksums agree only where
 * every rank passed the same nonzero value; file descriptors reach every rank (each sees
 * what the others wrote through them); a rank that cannot take part is seen by all and
 * gets none; a killed rank ends the others' exchange at once, with one line, not at the
 * timeout. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "core/core.h"
#include "rank_procs.h"

#define NRANKS 3
#define COUNT 1000

static bool join(void) {
  struct psc_config cfg = {48u << 20, 0, 0, "auto"};
  return psc_node_join(&cfg, 0) == PSC_GROUP;
}

/* Chunk i: equal everywhere when i % 3 == 0; rank 2 differs when i % 3 == 1; rank 1 offers
 * nothing (0) when i % 3 == 2 and i % 2 == 0. */
static int checksums(int rank, void *arg) {
  (void)arg;
  if (!join()) return 10;
  static uint64_t sums[COUNT];
  static bool agree[COUNT];
  for (int round = 0; round < 3; round++) {
    for (uint64_t i = 0; i < COUNT; i++) {
      sums[i] = i * 1000 + 7 + (uint64_t)round;
      if (i % 3 == 1 && rank == 2) sums[i]++;
      if (i % 3 == 2 && i % 2 == 0 && rank == 1) sums[i] = 0;
    }
    if (!psc_agree_checksums(sums, COUNT, agree)) return 11;
    for (uint64_t i = 0; i < COUNT; i++)
      if (agree[i] != (i % 3 == 0 || (i % 3 == 2 && i % 2 != 0))) return 12;
  }
  psc_node_leave();
  return 0;
}

/* Runs fn on every rank: each exits 0 and says nothing. */
static void all_ranks_succeed(int (*fn)(int, void *)) {
  struct rank_result res[NRANKS];
  run_ranks(NRANKS, fn, NULL, 60, res);
  for (int r = 0; r < NRANKS; r++) {
    assert_int_equal(res[r].code, 0);
    assert_string_equal(res[r].err, "");
  }
}

static void checksums_agree_where_all_equal(void **state) {
  (void)state;
  all_ranks_succeed(checksums);
}

/* Every rank passes a memfd holding its rank; each reads every rank's through the fd it got,
 * then writes into its own through a peer's: rank r + 1 sees it. Then rank 1 passes none, and
 * gets none. */
static int fds(int rank, void *arg) {
  (void)arg;
  if (!join()) return 10;
  int mine = memfd_create("star-test", MFD_CLOEXEC), got[PSC_MAX_RANKS];
  if (mine < 0 || ftruncate(mine, 4096) != 0) return 11;
  int *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, mine, 0);
  if (p == MAP_FAILED) return 11;
  p[0] = rank;
  if (!psc_share_fds(mine, got)) return 12;
  for (int r = 0; r < NRANKS; r++) {
    int *q = got[r] < 0 ? MAP_FAILED : mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, got[r], 0);
    if (q == MAP_FAILED || q[0] != r) return 13;
    if (r == (rank + 1) % NRANKS) q[1] = 100 + rank;
    munmap(q, 4096);
    close(got[r]);
  }
  if (!psc_barrier() || p[1] != 100 + (rank + NRANKS - 1) % NRANKS) return 14;
  if (!psc_share_fds(rank == 1 ? -1 : mine, got)) return 15;
  for (int r = 0; r < NRANKS; r++) {
    if ((got[r] < 0) != (r == 1 || rank == 1)) return 16; /* rank 1 takes no part */
    if (got[r] >= 0) close(got[r]);
  }
  close(mine);
  psc_node_leave();
  return 0;
}

static void fds_reach_every_rank(void **state) {
  (void)state;
  all_ranks_succeed(fds);
}

/* Rank `victim` dies after one exchange; with a 60 s timeout the others fail at once, and
 * every later call fails without another line. */
static int one_dies(int rank, void *arg) {
  int victim = *(int *)arg;
  setenv("PSSHIM_COMM_TIMEOUT_S", "60", 1);
  ps_options_parse(NULL, 0); /* comm reads it from the options table */
  if (!join()) return 10;
  uint64_t sums[4] = {1, 2, 3, 4};
  bool agree[4];
  if (!psc_agree_checksums(sums, 4, agree)) return 11;
  if (rank == victim) raise(SIGKILL);
  bool ok = psc_agree_checksums(sums, 4, agree);
  int fd[PSC_MAX_RANKS];
  if (ok || psc_share_fds(-1, fd)) return 12;
  psc_node_leave();
  return 0;
}

static void dead_rank_ends_the_exchange(void **state) {
  (void)state;
  for (int victim = 0; victim < 2; victim++) { /* the hub, and a spoke */
    struct rank_result res[NRANKS];
    run_ranks(NRANKS, one_dies, &victim, 30, res);
    assert_int_equal(res[victim].code, -SIGKILL);
    for (int r = 0; r < NRANKS; r++) {
      if (r == victim) continue;
      assert_int_equal(res[r].code, 0);
      assert_true(res[r].seconds < 10);
      assert_non_null(strstr(res[r].err, "psshim: the ranks' socket star failed during the checksum exchange"));
      assert_null(strstr(strstr(res[r].err, "\n") + 1, "psshim:")); /* one line */
    }
  }
}

int main(void) {
  ps_options_parse(NULL, 0); /* comm's timeout and NCCL path come from the options table */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(checksums_agree_where_all_equal),
      cmocka_unit_test(fds_reach_every_rank),
      cmocka_unit_test(dead_rank_ends_the_exchange),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
