/* policy: the offline simulator against an exhaustive optimum, and the prefetch plan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "policy/policy.h"

uint64_t tp_rand(uint64_t *state);             /* test_policy_common.c */
psp_schedule *tp_write_then_read(uint64_t a, uint64_t b);
uint32_t tp_below(uint64_t *state, uint32_t n);

#define MIB (1ull << 20)

/* ---- exhaustive optimum for uniform chunks: fewest page-ins over all eviction choices ---- */

enum { MAX_T = 64, MAX_CHUNKS = 8 };

typedef struct brute {
  const psp_schedule *s;
  uint32_t slots;  /* chunks that fit */
  uint64_t end;    /* moments to replay */
  int memo[MAX_T][1 << MAX_CHUNKS];
} brute;

static int best_from(brute *b, uint64_t t, uint32_t mask);

/* Makes the uses of moment t from index i on resident, in order; then the next moment. */
static int serve(brute *b, uint64_t t, size_t i, uint32_t mask)
{
  const psp_use *u;
  size_t n = psp_schedule_uses(b->s, t, &u);
  if (i == n) return best_from(b, t + 1, mask);
  uint32_t bit = 1u << u[i].chunk;
  if (mask & bit) return serve(b, t, i + 1, mask);
  if ((uint32_t)__builtin_popcount(mask) < b->slots) return 1 + serve(b, t, i + 1, mask | bit);
  uint32_t now = 0;  /* this moment's chunks may not go */
  for (size_t k = 0; k < n; k++) now |= 1u << u[k].chunk;
  int best = -1;
  for (uint32_t v = 0; v < MAX_CHUNKS; v++) {
    if (!(mask & (1u << v)) || (now & (1u << v))) continue;
    int cost = 1 + serve(b, t, i + 1, (mask & ~(1u << v)) | bit);
    if (best < 0 || cost < best) best = cost;
  }
  assert_true(best >= 0);  /* moments never need more chunks than fit */
  return best;
}

static int best_from(brute *b, uint64_t t, uint32_t mask)
{
  if (t == b->end) return 0;
  if (b->memo[t][mask] < 0) b->memo[t][mask] = serve(b, t, 0, mask);
  return b->memo[t][mask];
}

static void test_opt_is_optimal(void **state)
{
  (void)state;
  uint64_t rng = 3;
  brute *b = malloc(sizeof *b);
  for (int round = 0; round < 400; round++) {
    uint32_t chunks = 4 + tp_below(&rng, 4), moments = 10 + tp_below(&rng, 5);
    uint32_t slots = 1 + tp_below(&rng, 4), iterations = 1 + tp_below(&rng, 3);
    psp_schedule *s = psp_schedule_new();
    for (uint32_t c = 0; c < chunks; c++) psp_schedule_chunk(s, c, MIB);
    for (uint32_t t = 0; t < moments; t++) {
      psp_schedule_moment(s, 0);
      uint32_t max_uses = slots < 3 ? slots : 3;
      for (uint32_t k = 1 + tp_below(&rng, max_uses); k > 0; k--)
        psp_schedule_touch(s, tp_below(&rng, chunks), tp_below(&rng, 2));
    }
    assert_int_equal(psp_schedule_seal(s), 0);

    psp_sim opt, lru;
    assert_int_equal(psp_simulate(s, slots * MIB, PSP_POLICY_OPT, iterations, &opt), 0);
    assert_int_equal(psp_simulate(s, slots * MIB, PSP_POLICY_LRU, iterations, &lru), 0);
    memset(b->memo, -1, sizeof b->memo);
    b->s = s;
    b->slots = slots;
    b->end = (uint64_t)iterations * moments;
    int optimum = best_from(b, 0, 0);

    assert_int_equal(opt.page_ins, optimum);
    assert_true(lru.page_ins >= opt.page_ins);
    assert_int_equal(opt.bytes_in, opt.page_ins * MIB);
    assert_int_equal(opt.in_place_moments, 0);
    /* every page-in but those still resident at the end was evicted one way or the other */
    assert_true(opt.page_outs + opt.drops <= opt.page_ins);
    assert_true(opt.page_ins - opt.page_outs - opt.drops <= slots);
    psp_schedule_free(s);
  }
  free(b);
}

/* ---- simulator bookkeeping ---- */

static void test_write_back_only_dirty(void **state)
{
  (void)state;
  /* A written at 0, B read at 1, one chunk fits: every moment misses */
  psp_schedule *s = tp_write_then_read(3 * MIB, 2 * MIB);
  assert_non_null(s);

  psp_sim r;
  assert_int_equal(psp_simulate(s, 4 * MIB, PSP_POLICY_OPT, 3, &r), 0);
  assert_int_equal(r.page_ins, 6);
  assert_int_equal(r.bytes_in, 3 * (3 + 2) * MIB);
  assert_int_equal(r.page_outs, 3);  /* A, written, each time B needs its frame */
  assert_int_equal(r.bytes_out, 3 * 3 * MIB);
  assert_int_equal(r.drops, 2);      /* B, clean, dropped for A */
  assert_int_equal(r.in_place_moments, 0);

  /* both fit: two compulsory page-ins, nothing else */
  assert_int_equal(psp_simulate(s, 5 * MIB, PSP_POLICY_LRU, 3, &r), 0);
  assert_int_equal(r.page_ins, 2);
  assert_int_equal(r.page_outs + r.drops, 0);
  psp_schedule_free(s);
}

static void test_static_and_in_place(void **state)
{
  (void)state;
  /* A at 0, B at 1 (non-model 1 MiB there), C (larger than any room) at 2 */
  psp_schedule *s = psp_schedule_new();
  psp_schedule_chunk(s, 0, 2 * MIB);
  psp_schedule_chunk(s, 1, 2 * MIB);
  psp_schedule_chunk(s, 2, 8 * MIB);
  for (uint32_t c = 0; c < 3; c++) {
    psp_schedule_moment(s, c == 1 ? MIB : 0);
    psp_schedule_touch(s, c, false);
  }
  assert_int_equal(psp_schedule_seal(s), 0);

  psp_sim r;
  /* STATIC keeps the peak non-model 1 MiB aside: A takes a frame, B and C never do */
  assert_int_equal(psp_simulate(s, 4 * MIB, PSP_POLICY_STATIC, 2, &r), 0);
  assert_int_equal(r.page_ins, 1);
  assert_int_equal(r.page_outs + r.drops, 0);
  assert_int_equal(r.in_place_moments, 4);
  /* demand paging: B fits beside the non-model MiB only after A goes (A in, B in, A back
   * in, then the non-model MiB pushes A out again at B's turn); C always in place */
  assert_int_equal(psp_simulate(s, 4 * MIB, PSP_POLICY_OPT, 2, &r), 0);
  assert_int_equal(r.page_ins, 3);
  assert_int_equal(r.drops, 2);
  assert_int_equal(r.in_place_moments, 2);
  /* one MiB more: both fit beside the non-model MiB and stay */
  assert_int_equal(psp_simulate(s, 5 * MIB, PSP_POLICY_OPT, 2, &r), 0);
  assert_int_equal(r.page_ins, 2);
  assert_int_equal(r.page_outs + r.drops, 0);
  assert_int_equal(r.in_place_moments, 2);
  psp_schedule_free(s);
}

/* ---- prefetch plan ---- */

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_opt_is_optimal),     cmocka_unit_test(test_write_back_only_dirty),
      cmocka_unit_test(test_static_and_in_place),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
