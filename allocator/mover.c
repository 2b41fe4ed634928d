/* Moving chunks between frames: the remap of a chunk's addresses onto another frame, and
 * the copy of its live bytes between the two frames' fixed staging mappings.
 *
 * The moves a plan starts are the mover's: one thread per device owns their remaps and
 * their copies, so the launching threads only choose and queue (psa_move_queue). Remaps
 * serialize in the driver whatever the number of threads, and a thread that remaps
 * nonstop does not slow another thread's launches (shared/DESIGN.md's measurements of
 * 2026-12-01); a remap on the launching thread cost it 0.1-1.7 ms a move. Copies are
 * chunk-sized and queued between remaps, never one large copy that remaps would queue
 * behind.
 *
 * The memory model holds throughout: a chunk with live data is always mapped to exactly
 * one frame, and a remap happens only while no enqueued work can touch the chunk. A
 * queued move holds its destination frame and marks the chunk MOVE_QUEUED; a launch that
 * touches the chunk before the mover takes it cancels the move (psa_move_touch). Once the
 * mover has found the chunk still quiescent it marks it MOVE_REMAPPING and remaps without
 * the device's lock; a launch that touches it then waits for the remap (a late wait: the
 * plan was late) and finds the copy queued, which its stream then waits for.
 *
 * The allocating thread's own moves (psa_frame_for, psa_chunk_migrate) stay synchronous
 * (psa_move): they need their frame before they return. */
#include "allocator/allocator_internal.h"
#include "tracer/tracer.h"

#include <stdlib.h>

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

static void trace_move(uint64_t chunk, enum psa_where to, uint64_t bytes, uint64_t start_ns)
{
  if (!pst_trace_enabled())
    return;
  struct pst_record r = {.type = PST_REC_MIGRATION,
                         .migration = {.chunk = (uint32_t)chunk, .direction = to == PSA_GPU ? PST_DIR_H2D : PST_DIR_D2H,
                                       .reason = to == PSA_GPU ? PST_REASON_PREFETCH : PST_REASON_EVICT,
                                       .bytes = bytes, .start_ns = start_ns, .end_ns = psa_now_ns()}};
  pst_trace_emit(&r);
}

/* A frame that frees once the copy out of it is done (at once when copy is NULL: nothing
 * is copied out of it). Without room on the deferred list, waits for the copy. */
static void give_after(struct device *d, uint32_t frame, struct psa_mark *copy)
{
  if (!copy || copy->done) {
    psa_frame_give(d, frame);
    return;
  }
  if (d->ndeferred == PSA_MAX_MIGRATIONS) {
    psa_mark_passed(d, copy, true);
    psa_frame_give(d, frame);
    return;
  }
  copy->refs++;
  d->deferred[d->ndeferred++] = (struct deferred_frame){.frame = frame, .copy = copy};
}

/* No enqueued or entering work can touch the chunk, and its last move's copy is done. */
static bool quiescent(struct device *d, uint64_t chunk)
{
  struct chunk *c = &d->chunks[chunk];
  return c->frame != PSA_NO_FRAME && c->frame != psa_shared_frame(d) && !c->in_flight && !c->span->building &&
         psa_copy_done(d, chunk, false) && psa_users_passed(d, c, false);
}

bool psa_movable(struct device *d, uint64_t chunk)
{
  return d->chunks[chunk].move == PSA_MOVE_NONE && quiescent(d, chunk);
}

/* Points the chunk's addresses at frame `to` (no lock needed: nothing else maps or
 * unmaps a chunk that is remapping); false, mapped onto `from` again, if the driver
 * refuses. *ns: the time it took. */
static bool remap(struct device *d, uint64_t chunk, uint32_t from, uint32_t to, uint64_t *ns)
{
  CUdeviceptr va = d->base + chunk * d->chunk_size;
  uint64_t start = psa_now_ns();
  bool ok = !PS_CU(ps_driver.cuMemUnmap(va, d->chunk_size));
  if (ok && psa_map(d, va, d->frames[to].handle) != CUDA_SUCCESS) {
    ok = false;
    if (psa_map(d, va, d->frames[from].handle)) /* back onto the frame that holds the data */
      ps_error("chunk %llu of device %d could not be remapped: its data is unreachable", (unsigned long long)chunk,
               d->ordinal);
  }
  *ns = psa_now_ns() - start;
  return ok;
}

/* After the remap of a chunk from frame `from` onto `to`, under the lock: its live bytes
 * copied on its direction's stream, after mark `after` when not NULL (the copy out of that
 * frame); launches that touch it from now on wait for the copy (c->copy). Returns the old
 * frame, whose copy-out is c->copy, or PSA_NO_FRAME (the chunk is back where it was and
 * `to` is given back after `after`). */
static uint32_t copy_after_remap(struct device *d, uint64_t chunk, uint32_t from, uint32_t to,
                                 struct psa_mark *after, uint64_t start)
{
  struct chunk *c = &d->chunks[chunk];
  enum psa_where where = d->frames[to].where;
  CUstream s = where == PSA_GPU ? d->copy_in : d->copy_out;
  if (after && !after->done && PS_CU(ps_driver.cuStreamWaitEvent(s, after->event, 0)))
    psa_mark_passed(d, after, true);
  int64_t bytes = copy_live_async(d, chunk, from, to, s);
  struct psa_mark *copy = bytes < 0 ? NULL : psa_mark_new(d, s);
  if (!copy) {
    /* Nothing moved. The new frame may still be a partial copy's target: it frees after
     * the stream. */
    PS_CU(ps_driver.cuStreamSynchronize(s));
    uint64_t ns;
    if (!remap(d, chunk, to, from, &ns))
      ps_error("chunk %llu of device %d could not be mapped back: its data is unreachable", (unsigned long long)chunk,
               d->ordinal);
    give_after(d, to, after);
    return PSA_NO_FRAME;
  }
  c->frame = to;
  c->copy = copy;
  d->copying[d->ncopying++] = chunk;
  psa_span_relist(d, c->span);
  if (where == PSA_GPU) {
    d->stats.migrations_to_gpu++;
    d->stats.bytes_h2d += (uint64_t)bytes;
  } else {
    d->stats.migrations_to_host++;
    d->stats.bytes_d2h += (uint64_t)bytes;
  }
  psa_trace_chunk(d, chunk, where == PSA_GPU ? PST_CHUNK_FRAME_GPU : PST_CHUNK_FRAME_HOST);
  trace_move(chunk, where, (uint64_t)bytes, start);
  return from;
}

/* Moves a quiescent chunk onto frame `to` (taken by the caller; given back, after `after`,
 * on failure). unlocked: the lock is dropped for the remap (the mover); else it is held
 * throughout (the allocating thread's own moves). Returns the old frame (c->copy is the
 * copy out of it) or PSA_NO_FRAME (the chunk is where it was). A shared chunk paged in and
 * unchanged goes back onto the node's copy with no remap of a frame of its own. */
static uint32_t move_onto(struct device *d, uint64_t chunk, uint32_t to, struct psa_mark *after, bool unlocked)
{
  struct chunk *c = &d->chunks[chunk];
  uint32_t from = c->frame;
  uint64_t start = psa_now_ns(), ns;
  if (d->frames[to].where == PSA_HOST && psa_shard_leave(d, chunk)) {
    give_after(d, to, after);
    return from;
  }
  c->move = PSA_MOVE_REMAPPING;
  if (unlocked)
    pthread_mutex_unlock(&d->lock);
  bool ok = remap(d, chunk, from, to, &ns);
  if (unlocked)
    pthread_mutex_lock(&d->lock);
  d->stats.remap_ns += ns;
  uint32_t old = ok ? copy_after_remap(d, chunk, from, to, after, start) : PSA_NO_FRAME;
  if (!ok)
    give_after(d, to, after);
  c->move = PSA_MOVE_NONE;
  pthread_cond_broadcast(&d->moved);
  return old;
}

/* What a move costs, as plans weigh it (psp_fetch_pays): the time the thread that made it
 * spent on it (the mover's, or the allocating thread's), over about the last 16 moves. */
static void note_move_cost(struct device *d, uint64_t ns)
{
  d->move_ns_mean = d->move_ns_mean ? (d->move_ns_mean * 15 + ns) / 16 : ns;
}

static bool copy_room(struct device *d, uint32_t moves)
{
  return d->ncopying + d->nqueued + moves <= PSA_MAX_MIGRATIONS && ensure_copy_streams(d);
}

CUresult psa_move(struct device *d, uint64_t chunk, enum psa_where to)
{
  if (chunk >= d->nchunks || d->chunks[chunk].frame == PSA_NO_FRAME || d->frames[d->chunks[chunk].frame].where == to)
    return CUDA_ERROR_INVALID_VALUE;
  if (!psa_movable(d, chunk) || !copy_room(d, 1))
    return CUDA_ERROR_NOT_READY;
  uint32_t fresh = to == PSA_HOST ? psa_host_frame(d) : psa_frame_take(d, to);
  if (fresh == PSA_NO_FRAME)
    return CUDA_ERROR_OUT_OF_MEMORY;
  if (!psa_movable(d, chunk)) { /* taking a frame may drop the lock */
    psa_frame_give(d, fresh);
    return CUDA_ERROR_NOT_READY;
  }
  uint64_t start = psa_now_ns();
  uint32_t old = move_onto(d, chunk, fresh, NULL, false);
  if (old == PSA_NO_FRAME)
    return CUDA_ERROR_UNKNOWN;
  give_after(d, old, d->chunks[chunk].copy);
  uint64_t spent = psa_now_ns() - start;
  d->stats.move_ns += spent;
  note_move_cost(d, spent);
  return CUDA_SUCCESS;
}

/* ---- the mover ---- */

/* A queued move: `chunk` onto `frame`; or, for a swap, `victim` (on the GPU) onto `frame`
 * (a host frame) and then `chunk` onto the victim's GPU frame once the copy out of it is
 * done. */
struct psa_move_req {
  uint64_t chunk, victim;
  uint32_t frame;
};
#define NO_VICTIM UINT64_MAX

static void *mover_main(void *arg);

/* At exit no remap may be in progress when the CUDA runtime's exit handlers destroy the
 * context: registered after the runtime's own (at the first move), so it runs first. */
static void movers_idle_at_exit(void)
{
  if (!ps_in_forked_child())
    psa_moves_settle();
}

static bool mover_running(struct device *d)
{
  if (d->mover_state == PSA_MOVER_OFF) {
    d->mover_q = calloc(PSA_MAX_MIGRATIONS, sizeof *d->mover_q);
    d->mover_state = d->mover_q && !pthread_create(&d->mover, NULL, mover_main, d) ? PSA_MOVER_ON : PSA_MOVER_FAILED;
    static bool registered;
    if (d->mover_state == PSA_MOVER_ON && !registered)
      registered = !atexit(movers_idle_at_exit);
    if (d->mover_state == PSA_MOVER_ON)
      pthread_detach(d->mover);
    else
      ps_log(PS_LOG_WARN, "device %d: no mover thread, so nothing is paged while training runs", d->ordinal);
  }
  return d->mover_state == PSA_MOVER_ON;
}

static bool enqueue(struct device *d, uint64_t chunk, uint64_t victim, uint32_t frame)
{
  if (!mover_running(d) || d->nqueued == PSA_MAX_MIGRATIONS)
    return false;
  d->mover_q[(d->qhead + d->nqueued++) % PSA_MAX_MIGRATIONS] =
      (struct psa_move_req){.chunk = chunk, .victim = victim, .frame = frame};
  d->chunks[chunk].move = PSA_MOVE_QUEUED;
  if (victim != NO_VICTIM)
    d->chunks[victim].move = PSA_MOVE_QUEUED;
  d->stats.moves_queued++;
  pthread_cond_signal(&d->mover_wake);
  return true;
}

bool psa_move_queue(struct device *d, uint64_t chunk, enum psa_where to)
{
  if (!psa_movable(d, chunk) || !copy_room(d, 1))
    return false;
  uint32_t fresh = to == PSA_HOST ? psa_host_frame(d) : psa_frame_take(d, to);
  if (fresh == PSA_NO_FRAME)
    return false;
  if (!psa_movable(d, chunk) || !enqueue(d, chunk, NO_VICTIM, fresh)) { /* taking a frame may drop the lock */
    psa_frame_give(d, fresh);
    return false;
  }
  return true;
}

bool psa_swap_queue(struct device *d, uint64_t chunk, uint64_t victim)
{
  if (!psa_movable(d, chunk) || !psa_movable(d, victim) || !copy_room(d, 2))
    return false;
  uint32_t host = psa_host_frame(d);
  if (host == PSA_NO_FRAME)
    return false;
  if (!psa_movable(d, chunk) || !psa_movable(d, victim) || !enqueue(d, chunk, victim, host)) {
    psa_frame_give(d, host);
    return false;
  }
  return true;
}

/* Whether a queued move of the chunk may still go: not cancelled by a touch, still
 * quiescent. Else the move is dropped (counted). */
static bool still_goes(struct device *d, uint64_t chunk)
{
  struct chunk *c = &d->chunks[chunk];
  if (c->move == PSA_MOVE_QUEUED && quiescent(d, chunk))
    return true;
  c->move = PSA_MOVE_NONE;
  d->stats.moves_cancelled++;
  return false;
}

/* One request, under the lock (dropped for each remap). A frame move_onto could not use
 * it has given back itself. */
static void run(struct device *d, struct psa_move_req r)
{
  if (r.victim == NO_VICTIM) {
    if (!still_goes(d, r.chunk)) {
      psa_frame_give(d, r.frame);
      return;
    }
    uint32_t old = move_onto(d, r.chunk, r.frame, NULL, true);
    if (old != PSA_NO_FRAME)
      give_after(d, old, d->chunks[r.chunk].copy);
    return;
  }
  bool chunk_goes = still_goes(d, r.chunk);
  uint32_t gpu = PSA_NO_FRAME;
  if (still_goes(d, r.victim))
    gpu = move_onto(d, r.victim, r.frame, NULL, true);
  else
    psa_frame_give(d, r.frame);
  if (gpu == PSA_NO_FRAME) {
    if (chunk_goes) {
      d->chunks[r.chunk].move = PSA_MOVE_NONE;
      d->stats.moves_cancelled++;
    }
    return;
  }
  /* The victim's frame is the chunk's once the copy out of it is done: that copy's mark
   * is held across the chunk's remap, while the lock is dropped. A touch may have
   * cancelled the chunk's move during the victim's remap. */
  struct psa_mark *out = d->chunks[r.victim].copy;
  if (out)
    out->refs++;
  if (chunk_goes && still_goes(d, r.chunk)) {
    uint32_t old = move_onto(d, r.chunk, gpu, out, true);
    if (old != PSA_NO_FRAME)
      give_after(d, old, d->chunks[r.chunk].copy);
  } else {
    give_after(d, gpu, out);
  }
  psa_mark_put(d, out);
}

static void *mover_main(void *arg)
{
  struct device *d = arg;
  ps_own_thread();
  psa_relax(true); /* for good: a remap must not break another thread's capture */
  if (PS_CU(ps_driver.cuCtxSetCurrent(d->ctx)))
    return NULL;
  pthread_mutex_lock(&d->lock);
  for (;;) {
    while (!d->nqueued)
      pthread_cond_wait(&d->mover_wake, &d->lock);
    struct psa_move_req r = d->mover_q[d->qhead];
    d->mover_busy = true;
    d->qhead = (d->qhead + 1) % PSA_MAX_MIGRATIONS;
    d->nqueued--;
    uint64_t start = psa_now_ns(), moves = d->stats.migrations_to_gpu + d->stats.migrations_to_host;
    run(d, r);
    uint64_t spent = psa_now_ns() - start;
    d->stats.mover_busy_ns += spent;
    moves = d->stats.migrations_to_gpu + d->stats.migrations_to_host - moves;
    if (moves)
      note_move_cost(d, spent / moves);
    d->mover_busy = false;
    pthread_cond_broadcast(&d->moved);
  }
  return NULL;
}

void psa_move_touch(struct device *d, uint64_t chunk)
{
  struct chunk *c = &d->chunks[chunk];
  if (c->move == PSA_MOVE_QUEUED) {
    c->move = PSA_MOVE_CANCELLED;
    return;
  }
  if (c->move != PSA_MOVE_REMAPPING)
    return;
  uint64_t start = psa_now_ns();
  while (c->move == PSA_MOVE_REMAPPING)
    pthread_cond_wait(&d->moved, &d->lock);
  d->stats.late_waits++;
  d->stats.late_wait_ns += psa_now_ns() - start;
}

void psa_moves_settle(void)
{
  for (int i = 0; i < PSA_MAX_DEVICES; i++) {
    struct device *d = &psa_devices[i];
    if (!d->ready)
      continue;
    pthread_mutex_lock(&d->lock);
    psa_mover_idle(d, false);
    pthread_mutex_unlock(&d->lock);
  }
}

void psa_mover_idle(struct device *d, bool cancel)
{
  for (uint32_t i = 0; cancel && i < d->nqueued; i++) {
    struct psa_move_req *r = &d->mover_q[(d->qhead + i) % PSA_MAX_MIGRATIONS];
    psa_move_touch(d, r->chunk);
    if (r->victim != NO_VICTIM)
      psa_move_touch(d, r->victim);
  }
  while (d->nqueued || d->mover_busy)
    pthread_cond_wait(&d->moved, &d->lock);
}

bool psa_copy_done(struct device *d, uint64_t chunk, bool sync)
{
  struct chunk *c = &d->chunks[chunk];
  if (!c->copy)
    return true;
  if (!psa_mark_passed(d, c->copy, sync))
    return false;
  psa_mark_put(d, c->copy);
  c->copy = NULL;
  for (uint32_t i = 0; i < d->ncopying; i++)
    if (d->copying[i] == chunk) {
      d->copying[i] = d->copying[--d->ncopying];
      break;
    }
  return true;
}

void psa_moves_poll(struct device *d)
{
  for (uint32_t i = 0; i < d->ndeferred;) {
    if (!psa_mark_passed(d, d->deferred[i].copy, false)) {
      i++;
      continue;
    }
    psa_frame_give(d, d->deferred[i].frame);
    psa_mark_put(d, d->deferred[i].copy);
    d->deferred[i] = d->deferred[--d->ndeferred];
  }
  for (uint32_t i = 0; i < d->ncopying;) {
    uint64_t chunk = d->copying[i];
    if (!psa_copy_done(d, chunk, false))
      i++; /* else the slot now holds another chunk */
  }
}
