/* --html: one self-contained page (inline SVG and CSS, no scripts) that a person reads at a
 * glance: what each steady iteration took and moved against LEAST TRAFFIC, GPU and host
 * frames over the run against their budgets, one steady iteration up close, chunk
 * residency, the top allocation sites by the code that asked for them, and the text
 * summary. The charts over time share one time axis, so they line up. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tools/report.h"

enum { W = 1200, LEFT = 80, RIGHT = 20, BINS = 600, MAX_ROWS = 300 };
#define PLOT_W (W - LEFT - RIGHT)
#define GPU_COLOR "#e8742a"
#define IN_PLACE_COLOR "#f6c39c"
#define HOST_COLOR "#3f73c4"
#define NONMODEL_COLOR "#9a9a9a"
#define TIME_COLOR "#6c5ba7"
#define GB 1e9 /* bytes moved in GB, like LEAST TRAFFIC's MB (10^6) */

/* A step function: value v[i] from t[i] until t[i + 1]. */
struct series { uint64_t *t, *v; size_t n, cap; };

static bool series_add(struct series *s, uint64_t t, uint64_t v) {
  if (s->n == s->cap) {
    s->cap = s->cap ? s->cap * 2 : 256;
    uint64_t *nt = realloc(s->t, s->cap * sizeof *nt);
    if (nt) s->t = nt;
    uint64_t *nv = realloc(s->v, s->cap * sizeof *nv);
    if (nv) s->v = nv;
    if (!nt || !nv) return false;
  }
  s->t[s->n] = t;
  s->v[s->n++] = v;
  return true;
}

static void series_free(struct series *s) {
  free(s->t);
  free(s->v);
}

/* The three memory classes over time: from SAMPLE records when there are any, else
 * rebuilt from chunk residency (non-model memory is then unknown). */
struct memory { struct series gpu, host, nonmodel; bool sampled; };

struct delta { uint64_t t; int64_t gpu, host; };
static int by_t(const void *a, const void *b) {
  const struct delta *x = a, *y = b;
  return x->t < y->t ? -1 : x->t > y->t;
}

static bool memory_build(const struct rp_trace *t, const struct rp_chunks *cs, struct memory *m) {
  memset(m, 0, sizeof *m);
  bool ok = true;
  for (size_t i = 0; i < t->nev && ok; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type != PST_REC_SAMPLE) continue;
    m->sampled = true;
    ok = series_add(&m->gpu, r->ts_ns, r->sample.gpu_chunk_bytes) &&
         series_add(&m->host, r->ts_ns, r->sample.host_chunk_bytes) &&
         series_add(&m->nonmodel, r->ts_ns, r->sample.nonmodel_gpu_bytes);
  }
  if (m->sampled || !ok) return ok;
  size_t n = 0, k = 0;
  for (size_t c = 0; c < cs->n; c++) n += 2 * cs->c[c].nspans;
  struct delta *d = malloc((n + 1) * sizeof *d);
  if (!d) return false;
  for (size_t c = 0; c < cs->n; c++)
    for (size_t s = 0; s < cs->c[c].nspans; s++) {
      const struct rp_span *sp = &cs->c[c].spans[s];
      const int64_t size = (int64_t)cs->c[c].size, g = sp->where == RP_GPU ? size : 0, h = sp->where == RP_HOST ? size : 0;
      d[k++] = (struct delta){ sp->from, g, h };
      d[k++] = (struct delta){ sp->to, -g, -h };
    }
  qsort(d, k, sizeof *d, by_t);
  int64_t gpu = 0, host = 0;
  ok = series_add(&m->gpu, t->t0, 0) && series_add(&m->host, t->t0, 0) && series_add(&m->nonmodel, t->t0, 0);
  for (size_t i = 0; i < k && ok; i++) {
    gpu += d[i].gpu;
    host += d[i].host;
    if (i + 1 < k && d[i + 1].t == d[i].t) continue; /* one point per instant */
    ok = series_add(&m->gpu, d[i].t, (uint64_t)gpu) && series_add(&m->host, d[i].t, (uint64_t)host) &&
         series_add(&m->nonmodel, d[i].t, 0);
  }
  free(d);
  return ok;
}

/* ---- geometry: the time axis shared by every chart ---- */
struct axis { uint64_t t0, t1; };
static double x_of(const struct axis *a, uint64_t t) {
  if (t <= a->t0) return LEFT;
  if (t >= a->t1) return LEFT + PLOT_W;
  return LEFT + (double)(t - a->t0) / (double)(a->t1 - a->t0) * PLOT_W;
}

/* A round step (1, 2 or 5 times a power of ten) giving about `want` ticks over span. */
static double nice_step(double span, int want) {
  const double raw = span / want, p = pow(10, floor(log10(raw))), f = raw / p;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

static void time_ticks(FILE *f, const struct axis *a, double y0, double y1) {
  const double span = (double)(a->t1 - a->t0) / 1e9, step = nice_step(span, 10);
  for (double s = 0; s <= span + 1e-9; s += step) {
    const double x = LEFT + s / span * PLOT_W;
    fprintf(f, "<line x1='%.1f' x2='%.1f' y1='%.1f' y2='%.1f' class='grid'/>", x, x, y0, y1);
    fprintf(f, "<text x='%.1f' y='%.1f' class='tick' text-anchor='middle'>%g s</text>\n", x, y1 + 14, s);
  }
}

/* Iteration marks without a wall of lines: alternate steady iterations shaded behind the
 * data, and every mark a short tick above the plot, numbered where there is room. */
static void lap_shading(FILE *f, const struct rp_laps *laps, const struct axis *a, double y0, double h) {
  size_t k = 0;
  for (size_t i = 0; i < laps->n; i++) {
    const struct rp_lap *l = &laps->l[i];
    if (l->phase != RP_STEADY || k++ % 2) continue;
    const double x0 = x_of(a, l->from), x1 = x_of(a, l->to);
    if (x1 > x0) fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' class='lap'/>", x0, y0, x1 - x0, h);
  }
  fputc('\n', f);
}

static void mark_ticks(FILE *f, const struct rp_trace *t, const struct axis *a, double y0) {
  double labelled = -1e9; /* x of the last number drawn */
  for (size_t i = 0; i < t->nev; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type != PST_REC_ITERATION || r->ts_ns < a->t0 || r->ts_ns > a->t1) continue;
    const double x = x_of(a, r->ts_ns);
    fprintf(f, "<line x1='%.1f' x2='%.1f' y1='%.1f' y2='%.1f' class='iter'/>", x, x, y0 - 6, y0);
    if (x - labelled >= 34) {
      const bool edge = x > LEFT + PLOT_W - 24; /* the number goes left of its tick */
      fprintf(f, "<text x='%.1f' y='%.1f' class='itlabel'%s>%llu</text>", edge ? x - 2 : x + 2, y0 - 8,
              edge ? " text-anchor='end'" : "", (unsigned long long)r->iteration.iteration);
      labelled = x;
    }
  }
  fputc('\n', f);
}

/* The bin of time t on axis a, within 0 .. BINS - 1 (a time far outside the axis, from a
 * damaged or odd trace, is clamped before it becomes an int). */
static int bin_of(const struct axis *a, uint64_t t) {
  if (t <= a->t0) return 0;
  const double b = (double)(t - a->t0) / ((double)(a->t1 - a->t0) / BINS);
  return b >= BINS - 1 ? BINS - 1 : (int)b;
}

struct layer { const struct series *s; const char *color, *label; };
enum { MAX_LAYERS = 3 };

/* Each layer's value, in each of BINS time bins, at the moment the layers' sum peaks there:
 * the stack shows what was in use at one moment. Peaks of each layer taken apart would
 * stack values of different moments, a sum never reached. The layers share one time line
 * (memory_build adds a point to each at once). */
static void bin_stack(const struct layer *layers, int nlayers, const struct axis *a, double out[][BINS]) {
  static double best[BINS];
  size_t n = layers[0].s->n;
  for (int l = 0; l < nlayers; l++) {
    if (layers[l].s->n < n) n = layers[l].s->n;
    for (int b = 0; b < BINS; b++) out[l][b] = 0;
  }
  for (int b = 0; b < BINS; b++) best[b] = -1;
  const struct series *s = layers[0].s;
  for (size_t i = 0; i < n; i++) {
    const uint64_t from = s->t[i], to = i + 1 < n ? s->t[i + 1] : a->t1;
    if (to < a->t0 || from > a->t1) continue; /* outside the chart */
    double sum = 0;
    for (int l = 0; l < nlayers; l++) sum += (double)layers[l].s->v[i];
    for (int b = bin_of(a, from), b1 = bin_of(a, to); b <= b1; b++)
      if (sum > best[b]) {
        best[b] = sum;
        for (int l = 0; l < nlayers; l++) out[l][b] = (double)layers[l].s->v[i];
      }
  }
}

/* A filled band between lower and upper (per bin), drawn as steps. */
static void band(FILE *f, const double *lower, const double *upper, double y0, double h, double ymax,
                 const char *color) {
  const double bw = (double)PLOT_W / BINS;
#define Y(v) (y0 + h - (v) / ymax * h)
  fprintf(f, "<path fill='%s' d='M%d %.1f", color, LEFT, Y(lower[0]));
  for (int b = 0; b < BINS; b++) fprintf(f, "V%.1fH%.1f", Y(upper[b]), LEFT + (b + 1) * bw);
  for (int b = BINS - 1; b >= 0; b--) fprintf(f, "V%.1fH%.1f", Y(lower[b]), LEFT + b * bw);
  fputs("Z'/>\n", f);
#undef Y
}

/* The y scale of a chart whose data peak at peak under a budget line: the budget is drawn
 * when it is within BUDGET_SPAN of the data; far above (a 138 GiB budget over 1.4 GiB of
 * data) it would squash the data against the axis, so it is named instead. */
#define BUDGET_SPAN 3.0
static bool budget_on_scale(uint64_t budget, double peak) {
  return budget && (peak <= 0 || (double)budget <= BUDGET_SPAN * peak);
}

/* Horizontal grid lines and their labels, unit per step of the y axis. */
static void y_grid(FILE *f, double ymax, double unit, const char *suffix, double top, double h) {
  const double step = nice_step(ymax / unit, 5) * unit;
  for (double v = 0; v <= ymax; v += step) {
    const double y = top + h - v / ymax * h;
    fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' class='grid'/>", LEFT, LEFT + PLOT_W, y, y);
    fprintf(f, "<text x='%d' y='%.1f' class='tick' text-anchor='end'>%g%s</text>\n", LEFT - 6, y + 4, v / unit, suffix);
  }
}

static void legend(FILE *f, int x, const char *color, const char *label) {
  fprintf(f, "<rect x='%d' y='8' width='12' height='12' fill='%s'/><text x='%d' y='18' class='legend'>%s</text>", x,
          color, x + 16, label);
}

/* One memory chart: stacked classes against a dashed budget line, axes, legend; laps (NULL:
 * none) shaded behind. */
static void memory_chart(FILE *f, const struct rp_trace *t, const struct rp_laps *laps, const struct axis *a,
                         const char *title, const struct layer *layers, int nlayers, uint64_t budget) {
  enum { H = 200, TOP = 40, BOTTOM = 24 };
  static double lower[BINS], upper[BINS], vals[MAX_LAYERS][BINS];
  double ymax = 0;
  if (nlayers > MAX_LAYERS) nlayers = MAX_LAYERS;
  bin_stack(layers, nlayers, a, vals);
  for (int b = 0; b < BINS; b++) {
    double sum = 0;
    for (int l = 0; l < nlayers; l++) sum += vals[l][b];
    if (sum > ymax) ymax = sum;
  }
  const bool drawn = budget_on_scale(budget, ymax);
  if (drawn && (double)budget > ymax) ymax = (double)budget;
  if (ymax <= 0) ymax = 1 << 30;
  ymax *= 1.08;
  fprintf(f, "<h2>%s</h2>\n<svg width='%d' height='%d' viewBox='0 0 %d %d'>\n", title, W, TOP + H + BOTTOM, W,
          TOP + H + BOTTOM);
  if (laps) lap_shading(f, laps, a, TOP, H);
  y_grid(f, ymax, ymax >= 4.0 * (1 << 30) ? 1024.0 * 1024 * 1024 : 1024.0 * 1024,
         ymax >= 4.0 * (1 << 30) ? " GiB" : " MiB", TOP, H);
  time_ticks(f, a, TOP, TOP + H);
  for (int b = 0; b < BINS; b++) lower[b] = upper[b] = 0;
  for (int l = 0; l < nlayers; l++) {
    for (int b = 0; b < BINS; b++) upper[b] = lower[b] + vals[l][b];
    band(f, lower, upper, TOP, H, ymax, layers[l].color);
    memcpy(lower, upper, sizeof lower);
  }
  char bb[32];
  if (drawn) {
    const double y = TOP + H - (double)budget / ymax * H;
    fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' class='budget'/>", LEFT, LEFT + PLOT_W, y, y);
    fprintf(f, "<text x='%d' y='%.1f' class='budgetlabel' text-anchor='end'>budget %s</text>\n", LEFT + PLOT_W - 4,
            y - 4, rp_bytes(budget, bb, sizeof bb));
  } else if (budget) {
    fprintf(f, "<text x='%d' y='18' class='budgetlabel' text-anchor='end'>budget %s: off the scale, far above</text>\n",
            LEFT + PLOT_W, rp_bytes(budget, bb, sizeof bb));
  }
  mark_ticks(f, t, a, TOP);
  fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' class='frame'/>\n", LEFT, TOP, PLOT_W, H);
  int x = LEFT;
  for (int l = 0; l < nlayers; l++) {
    legend(f, x, layers[l].color, layers[l].label);
    x += 24 + 7 * (int)strlen(layers[l].label);
  }
  fputs("\n</svg>\n", f);
}

/* ---- the steady iterations, one by one ---- */

/* What the page says of the steady phase: its laps, and the bound of its window. */
struct steady {
  const struct rp_lap **l; /* the steady laps, in order */
  size_t n;
  uint64_t least, budget;  /* LEAST TRAFFIC at the run's budget (least valid when has_least) */
  bool has_least;
  const struct rp_accesses *a;
};

/* Bars per steady iteration: its time; and the bytes it brought onto the GPU (paged in, and
 * on top what its kernels named in host frames: read in place, at most) and paged out,
 * against the least traffic any placement must bring in. */
static void steady_chart(FILE *f, const struct steady *st) {
  enum { TH = 110, BH = 200, TOP = 40, GAP = 44, BOTTOM = 34 };
  const double slot = (double)PLOT_W / (double)st->n, bw = slot * 0.36;
  const bool values = slot >= 60; /* room for numbers on the bars */
  /* The bytes' scale holds what was paged and the bound; an upper bound on in-place reads
   * far above them is cut at the top (and its number written there) rather than squash them. */
  double tmax = 0, bmax = st->has_least ? (double)st->least : 0, inmax = 0;
  for (size_t i = 0; i < st->n; i++) {
    const struct rp_lap *l = st->l[i];
    tmax = fmax(tmax, (double)(l->to - l->from) / 1e9);
    bmax = fmax(bmax, fmax((double)l->bytes_in, (double)l->bytes_out));
    inmax = fmax(inmax, (double)(l->bytes_in + l->in_place_bytes));
  }
  if (inmax <= 1.5 * bmax) bmax = fmax(bmax, inmax);
  tmax = tmax > 0 ? tmax * 1.15 : 1;
  bmax = bmax > 0 ? bmax * 1.15 : GB;
  const double btop = TOP + TH + GAP, height = btop + BH + BOTTOM;
  fprintf(f, "<svg width='%d' height='%.0f' viewBox='0 0 %d %.0f'>\n", W, height, W, height);
  fprintf(f, "<text x='%d' y='%d' class='panel'>time per iteration</text>\n", LEFT, TOP - 8);
  y_grid(f, tmax, 1, " s", TOP, TH);
  char b[32];
  fprintf(f, "<text x='%d' y='%.0f' class='panel'>bytes per iteration (GB = 10^9 bytes)", LEFT, btop - 8);
  if (st->has_least)
    fprintf(f, "<tspan class='leastlabel'> &#8212; dashed: LEAST TRAFFIC, %.1f GB at the %s budget in %s</tspan>",
            (double)st->least / GB, rp_bytes(st->budget, b, sizeof b), st->a->window);
  fputs("</text>\n", f);
  y_grid(f, bmax, GB, " GB", btop, BH);
  const size_t label_every = slot >= 28 ? 1 : (size_t)(28 / slot) + 1;
#define TY(v) (TOP + TH - (v) / tmax * TH)
#define BY(v) (btop + BH - (v) / bmax * BH)
  for (size_t i = 0; i < st->n; i++) {
    const struct rp_lap *l = st->l[i];
    const double x = LEFT + slot * (double)i, secs = (double)(l->to - l->from) / 1e9;
    const double in = (double)l->bytes_in, inp = (double)l->in_place_bytes, out = (double)l->bytes_out;
    const double top = fmin(in + inp, bmax), xin = x + slot * 0.12, xout = x + slot * 0.52;
    fprintf(f, "<g><title>iteration %llu: %.3f s, %llu launches; paged in %.2f GB, named in host frames %.2f GB, "
               "paged out %.2f GB</title>",
            (unsigned long long)l->iteration, secs, (unsigned long long)l->launches, in / GB, inp / GB, out / GB);
    fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='%s'/>", x + slot * 0.2, TY(secs), slot * 0.6,
            TOP + TH - TY(secs), TIME_COLOR);
    fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='%s'/>", xin, BY(top), bw, BY(in) - BY(top),
            IN_PLACE_COLOR);
    fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='%s'/>", xin, BY(in), bw, btop + BH - BY(in),
            GPU_COLOR);
    fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='%s'/></g>", xout, BY(out), bw,
            btop + BH - BY(out), HOST_COLOR);
    if (in + inp > bmax) /* cut: a break across the bar's top */
      fprintf(f, "<path d='M%.1f %.1fl%.1f -5l%.1f 5l%.1f -5' class='cut'/>", xin, btop + 20, bw / 3, bw / 3, bw / 3);
    if (values) {
      fprintf(f, "<text x='%.1f' y='%.1f' class='value' text-anchor='middle'>%.2f s</text>", x + slot / 2, TY(secs) - 3,
              secs);
      if (inp > 0)
        fprintf(f, "<text x='%.1f' y='%.1f' class='value' text-anchor='middle'>&le; %.1f</text>", xin + bw / 2,
                in + inp > bmax ? btop + 11 : BY(top) - 3, (in + inp) / GB);
      fprintf(f, "<text x='%.1f' y='%.1f' class='value' text-anchor='middle'>%.2f</text>", xin + bw / 2,
              fmin(BY(in) - 3, btop + BH - 3), in / GB);
      fprintf(f, "<text x='%.1f' y='%.1f' class='value' text-anchor='middle'>%.2f</text>", xout + bw / 2, BY(out) - 3,
              out / GB);
    }
    if (i % label_every == 0)
      fprintf(f, "<text x='%.1f' y='%.0f' class='tick' text-anchor='middle'>%llu</text>", x + slot / 2,
              btop + BH + 14, (unsigned long long)l->iteration);
    fputc('\n', f);
  }
  if (st->has_least) {
    const double y = BY((double)st->least);
    fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' class='least'/>\n", LEFT, LEFT + PLOT_W, y, y);
  }
#undef TY
#undef BY
  fprintf(f, "<text x='%d' y='%.0f' class='tick' text-anchor='middle'>iteration</text>\n", LEFT + PLOT_W / 2,
          height - 4);
  fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' class='frame'/>", LEFT, TOP, PLOT_W, TH);
  fprintf(f, "<rect x='%d' y='%.0f' width='%d' height='%d' class='frame'/>\n", LEFT, btop, PLOT_W, BH);
  legend(f, LEFT, TIME_COLOR, "time");
  legend(f, LEFT + 70, GPU_COLOR, "paged in (onto the GPU)");
  legend(f, LEFT + 260, IN_PLACE_COLOR, "named in host frames: read in place, at most");
  legend(f, LEFT + 590, HOST_COLOR, "paged out");
  fputs("</svg>\n", f);
}

/* One row per steady iteration (the last MAX_LAP_ROWS of them). */
static void steady_table(FILE *f, const struct rp_trace *t, const struct steady *st) {
  enum { MAX_LAP_ROWS = 20 };
  const size_t from = st->n > MAX_LAP_ROWS ? st->n - MAX_LAP_ROWS : 0;
  if (from) fprintf(f, "<p class='note'>The last %d of %zu steady iterations:</p>\n", MAX_LAP_ROWS, st->n);
  fputs("<table class='laps'><tr><th>iteration</th><th>starts at s</th><th>time s</th><th>launches</th>"
        "<th>paged in GB</th><th>named in host frames GB</th><th>paged out GB</th><th>pager ms</th>"
        "<th>late waits</th></tr>\n", f);
  for (size_t i = from; i < st->n; i++) {
    const struct rp_lap *l = st->l[i];
    fprintf(f, "<tr><td>%llu</td><td>%.3f</td><td>%.3f</td><td>%llu</td><td>%.2f</td><td>%.2f</td><td>%.2f</td>",
            (unsigned long long)l->iteration, rp_secs(t, l->from), (double)(l->to - l->from) / 1e9,
            (unsigned long long)l->launches, (double)l->bytes_in / GB, (double)l->in_place_bytes / GB,
            (double)l->bytes_out / GB);
    if (l->has_pager)
      fprintf(f, "<td>%.2f</td><td>%llu</td></tr>\n", (double)l->pager_ns / 1e6, (unsigned long long)l->late_waits);
    else
      fputs("<td>-</td><td>-</td></tr>\n", f);
  }
  fputs("</table>\n<p class='note'>Paged: psshim's migrations, recorded exactly. Named in host frames: the bytes in "
        "host frames of the allocations that the iteration's launches named by their start (counted per launch), "
        "an upper bound on what kernels read there in place across PCIe, which the trace does not record. LEAST "
        "TRAFFIC: what any placement must bring onto the GPU, paged in or read in place (the text's LEAST TRAFFIC "
        "says why). Pager ms: the launching threads' host time in psshim's pager (their waits for their moments included); late "
        "waits: launches that reached a chunk while it was remapped.</p>\n",
        f);
}

/* The headline: a steady iteration's time and bytes, and the bound. */
static void glance(FILE *f, const struct steady *st) {
  if (!st->n) {
    fputs("<p class='glance'>No steady iterations: the tracer found no iteration period, so the page shows the "
          "run as one phase.</p>\n",
          f);
    return;
  }
  double secs = 0, lo = 0, hi = 0, in = 0, inp = 0, out = 0;
  for (size_t i = 0; i < st->n; i++) {
    const struct rp_lap *l = st->l[i];
    const double s = (double)(l->to - l->from) / 1e9;
    lo = i && lo < s ? lo : s;
    hi = hi > s ? hi : s;
    secs += s;
    in += (double)l->bytes_in;
    inp += (double)l->in_place_bytes;
    out += (double)l->bytes_out;
  }
  const double n = (double)st->n;
  fprintf(f, "<p class='glance'><b>%zu steady iterations</b> (%llu to %llu): <b>%.3f s</b> each on average "
             "(%.3f to %.3f). Each paged <b>%.2f GB</b> in and <b>%.2f GB</b> out, and its kernels named "
             "<b>%.2f GB</b> in host frames (read in place, at most).",
          st->n, (unsigned long long)st->l[0]->iteration, (unsigned long long)st->l[st->n - 1]->iteration, secs / n,
          lo, hi, in / n / GB, out / n / GB, inp / n / GB);
  if (st->has_least) {
    char b[32];
    fprintf(f, " LEAST TRAFFIC at the %s budget: <b>%.2f GB</b> must reach the GPU in %s, whatever the placement.",
            rp_bytes(st->budget, b, sizeof b), (double)st->least / GB, st->a->window);
  }
  fputs("</p>\n", f);
}

/* ---- one steady iteration up close ---- */

/* Paging per time bin of the window: bytes in (up) and out (down) as GB/s, each move spread
 * over the time it took; and a strip of the launches the host enqueued per bin (where it
 * enqueues none, it waited). */
static bool traffic_chart(FILE *f, const struct rp_trace *t, const struct axis *a) {
  enum { H = 180, TOP = 30, STRIP = 14, BOTTOM = 24 };
  double *in = calloc(BINS, sizeof *in), *out = calloc(BINS, sizeof *out), *launch = calloc(BINS, sizeof *launch);
  if (!in || !out || !launch) {
    free(in);
    free(out);
    free(launch);
    return false;
  }
  const double width = (double)(a->t1 - a->t0) / BINS; /* ns per bin */
  for (size_t i = 0; i < t->nev; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type == PST_REC_LAUNCH && r->ts_ns >= a->t0 && r->ts_ns < a->t1)
      launch[(int)((double)(r->ts_ns - a->t0) / width)]++;
    if (r->type != PST_REC_MIGRATION) continue;
    const uint64_t s = r->migration.start_ns ? r->migration.start_ns : r->ts_ns;
    const uint64_t e = r->migration.end_ns > s ? r->migration.end_ns : s + 1;
    if (e <= a->t0 || s >= a->t1) continue;
    double *to = r->migration.direction == PST_DIR_H2D ? in : out;
    const double rate = (double)r->migration.bytes / (double)(e - s); /* bytes per ns */
    const double from = s > a->t0 ? (double)(s - a->t0) : 0, until = e < a->t1 ? (double)(e - a->t0) : (double)(a->t1 - a->t0);
    for (int b = (int)(from / width); b < BINS && b * width < until; b++) {
      const double lo = fmax(from, b * width), hi = fmin(until, (b + 1) * width);
      if (hi > lo) to[b] += rate * (hi - lo);
    }
  }
  double ymax = 0, lmax = 0;
  for (int b = 0; b < BINS; b++) {
    in[b] /= width; /* bytes per ns: GB/s */
    out[b] /= width;
    ymax = fmax(ymax, fmax(in[b], out[b]));
    lmax = fmax(lmax, launch[b]);
  }
  ymax = ymax > 0 ? ymax * 1.1 : 1;
  const double mid = TOP + H / 2.0, bw = (double)PLOT_W / BINS, sy = TOP + H + 8;
  fprintf(f, "<svg width='%d' height='%d' viewBox='0 0 %d %d'>\n", W, TOP + H + 8 + STRIP + BOTTOM, W,
          TOP + H + 8 + STRIP + BOTTOM);
  const double step = nice_step(ymax, 3);
  for (double v = 0; v <= ymax; v += step)
    for (int sign = -1; sign <= 1; sign += 2) {
      const double y = mid - sign * v / ymax * (H / 2.0);
      fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' class='grid'/>", LEFT, LEFT + PLOT_W, y, y);
      fprintf(f, "<text x='%d' y='%.1f' class='tick' text-anchor='end'>%g GB/s</text>\n", LEFT - 6, y + 4, v);
      if (v == 0) break;
    }
  for (int b = 0; b < BINS; b++) {
    const double hin = in[b] / ymax * (H / 2.0), hout = out[b] / ymax * (H / 2.0);
    if (hin > 0.05)
      fprintf(f, "<rect x='%.1f' y='%.1f' width='%.2f' height='%.1f' fill='%s'/>", LEFT + b * bw, mid - hin, bw, hin,
              GPU_COLOR);
    if (hout > 0.05)
      fprintf(f, "<rect x='%.1f' y='%.1f' width='%.2f' height='%.1f' fill='%s'/>", LEFT + b * bw, mid, bw, hout,
              HOST_COLOR);
    if (launch[b] > 0)
      fprintf(f, "<rect x='%.1f' y='%.1f' width='%.2f' height='%d' fill='#444' fill-opacity='%.2f'/>", LEFT + b * bw,
              sy, bw, STRIP, 0.15 + 0.85 * launch[b] / lmax);
  }
  fputc('\n', f);
  time_ticks(f, a, TOP, sy + STRIP);
  fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' class='frame'/>", LEFT, TOP, PLOT_W, H);
  fprintf(f, "<rect x='%d' y='%.0f' width='%d' height='%d' class='frame'/>", LEFT, sy, PLOT_W, STRIP);
  fprintf(f, "<text x='%d' y='%.0f' class='tick' text-anchor='end'>launches</text>\n", LEFT - 6, sy + 11);
  legend(f, LEFT, GPU_COLOR, "paged in (up)");
  legend(f, LEFT + 130, HOST_COLOR, "paged out (down)");
  fprintf(f, "<text x='%d' y='18' class='legend'>grey strip: launches the host enqueued (darker: more; blank: it "
             "enqueued none)</text>\n</svg>\n",
          LEFT + 280);
  free(in);
  free(out);
  free(launch);
  return true;
}

/* ---- allocation sites by the code that asked for the memory ---- */

/* Frames that only pass a request on: torch's operator dispatch. */
static bool dispatch_frame(const char *name) {
  static const char *const prefix[] = { "at::_ops::", "c10::impl::", "c10::Dispatcher::", "c10::BoxedKernel",
                                        "c10::KernelFunction" };
  for (size_t i = 0; i < sizeof prefix / sizeof *prefix; i++)
    if (strncmp(name, prefix[i], strlen(prefix[i])) == 0) return true;
  return false;
}

static bool python_frame(const char *name) {
  return strncmp(name, "_Py", 3) == 0 || strncmp(name, "Py", 2) == 0 || strncmp(name, "[python", 7) == 0 ||
         strncmp(name, "[libpython", 10) == 0;
}

/* The site's callers, innermost first, from its first frame outside the allocators: named
 * frames without their parameters, dispatch and repeats left out, up to the interpreter. */
static void site_chain(FILE *f, const struct rp_trace *t, const struct rp_stack *s) {
  enum { SHOW = 7 };
  char full[1024], name[512], prev[512] = "";
  int shown = 0;
  for (uint32_t i = rp_stack_start(t, s); i < s->depth && shown <= SHOW; i++) {
    const char *d = rp_demangle(rp_string(t, s->frames[i].symbol), full, sizeof full);
    if (python_frame(d)) {
      fputs(shown ? " &larr; <i>Python</i>" : "<i>Python</i>", f);
      return;
    }
    if ((d[0] == '[' && shown) || dispatch_frame(d)) continue; /* unnamed: only when nothing else is */
    rp_short_name(d, name, sizeof name);
    if (strcmp(name, prev) == 0) continue;
    fputs(shown ? " &larr; " : "", f);
    if (shown++ == SHOW) {
      fputs("&hellip;", f);
      return;
    }
    fputs("<code>", f);
    rp_html_escape(f, name);
    fputs("</code>", f);
    memcpy(prev, name, sizeof prev);
  }
}

static void site_stack(FILE *f, const struct rp_trace *t, const struct rp_stack *s) {
  char full[1024];
  const uint32_t start = rp_stack_start(t, s);
  fputs("<details><summary>stack</summary><pre>", f);
  for (uint32_t i = 0; i < s->depth; i++) {
    fputs(i < start ? "<span class='alloc'>" : "", f);
    rp_html_escape(f, rp_demangle(rp_string(t, s->frames[i].symbol), full, sizeof full));
    fprintf(f, "+0x%x%s\n", s->frames[i].offset, i < start ? "</span>" : "");
  }
  fputs("</pre></details>", f);
}

static bool sites_table(FILE *f, const struct rp_trace *t, const struct rp_chunks *cs) {
  enum { TOP_SITES = 10 };
  struct rp_sites ss;
  if (!rp_sites_build(t, cs, &ss)) return false;
  fprintf(f, "<h2>Top allocation sites</h2>\n");
  if (!ss.n) {
    fputs("<p class='note'>No ALLOC records.</p>\n", f);
    rp_sites_free(&ss);
    return true;
  }
  char a[32], b[32];
  fprintf(f, "<p class='note'>By peak live bytes. Where: the site's bytes at the last peak of all live bytes (%s at "
             "%.3f s). In place: %s launches that named its allocations by their start while some of each sat in "
             "host frames, and those bytes (read across PCIe, at most). Allocated by: the first frames outside the "
             "allocators (psshim, libcudart, torch's c10::cuda allocators), callers to the right; operator "
             "dispatch left out.</p>\n",
          rp_bytes(ss.peak, a, sizeof a), rp_secs(t, ss.peak_ts),
          ss.laps ? "a steady iteration's (on average)" : "the trace's");
  fputs("<table class='sites'><tr><th>#</th><th>peak live</th><th>where: GPU</th><th>host frames</th>"
        "<th>in place</th><th class='chain'>allocated by</th></tr>\n",
        f);
  const uint64_t laps = ss.laps ? ss.laps : 1;
  for (size_t i = 0; i < TOP_SITES && i < ss.n; i++) {
    const struct rp_site *w = &ss.s[i];
    fprintf(f, "<tr><td>%zu</td><td>%s</td>", i + 1, rp_bytes(w->peak, a, sizeof a));
    fprintf(f, "<td>%s</td>", rp_bytes(w->at_gpu, a, sizeof a));
    fprintf(f, "<td>%s</td>", rp_bytes(w->at_host, a, sizeof a));
    fprintf(f, "<td>%llu launches, %s</td><td class='chain'>", (unsigned long long)(w->in_place / laps),
            rp_bytes(w->in_place_bytes / laps, b, sizeof b));
    const struct rp_stack *s = w->stack < t->nstacks ? &t->stacks[w->stack] : NULL;
    if (w->stack && s && s->frames) {
      site_chain(f, t, s);
      site_stack(f, t, s);
    } else {
      fputs("(no stack recorded)", f);
    }
    fputs("</td></tr>\n", f);
  }
  fputs("</table>\n", f);
  rp_sites_free(&ss);
  return true;
}

/* ---- the residency heat map ---- */

/* A colour between host blue and GPU orange by the GPU share, faded by occupancy. */
static void cell_style(char *buf, size_t len, double gpu_share, double occupancy) {
  const int q = (int)lround(gpu_share * 8), o = (int)lround(occupancy * 4);
  const int r = 0x3f + (0xe8 - 0x3f) * q / 8, g = 0x73 + (0x74 - 0x73) * q / 8, b = 0xc4 + (0x2a - 0xc4) * q / 8;
  snprintf(buf, len, "#%02x%02x%02x' fill-opacity='%.2f", r, g, b, o < 1 ? 0.25 : o / 4.0);
}

static bool heat_map(FILE *f, const struct rp_chunks *cs, const struct axis *a, const struct rp_trace *t,
                     const struct rp_laps *laps) {
  enum { COLS = 300, TOP = 22 };
  fprintf(f, "<h2>Chunk residency</h2>\n");
  if (!cs->n) {
    fputs("<p class='note'>No CHUNK or MIGRATION records: nothing to draw.</p>\n", f);
    return true;
  }
  const size_t per_row = (cs->n + MAX_ROWS - 1) / MAX_ROWS, rows = (cs->n + per_row - 1) / per_row;
  const double rh = rows * 14 <= 420 ? 14 : rows * 3 <= 420 ? 420.0 / rows : 1.4;
  const double h = rh * (double)rows, cw = (double)PLOT_W / COLS, bin = (double)(a->t1 - a->t0) / COLS;
  double *gpu = malloc(COLS * sizeof *gpu), *host = malloc(COLS * sizeof *host);
  if (!gpu || !host) {
    free(gpu);
    free(host);
    return false;
  }
  if (per_row > 1) fprintf(f, "<p class='note'>%zu chunks per row.</p>\n", per_row);
  fprintf(f, "<svg width='%d' height='%.0f' viewBox='0 0 %d %.0f'>\n", W, TOP + h + 24, W, TOP + h + 24);
  time_ticks(f, a, TOP, TOP + h); /* under the cells: the labels show, the grid only between */
  lap_shading(f, laps, a, TOP, h);
  for (size_t row = 0; row < rows; row++) {
    const size_t c0 = row * per_row, c1 = c0 + per_row < cs->n ? c0 + per_row : cs->n;
    uint64_t g_ns = 0, h_ns = 0, ins = 0, outs = 0;
    for (int b = 0; b < COLS; b++) gpu[b] = host[b] = 0;
    for (size_t c = c0; c < c1; c++) {
      const struct rp_chunk *ch = &cs->c[c];
      g_ns += ch->gpu_ns, h_ns += ch->host_ns, ins += ch->ins, outs += ch->outs;
      for (size_t s = 0; s < ch->nspans; s++) {
        const struct rp_span *sp = &ch->spans[s];
        if (sp->to <= a->t0 || sp->from >= a->t1) continue; /* off the axis */
        const double from = sp->from > a->t0 ? (double)(sp->from - a->t0) : 0, to = (double)(sp->to - a->t0);
        for (int b = from / bin < COLS ? (int)(from / bin) : COLS; b < COLS && b * bin < to; b++) {
          const double lo = b * bin > from ? b * bin : from, hi = (b + 1) * bin < to ? (b + 1) * bin : to;
          if (hi > lo) *(sp->where == RP_GPU ? &gpu[b] : &host[b]) += hi - lo;
        }
      }
    }
    const double y = TOP + rh * (double)row;
    char who[64], sz[32];
    if (per_row > 1) snprintf(who, sizeof who, "chunks %u-%u", cs->c[c0].id, cs->c[c1 - 1].id);
    else snprintf(who, sizeof who, "chunk %u (%s)", cs->c[c0].id, rp_bytes(cs->c[c0].size, sz, sizeof sz));
    fprintf(f, "<g><title>%s: %.3f s on GPU, %.3f s on host, %llu in, %llu out</title>", who,
            (double)g_ns / 1e9, (double)h_ns / 1e9, (unsigned long long)ins, (unsigned long long)outs);
    /* Runs of equal colour become one rect: far fewer elements than cells. */
    char style[64], prev[64] = "";
    int start = 0;
    for (int b = 0; b <= COLS; b++) {
      style[0] = '\0';
      if (b < COLS && gpu[b] + host[b] > 0)
        cell_style(style, sizeof style, gpu[b] / (gpu[b] + host[b]), (gpu[b] + host[b]) / (bin * (double)(c1 - c0)));
      if (b < COLS && strcmp(style, prev) == 0) continue;
      if (prev[0])
        fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.2f' fill='%s'/>", LEFT + start * cw, y,
                (b - start) * cw, rh > 2 ? rh - 0.5 : rh, prev);
      memcpy(prev, style, sizeof prev);
      start = b;
    }
    fputs("</g>\n", f);
    const size_t label_every = rh >= 10 ? 1 : (size_t)(12 / rh) + 1;
    if (row % label_every == 0)
      fprintf(f, "<text x='%d' y='%.1f' class='tick' text-anchor='end'>%u</text>\n", LEFT - 6,
              y + (rh < 10 ? 10 : rh - 3), cs->c[c0].id);
  }
  mark_ticks(f, t, a, TOP);
  fprintf(f, "<rect x='%d' y='%d' width='%d' height='%.1f' class='frame'/>\n</svg>\n", LEFT, TOP, PLOT_W, h);
  fprintf(f, "<p class='legend'><span class='sw' style='background:%s'></span>on GPU "
             "<span class='sw' style='background:%s'></span>on host "
             "(mixed colours: part of the interval on each; faded: the chunk existed for part of it)</p>\n",
          GPU_COLOR, HOST_COLOR);
  free(gpu);
  free(host);
  return true;
}

static const char *STYLE =
    "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222;max-width:1240px}"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:26px 0 6px}"
    ".meta{color:#555;font-size:13px}.note{color:#666;font-size:12px;margin:2px 0;max-width:1180px}"
    ".glance{font-size:15px;background:#fbf6ee;border-left:4px solid #e8742a;padding:8px 12px;max-width:1160px}"
    ".verdict{font-size:15px;max-width:1160px;padding-left:22px}.verdict li{margin:4px 0}"
    "svg{display:block}.grid{stroke:#e6e6e6}.frame{fill:none;stroke:#999}"
    ".tick{font-size:11px;fill:#555}.legend{font-size:12px;fill:#333}.panel{font-size:12px;fill:#333;font-weight:600}"
    ".value{font-size:10px;fill:#333;paint-order:stroke;stroke:#fff;stroke-width:2px}"
    ".budget{stroke:#c0392b;stroke-dasharray:6 4;stroke-width:1.5}"
    ".budgetlabel{font-size:11px;fill:#c0392b;paint-order:stroke;stroke:#fff;stroke-width:3px}"
    ".least{stroke:#c0392b;stroke-dasharray:8 4;stroke-width:2}"
    ".leastlabel{font-size:12px;fill:#c0392b;font-weight:600;paint-order:stroke;stroke:#fff;stroke-width:3px}"
    ".cut{fill:none;stroke:#fff;stroke-width:3}"
    ".lap{fill:#8e44ad;fill-opacity:.07}.iter{stroke:#8e44ad;stroke-opacity:.6}.itlabel{font-size:9px;fill:#8e44ad}"
    ".sw{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:-1px}"
    "table{border-collapse:collapse;font-size:12px;margin:6px 0}"
    "td,th{border-bottom:1px solid #e3e3e3;padding:3px 10px;text-align:right;vertical-align:top}"
    "td{white-space:nowrap}th{background:#f3f3f3}td.chain,th.chain{text-align:left;white-space:normal;max-width:760px}"
    "code{font-size:12px}"
    "details pre{margin:4px 0;padding:6px}.alloc{color:#999}summary{color:#666;cursor:pointer}"
    "pre{font-size:12px;background:#f7f7f7;padding:12px;overflow-x:auto}";

/* The steady laps and the bound of the accesses' window at the run's budget. */
static bool steady_build(const struct rp_trace *t, const struct rp_laps *laps, const struct rp_accesses *a,
                         struct steady *st) {
  *st = (struct steady){ .budget = t->hdr.gpu_budget, .a = a };
  st->l = malloc((laps->n ? laps->n : 1) * sizeof *st->l);
  if (!st->l) return false;
  for (size_t i = 0; i < laps->n; i++)
    if (laps->l[i].phase == RP_STEADY) st->l[st->n++] = &laps->l[i];
  uint64_t read_all;
  st->has_least = a->matched && st->budget;
  return !st->has_least || rp_least_bound(a, &st->budget, 1, &st->least, &read_all);
}

/* The page; false after one line on stderr. */
static bool page(FILE *f, const struct rp_trace *t, const struct rp_chunks *cs, const struct rp_accesses *acc,
                 const struct rp_laps *laps, const struct steady *st, const struct memory *m, const char *text) {
  const struct axis a = { t->t0, t->t1 > t->t0 ? t->t1 : t->t0 + 1 };
  char cb[32], d[PST_DEVICE_NAME_MAX + 32];
  fprintf(f, "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>psshim trace</title>"
             "<style>%s</style></head><body>\n", STYLE);
  snprintf(d, sizeof d, "%s", t->hdr.device[0] ? t->hdr.device : "unnamed device");
  fputs("<h1>psshim trace</h1>\n<p class='meta'>", f);
  rp_html_escape(f, t->path);
  fprintf(f, " &mdash; pid %u on ", t->hdr.pid);
  rp_html_escape(f, d);
  fprintf(f, ", %.3f s traced, chunks of %s%s</p>\n", rp_secs(t, t->t1), rp_bytes(t->hdr.chunk_size, cb, sizeof cb),
          t->error[0] ? " &mdash; <b>the file is damaged: see the summary</b>" : "");
  const char *settings = rp_settings(t);
  if (settings) {
    fputs("<p class='meta'>Settings: ", f);
    rp_html_escape(f, settings);
    fputs("</p>\n", f);
  }
  struct rp_verdict v;
  if (!rp_verdict_build(t, cs, acc, &v)) {
    fprintf(stderr, "psshim-report: out of memory\n");
    return false;
  }
  fputs("<h2>What to change</h2>\n<ul class='verdict'>", f);
  for (size_t i = 0; i < v.n; i++) {
    fputs("<li>", f);
    rp_html_escape(f, v.line[i]);
    fputs("</li>", f);
  }
  fputs("</ul>\n<details class='note'><summary>Words used here</summary><b>Read in place</b>: a kernel reads a chunk "
        "that sits in pinned host memory across PCIe, without moving it. <b>Paged in, out</b>: psshim copied a chunk "
        "to the GPU or back to host memory. <b>LEAST TRAFFIC</b>: the fewest bytes any placement must bring onto "
        "the GPU in an iteration at the budget; the time it takes at the link's rate is the run's bound. "
        "<b>Named in host frames</b>: a launch's argument points into an allocation partly in host memory, so the "
        "kernel may read that part in place. <b>The owner</b>: the thread per device that makes the plan's moves ahead of the launches; a launch waits until its moment's moves are made. "
        "<b>Moments</b>: the launches, copies and collectives psshim observes, in order. <b>OPT</b>: the replay "
        "that evicts what is needed farthest ahead.</details>\n",
        f);
  glance(f, st);
  if (st->n) {
    fputs("<h2>Steady iterations: time, and bytes against LEAST TRAFFIC</h2>\n", f);
    steady_chart(f, st);
    steady_table(f, t, st);
  }
  const struct layer gpu[] = { { &m->gpu, GPU_COLOR, "chunks on GPU" },
                               { &m->nonmodel, NONMODEL_COLOR, "non-model (not paged)" } };
  const struct layer host[] = { { &m->host, HOST_COLOR, "chunks on host" } };
  memory_chart(f, t, laps, &a, "GPU memory over the run", gpu, m->sampled ? 2 : 1, t->hdr.gpu_budget);
  memory_chart(f, t, laps, &a, "Host memory (pinned) over the run", host, 1, t->hdr.host_budget);
  fprintf(f, "<p class='note'>%s Each pixel shows the moment of its highest total. Ticks above a chart: iteration marks; shaded: alternate steady "
             "iterations.</p>\n",
          m->sampled ? "From SAMPLE records." : "No SAMPLE records: rebuilt from chunk residency; non-model memory unknown.");
  if (acc->periodic) {
    const struct axis w = { acc->from, acc->to > acc->from ? acc->to : acc->from + 1 };
    fprintf(f, "<h2>Up close: %s</h2>\n", acc->window);
    memory_chart(f, t, NULL, &w, "GPU memory", gpu, m->sampled ? 2 : 1, t->hdr.gpu_budget);
    fputs("<h2>Paging</h2>\n", f);
    if (!traffic_chart(f, t, &w)) {
      fprintf(stderr, "psshim-report: out of memory\n");
      return false;
    }
  }
  if (!heat_map(f, cs, &a, t, laps)) {
    fprintf(stderr, "psshim-report: out of memory\n");
    return false;
  }
  if (!sites_table(f, t, cs)) return false;
  fputs("<h2>Summary</h2>\n<pre>", f);
  rp_html_escape(f, text);
  fputs("</pre>\n</body></html>\n", f);
  return true;
}

bool rp_html(const struct rp_trace *t, const struct rp_chunks *cs, const struct rp_accesses *a, const char *path) {
  struct memory m;
  struct rp_laps laps = { 0 };
  struct steady st = { 0 };
  char *text = NULL;
  size_t text_len = 0;
  if (!memory_build(t, cs, &m) || !rp_laps_build(t, cs, &laps) || !steady_build(t, &laps, a, &st)) {
    fprintf(stderr, "psshim-report: out of memory\n");
    series_free(&m.gpu);
    series_free(&m.host);
    series_free(&m.nonmodel);
    rp_laps_free(&laps);
    free(st.l);
    return false;
  }
  FILE *tf = open_memstream(&text, &text_len);
  bool ok = tf && rp_text(t, cs, a, tf);
  if (tf) fclose(tf);
  FILE *f = ok ? fopen(path, "w") : NULL;
  if (ok && !f) fprintf(stderr, "psshim-report: %s: %s\n", path, strerror(errno));
  ok = ok && f;
  if (ok) {
    ok = page(f, t, cs, a, &laps, &st, &m, text);
    if (fclose(f) != 0 && ok) {
      fprintf(stderr, "psshim-report: %s: %s\n", path, strerror(errno));
      ok = false;
    }
  }
  free(text);
  free(st.l);
  rp_laps_free(&laps);
  series_free(&m.gpu);
  series_free(&m.host);
  series_free(&m.nonmodel);
  return ok;
}
