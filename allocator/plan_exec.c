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
 * The recorded iteration's allocations are recalled: each is known by the moment after
 * which it came and its rank among that moment's allocations, and in the iterations that
 * follow the same allocation goes to the same address where its bytes are free (alloc.c),
 * so the plan's chunks hold the same tensors every iteration and its moves stay about them.
 * One that cannot is placed as any other: the plan's moves for it miss, the owner serves
 * the launch that names it on demand.
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

/* An allocation of the recorded iteration: its key (alloc_key), size and address. */
struct recalled {
  uint64_t key, size;
  CUdeviceptr ptr;
};

/* One iteration recorded: its touches as a schedule, and its allocations. */
struct record {
  psp_schedule *sched; /* NULL: none */
  uint64_t *begun;     /* by position: when its first touch came (ns), 0 when none did */
  uint32_t opened;     /* moments of sched opened */
  struct seen *seen;   /* by chunk */
  struct recalled *allocs; /* by key once a plan is made of it */
  size_t nallocs, cap;
  uint64_t misses; /* its allocations not placed where the plan followed meanwhile recalled them */
};

/* RECORDING: the first iteration is being recorded. FOLLOWING: a plan is made, its owner
 * follows it, and another iteration may be recorded beside (`rec`) where allocations did
 * not land where recalled: the layout moves while tensors that live across the iteration's
 * end settle at their recalled addresses, and a plan of chunks that then hold other data
 * moves the wrong chunks. */
struct plan_exec {
  uint64_t period;
  enum phase phase;
  bool started;      /* a position has come */
  uint64_t now;      /* the latest absolute moment seen: lap * period + position */
  uint64_t lap;      /* the lap recorded (rec), or the first that may be */
  struct record rec;  /* the iteration being recorded */
  struct record used; /* the one the plan was made of (its schedule and allocations) */
  psp_plan plan;
  psp_move *fixes;   /* the chunks the plan never moves, where it keeps them */
  size_t nfix;
  uint64_t lap_allocs, lap_misses; /* FOLLOWING: this lap's keyed allocations, and those not recalled */
  uint32_t records;                /* iterations recorded after the first */
  uint64_t alloc_entered, alloc_rank, alloc_key; /* the latest allocation's (alloc_key) */
  bool alloc_keyed;                              /* ... and whether it has a key */
};

#define MAX_RECORDS 8 /* iterations recorded again, at most, for a layout that settles */

static struct plan_exec execs[PSA_MAX_DEVICES]; /* by ordinal, under the device's lock */

/* The latest launch to enter on any thread (psa_plan_entered): its absolute moment's low 32
 * bits above its position + 1 (positions stay far below 2^32); 0 before any. */
static _Atomic uint64_t entered;

static void record_free(struct record *r)
{
  psp_schedule_free(r->sched);
  free(r->begun);
  free(r->seen);
  free(r->allocs);
  memset(r, 0, sizeof *r);
}

/* Stops following the plan (its owner first: it reads the plan) and lets it go. */
static void drop_plan(struct device *d, struct plan_exec *st)
{
  if (st->phase == FOLLOWING)
    psa_owner_stop(d);
  atomic_store(&d->pager->owner_due, false);
  psp_plan_free(&st->plan);
  free(st->fixes);
  st->fixes = NULL;
  st->nfix = 0;
  record_free(&st->used);
}

static void forget(struct device *d, struct plan_exec *st)
{
  drop_plan(d, st);
  record_free(&st->rec);
  memset(st, 0, sizeof *st);
}

/* Records the iteration at lap `lap` (false without memory). */
static bool record_start(const struct device *d, struct plan_exec *st, uint64_t lap)
{
  struct record *r = &st->rec;
  st->lap = lap;
  r->sched = psp_schedule_new();
  r->begun = calloc(st->period, sizeof *r->begun);
  r->seen = calloc(d->nchunks, sizeof *r->seen);
  if (r->sched && r->begun && r->seen)
    return true;
  record_free(r);
  return false;
}

static bool recording(const struct plan_exec *st) { return st->rec.sched && st->now / st->period == st->lap; }

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
static bool open_to(struct record *r, uint64_t position, uint64_t ns)
{
  for (; r->opened <= position; r->opened++)
    if (psp_schedule_moment(r->sched, 0))
      return false;
  if (!r->begun[position])
    r->begun[position] = ns;
  return true;
}

static int by_value(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static int by_key(const void *a, const void *b)
{
  const struct recalled *x = a, *y = b;
  if (x->key != y->key)
    return (x->key > y->key) - (x->key < y->key);
  return (x->ptr > y->ptr) - (x->ptr < y->ptr);
}

/* Each moment's duration from when the moments began: a moment no touch stamped shares the
 * time of the stamped one before it, those before the first stamped one last the median,
 * and none lasts more than OUTLIER medians. `end`: when the iteration ended. NULL without
 * memory. */
static uint64_t *durations(const struct plan_exec *st, uint64_t end)
{
  uint32_t P = (uint32_t)st->period;
  const uint64_t *begun = st->rec.begun;
  uint64_t *ns = calloc(P, sizeof *ns), *sorted = malloc(P * sizeof *sorted);
  if (!ns || !sorted) {
    free(ns);
    free(sorted);
    return NULL;
  }
  for (uint32_t m = 0, k; m < P; m = k) {
    for (k = m + 1; k < P && !begun[k]; k++)
      ;
    uint64_t from = begun[m], to = k < P ? begun[k] : end;
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

/* The chunks the schedule touches that the plan never moves: kept where it starts them.
 * NULL without memory. */
static psp_move *keep_fixes(const struct device *d, const psp_schedule *sched, const psp_plan *plan,
                            uint64_t period, size_t *nfix)
{
  uint32_t n = psp_schedule_chunks(sched);
  uint8_t *kind = calloc(n ? n : 1, 1); /* 1: moved by the plan, 2: on the GPU at the start */
  psp_move *fixes = malloc((n ? n : 1) * sizeof *fixes);
  if (!kind || !fixes) {
    free(kind);
    free(fixes);
    return NULL;
  }
  for (size_t i = 0; i < plan->n_moves; i++)
    kind[plan->moves[i].chunk] = 1;
  for (size_t i = 0; i < plan->n_start; i++)
    kind[plan->start[i]] |= 2;
  *nfix = 0;
  for (uint32_t c = 0; c < n; c++)
    if (!(kind[c] & 1) && psp_schedule_chunk_bytes(sched, c)) {
      uint32_t first = (uint32_t)(psp_next_use(sched, c, period - 1) - period);
      fixes[(*nfix)++] = (psp_move){.chunk = c, .dir = kind[c] ? PSP_TO_GPU : PSP_TO_HOST, .need = first,
                                    .bytes = d->chunk_size};
    }
  free(kind);
  return fixes;
}

/* Chunks whose span is not the one of their last touch any more were emptied after it: they
 * hold nothing live until their first touch of the next iteration. */
static bool empty_across_end(const struct device *d, struct record *r)
{
  uint32_t n = psp_schedule_chunks(r->sched);
  for (uint32_t c = 0; c < n; c++) {
    const struct seen *w = &r->seen[c];
    if (w->n && d->chunks[c].span != w->span && psp_schedule_empty(r->sched, c, w->last_touch, w->first_touch))
      return false;
  }
  return true;
}

/* The recorded iteration is over: the plan for it, in place of the one followed (if any).
 * A plan that cannot be made leaves the one followed; with none, nothing is paged ahead. */
static void make_plan(struct device *d, struct plan_exec *st)
{
  uint64_t start = psa_now_ns(), P = st->period;
  uint64_t *ns = NULL;
  struct record *r = &st->rec;
  psp_plan plan = {0};
  psp_move *fixes = NULL;
  size_t nfix = 0;
  bool ok = open_to(r, P - 1, 0) && empty_across_end(d, r) && psp_schedule_seal(r->sched) == 0 &&
            (ns = durations(st, start));
  if (ok) {
    /* The frames chunks outside the iteration hold on the GPU are not the plan's. */
    uint64_t frames = d->fr.gpu_limit;
    uint32_t n = psp_schedule_chunks(r->sched);
    for (uint64_t i = 0; i < d->space.chunks_high; i++)
      if (on_gpu(d, i) && (i >= n || !psp_schedule_chunk_bytes(r->sched, (uint32_t)i)) && frames)
        frames--;
    /* Lag 0: the owner waits for the GPU to pass a victim's last use itself (owner.c). */
    psp_costs costs = {.h2d = PSP_PCIE_H2D, .d2h = PSP_PCIE_D2H, .both = PSP_PCIE_BOTH,
                       .in_place = PSP_PCIE_IN_PLACE,
                       .moment_ns = ns, .default_ns = DEFAULT_MOMENT_NS, .lag = 0};
    ok = psp_plan_make(r->sched, frames * d->chunk_size, &costs, &plan) == 0 &&
         (fixes = keep_fixes(d, r->sched, &plan, P, &nfix));
  }
  free(ns);
  d->stats.plan_builds++;
  d->stats.plan_build_ns += psa_now_ns() - start;
  if (!ok) {
    psp_plan_free(&plan);
    record_free(r);
    if (st->phase == FOLLOWING)
      return;
    ps_log(PS_LOG_WARN, "the plan for device %d's iteration could not be made: nothing is paged ahead of use",
           d->ordinal);
    st->phase = FAILED;
    return;
  }
  drop_plan(d, st);
  free(r->begun);
  free(r->seen);
  r->begun = NULL;
  r->seen = NULL;
  if (r->nallocs)
    qsort(r->allocs, r->nallocs, sizeof *r->allocs, by_key);
  st->used = *r;
  memset(r, 0, sizeof *r);
  st->plan = plan;
  st->fixes = fixes;
  st->nfix = nfix;
  st->lap_allocs = st->lap_misses = 0;
  d->stats.plan_bytes_in = plan.bytes_in;
  d->stats.plan_bytes_out = plan.bytes_out;
  d->stats.plan_bytes_in_place = plan.bytes_in_place;
  st->phase = FOLLOWING;
  atomic_store(&d->pager->owner_due, true); /* the next launch to exit starts the owner */
}

/* At most 1% of a lap's allocations not where recalled: the layout has settled. */
static bool settled(uint64_t allocs, uint64_t misses) { return misses <= allocs / 100; }

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
  uint64_t lap_was = st->started ? st->now / period : 0;
  advance(st, position);
  uint64_t lap = st->now / period;
  if (st->phase == WAITING && lap >= st->lap)
    st->phase = record_start(d, st, lap) ? RECORDING : FAILED;
  if (st->rec.sched && lap > st->lap) {
    if (st->phase != FOLLOWING || settled(st->rec.nallocs, st->rec.misses))
      make_plan(d, st);
    else
      record_free(&st->rec);
  }
  /* A lap whose allocations went elsewhere than recalled: the next one is recorded, and
   * planned once its own allocations land where recalled. */
  if (st->phase == FOLLOWING && lap > lap_was) {
    if (!st->rec.sched && !settled(st->lap_allocs, st->lap_misses) && st->records < MAX_RECORDS &&
        record_start(d, st, lap))
      st->records++;
    st->lap_allocs = st->lap_misses = 0;
  }
  return st;
}

void psa_plan_note(struct device *d, uint64_t chunk, uint64_t period, uint64_t position)
{
  struct plan_exec *st = state(d, period, position);
  if (!st || !recording(st) || st->now % period != position)
    return; /* a straggler of a moment already past is not recorded */
  struct record *r = &st->rec;
  const struct span *s = d->chunks[chunk].span;
  struct seen *w = &r->seen[chunk];
  if (!open_to(r, position, psa_now_ns()) || psp_schedule_chunk(r->sched, (uint32_t)chunk, d->chunk_size) ||
      psp_schedule_touch(r->sched, (uint32_t)chunk, true) || /* every touch counted a write */
      (w->n && w->span != s && w->last_touch < position &&
       psp_schedule_empty(r->sched, (uint32_t)chunk, w->last_touch, (uint32_t)position))) {
    record_free(r);
    if (st->phase == RECORDING)
      st->phase = FAILED;
    return;
  }
  if (!w->n)
    w->first_touch = (uint32_t)position;
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
  psa_owner_follow(d, st->used.sched, &st->plan, st->fixes, st->nfix, moment + 1, moment - position, period);
}

void psa_plan_entered(uint64_t position, uint64_t moment)
{
  atomic_store_explicit(&entered, (moment & 0xffffffffu) << 32 | (position + 1), memory_order_relaxed);
}

/* The allocation being placed, known by the position of the latest launch to enter and its
 * rank among the allocations since that launch entered (key: position << 24 | rank); false
 * when no launch of a trusted period has entered yet. */
static bool alloc_key(struct plan_exec *st)
{
  uint64_t e = atomic_load_explicit(&entered, memory_order_relaxed), position = (e & 0xffffffffu) - 1;
  st->alloc_keyed = (e & 0xffffffffu) && st->period && position < st->period;
  if (!st->alloc_keyed)
    return false;
  st->alloc_rank = e == st->alloc_entered ? st->alloc_rank + 1 : 0;
  st->alloc_entered = e;
  st->alloc_key = position << 24 | (st->alloc_rank < 0xffffff ? st->alloc_rank : 0xffffff);
  return true;
}

/* The plan's iteration's allocation of that key, NULL if none. */
static struct recalled *find_alloc(struct plan_exec *st, uint64_t key)
{
  size_t lo = 0, hi = st->used.nallocs;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (st->used.allocs[mid].key < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < st->used.nallocs && st->used.allocs[lo].key == key ? &st->used.allocs[lo] : NULL;
}

CUdeviceptr psa_plan_recall(struct device *d, uint64_t size)
{
  PSA_HELD(d);
  struct plan_exec *st = &execs[d->ordinal];
  if (!alloc_key(st) || st->phase != FOLLOWING)
    return 0;
  const struct recalled *r = find_alloc(st, st->alloc_key);
  return r && r->size == size ? r->ptr : 0;
}

void psa_plan_placed(struct device *d, CUdeviceptr ptr, uint64_t size, bool recalled)
{
  PSA_HELD(d);
  struct plan_exec *st = &execs[d->ordinal];
  if (!st->alloc_keyed)
    return;
  bool missed = false;
  if (st->phase == FOLLOWING) {
    /* One not recalled is recalled where it went next time: the layout heals lap by lap. */
    struct recalled *r = recalled ? NULL : find_alloc(st, st->alloc_key);
    missed = r != NULL;
    if (r)
      *r = (struct recalled){r->key, size, ptr};
    d->stats.recalled_allocs += recalled;
    d->stats.recall_misses += missed;
    st->lap_allocs++;
    st->lap_misses += missed;
  }
  /* Recorded where the plan's clock stands at the allocation's own position: a lap's first
   * launch entering before any touch of it moved the clock is left out, as it is left out
   * at the lap's start. */
  struct record *rec = &st->rec;
  if (!recording(st) || st->alloc_entered != atomic_load(&entered) || (st->alloc_key >> 24) != st->now % st->period)
    return;
  rec->misses += missed;
  if (rec->nallocs == rec->cap) {
    size_t cap = rec->cap ? 2 * rec->cap : 256;
    struct recalled *a = realloc(rec->allocs, cap * sizeof *a);
    if (!a)
      return; /* not recalled: placed as any other */
    rec->allocs = a;
    rec->cap = cap;
  }
  rec->allocs[rec->nallocs++] = (struct recalled){st->alloc_key, size, ptr};
}
