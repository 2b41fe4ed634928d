/* Paging: moving chunks between GPU and host frames while kernels run (PSSHIM_POLICY=auto).
 *
 * The protocol, which never races a kernel (cuMemUnmap does not wait for kernels):
 * - Every observed launch brackets its chunks: at enter they are "in flight" (no migration
 *   may start) and a pending migration of theirs is resolved first; at exit the launch's
 *   stream is noted on each chunk.
 * - A migration starts only for a chunk with no launch in flight. The copy stream waits for
 *   events recorded just then on every stream that touched the chunk, copies the live
 *   ranges between the two frames' staging mappings, and records `done`.
 * - It finishes (remap) once `done` has completed and no launch touched the chunk since it
 *   started; a launch that touches it first resolves it: a page-in is waited for and
 *   finished before the launch is enqueued, a page-out is cancelled (the GPU frame still
 *   holds the data).
 * Decisions (which chunk, when) come from policy/: least recently used victims, and chunks
 * touched on the host promoted on their next use. Correctness never depends on them. */
#include "allocator/allocator_internal.h"
#include "policy/policy.h"
#include "tracer/tracer.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Atomic bool paging_off; /* see stop_paging */

static uint64_t now_ns(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Index of stream s in the device's table, or PSA_STREAM_UNKNOWN when it cannot be named
 * from another thread (the per-thread default stream) or the table is full. */
static uint32_t stream_index(struct device *d, CUstream s)
{
  if (s == CU_STREAM_PER_THREAD)
    return PSA_STREAM_UNKNOWN;
  for (uint32_t i = 0; i < d->nstreams; i++)
    if (d->streams[i] == s)
      return i;
  if (d->nstreams == PSA_STREAM_UNKNOWN)
    return PSA_STREAM_UNKNOWN;
  d->streams[d->nstreams] = s;
  return d->nstreams++;
}

static bool ensure_copy_streams(struct device *d)
{
  if (d->copy_in)
    return true;
  if (PS_CU(ps_driver.cuStreamCreate(&d->copy_in, CU_STREAM_NON_BLOCKING)))
    return false;
  if (PS_CU(ps_driver.cuStreamCreate(&d->copy_out, CU_STREAM_NON_BLOCKING))) {
    PS_CU(ps_driver.cuStreamDestroy_v2(d->copy_in));
    d->copy_in = NULL;
    return false;
  }
  return true;
}

/* Orders `copy` after all work enqueued so far on the streams that touched chunk c. */
static bool wait_for_users(struct device *d, struct chunk *c, CUstream copy)
{
  if (c->streams & (1ull << PSA_STREAM_UNKNOWN))
    return ps_driver.cuCtxSynchronize() == CUDA_SUCCESS;
  for (uint32_t i = 0; i < d->nstreams; i++) {
    if (!(c->streams & (1ull << i)))
      continue;
    CUevent e = psa_event_get(d);
    bool ok = e && !PS_CU(ps_driver.cuEventRecord(e, d->streams[i])) && !PS_CU(ps_driver.cuStreamWaitEvent(copy, e, 0));
    psa_event_put(d, e); /* the wait captured the event's state: it may be reused */
    if (!ok)
      return false;
  }
  return true;
}

/* Copies chunk's live ranges between two frames on stream s; returns the bytes, -1 on error. */
static int64_t copy_live_async(struct device *d, uint64_t chunk, uint32_t from, uint32_t to, CUstream s)
{
  struct span *sp = d->chunks[chunk].span;
  uint64_t lo = (chunk - sp->first_chunk) * d->chunk_size, hi = lo + d->chunk_size, at = lo, copied = 0;
  for (uint32_t i = 0; i <= sp->nranges && at < hi; i++) {
    uint64_t free_lo = i < sp->nranges ? sp->ranges[i].off : hi;
    uint64_t live_end = free_lo < hi ? free_lo : hi;
    if (live_end > at) {
      if (PS_CU(ps_driver.cuMemcpyAsync(d->frames[to].staging + (at - lo), d->frames[from].staging + (at - lo),
                                        live_end - at, s)))
        return -1;
      copied += live_end - at;
    }
    if (i < sp->nranges && sp->ranges[i].off + sp->ranges[i].len > at)
      at = sp->ranges[i].off + sp->ranges[i].len;
  }
  return (int64_t)copied;
}

static void trace_migration(const struct migration *m, uint64_t chunk, uint16_t reason)
{
  if (!pst_trace_enabled())
    return;
  struct pst_record r = {.type = PST_REC_MIGRATION,
                         .migration = {.chunk = (uint32_t)chunk,
                                       .direction = m->to == PSA_GPU ? PST_DIR_H2D : PST_DIR_D2H,
                                       .reason = reason, .bytes = m->bytes, .start_ns = m->start_ns,
                                       .end_ns = now_ns()}};
  pst_trace_emit(&r);
}

static void drop_migration(struct device *d, uint64_t chunk)
{
  struct chunk *c = &d->chunks[chunk];
  psa_event_put(d, c->mig->done);
  free(c->mig);
  c->mig = NULL;
  for (uint32_t i = 0; i < d->nmigrating; i++)
    if (d->migrating[i] == chunk) {
      d->migrating[i] = d->migrating[--d->nmigrating];
      break;
    }
}

CUresult psa_migration_start(struct device *d, uint64_t chunk, enum psa_where to)
{
  struct chunk *c = &d->chunks[chunk];
  if (c->frame == PSA_NO_FRAME || c->mig || c->in_flight || d->frames[c->frame].where == to)
    return CUDA_ERROR_INVALID_VALUE;
  if (d->nmigrating == PSA_MAX_MIGRATIONS || !ensure_copy_streams(d))
    return CUDA_ERROR_NOT_READY;
  uint32_t from = c->frame, fresh = psa_frame_take(d, to);
  if (fresh == PSA_NO_FRAME)
    return CUDA_ERROR_OUT_OF_MEMORY;
  if (c->frame != from || c->mig || c->in_flight) { /* taking a frame may drop the lock */
    psa_frame_give(d, fresh);
    return CUDA_ERROR_NOT_READY;
  }
  struct migration *m = calloc(1, sizeof *m);
  CUstream s = to == PSA_GPU ? d->copy_in : d->copy_out;
  int64_t bytes = -1;
  if (m && (m->done = psa_event_get(d)) && wait_for_users(d, c, s))
    bytes = copy_live_async(d, chunk, from, fresh, s);
  if (bytes < 0 || PS_CU(ps_driver.cuEventRecord(m->done, s))) {
    /* Nothing was remapped: the data is where it was. The fresh frame may still be a copy's
     * target, so it is given back only after the stream drains. */
    PS_CU(ps_driver.cuStreamSynchronize(s));
    psa_frame_give(d, fresh);
    if (m)
      psa_event_put(d, m->done);
    free(m);
    return CUDA_ERROR_UNKNOWN;
  }
  m->frame = fresh;
  m->to = to;
  m->touches_at_start = c->touches;
  m->bytes = (uint64_t)bytes;
  m->start_ns = now_ns();
  c->mig = m;
  d->migrating[d->nmigrating++] = chunk;
  return CUDA_SUCCESS;
}

/* Remaps a chunk whose copy has completed and that nothing touched since it started. */
static void finish(struct device *d, uint64_t chunk)
{
  struct chunk *c = &d->chunks[chunk];
  struct migration *m = c->mig;
  CUdeviceptr va = d->base + chunk * d->chunk_size;
  uint32_t from = c->frame;
  if (PS_CU(ps_driver.cuMemUnmap(va, d->chunk_size)) || psa_map(d, va, d->frames[m->frame].handle)) {
    /* Back onto the frame that still holds the data. */
    if (psa_map(d, va, d->frames[from].handle))
      ps_error("chunk %llu of device %d could not be remapped: its data is unreachable", (unsigned long long)chunk,
               d->ordinal);
    psa_frame_give(d, m->frame);
    drop_migration(d, chunk);
    return;
  }
  c->frame = m->frame;
  c->streams = 0; /* every earlier user finished before the copy did */
  psa_frame_give(d, from);
  psa_span_relist(d, c->span);
  if (m->to == PSA_GPU) {
    d->stats.migrations_to_gpu++;
    d->stats.bytes_h2d += m->bytes;
  } else {
    d->stats.migrations_to_host++;
    d->stats.bytes_d2h += m->bytes;
  }
  psa_trace_chunk(d, chunk, m->to == PSA_GPU ? PST_CHUNK_FRAME_GPU : PST_CHUNK_FRAME_HOST);
  trace_migration(m, chunk, m->to == PSA_GPU ? PST_REASON_PREFETCH : PST_REASON_EVICT);
  drop_migration(d, chunk);
}

/* Abandons a migration: the chunk stays on its frame. The target frame returns once the
 * copy into it has completed: later (polled), so a launch never waits for a copy it does
 * not need, or at once when the deferred list is full. */
static void cancel(struct device *d, uint64_t chunk)
{
  struct migration *m = d->chunks[chunk].mig;
  if (d->ndeferred < PSA_MAX_MIGRATIONS) {
    d->deferred[d->ndeferred++] = (struct deferred_frame){.frame = m->frame, .done = m->done};
    m->done = NULL; /* now the deferred entry's */
  } else {
    PS_CU(ps_driver.cuEventSynchronize(m->done));
    psa_frame_give(d, m->frame);
  }
  d->stats.migrations_cancelled++;
  drop_migration(d, chunk);
}

/* Frames of cancelled migrations whose copies have completed go back to their lists. */
static void release_deferred(struct device *d)
{
  for (uint32_t i = 0; i < d->ndeferred;) {
    CUresult q = ps_driver.cuEventQuery(d->deferred[i].done);
    if (q == CUDA_ERROR_NOT_READY) {
      i++;
      continue;
    }
    if (q != CUDA_SUCCESS)
      PS_CU(ps_driver.cuEventSynchronize(d->deferred[i].done)); /* be sure the copy is over */
    psa_frame_give(d, d->deferred[i].frame);
    psa_event_put(d, d->deferred[i].done);
    d->deferred[i] = d->deferred[--d->ndeferred];
  }
}

bool psa_migration_settle(struct device *d, uint64_t chunk, enum psa_settle how)
{
  struct chunk *c = &d->chunks[chunk];
  struct migration *m = c->mig;
  if (!m)
    return true;
  bool touched = c->touches != m->touches_at_start || c->in_flight;
  if (touched || (how == PSA_SETTLE_FOR_TOUCH && m->to == PSA_HOST)) {
    cancel(d, chunk);
    return true;
  }
  /* Before a touch, a page-in still copying is abandoned rather than waited for: the
   * launch reads the host frame in place, and the host never stalls the GPU's queue. */
  CUresult q = how == PSA_SETTLE_FINISH ? ps_driver.cuEventSynchronize(m->done) : ps_driver.cuEventQuery(m->done);
  if (q == CUDA_ERROR_NOT_READY && how == PSA_SETTLE_FOR_TOUCH) {
    cancel(d, chunk);
    return true;
  }
  if (q == CUDA_ERROR_NOT_READY)
    return false;
  if (PS_CU(q)) {
    cancel(d, chunk);
    return true;
  }
  finish(d, chunk);
  return true;
}

void psa_migrations_poll(struct device *d)
{
  release_deferred(d);
  for (uint32_t i = 0; i < d->nmigrating;) {
    uint64_t chunk = d->migrating[i];
    if (psa_migration_settle(d, chunk, PSA_SETTLE_POLL) && (i >= d->nmigrating || d->migrating[i] != chunk))
      continue; /* removed: the slot now holds another chunk */
    i++;
  }
}

/* ---- decisions (PSSHIM_POLICY=auto) ---- */

/* A chunk on a GPU frame that may be paged out now. */
static bool evictable(const struct device *d, const struct chunk *c)
{
  return c->frame != PSA_NO_FRAME && !c->mig && !c->in_flight && !c->span->building &&
         d->frames[c->frame].where == PSA_GPU;
}

/* The least recently used GPU chunk that may move now, or UINT64_MAX. */
static uint64_t lru_victim(struct device *d, uint64_t now)
{
  psp_cand *cands = d->cands;
  uint64_t *ids = d->cand_chunks;
  size_t n = 0;
  for (uint64_t i = 0; i < d->nchunks; i++) {
    struct chunk *c = &d->chunks[i];
    if (!evictable(d, c))
      continue;
    cands[n] = (psp_cand){.chunk = (uint32_t)i, .bytes = d->chunk_size, .last_use = c->last_use, .dirty = true};
    ids[n++] = i;
  }
  ptrdiff_t v = psp_victim_lru(now, cands, n);
  return v < 0 ? UINT64_MAX : ids[v];
}

static uint64_t predicted_next(const struct chunk *c, uint64_t now, uint64_t period)
{
  return psp_predict_next(c->uses, PSA_USES, now, period);
}

/* Once the iteration's period is known: the GPU chunk whose next use comes last (OPT,
 * predicted from each chunk's uses in the last iteration), but only if that is later than
 * `need`, the next use of the chunk that wants its frame (Belady's condition: otherwise
 * the swap costs two copies and gains nothing). UINT64_MAX when there is none. */
static uint64_t opt_victim(struct device *d, uint64_t now, uint64_t period, uint64_t need)
{
  uint64_t best = UINT64_MAX, best_next = need;
  for (uint64_t i = 0; i < d->nchunks; i++) {
    struct chunk *c = &d->chunks[i];
    if (!evictable(d, c))
      continue;
    uint64_t next = predicted_next(c, now, period);
    if (next > best_next || (next == best_next && best != UINT64_MAX && c->last_use < d->chunks[best].last_use)) {
      best = i;
      best_next = next;
    }
  }
  return best;
}

/* After a launch that touched chunk on the host: bring it in for its next use. Without a
 * free GPU frame, page out a victim to make room: by OPT once the iteration's period is
 * known, by LRU before. */
static void promote(struct device *d, uint64_t chunk, uint64_t now)
{
  struct chunk *c = &d->chunks[chunk];
  if (c->mig || c->in_flight || c->frame == PSA_NO_FRAME || d->frames[c->frame].where != PSA_HOST)
    return;
  if (!psa_gpu_frame_available(d)) {
    uint64_t period = pst_session_period();
    uint64_t v = period ? opt_victim(d, now, period, predicted_next(c, now, period)) : lru_victim(d, now);
    if (v != UINT64_MAX)
      psa_migration_start(d, v, PSA_HOST); /* its frame frees when the copy is done */
    return; /* this chunk goes in at a later use, once a frame is free */
  }
  psa_migration_start(d, chunk, PSA_GPU);
}

/* Calls fn for every chunk of the spans that the launch's pointers fall in, once per
 * span, holding each device's lock once per launch (pointers come sorted, so pointers of
 * one span, and of one device, are neighbours). */
static void for_each_chunk(const struct pst_launch *l, void (*fn)(struct device *, uint64_t, const struct pst_launch *))
{
  struct device *locked = NULL;
  const struct span *last = NULL;
  for (uint32_t k = 0; k < l->nptrs; k++) {
    int ordinal;
    int64_t chunk = psa_chunk_of(l->ptrs[k], &ordinal);
    if (chunk < 0)
      continue;
    struct device *d = &psa_devices[ordinal];
    if (d != locked) {
      if (locked)
        pthread_mutex_unlock(&locked->lock);
      pthread_mutex_lock(&d->lock);
      locked = d;
      last = NULL;
    }
    struct span *s = d->chunks[chunk].span;
    if (!s || s == last)
      continue;
    last = s;
    for (uint64_t i = s->first_chunk; i < s->first_chunk + s->nchunks; i++)
      fn(d, i, l);
  }
  if (locked)
    pthread_mutex_unlock(&locked->lock);
}

static void enter_chunk(struct device *d, uint64_t chunk, const struct pst_launch *l)
{
  struct chunk *c = &d->chunks[chunk];
  if (c->mig)
    psa_migration_settle(d, chunk, PSA_SETTLE_FOR_TOUCH);
  c->in_flight++;
  c->touches++;
  if (c->frame != PSA_NO_FRAME && d->frames[c->frame].where == PSA_HOST)
    d->stats.touches_host++;
  else
    d->stats.touches_gpu++;
  c->last_use = l->seq + 1; /* +1: 0 means never */
  c->uses[c->use_pos++ % PSA_USES] = c->last_use;
}

static void exit_chunk(struct device *d, uint64_t chunk, const struct pst_launch *l)
{
  struct chunk *c = &d->chunks[chunk];
  if (c->in_flight)
    c->in_flight--;
  if (!l->failed)
    c->streams |= 1ull << stream_index(d, (CUstream)(uintptr_t)l->stream);
  if (ps_options.policy == PS_POLICY_AUTO && !c->in_flight && !atomic_load(&paging_off))
    promote(d, chunk, l->seq + 1);
}

/* Work whose accesses psshim cannot see (CUDA graphs) may touch any chunk: pending
 * migrations are settled before it, and paging stops for good, said once. */
static void stop_paging(void)
{
  if (atomic_exchange(&paging_off, true))
    return;
  ps_log(PS_LOG_WARN, "a CUDA graph was launched: its memory accesses cannot be observed, so paging stops "
                      "(placement stays as it is)");
  for (int i = 0; i < PSA_MAX_DEVICES; i++) {
    struct device *d = &psa_devices[i];
    if (!d->ready)
      continue;
    pthread_mutex_lock(&d->lock);
    while (d->nmigrating)
      psa_migration_settle(d, d->migrating[0], PSA_SETTLE_FOR_TOUCH);
    pthread_mutex_unlock(&d->lock);
  }
}

void psa_on_moment(const struct pst_launch *l, bool enter)
{
  if (l->opaque && enter)
    stop_paging();
  if (!l->nptrs)
    return;
  for_each_chunk(l, enter ? enter_chunk : exit_chunk);
  if (!enter && ps_options.policy == PS_POLICY_AUTO) {
    for (int i = 0; i < PSA_MAX_DEVICES; i++) {
      struct device *d = &psa_devices[i];
      if (!d->ready || (!d->nmigrating && !d->ndeferred))
        continue;
      pthread_mutex_lock(&d->lock);
      psa_migrations_poll(d);
      pthread_mutex_unlock(&d->lock);
    }
  }
}
