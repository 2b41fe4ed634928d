/* The prefetch plan: walk the schedule forward from now and fetch each chunk that will be
 * needed, in order of need, evicting by OPT to make room. Every resident chunk's first use
 * from now is computed once: a chunk is protected at moment m exactly when that use is at
 * or before m, so sorting the residents in eviction order once lets evictions proceed from
 * the front of that order for the whole plan. */
#include <stdlib.h>

#include "policy/internal.h"

typedef struct ranked {
  const psp_cand *cand;
  uint64_t first_use;  /* at or after now */
} ranked;

static int by_eviction_order(const void *x, const void *y)
{
  const ranked *a = x, *b = y;
  if (psp_evicts_before(a->cand, a->first_use, b->cand, b->first_use)) return -1;
  if (psp_evicts_before(b->cand, b->first_use, a->cand, a->first_use)) return 1;
  return 0;
}

typedef struct plan {
  ranked *order;       /* residents at the start, best victim first */
  size_t n_order, next;  /* order[next ..] are still resident */
  bool *resident;      /* by chunk id, for the n_chunks ids the schedule knows */
  uint32_t n_chunks;
  uint64_t used, room;
  psp_op *ops;
  size_t cap, n_ops;
} plan;

static void evict_front(plan *p)
{
  const psp_cand *c = p->order[p->next].cand;
  p->ops[p->n_ops++] =
      (psp_op){.kind = PSP_OP_EVICT, .chunk = c->chunk, .next_use = p->order[p->next].first_use};
  p->used -= c->bytes;
  if (c->chunk < p->n_chunks) p->resident[c->chunk] = false;
  p->next++;
}

/* Evicts chunks first used after `deadline` until `need` more bytes fit, keeping one op
 * free for the fetch. Changes nothing and returns false when that cannot be done. */
static bool make_room(plan *p, uint64_t need, uint64_t deadline)
{
  uint64_t used = p->used;
  size_t k = p->next;
  while (used + need > p->room && k < p->n_order && p->order[k].first_use > deadline)
    used -= p->order[k++].cand->bytes;
  if (used + need > p->room || p->n_ops + (k - p->next) + 1 > p->cap) return false;
  while (p->next < k) evict_front(p);
  return true;
}

int psp_plan(const psp_schedule *s, const psp_plan_req *req, psp_op *ops, size_t cap,
             size_t *n_ops)
{
  *n_ops = 0;
  uint32_t n_chunks = psp_schedule_chunks(s);
  plan p = {
      .order = malloc((req->n_resident ? req->n_resident : 1) * sizeof *p.order),
      .n_order = req->n_resident,
      .resident = calloc(n_chunks ? n_chunks : 1, sizeof *p.resident),
      .n_chunks = n_chunks,
      .room = req->budget > req->margin ? req->budget - req->margin : 0,
      .ops = ops,
      .cap = cap,
  };
  if (!p.order || !p.resident) {
    free(p.order);
    free(p.resident);
    return -1;
  }
  for (size_t i = 0; i < req->n_resident; i++) {
    const psp_cand *c = &req->resident[i];
    p.order[i] = (ranked){.cand = c, .first_use = psp_use_from(s, c->chunk, req->now)};
    p.used += c->bytes;
    if (c->chunk < n_chunks) p.resident[c->chunk] = true;
  }
  qsort(p.order, p.n_order, sizeof *p.order, by_eviction_order);

  /* Non-model memory is about to grow: give back what it needs, as far as chunks not used
   * now allow. */
  while (p.used > p.room && p.next < p.n_order && p.order[p.next].first_use > req->now &&
         p.n_ops < p.cap)
    evict_front(&p);

  uint32_t period = psp_schedule_period(s);
  uint32_t window = req->window < period ? req->window : period;
  for (uint32_t w = 0; w < window; w++) {
    uint64_t m = req->now + w;
    const psp_use *uses;
    size_t n = psp_schedule_uses(s, m, &uses);
    for (size_t i = 0; i < n; i++) {
      uint32_t c = uses[i].chunk;
      uint64_t bytes = psp_schedule_chunk_bytes(s, c);
      if (p.resident[c] || (req->in_place && req->in_place[c]) || bytes > p.room) continue;
      if (!make_room(&p, bytes, m)) goto done;
      ops[p.n_ops++] = (psp_op){.kind = PSP_OP_FETCH, .chunk = c, .next_use = m};
      p.used += bytes;
      p.resident[c] = true;
    }
  }
done:
  *n_ops = p.n_ops;
  free(p.order);
  free(p.resident);
  return 0;
}
