/* comm/: the node group among forked ranks: rendezvous, refusal of a mismatched
 * configuration, missing and dead ranks, helpers that inherit a rank's environment, stale
 * segments, the allocation-hash check, and WORLD_SIZE=1 creating nothing. */
#include <dlfcn.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm/node.h"
#include "core/core.h"
#include "rank_procs.h"

#define MIB (1ull << 20)

static struct psc_config config(void) {
  return (struct psc_config){48 * MIB, 16 * 1024 * MIB, 256 * MIB, "auto"}; /* 2, 3, 4 shards */
}

/* What the children tell the parent. */
struct scratch {
  char shm_name[48];
  _Atomic int joined;
  _Atomic int helper_done;
};
static struct scratch *scratch;

static int setup(void **state) {
  (void)state;
  memset(scratch, 0, sizeof *scratch);
  unsetenv("PSSHIM_COMM_TIMEOUT_S");
  ps_options_parse(NULL, 0); /* comm reads them from the options table */
  return 0;
}

static void wait_for(_Atomic int *flag, int value) {
  for (int i = 0; i < 10000 && atomic_load(flag) < value; i++) usleep(1000);
}

static bool segment_exists(const char *name) {
  int fd = shm_open(name, O_RDONLY, 0);
  if (fd >= 0) close(fd);
  return fd >= 0;
}

static int meet(int rank, void *arg) {
  (void)arg;
  struct psc_config cfg = config();
  if (psc_node_join(&cfg, 2 * MIB) != PSC_GROUP) return 10;
  if (psc_rank() != rank || psc_nranks() != 4) return 11;
  if (rank == 0) strcpy(scratch->shm_name, psc_state.shm_name);
  for (int i = 0; i < 3; i++)
    if (!psc_barrier()) return 12;
  if (rank == 1) {
    /* a forked child (a data-loader worker) leaving must not take the rank's slot along */
    pid_t child = fork();
    if (child == 0) {
      psc_node_leave();
      _exit(0);
    }
    waitpid(child, NULL, 0);
    if (atomic_load(&psc_state.node->group.m[1].left)) return 16;
  }
  if (!psc_barrier()) return 12;
  if (!segment_exists(psc_state.shm_name)) return 13; /* kept while the job runs */
  if (!psc_check_alloc_hash(0x1234)) return 14;
  if (!psc_barrier()) return 15;
  psc_node_leave();
  return 0;
}

static void four_ranks_meet(void **state) {
  (void)state;
  struct rank_result res[4];
  run_ranks(4, meet, NULL, 30, res);
  for (int r = 0; r < 4; r++) {
    assert_int_equal(res[r].code, 0);
    assert_string_equal(res[r].err, "");
  }
  assert_true(scratch->shm_name[0] == '/');
  assert_false(segment_exists(scratch->shm_name)); /* the last rank out removed it */
}

static int chunk_differs_on_rank_2(int rank, void *arg) {
  (void)arg;
  struct psc_config cfg = config();
  if (rank == 2) cfg.chunk_size = 32 * MIB;
  return psc_node_join(&cfg, 0) == PSC_BAD ? 0 : 1;
}

static void config_mismatch_refused(void **state) {
  (void)state;
  struct rank_result res[4];
  run_ranks(4, chunk_differs_on_rank_2, NULL, 30, res);
  for (int r = 0; r < 4; r++) {
    assert_int_equal(res[r].code, 0);
    /* every rank says why it stops, in one line */
    assert_string_equal(res[r].err, "psshim: rank 2 has PSSHIM_CHUNK_SIZE=32M but rank 0 has 48M\n");
  }
}

static int chunk_does_not_shard(int rank, void *arg) {
  (void)rank;
  (void)arg;
  struct psc_config cfg = config();
  cfg.chunk_size = 64 * MIB;
  return psc_node_join(&cfg, 2 * MIB) == PSC_BAD ? 0 : 1;
}

static void unshardable_chunk_refused(void **state) {
  (void)state;
  struct rank_result res[3];
  run_ranks(3, chunk_does_not_shard, NULL, 30, res);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(res[r].code, 0);
    assert_string_equal(res[r].err, "psshim: PSSHIM_CHUNK_SIZE=64M does not split into 3 shards "
                                    "of a multiple of 2M (LOCAL_WORLD_SIZE=3): use a multiple of 6M\n");
  }
}

static int rank_3_never_comes(int rank, void *arg) {
  (void)arg;
  if (rank == 3) return 0;
  setenv("PSSHIM_COMM_TIMEOUT_S", "2", 1);
  ps_options_parse(NULL, 0); /* comm reads them from the options table */
  struct psc_config cfg = config();
  return psc_node_join(&cfg, 0) == PSC_BAD ? 0 : 1;
}

static void missing_rank_times_out(void **state) {
  (void)state;
  struct rank_result res[4];
  run_ranks(4, rank_3_never_comes, NULL, 30, res);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(res[r].code, 0);
    assert_true(res[r].seconds < 2 + 2.0);
    assert_string_equal(res[r].err, "psshim: rank 3 never joined the node rendezvous within 2s "
                                    "(PSSHIM_COMM_TIMEOUT_S)\n");
  }
}

static int rank_0_never_comes(int rank, void *arg) {
  (void)arg;
  if (rank == 0) return 0;
  setenv("PSSHIM_COMM_TIMEOUT_S", "1", 1);
  ps_options_parse(NULL, 0); /* comm reads them from the options table */
  struct psc_config cfg = config();
  return psc_node_join(&cfg, 0) == PSC_BAD ? 0 : 1;
}

static void missing_rank_0_times_out(void **state) {
  (void)state;
  struct rank_result res[2];
  run_ranks(2, rank_0_never_comes, NULL, 30, res);
  assert_int_equal(res[1].code, 0);
  assert_true(res[1].seconds < 1 + 2.0);
  assert_non_null(strstr(res[1].err, "psshim: rank 0 did not open psshim's node group (segment "
                                     "/psshim-"));
  assert_non_null(strstr(res[1].err, ") within 1s (PSSHIM_COMM_TIMEOUT_S)\n"));
}

/* Rank 1 is killed instead of reaching the barrier; with a long timeout, the others must
 * notice its death, not wait the timeout out. */
static int rank_1_dies(int rank, void *arg) {
  (void)arg;
  setenv("PSSHIM_COMM_TIMEOUT_S", "60", 1);
  ps_options_parse(NULL, 0); /* comm reads them from the options table */
  struct psc_config cfg = config();
  if (psc_node_join(&cfg, 0) != PSC_GROUP) return 1;
  if (rank == 1) raise(SIGKILL);
  bool ok = psc_barrier();
  psc_node_leave();
  return ok ? 1 : 0;
}

static void dead_rank_noticed(void **state) {
  (void)state;
  struct rank_result res[3];
  run_ranks(3, rank_1_dies, NULL, 30, res);
  assert_int_equal(res[1].code, -SIGKILL);
  for (int r = 0; r < 3; r += 2) {
    assert_int_equal(res[r].code, 0);
    assert_true(res[r].seconds < 5);
    assert_non_null(strstr(res[r].err, "psshim: rank 1 (pid "));
    assert_non_null(strstr(res[r].err, ") died before psc_barrier\n"));
  }
}

/* Rank 2 leaves early but stays alive: the others stop at once, not at the timeout. */
static int rank_2_leaves_early(int rank, void *arg) {
  (void)arg;
  setenv("PSSHIM_COMM_TIMEOUT_S", "60", 1);
  ps_options_parse(NULL, 0); /* comm reads them from the options table */
  struct psc_config cfg = config();
  if (psc_node_join(&cfg, 0) != PSC_GROUP) return 1;
  if (rank == 2) {
    psc_node_leave();
    sleep(2);
    return 0;
  }
  bool ok = psc_barrier();
  psc_node_leave();
  return ok ? 1 : 0;
}

static void rank_that_left_noticed(void **state) {
  (void)state;
  struct rank_result res[3];
  run_ranks(3, rank_2_leaves_early, NULL, 30, res);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(res[r].code, 0);
    assert_true(res[r].seconds < 1.5);
    assert_string_equal(res[r].err, "psshim: rank 2 left psshim's node group before psc_barrier\n");
  }
}

/* Rank 2 pretends to be a helper process that inherited rank 1's environment. */
static int helper_inherits_rank_1(int rank, void *arg) {
  (void)arg;
  setenv("WORLD_SIZE", "2", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  struct psc_config cfg = config();
  if (rank == 2) {
    setenv("RANK", "1", 1);
    setenv("LOCAL_RANK", "1", 1);
    wait_for(&scratch->joined, 2);
    bool refused = psc_node_join(&cfg, 0) == PSC_BAD;
    atomic_store(&scratch->helper_done, 1);
    return refused ? 0 : 1;
  }
  if (psc_node_join(&cfg, 0) != PSC_GROUP) return 1;
  atomic_fetch_add(&scratch->joined, 1);
  wait_for(&scratch->helper_done, 1);
  bool ok = psc_barrier();
  psc_node_leave();
  return ok ? 0 : 2;
}

static void helper_with_rank_environment_refused(void **state) {
  (void)state;
  struct rank_result res[3];
  run_ranks(3, helper_inherits_rank_1, NULL, 30, res);
  for (int r = 0; r < 3; r++) assert_int_equal(res[r].code, 0);
  assert_string_equal(res[0].err, "");
  assert_string_equal(res[1].err, "");
  static const char head[] = "psshim: LOCAL_RANK=1 of this job is already pid ";
  assert_true(strncmp(res[2].err, head, strlen(head)) == 0);
  assert_non_null(strstr(res[2].err, ": is this process a helper that inherited a rank's "
                                     "environment?\n"));
}

/* A run that dies whole after meeting leaves its segment behind: the next run of the same
 * job (same key) replaces it, and rank 0 of any later run removes it. */
static int crash_or_run(int rank, void *arg) {
  setenv("TORCHELASTIC_RUN_ID", (const char *)arg, 1);
  setenv("PSSHIM_COMM_TIMEOUT_S", "10", 1);
  ps_options_parse(NULL, 0); /* comm reads them from the options table */
  struct psc_config cfg = config();
  if (psc_node_join(&cfg, 0) != PSC_GROUP) return 1;
  if (rank == 0) strcpy(scratch->shm_name, psc_state.shm_name);
  if (!psc_barrier()) return 2;
  if (getenv("CRASH")) raise(SIGKILL);
  psc_node_leave();
  return 0;
}

static void crashed_run(const char *run_id, char name[48]) {
  struct rank_result res[4];
  setenv("CRASH", "1", 1);
  run_ranks(4, crash_or_run, (void *)run_id, 30, res);
  unsetenv("CRASH");
  for (int r = 0; r < 4; r++) assert_int_equal(res[r].code, -SIGKILL);
  strcpy(name, scratch->shm_name);
}

static void clean_run(const char *run_id) {
  struct rank_result res[4];
  run_ranks(4, crash_or_run, (void *)run_id, 30, res);
  for (int r = 0; r < 4; r++) {
    assert_int_equal(res[r].code, 0);
    assert_string_equal(res[r].err, "");
  }
}

static void stale_segments_replaced_and_removed(void **state) {
  (void)state;
  char a[64], b[64], name_a[48], name_b[48];
  snprintf(a, sizeof a, "stale-a-%d", (int)getpid());
  snprintf(b, sizeof b, "stale-b-%d", (int)getpid());
  crashed_run(a, name_a);
  clean_run(a); /* the same job again: rank 0 replaces the stale segment */
  crashed_run(a, name_a);
  crashed_run(b, name_b);
  assert_true(segment_exists(name_b));
  clean_run(a); /* another job's abandoned segment goes too */
  assert_false(segment_exists(name_a));
  assert_false(segment_exists(name_b));
}

static int hash_differs_on_rank_1(int rank, void *arg) {
  (void)arg;
  struct psc_config cfg = config();
  if (psc_node_join(&cfg, 0) != PSC_GROUP) return 1;
  /* a first, agreeing exchange, so the second uses the other half of the slots */
  if (!psc_check_alloc_hash(7)) return 2;
  bool ok = psc_check_alloc_hash(rank == 1 ? 0xbad : 0x600d);
  psc_node_leave();
  return ok ? 3 : 0;
}

static void alloc_hash_mismatch_refused(void **state) {
  (void)state;
  struct rank_result res[3];
  run_ranks(3, hash_differs_on_rank_1, NULL, 30, res);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(res[r].code, 0);
    assert_string_equal(res[r].err, "psshim: rank 1 allocated differently from rank 0 up to the "
                                    "first iteration boundary (allocation sequence hash "
                                    "0000000000000bad vs 000000000000600d): its replicated chunks "
                                    "cannot be sharded\n");
  }
}

/* WORLD_SIZE=1: no segment mapped, NCCL not loaded, nothing written. */
static int world_of_one(int rank, void *arg) {
  (void)rank;
  (void)arg;
  setenv("WORLD_SIZE", "1", 1);
  struct psc_config cfg = config();
  if (psc_node_join(&cfg, 0) != PSC_ALONE) return 1;
  if (psc_comm_init(NULL)) return 2; /* refused: no group */
  if (dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD)) return 3;
  FILE *maps = fopen("/proc/self/maps", "r");
  char line[512];
  while (fgets(line, sizeof line, maps))
    if (strstr(line, "/psshim-")) return 4;
  fclose(maps);
  return 0;
}

static void world_size_one_creates_nothing(void **state) {
  (void)state;
  struct rank_result res[1];
  run_ranks(1, world_of_one, NULL, 30, res);
  assert_int_equal(res[0].code, 0);
  assert_string_equal(res[0].err, "psshim: psc_comm_init before psc_node_join formed a group\n");
}

int main(void) {
  scratch = shared_scratch(sizeof *scratch);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(four_ranks_meet, setup),
      cmocka_unit_test_setup(config_mismatch_refused, setup),
      cmocka_unit_test_setup(unshardable_chunk_refused, setup),
      cmocka_unit_test_setup(missing_rank_times_out, setup),
      cmocka_unit_test_setup(missing_rank_0_times_out, setup),
      cmocka_unit_test_setup(dead_rank_noticed, setup),
      cmocka_unit_test_setup(rank_that_left_noticed, setup),
      cmocka_unit_test_setup(helper_with_rank_environment_refused, setup),
      cmocka_unit_test_setup(stale_segments_replaced_and_removed, setup),
      cmocka_unit_test_setup(alloc_hash_mismatch_refused, setup),
      cmocka_unit_test_setup(world_size_one_creates_nothing, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
