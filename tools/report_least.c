/* LEAST TRAFFIC: a lower bound on the bytes any placement must bring onto the GPU.
 *
 * Take any stretch of the window's launches. What they read that already held data when
 * the stretch began (parameters, optimizer state, activations saved earlier) was either on
 * the GPU then, and the GPU holds at most the budget, or it crossed PCIe during the
 * stretch, paged in or read in place. So the stretch brings in at least its data read less
 * the budget, whatever the pager does, and disjoint stretches add up. The bound is the
 * best sum over cuts of the window into stretches, found by dynamic programming over at
 * most MAX_CUTS cut points. A kernel named a pointer into an allocation is taken to read
 * all of it (the trace does not say how much it read), and what a launch writes first is
 * taken to cost nothing: it may be born where it is. */
#include <stdlib.h>
#include <string.h>

#include "tools/report.h"

#define MAX_CUTS 1024 /* cut points considered: O(cuts x touches) time, O(cuts) memory */

/* Moment index of cut point k of ncuts over n moments (0 and n at the ends). */
static size_t cut_at(size_t k, size_t ncuts, size_t n) {
  return (size_t)((unsigned long long)k * n / ncuts);
}

/* best[b]: the bound for budgets[b], over moments [0, n). */
bool rp_least_bound(const struct rp_accesses *a, const uint64_t *budgets, size_t nb, uint64_t *best,
                    uint64_t *read_all) {
  const size_t n = a->nmoments, ncuts = n < MAX_CUTS ? n : MAX_CUTS;
  uint64_t *at = calloc((ncuts + 1) * nb, sizeof *at); /* at[k * nb + b]: best bound up to cut k */
  uint32_t *seen = calloc(a->nallocs ? a->nallocs : 1, sizeof *seen); /* stamp: counted from cut i */
  if (!at || !seen) {
    free(at);
    free(seen);
    return false;
  }
  *read_all = 0;
  for (size_t i = 0; i < ncuts; i++) { /* at[i] is final: every stretch ending at cut i was tried */
    const size_t start = cut_at(i, ncuts, n);
    uint64_t read = 0;
    for (size_t k = i + 1; k <= ncuts; k++) {
      for (size_t m = cut_at(k - 1, ncuts, n); m < cut_at(k, ncuts, n); m++)
        for (size_t u = a->first[m]; u < a->first[m + 1]; u++) {
          const uint32_t alloc = a->touch[u];
          if (seen[alloc] != i + 1 && a->alloc[alloc].holds_from < (int64_t)start) {
            seen[alloc] = (uint32_t)(i + 1);
            read += a->alloc[alloc].size;
          }
        }
      if (i == 0 && k == ncuts) *read_all = read;
      for (size_t b = 0; b < nb; b++) {
        const uint64_t v = at[i * nb + b] + (read > budgets[b] ? read - budgets[b] : 0);
        if (v > at[k * nb + b]) at[k * nb + b] = v;
      }
    }
  }
  for (size_t b = 0; b < nb; b++) best[b] = at[ncuts * nb + b];
  free(at);
  free(seen);
  return true;
}

bool rp_least_traffic(const struct rp_trace *t, const struct rp_accesses *a, const uint64_t *budgets, size_t nb,
                      FILE *out) {
  fprintf(out, "\nLEAST TRAFFIC (a lower bound for any placement; MB = 10^6 bytes)\n");
  if (!a->matched || !nb) {
    fprintf(out, "  nothing to bound: %s\n", !nb ? "no GPU budget recorded (give --least=SIZES)"
                                                 : "no launch pointer falls inside an ALLOC'd range");
    return true;
  }
  uint64_t *best = calloc(nb, sizeof *best), read_all = 0, paged_in = 0;
  if (!best || !rp_least_bound(a, budgets, nb, best, &read_all)) {
    free(best);
    fprintf(stderr, "psshim-report: out of memory\n");
    return false;
  }
  for (size_t i = 0; i < t->nev; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type == PST_REC_MIGRATION && r->migration.direction == PST_DIR_H2D && r->ts_ns >= a->from &&
        r->ts_ns < a->to)
      paged_in += r->migration.bytes;
  }
  char b1[32];
  fprintf(out, "  %s: %llu launches read %.1f MB of data they did not write first\n", a->window,
          (unsigned long long)a->launches, (double)read_all / 1e6);
  fprintf(out, "  at least onto the GPU, paged in or read in place, whatever the placement:\n");
  for (size_t b = 0; b < nb; b++)
    fprintf(out, "    GPU budget %10s  %12.1f MB\n", rp_bytes(budgets[b], b1, sizeof b1), (double)best[b] / 1e6);
  fprintf(out, "  this run paged in %.1f MB then; its in-place reads are not recorded (see the sites' in place lines)\n",
          (double)paged_in / 1e6);
  free(best);
  return true;
}
