/* The recorded accesses of a window of the run: every LAUNCH's pointers mapped, through
 * ALLOC and FREE, to the allocations that held them. Shared by the chunk-size replay and
 * the least-traffic bound. */
#include <stdlib.h>
#include <string.h>

#include "tools/report.h"

/* Live allocations, sorted by address, to find the one holding an interior pointer. */
struct live { uint64_t addr, end; uint32_t alloc; };

static size_t live_find(const struct live *l, size_t n, uint64_t addr) {
  size_t lo = 0, hi = n; /* first entry with addr > the one sought */
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (l[mid].addr <= addr) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The allocation holding addr, or -1. */
static int64_t live_holder(const struct live *l, size_t n, uint64_t addr) {
  const size_t at = live_find(l, n, addr);
  return at == 0 || addr >= l[at - 1].end ? -1 : (int64_t)l[at - 1].alloc;
}

#define PUSH(arr, n, cap, val)                                               \
  do {                                                                       \
    if ((n) == (cap)) {                                                      \
      size_t c_ = (cap) ? (cap) * 2 : 1024;                                  \
      void *p_ = realloc((arr), c_ * sizeof *(arr));                         \
      if (!p_) goto oom;                                                     \
      (arr) = p_;                                                            \
      (cap) = c_;                                                            \
    }                                                                        \
    (arr)[(n)++] = (val);                                                    \
  } while (0)

void rp_accesses_free(struct rp_accesses *a) {
  free(a->alloc);
  free(a->ops);
  free(a->touch);
  free(a->first);
  memset(a, 0, sizeof *a);
}

/* The steady phase's last complete iteration (rp_steady_marks) when it has one (true); else
 * all of the run. */
static bool pick_window(const struct rp_trace *t, uint64_t *from, uint64_t *to, char *desc, size_t len) {
  size_t first, last, before = SIZE_MAX;
  if (rp_steady_marks(t, &first, &last))
    for (size_t i = first; i < last; i++)
      if (t->ev[i].type == PST_REC_ITERATION) before = i;
  if (before != SIZE_MAX) {
    *from = t->ev[before].ts_ns;
    *to = t->ev[last].ts_ns;
    snprintf(desc, len, "iteration %llu (the last complete one of the steady period)",
             (unsigned long long)t->ev[before].iteration.iteration);
    return true;
  }
  *from = 0;
  *to = UINT64_MAX;
  snprintf(desc, len, "the whole run");
  return false;
}

bool rp_accesses_gather(const struct rp_trace *t, struct rp_accesses *a) {
  size_t cap_alloc = 0, cap_ops = 0, cap_touch = 0, cap_first = 0, nfirst = 0, nlive = 0, cap_live = 0;
  struct live *live = NULL;
  memset(a, 0, sizeof *a);
  a->periodic = pick_window(t, &a->from, &a->to, a->window, sizeof a->window);
  for (size_t i = 0; i < t->nev; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type == PST_REC_ALLOC && r->alloc.size) {
      const uint32_t id = (uint32_t)a->nallocs;
      PUSH(a->alloc, a->nallocs, cap_alloc, ((struct rp_access_alloc){ r->alloc.size, INT64_MAX }));
      PUSH(a->ops, a->nops, cap_ops, ((struct rp_access_op){ id, false, r->ts_ns }));
      PUSH(live, nlive, cap_live, ((struct live){ 0 }));
      const size_t at = live_find(live, nlive - 1, r->alloc.addr);
      memmove(&live[at + 1], &live[at], (nlive - 1 - at) * sizeof *live);
      live[at] = (struct live){ r->alloc.addr, r->alloc.addr + r->alloc.size, id };
    } else if (r->type == PST_REC_FREE) {
      const size_t at = live_find(live, nlive, r->free.addr);
      if (at == 0 || live[at - 1].addr != r->free.addr) continue; /* not one of ours */
      PUSH(a->ops, a->nops, cap_ops, ((struct rp_access_op){ live[at - 1].alloc, true, r->ts_ns }));
      memmove(&live[at - 1], &live[at], (nlive - at) * sizeof *live);
      nlive--;
    } else if (r->type == PST_REC_LAUNCH && r->ts_ns < a->from) {
      for (uint32_t k = 0; k < r->launch.n; k++) { /* what holds data when the window opens */
        const int64_t alloc = live_holder(live, nlive, r->launch.ptrs[k]);
        if (alloc >= 0) a->alloc[alloc].holds_from = -1;
      }
    } else if (r->type == PST_REC_LAUNCH && r->ts_ns < a->to) {
      a->launches++;
      PUSH(a->first, nfirst, cap_first, a->ntouch);
      a->nmoments++;
      for (uint32_t k = 0; k < r->launch.n; k++) {
        const int64_t alloc = live_holder(live, nlive, r->launch.ptrs[k]);
        a->pointers++;
        if (alloc < 0) continue; /* not into an allocation */
        a->matched++;
        PUSH(a->touch, a->ntouch, cap_touch, (uint32_t)alloc);
        if (a->alloc[alloc].holds_from == INT64_MAX) a->alloc[alloc].holds_from = (int64_t)a->nmoments - 1;
      }
    }
  }
  PUSH(a->first, nfirst, cap_first, a->ntouch); /* the end of the last moment */
  free(live);
  return true;
oom:
  free(live);
  rp_accesses_free(a);
  fprintf(stderr, "psshim-report: out of memory\n");
  return false;
}
