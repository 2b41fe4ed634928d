/* The plan: policy/'s steady plan for the trusted iteration (psp_plan_make), which the
 * device's owner runs (owner.c).
 *
 * Once the iteration's period is trusted, the next whole iteration is recorded as a
 * schedule: for each moment (by its position in the iteration, which the wiring gives) the
 * chunks it touched, and when its first touch came. When it ends the plan is made, once
 * per period (again only for another period), for the GPU frames less those held by chunks
 * the iteration never touches, at lag 0. The next launch to exit starts the device's owner
 * (owner.c) on it: the owner makes each moment's moves before the moment's launch may go,
 * and puts the chunks the plan never moves where it keeps them at each iteration's start.
 * Correctness never depends on any of it: a chunk left in a host frame is read in place.
 * Until the plan is made, placement is static's, with room by age (room.c).
 *
 * A chunk holds nothing live (psp_schedule_empty) between two touches only where its span
 * was made anew between them; a span reused in place for new data is not seen, so freed
 * and reallocated activations may count as data to copy, and the plan's predicted bytes are
 * an upper bound of what moves copy (only live ranges are copied). */
#include "allocator/paging.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_MOMENT_NS 10000 /* a moment's duration when no launch times were seen */
#define OUTLIER 16              /* a moment lasts at most 16 times the median (a stall, a print) */

enum phase { WAITING, RECORDING, FOLLOWING, FAILED };

/* A chunk as the recorded iteration saw it. Where its span lies identifies its data: a
 * span freed and made again in the same place each iteration (activations) is the same to
 * the plan, a span elsewhere means the program changed. A span that is another object than
 * at the chunk's previous touch was made anew in between: the chunk held nothing live. */
struct seen {
  uint64_t first, n; /* its span's chunks; n = 0: not touched */
  const struct span *span;
  uint32_t first_touch, last_touch;
};

struct plan_exec {
  uint64_t period;
  enum phase phase;
  bool started;      /* a position has come */
  uint64_t now;      /* the latest absolute moment seen: lap * period + position */
  uint64_t lap;      /* RECORDING: the lap recorded; WAITING: the first that may be */
  psp_schedule *sched;
  uint64_t *begun;   /* by position: when its first touch came (ns), 0 when none did */
  uint32_t opened;   /* moments of sched opened */
  struct seen *seen; /* by chunk */
  psp_plan plan;
  psp_move *fixes;   /* the chunks the plan never moves, where it keeps them */
  size_t nfix;
};

static struct plan_exec execs[PSA_MAX_DEVICES]; /* by ordinal, under the device's lock */

static void forget(struct device *d, struct plan_exec *st)
{
  if (st->phase == FOLLOWING)
    psa_owner_stop(d); /* before the plan it reads is freed */
  atomic_store(&d->pager->owner_due, false);
  psp_schedule_free(st->sched);
  psp_plan_free(&st->plan);
  free(st->begun);
  free(st->seen);
  free(st->fixes);
  memset(st, 0, sizeof *st);
}

/* Moves the clock to position (threads report moments slightly out of order: an earlier
 * position less than half a period back is a straggler, not a new lap). */
static void advance(struct plan_exec *st, uint64_t position)
{
  uint64_t P = st->period, at = st->now % P;
  if (!st->started) {
    st->started = true;
    st->now = position;
    st->lap = position == 0 ? 0 : 1; /* record from an iteration's start */
  } else if (position < at && at - position >= (P + 1) / 2) {
    st->now += P - at + position;
  } else if (position > at) {
    st->now += position - at;
  }
}

static bool on_gpu(const struct device *d, uint64_t chunk)
{
  uint32_t f = d->chunks[chunk].frame;
  return f != PSA_NO_FRAME && f != psa_shared_frame(d) && d->fr.frames[f].where == PSA_GPU;
}

/* Opens the schedule's moments up to and including position; `ns` stamps the last. */
static bool open_to(struct plan_exec *st, uint64_t position, uint64_t ns)
{
  for (; st->opened <= position; st->opened++)
    if (psp_schedule_moment(st->sched, 0))
      return false;
  if (!st->begun[position])
    st->begun[position] = ns;
  return true;
}

static int by_value(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Each moment's duration from when the moments began: a moment no touch stamped shares the
 * time of the stamped one before it, those before the first stamped one last the median,
 * and none lasts more than OUTLIER medians. `end`: when the iteration ended. NULL without
 * memory. */
static uint64_t *durations(const struct plan_exec *st, uint64_t end)
{
  uint32_t P = (uint32_t)st->period;
  uint64_t *ns = calloc(P, sizeof *ns), *sorted = malloc(P * sizeof *sorted);
  if (!ns || !sorted) {
    free(ns);
    free(sorted);
    return NULL;
  }
  for (uint32_t m = 0, k; m < P; m = k) {
    for (k = m + 1; k < P && !st->begun[k]; k++)
      ;
    uint64_t from = st->begun[m], to = k < P ? st->begun[k] : end;
    for (uint32_t j = m; from && j < k; j++)
      ns[j] = to > from ? (to - from) / (k - m) : 0;
  }
  memcpy(sorted, ns, P * sizeof *ns);
  qsort(sorted, P, sizeof *sorted, by_value);
  uint64_t median = sorted[P / 2] ? sorted[P / 2] : DEFAULT_MOMENT_NS;
  for (uint32_t m = 0; m < P; m++)
    if (!ns[m] || ns[m] > OUTLIER * median)
      ns[m] = !ns[m] ? median : OUTLIER * median;
  free(sorted);
  return ns;
}

/* The chunks the schedule touches that the plan never moves: kept where it starts them. */
static bool keep_fixes(const struct device *d, struct plan_exec *st)
{
  uint32_t n = psp_schedule_chunks(st->sched);
  uint8_t *kind = calloc(n ? n : 1, 1); /* 1: moved by the plan, 2: on the GPU at the start */
  st->fixes = malloc((n ? n : 1) * sizeof *st->fixes);
  if (!kind || !st->fixes) {
    free(kind);
    return false;
  }
  for (size_t i = 0; i < st->plan.n_moves; i++)
    kind[st->plan.moves[i].chunk] = 1;
  for (size_t i = 0; i < st->plan.n_start; i++)
    kind[st->plan.start[i]] |= 2;
  for (uint32_t c = 0; c < n; c++)
    if (!(kind[c] & 1) && psp_schedule_chunk_bytes(st->sched, c)) {
      uint32_t first = (uint32_t)(psp_next_use(st->sched, c, st->period - 1) - st->period);
      st->fixes[st->nfix++] = (psp_move){.chunk = c, .dir = kind[c] ? PSP_TO_GPU : PSP_TO_HOST, .need = first,
                                         .bytes = d->chunk_size};
    }
  free(kind);
  return true;
}

/* Chunks whose span is not the one of their last touch any more were emptied after it: they
 * hold nothing live until their first touch of the next iteration. */
static bool empty_across_end(const struct device *d, struct plan_exec *st)
{
  uint32_t n = psp_schedule_chunks(st->sched);
  for (uint32_t c = 0; c < n; c++) {
    const struct seen *w = &st->seen[c];
    if (w->n && d->chunks[c].span != w->span && psp_schedule_empty(st->sched, c, w->last_touch, w->first_touch))
      return false;
  }
  return true;
}

/* The recorded iteration is over: the plan for it, once. */
static void make_plan(struct device *d, struct plan_exec *st)
{
  uint64_t start = psa_now_ns(), P = st->period;
  uint64_t *ns = NULL;
  bool ok = open_to(st, P - 1, 0) && empty_across_end(d, st) && psp_schedule_seal(st->sched) == 0 &&
            (ns = durations(st, start));
  if (ok) {
    /* The frames chunks outside the iteration hold on the GPU are not the plan's. */
    uint64_t frames = d->fr.gpu_limit;
    uint32_t n = psp_schedule_chunks(st->sched);
    for (uint64_t i = 0; i < d->space.chunks_high; i++)
      if (on_gpu(d, i) && (i >= n || !psp_schedule_chunk_bytes(st->sched, (uint32_t)i)) && frames)
        frames--;
    /* Lag 0: the owner waits for the GPU to pass a victim's last use itself (owner.c). */
    psp_costs costs = {.h2d = PSP_PCIE_H2D, .d2h = PSP_PCIE_D2H, .both = PSP_PCIE_BOTH,
                       .in_place = PSP_PCIE_IN_PLACE,
                       .moment_ns = ns, .default_ns = DEFAULT_MOMENT_NS, .lag = 0};
    ok = psp_plan_make(st->sched, frames * d->chunk_size, &costs, &st->plan) == 0 && keep_fixes(d, st);
  }
  free(ns);
  d->stats.plan_builds++;
  d->stats.plan_build_ns += psa_now_ns() - start;
  if (!ok) {
    ps_log(PS_LOG_WARN, "the plan for device %d's iteration could not be made: nothing is paged ahead of use",
           d->ordinal);
    st->phase = FAILED;
    return;
  }
  d->stats.plan_bytes_in = st->plan.bytes_in;
  d->stats.plan_bytes_out = st->plan.bytes_out;
  d->stats.plan_bytes_in_place = st->plan.bytes_in_place;
  st->phase = FOLLOWING;
  atomic_store(&d->pager->owner_due, true); /* the next launch to exit starts the owner */
}

/* The plan's state for the device at this period; NULL when there is none to keep. */
static struct plan_exec *state(struct device *d, uint64_t period, uint64_t position)
{
  struct plan_exec *st = &execs[d->ordinal];
  if (!period)
    return NULL; /* distrusted for now: a plan made for the period stays */
  if (period != st->period) {
    forget(d, st);
    st->period = period;
  }
  advance(st, position);
  if (st->phase == WAITING && st->now / period >= st->lap) {
    st->lap = st->now / period;
    st->sched = psp_schedule_new();
    st->begun = calloc(period, sizeof *st->begun);
    st->seen = calloc(d->nchunks, sizeof *st->seen);
    st->phase = st->sched && st->begun && st->seen ? RECORDING : FAILED;
  }
  if (st->phase == RECORDING && st->now / period > st->lap)
    make_plan(d, st);
  return st;
}

void psa_plan_note(struct device *d, uint64_t chunk, uint64_t period, uint64_t position)
{
  struct plan_exec *st = state(d, period, position);
  if (!st || st->phase != RECORDING || st->now % period != position)
    return; /* a straggler of a moment already past is not recorded */
  if (!open_to(st, position, psa_now_ns()) || psp_schedule_chunk(st->sched, (uint32_t)chunk, d->chunk_size) ||
      psp_schedule_touch(st->sched, (uint32_t)chunk, true)) { /* every touch counted a write */
    st->phase = FAILED;
    return;
  }
  const struct span *s = d->chunks[chunk].span;
  struct seen *w = &st->seen[chunk];
  if (!w->n)
    w->first_touch = (uint32_t)position;
  else if (w->span != s && w->last_touch < position &&
           psp_schedule_empty(st->sched, (uint32_t)chunk, w->last_touch, (uint32_t)position))
    st->phase = FAILED;
  *w = (struct seen){s->first_chunk, s->nchunks, s, w->n ? w->first_touch : (uint32_t)position, (uint32_t)position};
}

void psa_plan_own(struct device *d, uint64_t period, uint64_t position, uint64_t moment)
{
  PSA_HELD(d);
  struct plan_exec *st = &execs[d->ordinal];
  if (!atomic_exchange(&d->pager->owner_due, false) || st->phase != FOLLOWING || period != st->period ||
      atomic_load(&psa_moves_off))
    return;
  if (!st->plan.n_moves && !st->nfix)
    return; /* the iteration fits: no owner, no waits */
  psa_owner_follow(d, st->sched, &st->plan, st->fixes, st->nfix, moment + 1, moment - position, period);
}
