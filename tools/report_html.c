/* --html: one self-contained page (inline SVG and CSS, no scripts): GPU and host memory
 * over time by class, a chunk x time residency heat map, and the text summary. All charts
 * share one time axis, so they line up. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tools/report.h"

enum { W = 1200, LEFT = 80, RIGHT = 20, BINS = 600, MAX_ROWS = 300 };
#define PLOT_W (W - LEFT - RIGHT)
#define GPU_COLOR "#e8742a"
#define HOST_COLOR "#3f73c4"
#define NONMODEL_COLOR "#9a9a9a"

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

static void iteration_marks(FILE *f, const struct rp_trace *t, const struct axis *a, double y0, double y1) {
  size_t n = 0;
  for (size_t i = 0; i < t->nev; i++) n += t->ev[i].type == PST_REC_ITERATION;
  const size_t every = n > 40 ? (n + 39) / 40 : 1; /* at most ~40 labels */
  size_t k = 0;
  for (size_t i = 0; i < t->nev; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type != PST_REC_ITERATION) continue;
    const double x = x_of(a, r->ts_ns);
    fprintf(f, "<line x1='%.1f' x2='%.1f' y1='%.1f' y2='%.1f' class='iter'/>", x, x, y0, y1);
    if (k++ % every == 0)
      fprintf(f, "<text x='%.1f' y='%.1f' class='itlabel'>%llu</text>", x + 2, y0 + 9,
              (unsigned long long)r->iteration.iteration);
  }
  fputc('\n', f);
}

/* Peak of s in each of BINS time bins (peaks survive the squeeze into pixels). */
static void bin_peaks(const struct series *s, const struct axis *a, double *out) {
  const double width = (double)(a->t1 - a->t0) / BINS;
  for (int b = 0; b < BINS; b++) out[b] = 0;
  for (size_t i = 0; i < s->n; i++) {
    const uint64_t from = s->t[i], to = i + 1 < s->n ? s->t[i + 1] : a->t1;
    int b0 = (int)((double)(from > a->t0 ? from - a->t0 : 0) / width);
    int b1 = (int)((double)(to > a->t0 ? to - a->t0 : 0) / width);
    if (b0 >= BINS) b0 = BINS - 1;
    if (b1 >= BINS) b1 = BINS - 1;
    for (int b = b0; b <= b1; b++)
      if ((double)s->v[i] > out[b]) out[b] = (double)s->v[i];
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

/* One memory chart: stacked classes, a dashed budget line, axes, legend. */
struct layer { const struct series *s; const char *color, *label; };

static void memory_chart(FILE *f, const struct rp_trace *t, const struct axis *a, const char *title,
                         const struct layer *layers, int nlayers, uint64_t budget, const char *budget_label) {
  enum { H = 220, TOP = 28, BOTTOM = 24 };
  static double lower[BINS], upper[BINS], peak[BINS];
  double ymax = (double)budget;
  for (int b = 0; b < BINS; b++) upper[b] = 0;
  for (int l = 0; l < nlayers; l++) {
    bin_peaks(layers[l].s, a, peak);
    for (int b = 0; b < BINS; b++) {
      upper[b] += peak[b];
      if (upper[b] > ymax) ymax = upper[b];
    }
  }
  if (ymax <= 0) ymax = 1 << 30;
  ymax *= 1.08;
  const double gib = 1024.0 * 1024 * 1024, step = nice_step(ymax / gib, 5) * gib;
  fprintf(f, "<h2>%s</h2>\n<svg width='%d' height='%d' viewBox='0 0 %d %d'>\n", title, W, TOP + H + BOTTOM, W,
          TOP + H + BOTTOM);
  for (double v = 0; v <= ymax; v += step) {
    const double y = TOP + H - v / ymax * H;
    fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' class='grid'/>", LEFT, LEFT + PLOT_W, y, y);
    fprintf(f, "<text x='%d' y='%.1f' class='tick' text-anchor='end'>%g GiB</text>\n", LEFT - 6, y + 4, v / gib);
  }
  time_ticks(f, a, TOP, TOP + H);
  for (int b = 0; b < BINS; b++) lower[b] = upper[b] = 0;
  for (int l = 0; l < nlayers; l++) {
    bin_peaks(layers[l].s, a, peak);
    for (int b = 0; b < BINS; b++) upper[b] = lower[b] + peak[b];
    band(f, lower, upper, TOP, H, ymax, layers[l].color);
    memcpy(lower, upper, sizeof lower);
  }
  if (budget) {
    const double y = TOP + H - (double)budget / ymax * H;
    char b[32];
    fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' class='budget'/>", LEFT, LEFT + PLOT_W, y, y);
    fprintf(f, "<text x='%d' y='%.1f' class='tick' text-anchor='end'>%s %s</text>\n", LEFT + PLOT_W - 4, y - 4,
            budget_label, rp_bytes(budget, b, sizeof b));
  }
  iteration_marks(f, t, a, TOP, TOP + H);
  fprintf(f, "<rect x='%d' y='%d' width='%d' height='%d' class='frame'/>\n", LEFT, TOP, PLOT_W, H);
  int x = LEFT;
  for (int l = 0; l < nlayers; l++) {
    fprintf(f, "<rect x='%d' y='8' width='12' height='12' fill='%s'/><text x='%d' y='18' class='legend'>%s</text>",
            x, layers[l].color, x + 16, layers[l].label);
    x += 24 + 7 * (int)strlen(layers[l].label);
  }
  fputs("\n</svg>\n", f);
}

/* ---- the residency heat map ---- */

/* A colour between host blue and GPU orange by the GPU share, faded by occupancy. */
static void cell_style(char *buf, size_t len, double gpu_share, double occupancy) {
  const int q = (int)lround(gpu_share * 8), o = (int)lround(occupancy * 4);
  const int r = 0x3f + (0xe8 - 0x3f) * q / 8, g = 0x73 + (0x74 - 0x73) * q / 8, b = 0xc4 + (0x2a - 0xc4) * q / 8;
  snprintf(buf, len, "#%02x%02x%02x' fill-opacity='%.2f", r, g, b, o < 1 ? 0.25 : o / 4.0);
}

static bool heat_map(FILE *f, const struct rp_chunks *cs, const struct axis *a, const struct rp_trace *t) {
  enum { COLS = 300, TOP = 8 };
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
  for (size_t row = 0; row < rows; row++) {
    const size_t c0 = row * per_row, c1 = c0 + per_row < cs->n ? c0 + per_row : cs->n;
    uint64_t g_ns = 0, h_ns = 0, ins = 0, outs = 0;
    for (int b = 0; b < COLS; b++) gpu[b] = host[b] = 0;
    for (size_t c = c0; c < c1; c++) {
      const struct rp_chunk *ch = &cs->c[c];
      g_ns += ch->gpu_ns, h_ns += ch->host_ns, ins += ch->ins, outs += ch->outs;
      for (size_t s = 0; s < ch->nspans; s++) {
        const struct rp_span *sp = &ch->spans[s];
        const double from = (double)(sp->from - a->t0), to = (double)(sp->to - a->t0);
        for (int b = (int)(from / bin); b < COLS && b * bin < to; b++) {
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
  iteration_marks(f, t, a, TOP, TOP + h);
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
    ".meta{color:#555;font-size:13px}.note{color:#666;font-size:12px;margin:2px 0}"
    "svg{display:block}.grid{stroke:#e6e6e6}.frame{fill:none;stroke:#999}"
    ".tick{font-size:11px;fill:#555}.legend{font-size:12px;fill:#333}"
    ".budget{stroke:#c0392b;stroke-dasharray:6 4;stroke-width:1.5}"
    ".iter{stroke:#8e44ad;stroke-opacity:.35}.itlabel{font-size:9px;fill:#8e44ad}"
    ".sw{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:-1px}"
    "pre{font-size:12px;background:#f7f7f7;padding:12px;overflow-x:auto}";

bool rp_html(const struct rp_trace *t, const struct rp_chunks *cs, const char *path) {
  struct memory m;
  if (!memory_build(t, cs, &m)) {
    fprintf(stderr, "psshim-report: out of memory\n");
    return false;
  }
  char *text = NULL;
  size_t text_len = 0;
  FILE *tf = open_memstream(&text, &text_len);
  bool ok = tf && rp_text(t, cs, tf);
  if (tf) fclose(tf);
  FILE *f = ok ? fopen(path, "w") : NULL;
  if (ok && !f) fprintf(stderr, "psshim-report: %s: %s\n", path, strerror(errno));
  ok = ok && f;
  if (ok) {
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
    const struct layer gpu[] = { { &m.gpu, GPU_COLOR, "chunks on GPU" },
                                 { &m.nonmodel, NONMODEL_COLOR, "non-model (not paged)" } };
    const struct layer host[] = { { &m.host, HOST_COLOR, "chunks on host" } };
    memory_chart(f, t, &a, "GPU memory", gpu, m.sampled ? 2 : 1, t->hdr.gpu_budget, "budget");
    memory_chart(f, t, &a, "Host memory (pinned)", host, 1, t->hdr.host_budget, "budget");
    fprintf(f, "<p class='note'>%s Per-pixel peaks. Purple lines: iteration starts.</p>\n",
            m.sampled ? "From SAMPLE records." : "No SAMPLE records: rebuilt from chunk residency; non-model memory unknown.");
    ok = heat_map(f, cs, &a, t);
    fputs("<h2>Summary</h2>\n<pre>", f);
    rp_html_escape(f, text);
    fputs("</pre>\n</body></html>\n", f);
    if (fclose(f) != 0 && ok) {
      fprintf(stderr, "psshim-report: %s: %s\n", path, strerror(errno));
      ok = false;
    }
  }
  free(text);
  series_free(&m.gpu);
  series_free(&m.host);
  series_free(&m.nonmodel);
  return ok;
}
