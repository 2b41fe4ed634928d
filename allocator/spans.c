/* Spans: one chunk, or several consecutive chunks for a tensor larger than a chunk, with
 * tensors sub-allocated inside by best fit over sorted free ranges. A range freed on a
 * stream stays "pending" on that stream (reusable by that stream at once, since later work
 * there runs after the free) until an event shows the stream has passed the free. */
#include "allocator/space.h"
#include "tracer/tracer.h"

#include <stdlib.h>
#include <string.h>

CUevent psa_event_get(struct device *d)
{
  if (d->events.n)
    return d->events.pool[--d->events.n];
  CUevent e = NULL;
  if (PS_CU(ps_driver.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING)))
    return NULL;
  return e;
}

void psa_event_put(struct device *d, CUevent e)
{
  if (!e)
    return;
  if (d->events.n == d->events.cap) {
    uint32_t cap = d->events.cap ? d->events.cap * 2 : 64;
    CUevent *p = realloc(d->events.pool, cap * sizeof *p);
    if (!p) {
      PS_CU(ps_driver.cuEventDestroy_v2(e));
      return;
    }
    d->events.pool = p;
    d->events.cap = cap;
  }
  d->events.pool[d->events.n++] = e;
}

static void list_insert(struct device *d, struct span *s)
{
  struct span **head = &d->space.spans[s->where];
  s->prev = NULL;
  s->next = *head;
  if (*head)
    (*head)->prev = s;
  *head = s;
}

static void list_remove(struct device *d, struct span *s)
{
  if (s->prev)
    s->prev->next = s->next;
  else
    d->space.spans[s->where] = s->next;
  if (s->next)
    s->next->prev = s->prev;
  s->prev = s->next = NULL;
}

static enum psa_where span_where(struct device *d, struct span *s)
{
  for (uint64_t i = 0; i < s->nchunks; i++)
    if (d->fr.frames[d->chunks[s->first_chunk + i].frame].where != PSA_GPU)
      return PSA_HOST;
  return PSA_GPU;
}

void psa_span_relist(struct device *d, struct span *s)
{
  list_remove(d, s);
  s->where = span_where(d, s);
  list_insert(d, s);
}

static bool mergeable(const struct range *a, const struct range *b)
{
  if (a->off + a->len != b->off || a->pending != b->pending || a->graph != b->graph)
    return false;
  return !a->pending || a->stream == b->stream;
}

/* Merges b into a (a precedes b). Two pending ranges of one stream keep the later free's
 * event: that stream passing it means it passed the earlier one too. */
static void merge_into(struct device *d, struct range *a, struct range *b, bool b_is_later)
{
  a->len += b->len;
  if (a->pending) {
    if (b_is_later) {
      psa_event_put(d, a->event);
      a->event = b->event;
    } else {
      psa_event_put(d, b->event);
    }
  }
}

static void remove_at(struct span *s, uint32_t i)
{
  memmove(&s->ranges[i], &s->ranges[i + 1], (s->nranges - i - 1) * sizeof *s->ranges);
  s->nranges--;
}

/* Merges range i with its neighbours where allowed; returns the merged range's index. */
static uint32_t normalize(struct device *d, struct span *s, uint32_t i, bool i_is_newest)
{
  if (i + 1 < s->nranges && mergeable(&s->ranges[i], &s->ranges[i + 1])) {
    merge_into(d, &s->ranges[i], &s->ranges[i + 1], !i_is_newest);
    remove_at(s, i + 1);
  }
  if (i > 0 && mergeable(&s->ranges[i - 1], &s->ranges[i])) {
    merge_into(d, &s->ranges[i - 1], &s->ranges[i], i_is_newest);
    remove_at(s, i);
    i--;
  }
  return i;
}

/* A pending range whose stream has passed its free becomes free for every stream. */
static uint32_t settle(struct device *d, struct span *s, uint32_t i)
{
  struct range *r = &s->ranges[i];
  if (!r->pending || (r->graph && r->graph != PSA_AFTER_CAPTURE))
    return i; /* a graph's bytes stay its own */
  CUresult q = r->graph ? CUDA_ERROR_INVALID_HANDLE : ps_driver.cuEventQuery(r->event);
  if (q == CUDA_ERROR_NOT_READY)
    return i;
  if (q != CUDA_SUCCESS) {
    /* A broken event (or none) cannot prove the stream passed the free: wait for the whole
     * device, once no capture is underway (the wait would break it). */
    if (!r->graph)
      PS_CU(q);
    if (psa_capture_underway())
      return i;
    PS_CU(ps_driver.cuCtxSynchronize());
  }
  r->graph = 0;
  psa_event_put(d, r->event);
  r->event = NULL;
  r->pending = false;
  return normalize(d, s, i, false);
}

static bool grow(struct span *s)
{
  if (s->nranges < s->cap)
    return true;
  uint32_t cap = s->cap ? s->cap * 2 : 8;
  struct range *p = realloc(s->ranges, cap * sizeof *p);
  if (!p)
    return false;
  s->ranges = p;
  s->cap = cap;
  return true;
}

int64_t psa_span_best(struct device *d, struct span *s, uint64_t size, CUstream stream)
{
  int64_t best = -1;
  for (uint32_t i = 0; i < s->nranges; i++) {
    if (!psa_range_usable(&s->ranges[i], stream))
      i = settle(d, s, i);
    const struct range *r = &s->ranges[i];
    if (r->len < size || !psa_range_usable(r, stream))
      continue;
    if (best < 0 || r->len < s->ranges[best].len)
      best = i;
    if (r->len == size)
      break;
  }
  return best;
}

uint64_t psa_span_take(struct device *d, struct span *s, uint32_t i, uint64_t size)
{
  struct range *r = &s->ranges[i];
  uint64_t off = r->off;
  r->off += size;
  r->len -= size;
  if (r->len == 0) {
    psa_event_put(d, r->event);
    remove_at(s, i);
  }
  psa_span_check(d, s);
  return off;
}

/* The first free range of s that starts at or after off (s->nranges if none). */
static uint32_t range_from(const struct span *s, uint64_t off)
{
  uint32_t lo = 0, hi = s->nranges;
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (s->ranges[mid].off < off)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

bool psa_span_take_at(struct device *d, struct span *s, uint64_t off, uint64_t size, CUstream stream)
{
  uint32_t i = range_from(s, off + 1); /* the range holding off, if any, is the one before */
  if (i == 0 || s->ranges[i - 1].off + s->ranges[i - 1].len <= off)
    return false;
  i--;
  if (!psa_range_usable(&s->ranges[i], stream))
    i = settle(d, s, i); /* merging may put off in the range before */
  struct range *r = &s->ranges[i];
  uint64_t head = off - r->off, end = r->off + r->len;
  if (off < r->off || off + size > end || !psa_range_usable(r, stream))
    return false;
  if (!head) {
    psa_span_take(d, s, i, size);
    return true;
  }
  uint64_t tail = end - off - size;
  if (tail && (r->pending || !grow(s))) /* one event cannot stand for two ranges */
    return false;
  r = &s->ranges[i]; /* grow may move the table */
  r->len = head;
  if (tail) {
    memmove(&s->ranges[i + 2], &s->ranges[i + 1], (s->nranges - i - 1) * sizeof *s->ranges);
    s->ranges[i + 1] = (struct range){.off = off + size, .len = tail};
    s->nranges++;
  }
  psa_span_check(d, s);
  return true;
}

void psa_span_release(struct device *d, struct span *s, uint64_t off, uint64_t size, CUstream stream, CUevent ev,
                      uint64_t graph)
{
  if (!grow(s)) {
    /* Out of host memory for the range table: keep the bytes unusable rather than risk
     * reuse before the stream passed the free. Only the capacity is lost. */
    ps_error("out of host memory: %llu bytes of chunk space leaked", (unsigned long long)size);
    psa_event_put(d, ev);
    return;
  }
  uint32_t lo = range_from(s, off);
  memmove(&s->ranges[lo + 1], &s->ranges[lo], (s->nranges - lo) * sizeof *s->ranges);
  s->ranges[lo] = (struct range){
      .off = off, .len = size, .pending = ev || graph, .stream = psa_stream_key(stream), .event = ev, .graph = graph};
  s->nranges++;
  normalize(d, s, lo, true);
  psa_span_check(d, s);
}

#ifdef PS_CHECKS
void psa_span_check(const struct device *d, const struct span *s)
{
  uint64_t bytes = s->nchunks * d->chunk_size, free_bytes = 0;
  for (uint32_t i = 0; i < s->nranges; i++) {
    const struct range *r = &s->ranges[i], *next = i + 1 < s->nranges ? r + 1 : NULL;
    if (!r->len || r->off + r->len > bytes || r->off + r->len < r->off)
      ps_check_failed("span at chunk %llu: free range %u [%llu, +%llu) is empty or outside its %llu bytes",
                      (unsigned long long)s->first_chunk, i, (unsigned long long)r->off, (unsigned long long)r->len,
                      (unsigned long long)bytes);
    if (next && r->off + r->len > next->off)
      ps_check_failed("span at chunk %llu: free ranges %u and %u overlap or are out of order",
                      (unsigned long long)s->first_chunk, i, i + 1);
    if (next && mergeable(r, next))
      ps_check_failed("span at chunk %llu: free ranges %u and %u should have been merged",
                      (unsigned long long)s->first_chunk, i, i + 1);
    free_bytes += r->len;
  }
  if (free_bytes + s->live_bytes > bytes)
    ps_check_failed("span at chunk %llu: %llu bytes free and %llu live, more than its %llu",
                    (unsigned long long)s->first_chunk, (unsigned long long)free_bytes,
                    (unsigned long long)s->live_bytes, (unsigned long long)bytes);
}
#endif

bool psa_span_idle(struct device *d, struct span *s)
{
  /* A span growing (psa_span_extend) has lent out its tail: what is left may look idle to
   * the reclaim that taking its new frames runs, on this very thread. */
  if (s->live_allocs || s->building || s->in_flight)
    return false;
  for (uint64_t i = s->first_chunk; i < s->first_chunk + s->nchunks; i++)
    if (d->chunks[i].move == PSA_REMAPPING || !psa_copy_done(d, i, false))
      return false;
  for (uint32_t i = 0; i < s->nranges; i++)
    i = settle(d, s, i);
  return s->nranges == 1 && !s->ranges[0].pending;
}

bool psa_live_next(struct device *d, uint64_t chunk, uint64_t *at, uint64_t *end)
{
  const struct span *s = d->chunks[chunk].span;
  uint64_t hi = (chunk - s->first_chunk + 1) * d->chunk_size;
  for (uint32_t i = 0; i < s->nranges && *at < hi; i++) {
    const struct range *r = &s->ranges[i];
    if (r->off + r->len <= *at)
      continue;
    if (r->off > *at) {
      *end = r->off < hi ? r->off : hi;
      return true;
    }
    *at = r->off + r->len; /* inside a free range: live bytes start after it */
  }
  *end = hi;
  return *at < hi;
}

void psa_trace_chunk(struct device *d, uint64_t chunk, uint32_t event)
{
  if (!pst_trace_enabled())
    return;
  struct pst_record r = {.type = PST_REC_CHUNK, .chunk = {.id = (uint32_t)chunk, .event = event,
                                                          .base = d->base + chunk * d->chunk_size,
                                                          .size = d->chunk_size}};
  pst_trace_emit(&r);
}

/* Unmaps the chunks of [first, first + n) that have frames and gives the frames back. */
static void unmap_chunks(struct device *d, uint64_t first, uint64_t n)
{
  for (uint64_t i = first; i < first + n; i++) {
    struct chunk *c = &d->chunks[i];
    if (c->frame == PSA_NO_FRAME)
      continue;
    if (c->frame == psa_shared_frame(d)) {
      if (psa_space_hooks.shared_drop)
        psa_space_hooks.shared_drop(d, i);
    } else {
      PS_CU(ps_driver.cuMemUnmap(d->base + i * d->chunk_size, d->chunk_size));
      psa_frame_give(d, c->frame);
    }
    c->frame = PSA_NO_FRAME;
    d->stats.mapped_chunk_bytes -= d->chunk_size;
    psa_trace_chunk(d, i, PST_CHUNK_RELEASED);
  }
}

void psa_span_delete(struct device *d, struct span *s)
{
  if (d->space.last_span == s)
    d->space.last_span = NULL;
  list_remove(d, s);
  psa_span_forget_users(d, s);
  unmap_chunks(d, s->first_chunk, s->nchunks);
  psa_chunks_unreserve(d, s->first_chunk, s->nchunks);
  for (uint32_t i = 0; i < s->nranges; i++)
    psa_event_put(d, s->ranges[i].event);
  free(s->ranges);
  free(s);
}

static bool span_has(struct device *d, struct span *s, enum psa_where w)
{
  for (uint64_t i = 0; i < s->nchunks; i++)
    if (d->fr.frames[d->chunks[s->first_chunk + i].frame].where == w)
      return true;
  return false;
}

/* An idle span that holds a frame of kind `want`. A span with any host frame is on the
 * host list (span_where), so host frames are sought there only. */
static struct span *idle_span(struct device *d, enum psa_where want)
{
  static const enum psa_where lists[] = {PSA_GPU, PSA_HOST};
  for (int k = want == PSA_HOST; k < 2; k++)
    for (struct span *s = d->space.spans[lists[k]]; s; s = s->next)
      if (span_has(d, s, want) && psa_span_idle(d, s))
        return s;
  return NULL;
}

/* Takes back the frames of one such span. Its time, the search included, is counted:
 * every page-out takes one back first. */
static bool reclaim_one(struct device *d, enum psa_where want)
{
  uint64_t start = psa_now_ns();
  struct span *s = idle_span(d, want);
  if (s) {
    d->stats.reclaims++;
    d->stats.reclaim_chunks += s->nchunks;
    psa_span_delete(d, s);
  }
  d->stats.reclaim_ns += psa_now_ns() - start;
  return s != NULL;
}

uint32_t psa_host_frame(struct device *d)
{
  PSA_HELD(d);
  reclaim_one(d, PSA_HOST);
  return psa_frame_take(d, PSA_HOST);
}

/* GPU frames first (free, made, taken back from idle spans, or made by paging out:
 * psa_space_hooks.gpu_room), then host frames. Drops d->lock. */
static uint32_t frame_for_chunk(struct device *d)
{
  PSA_HELD(d);
  static const enum psa_where order[] = {PSA_GPU, PSA_HOST};
  for (int k = 0; k < 2; k++) {
    for (;;) {
      uint32_t f = psa_frame_take(d, order[k]);
      if (f != PSA_NO_FRAME)
        return f;
      if (!reclaim_one(d, order[k]))
        break;
    }
    uint32_t f = order[k] == PSA_GPU && psa_space_hooks.gpu_room ? psa_space_hooks.gpu_room(d) : PSA_NO_FRAME;
    if (f != PSA_NO_FRAME)
      return f;
  }
  return PSA_NO_FRAME;
}

/* Gives s the unreserved chunks [first, first + n) and maps a frame under each (drops
 * d->lock while frames are taken: s->building keeps the pager off s). False when frames
 * run out: then the chunks are unmapped and unreserved again. */
static bool add_chunks(struct device *d, struct span *s, uint64_t first, uint64_t n)
{
  for (uint64_t i = first; i < first + n; i++) {
    struct chunk *c = &d->chunks[i];
    c->span = s;
  }
  psa_chunks_note_high(d, first + n);
  bool building = s->building;
  s->building = true;
  for (uint64_t i = first; i < first + n; i++) {
    uint32_t f = frame_for_chunk(d);
    CUresult r = f == PSA_NO_FRAME ? CUDA_ERROR_OUT_OF_MEMORY : psa_map(d, d->base + i * d->chunk_size, d->fr.frames[f].handle);
    if (r) {
      if (f != PSA_NO_FRAME)
        psa_frame_give(d, f);
      unmap_chunks(d, first, i - first);
      psa_chunks_unreserve(d, first, n);
      s->building = building;
      return false;
    }
    d->chunks[i].frame = f;
    d->stats.mapped_chunk_bytes += d->chunk_size;
    psa_trace_chunk(d, i, d->fr.frames[f].where == PSA_GPU ? PST_CHUNK_FRAME_GPU : PST_CHUNK_FRAME_HOST);
  }
  s->building = building;
  return true;
}

struct span *psa_span_new(struct device *d, uint64_t nchunks, uint64_t at)
{
  PSA_HELD(d);
  uint64_t first = at;
  if (at != PSA_ANYWHERE && !psa_chunks_free(d, at, nchunks))
    return NULL;
  while (at == PSA_ANYWHERE && !psa_chunks_reserve(d, nchunks, &first))
    if (!reclaim_one(d, PSA_HOST) && !reclaim_one(d, PSA_GPU))
      return NULL;
  struct span *s = calloc(1, sizeof *s);
  if (!s || !grow(s)) {
    free(s);
    psa_chunks_unreserve(d, first, nchunks);
    return NULL;
  }
  s->first_chunk = first;
  s->nchunks = nchunks;
  s->building = true;
  s->last_alloc = d->space.clock;
  if (!add_chunks(d, s, first, nchunks)) {
    free(s->ranges);
    free(s);
    return NULL;
  }
  s->ranges[0] = (struct range){.off = 0, .len = nchunks * d->chunk_size};
  s->nranges = 1;
  s->where = span_where(d, s);
  s->building = false;
  list_insert(d, s);
  psa_span_check(d, s);
  return s;
}

/* A tensor larger than a chunk leaves the free tail of its span's last chunk to smaller
 * tensors, and models have few of those: on a large GPT a tenth of the chunk bytes held
 * nothing. So a tensor may instead start in the free tail of the span that took the
 * allocation just before it, growing that span into the unreserved chunks after it, when
 * that takes fewer new chunks than a span of its own: tensors made one after another (a
 * model's parameters, its optimizer state) lie back to back. Only that span: growing any
 * span with a free tail mixed lifetimes, so, we think, spans seldom emptied and their
 * frames could not be taken back for the next step's activations (static placement just
 * over budget ran several times slower). */
struct span *psa_span_extend(struct device *d, uint64_t size, CUstream stream, uint64_t *off)
{
  PSA_HELD(d);
  struct span *s = d->space.last_span;
  uint64_t c = d->chunk_size, own = (size + c - 1) / c;
  if (!s || !s->nranges || s->building)
    return NULL;
  uint32_t i = settle(d, s, s->nranges - 1);
  struct range tail = s->ranges[i];
  uint64_t next = s->first_chunk + s->nchunks, more = tail.len < size ? (size - tail.len + c - 1) / c : own;
  if (tail.off + tail.len != s->nchunks * c || !psa_range_usable(&tail, stream) || more >= own ||
      !psa_chunks_free(d, next, more))
    return NULL;
  /* The tail leaves the span while frames are taken (the lock may drop), so no other
   * allocation carves it; add_chunks marks the span building, so what is left of it does
   * not look idle to the reclaim that taking frames runs. */
  remove_at(s, i);
  if (!add_chunks(d, s, next, more)) {
    psa_span_release(d, s, tail.off, tail.len, tail.stream, tail.event, tail.graph);
    return NULL;
  }
  psa_event_put(d, tail.event); /* pending on this stream: its later work runs after the free */
  s->nchunks += more;
  uint64_t end = s->nchunks * c;
  if (tail.off + size < end)
    psa_span_release(d, s, tail.off + size, end - (tail.off + size), stream, NULL, 0);
  psa_span_relist(d, s);
  *off = tail.off;
  return s;
}
