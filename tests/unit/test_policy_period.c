/* policy: iteration-period detection on synthetic launch streams. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include <stdio.h>

#include "policy/policy.h"

uint64_t tp_rand(uint64_t *state);             /* test_policy_common.c */
uint32_t tp_below(uint64_t *state, uint32_t n);

/* A stream being fed, kept whole so tests can look at what a phase points to. */
typedef struct stream {
  psp_period *d;
  uint64_t *sig;
  size_t n, cap;
} stream;

static stream *stream_new(uint32_t max_period, uint32_t repeats, double noise)
{
  stream *st = calloc(1, sizeof *st);
  st->d = psp_period_new(max_period, repeats, noise);
  assert_non_null(st->d);
  return st;
}

static void stream_free(stream *st)
{
  psp_period_free(st->d);
  free(st->sig);
  free(st);
}

static void feed(stream *st, uint64_t sig)
{
  if (st->n == st->cap) {
    st->cap = st->cap ? 2 * st->cap : 1024;
    st->sig = realloc(st->sig, st->cap * sizeof *st->sig);
  }
  st->sig[st->n++] = sig;
  psp_period_feed(st->d, sig);
}

/* launch i of an iteration; the iteration's first launch (ITER_START) occurs nowhere else,
 * so the pattern's smallest period is its length */
#define ITER_START 0xfeedull
static uint64_t *pattern(uint64_t *rng, uint32_t period, uint32_t alphabet)
{
  uint64_t *p = malloc(period * sizeof *p);
  p[0] = ITER_START;
  for (uint32_t i = 1; i < period; i++) p[i] = 1 + tp_below(rng, alphabet);
  return p;
}

/* launches `from` .. from + count - 1 of the endlessly repeated pattern */
static void feed_pattern(stream *st, const uint64_t *p, uint32_t period, uint64_t from,
                         uint64_t count)
{
  for (uint64_t i = from; i < from + count; i++) feed(st, p[i % period]);
}

static uint64_t unique_sig(uint64_t *rng) { return tp_rand(rng) | 1ull << 63; }

static void test_exact(void **state)
{
  (void)state;
  uint64_t rng = 5;
  uint32_t periods[] = {1, 2, 3, 7, 50, 333, 1000};
  for (size_t k = 0; k < sizeof periods / sizeof *periods; k++) {
    uint32_t p = periods[k], got;
    uint64_t phase, *pat = pattern(&rng, p, 16);
    stream *st = stream_new(1024, 3, 0.02);
    uint64_t reps = p < 4 ? 8 : 4;  /* a run needs a few matches in a row to count */
    feed_pattern(st, pat, p, 0, reps * p);
    assert_true(psp_period_get(st->d, &got, &phase));
    assert_int_equal(got, p);
    /* boundaries 0, p, .. (reps - 1) p: the latest iteration whose successor has begun */
    assert_int_equal(phase, (reps - 2) * p);
    feed_pattern(st, pat, p, 0, p / 2 + 1);
    assert_true(psp_period_get(st->d, &got, &phase));
    assert_int_equal(got, p);
    assert_int_equal(phase, (reps - 1) * p);
    stream_free(st);
    free(pat);
  }
}

static void test_too_few_repeats(void **state)
{
  (void)state;
  uint64_t rng = 6, phase;
  uint32_t got;
  uint64_t *pat = pattern(&rng, 50, 16);
  stream *st = stream_new(1024, 3, 0.02);
  feed_pattern(st, pat, 50, 0, 140);
  assert_false(psp_period_get(st->d, &got, &phase));
  feed_pattern(st, pat, 50, 140, 10);  /* 150 = three periods */
  assert_true(psp_period_get(st->d, &got, &phase));
  assert_int_equal(got, 50);
  stream_free(st);
  free(pat);
}

static void test_warm_up_prefix(void **state)
{
  (void)state;
  uint64_t rng = 7, phase;
  uint32_t got;
  uint64_t *pat = pattern(&rng, 40, 16);
  stream *st = stream_new(1024, 3, 0.02);
  for (int i = 0; i < 137; i++) feed(st, unique_sig(&rng));
  feed_pattern(st, pat, 40, 0, 5 * 40 + 7);
  assert_true(psp_period_get(st->d, &got, &phase));
  assert_int_equal(got, 40);
  assert_int_equal(phase, 137 + 4 * 40);
  stream_free(st);
  free(pat);
}

/* A real torch launch stream (tests/data/gpt_small_moments.txt, from a small GPT traced on
 * the H200): periodic with 290 moments per iteration from about moment 5000, then with 434
 * from about 9900 on. Asked every 500 moments, the detector must name each phase's period.
 * Without the rule on evidence, long candidates that matched a few launches of the
 * start-up would span nearly everything, and no period would be found in this stream. */
static void test_real_trace(void **state)
{
  (void)state;
  const char *path = getenv("MOMENTS");
  FILE *f = path ? fopen(path, "r") : NULL;
  if (!f)
    fail_msg("MOMENTS names no readable file (%s)", path ? path : "unset");
  psp_period *d = psp_period_new(65536, 3, 0.02);
  char line[512];
  uint64_t fed = 0;
  int found_290 = 0, found_434 = 0, wrong = 0;
  while (fgets(line, sizeof line, f)) {
    if (line[0] == '#')
      continue;
    for (char *c = line, *end; ; c = end) {
      unsigned long v = strtoul(c, &end, 10);
      if (end == c)
        break;
      psp_period_feed(d, v * 0x9E3779B97F4A7C15ull + 1);
      if (++fed % 500)
        continue;
      uint32_t p = 0;
      uint64_t phase = 0;
      if (!psp_period_get(d, &p, &phase))
        continue;
      if (fed >= 6000 && fed <= 9500)
        p == 290 ? found_290++ : wrong++;
      else if (fed >= 11500)
        p == 434 ? found_434++ : wrong++;
    }
  }
  fclose(f);
  psp_period_free(d);
  assert_int_equal(fed, 13489);
  assert_int_equal(wrong, 0);
  assert_true(found_290 >= 6); /* of the 8 queries in that stretch */
  assert_true(found_434 >= 3); /* of 4 */
}

/* Noise in two of seven iterations, away from their starts: an extra launch, a missing one
 * or a changed one. */
static void test_noise(void **state)
{
  (void)state;
  uint64_t rng = 8;
  for (int round = 0; round < 100; round++) {
    uint32_t p = 60 + tp_below(&rng, 400), got;
    uint64_t phase, *pat = pattern(&rng, p, 30);
    stream *st = stream_new(1024, 3, 0.02);
    for (int i = 0; i < 25; i++) feed(st, unique_sig(&rng));
    for (uint32_t r = 0; r < 7; r++) {
      uint32_t at = r == 2 || r == 5 ? 5 + tp_below(&rng, p - 10) : UINT32_MAX;
      uint32_t kind = tp_below(&rng, 3);
      for (uint32_t i = 0; i < p; i++) {
        if (i == at && kind == 0) feed(st, unique_sig(&rng));  /* inserted */
        if (i == at && kind == 1) continue;                    /* missing */
        feed(st, i == at && kind == 2 ? unique_sig(&rng) : pat[i]);  /* changed */
      }
    }
    feed_pattern(st, pat, p, 0, p / 3);
    assert_true(psp_period_get(st->d, &got, &phase));
    assert_int_equal(got, p);
    assert_true(phase + p <= st->n);
    assert_int_equal(st->sig[phase], ITER_START);  /* aligned to the iteration despite noise */
    assert_true(st->n - phase < 2ull * p + 2);     /* and the latest complete one */
    stream_free(st);
    free(pat);
  }
}

static void test_no_period(void **state)
{
  (void)state;
  uint64_t rng = 9, phase;
  uint32_t got;
  stream *st = stream_new(1024, 3, 0.02);
  for (int i = 0; i < 5000; i++) feed(st, unique_sig(&rng));
  assert_false(psp_period_get(st->d, &got, &phase));
  stream_free(st);
  /* few distinct kernels in random order repeat often, but not periodically */
  for (uint32_t alphabet = 2; alphabet <= 32; alphabet *= 4) {
    st = stream_new(1024, 3, 0.02);
    for (int i = 0; i < 5000; i++) {
      feed(st, tp_below(&rng, alphabet));
      if (i % 100 == 99) assert_false(psp_period_get(st->d, &got, &phase));
    }
    stream_free(st);
  }
  /* periodic, but with a period beyond max_period */
  uint64_t *pat = pattern(&rng, 100, 16);
  st = stream_new(64, 3, 0.02);
  feed_pattern(st, pat, 100, 0, 1000);
  assert_false(psp_period_get(st->d, &got, &phase));
  stream_free(st);
  free(pat);
  assert_null(psp_period_new(0, 3, 0.02));
  assert_null(psp_period_new(64, 1, 0.02));
}

static void test_long_period(void **state)
{
  (void)state;
  uint64_t rng = 10, phase;
  uint32_t got;
  uint64_t *pat = pattern(&rng, 3000, 300);
  stream *st = stream_new(4096, 3, 0.02);
  feed_pattern(st, pat, 3000, 0, 4 * 3000 + 1234);
  assert_true(psp_period_get(st->d, &got, &phase));
  assert_int_equal(got, 3000);
  assert_int_equal(phase, 3 * 3000);
  stream_free(st);
  free(pat);
}

/* A model's iteration: embedding, 32 identical layers forward, head, 32 identical layers
 * backward, optimizer. One layer repeats too, but only within the stack. */
static void test_layers_are_not_the_iteration(void **state)
{
  (void)state;
  enum { LAYERS = 32, LAYER = 8 };
  uint64_t iter[2 + LAYERS * LAYER + 2 + LAYERS * LAYER + 1];
  uint32_t p = 0;
  iter[p++] = ITER_START;
  iter[p++] = 2;
  for (int l = 0; l < LAYERS; l++)
    for (int k = 0; k < LAYER; k++) iter[p++] = 100 + k;
  iter[p++] = 3;
  iter[p++] = 4;
  for (int l = 0; l < LAYERS; l++)
    for (int k = 0; k < LAYER; k++) iter[p++] = 200 + k;
  iter[p++] = 5;

  uint64_t phase;
  uint32_t got;
  stream *st = stream_new(2048, 3, 0.02);
  feed_pattern(st, iter, p, 0, 2 * p + 100);  /* mid-stack of the third iteration */
  assert_false(psp_period_get(st->d, &got, &phase));
  feed_pattern(st, iter, p, 2 * p + 100, p);  /* mid-stack of the fourth */
  assert_true(psp_period_get(st->d, &got, &phase));
  assert_int_equal(got, p);
  assert_int_equal(phase, 2 * p);
  stream_free(st);
}

/* An iteration that is two runs of one kernel each (a layer pipeline: 48 forward launches
 * of one kernel, then 48 backward launches of another): a period of 1 matches all but the
 * two changes of kernel an iteration, the iteration matches everything, and is chosen. */
static void test_runs_of_one_kernel(void **state)
{
  (void)state;
  enum { LAYERS = 48 };
  uint64_t iter[2 * LAYERS];
  for (int k = 0; k < 2 * LAYERS; k++) iter[k] = k < LAYERS ? 11 : 22;
  uint64_t phase;
  uint32_t got;
  stream *st = stream_new(65536, 2, 0.02);
  feed_pattern(st, iter, 2 * LAYERS, 0, 6 * 2 * LAYERS + 10); /* ten launches into the seventh */
  assert_true(psp_period_get(st->d, &got, &phase));
  assert_int_equal(got, 2 * LAYERS);
  assert_int_equal(phase % (2 * LAYERS), 0);
  stream_free(st);
}

/* Asked once per iteration for many iterations: the ring wraps, the warm-up prefix leaves
 * it, and boundaries stay where they first were. */
static void test_bounded_and_stable(void **state)
{
  (void)state;
  uint64_t rng = 11;
  uint32_t p = 50, got;
  uint64_t phase, *pat = pattern(&rng, p, 16);
  stream *st = stream_new(64, 3, 0.02);
  for (int i = 0; i < 13; i++) feed(st, unique_sig(&rng));
  for (int r = 0; r < 200; r++) {
    feed_pattern(st, pat, p, 0, p);
    if (r < 2) continue;
    assert_true(psp_period_get(st->d, &got, &phase));
    assert_int_equal(got, p);
    /* the iteration starts after the prefix; once the prefix has left the ring (256
     * launches), the oldest held launch is at 7 mod 50, which must not move the boundary */
    assert_int_equal(phase % p, 13);
    assert_int_equal(st->sig[phase], ITER_START);
  }
  stream_free(st);
  free(pat);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact),         cmocka_unit_test(test_too_few_repeats),
      cmocka_unit_test(test_warm_up_prefix), cmocka_unit_test(test_noise),
      cmocka_unit_test(test_real_trace),
      cmocka_unit_test(test_no_period),     cmocka_unit_test(test_long_period),
      cmocka_unit_test(test_layers_are_not_the_iteration),
      cmocka_unit_test(test_runs_of_one_kernel),
      cmocka_unit_test(test_bounded_and_stable),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
