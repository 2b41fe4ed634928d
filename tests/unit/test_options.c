/* Every PSSHIM_* variable: a bad value is refused with one line naming the variable and
 * what it accepts; good values parse to what they say; and every option of the table, by
 * its kind, at the edges of what it accepts: the smallest and largest accepted value and
 * the first refused one past each. */
#include "core/core.h"
/* The table itself, so that each option it holds (a new one too) gets its edge cases: the
 * test defines everything options.c defines, and the linker takes none of it from core. */
#include "core/options.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <float.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define NOPTIONS (sizeof option_table / sizeof option_table[0])

static int clear_env(void **state)
{
  (void)state;
  for (size_t i = 0; i < NOPTIONS; i++)
    unsetenv(option_table[i].name);
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

/* ---- the edges of every option, from the table ---- */

/* Sizes are whole bytes up to 18e18 (ps_parse_size); the first double above it is refused. */
#define SIZE_LARGEST 18000000000000000000ull
#define SIZE_PAST 18000000000000002048ull

/* Parses with `text` for option o alone; true if accepted. A refusal must name the option
 * and what it accepts. */
static bool parse_alone(const struct option_def *o, const char *text)
{
  char err[512] = "";
  clear_env(NULL);
  setenv(o->name, text, 1);
  bool ok = ps_options_parse(err, sizeof err);
  if (!ok && (!strstr(err, o->name) || !strstr(err, o->accepts)))
    fail_msg("the message for %s=%s does not name it and what it accepts: %s", o->name, text, err);
  return ok;
}

static void refused(const struct option_def *o, const char *text)
{
  if (parse_alone(o, text))
    fail_msg("%s=%s was accepted (%s accepts %s)", o->name, text, o->name, o->accepts);
}

static void accepted(const struct option_def *o, const char *text)
{
  if (!parse_alone(o, text))
    fail_msg("%s=%s was refused (%s accepts %s)", o->name, text, o->name, o->accepts);
}

static void size_is(const struct option_def *o, uint64_t bytes)
{
  char text[32];
  snprintf(text, sizeof text, "%" PRIu64, bytes);
  accepted(o, text);
  if (*(uint64_t *)o->value != bytes)
    fail_msg("%s=%s parsed to %" PRIu64, o->name, text, *(uint64_t *)o->value);
  if (o->pct && *o->pct != 0)
    fail_msg("%s=%s left a percentage of %g", o->name, text, *o->pct);
}

static void size_refused(const struct option_def *o, uint64_t bytes)
{
  char text[32];
  snprintf(text, sizeof text, "%" PRIu64, bytes);
  refused(o, text);
}

/* A real number (percent or seconds) at its exact double: "%.17g" reads back unchanged. */
static void real_is(const struct option_def *o, double v, const char *suffix, const double *stored, double want)
{
  char text[64];
  snprintf(text, sizeof text, "%.17g%s", v, suffix);
  accepted(o, text);
  if (*stored != want)
    fail_msg("%s=%s parsed to %.17g, not %.17g", o->name, text, *stored, want);
}

static void real_refused(const struct option_def *o, double v, const char *suffix)
{
  char text[64];
  snprintf(text, sizeof text, "%.17g%s", v, suffix);
  refused(o, text);
}

/* Sizes: 1 byte (or the granularity the option states, "a multiple of 2M") up to the
 * largest such size; 0, one granule less, and one granule past the largest refused. */
static void size_edges(const struct option_def *o)
{
  uint64_t unit = 1;
  const char *mult = strstr(o->accepts, "multiple of ");
  if (mult) {
    uint64_t mib = strtoull(mult + strlen("multiple of "), NULL, 10);
    assert_true(mib > 0);
    unit = mib << 20;
    size_refused(o, unit - 1);
    size_refused(o, unit + unit / 2);
  }
  uint64_t largest = SIZE_LARGEST / unit * unit;
  size_refused(o, 0);
  size_is(o, unit);
  size_is(o, largest);
  size_refused(o, unit == 1 ? SIZE_PAST : largest + unit);
}

/* Percentages: more than 0, at most 100 (100 is all of it: accepted, stored as 1). */
static void pct_edges(const struct option_def *o)
{
  refused(o, "0%");
  refused(o, "-0%");
  real_is(o, DBL_MIN, "%", o->pct, DBL_MIN / 100.0);
  real_is(o, 100, "%", o->pct, 1.0);
  real_refused(o, nextafter(100, 200), "%");
  assert_int_equal(*(uint64_t *)o->value, 0);
}

/* Whole numbers: the range the option states ("from 1 to 60000"), both ends and one past. */
static void uint_edges(const struct option_def *o)
{
  unsigned lo = 0, hi = 0;
  const char *from = strstr(o->accepts, "from ");
  if (!from || sscanf(from, "from %u to %u", &lo, &hi) != 2)
    fail_msg("%s accepts \"%s\": no \"from A to B\" range to test", o->name, o->accepts);
  char text[32];
  for (unsigned v = lo; ; v = hi) {
    snprintf(text, sizeof text, "%u", v);
    accepted(o, text);
    assert_int_equal(*(unsigned *)o->value, v);
    if (v == hi)
      break;
  }
  snprintf(text, sizeof text, "%u", lo - 1);
  refused(o, text);
  snprintf(text, sizeof text, "%u", hi + 1);
  refused(o, text);
}

/* Seconds: "more than A and at most B". */
static void seconds_edges(const struct option_def *o)
{
  double lo = 0, hi = 0;
  const char *more = strstr(o->accepts, "more than ");
  if (!more || sscanf(more, "more than %lf and at most %lf", &lo, &hi) != 2)
    fail_msg("%s accepts \"%s\": no \"more than A and at most B\" range to test", o->name, o->accepts);
  double *stored = o->value, above_lo = lo == 0 ? DBL_MIN : nextafter(lo, hi);
  real_refused(o, lo, "");
  real_is(o, above_lo, "", stored, above_lo);
  real_is(o, hi, "", stored, hi);
  real_refused(o, nextafter(hi, 2 * hi), "");
}

/* Choices: each one exactly, stored as its index; one character more or less refused. */
static void choice_edges(const struct option_def *o)
{
  char text[64];
  refused(o, "");
  for (int i = 0; o->choices[i]; i++) {
    accepted(o, o->choices[i]);
    assert_int_equal(*(int *)o->value, i);
    snprintf(text, sizeof text, "%s ", o->choices[i]);
    refused(o, text);
    snprintf(text, sizeof text, "%s0", o->choices[i]);
    refused(o, text);
    size_t n = strlen(o->choices[i]);
    if (n > 1) {
      snprintf(text, sizeof text, "%.*s", (int)(n - 1), o->choices[i]);
      refused(o, text);
    }
  }
}

/* A file psshim writes: checked without writing it. One not there yet in a folder that
 * exists is accepted (and not made); "", a folder, and a file in a missing folder refused;
 * where the option also takes 0 and 1 (PSSHIM_STATS: no file, or stderr), those too. */
static void output_edges(const struct option_def *o)
{
  char dir[] = "/tmp/psshim-options-XXXXXX", path[64];
  assert_non_null(mkdtemp(dir));
  refused(o, "");
  snprintf(path, sizeof path, "%s/out", dir);
  accepted(o, path);
  assert_int_equal(access(path, F_OK), -1);
  refused(o, dir);
  snprintf(path, sizeof path, "%s/missing/out", dir);
  refused(o, path);
  assert_int_equal(rmdir(dir), 0);
  if (strncmp(o->accepts, "0, 1 ", 5) == 0) {
    accepted(o, "0");
    accepted(o, "1");
  }
}

static void test_every_option_at_its_edges(void **state)
{
  (void)state;
  for (size_t i = 0; i < NOPTIONS; i++) {
    const struct option_def *o = &option_table[i];
    if (o->def)
      accepted(o, o->def);
    switch (o->kind) { /* no default: a new kind does not build until it has edges here */
    case OPT_SIZE:
      size_edges(o);
      break;
    case OPT_SIZE_OR_PCT:
      size_edges(o);
      pct_edges(o);
      break;
    case OPT_CHOICE:
      choice_edges(o);
      break;
    case OPT_BOOL:
      accepted(o, "0");
      assert_false(*(bool *)o->value);
      accepted(o, "1");
      assert_true(*(bool *)o->value);
      refused(o, "");
      refused(o, "2");
      refused(o, "10");
      break;
    case OPT_PATH:
      refused(o, "");
      break;
    case OPT_OUTPUT:
      output_edges(o);
      break;
    case OPT_UINT:
      uint_edges(o);
      break;
    case OPT_SECONDS:
      seconds_edges(o);
      break;
    }
  }
  clear_env(NULL);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_defaults, clear_env),
      cmocka_unit_test_setup(test_bad_values_refused, clear_env),
      cmocka_unit_test_setup(test_good_values, clear_env),
      cmocka_unit_test(test_parse_size),
      cmocka_unit_test_setup(test_every_option_at_its_edges, clear_env),
  };
  return cmocka_run_group_tests_name("options", tests, NULL, NULL);
}
