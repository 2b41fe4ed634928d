/* Where each chunk lived over time: spans on GPU or host, and its migrations. */
#include <stdlib.h>
#include <string.h>

#include "tools/report.h"

static int by_id(const void *a, const void *b) {
  const struct rp_chunk *x = a, *y = b;
  return x->id < y->id ? -1 : x->id > y->id;
}

static struct rp_chunk *find(const struct rp_chunks *cs, uint32_t id) {
  const struct rp_chunk key = { .id = id };
  return cs->n ? bsearch(&key, cs->c, cs->n, sizeof *cs->c, by_id) : NULL; /* no chunks: c may be NULL */
}

/* Per chunk while building: where it is now, since when, and whether frame events
 * exist (then they alone say where it is; else migration ends do). */
struct now { uint8_t where; uint64_t since; bool has_frames; size_t cap; };

static bool move_to(struct rp_chunk *c, struct now *s, uint8_t where, uint64_t at) {
  if (at < s->since) at = s->since; /* records of several threads: keep spans in order */
  if (s->where != RP_NONE && at > s->since) {
    if (c->nspans == s->cap) {
      s->cap = s->cap ? s->cap * 2 : 8;
      struct rp_span *sp = realloc(c->spans, s->cap * sizeof *sp);
      if (!sp) return false;
      c->spans = sp;
    }
    c->spans[c->nspans++] = (struct rp_span){ s->since, at, s->where };
    *(s->where == RP_GPU ? &c->gpu_ns : &c->host_ns) += at - s->since;
  }
  s->where = where;
  s->since = at;
  return true;
}

bool rp_chunks_build(const struct rp_trace *t, struct rp_chunks *out) {
  memset(out, 0, sizeof *out);
  size_t cap = 0;
  /* The chunk ids, once each. */
  for (size_t i = 0; i < t->nev; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type != PST_REC_CHUNK && r->type != PST_REC_MIGRATION) continue;
    if (out->n == cap) {
      cap = cap ? cap * 2 : 64;
      struct rp_chunk *c = realloc(out->c, cap * sizeof *c);
      if (!c) goto oom;
      out->c = c;
    }
    out->c[out->n++] = (struct rp_chunk){ .id = r->type == PST_REC_CHUNK ? r->chunk.id : r->migration.chunk };
  }
  if (out->n) qsort(out->c, out->n, sizeof *out->c, by_id);
  size_t k = 0;
  for (size_t i = 0; i < out->n; i++)
    if (!k || out->c[i].id != out->c[k - 1].id) out->c[k++] = out->c[i];
  out->n = k;

  struct now *st = calloc(out->n ? out->n : 1, sizeof *st);
  if (!st) goto oom;
  for (size_t i = 0; i < t->nev; i++)
    if (t->ev[i].type == PST_REC_CHUNK && t->ev[i].chunk.event != PST_CHUNK_CREATED)
      st[find(out, t->ev[i].chunk.id) - out->c].has_frames = true;
  bool ok = true;
  for (size_t i = 0; i < t->nev && ok; i++) {
    const struct pst_record *r = &t->ev[i];
    if (r->type == PST_REC_CHUNK) {
      struct rp_chunk *c = find(out, r->chunk.id);
      struct now *s = &st[c - out->c];
      if (r->chunk.size) c->size = r->chunk.size;
      static const uint8_t where[] = { [PST_CHUNK_CREATED] = RP_NONE, [PST_CHUNK_FRAME_GPU] = RP_GPU,
                                       [PST_CHUNK_FRAME_HOST] = RP_HOST, [PST_CHUNK_RELEASED] = RP_NONE };
      if (r->chunk.event == PST_CHUNK_CREATED) {
        if (s->where == RP_NONE) s->since = r->ts_ns; /* its life starts here */
      } else if (r->chunk.event < sizeof where) {
        ok = move_to(c, s, where[r->chunk.event], r->ts_ns);
      }
    } else if (r->type == PST_REC_MIGRATION) {
      struct rp_chunk *c = find(out, r->migration.chunk);
      struct now *s = &st[c - out->c];
      const bool in = r->migration.direction == PST_DIR_H2D;
      *(in ? &c->ins : &c->outs) += 1;
      *(in ? &c->bytes_in : &c->bytes_out) += r->migration.bytes;
      if (!c->size) c->size = r->migration.bytes;
      if (!s->has_frames) {
        /* Before its first migration the chunk was where the migration moved it from. */
        if (s->where == RP_NONE) ok = move_to(c, s, in ? RP_HOST : RP_GPU, s->since ? s->since : t->t0);
        const uint64_t end = r->migration.end_ns ? r->migration.end_ns : r->ts_ns;
        if (ok) ok = move_to(c, s, in ? RP_GPU : RP_HOST, end);
      }
    }
  }
  for (size_t i = 0; i < out->n && ok; i++) ok = move_to(&out->c[i], &st[i], RP_NONE, t->t1);
  free(st);
  if (ok) return true;
oom:
  rp_chunks_free(out);
  return false;
}

enum rp_where rp_chunk_at(const struct rp_chunks *cs, uint32_t id, uint64_t ts) {
  const struct rp_chunk *c = find(cs, id);
  return c ? rp_chunk_where(c, ts) : RP_NONE;
}

enum rp_where rp_chunk_where(const struct rp_chunk *c, uint64_t ts) {
  size_t lo = 0, hi = c->nspans; /* the first span ending after ts */
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (c->spans[mid].to <= ts) lo = mid + 1;
    else hi = mid;
  }
  return lo < c->nspans && c->spans[lo].from <= ts ? c->spans[lo].where : RP_NONE;
}

void rp_chunks_free(struct rp_chunks *cs) {
  for (size_t i = 0; i < cs->n; i++) free(cs->c[i].spans);
  free(cs->c);
  memset(cs, 0, sizeof *cs);
}
