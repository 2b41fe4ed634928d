/* WHAT TO CHANGE: the report's first section, in plain words. Was a steady iteration at
 * its bound (the time LEAST TRAFFIC alone takes to cross PCIe), what bounded it (copies,
 * kernels reading host frames in place, psshim's own host time, or the GPU's own work),
 * and at most two settings to try, each with what it is predicted to change:
 *   - a larger budget, where the device had memory free at the fullest: LEAST TRAFFIC at
 *     that budget (and with it the floor) falls;
 *   - another chunk size, where the replay of the iteration under OPT moves at least a
 *     tenth fewer bytes across PCIe, copies and in-place reads counted together.
 * The times are estimates from bytes and rates: the copy rates the run's own moves
 * measured where it made some, else the link's (policy.h), and the in-place rate. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "tools/report.h"

static void say(struct rp_verdict *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct rp_verdict *v, const char *fmt, ...) {
  if (v->n == RP_VERDICT_LINES) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v->line[v->n++], RP_VERDICT_LEN, fmt, ap);
  va_end(ap);
}

/* A duration scaled to itself: "850 us", "41.2 ms", "2.31 s". */
static const char *span(double s, char *buf, size_t len) {
  if (s < 1e-3) snprintf(buf, len, "%.0f us", s * 1e6);
  else if (s < 1) snprintf(buf, len, "%.1f ms", s * 1e3);
  else snprintf(buf, len, "%.2f s", s);
  return buf;
}

/* The steady iterations' means. */
struct steady_means {
  size_t n;
  double secs, in, out, in_place, pager_s, late;
  bool pager;
  uint64_t from, to; /* the steady phase's span */
};

static void means(const struct rp_laps *laps, struct steady_means *m) {
  memset(m, 0, sizeof *m);
  size_t with_pager = 0;
  for (size_t i = 0; i < laps->n; i++) {
    const struct rp_lap *l = &laps->l[i];
    if (l->phase != RP_STEADY) continue;
    if (!m->n++) m->from = l->from;
    m->to = l->to;
    m->secs += (double)(l->to - l->from) / 1e9;
    m->in += (double)l->bytes_in;
    m->out += (double)l->bytes_out;
    m->in_place += (double)l->in_place_bytes;
    if (l->has_pager) {
      with_pager++;
      m->pager_s += (double)l->pager_ns / 1e9;
      m->late += (double)l->late_waits;
    }
  }
  if (!m->n) return;
  const double n = (double)m->n;
  m->secs /= n, m->in /= n, m->out /= n, m->in_place /= n;
  m->pager = with_pager > 0;
  if (with_pager) m->pager_s /= (double)with_pager, m->late /= (double)with_pager;
}

/* The run's own copy rate each way over [from, to): bytes over the time its moves took
 * (0: it made none there). Moves that overlap count twice in the time: a low estimate. */
static double measured_rate(const struct rp_trace *t, int dir, uint64_t from, uint64_t to) {
  double bytes = 0, ns = 0;
  for (size_t i = 0; i < t->nev; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type != PST_REC_MIGRATION || r->migration.direction != dir || r->ts_ns < from || r->ts_ns > to ||
        r->migration.end_ns <= r->migration.start_ns)
      continue;
    bytes += (double)r->migration.bytes;
    ns += (double)(r->migration.end_ns - r->migration.start_ns);
  }
  return ns > 0 && bytes > 0 ? bytes / ns * 1e9 : 0;
}

/* The least free device memory any sample of [from, to] saw (UINT64_MAX: none). */
static uint64_t least_free(const struct rp_trace *t, uint64_t from, uint64_t to) {
  uint64_t low = UINT64_MAX;
  for (size_t i = 0; i < t->nev; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type == PST_REC_SAMPLE && r->ts_ns >= from && r->ts_ns <= to && r->sample.device_free_bytes < low)
      low = r->sample.device_free_bytes;
  }
  return low;
}

/* A larger budget where the device had room: false only when out of memory. */
static bool budget_advice(const struct rp_trace *t, const struct rp_accesses *a, const struct steady_means *m,
                          double h2d, uint64_t least, struct rp_verdict *v) {
  const uint64_t chunk = t->hdr.chunk_size, budget = t->hdr.gpu_budget;
  if (!chunk || !budget || !a->periodic || (least == 0 && m->in_place == 0)) return true;
  const uint64_t free = least_free(t, a->from, a->to);
  if (free == UINT64_MAX) return true; /* no samples: the device's room is unknown */
  /* Keep a tenth of what was free (or a chunk) for what grows beside psshim. */
  const uint64_t keep = free / 10 > chunk ? free / 10 : chunk, extra = free > keep ? (free - keep) / chunk * chunk : 0;
  char b[32], c[32], d[32], e[32], f[32], g[32], h[32];
  if (!extra) {
    say(v, "A larger budget: the device had %s free at the fullest, less than a chunk to spare; more GPU memory "
           "would have to come from the program itself.",
        rp_bytes(free, b, sizeof b));
    return true;
  }
  /* The run's budget, then eighths of the room: the smallest that gets within a chunk of
   * what all of it would, since memory given to psshim is taken from the program. */
  enum { STEPS = 8 };
  uint64_t budgets[STEPS + 1], best[STEPS + 1], read_all;
  for (size_t i = 0; i <= STEPS; i++) budgets[i] = budget + (i == STEPS ? extra : extra / STEPS * i / chunk * chunk);
  if (!rp_least_bound(a, budgets, STEPS + 1, best, &read_all)) return false;
  if (best[STEPS] >= best[0]) return true; /* more memory would not lower the floor */
  size_t pick = STEPS;
  for (size_t i = STEPS; i-- > 1;)
    if (budgets[i] > budget && best[i] <= best[STEPS] + chunk) pick = i;
  say(v, "Try --budget %s (PSSHIM_GPU_BUDGET; %s more, of %s free on the device at the fullest): the least that "
         "must reach the GPU each iteration falls from %s to %s, %s to %s of PCIe time.",
      rp_bytes(budgets[pick], b, sizeof b), rp_bytes(budgets[pick] - budget, c, sizeof c), rp_bytes(free, d, sizeof d),
      rp_bytes(best[0], e, sizeof e), rp_bytes(best[pick], f, sizeof f), span((double)best[0] / h2d, g, sizeof g),
      span((double)best[pick] / h2d, h, sizeof h));
  v->tries++;
  return true;
}

/* Another chunk size where the replay moves a tenth less: false only when out of memory. */
static bool chunk_advice(const struct rp_trace *t, const struct rp_accesses *a, struct rp_verdict *v) {
  const uint64_t chunk = t->hdr.chunk_size, budget = t->hdr.gpu_budget, M2 = 2u << 20;
  if (!chunk || chunk % M2 || !budget || !a->periodic || !a->matched) return true;
  uint64_t sizes[4] = { chunk, chunk / 2, chunk * 2, 4u << 20 };
  uint64_t run_bytes = 0, best_bytes = UINT64_MAX, best_size = 0, best_moved = 0, best_in_place = 0;
  for (size_t i = 0; i < 4; i++) {
    const uint64_t s = sizes[i];
    bool again = false;
    for (size_t k = 0; k < i; k++) again |= sizes[k] == s;
    if (again || s < M2 || s % M2 || s > budget) continue;
    uint64_t moved, in_place;
    if (!rp_chunk_across(a, s, budget, &moved, &in_place)) return false;
    if (i == 0) run_bytes = moved + in_place;
    else if (moved + in_place < best_bytes) best_bytes = moved + in_place, best_size = s, best_moved = moved,
                                            best_in_place = in_place;
  }
  if (!best_size || (double)best_bytes > 0.9 * (double)run_bytes) return true;
  char b[32], c[32], d[32], e[32], f[32], g[32];
  say(v, "Try --chunk-size %s (PSSHIM_CHUNK_SIZE): replayed under OPT at this budget, an iteration moves %s across "
         "PCIe (%s copied, %s read in place) where %s chunks move %s; bytes, not step time: measure it.",
      rp_bytes(best_size, b, sizeof b), rp_bytes(best_bytes, c, sizeof c), rp_bytes(best_moved, d, sizeof d),
      rp_bytes(best_in_place, e, sizeof e), rp_bytes(chunk, f, sizeof f), rp_bytes(run_bytes, g, sizeof g));
  v->tries++;
  return true;
}

bool rp_verdict_build(const struct rp_trace *t, const struct rp_chunks *cs, const struct rp_accesses *a,
                      struct rp_verdict *v) {
  memset(v, 0, sizeof *v);
  struct rp_laps laps;
  if (!rp_laps_build(t, cs, &laps)) return false;
  struct steady_means m;
  means(&laps, &m);
  rp_laps_free(&laps);
  char b[32], c[32], d[32], e[32], f[32], g[32];
  if (!m.n) {
    say(v, "No steady iterations: the tracer found no repeating iteration, so there is no bound per iteration to "
           "hold the run against (a run of a few steps, or one psshim did not observe).");
    return true;
  }
  double h2d = measured_rate(t, PST_DIR_H2D, m.from, m.to), d2h = measured_rate(t, PST_DIR_D2H, m.from, m.to);
  const bool measured = h2d > 0 || d2h > 0;
  if (h2d <= 0) h2d = PSP_PCIE_H2D;
  if (d2h <= 0) d2h = PSP_PCIE_D2H;
  const double copies = m.in / h2d + m.out / d2h, in_place = m.in_place / PSP_PCIE_IN_PLACE, T = m.secs;
  uint64_t least = 0, read_all = 0;
  const bool bound = a && a->periodic && t->hdr.gpu_budget &&
                     rp_least_bound(a, &t->hdr.gpu_budget, 1, &least, &read_all);
  const double floor = (double)least / PSP_PCIE_H2D; /* the bound at the link's rate, whatever the run's moves got */
  /* Was it at its bound? */
  if (m.in + m.out + m.in_place == 0 && least == 0)
    say(v, "A steady iteration took %s and nothing crossed PCIe for it: the run was bound by the GPU's own work, "
           "not by psshim; no setting of psshim's would make it faster.",
        span(T, b, sizeof b));
  else if (bound)
    say(v, "A steady iteration took %s. The least any placement must bring onto the GPU in one, at this budget, "
           "is %s: %s at %.0f GB/s. The run took %.1fx that%s.",
        span(T, b, sizeof b), rp_bytes(least, c, sizeof c), span(floor, d, sizeof d), PSP_PCIE_H2D / 1e9,
        floor > 0 ? T / floor : 0, floor > 0 && T <= 1.25 * floor ? ": it is at its bound" : "");
  else
    say(v, "A steady iteration took %s (no bound to hold it against: the trace records no GPU budget).",
        span(T, b, sizeof b));
  /* What bounded it, from the estimates. */
  if (m.in + m.out + m.in_place > 0) {
    const double pcie = copies + in_place, pager = m.pager ? m.pager_s : 0;
    char copied[160] = "copied nothing";
    if (m.in + m.out > 0)
      snprintf(copied, sizeof copied, "copied %s in and %s out (about %s at %s rates)",
               rp_bytes((uint64_t)m.in, b, sizeof b), rp_bytes((uint64_t)m.out, c, sizeof c), span(copies, d, sizeof d),
               measured ? "the run's own" : "the link's");
    say(v, "Per iteration psshim %s, and kernels read at most %s of host frames in place (about %s at %.0f GB/s)%s%s%s.",
        copied, rp_bytes((uint64_t)m.in_place, e, sizeof e), span(in_place, f, sizeof f), PSP_PCIE_IN_PLACE / 1e9,
        m.pager ? "; the launching threads spent " : "", m.pager ? span(pager, g, sizeof g) : "",
        m.pager ? " in psshim" : "");
    const char *by = copies >= in_place ? "psshim's copies" : "kernels reading host frames in place";
    const double share = T > 0 ? 100 * pcie / T : 0;
    if (pcie >= 0.9 * T)
      say(v, "What bounded it: PCIe, most by %s: the estimates fill %.0f%% of the iteration (in-place bytes are an "
             "upper bound).", by, share);
    else if (pcie >= 0.5 * T)
      say(v, "What bounded it: mostly PCIe, most by %s (about %.0f%% of the iteration), the GPU's own work beside.",
          by, share);
    else if (pager >= 0.2 * T)
      say(v, "What bounded it: psshim's own host time, planning and remapping (%.0f%% of the iteration; PCIe "
             "about %.0f%%).", 100 * pager / T, share);
    else
      say(v, "What bounded it: the GPU's own work; PCIe fills about %.0f%% of the iteration.", share);
    if (m.pager && m.late >= 0.5)
      say(v, "About %.0f launch%s an iteration waited for a chunk being moved.", m.late, m.late < 1.5 ? "" : "es");
  }
  if (a && !budget_advice(t, a, &m, PSP_PCIE_H2D, least, v)) return false;
  if (a && !chunk_advice(t, a, v)) return false;
  if (!v->tries && m.in + m.out + m.in_place > 0)
    say(v, "No setting to try that the trace can show: a larger budget needs free device memory, and no other "
           "chunk size moves a tenth less.");
  return true;
}
