/* Victim choice: OPT/Belady from the schedule, LRU without one, or by a rank the caller
 * gives (psp_sort_farthest); one tie-break for all. */
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
