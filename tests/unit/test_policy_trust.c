/* policy: trusting a detected period as the iteration, from its boundaries' live bytes and
 * allocation counts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "policy/policy.h"

#define MIB (1ull << 20)
#define LIVE (3000 * MIB) /* a model's weights and optimizer state, held across steps */

static psp_trust fresh(void)
{
  psp_trust t;
  memset(&t, 0xa5, sizeof t); /* reset must not depend on what was there */
  psp_trust_reset(&t);
  return t;
}

static void test_steady_boundaries_trust(void **state)
{
  (void)state;
  psp_trust t = fresh();
  assert_false(t.trusted);
  assert_false(psp_trust_boundary(&t, LIVE, 100)); /* nothing to compare with yet */
  /* a step allocated its activations and freed them, keeping a few bytes (a logged loss) */
  assert_true(psp_trust_boundary(&t, LIVE + 512, 180));
  assert_true(t.trusted);
}

static void test_zeroed_is_reset(void **state)
{
  (void)state;
  psp_trust t = {0};
  assert_false(psp_trust_boundary(&t, 0, 0)); /* zero live bytes is a boundary, not "none" */
  assert_true(psp_trust_boundary(&t, 0, 1));
}

/* A layer's period: each boundary finds the activations of the layer before it still
 * live, megabytes more each time. */
static void test_growing_boundaries_do_not_trust(void **state)
{
  (void)state;
  psp_trust t = fresh();
  uint64_t live = LIVE, allocs = 0;
  for (int layer = 0; layer < 48; layer++) {
    assert_false(psp_trust_boundary(&t, live, allocs));
    live += 8 * MIB;
    allocs += 6;
  }
  /* and on the way back the backward pass frees them */
  for (int layer = 0; layer < 48; layer++) {
    assert_false(psp_trust_boundary(&t, live, allocs));
    live -= 8 * MIB;
    allocs += 3;
  }
}

/* Live bytes differing by less than the slack are the same; by the slack, not: both ways. */
static void test_slack_edge(void **state)
{
  (void)state;
  struct {
    uint64_t was, now;
    bool trusts;
  } cases[] = {
      {LIVE, LIVE + PSP_TRUST_SLACK - 1, true},  {LIVE, LIVE + PSP_TRUST_SLACK, false},
      {LIVE, LIVE - PSP_TRUST_SLACK + 1, true},  {LIVE, LIVE - PSP_TRUST_SLACK, false},
      {0, PSP_TRUST_SLACK - 1, true},            {PSP_TRUST_SLACK, 0, false},
      {UINT64_MAX - PSP_TRUST_SLACK, UINT64_MAX, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    assert_int_equal(psp_trust_steady(cases[i].was, 10, cases[i].now, 11), cases[i].trusts);
    psp_trust t = fresh();
    psp_trust_boundary(&t, cases[i].was, 10);
    assert_int_equal(psp_trust_boundary(&t, cases[i].now, 11), cases[i].trusts);
  }
  /* the pooled rule measures "unchanged" with the same slack */
  psp_trust t = fresh();
  psp_trust_boundary(&t, LIVE, 10);
  for (int i = 0; i < 2 * PSP_TRUST_POOLED; i++)
    assert_false(psp_trust_boundary(&t, i % 2 ? LIVE : LIVE + PSP_TRUST_SLACK, 10));
  t = fresh();
  psp_trust_boundary(&t, LIVE, 10);
  for (int i = 1; i < PSP_TRUST_POOLED; i++)
    assert_false(psp_trust_boundary(&t, i % 2 ? LIVE : LIVE + PSP_TRUST_SLACK - 1, 10));
  assert_true(psp_trust_boundary(&t, LIVE + PSP_TRUST_SLACK - 1, 10));
}

/* Same live bytes with nothing allocated between is no step by the steady rule: an
 * iteration allocates its activations. */
static void test_steady_needs_allocations(void **state)
{
  (void)state;
  assert_false(psp_trust_steady(LIVE, 10, LIVE, 10));
  assert_true(psp_trust_steady(LIVE, 10, LIVE, 11));
  assert_false(psp_trust_steady(LIVE, 11, LIVE, 10));
  psp_trust t = fresh();
  assert_false(psp_trust_boundary(&t, LIVE, 10));
  assert_false(psp_trust_boundary(&t, LIVE, 10));
}

/* The quiet boundaries of a pooled run short of the one that trusts it: none does. */
static void quiet_short_of_trust(psp_trust *t, uint64_t live, uint64_t allocs)
{
  for (int quiet = 1; quiet < PSP_TRUST_POOLED; quiet++)
    assert_false(psp_trust_boundary(t, live, allocs));
}

/* A pooling allocator's program allocates nothing psshim sees once warm: trusted at the
 * PSP_TRUST_POOLED-th quiet boundary after the first, not one before. */
static void test_pooled_trusts_after_exact_count(void **state)
{
  (void)state;
  psp_trust t = fresh();
  assert_false(psp_trust_boundary(&t, LIVE, 40));
  for (int quiet = 1; quiet < PSP_TRUST_POOLED; quiet++)
    assert_false(psp_trust_boundary(&t, LIVE + (uint64_t)quiet, 40)); /* a few bytes kept */
  assert_true(psp_trust_boundary(&t, LIVE, 40));
}

/* A boundary that changed the live bytes starts the count again from itself. */
static void test_pooled_count_restarts(void **state)
{
  (void)state;
  psp_trust t = fresh();
  psp_trust_boundary(&t, LIVE, 40);
  quiet_short_of_trust(&t, LIVE, 40);
  assert_false(psp_trust_boundary(&t, LIVE + 64 * MIB, 40)); /* freed nothing, grew: no step */
  quiet_short_of_trust(&t, LIVE + 64 * MIB, 40);
  assert_true(psp_trust_boundary(&t, LIVE + 64 * MIB, 40));
}

static void test_reset_forgets(void **state)
{
  (void)state;
  psp_trust t = fresh();
  psp_trust_boundary(&t, LIVE, 10);
  assert_true(psp_trust_boundary(&t, LIVE, 20));
  psp_trust_reset(&t);
  assert_false(t.trusted);
  /* the boundary before the reset is forgotten: this one only starts the comparison */
  assert_false(psp_trust_boundary(&t, LIVE, 30));
  assert_true(psp_trust_boundary(&t, LIVE, 40));

  /* the quiet count is forgotten too, whether the first boundary after the reset comes or
   * was passed already */
  for (int passed = 0; passed < 2; passed++) {
    t = fresh();
    psp_trust_boundary(&t, LIVE, 10);
    quiet_short_of_trust(&t, LIVE, 10);
    psp_trust_reset(&t);
    if (passed)
      psp_trust_passed(&t, LIVE, 10);
    else
      assert_false(psp_trust_boundary(&t, LIVE, 10));
    quiet_short_of_trust(&t, LIVE, 10);
    assert_true(psp_trust_boundary(&t, LIVE, 10));
  }
}

/* Once trusted, boundaries change nothing: the period stays trusted until reset. */
static void test_trusted_stays(void **state)
{
  (void)state;
  psp_trust t = fresh();
  psp_trust_boundary(&t, LIVE, 10);
  assert_true(psp_trust_boundary(&t, LIVE, 20));
  psp_trust before = t;
  assert_true(psp_trust_boundary(&t, 5 * LIVE, 20));
  assert_true(psp_trust_boundary(&t, 0, 0));
  assert_memory_equal(&t, &before, sizeof t);
}

/* A boundary passed before the period was adopted stands for its last one, unjudged. */
static void test_passed_boundary(void **state)
{
  (void)state;
  psp_trust t = fresh();
  psp_trust_passed(&t, LIVE, 10);
  assert_false(t.trusted);
  assert_true(psp_trust_boundary(&t, LIVE + 100, 15));

  t = fresh();
  psp_trust_passed(&t, LIVE, 10);
  assert_false(psp_trust_boundary(&t, LIVE + 8 * MIB, 15));

  /* it counts as the first of a pooled run, not as a quiet boundary */
  t = fresh();
  psp_trust_passed(&t, LIVE, 10);
  quiet_short_of_trust(&t, LIVE, 10);
  assert_true(psp_trust_boundary(&t, LIVE, 10));
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_steady_boundaries_trust),
      cmocka_unit_test(test_zeroed_is_reset),
      cmocka_unit_test(test_growing_boundaries_do_not_trust),
      cmocka_unit_test(test_slack_edge),
      cmocka_unit_test(test_steady_needs_allocations),
      cmocka_unit_test(test_pooled_trusts_after_exact_count),
      cmocka_unit_test(test_pooled_count_restarts),
      cmocka_unit_test(test_reset_forgets),
      cmocka_unit_test(test_trusted_stays),
      cmocka_unit_test(test_passed_boundary),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
