/* PAGE-OUTS: what came of the chunks the steady phase paged out, up to their next page-in:
 * back on the GPU before any launch named them, read in place first, or freed (their data
 * died in host frames: the copy out bought nothing), or still out when the trace ends. */
#include <stdlib.h>

#include "tools/report.h"

enum fate { BACK, BACK_READ, FREED, FREED_READ, STILL_OUT, READ_OUT, FATES };

struct pageout_chunk {
  uint32_t live;    /* live allocations with bytes in it */
  uint32_t touches; /* launches that named it since its page-out, +1 (0: not out) */
};

struct pageouts {
  struct pageout_chunk *c; /* by chunk */
  size_t n;
  uint64_t fate[FATES], touches_all;
};

/* The chunks of the trace's chunk space: no damaged id makes the tables larger. */
static uint64_t space_chunks(const struct rp_trace *t) {
  return t->hdr.chunk_size ? t->hdr.space_size / t->hdr.chunk_size : 0;
}

/* The chunks [first, end) an allocation at addr of size bytes holds bytes of, within the
 * chunk space (rp_in_space); false when it has none there. */
static bool chunks_of(const struct rp_trace *t, uint64_t addr, uint64_t size, size_t *first, size_t *end) {
  const uint64_t len = rp_in_space(t, addr, size), off = addr - t->hdr.space_base;
  if (!len) return false;
  *first = off / t->hdr.chunk_size;
  *end = (off + len - 1) / t->hdr.chunk_size + 1;
  return true;
}

static void settle(struct pageouts *p, size_t chunk, enum fate untouched, enum fate read) {
  if (chunk >= p->n || !p->c[chunk].touches) return;
  p->fate[p->c[chunk].touches > 1 ? read : untouched]++;
  p->c[chunk].touches = 0;
}

static bool grow_to(struct pageouts *p, size_t chunk) {
  return rp_reserve((void **)&p->c, &p->n, chunk, sizeof *p->c);
}

bool rp_pageouts(const struct rp_trace *t, FILE *f) {
  size_t first = 0, last = 0;
  if (!rp_steady_marks(t, &first, &last) || first == last) return true;
  struct pageouts p = { 0 };
  struct rp_map allocs = { 0 }; /* address -> size */
  uint64_t outs = 0;
  bool ok = true;
  for (size_t i = 0; i < t->nev && ok; i++) {
    const struct pst_record *r = &t->ev[i];
    size_t c0, c1;
    uint64_t size;
    if (r->type == PST_REC_ALLOC && chunks_of(t, r->alloc.addr, r->alloc.size, &c0, &c1)) {
      ok = rp_map_put(&allocs, r->alloc.addr, r->alloc.size) && grow_to(&p, c1 - 1);
      for (size_t c = c0; ok && c < c1; c++) p.c[c].live++;
    } else if (r->type == PST_REC_FREE && rp_map_del(&allocs, r->free.addr, &size) &&
               chunks_of(t, r->free.addr, size, &c0, &c1)) {
      for (size_t c = c0; c < c1 && c < p.n; c++)
        if (p.c[c].live && !--p.c[c].live) settle(&p, c, FREED, FREED_READ);
    } else if (r->type == PST_REC_CHUNK && r->chunk.event == PST_CHUNK_RELEASED) {
      settle(&p, r->chunk.id, FREED, FREED_READ);
    } else if (r->type == PST_REC_MIGRATION && r->migration.direction == PST_DIR_H2D) {
      settle(&p, r->migration.chunk, BACK, BACK_READ);
    } else if (r->type == PST_REC_MIGRATION && i > first && i < last && r->migration.chunk < space_chunks(t)) {
      ok = grow_to(&p, r->migration.chunk);
      if (ok && !p.c[r->migration.chunk].touches) {
        p.c[r->migration.chunk].touches = 1;
        outs++;
      }
    } else if (r->type == PST_REC_LAUNCH) {
      for (uint32_t k = 0; k < r->launch.n; k++)
        if (rp_map_get(&allocs, r->launch.ptrs[k], &size) && chunks_of(t, r->launch.ptrs[k], size, &c0, &c1))
          for (size_t c = c0; c < c1 && c < p.n; c++)
            if (p.c[c].touches) {
              p.c[c].touches++;
              p.touches_all++;
            }
    }
  }
  for (size_t c = 0; c < p.n && ok; c++) settle(&p, c, STILL_OUT, READ_OUT);
  free(p.c);
  rp_map_free(&allocs);
  if (!ok) {
    fprintf(stderr, "psshim-report: out of memory\n");
    return false;
  }
  if (!outs) return true;
  size_t laps = 0;
  for (size_t i = first; i < last; i++) laps += t->ev[i].type == PST_REC_ITERATION;
  fprintf(f, "\nPAGE-OUTS (the steady phase's, by what came of each chunk before it was paged in again)\n");
  fprintf(f, "  %llu chunks paged out in %zu iteration%s (%.1f an iteration); launches named them %llu times "
             "while in host frames\n",
          (unsigned long long)outs, laps, laps == 1 ? "" : "s", (double)outs / (double)laps,
          (unsigned long long)p.touches_all);
  static const char *const names[FATES] = {
      "back on the GPU before any launch named them", "read in place, then back on the GPU",
      "freed untouched (the copy out bought nothing)", "read in place, then freed", "still out at the end",
      "read in place, still out at the end"};
  for (int k = 0; k < FATES; k++)
    if (p.fate[k])
      fprintf(f, "  %-48s %8llu  %5.1f%%\n", names[k], (unsigned long long)p.fate[k],
              100.0 * (double)p.fate[k] / (double)outs);
  return true;
}
