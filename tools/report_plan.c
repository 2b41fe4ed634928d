/* PLAN: policy/'s steady plan (psp_plan_make) for the iteration LEAST TRAFFIC bounds, at
 * the run's budget and chunk size with a PCIe 5 link's copy rates: the bytes it copies, its
 * predicted step, and its late waits, beside the bound and what the run paged then. */
#include <stdlib.h>

#include "tools/report.h"

/* The trace holds no rates of its own: policy/'s measured PCIe 5 ones (PSP_PCIE_*). */
enum { DEFAULT_NS = 10000 }; /* a moment's duration when the trace has no launch times */

/* Each moment's duration: the time from its launch to the next one's (to the window's
 * end for the last). NULL when the launches do not match the moments, or out of memory. */
static uint64_t *launch_gaps(const struct rp_trace *t, const struct rp_accesses *a) {
  uint64_t *ns = calloc(a->nmoments + 1, sizeof *ns), prev = 0;
  size_t m = 0;
  for (size_t i = 0; ns && i < t->nev; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type != PST_REC_LAUNCH || r->ts_ns < a->from || r->ts_ns >= a->to) continue;
    if (m == a->nmoments) break;
    if (m) ns[m - 1] = r->ts_ns - prev;
    prev = r->ts_ns;
    m++;
  }
  if (!ns || m != a->nmoments || !m) {
    free(ns);
    return NULL;
  }
  ns[m - 1] = (a->to < t->t1 ? a->to : t->t1) - prev;
  return ns;
}

/* lag: a chunk moves only once the launches that used it have run, and the host runs up
 * to that many launches ahead of the GPU. */
bool rp_plan(const struct rp_trace *t, const struct rp_accesses *a, uint32_t lag, FILE *out) {
  const uint64_t budget = t->hdr.gpu_budget, chunk = t->hdr.chunk_size;
  fprintf(out, "\nPLAN (policy/'s steady plan for the same iteration at the run's budget; MB = 10^6 bytes)\n");
  if (!a->matched || !budget || !chunk || !a->periodic) {
    fprintf(out, "  nothing to plan: %s\n", !a->matched ? "no launch pointer falls inside an ALLOC'd range"
                                            : !a->periodic ? "no steady iteration to repeat"
                                                           : "no GPU budget or chunk size recorded");
    return true;
  }
  size_t chunks;
  uint64_t footprint, least = 0, read_all, paged[2] = { 0, 0 };
  psp_schedule *s = rp_schedule(a, chunk, &chunks, &footprint);
  uint64_t *gaps = s ? launch_gaps(t, a) : NULL;
  const psp_costs costs = { .h2d = PSP_PCIE_H2D, .d2h = PSP_PCIE_D2H, .both = PSP_PCIE_BOTH,
                            .in_place = PSP_PCIE_IN_PLACE, .moment_ns = gaps,
                            .default_ns = DEFAULT_NS, .lag = lag };
  psp_plan pl;
  bool ok = s && psp_plan_make(s, budget, &costs, &pl) == 0;
  if (ok && !rp_least_bound(a, &budget, 1, &least, &read_all)) {
    psp_plan_free(&pl);
    ok = false;
  }
  psp_schedule_free(s);
  free(gaps);
  if (!ok) {
    fprintf(stderr, "psshim-report: out of memory\n");
    return false;
  }
  for (size_t i = 0; i < t->nev; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type == PST_REC_MIGRATION && r->migration.direction < 2 && r->ts_ns >= a->from && r->ts_ns < a->to)
      paged[r->migration.direction] += r->migration.bytes;
  }
  char b1[32], b2[32];
  fprintf(out, "  %s: %zu moments, %zu chunks of %s (every touch a write), GPU budget %s\n", a->window, a->nmoments,
          chunks, rp_bytes(chunk, b1, sizeof b1), rp_bytes(budget, b2, sizeof b2));
  fprintf(out, "  plan     in %10.1f MB  out %10.1f MB  %zu moves; %u moments read %.1f MB in place\n",
          (double)pl.bytes_in / 1e6, (double)pl.bytes_out / 1e6, pl.n_moves, pl.in_place,
          (double)pl.bytes_in_place / 1e6);
  fprintf(out, "  bound    in %10.1f MB at least (LEAST TRAFFIC, paged in or read in place)\n", (double)least / 1e6);
  fprintf(out, "  this run in %10.1f MB  out %10.1f MB paged then\n", (double)paged[PST_DIR_H2D] / 1e6,
          (double)paged[PST_DIR_D2H] / 1e6);
  fprintf(out, "  step     %.4f s predicted: the moments %.4f s, %u of them waiting %.4f s for fetches\n",
          (double)pl.step_ns / 1e9, (double)pl.work_ns / 1e9, pl.waits, (double)pl.wait_ns / 1e9);
  fprintf(out, "  (copies at %.1f GB/s in, %.1f out, %.1f both, in place %.1f; a chunk movable %u moments after a use%s;\n"
               "   moment durations %s)\n", costs.h2d / 1e9, costs.d2h / 1e9, costs.both / 1e9, costs.in_place / 1e9, lag,
          lag == RP_DEFAULT_LAG ? ", as auto's owner plans" : " (--lag)",
          costs.moment_ns ? "from the gaps between the trace's launches: host time, the run's own paging waits included"
                          : "unknown: 10 us each");
  psp_plan_free(&pl);
  return true;
}
