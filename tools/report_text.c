/* psshim-report's text summary, in the spirit of PatrickStar's profiler: the run, its
 * phases, every kind of data movement, where memory was allocated, where chunks lived. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/report.h"

#define MB 1e6 /* the DATA MOVE table's unit, like GB/s on a spec sheet */

static void run_header(const struct rp_trace *t, FILE *f) {
  const struct pst_trace_header *h = &t->hdr;
  char when[64] = "?", a[32], b[32], c[32], d[32];
  const time_t secs = (time_t)(h->wall_ns / 1000000000ull);
  struct tm tm;
  if (h->wall_ns && gmtime_r(&secs, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
  fprintf(f, "psshim-report %s\n\n", t->path);
  fprintf(f, "RUN\n");
  fprintf(f, "  process     pid %u on %s, started %s, traced for %.3f s\n", h->pid,
          h->device[0] ? h->device : "an unnamed device", when, rp_secs(t, t->t1));
  char chunk[48] = "size unset";
  if (h->chunk_size) snprintf(chunk, sizeof chunk, "%s each", rp_bytes(h->chunk_size, a, sizeof a));
  fprintf(f, "  chunks      %s; GPU budget %s, host budget %s\n", chunk,
          h->gpu_budget ? rp_bytes(h->gpu_budget, b, sizeof b) : "unset",
          h->host_budget ? rp_bytes(h->host_budget, c, sizeof c) : "unset");
  fprintf(f, "  chunk space 0x%llx, %s\n", (unsigned long long)h->space_base,
          rp_bytes(h->space_size, d, sizeof d));

  size_t count[PST_REC_TYPE_COUNT] = { 0 };
  for (size_t i = 0; i < t->nev; i++) count[t->ev[i].type]++;
  fprintf(f, "  trace       %llu records in %llu blocks, %s; %s\n", (unsigned long long)t->stats.records,
          (unsigned long long)t->stats.blocks, rp_bytes(t->stats.good_bytes, a, sizeof a),
          t->stats.clean_end ? "closed cleanly" : "not closed (the process died or is still running)");
  fprintf(f, "  records    ");
  bool any = false;
  for (unsigned k = PST_REC_ALLOC; k < PST_REC_END; k++)
    if (count[k]) {
      fprintf(f, " %zu %s", count[k], pst_record_type_name(k));
      any = true;
    }
  fprintf(f, "%s\n", any ? "" : " none besides the writer's own");
  if (t->error[0])
    fprintf(f, "  damage      %s; %s unreadable\n", t->error, rp_bytes(t->stats.lost_bytes, a, sizeof a));
  const char *settings = rp_settings(t);
  if (settings) fprintf(f, "  settings    %s\n", settings);
  size_t shown = 0;
  for (size_t i = 0; i < t->nev; i++) {
    if (t->ev[i].type != PST_REC_NOTE || (settings && t->ev[i].note.text + strlen(RP_SETTINGS) == settings)) continue;
    if (shown++ < 20)
      fprintf(f, "  note        +%.3f s  %s\n", rp_secs(t, t->ev[i].ts_ns), t->ev[i].note.text);
  }
  if (shown > 20) fprintf(f, "  note        ... and %zu more\n", shown - 20);
}

/* Appends period to list ("36, 40") unless it is 0 or the list is full. */
static void list_period(char *list, size_t len, uint64_t period) {
  size_t used = strlen(list);
  if (period && used + 24 < len)
    snprintf(list + used, len - used, "%s%llu", used ? ", " : "", (unsigned long long)period);
}

/* Per phase: the laps between consecutive ITERATION records (rp_laps_build). Steady: those
 * between the marks of rp_steady_marks; warm-up: those before; later: those after (another
 * loop). */
static void phases(const struct rp_trace *t, const struct rp_laps *laps, FILE *f) {
  struct acc {
    size_t iters, launches, with_pager;
    double secs, min, max;
    uint64_t in, out, in_place, pager_ns, turns_ns, late_waits;
  } ph[3] = { 0 };
  bool pager = false;
  const char *names[3] = { [RP_WARMUP] = "warm-up", [RP_STEADY] = "steady", [RP_LATER] = "later" };
  char other[2][96] = { "", "" }; /* periods of the marks before and after the steady ones */
  size_t first = SIZE_MAX, last = SIZE_MAX, prev = SIZE_MAX;
  uint64_t first_ns = 0;
  rp_steady_marks(t, &first, &last); /* untouched where no mark has a period: all warm-up */
  fprintf(f, "\nPHASES\n");
  for (size_t i = 0; i < t->nev; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type != PST_REC_ITERATION) continue;
    bool new_period = prev == SIZE_MAX || r->iteration.period != t->ev[prev].iteration.period;
    if (new_period && (i < first || i > last))
      list_period(other[i > first], sizeof other[0], r->iteration.period);
    if (prev == SIZE_MAX) first_ns = r->ts_ns;
    prev = i;
  }
  for (size_t k = 0; k < laps->n; k++) {
    const struct rp_lap *l = &laps->l[k];
    struct acc *a = &ph[l->phase];
    const double s = (double)(l->to - l->from) / 1e9;
    if (!a->iters || s < a->min) a->min = s;
    if (s > a->max) a->max = s;
    a->iters++;
    a->secs += s;
    a->launches += l->launches;
    a->in += l->bytes_in;
    a->out += l->bytes_out;
    a->in_place += l->in_place_bytes;
    if (l->has_pager) {
      a->with_pager++;
      a->pager_ns += l->pager_ns;
      a->turns_ns += l->turns_ns;
      a->late_waits += l->late_waits;
      pager = true;
    }
  }
  if (prev == SIZE_MAX) {
    fprintf(f, "  no ITERATION records: the run is one phase of %.3f s\n", rp_secs(t, t->t1));
    return;
  }
  fprintf(f, "  before the first iteration mark: %.3f s\n", rp_secs(t, first_ns));
  fprintf(f, "  per iteration: paged in and out, and at most read in place (launches that named an allocation\n"
             "  partly in host frames); LEAST TRAFFIC below bounds in + in place\n");
  if (pager)
    fprintf(f, "  and the pager's host time per iteration: the launching threads' (their waits for their\n"
               "  moments included), the moves' (remaps and copies queued, on the thread that made them),\n"
               "  launches that waited for a remap\n");
  fprintf(f, "  %-8s %10s %10s %10s %10s %10s %12s %12s %12s %14s", "phase", "iterations", "total s", "mean s",
          "min s", "max s", "launches/it", "in MB/it", "out MB/it", "in place MB/it");
  if (pager)
    fprintf(f, " %12s %12s %8s", "pager ms/it", "moves ms/it", "late/it");
  fputc('\n', f);
  for (int k = 0; k < 3; k++) {
    const struct acc *a = &ph[k];
    if (!a->iters) continue;
    const double n = (double)a->iters;
    fprintf(f, "  %-8s %10zu %10.3f %10.4f %10.4f %10.4f %12.0f %12.1f %12.1f %14.1f", names[k], a->iters, a->secs,
            a->secs / n, a->min, a->max, (double)a->launches / n, (double)a->in / MB / n, (double)a->out / MB / n,
            (double)a->in_place / MB / n);
    if (pager && a->with_pager) {
      const double w = (double)a->with_pager;
      fprintf(f, " %12.2f %12.2f %8.1f", (double)a->pager_ns / 1e6 / w, (double)a->turns_ns / 1e6 / w,
              (double)a->late_waits / w);
    } else if (pager) {
      fprintf(f, " %12s %12s %8s", "-", "-", "-");
    }
    fputc('\n', f);
  }
  if (other[0][0])
    fprintf(f, "  warm-up marks also came from periods taken for the iteration before the steady one: %s launches\n",
            other[0]);
  if (other[1][0])
    fprintf(f, "  later marks came from other periods than the steady one (another loop): %s launches\n", other[1]);
  fprintf(f, "  after the last mark (iteration %llu): %.3f s until the trace ends, not counted above\n",
          (unsigned long long)t->ev[prev].iteration.iteration, rp_secs(t, t->t1) - rp_secs(t, t->ev[prev].ts_ns));
}

static void data_move(const struct rp_trace *t, FILE *f) {
  /* rows: the four copy kinds, then migrations by direction and reason */
  enum { COPIES = 4, ROWS = COPIES + 2 * 3 };
  struct row { uint64_t bytes, times, ns; } row[ROWS] = { { 0 } };
  for (size_t i = 0; i < t->nev; i++) {
    const struct pst_record *r = &t->ev[i];
    struct row *w;
    uint64_t start, end;
    if (r->type == PST_REC_COPY && r->copy.kind < COPIES) {
      w = &row[r->copy.kind];
      w->bytes += r->copy.bytes;
      start = r->copy.start_ns, end = r->copy.end_ns;
    } else if (r->type == PST_REC_MIGRATION && r->migration.direction < 2 && r->migration.reason < 3) {
      w = &row[COPIES + r->migration.direction * 3 + r->migration.reason];
      w->bytes += r->migration.bytes;
      start = r->migration.start_ns, end = r->migration.end_ns;
    } else {
      continue;
    }
    w->times++;
    if (end > start) w->ns += end - start;
  }
  fprintf(f, "\nDATA MOVE (MB = 10^6 bytes; MB/s over the time the transfers took)\n");
  fprintf(f, "  %-28s %12s %10s %12s %12s\n", "kind", "MB", "times", "busy ms", "MB/s");
  bool any = false;
  struct row paging = { 0 };
  for (int k = 0; k < ROWS; k++) {
    const struct row *w = &row[k];
    if (!w->times) continue;
    char name[64];
    if (k < COPIES) snprintf(name, sizeof name, "app copy %s", pst_copy_kind_name((unsigned)k));
    else snprintf(name, sizeof name, "paging %s (%s)", pst_direction_name((unsigned)(k - COPIES) / 3),
                  pst_reason_name((unsigned)(k - COPIES) % 3));
    char rate[32] = "-";
    if (w->ns) snprintf(rate, sizeof rate, "%.1f", (double)w->bytes / MB / ((double)w->ns / 1e9));
    fprintf(f, "  %-28s %12.3f %10llu %12.3f %12s\n", name, (double)w->bytes / MB,
            (unsigned long long)w->times, (double)w->ns / 1e6, rate);
    if (k >= COPIES) {
      paging.bytes += w->bytes;
      paging.times += w->times;
      paging.ns += w->ns;
    }
    any = true;
  }
  if (!any) fprintf(f, "  no copies or migrations recorded\n");
  if (paging.times)
    fprintf(f, "  %-28s %12.3f %10llu %12.3f\n", "paging, all", (double)paging.bytes / MB,
            (unsigned long long)paging.times, (double)paging.ns / 1e6);
}

/* From the first frame outside the allocators (rp_stack_start), up to 8. */
static void print_stack(const struct rp_trace *t, uint32_t id, FILE *f) {
  if (!id || id >= t->nstacks || !t->stacks[id].frames) {
    fprintf(f, "      (no stack recorded)\n");
    return;
  }
  const struct rp_stack *s = &t->stacks[id];
  const uint32_t start = rp_stack_start(t, s);
  char name[512];
  if (start) fprintf(f, "      (%u frame%s of the allocators above)\n", start, start == 1 ? "" : "s");
  for (uint32_t i = start; i < s->depth && i < start + 8; i++)
    fprintf(f, "      %s+0x%x\n", rp_demangle(rp_string(t, s->frames[i].symbol), name, sizeof name),
            s->frames[i].offset);
  if (s->depth > start + 8) fprintf(f, "      ... %u more frames\n", s->depth - start - 8);
}

static bool alloc_sites(const struct rp_trace *t, const struct rp_chunks *cs, FILE *f) {
  struct rp_sites ss;
  if (!rp_sites_build(t, cs, &ss)) return false;
  fprintf(f, "\nALLOCATION SITES (top 10 by peak live bytes)\n");
  if (!ss.n) fprintf(f, "  no ALLOC records\n");
  char a[32], b[32];
  if (ss.placed) {
    fprintf(f, "  where: each site's bytes at the last peak of all live bytes (%s at %.3f s)\n",
            rp_bytes(ss.peak, a, sizeof a), rp_secs(t, ss.peak_ts));
    fprintf(f, "  in place: %s launches that named one of the site's allocations by its start\n"
               "    while some of it was in host frames, and those bytes: what they read across PCIe at most\n",
            ss.laps ? "a steady iteration's (on average)" : "the trace's");
  }
  const uint64_t laps = ss.laps ? ss.laps : 1;
  for (size_t i = 0; i < 10 && i < ss.n; i++) {
    const struct rp_site *w = &ss.s[i];
    fprintf(f, "  #%zu  peak live %s, %llu allocations, %s in all\n", i + 1, rp_bytes(w->peak, a, sizeof a),
            (unsigned long long)w->allocs, rp_bytes(w->bytes, b, sizeof b));
    if (ss.placed && !w->at_gpu && !w->at_host)
      fprintf(f, "      where: none of it live then\n");
    else if (ss.placed)
      fprintf(f, "      where: %s on the GPU, %s in host frames\n", rp_bytes(w->at_gpu, a, sizeof a),
              rp_bytes(w->at_host, b, sizeof b));
    if (ss.placed)
      fprintf(f, "      in place: %llu launches, %s\n", (unsigned long long)(w->in_place / laps),
              rp_bytes(w->in_place_bytes / laps, a, sizeof a));
    print_stack(t, w->stack, f);
  }
  rp_sites_free(&ss);
  return true;
}

static int by_moves(const void *a, const void *b) {
  const struct rp_chunk *x = a, *y = b;
  const uint64_t mx = x->ins + x->outs, my = y->ins + y->outs;
  if (mx != my) return mx > my ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

static bool residency(const struct rp_chunks *cs, FILE *f) {
  enum { SHOW = 40 };
  fprintf(f, "\nCHUNKS (residency)\n");
  if (!cs->n) {
    fprintf(f, "  no CHUNK or MIGRATION records\n");
    return true;
  }
  /* The busiest chunks when there are many; all of them, by id, when few. */
  struct rp_chunk *c = malloc(cs->n * sizeof *c);
  if (!c) {
    fprintf(stderr, "psshim-report: out of memory\n");
    return false;
  }
  memcpy(c, cs->c, cs->n * sizeof *c);
  if (cs->n > SHOW) qsort(c, cs->n, sizeof *c, by_moves);
  uint64_t gpu = 0, host = 0, ins = 0, outs = 0;
  for (size_t i = 0; i < cs->n; i++) {
    gpu += cs->c[i].gpu_ns;
    host += cs->c[i].host_ns;
    ins += cs->c[i].ins;
    outs += cs->c[i].outs;
  }
  fprintf(f, "  %zu chunks; chunk-seconds on GPU %.3f, on host %.3f; %llu page-ins, %llu page-outs\n", cs->n,
          (double)gpu / 1e9, (double)host / 1e9, (unsigned long long)ins, (unsigned long long)outs);
  if (cs->n > SHOW) fprintf(f, ins + outs ? "  the %d with the most migrations:\n" : "  the first %d (none migrated):\n", SHOW);
  fprintf(f, "  %8s %10s %10s %10s %6s %6s %6s %12s\n", "chunk", "size MiB", "GPU s", "host s", "GPU %",
          "in", "out", "moved MB");
  for (size_t i = 0; i < cs->n && i < SHOW; i++) {
    const double life = (double)(c[i].gpu_ns + c[i].host_ns);
    fprintf(f, "  %8u %10.1f %10.3f %10.3f %6.1f %6llu %6llu %12.1f\n", c[i].id, (double)c[i].size / 1048576.0,
            (double)c[i].gpu_ns / 1e9, (double)c[i].host_ns / 1e9, life > 0 ? 100.0 * (double)c[i].gpu_ns / life : 0.0,
            (unsigned long long)c[i].ins, (unsigned long long)c[i].outs,
            (double)(c[i].bytes_in + c[i].bytes_out) / MB);
  }
  free(c);
  return true;
}

static bool what_to_change(const struct rp_trace *t, const struct rp_chunks *cs, const struct rp_accesses *a,
                           FILE *f) {
  struct rp_verdict v;
  if (!rp_verdict_build(t, cs, a, &v)) {
    fprintf(stderr, "psshim-report: out of memory\n");
    return false;
  }
  fprintf(f, "\nWHAT TO CHANGE\n");
  for (size_t i = 0; i < v.n; i++) fprintf(f, "  %s\n", v.line[i]);
  return true;
}

bool rp_text(const struct rp_trace *t, const struct rp_chunks *cs, const struct rp_accesses *a, FILE *out) {
  struct rp_laps laps;
  run_header(t, out);
  if (a && !what_to_change(t, cs, a, out)) return false;
  if (!rp_laps_build(t, cs, &laps)) return false;
  phases(t, &laps, out);
  rp_laps_free(&laps);
  data_move(t, out);
  return rp_pageouts(t, out) && rp_moves(t, cs, out) && alloc_sites(t, cs, out) && residency(cs, out);
}
