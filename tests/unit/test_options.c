/* Every PSSHIM_* variable: a bad value is refused with one line naming the variable and
 * what it accepts; good values parse to what they say. */
#include "core/core.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

static const char *const all_vars[] = {
    "PSSHIM_GPU_BUDGET", "PSSHIM_GPU_RESERVE", "PSSHIM_HOST_BUDGET", "PSSHIM_CHUNK_SIZE",
    "PSSHIM_POLICY",     "PSSHIM_LOG",         "PSSHIM_STATS",       "PSSHIM_TRACE",
    "PSSHIM_SAMPLE_MS",  "PSSHIM_CUPTI",       "PSSHIM_TORCH_ALLOC", "PSSHIM_DISABLE",
    "PSSHIM_LIBCUDA",    "PSSHIM_NCCL",        "PSSHIM_COMM_TIMEOUT_S",
};

static int clear_env(void **state)
{
  (void)state;
  for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++)
    unsetenv(all_vars[i]);
  return 0;
}

static void expect_refused(const char *var, const char *value)
{
  char err[512] = "";
  setenv(var, value, 1);
  bool ok = ps_options_parse(err, sizeof err);
  unsetenv(var);
  if (ok)
    fail_msg("%s=%s was accepted", var, value);
  if (!strstr(err, var) || !strstr(err, "accepts"))
    fail_msg("message for %s=%s does not name the variable and what it accepts: %s", var, value, err);
}

static void test_bad_values_refused(void **state)
{
  (void)state;
  const char *bad[][2] = {
      {"PSSHIM_GPU_BUDGET", "lots"}, {"PSSHIM_GPU_BUDGET", "-4G"}, {"PSSHIM_GPU_BUDGET", "0"},
      {"PSSHIM_GPU_BUDGET", "150%"}, {"PSSHIM_GPU_BUDGET", "12Q"},
      {"PSSHIM_GPU_RESERVE", "x"},   {"PSSHIM_GPU_RESERVE", "0"},
      {"PSSHIM_HOST_BUDGET", "1e400"}, {"PSSHIM_HOST_BUDGET", "0%"}, {"PSSHIM_HOST_BUDGET", ""},
      {"PSSHIM_CHUNK_SIZE", "0"},    {"PSSHIM_CHUNK_SIZE", "3M"},  {"PSSHIM_CHUNK_SIZE", "64M "},
      {"PSSHIM_CHUNK_SIZE", "50%"},  {"PSSHIM_CHUNK_SIZE", "1.5K"},
      {"PSSHIM_POLICY", "fastest"},  {"PSSHIM_POLICY", ""},
      {"PSSHIM_LOG", "loud"},        {"PSSHIM_STATS", ""},         {"PSSHIM_TRACE", ""},
      {"PSSHIM_SAMPLE_MS", "0"},     {"PSSHIM_SAMPLE_MS", "10ms"}, {"PSSHIM_SAMPLE_MS", "-1"},
      {"PSSHIM_CUPTI", ""},          {"PSSHIM_TORCH_ALLOC", "native"}, {"PSSHIM_DISABLE", "yes"},
      {"PSSHIM_LIBCUDA", ""},        {"PSSHIM_NCCL", ""},
      {"PSSHIM_COMM_TIMEOUT_S", "0"}, {"PSSHIM_COMM_TIMEOUT_S", "soon"}, {"PSSHIM_COMM_TIMEOUT_S", "2e6"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    expect_refused(bad[i][0], bad[i][1]);
}

static void test_defaults(void **state)
{
  (void)state;
  char err[256];
  assert_true(ps_options_parse(err, sizeof err));
  assert_int_equal(ps_options.chunk_size, 0); /* the allocator picks */
  assert_int_equal(ps_options.gpu_budget, 0);
  assert_int_equal(ps_options.policy, PS_POLICY_AUTO);
  assert_int_equal(ps_options.log_level, PS_LOG_ERROR);
  assert_int_equal(ps_options.sample_ms, 10);
  assert_false(ps_options.stats);
  assert_false(ps_options.keep_torch_allocator);
}

static void test_good_values(void **state)
{
  (void)state;
  char err[256];
  setenv("PSSHIM_GPU_BUDGET", "24G", 1);
  setenv("PSSHIM_HOST_BUDGET", "50%", 1);
  setenv("PSSHIM_CHUNK_SIZE", "32MiB", 1);
  setenv("PSSHIM_POLICY", "static", 1);
  setenv("PSSHIM_STATS", "/tmp/s.json", 1);
  setenv("PSSHIM_TORCH_ALLOC", "keep", 1);
  assert_true(ps_options_parse(err, sizeof err));
  assert_int_equal(ps_options.gpu_budget, 24ull << 30);
  assert_int_equal(ps_options.host_budget, 0);
  assert_true(ps_options.host_budget_frac > 0.499 && ps_options.host_budget_frac < 0.501);
  assert_int_equal(ps_options.chunk_size, 32ull << 20);
  assert_int_equal(ps_options.policy, PS_POLICY_STATIC);
  assert_true(ps_options.stats);
  assert_string_equal(ps_options.stats_path, "/tmp/s.json");
  assert_true(ps_options.keep_torch_allocator);
  clear_env(NULL);
}

static void test_parse_size(void **state)
{
  (void)state;
  uint64_t b;
  double pct;
  assert_true(ps_parse_size("1.5G", &b, NULL));
  assert_int_equal(b, 3ull << 29);
  assert_true(ps_parse_size("512", &b, NULL));
  assert_int_equal(b, 512);
  assert_true(ps_parse_size("2T", &b, NULL));
  assert_int_equal(b, 2ull << 40);
  assert_true(ps_parse_size("25%", &b, &pct));
  assert_true(pct > 0.2499 && pct < 0.2501);
  assert_false(ps_parse_size("25%", &b, NULL));
  assert_false(ps_parse_size("G", &b, NULL));
  assert_false(ps_parse_size("0.5", &b, NULL)); /* half a byte */
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_defaults, clear_env),
      cmocka_unit_test_setup(test_bad_values_refused, clear_env),
      cmocka_unit_test_setup(test_good_values, clear_env),
      cmocka_unit_test(test_parse_size),
  };
  return cmocka_run_group_tests_name("options", tests, NULL, NULL);
}
