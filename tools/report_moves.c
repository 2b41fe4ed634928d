/* MOVES: what each of the steady phase's moves cost the thread that made it (its remap and
 * queueing its copy: the MIGRATION record's start to end), by direction and by whether a
 * launch shortly before it named a chunk in host frames: a remap beside kernels that read
 * host memory takes many times its idle time, and this says whether a run's moves paid that. */
#include <stdlib.h>

#include "tools/report.h"

/* Launches looked back over. A remap is slow while a kernel that reads host memory runs; where
 * the launching thread is the bottleneck the GPU runs the last few launches, so a short look
 * back finds the kernels running beside the remap, and a long one (what may be queued)
 * blurs the split with launches long done. */
#define BEFORE 4

struct costs {
  uint64_t *ns;
  size_t n, cap;
};

static bool add(struct costs *c, uint64_t ns) {
  if (!rp_reserve((void **)&c->ns, &c->cap, c->n, sizeof *c->ns)) return false;
  c->ns[c->n++] = ns;
  return true;
}

static void mark_in_place(void *user, size_t ev, size_t alloc, uint64_t host) {
  (void)alloc, (void)host;
  ((bool *)user)[ev] = true;
}

static void row(FILE *f, const char *direction, const char *in_place, struct costs *c) {
  if (!c->n) return;
  qsort(c->ns, c->n, sizeof *c->ns, rp_cmp_u64);
  double sum = 0;
  for (size_t i = 0; i < c->n; i++) sum += (double)c->ns[i];
  fprintf(f, "  %-9s  %-8s  %8zu  %9.0f  %9.0f  %9.0f\n", direction, in_place, c->n, (double)c->ns[c->n / 2] / 1e3,
          (double)c->ns[c->n * 9 / 10] / 1e3, sum / (double)c->n / 1e3);
}

bool rp_moves(const struct rp_trace *t, const struct rp_chunks *cs, FILE *f) {
  size_t first = 0, last = 0;
  if (!rp_steady_marks(t, &first, &last) || first == last) return true;
  bool *in_place = calloc(t->nev ? t->nev : 1, sizeof *in_place), *window = calloc(BEFORE, sizeof *window);
  struct costs by[2][2] = { 0 }; /* [to the GPU][in place before] */
  bool ok = in_place && window && rp_in_place(t, cs, 0, last, mark_in_place, in_place);
  size_t launches = 0, in_window = 0;
  for (size_t i = 0; i < last && ok; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type == PST_REC_LAUNCH) {
      const size_t k = launches++ % BEFORE;
      in_window -= window[k];
      window[k] = in_place[i];
      in_window += window[k];
    } else if (r->type == PST_REC_MIGRATION && i > first && r->migration.end_ns >= r->migration.start_ns) {
      ok = add(&by[r->migration.direction == PST_DIR_H2D][in_window > 0], r->migration.end_ns - r->migration.start_ns);
    }
  }
  if (ok && (by[0][0].n || by[0][1].n || by[1][0].n || by[1][1].n)) {
    fprintf(f, "\nMOVES (the steady phase's: the thread that made each spent its remap and the queueing of its copy)\n");
    fprintf(f, "  in place: whether one of the %d launches before it named a chunk in host frames\n", BEFORE);
    fprintf(f, "  direction  in place     moves  median us     p90 us    mean us\n");
    static const char *const directions[2] = { "out (d2h)", "in (h2d)" };
    for (int g = 1; g >= 0; g--) {
      row(f, directions[g], "yes", &by[g][1]);
      row(f, directions[g], "no", &by[g][0]);
    }
  }
  for (int g = 0; g < 2; g++)
    for (int p = 0; p < 2; p++) free(by[g][p].ns);
  free(in_place);
  free(window);
  if (!ok) fprintf(stderr, "psshim-report: out of memory\n");
  return ok;
}
