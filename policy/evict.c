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

void psp_sort_farthest(psp_cand *cands, size_t n)
{
  if (n > 1)
    qsort(cands, n, sizeof *cands, farthest_first);
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
