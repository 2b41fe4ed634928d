/* Iteration-period detection over launch signatures.
 *
 * Candidates: a training iteration repeats, so the signatures of the last few launches
 * occurred one period earlier too; each earlier occurrence proposes a period.
 *
 * Checking a candidate: walk backwards from the newest launch i, comparing it with launch
 * j = i - period. Noise (a launch inserted, missing or changed) shifts the alignment by one,
 * so on a mismatch the walk resynchronizes by the step that makes the next few comparisons
 * agree best: both back one (changed), i alone (inserted in the newer copy), j alone
 * (missing from it). A match scores 1 and an edit -penalty, chosen so that a stretch in
 * which more than `noise` of the launches are noise loses score; the walk ends when the
 * score falls BURST edits' worth below its best. The periodic run reaches back to the oldest launch of the
 * last STREAK matches in a row: noise just before that (which the score has not yet paid
 * back) does not cut the run short, and stray matches in the garbage before it do not
 * stretch it.
 *
 * Choosing: a shorter pattern (one transformer layer) also repeats, but only since the
 * newest iteration boundary, while the iteration repeats since warm-up ended. So the answer
 * is the smallest period whose run spans `repeats` periods and either reaches back within
 * one period of the longest span any candidate has (a stream periodic from its start), or
 * spans at least the evidence any candidate has and MIN_EVIDENCE launches more than its
 * period. A run's evidence is the older copy it matched, its span less one period. The
 * second way finds the iteration after a long unperiodic stretch (warm-up, a change of
 * phase), where a long candidate that matched only a few launches there spans nearly
 * everything: on a real torch trace that hid the iteration. */
#include <stdlib.h>
#include <string.h>

#include "policy/policy.h"

#define PROBES 4     /* newest launches whose earlier occurrences propose periods */
#define LOOKAHEAD 8  /* comparisons judging how to resynchronize after a mismatch */
#define BURST 4      /* edits in a row a run survives: an insertion costs two (one per copy) */
#define DRIFT 8      /* most launches the alignment may slip from the candidate period */
#define STREAK 4     /* matches in a row that mark launches as part of the run */
#define MIN_EVIDENCE 64 /* launches a run must have matched: random streams over a few
                           kernels repeat by chance over shorter stretches */

struct psp_period {
  uint64_t *ring;     /* launch k's signature is ring[k & mask] */
  uint32_t *partner;  /* scratch, ring-indexed: the matched launch one period later is
                         j + partner[j], 0 when j was not matched */
  uint32_t *cand;     /* scratch: candidate shifts to walk */
  uint32_t *period_of;  /* scratch: the period each candidate's walk measured */
  uint64_t *cover;    /* scratch: launches each candidate's run spans */
  uint64_t *misses;   /* scratch: launches of it that did not match */
  size_t cand_cap;
  uint64_t mask, n;   /* n: launches fed */
  uint32_t max_period, repeats;
  int64_t penalty;
  /* the last answer, kept while nothing new is fed, and its phase, to align the next */
  uint64_t answered_at;
  bool found;
  uint32_t period;
  uint64_t phase;
};

typedef struct run {
  uint32_t period;   /* the most common distance between matched launches */
  uint64_t first_j;  /* the oldest launch of the run: where the periodicity begins */
  uint64_t steps;    /* steps the walk took to reach first_j, to replay it */
  uint64_t misses;   /* launches that did not match on the way to first_j */
} run;

psp_period *psp_period_new(uint32_t max_period, uint32_t repeats, double noise)
{
  if (max_period == 0 || repeats < 2) return NULL;
  psp_period *d = calloc(1, sizeof *d);
  if (!d) return NULL;
  uint64_t size = 1;
  while (size < ((uint64_t)repeats + 1) * max_period) size *= 2;
  d->mask = size - 1;
  d->max_period = max_period;
  d->repeats = repeats;
  /* A noisy launch costs two edits (it is compared once as the newer copy, once as the
   * older), so noise e makes edit rate 2e and scores (1 - 2e) - penalty * 2e per launch,
   * which is < 0 iff e > noise. */
  d->penalty = noise > 0 ? (int64_t)((1 - 2 * noise) / (2 * noise) + 0.999) : INT32_MAX;
  if (d->penalty < 1) d->penalty = 1;
  d->cand_cap = (size_t)PROBES * (max_period + DRIFT);
  d->ring = malloc(size * sizeof *d->ring);
  d->partner = malloc(size * sizeof *d->partner);
  d->cand = malloc(d->cand_cap * sizeof *d->cand);
  d->period_of = malloc(d->cand_cap * sizeof *d->period_of);
  d->cover = malloc(d->cand_cap * sizeof *d->cover);
  d->misses = malloc(d->cand_cap * sizeof *d->misses);
  if (!d->ring || !d->partner || !d->cand || !d->period_of || !d->cover || !d->misses) {
    psp_period_free(d);
    return NULL;
  }
  return d;
}

void psp_period_free(psp_period *d)
{
  if (!d) return;
  free(d->ring);
  free(d->partner);
  free(d->cand);
  free(d->period_of);
  free(d->cover);
  free(d->misses);
  free(d);
}

void psp_period_feed(psp_period *d, uint64_t signature)
{
  d->ring[d->n & d->mask] = signature;
  d->n++;
}

static uint64_t sig(const psp_period *d, int64_t k) { return d->ring[(uint64_t)k & d->mask]; }

/* The oldest launch still held. */
static int64_t oldest(const psp_period *d)
{
  return d->n > d->mask + 1 ? (int64_t)(d->n - d->mask - 1) : 0;
}

/* How far the alignment may slip: a quarter of the period, at least 1, at most DRIFT. */
static uint32_t drift_for(uint32_t shift)
{
  uint32_t q = shift / 4;
  return q < 1 ? 1 : q > DRIFT ? DRIFT : q;
}

/* How many of the LOOKAHEAD pairs (i, j), (i - 1, j - 1), ... down to launch lo agree. */
static uint32_t agree(const psp_period *d, int64_t i, int64_t j, int64_t lo)
{
  uint32_t hits = 0;
  for (int64_t k = 0; k < LOOKAHEAD && j - k >= lo; k++) hits += sig(d, i - k) == sig(d, j - k);
  return hits;
}

/* Walks candidate `shift` for at most max_steps; when record, marks matched pairs in
 * partner[] (replaying a walk up to first_j keeps exactly the run's pairs). */
static void walk(psp_period *d, uint32_t shift, uint64_t max_steps, bool record, run *r)
{
  int64_t lo = oldest(d), i = (int64_t)d->n - 1, j = i - shift;
  int64_t drift = drift_for(shift), min_gap = shift > drift ? shift - drift : 1,
          max_gap = shift + drift;
  uint64_t hist[2 * DRIFT + 1] = {0};
  int64_t score = 0, best = 0;
  uint64_t steps = 0, streak = 0, misses = 0;
  *r = (run){.period = shift, .first_j = d->n};
  while (j >= lo && steps < max_steps) {
    steps++;
    if (sig(d, i) == sig(d, j)) {
      hist[i - j - shift + drift]++;
      if (record) d->partner[(uint64_t)j & d->mask] = (uint32_t)(i - j);
      if (++score > best) best = score;
      if (++streak >= STREAK) {
        r->first_j = (uint64_t)j;
        r->steps = steps;
        r->misses = misses;
      }
      i--;
      j--;
      continue;
    }
    streak = 0;
    misses++;
    score -= d->penalty;
    if (score < best - BURST * d->penalty) break;
    uint32_t changed = agree(d, i - 1, j - 1, lo);
    uint32_t inserted = i - 1 - j >= min_gap ? agree(d, i - 1, j, lo) : 0;
    uint32_t missing = i - j + 1 <= max_gap ? agree(d, i, j - 1, lo) : 0;
    if (changed >= inserted && changed >= missing) {
      i--;
      j--;
    } else if (inserted >= missing) {
      i--;
    } else {
      j--;
    }
  }
  int64_t mode = drift;  /* hist[g] counts matches g - drift launches off the candidate */
  for (int64_t g = 0; g <= 2 * drift; g++)
    if (hist[g] > hist[mode]) mode = g;
  r->period = (uint32_t)(shift + mode - drift);
}

static int by_value(const void *x, const void *y)
{
  uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
  return (a > b) - (a < b);
}

/* Candidate periods, ascending and distinct; returns how many. */
static size_t propose(psp_period *d)
{
  int64_t lo = oldest(d), newest = (int64_t)d->n - 1;
  /* Periods too long to have repeated enough yet are proposed too: their runs keep a
   * shorter pattern from passing for the iteration. */
  uint64_t longest = d->n - (uint64_t)lo;
  if (longest > d->max_period + DRIFT) longest = d->max_period + DRIFT;
  size_t n = 0;
  for (int64_t q = newest; q > newest - PROBES && q >= lo; q--)
    for (int64_t k = 1; k <= (int64_t)longest && q - k >= lo; k++)
      if (sig(d, q - k) == sig(d, q)) d->cand[n++] = (uint32_t)k;
  qsort(d->cand, n, sizeof *d->cand, by_value);
  size_t u = 0;
  for (size_t k = 0; k < n; k++)
    if (u == 0 || d->cand[k] != d->cand[u - 1]) d->cand[u++] = d->cand[k];
  return u;
}

/* Follows matched launches one period at a time from b (or the first matched launch
 * within the drift after it); returns the last one whose next period has begun. */
static bool last_boundary(const psp_period *d, uint64_t b, uint32_t period, uint64_t *phase)
{
  bool found = false;
  for (;;) {
    uint64_t k = b;
    while (k < d->n && k <= b + drift_for(period) && !d->partner[k & d->mask]) k++;
    if (k >= d->n || !d->partner[k & d->mask]) return found;
    *phase = k;
    found = true;
    b = k + d->partner[k & d->mask];
  }
}

/* Whether candidate k explains the stream better than candidate c: with markedly fewer
 * misses per launch, or about as few and a shorter period (a multiple of the iteration
 * matches as well as the iteration). A run of one kernel repeated (a layer loop's forward
 * launches, then its backward ones) matches a period of 1 but at each change of kernel,
 * which the iteration matches: its misses decide, not its length. */
static bool better(const psp_period *d, size_t k, size_t c)
{
  /* misses per million launches; "about as few": up to 1.5 times and 0.2% more */
  uint64_t mk = d->misses[k] * 1000000 / (d->cover[k] ? d->cover[k] : 1);
  uint64_t mc = d->misses[c] * 1000000 / (d->cover[c] ? d->cover[c] : 1);
  if (2 * mk > 3 * mc + 4000) return false;
  if (2 * mc > 3 * mk + 4000) return true;
  return d->period_of[k] < d->period_of[c];
}

bool psp_period_get(psp_period *d, uint32_t *period, uint64_t *phase_start)
{
  if (d->n != d->answered_at) {
    bool anchored = d->found;
    uint64_t anchor = d->phase;
    uint32_t anchor_period = d->period;
    d->answered_at = d->n;
    d->found = false;

    size_t n = propose(d), evaluated = 0;
    uint64_t longest = 0, most_evidence = 0, lo = (uint64_t)oldest(d);
    for (; evaluated < n; evaluated++) {
      run r;
      walk(d, d->cand[evaluated], UINT64_MAX, false, &r);
      d->period_of[evaluated] = r.period;
      d->cover[evaluated] = d->n - r.first_j;
      d->misses[evaluated] = r.misses;
      if (r.period > d->max_period) d->cover[evaluated] = 0;
      /* The evidence of a run is the older copy it matched, its span less one period: a
       * long candidate that matched a few launches at the start spans nearly everything
       * and proves nothing. */
      uint64_t evidence = d->cover[evaluated] > r.period ? d->cover[evaluated] - r.period : 0;
      if (evidence > most_evidence) most_evidence = evidence;
      if (d->cover[evaluated] > longest) longest = d->cover[evaluated];
      /* a run over everything held, matching every launch, cannot be outdone by a longer period */
      if (r.first_j == lo && !r.misses && d->cover[evaluated] >= (uint64_t)d->repeats * r.period) {
        evaluated++;
        break;
      }
    }
    size_t chosen = evaluated;
    for (size_t k = 0; k < evaluated; k++) {
      uint32_t p = d->period_of[k];
      bool reaches_back = d->cover[k] + p >= longest;
      bool proven = d->cover[k] >= most_evidence && d->cover[k] >= p + MIN_EVIDENCE;
      if (d->cover[k] >= (uint64_t)d->repeats * p && (reaches_back || proven) &&
          (chosen == evaluated || better(d, k, chosen)))
        chosen = k;
    }
    if (chosen < evaluated) {
      uint32_t best = d->period_of[chosen];
      run r;
      walk(d, d->cand[chosen], UINT64_MAX, false, &r);
      memset(d->partner, 0, (d->mask + 1) * sizeof *d->partner);
      walk(d, d->cand[chosen], r.steps, true, &r);
      uint32_t slip = drift_for(best);
      bool aligned = anchored && anchor >= r.first_j && anchor < d->n &&
                     anchor_period + slip >= best && anchor_period <= best + slip;
      d->found = (aligned && last_boundary(d, anchor, best, &d->phase)) ||
                 last_boundary(d, r.first_j, best, &d->phase);
      d->period = best;
    }
  }
  if (d->found) {
    *period = d->period;
    *phase_start = d->phase;
  }
  return d->found;
}
