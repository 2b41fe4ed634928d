/* Allocations: where their bytes were (GPU or host frames), which launches read them in
 * host frames, and the sites (stacks) that made them. Shared by the text and the HTML. */
#include <stdlib.h>
#include <string.h>

#include "tools/report.h"

uint64_t rp_in_space(const struct rp_trace *t, uint64_t addr, uint64_t size) {
  const struct pst_trace_header *h = &t->hdr;
  if (!h->chunk_size || addr < h->space_base || addr - h->space_base >= h->space_size) return 0;
  const uint64_t room = h->space_size - (addr - h->space_base);
  return size < room ? size : room;
}

void rp_split(const struct rp_trace *t, const struct rp_chunks *cs, const struct pst_record *a, uint64_t ts,
              uint64_t *gpu, uint64_t *host) {
  const uint64_t size = t->hdr.chunk_size, len = rp_in_space(t, a->alloc.addr, a->alloc.size);
  if (!len) return;
  /* Offsets in the space; the chunks the trace knows of in [lo, hi), not every chunk of
   * the range: a damaged header's tiny chunk size would make those countless. */
  const uint64_t from = a->alloc.addr - t->hdr.space_base, to = from + len, lo = from / size, hi = (to - 1) / size;
  size_t k = 0, n = cs->n;
  while (k < n) { /* the first chunk known with id >= lo */
    const size_t mid = k + (n - k) / 2;
    if (cs->c[mid].id < lo) k = mid + 1;
    else n = mid;
  }
  for (; k < cs->n && cs->c[k].id <= hi; k++) {
    const uint64_t start = (uint64_t)cs->c[k].id * size, at = start > from ? start : from,
                   end = to - start > size ? start + size : to;
    const enum rp_where w = rp_chunk_where(&cs->c[k], ts);
    if (w == RP_GPU) *gpu += end - at;
    if (w == RP_HOST) *host += end - at;
  }
}

/* Live allocations follow ALLOC and FREE through a map addr -> ALLOC; a launch names one
 * by its start (a kernel's argument is a tensor's data pointer). */
bool rp_in_place(const struct rp_trace *t, const struct rp_chunks *cs, size_t from, size_t to, rp_in_place_fn fn,
                 void *user) {
  struct rp_map live = { 0 };
  bool ok = true;
  for (size_t i = 0; i <= to && i < t->nev && ok; i++) {
    const struct pst_record *r = &t->ev[i];
    uint64_t at;
    if (r->type == PST_REC_ALLOC) ok = rp_map_put(&live, r->alloc.addr, i);
    else if (r->type == PST_REC_FREE) rp_map_del(&live, r->free.addr, NULL);
    else if (r->type == PST_REC_LAUNCH && i >= from)
      for (uint32_t k = 0; k < r->launch.n; k++) {
        uint64_t gpu = 0, host = 0;
        if (!rp_map_get(&live, r->launch.ptrs[k], &at)) continue;
        rp_split(t, cs, &t->ev[at], r->ts_ns, &gpu, &host);
        if (host) fn(user, i, (size_t)at, host);
      }
  }
  rp_map_free(&live);
  return ok;
}

struct site_index { const struct rp_trace *t; struct rp_site *site; };

static struct rp_site *site_of(const struct rp_trace *t, struct rp_site *site, const struct pst_record *a) {
  return &site[a->alloc.stack < t->nstacks ? a->alloc.stack : 0];
}

static void count_in_place(void *user, size_t ev, size_t alloc, uint64_t host) {
  (void)ev;
  const struct site_index *x = user;
  struct rp_site *w = site_of(x->t, x->site, &x->t->ev[alloc]);
  w->in_place++;
  w->in_place_bytes += host;
}

static int by_peak(const void *a, const void *b) {
  const struct rp_site *x = a, *y = b;
  if (x->peak != y->peak) return x->peak > y->peak ? -1 : 1;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  return x->allocs > y->allocs ? -1 : x->allocs < y->allocs; /* sites that allocated before those that did not */
}

/* Sites by stack id. A first pass follows live bytes per site and in all; the launches of
 * the steady phase (all of them without one) that read a site's allocations in host frames
 * are counted by rp_in_place; a replay of allocations up to the last peak of all live bytes
 * (a steady step's, not warm-up's) splits what each site held then between GPU and host. */
bool rp_sites_build(const struct rp_trace *t, const struct rp_chunks *cs, struct rp_sites *out) {
  memset(out, 0, sizeof *out);
  struct rp_site *site = calloc(t->nstacks + 1, sizeof *site);
  struct rp_map live = { 0 };
  bool ok = site != NULL;
  size_t peak_at = 0, first = 0, last = t->nev ? t->nev - 1 : 0;
  uint64_t total = 0;
  const bool steady = rp_steady_marks(t, &first, &last);
  for (size_t i = first; steady && i <= last; i++) out->laps += t->ev[i].type == PST_REC_ITERATION;
  out->laps = out->laps ? out->laps - 1 : 0;
  for (size_t i = 0; i < t->nev && ok; i++) {
    const struct pst_record *r = &t->ev[i];
    uint64_t at;
    if (r->type == PST_REC_ALLOC) {
      struct rp_site *w = site_of(t, site, r);
      w->stack = (uint32_t)(w - site);
      w->bytes += r->alloc.size;
      w->allocs++;
      w->live += r->alloc.size;
      if (w->live > w->peak) w->peak = w->live;
      ok = rp_map_put(&live, r->alloc.addr, i);
      total += r->alloc.size;
      if (total >= out->peak) {
        out->peak = total;
        peak_at = i;
      }
    } else if (r->type == PST_REC_FREE && rp_map_del(&live, r->free.addr, &at)) {
      site_of(t, site, &t->ev[at])->live -= t->ev[at].alloc.size;
      total -= t->ev[at].alloc.size;
    }
  }
  rp_map_free(&live);
  struct site_index x = { t, site };
  ok = ok && rp_in_place(t, cs, first, last, count_in_place, &x);
  for (size_t i = 0; i <= peak_at && i < t->nev && ok; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type == PST_REC_ALLOC) ok = rp_map_put(&live, r->alloc.addr, i);
    else if (r->type == PST_REC_FREE) rp_map_del(&live, r->free.addr, NULL);
  }
  out->peak_ts = t->nev ? t->ev[peak_at].ts_ns : 0;
  for (size_t k = 0; ok && k < live.cap; k++)
    if (live.keys[k]) {
      const struct pst_record *a = &t->ev[live.vals[k]];
      struct rp_site *w = site_of(t, site, a);
      rp_split(t, cs, a, out->peak_ts, &w->at_gpu, &w->at_host);
    }
  rp_map_free(&live);
  if (!ok) {
    free(site);
    fprintf(stderr, "psshim-report: out of memory\n");
    return false;
  }
  for (size_t i = 0; i <= t->nstacks; i++) out->placed |= site[i].at_gpu || site[i].at_host || site[i].in_place;
  qsort(site, t->nstacks + 1, sizeof *site, by_peak);
  while (out->n <= t->nstacks && site[out->n].allocs) out->n++;
  out->s = site;
  return true;
}

void rp_sites_free(struct rp_sites *sites) {
  free(sites->s);
  memset(sites, 0, sizeof *sites);
}
