/* Victim choice: OPT/Belady from the schedule or from predicted next uses, LRU without
 * either; one tie-break for all. */
#include "policy/internal.h"

#include <stdlib.h>

bool psp_evicts_before(const psp_cand *a, uint64_t rank_a, const psp_cand *b, uint64_t rank_b)
{
  if (rank_a != rank_b) return rank_a > rank_b;
  if (a->dirty != b->dirty) return !a->dirty;  /* a clean chunk leaves without a copy */
  if (a->bytes != b->bytes) return a->bytes > b->bytes;  /* frees more at once */
  return a->chunk < b->chunk;  /* deterministic, so replays are reproducible */
}

ptrdiff_t psp_victim_opt(const psp_schedule *s, uint64_t now, const psp_cand *cands, size_t n)
{
  ptrdiff_t best = -1;
  uint64_t best_rank = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t next = psp_use_from(s, cands[i].chunk, now);
    if (next == now) continue;  /* the running moment needs it */
    if (best < 0 || psp_evicts_before(&cands[i], next, &cands[best], best_rank)) {
      best = (ptrdiff_t)i;
      best_rank = next;
    }
  }
  return best;
}

ptrdiff_t psp_victim_lru(uint64_t now, const psp_cand *cands, size_t n)
{
  ptrdiff_t best = -1;
  uint64_t best_rank = 0;
  for (size_t i = 0; i < n; i++) {
    if (cands[i].last_use >= now) continue;  /* touched by the running moment */
    uint64_t age = now - cands[i].last_use;
    if (best < 0 || psp_evicts_before(&cands[i], age, &cands[best], best_rank)) {
      best = (ptrdiff_t)i;
      best_rank = age;
    }
  }
  return best;
}

static int farthest_first(const void *a, const void *b)
{
  const psp_cand *x = a, *y = b;
  if (psp_evicts_before(x, x->next_use, y, y->next_use))
    return -1;
  return psp_evicts_before(y, y->next_use, x, x->next_use) ? 1 : 0;
}

static void swap_cands(psp_cand *a, psp_cand *b)
{
  psp_cand t = *a;
  *a = *b;
  *b = t;
}

/* Quickselect: afterwards cands[0..k) are the k first in eviction order (unsorted). The
 * order is total (chunk ids differ), so a plain two-way partition suffices. */
static void select_first(psp_cand *cands, size_t n, size_t k)
{
  size_t lo = 0, hi = n;
  while (hi - lo > 1) {
    swap_cands(&cands[lo + (hi - lo) / 2], &cands[hi - 1]); /* middle pivot: sorted input stays linear */
    size_t store = lo;
    for (size_t i = lo; i < hi - 1; i++)
      if (farthest_first(&cands[i], &cands[hi - 1]) < 0)
        swap_cands(&cands[i], &cands[store++]);
    swap_cands(&cands[store], &cands[hi - 1]); /* the pivot, at its final place */
    if (store == k || store + 1 == k)
      return;
    if (store < k)
      lo = store + 1;
    else
      hi = store;
  }
}

void psp_sort_farthest(psp_cand *cands, size_t n, size_t k)
{
  if (k < n)
    select_first(cands, n, k);
  else
    k = n;
  if (k > 1)
    qsort(cands, k, sizeof *cands, farthest_first);
}

size_t psp_uses_within(const uint64_t *uses, size_t n, uint64_t now, uint64_t period)
{
  size_t within = 0;
  for (size_t i = 0; i < n; i++)
    within += uses[i] && uses[i] <= now && now - uses[i] < period;
  return within;
}

bool psp_fetch_pays(size_t uses, uint64_t use_ns, uint64_t move_ns)
{
  return (uint64_t)uses * use_ns > 2 * move_ns;
}

bool psp_swap_pays(size_t uses_in, size_t uses_out, uint64_t use_ns, uint64_t move_ns)
{
  return uses_in > uses_out && (uint64_t)(uses_in - uses_out) * use_ns > 4 * move_ns;
}

uint64_t psp_predict_next(const uint64_t *uses, size_t n, uint64_t now, uint64_t period)
{
  if (!period)
    return PSP_NEVER;
  uint64_t first = PSP_NEVER;
  size_t within = 0;
  for (size_t i = 0; i < n; i++)
    if (uses[i] && uses[i] <= now && now - uses[i] < period) {
      within++;
      if (uses[i] < first)
        first = uses[i];
    }
  if (!within)
    return PSP_NEVER;    /* untouched for a whole iteration */
  if (within == n)
    return now + 1;      /* more uses per iteration than remembered: treat as always due */
  return first + period; /* the earliest use of the last iteration, one period on */
}

static size_t phase_of(uint64_t now, uint64_t period) { return (size_t)(now % period * PSP_PHASES / period); }

void psp_phase_note(psp_phase_max *m, uint64_t now, uint64_t period, uint64_t value)
{
  if (!period)
    return;
  if (m->period != period)
    *m = (psp_phase_max){.period = period};
  size_t i = phase_of(now, period);
  uint64_t lap = now / period + 1;
  if (m->lap[i] != lap) {
    m->lap[i] = lap;
    m->max[i] = value;
  } else if (value > m->max[i]) {
    m->max[i] = value;
  }
}

uint64_t psp_phase_ahead(const psp_phase_max *m, uint64_t now, uint64_t window)
{
  if (!m->period)
    return 0;
  uint64_t span = window >= m->period ? PSP_PHASES : (window * PSP_PHASES + m->period - 1) / m->period + 1;
  uint64_t ahead = 0, anywhere = 0;
  bool seen = false;
  for (size_t i = 0; i < PSP_PHASES; i++)
    if (m->lap[i] && m->max[i] > anywhere)
      anywhere = m->max[i];
  for (uint64_t j = 0, first = phase_of(now, m->period); j < span && j < PSP_PHASES; j++) {
    size_t i = (first + j) % PSP_PHASES;
    if (m->lap[i]) {
      seen = true;
      if (m->max[i] > ahead)
        ahead = m->max[i];
    }
  }
  return seen ? ahead : anywhere;
}
