/* Paging: moving chunks between GPU and host frames while kernels run (PSSHIM_POLICY=auto, plan).
 *
 * The protocol, which never races a kernel (cuMemUnmap does not wait for kernels) and never
 * makes a launch wait on the host for a copy (the host is held back only by the run-ahead
 * bound, PSSHIM_RUNAHEAD launches ahead of the GPU, so that chunks become quiescent):
 * - Every observed launch brackets the spans it names, and so all their chunks: between its
 *   enter and exit they are "in flight"; after it is enqueued, a mark (an event) recorded
 *   behind it on its stream is kept on each span it touched, one per stream.
 * - A chunk moves only when it is quiescent: no launch in flight on its span and every mark
 *   passed, so no enqueued work can touch its addresses. Then, at once: its addresses are remapped
 *   onto the new frame (with d->lock dropped, the chunk marked `moving`: a launch that
 *   reaches it meanwhile waits, everything else passes it over), its live ranges are
 *   copied between the two frames' fixed staging mappings on a copy stream, and its old
 *   frame waits on the deferred list until the copy is done.
 * - A launch that touches the chunk before its copy is seen complete makes its stream wait
 *   for the copy (a stream wait, not a host wait): kernels always find the data in place.
 * Decisions (which chunk, when) come from policy/ and the iteration's period, once it is
 * known: room is kept for the iteration's short-lived allocations (the margin), and chunks
 * in host frames that will be used soonest are fetched into free GPU frames or into the
 * frames of GPU chunks used later (OPT on predicted next uses), where the uses saved
 * outweigh the moves' measured cost; with PSSHIM_POLICY=plan, once policy/'s plan for the
 * iteration is made (plan_exec.c), its moves instead. Correctness never depends on them.
 * The launching threads take these turns every few launches, or wake a thread per device
 * (the mover) that takes them: once the iteration's own allocations outgrow the GPU
 * (PSSHIM_MOVER=crowded, the default), or always (=1). Work psshim cannot see (graph launches,
 * array copies, graph capture) stops paging for good. */
#include "allocator/allocator_internal.h"
#include "comm/comm.h"
#include "policy/policy.h"
#include "tracer/tracer.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MARGIN_LOOKAHEAD 8 /* room is made for the margin 1/8 of an iteration ahead */

static _Atomic bool paging_off; /* see stop_paging */

/* ---- marks ---- */

/* A mark recorded now on stream s, or NULL. */
static struct psa_mark *mark_new(struct device *d, CUstream s)
{
  struct psa_mark *m = d->pager.free_marks;
  if (m)
    d->pager.free_marks = m->next_free;
  else if (!(m = calloc(1, sizeof *m)))
    return NULL;
  *m = (struct psa_mark){.event = psa_event_get(d), .stream = s, .refs = 1};
  if (!m->event || PS_CU(ps_driver.cuEventRecord(m->event, s))) {
    psa_event_put(d, m->event);
    m->next_free = d->pager.free_marks;
    d->pager.free_marks = m;
    return NULL;
  }
  return m;
}

static void mark_put(struct device *d, struct psa_mark *m)
{
  if (!m || --m->refs)
    return;
  psa_event_put(d, m->event);
  m->next_free = d->pager.free_marks;
  d->pager.free_marks = m;
}

/* Whether the work before the mark has completed (sync: wait for it). */
static bool mark_passed(struct device *d, struct psa_mark *m, bool sync)
{
  if (m->done)
    return true;
  d->stats.event_queries += !sync;
  CUresult r = sync ? ps_driver.cuEventSynchronize(m->event) : ps_driver.cuEventQuery(m->event);
  if (r == CUDA_ERROR_NOT_READY)
    return false;
  if (r != CUDA_SUCCESS && !sync)
    PS_CU(ps_driver.cuEventSynchronize(m->event)); /* an error: be sure the work is over */
  m->done = true;
  return true;
}

/* Drops the chunk's marks that have passed; true when none is left (sync: wait for all). */
static bool users_passed(struct device *d, struct chunk *c, bool sync)
{
  for (uint32_t i = 0; i < c->nusers;)
    if (mark_passed(d, c->users[i], sync)) {
      mark_put(d, c->users[i]);
      c->users[i] = c->users[--c->nusers];
    } else {
      i++;
    }
  return c->nusers == 0;
}

/* Keeps launch mark m on the chunk. A later mark on the same stream stands for an earlier
 * one, except on the per-thread default stream, whose handle names a different stream on
 * every thread. */
static void add_user(struct device *d, struct chunk *c, struct psa_mark *m)
{
  for (uint32_t i = 0; i < c->nusers; i++)
    if (c->users[i]->stream == m->stream && m->stream != CU_STREAM_PER_THREAD) {
      mark_put(d, c->users[i]);
      c->users[i] = m;
      m->refs++;
      return;
    }
  if (c->nusers == PSA_USER_MARKS && !users_passed(d, c, false) && c->nusers == PSA_USER_MARKS) {
    /* More streams at once than tracked (rare): wait for the oldest. */
    mark_passed(d, c->users[0], true);
    users_passed(d, c, false);
  }
  c->users[c->nusers++] = m;
  m->refs++;
}

/* A span deleted (spans.c) is idle: its frees' events have passed, and with them the work
 * its chunks' marks stand for. Their uses are forgotten too: the chunks will hold other data. */
void psa_span_forget_users(struct device *d, struct span *s)
{
  for (uint64_t i = s->first_chunk; i < s->first_chunk + s->nchunks; i++) {
    struct chunk *c = &d->chunks[i];
    while (c->nusers)
      mark_put(d, c->users[--c->nusers]);
    c->use_pos = 0;
    c->last_use = c->next_use = 0;
    memset(&d->uses[i], 0, sizeof d->uses[i]);
  }
}

/* ---- moves ---- */

static bool ensure_copy_streams(struct device *d)
{
  if (d->pager.copy_in)
    return true;
  if (PS_CU(ps_driver.cuStreamCreate(&d->pager.copy_in, CU_STREAM_NON_BLOCKING)))
    return false;
  if (PS_CU(ps_driver.cuStreamCreate(&d->pager.copy_out, CU_STREAM_NON_BLOCKING))) {
    PS_CU(ps_driver.cuStreamDestroy_v2(d->pager.copy_in));
    d->pager.copy_in = NULL;
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
      if (PS_CU(ps_driver.cuMemcpyAsync(d->fr.frames[to].staging + (at - lo), d->fr.frames[from].staging + (at - lo),
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

/* A frame that frees once the copy out of it is done. Without room on the list, waits. */
static void give_after(struct device *d, uint32_t frame, struct psa_mark *copy)
{
  if (!copy) { /* nothing copied out of it (a shared chunk mapped back onto its pieces) */
    psa_frame_give(d, frame);
    return;
  }
  if (d->pager.ndeferred == PSA_MAX_MIGRATIONS) {
    mark_passed(d, copy, true);
    psa_frame_give(d, frame);
    return;
  }
  copy->refs++;
  d->pager.deferred[d->pager.ndeferred++] = (struct deferred_frame){.frame = frame, .copy = copy};
}

/* Whether n more moves fit in d->pager.copying beside the copies in flight and those the
 * moves underway will add (one each). */
static bool copy_slots_free(const struct device *d, uint32_t n)
{
  return d->pager.ncopying + d->pager.nmoving + n <= PSA_MAX_MIGRATIONS;
}

bool psa_movable(struct device *d, uint64_t chunk)
{
  struct chunk *c = &d->chunks[chunk];
  return c->frame != PSA_NO_FRAME && c->frame != psa_shared_frame(d) && !c->span->in_flight && !c->moving &&
         !c->span->building && !c->span->exported && !atomic_load(&paging_off) &&
         psa_copy_done(d, chunk, false) && users_passed(d, c, false);
}

/* Points a chunk's addresses at another frame with d->lock dropped (the caller has marked
 * the chunk `moving`, so nothing else touches it meanwhile): a remap takes 50 us alone and
 * over a millisecond queued behind copies (../shared/DESIGN.md), and launches of other
 * chunks need not wait for it. False (still mapped where it was) if the driver refuses. */
static bool remap(struct device *d, uint64_t chunk, uint32_t from, uint32_t to)
{
  CUdeviceptr va = d->base + chunk * d->chunk_size;
  CUmemGenericAllocationHandle onto = d->fr.frames[to].handle, back = d->fr.frames[from].handle;
  uint64_t start = psa_now_ns();
  pthread_mutex_unlock(&d->lock);
  bool ok = !PS_CU(ps_driver.cuMemUnmap(va, d->chunk_size));
  if (ok && psa_map(d, va, onto) != CUDA_SUCCESS) {
    ok = false;
    if (psa_map(d, va, back)) /* back onto the frame that holds the data */
      ps_error("chunk %llu of device %d could not be remapped: its data is unreachable", (unsigned long long)chunk,
               d->ordinal);
  }
  uint64_t driver_done = psa_now_ns();
  pthread_mutex_lock(&d->lock);
  d->stats.relock_ns += psa_now_ns() - driver_done;
  if (ok)
    d->stats.remap_ns += driver_done - start;
  return ok;
}

static _Thread_local bool tls_mover; /* this thread is a device's mover */

/* Remaps queue behind the copies in flight: on the H200 a 4 MiB remap took 90 us alone and
 * 600-1070 us beside 4 MiB copies kept 16 deep each way, 91 us with one copy queued after
 * each (bench/results/remap_beside_2026-12-01.txt). The mover, whose waits hold no launch
 * back, lets at most MOVER_COPIES_AHEAD run before it remaps. Drops d->lock. */
#define MOVER_COPIES_AHEAD 8

/* Waits for the work before mark m with d->lock dropped, so that the device's other
 * threads go on meanwhile (a launch, or the mover, that wants the lock would wait out a
 * copy queued behind others); the reference taken keeps m. */
static CUresult mark_wait_unlocked(struct device *d, struct psa_mark *m)
{
  m->refs++;
  pthread_mutex_unlock(&d->lock);
  CUresult r = ps_driver.cuEventSynchronize(m->event);
  pthread_mutex_lock(&d->lock);
  m->done = m->done || r == CUDA_SUCCESS;
  mark_put(d, m);
  return r;
}

static void copies_settle(struct device *d)
{
  while (tls_mover && d->pager.ncopying >= MOVER_COPIES_AHEAD) {
    uint64_t chunk = d->pager.copying[0];
    struct psa_mark *m = d->chunks[chunk].copy;
    if (!mark_passed(d, m, false)) {
      uint64_t start = psa_now_ns();
      CUresult r = mark_wait_unlocked(d, m);
      d->stats.copy_settle_ns += psa_now_ns() - start;
      if (r != CUDA_SUCCESS)
        return; /* an error: the pager's own checks find it */
    }
    psa_copy_done(d, chunk, false);
  }
}

static void move_end(struct device *d, struct chunk *c)
{
  c->moving = false;
  d->pager.nmoving--;
  pthread_cond_broadcast(&d->pager.moved);
}

/* Moves a chunk onto frame `to` (taken by the caller; given back once `after`, the copy out
 * of it, is done, when the move does not happen), if it is quiescent now: the remap first,
 * then the copy on its direction's stream, after `after` when not NULL. A remap behind a
 * queued copy of the same memory (read through the frames' staging addresses) costs more:
 * on the H200 an unmap took 83 us instead of 50 with one in flight (bench/remap_stall.c).
 * Nothing in flight uses the chunk's addresses; launches that reach it during the remap
 * wait for it (enter_chunk), and those after it wait for the copy on their stream (c->copy).
 * Returns the old frame, whose copy-out is c->copy, or PSA_NO_FRAME when nothing moved (the
 * chunk is where it was). Drops d->lock. */
static uint32_t move_onto(struct device *d, uint64_t chunk, uint32_t to, struct psa_mark *after)
{
  struct chunk *c = &d->chunks[chunk];
  if (after)
    after->refs++; /* the lock drops: another thread may see the copy done and put its mark */
  copies_settle(d);
  uint64_t waits = d->stats.relock_ns;
  uint32_t old = PSA_NO_FRAME;
  if (!psa_movable(d, chunk) || !copy_slots_free(d, 1)) {
    give_after(d, to, after);
    mark_put(d, after);
    return PSA_NO_FRAME;
  }
  uint32_t from = c->frame;
  enum psa_where where = d->fr.frames[to].where;
  CUstream s = where == PSA_GPU ? d->pager.copy_in : d->pager.copy_out;
  uint64_t start = psa_now_ns();
  if (where == PSA_HOST && psa_shard_leave(d, chunk)) { /* unchanged: back onto the node's copy */
    psa_frame_give(d, to);
    mark_put(d, after);
    return from;
  }
  c->moving = true;
  d->pager.nmoving++;
  if (!remap(d, chunk, from, to)) {
    give_after(d, to, after);
    goto out;
  }
  if (after && !after->done && PS_CU(ps_driver.cuStreamWaitEvent(s, after->event, 0)))
    mark_passed(d, after, true);
  int64_t bytes = copy_live_async(d, chunk, from, to, s);
  struct psa_mark *copy = bytes < 0 ? NULL : mark_new(d, s);
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
  d->pager.copying[d->pager.ncopying++] = chunk;
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
  d->pager.move_ns_mean = d->pager.move_ns_mean ? (d->pager.move_ns_mean * 15 + spent) / 16 : spent; /* over ~16 moves */
out:
  mark_put(d, after);
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

bool psa_copy_done(struct device *d, uint64_t chunk, bool sync)
{
  struct chunk *c = &d->chunks[chunk];
  if (!c->copy)
    return true;
  if (!mark_passed(d, c->copy, sync))
    return false;
  mark_put(d, c->copy);
  c->copy = NULL;
  for (uint32_t i = 0; i < d->pager.ncopying; i++)
    if (d->pager.copying[i] == chunk) {
      d->pager.copying[i] = d->pager.copying[--d->pager.ncopying];
      break;
    }
  return true;
}

void psa_moves_poll(struct device *d)
{
  for (uint32_t i = 0; i < d->pager.ndeferred;) {
    if (!mark_passed(d, d->pager.deferred[i].copy, false)) {
      i++;
      continue;
    }
    psa_frame_give(d, d->pager.deferred[i].frame);
    mark_put(d, d->pager.deferred[i].copy);
    d->pager.deferred[i] = d->pager.deferred[--d->pager.ndeferred];
  }
  for (uint32_t i = 0; i < d->pager.ncopying;) {
    uint64_t chunk = d->pager.copying[i];
    if (!psa_copy_done(d, chunk, false))
      i++; /* else the slot now holds another chunk */
  }
}

/* ---- decisions (PSSHIM_POLICY=auto) ---- */

/* Moves per plan, and copies in flight a plan may add to (see PSA_PLAN_BYTES). */
static uint32_t plan_moves(const struct device *d)
{
  uint64_t n = PSA_PLAN_BYTES / d->chunk_size;
  return n < 8 ? 8 : n > PSA_MAX_MIGRATIONS / 2 ? PSA_MAX_MIGRATIONS / 2 : (uint32_t)n;
}

/* What a use of a chunk left in a host frame costs: a kernel reads (and writes back) it in
 * place at PSSHIM_INPLACE_RATE. Moves cost what the launching thread measurably spends on
 * them (d->pager.move_ns_mean); see psp_fetch_pays. */
static uint64_t use_ns(const struct device *d)
{
  return (uint64_t)((double)d->chunk_size * 1e9 / (double)ps_options.inplace_rate);
}

static bool on(const struct device *d, const struct chunk *c, enum psa_where w)
{
  return c->frame != PSA_NO_FRAME && d->fr.frames[c->frame].where == w;
}

/* Allocated into within the last iteration: it holds the iteration's own, short-lived
 * allocations (a span is reused for them iteration after iteration, so its birth would
 * not tell). */
static bool young(const struct span *s, uint64_t now, uint64_t period)
{
  return now - s->last_alloc < period;
}

static uint64_t predicted_next(struct device *d, uint64_t chunk, uint64_t now, uint64_t period)
{
  struct chunk *c = &d->chunks[chunk];
  /* A prediction later than now stands until the chunk is used again (enter_span clears
   * it): the uses within the window that gave it are still within it. */
  if (c->next_use <= now)
    c->next_use = psp_predict_next(d->uses[chunk].at, PSA_USES, now, period);
  return c->next_use;
}

/* Whether a chunk of the iteration's own allocations waits beyond the margin's window for
 * its next use (a gradient before the optimizer step, an activation saved for a backward
 * pass far ahead), in a part of the iteration whose own allocations outgrow the GPU
 * (`crowded`, see coming_margin): then it needs no GPU frame for that part, and gives its
 * frame to the allocations made meanwhile. A chunk not used yet does not wait. */
static bool waits(struct device *d, uint64_t chunk, uint64_t now, uint64_t period, bool crowded)
{
  return crowded && d->chunks[chunk].last_use &&
         predicted_next(d, chunk, now, period) >= now + period / MARGIN_LOOKAHEAD;
}

/* Whether a mapped chunk may be movable by now, judged without the driver: no launch in
 * flight on its span, no copy of its own, used at least once, and not within the last
 * PSSHIM_RUNAHEAD launches (such a chunk is most likely still queued). psa_movable decides. */
static bool settled(const struct chunk *c, uint64_t now)
{
  return !c->span->in_flight && !c->copy && c->last_use && c->last_use + ps_options.runahead <= now;
}

/* What a plan needs of the chunks, in one pass over them (at 3x over budget on the 2.68B
 * GPT, three passes over its ~11,600 chunks took most of a plan's time: ~55 ms of a 1.9 s
 * step, bench/results/README.md):
 * - frames that young spans hold (the iteration's activations and other short-lived
 *   allocations): in all, and of those the ones that wait (anywhere) and the others on the
 *   GPU; and GPU frames that are free or soon free: unused, held by empty spans (an
 *   allocation takes them back), or leaving with a page-out's copy;
 * - the chunks a move might take now (in use or being copied: not), with predicted next
 *   uses, in the order to consider them: host chunks to fetch (into `fetch`, unless NULL)
 *   the soonest first, GPU chunks to page out (into `victims`, unless NULL) the farthest
 *   first. */
struct survey {
  uint64_t young_all, waiting, young_gpu, room;
  size_t nfetch, nvictims;
};

static void survey(struct device *d, uint64_t now, uint64_t period, bool crowded, struct survey *s, psp_cand *fetch,
                   psp_cand *victims)
{
  *s = (struct survey){.room = d->fr.gpu_limit - d->fr.gpu_held};
  for (uint64_t i = 0; i < d->space.chunks_high; i++) {
    struct chunk *c = &d->chunks[i];
    if (c->frame == PSA_NO_FRAME)
      continue;
    struct span *sp = c->span;
    bool gpu = on(d, c, PSA_GPU), live = sp->live_allocs, yng = live && young(sp, now, period);
    bool waiting = yng && waits(d, i, now, period, crowded);
    s->room += gpu && !live;
    s->young_all += yng;
    s->waiting += waiting;
    s->young_gpu += gpu && yng && !waiting;
    if (!settled(c, now))
      continue;
    if (gpu && victims) {
      /* Victims are model data and young chunks that wait: the other young keep their
       * frames (the margin), and an empty span's frame goes to the next allocation anyway. */
      if (live && (!yng || waiting))
        victims[s->nvictims++] = (psp_cand){.chunk = (uint32_t)i, .bytes = d->chunk_size, .dirty = true,
                                            .next_use = predicted_next(d, i, now, period)};
    } else if (!gpu && fetch) {
      uint64_t next = predicted_next(d, i, now, period);
      /* Not expected soon, or cheaper read in place: not fetched. Fetches want the soonest:
       * the victims' order with next uses reversed. */
      if (next != PSP_NEVER &&
          psp_fetch_pays(psp_uses_within(d->uses[i].at, PSA_USES, now, period), use_ns(d), d->pager.move_ns_mean))
        fetch[s->nfetch++] = (psp_cand){.chunk = (uint32_t)i, .bytes = d->chunk_size, .dirty = true,
                                        .next_use = PSP_NEVER - next};
    }
  }
  for (uint32_t i = 0; i < d->pager.ndeferred; i++)
    s->room += d->fr.frames[d->pager.deferred[i].frame].where == PSA_GPU;
  /* A plan takes few: only those worth sorting. */
  size_t k = 4 * (size_t)plan_moves(d);
  if (fetch) {
    psp_sort_farthest(fetch, s->nfetch, k);
    s->nfetch = s->nfetch < k ? s->nfetch : k;
  }
  if (victims) {
    psp_sort_farthest(victims, s->nvictims, k);
    s->nvictims = s->nvictims < k ? s->nvictims : k;
  }
}

/* Frames the iteration's short-lived allocations will hold in the coming part of the
 * iteration: the most they held in that part last time. More than the GPU has (3x over
 * budget on the 2.68B GPT) makes that part crowded: those that wait are paged as model
 * data is. PatrickStar's margin assumes they fit. */
static uint64_t coming_margin(const struct device *d, uint64_t now, uint64_t period)
{
  return psp_phase_ahead(&d->pager.young, now, period / MARGIN_LOOKAHEAD);
}

uint32_t psa_frame_for(struct device *d, uint64_t period, uint64_t need)
{
  uint64_t margin = coming_margin(d, d->pager.clock, period);
  if (d->fr.gpu_held + margin < d->fr.gpu_limit)
    return psa_frame_take(d, PSA_GPU);
  psp_cand *victims = d->pager.cands + d->nchunks;
  struct survey sv;
  survey(d, d->pager.clock, period, margin > d->fr.gpu_limit, &sv, NULL, victims);
  for (size_t v = 0; v < sv.nvictims && victims[v].next_use > need; v++) {
    uint64_t chunk = victims[v].chunk;
    if (!psa_movable(d, chunk) || psa_move(d, chunk, PSA_HOST) != CUDA_SUCCESS)
      continue;
    psa_copy_done(d, chunk, true);
    psa_moves_poll(d); /* its GPU frame is free once the copy out of it is done */
    return psa_frame_take(d, PSA_GPU);
  }
  return PSA_NO_FRAME;
}

/* Room by age: an allocation that finds no GPU frame takes the frame of the live chunk
 * unused for longest instead of a host frame: what a kernel writes now is read again soon,
 * what lay unused longest is read in place at most once or twice before it is needed.
 * - Before the period is trusted nothing tells the iteration's short-lived allocations from
 *   model data, and nothing moves (plan). Where that leaves kernels reading their operands
 *   in host frames (at 3x over budget on the 2.68B GPT: 17-29 s a step for the first four
 *   steps against 1.7 s steady, about 1 TB a step read in place, bench/results/README.md),
 *   room by age stands in for the pager. Where few touches find host frames (1.5% at
 *   1.25x), static placement stands: it costs nothing then.
 * - Once trusted, where the coming part of the iteration is crowded (its own allocations
 *   outgrow the GPU, as at half the activation set's peaks and at 3x on the GPT), the
 *   margin's page-outs ahead of time cannot make room for them all, and what they leave
 *   out lands in host frames: there room by age goes on (ResNet-50 5-6% and the demo GPT
 *   11-14% faster in two calls each, bench/results/README.md). */
#define ROOM_CROWDED_SHARE 10 /* more than 1/10 of the chunk touches in host frames */
#define ROOM_BATCH_BYTES (64ull << 20) /* a batch of page-outs, at most 1/16 of the GPU's frames */

/* Page-outs trade GPU frames for host frames: only while less than half of the host budget
 * (the node's, where ranks share it) is in host frames, so that static placement, which
 * needs the fewest, still fits where host frames are scarce. */
static bool host_frames_ample(const struct device *d)
{
  uint64_t node = psc_host_reserved(), mine = d->stats.host_frames_made * d->chunk_size;
  return 2 * (node > mine ? node : mine) < d->stats.host_budget;
}

bool psa_room_by_age(const struct device *d)
{
  if (ps_options.policy != PS_POLICY_AUTO || atomic_load(&paging_off) || psa_capture_underway() ||
      !host_frames_ample(d))
    return false;
  if (d->pager.period)
    return coming_margin(d, d->pager.clock, d->pager.period) > d->fr.gpu_limit;
  return d->stats.touches_host * ROOM_CROWDED_SHARE > d->stats.touches_host + d->stats.touches_gpu;
}

/* Pages out up to a batch of the live chunks on the GPU unused for longest; how many. */
static uint32_t page_out_oldest(struct device *d)
{
  psp_cand *oldest = d->pager.cands + d->nchunks;
  size_t n = 0, batch = ROOM_BATCH_BYTES / d->chunk_size;
  if (batch > d->fr.gpu_limit / 16)
    batch = d->fr.gpu_limit / 16;
  if (!batch)
    batch = 1;
  uint64_t now = d->pager.clock;
  for (uint64_t i = 0; i < d->space.chunks_high; i++) {
    struct chunk *c = &d->chunks[i];
    if (c->frame == PSA_NO_FRAME || !on(d, c, PSA_GPU) || !c->span->live_allocs || !settled(c, now))
      continue;
    oldest[n++] = (psp_cand){.chunk = (uint32_t)i, .bytes = d->chunk_size, .dirty = true, .next_use = now - c->last_use};
  }
  psp_sort_farthest(oldest, n, batch);
  uint32_t moved = 0;
  bool own = ps_in_own_calls();
  if (!own)
    ps_own_work(true); /* the copies out are not the program's moments */
  for (size_t k = 0; k < n && moved < batch; k++)
    if (psa_movable(d, oldest[k].chunk) && psa_move(d, oldest[k].chunk, PSA_HOST) == CUDA_SUCCESS)
      moved++;
  if (!own)
    ps_own_work(false);
  d->stats.room_page_outs += moved;
  return moved;
}

static uint32_t frame_by_age(struct device *d)
{
  for (;;) {
    psa_moves_poll(d);
    uint32_t f = psa_frame_take(d, PSA_GPU);
    if (f != PSA_NO_FRAME)
      return f;
    /* A GPU frame that a page-out's copy still reads comes back once the copy is done. */
    struct psa_mark *leaving = NULL;
    for (uint32_t i = 0; i < d->pager.ndeferred && !leaving; i++)
      if (d->fr.frames[d->pager.deferred[i].frame].where == PSA_GPU)
        leaving = d->pager.deferred[i].copy;
    if (leaving) {
      uint64_t start = psa_now_ns();
      mark_wait_unlocked(d, leaving); /* an error shows at the next poll, which waits it out */
      d->stats.room_wait_ns += psa_now_ns() - start;
    } else if (!host_frames_ample(d) || !page_out_oldest(d))
      return PSA_NO_FRAME;
  }
}

/* Counted apart (room_ns): these moves are made on the allocating threads whoever takes the
 * pager's turns, outside the launching threads' time in the pager (launch_ns). */
uint32_t psa_frame_by_age(struct device *d)
{
  uint64_t start = psa_now_ns();
  uint32_t f = frame_by_age(d);
  d->stats.room_ns += psa_now_ns() - start;
  return f;
}

/* Nothing moves until the iteration's period is known: without it nothing tells the
 * iteration's short-lived allocations from model data. (When free frames were filled with
 * recently used host chunks meanwhile, auto's first steps at 2x the budget took 26 s each
 * on the H200, static placement's 6.7; the cause was not isolated.) Then: first room on
 * the GPU for the iteration's short-lived allocations of the coming part of the iteration
 * (PatrickStar's margin: the most frames they held in that part last time, less those
 * that wait beyond it, up to the whole budget, less what the others hold on the GPU now),
 * made by paging out what is needed farthest ahead, model data or young chunks that wait,
 * so the activations in use do not land in host frames (at 3x over budget on the 2.68B
 * GPT the young alone outgrow the GPU). Then the host chunks needed soonest go into free
 * GPU frames beyond the margin, or into the frames of GPU chunks needed later than they
 * are (Belady), where the move pays. */
static void plan(struct device *d, uint64_t now, uint64_t period)
{
  if (!period)
    return;
  psp_cand *fetch = d->pager.cands, *victims = d->pager.cands + d->nchunks;
  uint32_t most = plan_moves(d);
  if (period != d->pager.predicted_for) { /* predictions made with another period are void */
    for (uint64_t i = 0; i < d->space.chunks_high; i++)
      d->chunks[i].next_use = 0;
    d->pager.predicted_for = period;
  }
  uint64_t scan_start = psa_now_ns();
  /* Judged before this moment is noted, since counting needs it. */
  bool crowded = coming_margin(d, now, period) > d->fr.gpu_limit;
  struct survey sv;
  survey(d, now, period, crowded, &sv, fetch, victims);
  d->stats.scan_ns += psa_now_ns() - scan_start;
  if (sv.young_all > d->pager.margin) /* counted in host frames too: what did not fit counts */
    d->stats.margin_frames = d->pager.margin = sv.young_all;
  if (d->pager.margin > d->fr.gpu_limit)
    atomic_store(&d->mover.crowded, true);
  psp_phase_note(&d->pager.young, now, period, sv.young_all);
  uint64_t margin = coming_margin(d, now, period);
  margin = margin > sv.waiting ? margin - sv.waiting : 0;
  if (margin > d->fr.gpu_limit)
    margin = d->fr.gpu_limit;
  uint64_t keep = margin > sv.young_gpu ? margin - sv.young_gpu : 0, room = sv.room;
  size_t nf = sv.nfetch, nv = sv.nvictims;
  size_t v = 0, moves = 0;
  d->stats.plans++;
  d->stats.plans_no_fetch += nf == 0;
  for (; room < keep && v < nv && moves < most && d->pager.ncopying < most; v++)
    if (psa_movable(d, victims[v].chunk) && psa_move(d, victims[v].chunk, PSA_HOST) == CUDA_SUCCESS) {
      room++;
      moves++;
    }
  for (size_t i = 0; i < nf && moves < most; i++) {
    if (d->pager.ncopying + 2 > most) { /* the copies in flight are at their bound */
      d->stats.plans_copy_bound++;
      return;
    }
    uint64_t chunk = fetch[i].chunk, need = PSP_NEVER - fetch[i].next_use;
    if (!psa_movable(d, chunk))
      continue;
    if (d->fr.gpu_limit - d->fr.gpu_held > keep) { /* a frame free or makeable beyond it */
      moves += psa_move(d, chunk, PSA_GPU) == CUDA_SUCCESS;
      continue;
    }
    while (v < nv && !psa_movable(d, victims[v].chunk))
      v++;
    if (v == nv || victims[v].next_use <= need) { /* no chunk on the GPU is needed later */
      d->stats.plans_no_victim += v == nv;
      d->stats.plans_belady += v < nv;
      return;
    }
    if (!psp_swap_pays(psp_uses_within(d->uses[chunk].at, PSA_USES, now, period),
                       psp_uses_within(d->uses[victims[v].chunk].at, PSA_USES, now, period), use_ns(d),
                       d->pager.move_ns_mean)) {
      d->stats.plans_no_gain++;
      continue; /* a later fetch, used more often, may still pay */
    }
    psa_swap_in(d, chunk, victims[v++].chunk);
    moves++;
  }
}

/* Calls fn for every span that the launch's pointers fall in, once per span, with the
 * chunks of it the launch touches (chunk_ranges, ascending): each allocation's that a
 * pointer names by its start, or the whole span's where a pointer is not an allocation's
 * start. Holds each device's lock once per launch (pointers come sorted, so pointers of
 * one span, and of one device, are neighbours). When a pointer stood for its whole span,
 * at 4x over budget on the 2.68B GPT every GPU chunk sat in a span some launch had just
 * named (tensors of every lifetime share spans), half the plans found no victim, and a
 * step took 5.43 s; 2.42 s this way (bench/results/README.md). */
struct visit {
  const struct ps_moment *l;
  uint64_t period, position; /* as psa_on_moment got them */
  struct device *marked; /* the device `mark` belongs to */
  struct psa_mark *mark;
  struct psa_mark *ahead; /* exit: the mark PSSHIM_RUNAHEAD launches back on ahead_dev */
  struct device *ahead_dev;
};

#define VISIT_RANGES 16 /* a span's ranges kept apart per launch; more count as the whole span */

struct chunk_ranges {
  uint32_t n;
  bool whole; /* a pointer into the span that is not an allocation's start */
  struct {
    uint64_t first, end;
  } r[VISIT_RANGES];
};

/* Takes d->lock, counting the time a launch waited for it (the mover holds it to plan). */
static void lock_timed(struct device *d)
{
  if (!pthread_mutex_trylock(&d->lock))
    return;
  uint64_t start = psa_now_ns();
  pthread_mutex_lock(&d->lock);
  d->stats.lock_wait_ns += psa_now_ns() - start;
}

/* Adds the chunks pointer p of span s touches to cr. */
static void add_touched(struct device *d, struct span *s, CUdeviceptr p, struct chunk_ranges *cr)
{
  struct alloc_entry *e = cr->whole ? NULL : psa_map_find(d, p);
  if (!e || e->span != s) {
    cr->whole = true;
    return;
  }
  uint64_t first = (e->ptr - d->base) / d->chunk_size, end = (e->ptr + e->size - 1 - d->base) / d->chunk_size + 1;
  if (cr->n && first <= cr->r[cr->n - 1].end) {
    if (end > cr->r[cr->n - 1].end)
      cr->r[cr->n - 1].end = end;
  } else if (cr->n == VISIT_RANGES) {
    cr->whole = true;
  } else {
    cr->r[cr->n].first = first;
    cr->r[cr->n++].end = end;
  }
}

typedef void visit_fn(struct device *, struct span *, const struct chunk_ranges *, struct visit *);

static void visit_span(struct device *d, struct span *s, struct chunk_ranges *cr, visit_fn *fn, struct visit *v)
{
  if (cr->whole) {
    cr->n = 1;
    cr->r[0].first = s->first_chunk;
    cr->r[0].end = s->first_chunk + s->nchunks;
  }
  fn(d, s, cr, v);
}

static void for_each_span(struct visit *v, visit_fn *fn)
{
  struct device *locked = NULL;
  struct span *cur = NULL;
  struct chunk_ranges cr;
  const struct ps_moment *l = v->l;
  for (uint32_t k = 0; k < l->nptrs; k++) {
    int ordinal;
    int64_t chunk = psa_chunk_of(l->ptrs[k], &ordinal);
    if (chunk < 0)
      continue;
    struct device *d = &psa_devices[ordinal];
    if (d != locked) {
      if (cur)
        visit_span(locked, cur, &cr, fn, v);
      cur = NULL;
      if (locked) {
        mark_put(locked, locked == v->marked ? v->mark : NULL);
        pthread_mutex_unlock(&locked->lock);
      }
      lock_timed(d);
      locked = d;
    }
    struct span *s = d->chunks[chunk].span;
    if (!s)
      continue;
    if (s != cur) {
      if (cur)
        visit_span(d, cur, &cr, fn, v);
      cur = s;
      cr.n = 0;
      cr.whole = false;
    }
    add_touched(d, s, l->ptrs[k], &cr);
  }
  if (cur)
    visit_span(locked, cur, &cr, fn, v);
  if (locked) {
    mark_put(locked, locked == v->marked ? v->mark : NULL);
    pthread_mutex_unlock(&locked->lock);
  }
}

/* Drops d->lock while a move remaps the chunk (it waits: the move came late) and when it
 * makes a shared chunk private (psa_unshare). */
static void enter_chunk(struct device *d, uint64_t chunk, struct visit *v)
{
  struct chunk *c = &d->chunks[chunk];
  if (c->moving) {
    uint64_t start = psa_now_ns();
    d->stats.late_waits++;
    while (c->moving)
      pthread_cond_wait(&d->pager.moved, &d->lock);
    d->stats.late_wait_ns += psa_now_ns() - start;
  }
  if (c->frame == psa_shared_frame(d))
    psa_unshare(d, chunk); /* it may write: its own copy first */
  if (!psa_copy_done(d, chunk, false)) {
    /* The copy that put its data here is still running: this launch waits for it. */
    if (PS_CU(ps_driver.cuStreamWaitEvent((CUstream)(uintptr_t)v->l->stream, c->copy->event, 0)))
      psa_copy_done(d, chunk, true);
    else
      d->stats.copy_waits++;
  }
  if (on(d, c, PSA_HOST))
    d->stats.touches_host++;
  else
    d->stats.touches_gpu++;
  if (ps_options.policy == PS_POLICY_PLAN && v->period)
    psa_plan_note(d, chunk, v->period, v->position);
}

/* In flight first, so that the span stays while enter_chunk drops the lock (an idle span
 * may be deleted meanwhile, a span in flight is not); it may grow meanwhile, and chunks it
 * gains then hold nothing of this launch's. */
static void enter_span(struct device *d, struct span *s, const struct chunk_ranges *cr, struct visit *v)
{
  s->in_flight++;
  uint64_t use = v->l->seq + 1; /* +1: 0 means never */
  if (use > d->pager.clock)
    d->pager.clock = use;
  /* Every chunk on a GPU frame, none moving or copied to, none shared: nothing to check. */
  bool checked = s->where != PSA_GPU || d->pager.nmoving || d->pager.ncopying || d->shard ||
                 ps_options.policy == PS_POLICY_PLAN;
  for (uint32_t k = 0; k < cr->n; k++)
    for (uint64_t i = cr->r[k].first; i < cr->r[k].end; i++) {
      struct chunk *c = &d->chunks[i];
      if (c->last_use != use) {
        c->last_use = use;
        c->next_use = 0;
        d->uses[i].at[c->use_pos++ % PSA_USES] = use;
      }
      if (checked)
        enter_chunk(d, i, v);
      else
        d->stats.touches_gpu++;
    }
}

static void exit_span(struct device *d, struct span *s, const struct chunk_ranges *cr, struct visit *v)
{
  if (s->in_flight)
    s->in_flight--;
  if (v->l->failed || atomic_load(&paging_off))
    return; /* nothing enqueued, or nothing will move again: no mark needed */
  if (v->marked != d) {
    v->marked = d;
    v->mark = mark_new(d, (CUstream)(uintptr_t)v->l->stream);
    /* The first device a launch touches; every stride-th launch, whose hold stands for them all. */
    if (v->mark && d->pager.recent && !v->ahead_dev && d->pager.marked++ % psa_hold_stride(ps_options.runahead) == 0) {
      v->mark->refs++;
      v->ahead_dev = d;
      v->ahead = d->pager.recent[d->pager.recent_pos]; /* the ring's reference passes to the visit */
      d->pager.recent[d->pager.recent_pos] = v->mark;
      d->pager.recent_pos = (d->pager.recent_pos + 1) % psa_hold_slots(ps_options.runahead);
    }
  }
  if (!v->mark) /* no mark: wait for the launch here rather than lose track of it */
    PS_CU(ps_driver.cuStreamSynchronize((CUstream)(uintptr_t)v->l->stream));
  for (uint32_t k = 0; k < cr->n; k++)
    for (uint64_t i = cr->r[k].first; i < cr->r[k].end; i++)
      if (v->mark)
        add_user(d, &d->chunks[i], v->mark);
      else
        users_passed(d, &d->chunks[i], true);
}

/* fn(d, l) for every ready device, under its lock. */
static void each_device(void (*fn)(struct device *, const struct ps_moment *), const struct ps_moment *l)
{
  for (int i = 0; i < PSA_MAX_DEVICES; i++) {
    struct device *d = &psa_devices[i];
    if (!d->ready)
      continue;
    pthread_mutex_lock(&d->lock);
    fn(d, l);
    pthread_mutex_unlock(&d->lock);
  }
}

/* The launch's stream waits for every copy still in flight on the device, once no remap is
 * underway (none starts any more: paging is off). */
static void wait_copies(struct device *d, const struct ps_moment *l)
{
  while (d->pager.nmoving)
    pthread_cond_wait(&d->pager.moved, &d->lock);
  for (uint32_t k = 0; k < d->pager.ncopying;) {
    uint64_t chunk = d->pager.copying[k];
    struct psa_mark *copy = d->chunks[chunk].copy;
    if (!psa_copy_done(d, chunk, false) &&
        PS_CU(ps_driver.cuStreamWaitEvent((CUstream)(uintptr_t)l->stream, copy->event, 0)))
      psa_copy_done(d, chunk, true);
    if (k < d->pager.ncopying && d->pager.copying[k] == chunk)
      k++; /* else the slot now holds another chunk */
  }
}

/* Work whose accesses psshim cannot see (a CUDA graph, an array copy) may touch any chunk,
 * and so may work being captured into a graph, which runs later: paging stops for good,
 * said once. Nothing moves again, so only the copies already in flight matter: work that
 * runs now (stream not capturing) waits for them on its stream. */
static void stop_paging(const struct ps_moment *l, bool capturing)
{
  psa_shard_stop();
  if (!atomic_exchange(&paging_off, true))
    ps_log(PS_LOG_WARN, "%s: its memory accesses cannot be observed, so paging stops (placement stays as it is)",
           capturing ? "a stream is capturing a CUDA graph" : l->name ? l->name : "a CUDA graph launch");
  if (!capturing)
    each_device(wait_copies, l);
}

static _Thread_local bool tls_unbracketed; /* this thread's current moment is not bracketed */

#define RUNAHEAD_WAIT_NS 1000000000ull /* the longest the bound holds the host back */

/* Waits for a run-ahead mark, at most RUNAHEAD_WAIT_NS. The bound is only for speed, and
 * the work before the mark may itself wait for this thread (a host function that needs a
 * lock the launching thread holds, such as Python's GIL): then the host goes on. Polls
 * (cuEventSynchronize cannot give up). True when the work before the mark is over. */
static bool runahead_wait(CUevent e)
{
  const struct timespec nap = {0, 20000}; /* 20 us: short against the work of 256 launches */
  for (uint64_t start = psa_now_ns();;) {
    CUresult r = ps_driver.cuEventQuery(e);
    if (r != CUDA_ERROR_NOT_READY)
      return true; /* an error ends the wait too: the work is over, or failed (as in mark_passed) */
    if (psa_now_ns() - start > RUNAHEAD_WAIT_NS)
      return false;
    nanosleep(&nap, NULL);
  }
}

/* Holds the host to PSSHIM_RUNAHEAD launches ahead of mark `ahead` (the visit's reference,
 * dropped here). After a wait that gave up, the host is not held back again until the
 * mark it gave up on has passed: each later mark lies behind the same stuck work. Returns
 * the time it held the host. */
static uint64_t hold_back(struct device *d, struct psa_mark *ahead)
{
  pthread_mutex_lock(&d->lock);
  struct psa_mark *stuck = d->pager.runahead_stuck;
  if (stuck && mark_passed(d, stuck, false)) {
    mark_put(d, stuck);
    stuck = d->pager.runahead_stuck = NULL;
  }
  pthread_mutex_unlock(&d->lock);
  uint64_t start = psa_now_ns();
  bool passed = !stuck && runahead_wait(ahead->event); /* without the lock: the reference keeps the event */
  pthread_mutex_lock(&d->lock);
  uint64_t held = psa_now_ns() - start;
  d->stats.runahead_wait_ns += held;
  if (passed) {
    ahead->done = true;
  } else if (!stuck && !d->pager.runahead_stuck) {
    d->pager.runahead_stuck = ahead;
    ahead->refs++;
    d->stats.runahead_timeouts++;
  }
  mark_put(d, ahead);
  pthread_mutex_unlock(&d->lock);
  return held;
}

/* Chunks become movable on the scale of the run-ahead window: planning far more often
 * than that finds nothing new, and each plan scans every chunk. */
static uint64_t plan_every(void)
{
  unsigned every = ps_options.runahead / 16;
  return every < 1 ? 1 : every > 16 ? 16 : every;
}

/* A plan that moved nothing is likely to be followed by more: the next one waits twice as
 * long, up to the run-ahead window and one phase of the margin (1/PSP_PHASES of the
 * iteration), so room is still made in time and short iterations keep every plan. A move
 * brings plans back to every plan_every() launches. On the 2.68B GPT's trace replayed
 * here, that took plans from 3177 to 1098 and their time by half, moving as much. Backing
 * off further, to period/16, cut the plans' time at the native peak (64 plans an iteration,
 * where nothing moves), but the test driver's random programs then fetched about half as
 * many chunks (4-18 a run against 8-28; tests/gpu/variants/plan_gap_sixteenth.patch).
 * Frames left behind by moves are freed as often as plans were. */
static void poll_and_plan(struct device *d, uint64_t seq, uint64_t period)
{
  uint64_t every = plan_every();
  uint64_t start = psa_now_ns();
  d->pager.period = period;
  psa_moves_poll(d); /* frames whose copies are done come back as room */
  d->stats.poll_ns += psa_now_ns() - start;
  if (seq >= d->pager.next_plan) {
    uint64_t moves = d->stats.migrations_to_gpu + d->stats.migrations_to_host;
    plan(d, seq + 1, period);
    uint64_t most = period / PSP_PHASES;
    if (most > ps_options.runahead)
      most = ps_options.runahead;
    bool idle = moves == d->stats.migrations_to_gpu + d->stats.migrations_to_host;
    if (!idle || d->pager.plan_gap < every)
      d->pager.plan_gap = every;
    else
      d->pager.plan_gap = d->pager.plan_gap * 2 > most ? most : d->pager.plan_gap * 2;
    d->pager.next_plan = seq + d->pager.plan_gap;
  }
  d->stats.plan_ns += psa_now_ns() - start;
}

/* One turn of the pager, under d->lock: auto's plan, or (PSSHIM_POLICY=plan) policy/'s plan
 * once made (plan_exec.c), auto's decisions until then. */
static void pager_turn(struct device *d, uint64_t seq, uint64_t period, uint64_t position)
{
  if (ps_options.policy != PS_POLICY_PLAN) {
    poll_and_plan(d, seq, period);
    return;
  }
  uint64_t start = psa_now_ns();
  psa_moves_poll(d);
  if (!psa_plan_follow(d, period, position))
    poll_and_plan(d, seq, period);
  else
    d->stats.plan_ns += psa_now_ns() - start;
}

/* The mover: plans and moves off the launching threads, which only wake it (mover_wake).
 * Remaps serialize in the driver but do not slow another thread's launches
 * (../shared/DESIGN.md), so a launch no longer pays for a move, unless it needs the very
 * chunk being remapped (enter_chunk: a late wait). Its driver calls are psshim's own, and
 * relaxed so that they never break another thread's capture. */
static void *mover_main(void *arg)
{
  struct device *d = arg;
  bool ready = !PS_CU(ps_driver.cuCtxSetCurrent(d->ctx));
  tls_mover = true;
  if (ready) {
    psa_relax(true);
    ps_own_work(true);
    pthread_mutex_lock(&d->lock);
    d->stats.movers = 1;
    pthread_mutex_unlock(&d->lock);
  }
  pthread_mutex_lock(&d->mover.mutex);
  if (!ready) {
    d->mover.running = false;
    ps_log(PS_LOG_WARN, "the mover of device %d has no context: launching threads make the moves", d->ordinal);
  }
  while (ready) {
    while (!d->mover.due)
      pthread_cond_wait(&d->mover.wake, &d->mover.mutex);
    d->mover.due = false;
    uint64_t seq = d->mover.seq, period = d->mover.period, position = d->mover.position;
    uint64_t launch_ns = d->mover.launch_ns;
    pthread_mutex_unlock(&d->mover.mutex);
    pthread_mutex_lock(&d->lock);
    d->stats.launch_ns = launch_ns;
    if (!atomic_load(&paging_off))
      pager_turn(d, seq, period, position);
    pthread_mutex_unlock(&d->lock);
    pthread_mutex_lock(&d->mover.mutex);
  }
  pthread_mutex_unlock(&d->mover.mutex);
  return NULL;
}

static _Thread_local uint64_t tls_launch_ns; /* this thread's time in the pager not yet told to a mover */

/* Whether the device's turns go to a mover: with PSSHIM_MOVER=crowded, once a plan has
 * found the iteration's own allocations outgrowing the GPU (its largest margin above the
 * budget). On the H200 the mover made every such run faster (the 2.68B GPT at 3x and 4x
 * over budget by 7% and 14%, ResNet-50 and the demo GPT at half their peaks by 20% and 7%)
 * and every other one slower or no faster (1.25x-2x: 2-23% slower), all in one call each
 * (bench/results/README.md): where few moves are made the launching threads have time for
 * them, and remaps made beside kernels reading host frames in place cost many times more. */
static bool mover_wanted(struct device *d)
{
  return ps_options.mover == PS_MOVER_ON || (ps_options.mover == PS_MOVER_CROWDED && atomic_load(&d->mover.crowded));
}

/* Asks the device's mover for a turn as of this launch, starting it the first time it is
 * wanted; without one the turn is taken here. */
static void mover_wake(struct device *d, uint64_t seq, uint64_t period, uint64_t position)
{
  pthread_mutex_lock(&d->mover.mutex);
  d->mover.seq = seq;
  d->mover.period = period;
  d->mover.position = position;
  d->mover.launch_ns += tls_launch_ns;
  tls_launch_ns = 0;
  if (!d->mover.started && mover_wanted(d)) {
    d->mover.started = true;
    d->mover.running = !pthread_create(&d->mover.thread, NULL, mover_main, d);
    if (!d->mover.running)
      ps_log(PS_LOG_WARN, "no mover thread for device %d: launching threads make the moves", d->ordinal);
  }
  bool here = !d->mover.running;
  if (!here && !d->mover.due) {
    d->mover.due = true;
    pthread_cond_signal(&d->mover.wake);
  }
  uint64_t launch_ns = d->mover.launch_ns;
  pthread_mutex_unlock(&d->mover.mutex);
  if (here) {
    pthread_mutex_lock(&d->lock);
    d->stats.launch_ns = launch_ns;
    pager_turn(d, seq, period, position);
    pthread_mutex_unlock(&d->lock);
  }
}

void psa_on_moment(const struct ps_moment *l, bool enter, uint64_t period, uint64_t position)
{
  uint64_t start = psa_now_ns(), held_back = 0;
  struct psa_relaxed relaxed PSA_RELAXED_SCOPE = psa_relax(psa_capture_underway());
  if (enter) {
    /* Captured work runs later, when the graph replays; a failed query counts as captured:
     * psshim must not add events or waits it cannot account for. */
    bool capture = l->nptrs && psa_stream_capture((CUstream)(uintptr_t)l->stream) != 0;
    tls_unbracketed = l->opaque || capture;
    if (tls_unbracketed)
      stop_paging(l, capture);
  }
  if (tls_unbracketed)
    return;
  struct visit v = {.l = l, .period = period, .position = position};
  if (l->nptrs)
    for_each_span(&v, enter ? enter_span : exit_span);
  /* Flow control: the host stays at most PSSHIM_RUNAHEAD launches ahead of the GPU, so a
   * chunk is quiescent soon after its last use and can move before its next one. */
  if (v.ahead)
    held_back = hold_back(v.ahead_dev, v.ahead);
  if (ps_options.policy == PS_POLICY_STATIC || atomic_load(&paging_off))
    return;
  if (!enter && l->seq % plan_every() == 0)
    for (int i = 0; i < PSA_MAX_DEVICES; i++)
      if (psa_devices[i].ready)
        mover_wake(&psa_devices[i], l->seq, period, position);
  tls_launch_ns += psa_now_ns() - start - held_back; /* told at this thread's next wake */
}
