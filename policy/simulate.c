/* Offline replay: demand paging (a moment's chunks are paged in as it runs, evicting by the
 * policy until they fit) or static placement, counting the traffic each would cause. */
#include <stdlib.h>
#include <string.h>

#include "policy/internal.h"

#define NOT_RESIDENT UINT32_MAX

typedef struct sim {
  const psp_schedule *s;
  psp_policy policy;
  psp_cand *state;     /* by chunk id: bytes, last_use, dirty */
  uint32_t *where;     /* by chunk id: index in resident[], or NOT_RESIDENT */
  uint32_t *resident;  /* chunks holding GPU frames */
  uint32_t n_resident;
  psp_cand *cands;     /* scratch: the residents, for the victim choice */
  uint64_t used;       /* bytes of GPU frames held */
  psp_sim *out;
} sim;

static void page_in(sim *x, uint32_t c, bool written)
{
  x->out->page_ins++;
  x->out->bytes_in += x->state[c].bytes;
  x->state[c].dirty = written;
  x->where[c] = x->n_resident;
  x->resident[x->n_resident++] = c;
  x->used += x->state[c].bytes;
}

/* Evicts the policy's victim among chunks not in use at now; false when there is none. */
static bool evict_one(sim *x, uint64_t now)
{
  for (uint32_t k = 0; k < x->n_resident; k++) x->cands[k] = x->state[x->resident[k]];
  ptrdiff_t v = x->policy == PSP_POLICY_OPT ? psp_victim_opt(x->s, now, x->cands, x->n_resident)
                                            : psp_victim_lru(now, x->cands, x->n_resident);
  if (v < 0) return false;
  psp_cand *st = &x->state[x->cands[v].chunk];
  if (st->dirty) {
    x->out->page_outs++;
    x->out->bytes_out += st->bytes;
  } else {
    x->out->drops++;
  }
  uint32_t k = x->where[st->chunk], last = x->resident[--x->n_resident];
  x->resident[k] = last;
  x->where[last] = k;
  x->where[st->chunk] = NOT_RESIDENT;
  x->used -= st->bytes;
  return true;
}

int psp_simulate(const psp_schedule *s, uint64_t budget, psp_policy policy,
                 uint32_t iterations, psp_sim *out)
{
  memset(out, 0, sizeof *out);
  uint32_t n = psp_schedule_chunks(s), period = psp_schedule_period(s);
  size_t alloc = n ? n : 1;
  sim x = {
      .s = s,
      .policy = policy,
      .state = calloc(alloc, sizeof *x.state),
      .where = malloc(alloc * sizeof *x.where),
      .resident = malloc(alloc * sizeof *x.resident),
      .cands = malloc(alloc * sizeof *x.cands),
      .out = out,
  };
  bool *decided = calloc(alloc, sizeof *decided);  /* STATIC: first touch has placed it */
  if (!x.state || !x.where || !x.resident || !x.cands || !decided) {
    free(x.state);
    free(x.where);
    free(x.resident);
    free(x.cands);
    free(decided);
    return -1;
  }
  for (uint32_t c = 0; c < n; c++) {
    x.state[c] = (psp_cand){.chunk = c, .bytes = psp_schedule_chunk_bytes(s, c)};
    x.where[c] = NOT_RESIDENT;
  }
  uint64_t peak = psp_schedule_margin(s, 0, period);
  uint64_t static_room = budget > peak ? budget - peak : 0;

  for (uint64_t m = 0; m < (uint64_t)iterations * period; m++) {
    const psp_use *uses;
    size_t n_uses = psp_schedule_uses(s, m, &uses);
    uint64_t nonmodel = psp_schedule_nonmodel(s, m);
    uint64_t room = policy == PSP_POLICY_STATIC ? static_room
                    : budget > nonmodel         ? budget - nonmodel
                                                : 0;
    uint64_t pinned = 0;  /* bytes of resident chunks this moment uses: not evictable */
    for (size_t i = 0; i < n_uses; i++) {
      x.state[uses[i].chunk].last_use = m;  /* pins them for LRU before any eviction */
      if (x.where[uses[i].chunk] != NOT_RESIDENT) pinned += x.state[uses[i].chunk].bytes;
    }
    if (policy != PSP_POLICY_STATIC)
      while (x.used > room && evict_one(&x, m)) continue;  /* non-model memory grew */

    bool host = false;
    for (size_t i = 0; i < n_uses; i++) {
      uint32_t c = uses[i].chunk;
      uint64_t bytes = x.state[c].bytes;
      if (x.where[c] != NOT_RESIDENT) {
        x.state[c].dirty |= uses[i].written;
      } else if (policy == PSP_POLICY_STATIC) {
        if (!decided[c] && x.used + bytes <= room) {
          page_in(&x, c, uses[i].written);
        } else {
          host = true;
          out->bytes_in_place += bytes;
        }
        decided[c] = true;
      } else if (pinned + bytes > room) {
        host = true;  /* cannot fit beside what this moment already holds */
        out->bytes_in_place += bytes;
      } else {
        while (x.used + bytes > room && evict_one(&x, m)) continue;
        page_in(&x, c, uses[i].written);
        pinned += bytes;
      }
    }
    if (host) out->in_place_moments++;
  }

  free(x.state);
  free(x.where);
  free(x.resident);
  free(x.cands);
  free(decided);
  return 0;
}
