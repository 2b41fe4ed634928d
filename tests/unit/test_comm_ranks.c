/* comm/: reading the ranks from the environment, shard geometry, configuration agreement
 * (one process; the multi-process tests are in test_comm_group.c and test_comm_nccl.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "core/core.h"

static char last_line[512];
static int lines;
static void sink(const char *line) {
  snprintf(last_line, sizeof last_line, "%s", line);
  lines++;
}

static const char *const vars[] = {"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                   "GROUP_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                                   "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                                   "PSSHIM_COMM_TIMEOUT_S"};

static int setup(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
  psc_set_error_sink(sink);
  last_line[0] = '\0';
  lines = 0;
  return 0;
}

static void torchrun(const char *rank, const char *local, const char *ws, const char *lws) {
  setenv("RANK", rank, 1);
  setenv("LOCAL_RANK", local, 1);
  setenv("WORLD_SIZE", ws, 1);
  setenv("LOCAL_WORLD_SIZE", lws, 1);
  setenv("MASTER_ADDR", "10.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
}

static void alone_without_world_size(void **state) {
  (void)state;
  struct psc_ranks r;
  assert_int_equal(psc_ranks_read(&r), PSC_ALONE);
  setenv("WORLD_SIZE", "1", 1);
  setenv("RANK", "garbage", 1); /* never looked at: WORLD_SIZE=1 is the one check */
  assert_int_equal(psc_ranks_read(&r), PSC_ALONE);
  assert_int_equal(lines, 0);
}

static void reads_torchrun(void **state) {
  (void)state;
  torchrun("5", "1", "8", "4");
  setenv("GROUP_RANK", "1", 1);
  setenv("PSSHIM_COMM_TIMEOUT_S", "2.5", 1);
  ps_options_parse(NULL, 0); /* comm reads them from the options table */
  struct psc_ranks r;
  assert_int_equal(psc_ranks_read(&r), PSC_GROUP);
  assert_int_equal(r.rank, 5);
  assert_int_equal(r.local_rank, 1);
  assert_int_equal(r.world_size, 8);
  assert_int_equal(r.local_world_size, 4);
  assert_int_equal(r.node_rank, 1);
  assert_true(r.timeout_s == 2.5);
  assert_non_null(strstr(r.job_key, "10.0.0.1:29500"));
  assert_non_null(strstr(r.job_key, "node=1"));
}

static void job_key_tells_jobs_apart(void **state) {
  (void)state;
  torchrun("0", "0", "2", "2");
  struct psc_ranks a, b, c;
  assert_int_equal(psc_ranks_read(&a), PSC_GROUP);
  setenv("MASTER_PORT", "29501", 1);
  assert_int_equal(psc_ranks_read(&b), PSC_GROUP);
  setenv("TORCHELASTIC_RUN_ID", "job7", 1);
  assert_int_equal(psc_ranks_read(&c), PSC_GROUP);
  assert_string_not_equal(a.job_key, b.job_key);
  assert_string_not_equal(b.job_key, c.job_key);
  assert_non_null(strstr(c.job_key, "run=job7"));
  /* The run id alone is enough to name the meeting place. */
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  assert_int_equal(psc_ranks_read(&c), PSC_GROUP);
}

static void alone_on_its_node(void **state) {
  (void)state;
  torchrun("3", "0", "4", "1"); /* four nodes of one GPU: nothing to share on a node */
  struct psc_ranks r;
  assert_int_equal(psc_ranks_read(&r), PSC_ALONE);
  assert_int_equal(lines, 0);
}

static void without_local_world_size_one_node(void **state) {
  (void)state;
  torchrun("2", "2", "4", "4");
  unsetenv("LOCAL_WORLD_SIZE");
  struct psc_ranks r;
  assert_int_equal(psc_ranks_read(&r), PSC_GROUP);
  assert_int_equal(r.local_world_size, 4);
  setenv("LOCAL_RANK", "1", 1);
  assert_int_equal(psc_ranks_read(&r), PSC_BAD);
  assert_string_equal(last_line, "LOCAL_WORLD_SIZE is unset and LOCAL_RANK=1 differs from RANK=2: "
                                 "set LOCAL_WORLD_SIZE to the number of ranks on this node");
}

/* Each bad value: one line, naming the variable. */
static void bad_values_name_the_variable(void **state) {
  (void)state;
  static const struct {
    const char *var, *value, *line;
  } cases[] = {
      {"WORLD_SIZE", "four", "WORLD_SIZE=four is not a world size: expected an integer from 1 to 1048576"},
      {"RANK", "4", "RANK=4 is not a rank: expected an integer from 0 to 3"},
      {"RANK", "-1", "RANK=-1 is not a rank: expected an integer from 0 to 3"},
      {"LOCAL_RANK", "2x", "LOCAL_RANK=2x is not a local rank: expected an integer from 0 to 1"},
      {"LOCAL_WORLD_SIZE", "8", "LOCAL_WORLD_SIZE=8 is not a local world size: expected an integer from 1 to 4"},
      {"GROUP_RANK", "", "GROUP_RANK= is not a node rank: expected an integer from 0 to 1048576"},
      {"MASTER_PORT", "70000", "MASTER_PORT=70000 is not a port: expected an integer from 1 to 65535"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    setup(NULL);
    torchrun("1", "1", "4", "2");
    setenv(cases[i].var, cases[i].value, 1);
    struct psc_ranks r;
    assert_int_equal(psc_ranks_read(&r), PSC_BAD);
    assert_int_equal(lines, 1);
    assert_string_equal(last_line, cases[i].line);
  }
  setup(NULL);
  torchrun("1", "1", "4", "2");
  unsetenv("RANK");
  struct psc_ranks r;
  assert_int_equal(psc_ranks_read(&r), PSC_BAD);
  assert_string_equal(last_line, "WORLD_SIZE=4 but RANK is unset");
  setup(NULL);
  torchrun("1", "1", "4", "2");
  unsetenv("MASTER_ADDR");
  assert_int_equal(psc_ranks_read(&r), PSC_BAD);
  assert_string_equal(last_line, "WORLD_SIZE=4 but neither TORCHELASTIC_RUN_ID nor MASTER_ADDR "
                                 "and MASTER_PORT are set: psshim's ranks cannot name their "
                                 "meeting place");
}

static void shard_geometry(void **state) {
  (void)state;
  uint64_t mib = 1 << 20;
  assert_true(psc_shard_check(64 * mib, 4, 0));
  struct psc_shard s = psc_shard_of(64 * mib, 4, 3);
  assert_int_equal(s.offset, 48 * mib);
  assert_int_equal(s.len, 16 * mib);
  for (int r = 0; r < 8; r++) {
    s = psc_shard_of(64 * mib, 8, r);
    assert_int_equal(s.offset, (uint64_t)r * 8 * mib);
    assert_int_equal(s.len, 8 * mib);
  }
  assert_true(psc_shard_check(6 * mib, 3, 2 * mib));
  assert_int_equal(lines, 0);
  assert_false(psc_shard_check(64 * mib, 3, 2 * mib));
  assert_string_equal(last_line, "PSSHIM_CHUNK_SIZE=64M does not split into 3 shards of a "
                                 "multiple of 2M (LOCAL_WORLD_SIZE=3): use a multiple of 6M");
  assert_false(psc_shard_check(1000, 4, 0));
  assert_string_equal(last_line, "PSSHIM_CHUNK_SIZE=1000 does not split into 4 shards of a "
                                 "multiple of 256 (LOCAL_WORLD_SIZE=4): use a multiple of 1K");
  assert_false(psc_shard_check(0, 2, 0));
}

static void shardable_chunk_size(void **state) {
  (void)state;
  const uint64_t M = 1ull << 20;
  assert_int_equal(psc_shardable_chunk_size(4 * M, 2 * M), 4 * M); /* alone */
  setenv("WORLD_SIZE", "2", 1);
  assert_int_equal(psc_shardable_chunk_size(4 * M, 2 * M), 4 * M);
  setenv("WORLD_SIZE", "3", 1);
  assert_int_equal(psc_shardable_chunk_size(4 * M, 2 * M), 6 * M);
  setenv("WORLD_SIZE", "16", 1); /* the node is LOCAL_WORLD_SIZE when set */
  setenv("LOCAL_WORLD_SIZE", "8", 1);
  assert_int_equal(psc_shardable_chunk_size(4 * M, 2 * M), 16 * M);
  setenv("LOCAL_WORLD_SIZE", "4", 1);
  assert_int_equal(psc_shardable_chunk_size(4 * M, 2 * M), 8 * M);
  setenv("LOCAL_WORLD_SIZE", "lots", 1); /* unreadable: WORLD_SIZE, and no line (joining says it) */
  setenv("WORLD_SIZE", "x", 1);
  assert_int_equal(psc_shardable_chunk_size(4 * M, 2 * M), 4 * M);
  assert_int_equal(lines, 0);
}

static void config_agreement(void **state) {
  (void)state;
  uint64_t mib = 1 << 20;
  struct psc_config c[4];
  for (int i = 0; i < 4; i++)
    c[i] = (struct psc_config){64 * mib, 24 * 1024 * mib, 100 * 1024 * mib, "auto"};
  char line[256] = "";
  assert_true(psc_check_config(c, 4, line, sizeof line));
  c[1].chunk_size = 32 * mib;
  assert_false(psc_check_config(c, 4, line, sizeof line));
  assert_string_equal(line, "rank 1 has PSSHIM_CHUNK_SIZE=32M but rank 0 has 64M");
  c[1].chunk_size = 64 * mib;
  c[3].gpu_budget = 16 * 1024 * mib;
  c[2].host_budget = 100 * 1024 * mib + 1;
  assert_false(psc_check_config(c, 4, line, sizeof line));
  assert_string_equal(line, "rank 2 has PSSHIM_HOST_BUDGET=107374182401 but rank 0 has 100G");
  c[2].host_budget = 100 * 1024 * mib;
  assert_false(psc_check_config(c, 4, line, sizeof line));
  assert_string_equal(line, "rank 3 has PSSHIM_GPU_BUDGET=16G but rank 0 has 24G");
  c[3].gpu_budget = 24 * 1024 * mib;
  strcpy(c[2].policy, "static");
  assert_false(psc_check_config(c, 4, line, sizeof line));
  assert_string_equal(line, "rank 2 has PSSHIM_POLICY=static but rank 0 has auto");
}

/* Alone, the node-wide calls are free no-ops. */
static void alone_calls_are_no_ops(void **state) {
  (void)state;
  struct psc_config cfg = {64 << 20, 0, 1 << 20, "auto"};
  assert_int_equal(psc_node_join(&cfg, 0), PSC_ALONE);
  assert_int_equal(psc_rank(), 0);
  assert_int_equal(psc_nranks(), 1);
  assert_true(psc_barrier());
  assert_true(psc_check_alloc_hash(42));
  assert_true(psc_host_reserve(1ull << 40)); /* the allocator's own budget is the limit */
  assert_int_equal(psc_host_reserved(), 0);
  psc_host_release(1ull << 40);
  psc_node_leave();
  assert_int_equal(lines, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(alone_without_world_size, setup),
      cmocka_unit_test_setup(reads_torchrun, setup),
      cmocka_unit_test_setup(job_key_tells_jobs_apart, setup),
      cmocka_unit_test_setup(alone_on_its_node, setup),
      cmocka_unit_test_setup(without_local_world_size_one_node, setup),
      cmocka_unit_test_setup(bad_values_name_the_variable, setup),
      cmocka_unit_test_setup(shard_geometry, setup),
      cmocka_unit_test_setup(shardable_chunk_size, setup),
      cmocka_unit_test_setup(config_agreement, setup),
      cmocka_unit_test_setup(alone_calls_are_no_ops, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
