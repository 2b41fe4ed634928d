/* policy: the schedule (building, next use, margin), victim choice and the cost model. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "policy/policy.h"

uint64_t tp_rand(uint64_t *state);             /* test_policy_common.c */
uint32_t tp_below(uint64_t *state, uint32_t n);

/* chunk 0: 100 B at moments 0, 1, 3; chunk 2: 200 B at moment 1 (touched twice, once
 * written); id 1 never declared. Period 4. */
static psp_schedule *small_schedule(void)
{
  psp_schedule *s = psp_schedule_new();
  assert_non_null(s);
  assert_int_equal(psp_schedule_chunk(s, 0, 100), 0);
  assert_int_equal(psp_schedule_chunk(s, 2, 200), 0);
  assert_int_equal(psp_schedule_moment(s, 10), 0);
  assert_int_equal(psp_schedule_touch(s, 0, false), 0);
  assert_int_equal(psp_schedule_moment(s, 50), 0);
  assert_int_equal(psp_schedule_touch(s, 2, false), 0);
  assert_int_equal(psp_schedule_touch(s, 0, false), 0);
  assert_int_equal(psp_schedule_touch(s, 2, true), 0);
  assert_int_equal(psp_schedule_moment(s, 5), 0);
  assert_int_equal(psp_schedule_moment(s, 20), 0);
  assert_int_equal(psp_schedule_touch(s, 0, true), 0);
  return s;
}

static void test_build(void **state)
{
  (void)state;
  psp_schedule *s = psp_schedule_new();
  errno = 0;
  assert_int_equal(psp_schedule_chunk(s, 3, 0), -1);  /* empty chunk */
  assert_int_equal(errno, EINVAL);
  assert_int_equal(psp_schedule_chunk(s, 3, 64), 0);
  errno = 0;
  assert_int_equal(psp_schedule_touch(s, 3, false), -1);  /* no moment open */
  assert_int_equal(errno, EINVAL);
  psp_schedule_free(s);

  s = small_schedule();
  errno = 0;
  assert_int_equal(psp_schedule_touch(s, 1, false), -1);  /* undeclared */
  assert_int_equal(errno, EINVAL);
  assert_int_equal(psp_schedule_touch(s, 7, false), -1);
  assert_int_equal(psp_schedule_seal(s), 0);
  assert_int_equal(psp_schedule_moment(s, 0), -1);  /* sealed */
  assert_int_equal(psp_schedule_touch(s, 0, false), -1);
  assert_int_equal(psp_schedule_seal(s), -1);

  assert_int_equal(psp_schedule_period(s), 4);
  assert_int_equal(psp_schedule_chunks(s), 3);
  assert_int_equal(psp_schedule_chunk_bytes(s, 2), 200);
  assert_int_equal(psp_schedule_chunk_bytes(s, 1), 0);
  assert_int_equal(psp_schedule_chunk_bytes(s, 9), 0);
  const psp_use *u;
  assert_int_equal(psp_schedule_uses(s, 5, &u), 2);  /* moment 1 of iteration 1 */
  assert_int_equal(u[0].chunk, 2);
  assert_true(u[0].written);  /* the repeated touch merged */
  assert_int_equal(u[1].chunk, 0);
  assert_false(u[1].written);
  assert_int_equal(psp_schedule_uses(s, 2, &u), 0);
  assert_int_equal(psp_schedule_nonmodel(s, 5), 50);
  bool written;
  assert_int_equal(psp_schedule_use_count(s, 0, &written), 3);
  assert_true(written);
  assert_int_equal(psp_schedule_use_count(s, 2, NULL), 1);
  assert_int_equal(psp_schedule_use_count(s, 1, &written), 0);
  assert_false(written);
  psp_schedule_free(s);
}

static void test_next_use_wraps(void **state)
{
  (void)state;
  psp_schedule *s = small_schedule();
  assert_int_equal(psp_schedule_seal(s), 0);
  assert_int_equal(psp_next_use(s, 0, 0), 1);
  assert_int_equal(psp_next_use(s, 0, 1), 3);
  assert_int_equal(psp_next_use(s, 0, 2), 3);
  assert_int_equal(psp_next_use(s, 0, 3), 4);  /* wraps: moment 0 of the next iteration */
  assert_int_equal(psp_next_use(s, 0, 7), 8);
  assert_int_equal(psp_next_use(s, 0, 8), 9);
  assert_int_equal(psp_next_use(s, 2, 0), 1);
  assert_int_equal(psp_next_use(s, 2, 1), 5);  /* its only use, one period later */
  assert_int_equal(psp_next_use(s, 2, 6), 9);
  assert_true(psp_next_use(s, 1, 0) == PSP_NEVER);
  assert_true(psp_next_use(s, 99, 0) == PSP_NEVER);
  assert_true(psp_next_use(s, 0, PSP_NEVER) == PSP_NEVER);
  psp_schedule_free(s);

  s = psp_schedule_new();  /* empty: nothing is ever used */
  assert_int_equal(psp_schedule_chunk(s, 0, 1), 0);
  assert_int_equal(psp_schedule_seal(s), 0);
  assert_true(psp_next_use(s, 0, 3) == PSP_NEVER);
  assert_int_equal(psp_schedule_margin(s, 0, 10), 0);
  psp_schedule_free(s);
}

static psp_schedule *random_schedule(uint64_t *rng, uint32_t chunks, uint32_t moments,
                                     uint32_t max_uses)
{
  psp_schedule *s = psp_schedule_new();
  for (uint32_t c = 0; c < chunks; c++)
    assert_int_equal(psp_schedule_chunk(s, c, 1 + tp_below(rng, 1000)), 0);
  for (uint32_t t = 0; t < moments; t++) {
    assert_int_equal(psp_schedule_moment(s, tp_below(rng, 1u << 20)), 0);
    for (uint32_t k = tp_below(rng, max_uses + 1); k > 0; k--)
      assert_int_equal(psp_schedule_touch(s, tp_below(rng, chunks), tp_below(rng, 2)), 0);
  }
  assert_int_equal(psp_schedule_seal(s), 0);
  return s;
}

static bool used_at(const psp_schedule *s, uint32_t chunk, uint64_t m)
{
  const psp_use *u;
  size_t n = psp_schedule_uses(s, m, &u);
  for (size_t i = 0; i < n; i++)
    if (u[i].chunk == chunk) return true;
  return false;
}

static void test_next_use_brute(void **state)
{
  (void)state;
  uint64_t rng = 1;
  for (int round = 0; round < 200; round++) {
    uint32_t chunks = 1 + tp_below(&rng, 12), moments = 1 + tp_below(&rng, 40);
    psp_schedule *s = random_schedule(&rng, chunks, moments, 3);
    for (uint32_t c = 0; c < chunks + 1; c++)  /* one id past the last: never used */
      for (uint64_t m = 0; m < 3ull * moments; m++) {
        uint64_t want = PSP_NEVER;
        for (uint64_t k = m + 1; k <= m + moments; k++)
          if (used_at(s, c, k)) { want = k; break; }
        assert_true(psp_next_use(s, c, m) == want);
      }
    psp_schedule_free(s);
  }
}

static void test_margin_brute(void **state)
{
  (void)state;
  uint64_t rng = 2;
  for (int round = 0; round < 60; round++) {
    uint32_t moments = 1 + tp_below(&rng, 900);
    psp_schedule *s = random_schedule(&rng, 2, moments, 1);
    for (int q = 0; q < 200; q++) {
      uint64_t m = tp_below(&rng, 3 * moments);
      uint32_t window = tp_below(&rng, moments + 5);
      uint64_t want = 0;
      for (uint64_t k = m; k < m + window && k < m + moments; k++)
        if (psp_schedule_nonmodel(s, k) > want) want = psp_schedule_nonmodel(s, k);
      assert_int_equal(psp_schedule_margin(s, m, window), want);
    }
    psp_schedule_free(s);
  }
}

static void test_victim_opt(void **state)
{
  (void)state;
  /* moments: 0 {A}, 1 {B}, 2 {C}, 3 {A, D}; E declared, never used */
  enum { A, B, C, D, E };
  psp_schedule *s = psp_schedule_new();
  for (uint32_t c = A; c <= E; c++) psp_schedule_chunk(s, c, 10);
  uint32_t uses[][2] = {{A, UINT32_MAX}, {B, UINT32_MAX}, {C, UINT32_MAX}, {A, D}};
  for (int t = 0; t < 4; t++) {
    psp_schedule_moment(s, 0);
    for (int k = 0; k < 2; k++)
      if (uses[t][k] != UINT32_MAX) psp_schedule_touch(s, uses[t][k], false);
  }
  assert_int_equal(psp_schedule_seal(s), 0);

  psp_cand cands[] = {{.chunk = A, .bytes = 10}, {.chunk = B, .bytes = 10},
                      {.chunk = C, .bytes = 10}, {.chunk = D, .bytes = 10}};
  /* at 1 (B running): A next at 3, C at 2, D at 3 -> A or D, tie on next use: lower id */
  assert_int_equal(psp_victim_opt(s, 1, cands, 4), 0);
  cands[0].dirty = true;  /* now the clean one of the tie goes */
  assert_int_equal(psp_victim_opt(s, 1, cands, 4), 3);
  cands[0].dirty = false;
  cands[3].bytes = 20;  /* or the larger */
  assert_int_equal(psp_victim_opt(s, 1, cands, 4), 3);
  /* at 3 (A and D running): B next at 5, C at 6 -> C */
  assert_int_equal(psp_victim_opt(s, 3, cands, 4), 2);
  /* wraparound: at 2 (C running): A at 3, B at 5, D at 3 -> B */
  assert_int_equal(psp_victim_opt(s, 2, cands, 4), 1);
  /* a chunk the schedule never uses goes first */
  psp_cand with_e[] = {{.chunk = B, .bytes = 10}, {.chunk = E, .bytes = 1, .dirty = true}};
  assert_int_equal(psp_victim_opt(s, 0, with_e, 2), 1);
  /* only chunks in use now: nothing to evict */
  assert_int_equal(psp_victim_opt(s, 3, cands, 1), -1);
  assert_int_equal(psp_victim_opt(s, 3, NULL, 0), -1);
  psp_schedule_free(s);
}

static void test_victim_lru(void **state)
{
  (void)state;
  psp_cand cands[] = {{.chunk = 0, .bytes = 1, .last_use = 7},
                      {.chunk = 1, .bytes = 1, .last_use = 3},
                      {.chunk = 2, .bytes = 1, .last_use = 9},
                      {.chunk = 3, .bytes = 1, .last_use = 3, .dirty = true}};
  assert_int_equal(psp_victim_lru(9, cands, 4), 1);  /* oldest, the clean one of the tie */
  cands[1].last_use = 9;
  assert_int_equal(psp_victim_lru(9, cands, 4), 3);
  assert_int_equal(psp_victim_lru(9, cands + 1, 2), -1);  /* both in use at 9 */
}

static void test_sort_farthest(void **state)
{
  (void)state;
  psp_cand cands[] = {{.chunk = 0, .bytes = 1, .next_use = 50},
                      {.chunk = 1, .bytes = 1, .next_use = 90, .dirty = true},
                      {.chunk = 2, .bytes = 1, .next_use = 20},
                      {.chunk = 3, .bytes = 1, .next_use = 90}};
  psp_sort_farthest(cands, 4, 4);
  uint32_t want[] = {3, 1, 0, 2}; /* farthest first; of the tie, the clean one */
  for (int i = 0; i < 4; i++)
    assert_int_equal(cands[i].chunk, want[i]);
  psp_sort_farthest(cands, 0, 0);
  /* against brute force: a permutation, each entry as psp_victim_opt's order would take it */
  psp_cand r[16];
  for (unsigned seed = 1; seed < 300; seed++) {
    size_t n = seed % 16 + 1;
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
      r[i] = (psp_cand){.chunk = (uint32_t)i, .bytes = 1 + (seed + i) % 3, .dirty = (seed ^ i) & 1,
                        .next_use = (seed * 31 + i * 17) % 7};
      sum += r[i].chunk;
    }
    psp_cand whole[16];
    memcpy(whole, r, sizeof r);
    psp_sort_farthest(whole, n, n);
    uint64_t seen = 0;
    for (size_t i = 0; i < n; i++) {
      seen += whole[i].chunk;
      if (i) {
        assert_true(whole[i - 1].next_use >= whole[i].next_use);
        if (whole[i - 1].next_use == whole[i].next_use && whole[i - 1].dirty != whole[i].dirty)
          assert_false(whole[i - 1].dirty); /* clean first */
      }
    }
    assert_int_equal(seen, sum);
    /* the first k alone: the same prefix as the whole sort, the rest still a permutation */
    size_t k = seed % (n + 2);
    psp_sort_farthest(r, n, k);
    seen = 0;
    for (size_t i = 0; i < n; i++) {
      seen += r[i].chunk;
      if (i < k)
        assert_int_equal(r[i].chunk, whole[i].chunk);
    }
    assert_int_equal(seen, sum);
  }
}

/* Each inequality of evict.c one unit either side of its edge. */
static void test_evict_edges(void **state)
{
  (void)state;
  const uint64_t now = 500;
  /* LRU: used at now is pinned, used the moment before is not */
  psp_cand lru[] = {{.chunk = 0, .bytes = 1, .last_use = now}, {.chunk = 1, .bytes = 1, .last_use = now - 1}};
  assert_int_equal(psp_victim_lru(now, lru, 2), 1);
  assert_int_equal(psp_victim_lru(now, lru, 1), -1);
  /* OPT: needed at now is pinned, needed the moment after is not */
  psp_schedule *s = psp_schedule_new();
  psp_schedule_chunk(s, 0, 1);
  psp_schedule_chunk(s, 1, 1);
  psp_schedule_moment(s, 0);
  psp_schedule_touch(s, 0, false);
  psp_schedule_moment(s, 0);
  psp_schedule_touch(s, 1, false);
  assert_int_equal(psp_schedule_seal(s), 0);
  psp_cand opt[] = {{.chunk = 0, .bytes = 1}, {.chunk = 1, .bytes = 1}};
  assert_int_equal(psp_victim_opt(s, 0, opt, 2), 1);
  assert_int_equal(psp_victim_opt(s, 0, opt, 1), -1);
  assert_int_equal(psp_victim_opt(s, 1, opt, 1), 0);
  psp_schedule_free(s);
  /* the order: a later next use by one beats clean, larger and lower id together */
  psp_cand later = {.chunk = 9, .bytes = 1, .dirty = true, .next_use = 11}, sooner = {.chunk = 0, .bytes = 2, .next_use = 10};
  psp_cand both[2];
  both[0] = sooner, both[1] = later;
  psp_sort_farthest(both, 2, 2);
  assert_int_equal(both[0].chunk, 9);
  later.next_use = 10; /* a tie: the clean one, then the larger, then the lower id */
  both[0] = later, both[1] = sooner;
  psp_sort_farthest(both, 2, 2);
  assert_int_equal(both[0].chunk, 0);
  later.dirty = false, later.bytes = 3;
  both[0] = sooner, both[1] = later;
  psp_sort_farthest(both, 2, 2);
  assert_int_equal(both[0].chunk, 9);
  later.bytes = 2;
  both[0] = later, both[1] = sooner;
  psp_sort_farthest(both, 2, 2);
  assert_int_equal(both[0].chunk, 0);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_build),          cmocka_unit_test(test_next_use_wraps),
      cmocka_unit_test(test_next_use_brute), cmocka_unit_test(test_margin_brute),
      cmocka_unit_test(test_victim_opt),     cmocka_unit_test(test_victim_lru),
      cmocka_unit_test(test_sort_farthest),  cmocka_unit_test(test_evict_edges),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
