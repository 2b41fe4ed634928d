/* One move: a chunk's data onto another frame while kernels run, never racing one
 * (cuMemUnmap does not wait for kernels) and never making a launch wait on the host for a
 * copy. A chunk moves only when it is quiescent (psa_movable): no launch in flight on its
 * span and every mark passed, so no enqueued work can touch its addresses. Then, at once:
 * its addresses are remapped onto the new frame (with d->lock dropped, the chunk marked
 * REMAPPING: a launch that reaches it meanwhile waits, everything else passes it over), its
 * live ranges are copied between the two frames' fixed staging mappings on a copy stream,
 * and its old frame waits on the deferred list until the copy is done. A launch that
 * touches the chunk before its copy is seen complete makes its stream wait for the copy
 * (launches.c): kernels always find the data in place. */
#include "allocator/move.h"

#include <stdatomic.h>
#include <stdlib.h>

_Atomic bool psa_moves_off;

bool psa_paging_stopped(void) { return atomic_load(&psa_moves_off); }
PS_THREAD_LOCAL bool psa_moves_settle;
struct psa_move_hooks psa_move_hooks;

bool psa_moves_setup(struct device *d)
{
  if (!(d->moves = calloc(1, sizeof *d->moves)))
    return false;
  pthread_cond_init(&d->moves->moved, NULL);
  return true;
}

static bool ensure_copy_streams(struct device *d)
{
  if (d->moves->copy_in)
    return true;
  if (PS_CU(ps_driver.cuStreamCreate(&d->moves->copy_in, CU_STREAM_NON_BLOCKING)))
    return false;
  if (PS_CU(ps_driver.cuStreamCreate(&d->moves->copy_out, CU_STREAM_NON_BLOCKING))) {
    PS_CU(ps_driver.cuStreamDestroy_v2(d->moves->copy_in));
    d->moves->copy_in = NULL;
    return false;
  }
  return true;
}

/* Copies chunk's live ranges between two frames on stream s; returns the bytes, -1 on error.
 * The copies are psshim's own work, never the program's moments: observed, they would reach
 * the iteration's period (wiring.c, its lock ranked below d->lock) from under d->lock. */
static int64_t copy_live_async(struct device *d, uint64_t chunk, uint32_t from, uint32_t to, CUstream s)
{
  struct span *sp = d->chunks[chunk].span;
  uint64_t lo = (chunk - sp->first_chunk) * d->chunk_size, hi = lo + d->chunk_size, at = lo;
  int64_t copied = 0;
  bool own = ps_in_own_calls();
  if (!own)
    ps_own_work(true);
  for (uint32_t i = 0; i <= sp->nranges && at < hi && copied >= 0; i++) {
    uint64_t free_lo = i < sp->nranges ? sp->ranges[i].off : hi;
    uint64_t live_end = free_lo < hi ? free_lo : hi;
    if (live_end > at)
      copied = PS_CU(ps_driver.cuMemcpyAsync(d->fr.frames[to].staging + (at - lo), d->fr.frames[from].staging + (at - lo),
                                             live_end - at, s))
                   ? -1
                   : copied + (int64_t)(live_end - at);
    if (i < sp->nranges && sp->ranges[i].off + sp->ranges[i].len > at)
      at = sp->ranges[i].off + sp->ranges[i].len;
  }
  if (!own)
    ps_own_work(false);
  return copied;
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

/* A frame that frees once the copy out of it is done. Without room on the list, waits. */
static void give_after(struct device *d, uint32_t frame, struct psa_mark *copy)
{
  if (!copy) { /* nothing copied out of it (a shared chunk mapped back onto its pieces) */
    psa_frame_give(d, frame);
    return;
  }
  if (d->moves->ndeferred == PSA_MAX_MIGRATIONS) {
    psa_mark_passed(d, copy, true);
    psa_frame_give(d, frame);
    return;
  }
  copy->refs++;
  d->moves->deferred[d->moves->ndeferred++] = (struct deferred_frame){.frame = frame, .copy = copy};
}

/* Whether n more moves fit in d->marks.copying beside the copies in flight and those the
 * moves underway will add (one each). */
static bool copy_slots_free(const struct device *d, uint32_t n)
{
  return d->marks.ncopying + d->moves->nmoving + n <= PSA_MAX_MIGRATIONS;
}

bool psa_movable(struct device *d, uint64_t chunk)
{
  struct chunk *c = &d->chunks[chunk];
  return c->frame != PSA_NO_FRAME && c->frame != psa_shared_frame(d) && !c->span->in_flight && c->move != PSA_REMAPPING &&
         !c->span->building && !c->span->exported && !atomic_load(&psa_moves_off) &&
         psa_copy_done(d, chunk, false) && psa_users_passed(d, c, false);
}

/* Points a chunk's addresses at another frame with d->lock dropped (the chunk is
 * REMAPPING, so nothing else touches it meanwhile): a remap is slow, far slower
 * queued behind copies, and launches of other chunks need not wait for it. False (still mapped where it was) if the driver refuses. */
static bool remap(struct device *d, uint64_t chunk, uint32_t from, uint32_t to)
{
  PSA_HELD(d);
  CUdeviceptr va = d->base + chunk * d->chunk_size;
  CUmemGenericAllocationHandle onto = d->fr.frames[to].handle, back = d->fr.frames[from].handle;
  uint64_t start = psa_now_ns();
  if (d->marks.inplace && !psa_mark_passed(d, d->marks.inplace, false))
    d->stats.remaps_beside_inplace++;
  ps_mutex_unlock(&d->lock);
  bool ok = !PS_CU(ps_driver.cuMemUnmap(va, d->chunk_size));
  if (ok && psa_map(d, va, onto) != CUDA_SUCCESS) {
    ok = false;
    if (psa_map(d, va, back)) /* back onto the frame that holds the data */
      ps_error("chunk %llu of device %d could not be remapped: its data is unreachable", (unsigned long long)chunk,
               d->ordinal);
  }
  uint64_t driver_done = psa_now_ns();
  ps_mutex_lock(&d->lock);
  d->stats.relock_ns += psa_now_ns() - driver_done;
  if (ok)
    d->stats.remap_ns += driver_done - start;
  return ok;
}

/* Remaps queue behind the copies in flight: one beside copies kept deep in both directions
 * costs many times what it does alone or with one copy queued after each. The owner
 * (psa_moves_settle) lets at most OWNER_COPIES_AHEAD run before it remaps. Drops d->lock. */
#define OWNER_COPIES_AHEAD 8

static void copies_settle(struct device *d)
{
  PSA_HELD(d);
  while (psa_moves_settle && d->marks.ncopying >= OWNER_COPIES_AHEAD) {
    uint64_t chunk = d->marks.copying[0];
    struct psa_mark *m = d->chunks[chunk].copy;
    if (!psa_mark_passed(d, m, false)) {
      uint64_t start = psa_now_ns();
      CUresult r = psa_mark_wait_unlocked(d, m);
      d->stats.copy_settle_ns += psa_now_ns() - start;
      if (r != CUDA_SUCCESS)
        return; /* an error: the pager's own checks find it */
    }
    psa_copy_done(d, chunk, false);
  }
}

/* REMAPPING -> COPYING (a copy queued) or SETTLED (nothing moved). */
static void move_end(struct device *d, struct chunk *c)
{
  c->move = c->copy ? PSA_COPYING : PSA_SETTLED;
  d->moves->nmoving--;
  pthread_cond_broadcast(&d->moves->moved);
}

/* Moves a chunk onto frame `to` (taken by the caller; given back once `after`, the copy out
 * of it, is done, when the move does not happen), if it is quiescent now: the remap first,
 * then the copy on its direction's stream, after `after` when not NULL. A remap behind a
 * queued copy of the same memory (read through the frames' staging addresses) costs more:
 * an unmap waits longer with one in flight (bench/remap_stall.c measures it).
 * Nothing in flight uses the chunk's addresses; launches that reach it during the remap
 * wait for it (enter_chunk), and those after it wait for the copy on their stream (c->copy).
 * Returns the old frame, whose copy-out is c->copy, or PSA_NO_FRAME when nothing moved (the
 * chunk is where it was). Drops d->lock. */
static uint32_t move_onto(struct device *d, uint64_t chunk, uint32_t to, struct psa_mark *after)
{
  PSA_HELD(d);
  struct chunk *c = &d->chunks[chunk];
  if (after)
    after->refs++; /* the lock drops: another thread may see the copy done and put its mark */
  copies_settle(d);
  uint64_t waits = d->stats.relock_ns;
  uint32_t old = PSA_NO_FRAME;
  if (!psa_movable(d, chunk) || !copy_slots_free(d, 1)) {
    give_after(d, to, after);
    psa_mark_put(d, after);
    return PSA_NO_FRAME;
  }
  uint32_t from = c->frame;
  enum psa_where where = d->fr.frames[to].where;
  CUstream s = where == PSA_GPU ? d->moves->copy_in : d->moves->copy_out;
  uint64_t start = psa_now_ns();
  if (where == PSA_HOST && psa_move_hooks.shared_leave && psa_move_hooks.shared_leave(d, chunk)) { /* unchanged: back onto the node's copy */
    psa_frame_give(d, to);
    psa_mark_put(d, after);
    return from;
  }
  c->move = PSA_REMAPPING; /* SETTLED: psa_movable saw its last copy done */
  d->moves->nmoving++;
  if (!remap(d, chunk, from, to)) {
    give_after(d, to, after);
    goto out;
  }
  if (after && !after->done && PS_CU(ps_driver.cuStreamWaitEvent(s, after->event, 0)))
    psa_mark_passed(d, after, true);
  int64_t bytes = copy_live_async(d, chunk, from, to, s);
  struct psa_mark *copy = bytes < 0 ? NULL : psa_mark_new(d, s);
  if (!copy) {
    /* Nothing moved. The new frame may still be a partial copy's target: it frees after
     * the stream. */
    PS_CU(ps_driver.cuStreamSynchronize(s));
    if (!remap(d, chunk, to, from))
      ps_error("chunk %llu of device %d could not be mapped back: its data is unreachable", (unsigned long long)chunk,
               d->ordinal);
    psa_frame_give(d, to);
    goto out;
  }
  old = from;
  c->frame = to;
  c->copy = copy;
  d->marks.copying[d->marks.ncopying++] = chunk;
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
  /* What the move cost the thread that made it, its waits for the lock apart: the price
   * plans weigh moves at. */
  uint64_t spent = psa_now_ns() - start - (d->stats.relock_ns - waits);
  d->stats.move_ns += spent;
  d->moves->move_ns_mean = d->moves->move_ns_mean ? (d->moves->move_ns_mean * 15 + spent) / 16 : spent; /* over ~16 moves */
out:
  psa_mark_put(d, after);
  move_end(d, c);
  return old;
}

static CUresult move_checks(struct device *d, uint64_t chunk)
{
  if (!psa_movable(d, chunk))
    return CUDA_ERROR_NOT_READY;
  if (!copy_slots_free(d, 1) || !ensure_copy_streams(d))
    return CUDA_ERROR_NOT_READY;
  return CUDA_SUCCESS;
}

CUresult psa_move(struct device *d, uint64_t chunk, enum psa_where to)
{
  PSA_HELD(d);
  if (chunk >= d->nchunks || d->chunks[chunk].frame == PSA_NO_FRAME || d->fr.frames[d->chunks[chunk].frame].where == to)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = move_checks(d, chunk);
  if (r)
    return r;
  uint32_t fresh = to == PSA_HOST ? psa_host_frame(d) : psa_frame_take(d, to);
  if (fresh == PSA_NO_FRAME)
    return CUDA_ERROR_OUT_OF_MEMORY;
  uint32_t old = move_onto(d, chunk, fresh, NULL); /* checks again: taking a frame may drop the lock */
  if (old == PSA_NO_FRAME)
    return psa_movable(d, chunk) ? CUDA_ERROR_UNKNOWN : CUDA_ERROR_NOT_READY;
  give_after(d, old, d->chunks[chunk].copy);
  return CUDA_SUCCESS;
}

bool psa_swap_in(struct device *d, uint64_t chunk, uint64_t victim)
{
  PSA_HELD(d);
  if (move_checks(d, chunk) || move_checks(d, victim) || !copy_slots_free(d, 2))
    return false;
  uint32_t host = psa_host_frame(d);
  if (host == PSA_NO_FRAME)
    return false;
  uint32_t gpu = move_onto(d, victim, host, NULL);
  if (gpu == PSA_NO_FRAME)
    return false;
  /* The victim's GPU frame, freed once its copy out is done, whether the chunk follows or not. */
  uint32_t old = move_onto(d, chunk, gpu, d->chunks[victim].copy);
  if (old == PSA_NO_FRAME)
    return false;
  give_after(d, old, d->chunks[chunk].copy);
  return true;
}

void psa_moves_poll(struct device *d)
{
  for (uint32_t i = 0; i < d->moves->ndeferred;) {
    if (!psa_mark_passed(d, d->moves->deferred[i].copy, false)) {
      i++;
      continue;
    }
    psa_frame_give(d, d->moves->deferred[i].frame);
    psa_mark_put(d, d->moves->deferred[i].copy);
    d->moves->deferred[i] = d->moves->deferred[--d->moves->ndeferred];
  }
  for (uint32_t i = 0; i < d->marks.ncopying;) {
    uint64_t chunk = d->marks.copying[i];
    if (!psa_copy_done(d, chunk, false))
      i++; /* else the slot now holds another chunk */
  }
}
