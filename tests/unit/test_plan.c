/* policy: the plan for a repeating iteration, against an exhaustive search, and its
 * write-backs, timing, cycle and fresh (young) data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "policy/policy.h"

uint64_t tp_rand(uint64_t *state); /* test_policy_common.c */
psp_schedule *tp_write_then_read(uint64_t a, uint64_t b);
uint32_t tp_below(uint64_t *state, uint32_t n);

#define MIB (1ull << 20)

static const psp_costs FAST = {.h2d = 50e9, .d2h = 50e9, .both = 90e9, .in_place = 25e9, .default_ns = 1000};

/* Whether the chunk's data at moment t is read again before it dies: its next use from t
 * on is not fresh. */
static bool live_at(const psp_schedule *s, uint32_t chunk, uint32_t t)
{
  uint32_t P = psp_schedule_period(s);
  for (uint32_t k = 0; k < P; k++) {
    const psp_use *u;
    for (size_t i = 0, n = psp_schedule_uses(s, t + k, &u); i < n; i++)
      if (u[i].chunk == chunk) return !u[i].fresh;
  }
  return false;
}

/* Plays the plan's moves over two iterations from its start placement: each move legal (a
 * fetch of a chunk in host memory, an eviction of one on the GPU), the frames within the
 * budget less the moment's non-model bytes, each use on the GPU unless the moment is
 * counted in place, the bytes as the plan sums them, the end where it started, and in the
 * second (the dirt at its start known) a copy out exactly for data written since it came
 * in and read again. */
static void check_plan(const psp_schedule *s, uint64_t budget, const psp_plan *pl)
{
  uint32_t n = psp_schedule_chunks(s), P = psp_schedule_period(s);
  bool *on = calloc(n + 1, sizeof *on), *dirty = calloc(n + 1, sizeof *dirty);
  uint64_t used = 0;
  for (size_t i = 0; i < pl->n_start; i++) {
    on[pl->start[i]] = true;
    used += psp_schedule_chunk_bytes(s, pl->start[i]);
  }
  for (int lap = 0; lap < 2; lap++) {
    uint64_t in = 0, out = 0;
    uint32_t host = 0;
    size_t k = 0;
    for (uint32_t t = 0; t < P; t++) {
      for (; k < pl->n_moves && pl->moves[k].at == t; k++) {
        const psp_move *m = &pl->moves[k];
        assert_int_equal(on[m->chunk], m->dir == PSP_TO_HOST);
        on[m->chunk] = m->dir == PSP_TO_GPU;
        uint64_t b = psp_schedule_chunk_bytes(s, m->chunk);
        if (m->dir == PSP_TO_GPU) {
          used += b, in += m->bytes;
          assert_int_equal(m->bytes, live_at(s, m->chunk, t) ? b : 0);
        } else {
          used -= b, out += m->bytes;
          if (lap) assert_int_equal(m->bytes, dirty[m->chunk] && live_at(s, m->chunk, t) ? b : 0);
        }
        dirty[m->chunk] = false;
      }
      assert_true(used + psp_schedule_nonmodel(s, t) <= budget || used == 0);
      const psp_use *u;
      bool away = false;
      for (size_t i = 0, nu = psp_schedule_uses(s, t, &u); i < nu; i++) {
        away |= !on[u[i].chunk];
        dirty[u[i].chunk] |= on[u[i].chunk] && u[i].written;
      }
      host += away;
    }
    assert_int_equal(k, pl->n_moves); /* every move at a moment of the iteration */
    assert_int_equal(host, pl->in_place);
    assert_int_equal(in, pl->bytes_in);
    assert_int_equal(out, pl->bytes_out);
  }
  for (size_t i = 0; i < pl->n_start; i++) on[pl->start[i]] = false;
  for (uint32_t c = 0; c < n; c++) assert_false(on[c]); /* ends where it began */
  free(on);
  free(dirty);
}

/* ---- the fewest fetches of any placement that repeats each iteration, by exhaustion ---- */

enum { MAX_CHUNKS = 6, MASKS = 1 << MAX_CHUNKS };

/* Over every start placement S and every way through the iteration back to S, with
 * `slots` equal chunks fitting: the fewest chunks copied in. Evicting freely and fetching
 * a chunk only at its use loses nothing (a fetch can always wait for its use), so from
 * placement M moment t leads to its uses plus any subset of M. */
static int fewest_fetches(const psp_schedule *s, uint32_t slots)
{
  uint32_t P = psp_schedule_period(s);
  int best = -1;
  for (uint32_t start = 0; start < MASKS; start++) {
    if ((uint32_t)__builtin_popcount(start) > slots) continue;
    int cost[MASKS], next[MASKS];
    for (uint32_t m = 0; m < MASKS; m++) cost[m] = m == start ? 0 : -1;
    for (uint32_t t = 0; t < P; t++) {
      const psp_use *u;
      uint32_t uses = 0;
      for (size_t i = 0, nu = psp_schedule_uses(s, t, &u); i < nu; i++) uses |= 1u << u[i].chunk;
      for (uint32_t m = 0; m < MASKS; m++) next[m] = -1;
      for (uint32_t m = 0; m < MASKS; m++) {
        if (cost[m] < 0) continue;
        int c = cost[m] + __builtin_popcount(uses & ~m);
        uint32_t rest = m & ~uses, sub = rest;
        for (;;) { /* every subset of what stays */
          uint32_t to = sub | uses;
          if ((uint32_t)__builtin_popcount(to) <= slots && (next[to] < 0 || c < next[to])) next[to] = c;
          if (!sub) break;
          sub = (sub - 1) & rest;
        }
      }
      memcpy(cost, next, sizeof cost);
    }
    for (uint32_t m = 0; m < MASKS; m++)
      if (cost[m] >= 0) {
        int c = cost[m] + __builtin_popcount(start & ~m);  /* back to the start */
        if (best < 0 || c < best) best = c;
      }
  }
  return best;
}

/* Equal chunks, up to max_uses a moment. Every other one sweeps the chunks in order
 * first, as a training step does: there OPT from a cold start settles into a pattern that
 * repeats every few iterations, not every one, and the plan has to close the cycle. */
static psp_schedule *random_schedule(uint64_t *rng, uint32_t chunks, uint32_t moments, uint32_t max_uses)
{
  psp_schedule *s = psp_schedule_new();
  bool sweep = tp_below(rng, 2);
  for (uint32_t c = 0; c < chunks; c++) psp_schedule_chunk(s, c, MIB);
  for (uint32_t t = 0; t < moments; t++) {
    psp_schedule_moment(s, 0);
    if (sweep && t < chunks) psp_schedule_touch(s, t, false);
    for (uint32_t k = sweep ? tp_below(rng, 2) : 1 + tp_below(rng, max_uses); k > 0; k--)
      psp_schedule_touch(s, tp_below(rng, chunks), tp_below(rng, 2));
  }
  assert_int_equal(psp_schedule_seal(s), 0);
  return s;
}

static void test_fewest_bytes_in(void **state)
{
  (void)state;
  uint64_t rng = 11;
  for (int round = 0; round < 300; round++) {
    uint32_t chunks = 3 + tp_below(&rng, 4), moments = 8 + tp_below(&rng, 7), slots = 2 + tp_below(&rng, 2);
    psp_schedule *s = random_schedule(&rng, chunks, moments, slots);
    psp_plan pl;
    assert_int_equal(psp_plan_make(s, slots * MIB, &FAST, &pl), 0);
    check_plan(s, slots * MIB, &pl);
    assert_int_equal(pl.in_place, 0);
    assert_int_equal(pl.bytes_in, (uint64_t)fewest_fetches(s, slots) * MIB);
    psp_plan_free(&pl);
    psp_schedule_free(s);
  }
}

/* ---- write-back: only chunks written since they came in ---- */

static void test_write_back_only_written(void **state)
{
  (void)state;
  /* A written at 0, B read at 1, room for one: A goes out with a copy, B without */
  psp_schedule *s = tp_write_then_read(MIB, MIB);
  assert_non_null(s);
  psp_plan pl;
  assert_int_equal(psp_plan_make(s, MIB, &FAST, &pl), 0);
  check_plan(s, MIB, &pl);
  assert_int_equal(pl.bytes_in, 2 * MIB);
  assert_int_equal(pl.bytes_out, MIB);
  for (size_t i = 0; i < pl.n_moves; i++)
    if (pl.moves[i].dir == PSP_TO_HOST) assert_int_equal(pl.moves[i].bytes, pl.moves[i].chunk == 0 ? MIB : 0);
  psp_plan_free(&pl);
  psp_schedule_free(s);

  /* random schedules of mixed sizes and non-model bytes: a chunk never written never
   * leaves with a copy */
  uint64_t rng = 5;
  for (int round = 0; round < 200; round++) {
    uint32_t chunks = 3 + tp_below(&rng, 8), moments = 6 + tp_below(&rng, 30);
    s = psp_schedule_new();
    for (uint32_t c = 0; c < chunks; c++) psp_schedule_chunk(s, c, (1 + tp_below(&rng, 3)) * MIB);
    for (uint32_t t = 0; t < moments; t++) {
      psp_schedule_moment(s, tp_below(&rng, 3) * MIB / 2);
      for (uint32_t k = 1 + tp_below(&rng, 3); k > 0; k--) {
        uint32_t c = tp_below(&rng, chunks);
        psp_schedule_touch(s, c, c % 2 && tp_below(&rng, 2));  /* even chunks are only read */
      }
    }
    assert_int_equal(psp_schedule_seal(s), 0);
    uint64_t budget = (2 + tp_below(&rng, 6)) * MIB;
    assert_int_equal(psp_plan_make(s, budget, &FAST, &pl), 0);
    check_plan(s, budget, &pl);
    for (size_t i = 0; i < pl.n_moves; i++)
      if (pl.moves[i].dir == PSP_TO_HOST && pl.moves[i].chunk % 2 == 0) assert_int_equal(pl.moves[i].bytes, 0);
    psp_plan_free(&pl);
    psp_schedule_free(s);
  }
}

/* ---- timing ---- */

/* A, B and C read at moments 0, 2 and 4 of six, room for two. Whichever stays, the other
 * two share a frame: one's fetch has one moment to copy in, the other's three. */
static void test_timing(void **state)
{
  (void)state;
  psp_schedule *s = psp_schedule_new();
  for (uint32_t c = 0; c < 3; c++) psp_schedule_chunk(s, c, MIB);
  for (uint32_t t = 0; t < 6; t++) {
    psp_schedule_moment(s, 0);
    if (t % 2 == 0) psp_schedule_touch(s, t / 2, false);
  }
  assert_int_equal(psp_schedule_seal(s), 0);
  const uint64_t d = 1000, ns[6] = {d, d, d, d, d, d};
  /* copy time per chunk: within one moment, within three, beyond */
  const uint64_t copy[] = {500, 2000, 10000};
  for (size_t i = 0; i < 3; i++) {
    double rate = (double)MIB / ((double)copy[i] * 1e-9);
    psp_costs c = {.h2d = rate, .d2h = rate, .both = 1.8 * rate, .in_place = rate, .moment_ns = ns};
    psp_plan pl;
    assert_int_equal(psp_plan_make(s, 2 * MIB, &c, &pl), 0);
    check_plan(s, 2 * MIB, &pl);
    assert_int_equal(pl.bytes_in, 2 * MIB);
    assert_int_equal(pl.work_ns, 6 * d);
    uint64_t late1 = copy[i] > d ? copy[i] - d : 0, late3 = copy[i] > 3 * d ? copy[i] - 3 * d : 0;
    assert_in_range(pl.step_ns, 6 * d + late1 + late3 - 1, 6 * d + late1 + late3 + 1);  /* rounding */
    assert_int_equal(pl.waits, (late1 > 0) + (late3 > 0));
    assert_in_range(pl.wait_ns + 1, late1 + late3, late1 + late3 + 2);
    psp_plan_free(&pl);
  }
  psp_schedule_free(s);
}

/* ---- cyclic: mixed sizes, non-model bytes, in-place reads ---- */

static void test_cyclic(void **state)
{
  (void)state;
  uint64_t rng = 17;
  for (int round = 0; round < 300; round++) {
    uint32_t chunks = 2 + tp_below(&rng, 20), moments = 1 + tp_below(&rng, 60);
    bool sweep = tp_below(&rng, 2);  /* as in random_schedule */
    psp_schedule *s = psp_schedule_new();
    for (uint32_t c = 0; c < chunks; c++) psp_schedule_chunk(s, c, (1 + tp_below(&rng, 4)) * MIB);
    for (uint32_t t = 0; t < moments; t++) {
      psp_schedule_moment(s, tp_below(&rng, 4) * MIB);
      if (sweep) psp_schedule_touch(s, t % chunks, tp_below(&rng, 2));
      for (uint32_t k = tp_below(&rng, 4); k > 0; k--) psp_schedule_touch(s, tp_below(&rng, chunks), tp_below(&rng, 2));
    }
    assert_int_equal(psp_schedule_seal(s), 0);
    uint64_t budget = tp_below(&rng, 12) * MIB;
    psp_plan pl;
    assert_int_equal(psp_plan_make(s, budget, &FAST, &pl), 0);
    check_plan(s, budget, &pl);
    assert_true(pl.step_ns >= pl.work_ns);
    psp_plan_free(&pl);
    psp_schedule_free(s);
  }
}

/* ---- fresh data: a chunk that holds nothing live part of the iteration ---- */

static void test_fresh(void **state)
{
  (void)state;
  /* A written at 0 and read at 1 (an activation), B read at 2 and 3; room for one */
  for (int empty = 0; empty < 2; empty++) {
    psp_schedule *s = psp_schedule_new();
    psp_schedule_chunk(s, 0, MIB);
    psp_schedule_chunk(s, 1, MIB);
    for (uint32_t t = 0; t < 4; t++) {
      psp_schedule_moment(s, 0);
      psp_schedule_touch(s, t < 2 ? 0 : 1, t == 0);
    }
    if (empty) assert_int_equal(psp_schedule_empty(s, 0, 1, 0), 0);  /* freed after 1, made again at 0 */
    assert_int_equal(psp_schedule_seal(s), 0);
    const psp_use *u;
    assert_int_equal(psp_schedule_uses(s, 0, &u), 1);
    assert_int_equal(u[0].fresh, empty);
    psp_plan pl;
    assert_int_equal(psp_plan_make(s, MIB, &FAST, &pl), 0);
    check_plan(s, MIB, &pl);
    /* with the empty range A costs neither its fetch nor its write-back */
    assert_int_equal(pl.bytes_in, empty ? MIB : 2 * MIB);
    assert_int_equal(pl.bytes_out, empty ? 0 : MIB);
    psp_plan_free(&pl);
    psp_schedule_free(s);
  }
  /* a range with a use inside it is refused, and the schedule stays open */
  psp_schedule *s = psp_schedule_new();
  psp_schedule_chunk(s, 0, MIB);
  for (uint32_t t = 0; t < 3; t++) {
    psp_schedule_moment(s, 0);
    psp_schedule_touch(s, 0, true);
  }
  assert_int_equal(psp_schedule_empty(s, 0, 0, 2), 0);
  assert_int_equal(psp_schedule_seal(s), -1);
  assert_int_equal(psp_schedule_touch(s, 0, false), 0);  /* merges into moment 2's touch */
  const psp_use *u;
  assert_int_equal(psp_schedule_uses(s, 2, &u), 1);
  assert_true(u[0].written);
  assert_false(u[0].fresh);
  psp_schedule_free(s);
}

/* ---- lag: a chunk stays busy for `lag` moments after each use ---- */

/* Moves of the plan that issue within the lag after a use of their chunk (the iteration
 * repeats: uses before moment 0 are the previous iteration's). */
static uint32_t moves_too_soon(const psp_schedule *s, const psp_plan *pl, uint32_t lag)
{
  uint32_t P = psp_schedule_period(s), soon = 0, L = lag < P ? lag : P;
  for (size_t i = 0; i < pl->n_moves; i++) {
    const psp_move *m = &pl->moves[i];
    for (uint32_t k = 1; k < L; k++) {
      const psp_use *u;
      bool used = false;
      for (size_t j = 0, nu = psp_schedule_uses(s, m->at + P - k, &u); j < nu; j++) used |= u[j].chunk == m->chunk;
      if (used) {
        soon++;
        break;
      }
    }
  }
  return soon;
}

/* With a lag, no move issues within it after a use of its chunk, and a fetch never takes a
 * frame before the eviction that frees it has issued (check_plan: the frames at each
 * moment within the budget). The same schedules planned without the lag do move chunks
 * that soon, so the rule is what keeps them apart. */
static void test_lag(void **state)
{
  (void)state;
  uint64_t rng = 23;
  uint32_t soon_without = 0, moved = 0;
  for (int round = 0; round < 300; round++) {
    uint32_t chunks = 2 + tp_below(&rng, 16), moments = 2 + tp_below(&rng, 60), lag = 2 + tp_below(&rng, 12);
    psp_schedule *s = psp_schedule_new();
    for (uint32_t c = 0; c < chunks; c++) psp_schedule_chunk(s, c, (1 + tp_below(&rng, 3)) * MIB);
    for (uint32_t t = 0; t < moments; t++) {
      psp_schedule_moment(s, 0);
      for (uint32_t k = tp_below(&rng, 3); k > 0; k--) psp_schedule_touch(s, tp_below(&rng, chunks), tp_below(&rng, 2));
    }
    assert_int_equal(psp_schedule_seal(s), 0);
    uint64_t budget = (1 + tp_below(&rng, 10)) * MIB;
    psp_costs c = FAST;
    psp_plan pl;
    assert_int_equal(psp_plan_make(s, budget, &c, &pl), 0);
    soon_without += moves_too_soon(s, &pl, lag) > 0;
    psp_plan_free(&pl);
    c.lag = lag;
    assert_int_equal(psp_plan_make(s, budget, &c, &pl), 0);
    check_plan(s, budget, &pl);
    assert_int_equal(moves_too_soon(s, &pl, lag), 0);
    moved += pl.n_moves > 0;
    psp_plan_free(&pl);
    psp_schedule_free(s);
  }
  assert_true(soon_without > 30);
  assert_true(moved > 50);
}

/* ---- the rules at their exact edges, on hand-built schedules ---- */

/* Chunks A (0) and B (1) of 1 MiB, A used at moment 0 and B at moment k of P, one frame:
 * the two can only take turns in it. */
static psp_schedule *turns(uint32_t P, uint32_t k)
{
  psp_schedule *s = psp_schedule_new();
  assert_non_null(s);
  assert_int_equal(psp_schedule_chunk(s, 0, MIB), 0);
  assert_int_equal(psp_schedule_chunk(s, 1, MIB), 0);
  for (uint32_t t = 0; t < P; t++) {
    assert_int_equal(psp_schedule_moment(s, 0), 0);
    if (t == 0) assert_int_equal(psp_schedule_touch(s, 0, false), 0);
    if (t == k) assert_int_equal(psp_schedule_touch(s, 1, false), 0);
  }
  assert_int_equal(psp_schedule_seal(s), 0);
  return s;
}

/* The plan of turns(P, k) under one frame with the lag: its moves as "at:chunk:dir[:need]"
 * in issue order into out, and its in-place moments. */
static uint32_t turn_plan(uint32_t P, uint32_t k, uint32_t lag, char *out, size_t len)
{
  psp_schedule *s = turns(P, k);
  psp_costs c = FAST;
  c.lag = lag;
  psp_plan pl;
  assert_int_equal(psp_plan_make(s, MIB, &c, &pl), 0);
  check_plan(s, MIB, &pl);
  size_t n = 0;
  out[0] = '\0';
  for (size_t i = 0; i < pl.n_moves && n < len; i++) {
    const psp_move *m = &pl.moves[i];
    n += (size_t)snprintf(out + n, len - n, m->dir == PSP_TO_GPU ? "%s%u:%u:in:%u" : "%s%u:%u:out", i ? " " : "",
                          m->at, m->chunk, m->need);
  }
  uint32_t in_place = pl.in_place;
  psp_plan_free(&pl);
  psp_schedule_free(s);
  return in_place;
}

/* With a lag of L, A (used at 0) may leave its frame at L and not before: B used at L
 * takes it exactly then (and gives it back exactly L after its own use); B used at L - 1
 * finds A still busy and is read in place, nothing moving. At the iteration's end, a
 * chunk used L before it can still leave by the close; one used L - 1 before cannot. A lag
 * of 1 holds nothing: B may take the frame right after A's use. */
static void test_lag_edges(void **state)
{
  (void)state;
  char got[256], want[256];
  for (uint32_t L = 2; L <= 5; L++) {
    const uint32_t P = 3 * L;
    assert_int_equal(turn_plan(P, L, L, got, sizeof got), 0);
    snprintf(want, sizeof want, "%u:0:out %u:1:in:%u %u:1:out %u:0:in:0", L, L, L, 2 * L, 2 * L);
    assert_string_equal(got, want);
    assert_int_equal(turn_plan(P, L - 1, L, got, sizeof got), 1);
    assert_string_equal(got, "");
    /* B used L before the end: it leaves at the next iteration's start, A coming back then */
    assert_int_equal(turn_plan(P, P - L, L, got, sizeof got), 0);
    snprintf(want, sizeof want, "0:1:out 0:0:in:0 %u:0:out %u:1:in:%u", L, L, P - L);
    assert_string_equal(got, want);
    assert_int_equal(turn_plan(P, P - L + 1, L, got, sizeof got), 1);
    assert_string_equal(got, "");
  }
  assert_int_equal(turn_plan(6, 1, 1, got, sizeof got), 0);
  assert_string_equal(got, "1:0:out 1:1:in:1 2:1:out 2:0:in:0");
  assert_int_equal(turn_plan(6, 1, 2, got, sizeof got), 1);
}

/* One moment using A and B (1 MiB each) beside `nonmodel` bytes: both fit exactly when
 * the budget is their bytes and the non-model ones, and one is read in place a byte below. */
static void test_budget_edges(void **state)
{
  (void)state;
  for (uint64_t nonmodel = 0; nonmodel <= 3 * MIB; nonmodel += 3 * MIB / 2) {
    psp_schedule *s = psp_schedule_new();
    assert_int_equal(psp_schedule_chunk(s, 0, MIB), 0);
    assert_int_equal(psp_schedule_chunk(s, 1, MIB), 0);
    assert_int_equal(psp_schedule_moment(s, nonmodel), 0);
    assert_int_equal(psp_schedule_touch(s, 0, true), 0);
    assert_int_equal(psp_schedule_touch(s, 1, false), 0);
    assert_int_equal(psp_schedule_moment(s, 0), 0);
    assert_int_equal(psp_schedule_seal(s), 0);
    for (int lag = 0; lag <= 2; lag += 2) {
      psp_costs c = FAST;
      c.lag = (uint32_t)lag;
      psp_plan pl;
      assert_int_equal(psp_plan_make(s, 2 * MIB + nonmodel, &c, &pl), 0);
      check_plan(s, 2 * MIB + nonmodel, &pl);
      assert_int_equal(pl.in_place, 0);
      assert_int_equal(pl.n_start, 2);
      psp_plan_free(&pl);
      assert_int_equal(psp_plan_make(s, 2 * MIB + nonmodel - 1, &c, &pl), 0);
      check_plan(s, 2 * MIB + nonmodel - 1, &pl);
      assert_int_equal(pl.in_place, 1);
      assert_int_equal(pl.bytes_in_place, MIB);
      psp_plan_free(&pl);
    }
    psp_schedule_free(s);
  }
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fewest_bytes_in), cmocka_unit_test(test_write_back_only_written),
      cmocka_unit_test(test_timing),          cmocka_unit_test(test_cyclic),
      cmocka_unit_test(test_fresh),           cmocka_unit_test(test_lag),
      cmocka_unit_test(test_lag_edges),       cmocka_unit_test(test_budget_edges),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
