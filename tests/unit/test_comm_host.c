/* comm/: pinned host memory shared by a node's ranks, among forked ranks: concurrent
 * reservations never exceed the budget together, a dead rank's bytes (and a lock it died
 * holding) are reclaimed. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm/node.h"
#include "core/core.h"
#include "rank_procs.h"

#define MIB (1ull << 20)
#define BUDGET (64 * MIB)

/* What the children tell the parent, and how they pace each other. */
struct scratch {
  _Atomic uint64_t held;      /* bytes the ranks say they hold right now */
  _Atomic uint64_t peak;
  _Atomic int granted, refused;
  _Atomic int ready;
};
static struct scratch *scratch;

static int setup(void **state) {
  (void)state;
  memset(scratch, 0, sizeof *scratch);
  return 0;
}

static void wait_for(_Atomic int *flag, int value) {
  for (int i = 0; i < 10000 && atomic_load(flag) < value; i++) usleep(1000);
}

static bool join(uint64_t budget) {
  struct psc_config cfg = {48 * MIB, 0, budget, "auto"}; /* 2, 3, 4 shards */
  return psc_node_join(&cfg, 0) == PSC_GROUP;
}

/* Each rank reserves and releases random amounts; `held` counts only what was granted
 * (added after the grant, removed before the release), so held <= budget must hold always. */
static int churn(int rank, void *arg) {
  (void)arg;
  if (!join(BUDGET)) return 10;
  /* First a round that contends whatever the scheduling: every rank asks for 40% of the
   * budget and holds what it got until all four have asked, so at most two are granted. */
  const uint64_t big = BUDGET / 5 * 2;
  bool got = psc_host_reserve(big);
  if (got) {
    atomic_fetch_add(&scratch->granted, 1);
    uint64_t now = atomic_fetch_add(&scratch->held, big) + big;
    uint64_t peak = atomic_load(&scratch->peak);
    while (now > peak && !atomic_compare_exchange_weak(&scratch->peak, &peak, now)) {}
  } else {
    atomic_fetch_add(&scratch->refused, 1);
  }
  atomic_fetch_add(&scratch->ready, 1);
  wait_for(&scratch->ready, 4);
  if (got) {
    atomic_fetch_sub(&scratch->held, big);
    psc_host_release(big);
  }
  unsigned seed = (unsigned)rank * 7919u + 1;
  for (int i = 0; i < 3000; i++) {
    uint64_t bytes = (uint64_t)(rand_r(&seed) % 24 + 1) * MIB;
    if (!psc_host_reserve(bytes)) {
      atomic_fetch_add(&scratch->refused, 1);
      continue;
    }
    atomic_fetch_add(&scratch->granted, 1);
    uint64_t now = atomic_fetch_add(&scratch->held, bytes) + bytes;
    uint64_t peak = atomic_load(&scratch->peak);
    while (now > peak && !atomic_compare_exchange_weak(&scratch->peak, &peak, now)) {}
    if (i % 16 == 0) usleep(50);
    atomic_fetch_sub(&scratch->held, bytes);
    psc_host_release(bytes);
  }
  if (!psc_barrier()) return 11;
  if (psc_host_reserved() != 0) return 12;
  psc_node_leave();
  return 0;
}

static void concurrent_reservations_stay_within_budget(void **state) {
  (void)state;
  struct rank_result res[4];
  run_ranks(4, churn, NULL, 60, res);
  for (int r = 0; r < 4; r++) {
    assert_int_equal(res[r].code, 0);
    assert_string_equal(res[r].err, "");
  }
  assert_true(atomic_load(&scratch->peak) <= BUDGET);
  assert_true(atomic_load(&scratch->peak) > BUDGET / 2); /* they did contend */
  assert_true(atomic_load(&scratch->granted) > 0);
  assert_true(atomic_load(&scratch->refused) > 0);
}

/* Rank 3 holds the whole budget and dies; the others get its bytes back. */
static int holder_dies(int rank, void *arg) {
  (void)arg;
  if (!join(BUDGET)) return 10;
  if (rank == 3) {
    if (!psc_host_reserve(BUDGET)) return 11;
    atomic_store(&scratch->ready, 1);
    raise(SIGKILL);
  }
  wait_for(&scratch->ready, 1);
  if (rank == 0) {
    /* still alive or not yet reaped, rank 3 may keep its bytes; once it is gone they return */
    for (int i = 0; i < 5000 && !psc_host_reserve(BUDGET / 2); i++) usleep(1000);
    if (psc_host_reserved() != BUDGET / 2) return 12;
    psc_host_release(BUDGET / 2);
  }
  bool ok = psc_barrier();
  psc_node_leave();
  return ok ? 0 : 13;
}

static void dead_rank_bytes_reclaimed(void **state) {
  (void)state;
  struct rank_result res[4];
  run_ranks(4, holder_dies, NULL, 60, res);
  assert_int_equal(res[3].code, -SIGKILL);
  /* rank 0 got the bytes back (else 12); then all see rank 3 dead at the final barrier */
  for (int r = 0; r < 3; r++) {
    assert_int_equal(res[r].code, 13);
    assert_true(res[r].seconds < 10);
    assert_non_null(strstr(res[r].err, ") died before psc_barrier\n"));
  }
}

/* Rank 1 dies holding the accounting lock: the robust mutex lets the others go on. */
static int lock_holder_dies(int rank, void *arg) {
  (void)arg;
  if (!join(BUDGET)) return 10;
  if (rank == 1) {
    pthread_mutex_lock(&psc_state.node->host_lock);
    atomic_store(&scratch->ready, 1);
    raise(SIGKILL);
  }
  wait_for(&scratch->ready, 1);
  usleep(20000);
  for (int i = 0; i < 3; i++) {
    if (!psc_host_reserve(MIB)) return 11;
    psc_host_release(MIB);
  }
  psc_node_leave();
  return 0;
}

static void dead_lock_holder_never_blocks(void **state) {
  (void)state;
  struct rank_result res[3];
  run_ranks(3, lock_holder_dies, NULL, 30, res);
  assert_int_equal(res[1].code, -SIGKILL);
  assert_int_equal(res[0].code, 0);
  assert_int_equal(res[2].code, 0);
}

/* A host budget of 0: no node-wide limit, but the bytes are still counted. */
static int unlimited(int rank, void *arg) {
  (void)rank;
  (void)arg;
  if (!join(0)) return 10;
  if (!psc_host_reserve(1ull << 50)) return 11;
  if (!psc_barrier()) return 12;
  if (psc_host_reserved() != 2ull << 50) return 13;
  if (!psc_barrier()) return 14;
  psc_host_release(1ull << 50);
  psc_node_leave();
  return 0;
}

static void no_budget_no_limit(void **state) {
  (void)state;
  struct rank_result res[2];
  run_ranks(2, unlimited, NULL, 30, res);
  assert_int_equal(res[0].code, 0);
  assert_int_equal(res[1].code, 0);
}

int main(void) {
  ps_options_parse(NULL, 0); /* comm's timeout and NCCL path come from the options table */
  scratch = shared_scratch(sizeof *scratch);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(concurrent_reservations_stay_within_budget, setup),
      cmocka_unit_test_setup(dead_rank_bytes_reclaimed, setup),
      cmocka_unit_test_setup(dead_lock_holder_never_blocks, setup),
      cmocka_unit_test_setup(no_budget_no_limit, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
