/* Which of the tracer's ITERATION marks make the steady phase, and the laps between marks. */
#include <stdlib.h>
#include <string.h>

#include "tools/report.h"

bool rp_steady_marks(const struct rp_trace *t, size_t *first, size_t *last) {
  size_t run = SIZE_MAX, prev = SIZE_MAX; /* the current run's first mark, and the mark before */
  uint64_t best_ns = 0;
  bool found = false;
  for (size_t i = 0; i < t->nev; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type != PST_REC_ITERATION) continue;
    if (prev == SIZE_MAX || r->iteration.period != t->ev[prev].iteration.period) run = i;
    prev = i;
    /* Ties go to the later run: the step's own period outlasts the guesses before it. */
    uint64_t span = r->ts_ns - t->ev[run].ts_ns;
    if (r->iteration.period && (!found || span >= best_ns)) {
      *first = run;
      *last = i;
      best_ns = span;
      found = true;
    }
  }
  return found;
}

/* Finds the lap whose launches include event ev: the last lap opened before it. */
static void lap_in_place(void *user, size_t ev, size_t alloc, uint64_t host) {
  (void)alloc;
  struct rp_laps *laps = user;
  size_t lo = 0, hi = laps->n; /* the first lap opened after ev */
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (laps->l[mid].mark < ev) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0 || ev > laps->l[lo - 1].end) return;
  laps->l[lo - 1].in_place++;
  laps->l[lo - 1].in_place_bytes += host;
}

bool rp_laps_build(const struct rp_trace *t, const struct rp_chunks *cs, struct rp_laps *out) {
  size_t first = SIZE_MAX, last = SIZE_MAX, marks = 0, seen = 0;
  memset(out, 0, sizeof *out);
  rp_steady_marks(t, &first, &last); /* untouched where no mark has a period: all warm-up */
  for (size_t i = 0; i < t->nev; i++) marks += t->ev[i].type == PST_REC_ITERATION;
  if (marks < 2) return true;
  out->l = calloc(marks - 1, sizeof *out->l);
  if (!out->l) {
    fprintf(stderr, "psshim-report: out of memory\n");
    return false;
  }
  out->n = marks - 1;
  for (size_t i = 0; i < t->nev; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type == PST_REC_ITERATION) {
      if (seen > 0) {
        struct rp_lap *p = &out->l[seen - 1];
        p->end = i;
        p->to = r->ts_ns;
        p->phase = p->mark < first ? RP_WARMUP : i <= last ? RP_STEADY : RP_LATER;
        const struct pst_record *o = &t->ev[p->mark];
        p->has_pager = o->iteration.has_pager && r->iteration.has_pager &&
                       r->iteration.pager_ns >= o->iteration.pager_ns && r->iteration.turns_ns >= o->iteration.turns_ns &&
                       r->iteration.late_waits >= o->iteration.late_waits; /* damaged totals: none */
        if (p->has_pager) {
          p->pager_ns = r->iteration.pager_ns - o->iteration.pager_ns;
          p->turns_ns = r->iteration.turns_ns - o->iteration.turns_ns;
          p->late_waits = r->iteration.late_waits - o->iteration.late_waits;
        }
      }
      if (seen < out->n)
        out->l[seen] = (struct rp_lap){ .mark = i, .iteration = r->iteration.iteration,
                                        .period = r->iteration.period, .from = r->ts_ns };
      seen++;
    } else if (seen > 0 && seen < marks) { /* between the first mark and the last */
      struct rp_lap *p = &out->l[seen - 1];
      p->launches += r->type == PST_REC_LAUNCH;
      if (r->type == PST_REC_MIGRATION) *(r->migration.direction == PST_DIR_H2D ? &p->bytes_in : &p->bytes_out) += r->migration.bytes;
    }
  }
  if (rp_in_place(t, cs, out->l[0].mark, out->l[out->n - 1].end, lap_in_place, out)) return true;
  rp_laps_free(out);
  fprintf(stderr, "psshim-report: out of memory\n");
  return false;
}

void rp_laps_free(struct rp_laps *laps) {
  free(laps->l);
  memset(laps, 0, sizeof *laps);
}
