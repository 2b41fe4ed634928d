/* --chunk-size: which chunk size would have moved the fewest bytes?
 *
 * The recorded accesses (each LAUNCH's pointers, mapped to the allocations that held them
 * through ALLOC and FREE) are re-packed into chunks of each candidate size by a best-fit
 * packer, as psshim's allocator packs its spans (though it gives an allocation larger than
 * a chunk whole chunks of its own, where psshim lets smaller ones fill the last one's
 * tail, and does not keep GPU and host chunks apart), and replayed through the policy
 * simulator at the run's GPU budget. The trace does not say which pointers a kernel
 * wrote, so every touch counts as a write: each eviction costs a copy back, as the worst
 * case would. Sizes are ranked by what crosses PCIe: copies, and reads in place. */
#include <stdlib.h>
#include <string.h>

#include "policy/policy.h"
#include "tools/report.h"

enum {
  ALIGN = 512,        /* sub-allocations start on 512 bytes, as cudaMalloc's do */
  BIG_ROUND = 2 << 20 /* an allocation larger than a chunk gets one of its own, rounded to
                         the VMM granularity */
};

/* ---- the best-fit packer ---- */
struct hole { uint64_t off, len; };
struct pchunk {
  uint64_t size;
  bool big;
  struct hole *holes; /* sorted by offset, never adjacent */
  size_t nholes, cap;
};
struct packing {
  struct pchunk *c;
  size_t n, cap;
  uint32_t *chunk_of; /* by allocation */
  uint64_t *off_of;
  uint64_t footprint, peak_footprint;
};

static uint64_t round_up(uint64_t v, uint64_t to) {
  return (v + to - 1) / to * to;
}

static bool new_chunk(struct packing *p, uint64_t size, bool big) {
  if (p->n == p->cap) {
    size_t c = p->cap ? p->cap * 2 : 64;
    struct pchunk *n = realloc(p->c, c * sizeof *n);
    if (!n) return false;
    p->c = n;
    p->cap = c;
  }
  struct pchunk *c = &p->c[p->n++];
  *c = (struct pchunk){ .size = size, .big = big, .holes = malloc(sizeof *c->holes), .cap = 1 };
  if (!c->holes) return false;
  if (!big) c->holes[c->nholes++] = (struct hole){ 0, size };
  p->footprint += size;
  if (p->footprint > p->peak_footprint) p->peak_footprint = p->footprint;
  return true;
}

static bool place(struct packing *p, uint32_t alloc, uint64_t bytes, uint64_t chunk_size) {
  const uint64_t need = round_up(bytes, ALIGN);
  if (need > chunk_size) {
    if (!new_chunk(p, round_up(bytes, BIG_ROUND), true)) return false;
    p->chunk_of[alloc] = (uint32_t)(p->n - 1);
    p->off_of[alloc] = 0;
    return true;
  }
  /* Best fit over every chunk's holes, as psshim's allocator over its spans (alloc.c);
   * a new chunk where none fits. */
  size_t bi = SIZE_MAX, bh = 0;
  for (size_t i = 0; i < p->n && !(bi != SIZE_MAX && p->c[bi].holes[bh].len == need); i++) {
    const struct pchunk *c = &p->c[i];
    for (size_t h = 0; !c->big && h < c->nholes; h++)
      if (c->holes[h].len >= need && (bi == SIZE_MAX || c->holes[h].len < p->c[bi].holes[bh].len)) bi = i, bh = h;
  }
  if (bi == SIZE_MAX) {
    if (!new_chunk(p, chunk_size, false)) return false;
    bi = p->n - 1;
    bh = 0;
  }
  struct pchunk *c = &p->c[bi];
  p->chunk_of[alloc] = (uint32_t)bi;
  p->off_of[alloc] = c->holes[bh].off;
  c->holes[bh].off += need;
  c->holes[bh].len -= need;
  if (!c->holes[bh].len) memmove(&c->holes[bh], &c->holes[bh + 1], (--c->nholes - bh) * sizeof *c->holes);
  return true;
}

static bool unplace(struct packing *p, uint32_t alloc, uint64_t bytes) {
  struct pchunk *c = &p->c[p->chunk_of[alloc]];
  if (c->big) { /* released with its allocation, as the allocator would */
    p->footprint -= c->size;
    return true;
  }
  const struct hole h = { p->off_of[alloc], round_up(bytes, ALIGN) };
  size_t at = 0;
  while (at < c->nholes && c->holes[at].off < h.off) at++;
  const bool left = at > 0 && c->holes[at - 1].off + c->holes[at - 1].len == h.off;
  const bool right = at < c->nholes && h.off + h.len == c->holes[at].off;
  if (left && right) {
    c->holes[at - 1].len += h.len + c->holes[at].len;
    memmove(&c->holes[at], &c->holes[at + 1], (--c->nholes - at) * sizeof *c->holes);
  } else if (left) {
    c->holes[at - 1].len += h.len;
  } else if (right) {
    c->holes[at].off = h.off;
    c->holes[at].len += h.len;
  } else {
    if (c->nholes == c->cap) {
      struct hole *n = realloc(c->holes, c->cap * 2 * sizeof *n);
      if (!n) return false;
      c->holes = n;
      c->cap *= 2;
    }
    memmove(&c->holes[at + 1], &c->holes[at], (c->nholes - at) * sizeof *c->holes);
    c->holes[at] = h;
    c->nholes++;
  }
  return true;
}

static void packing_free(struct packing *p) {
  for (size_t i = 0; i < p->n; i++) free(p->c[i].holes);
  free(p->c);
  free(p->chunk_of);
  free(p->off_of);
  memset(p, 0, sizeof *p);
}

static bool pack(const struct rp_accesses *a, uint64_t chunk_size, struct packing *p) {
  memset(p, 0, sizeof *p);
  p->chunk_of = malloc((a->nallocs + 1) * sizeof *p->chunk_of);
  p->off_of = malloc((a->nallocs + 1) * sizeof *p->off_of);
  bool ok = p->chunk_of && p->off_of;
  for (size_t i = 0; i < a->nops && ok; i++) {
    const struct rp_access_op *o = &a->ops[i];
    ok = o->free ? unplace(p, o->alloc, a->alloc[o->alloc].size) : place(p, o->alloc, a->alloc[o->alloc].size, chunk_size);
  }
  if (!ok) packing_free(p);
  return ok;
}

/* ---- replay ---- */
struct result {
  uint64_t chunk_size;
  size_t chunks;
  uint64_t footprint;
  psp_sim opt, lru;
};

static uint64_t moved(const psp_sim *s) {
  return s->bytes_in + s->bytes_out;
}

/* What crosses PCIe: copies, and kernels reading chunks left in host frames in place. A
 * size whose chunks barely fit the budget copies little because it reads nearly all in
 * place: counting copies alone would advise it. */
static uint64_t across(const psp_sim *s) {
  return moved(s) + s->bytes_in_place;
}

/* The traffic of the last of `iterations` simulated ones: warm, not the cold start. */
static int simulate_last(const psp_schedule *s, uint64_t budget, psp_policy pol, uint32_t iterations,
                         psp_sim *out) {
  psp_sim all, before = { 0 };
  if (psp_simulate(s, budget, pol, iterations, &all) != 0) return -1;
  if (iterations > 1 && psp_simulate(s, budget, pol, iterations - 1, &before) != 0) return -1;
  *out = (psp_sim){ all.page_ins - before.page_ins, all.bytes_in - before.bytes_in,
                    all.page_outs - before.page_outs, all.bytes_out - before.bytes_out,
                    all.drops - before.drops, all.in_place_moments - before.in_place_moments,
                    all.bytes_in_place - before.bytes_in_place };
  return 0;
}

/* ---- what each chunk holds live over the window ---- */
struct live_span { uint32_t chunk; int64_t from, to; }; /* moments; from -1: held before the window */

static int by_chunk_start(const void *a, const void *b) {
  const struct live_span *x = a, *y = b;
  if (x->chunk != y->chunk) return x->chunk < y->chunk ? -1 : 1;
  return (x->from > y->from) - (x->from < y->from);
}

/* Each allocation's live span in the window: from its first touch (-1 when it held data
 * before) to its last touch when freed within the window, else to the window's end.
 * One span per allocation that holds data read in the window. */
static size_t live_spans(const struct rp_accesses *a, const struct packing *p, struct live_span *span,
                         int64_t *last) {
  const int64_t end = (int64_t)a->nmoments - 1;
  uint64_t *born = calloc(a->nallocs + 1, sizeof *born), *freed = malloc((a->nallocs + 1) * sizeof *freed);
  size_t n = 0;
  if (!born || !freed) {
    free(born);
    free(freed);
    return SIZE_MAX;
  }
  for (size_t x = 0; x < a->nallocs; x++) freed[x] = UINT64_MAX, last[x] = -1;
  for (size_t i = 0; i < a->nops; i++) *(a->ops[i].free ? &freed[a->ops[i].alloc] : &born[a->ops[i].alloc]) = a->ops[i].ts;
  for (size_t m = 0; m < a->nmoments; m++)
    for (size_t k = a->first[m]; k < a->first[m + 1]; k++) last[a->touch[k]] = (int64_t)m;
  for (size_t x = 0; x < a->nallocs; x++) {
    const int64_t holds = a->alloc[x].holds_from;
    const bool gone = freed[x] < a->to;
    if (freed[x] < a->from || born[x] >= a->to) continue; /* not there in the window */
    if (holds == INT64_MAX && (born[x] >= a->from || gone)) continue; /* never read in it */
    if (gone && last[x] < 0) continue;
    span[n++] = (struct live_span){ p->chunk_of[x], holds == INT64_MAX ? -1 : holds, gone ? last[x] : end };
  }
  free(born);
  free(freed);
  return n;
}

/* Declares the gaps between a chunk's live spans empty, and the one across the
 * iteration's end unless the chunk holds data from before the window then. -1: out of
 * memory or refused. */
static int declare_empty(psp_schedule *s, const struct rp_accesses *a, const struct packing *p) {
  struct live_span *span = malloc((a->nallocs + 1) * sizeof *span);
  int64_t *last = malloc((a->nallocs + 1) * sizeof *last);
  size_t n = span && last ? live_spans(a, p, span, last) : SIZE_MAX;
  int rc = n == SIZE_MAX ? -1 : 0;
  if (rc == 0) qsort(span, n, sizeof *span, by_chunk_start);
  const int64_t end = (int64_t)a->nmoments - 1;
  for (size_t i = 0; i < n && rc == 0;) {
    size_t j = i;
    int64_t reach = span[i].to; /* the merged spans' end so far */
    for (; j + 1 < n && span[j + 1].chunk == span[i].chunk; j++) {
      if (span[j + 1].from > reach) rc = psp_schedule_empty(s, span[i].chunk, (uint32_t)reach, (uint32_t)span[j + 1].from);
      if (span[j + 1].to > reach) reach = span[j + 1].to;
    }
    if (rc == 0 && span[i].from >= 0 && (reach < end || span[i].from > 0)) /* across the end */
      rc = psp_schedule_empty(s, span[i].chunk, (uint32_t)reach, (uint32_t)span[i].from);
    i = j + 1;
  }
  free(span);
  free(last);
  return rc;
}

psp_schedule *rp_schedule(const struct rp_accesses *a, uint64_t chunk_size, size_t *chunks, uint64_t *footprint) {
  struct packing p;
  if (!pack(a, chunk_size, &p)) return NULL;
  psp_schedule *s = psp_schedule_new();
  int rc = s ? 0 : -1;
  for (size_t c = 0; c < p.n && rc == 0; c++) rc = psp_schedule_chunk(s, (uint32_t)c, p.c[c].size);
  for (size_t m = 0; m < a->nmoments && rc == 0; m++) {
    rc = psp_schedule_moment(s, 0); /* the budget is chunk frames': nothing else takes from it */
    for (size_t k = a->first[m]; k < a->first[m + 1] && rc == 0; k++)
      rc = psp_schedule_touch(s, p.chunk_of[a->touch[k]], true);
  }
  if (rc == 0 && a->nmoments) rc = declare_empty(s, a, &p);
  if (rc == 0) rc = psp_schedule_seal(s);
  *chunks = p.n;
  *footprint = p.peak_footprint;
  packing_free(&p);
  if (rc == 0) return s;
  psp_schedule_free(s);
  return NULL;
}

static bool replay(const struct rp_accesses *a, uint64_t chunk_size, uint64_t budget, uint32_t iterations,
                   struct result *res) {
  *res = (struct result){ .chunk_size = chunk_size };
  psp_schedule *s = rp_schedule(a, chunk_size, &res->chunks, &res->footprint);
  int rc = s ? 0 : -1;
  if (rc == 0) rc = simulate_last(s, budget, PSP_POLICY_OPT, iterations, &res->opt);
  if (rc == 0) rc = simulate_last(s, budget, PSP_POLICY_LRU, iterations, &res->lru);
  psp_schedule_free(s);
  return rc == 0;
}

bool rp_chunk_across(const struct rp_accesses *a, uint64_t chunk_size, uint64_t budget, uint64_t *moved_bytes,
                     uint64_t *in_place) {
  size_t chunks;
  uint64_t footprint;
  psp_sim r;
  psp_schedule *s = rp_schedule(a, chunk_size, &chunks, &footprint);
  const bool ok = s && simulate_last(s, budget, PSP_POLICY_OPT, a->periodic ? 3 : 1, &r) == 0;
  psp_schedule_free(s);
  if (ok) *moved_bytes = moved(&r), *in_place = r.bytes_in_place;
  return ok;
}

/* A size as PSSHIM_CHUNK_SIZE takes it: "64M". */
static const char *env_size(uint64_t v, char *buf, size_t len) {
  static const char unit[] = "KMGT";
  int u = -1;
  while (u < 3 && v % 1024 == 0 && v >= 1024) {
    v /= 1024;
    u++;
  }
  if (u < 0) snprintf(buf, len, "%llu", (unsigned long long)v);
  else snprintf(buf, len, "%llu%c", (unsigned long long)v, unit[u]);
  return buf;
}

bool rp_chunk_advice(const struct rp_accesses *a, const uint64_t *sizes, size_t n, uint64_t budget, FILE *out) {
  char b[32], c[32];
  const uint32_t iterations = a->periodic ? 3 : 1;
  fprintf(out, "\nCHUNK SIZE ADVICE\n");
  fprintf(out, "  replaying %s: %llu launches, %llu of their %llu pointers into %zu allocations\n", a->window,
          (unsigned long long)a->launches, (unsigned long long)a->matched, (unsigned long long)a->pointers, a->nallocs);
  if (!a->matched) {
    fprintf(out, "  nothing to replay: no launch pointer falls inside an ALLOC'd range\n");
    return true;
  }
  fprintf(out, "  GPU budget %s for chunks, as PSSHIM_GPU_BUDGET counts it (memory psshim does not manage is outside it)\n",
          rp_bytes(budget, b, sizeof b));
  fprintf(out, "  %s; every touched chunk counted as written\n",
          a->periodic ? "bytes moved per iteration once warm (the third of three replayed)" : "bytes moved from a cold start");
  /* A chunk larger than the budget has no GPU frame to go to: every launch would read it
   * in place, whatever the replay's copies say. */
  char skipped[256] = "";
  size_t nskipped = 0;
  for (size_t i = 0; i < n; i++) {
    if (sizes[i] <= budget) continue;
    const size_t len = strlen(skipped);
    snprintf(skipped + len, sizeof skipped - len, "%s%s", nskipped++ ? ", " : "", env_size(sizes[i], b, sizeof b));
  }
  if (nskipped)
    fprintf(out, "  not replayed, larger than the GPU budget: %s\n", skipped);
  if (nskipped == n) {
    fprintf(out, "  no chunk size left to replay: give sizes up to %s (--chunk-size=LIST)\n", rp_bytes(budget, b, sizeof b));
    return true;
  }
  fprintf(out, "  %10s %8s %11s %11s %13s %13s %13s %14s\n", "chunk size", "chunks", "footprint", "OPT page-ins",
          "OPT moved MB", "LRU moved MB", "OPT in place", "OPT in-place MB");
  struct result best = { 0 };
  bool ok = true;
  for (size_t i = 0; i < n && ok; i++) {
    if (sizes[i] > budget) continue;
    struct result r;
    ok = replay(a, sizes[i], budget, iterations, &r);
    if (!ok) break;
    fprintf(out, "  %10s %8zu %11s %11llu %13.1f %13.1f %13llu %14.1f\n", rp_bytes(r.chunk_size, b, sizeof b),
            r.chunks, rp_bytes(r.footprint, c, sizeof c), (unsigned long long)r.opt.page_ins,
            (double)moved(&r.opt) / 1e6, (double)moved(&r.lru) / 1e6, (unsigned long long)r.opt.in_place_moments,
            (double)r.opt.bytes_in_place / 1e6);
    /* Least across PCIe under OPT (what psshim does with a warm-up trace), copies and
     * in-place reads together; ties go to fewer copies, which run closer to full bandwidth. */
    if (!best.chunk_size || across(&r.opt) < across(&best.opt) ||
        (across(&r.opt) == across(&best.opt) && r.opt.page_ins < best.opt.page_ins))
      best = r;
  }
  if (ok) {
    fprintf(out, "  least across PCIe: PSSHIM_CHUNK_SIZE=%s (under OPT %.1f MB copied and at most %.1f MB read in place, "
                 "%s footprint)\n",
            env_size(best.chunk_size, b, sizeof b), (double)moved(&best.opt) / 1e6,
            (double)best.opt.bytes_in_place / 1e6, rp_bytes(best.footprint, c, sizeof c));
    /* psshim's pager reads host frames in place rather than paging every touch in, and
     * packs a tensor larger than a chunk into whole chunks, so the size that copies least
     * under demand paging need not give the fastest step. */
    fprintf(out, "  (bytes under demand paging, not step time: in-place reads are counted at whole chunks;\n"
                 "   measure the step at the sizes that move least)\n");
  } else {
    fprintf(stderr, "psshim-report: chunk-size replay failed (out of memory)\n");
  }
  return ok;
}
