/* Which of the tracer's ITERATION marks make the steady phase. */
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
