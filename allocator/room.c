/* Room by age (PSSHIM_POLICY=auto, until a plan is followed): an allocation that finds no
 * GPU frame takes the frame of the live chunk unused for longest instead of a host frame:
 * what a kernel writes now is read again soon, what lay unused longest is read in place at
 * most once or twice before it is needed. Before the plan nothing tells the iteration's
 * short-lived allocations from model data, and nothing else moves. Where that leaves
 * kernels reading their operands in host frames (far over budget, the first steps then ran
 * many times slower than the steady ones), room by age stands in for the pager. Where few
 * touches find host frames, static placement stands: it costs nothing then. Once an owner
 * follows a plan it alone places chunks (owner.c). Correctness never depends on any of it:
 * the page-outs are one move's (move.c), made under its quiescence rule. */
#include "allocator/paging.h"
#include "comm/comm.h"

#include <stdatomic.h>

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

/* Whether an allocation that finds no GPU frame free should have one made (psa_frame_by_age)
 * rather than be placed in host frames: where kernels find more than a tenth of their
 * chunks in host frames, and no owner places chunks. */
static bool room_by_age(const struct device *d)
{
  if (ps_options.policy != PS_POLICY_AUTO || atomic_load(&psa_moves_off) || psa_capture_underway() ||
      psa_owner_following(d) || !host_frames_ample(d))
    return false;
  return d->stats.touches_host * ROOM_CROWDED_SHARE > d->stats.touches_host + d->stats.touches_gpu;
}

/* Pages out up to a batch of the live chunks on the GPU unused for longest; how many. The
 * oldest are asked first whether their launches have run (psa_movable; a query costs about
 * a microsecond), so few queries find work still queued. */
static uint32_t page_out_oldest(struct device *d)
{
  psp_cand *oldest = d->pager->cands;
  size_t n = 0, batch = ROOM_BATCH_BYTES / d->chunk_size;
  if (batch > d->fr.gpu_limit / 16)
    batch = d->fr.gpu_limit / 16;
  if (!batch)
    batch = 1;
  uint64_t now = d->space.clock;
  for (uint64_t i = 0; i < d->space.chunks_high; i++) {
    struct chunk *c = &d->chunks[i];
    if (c->frame == PSA_NO_FRAME || !psa_chunk_on(d, c, PSA_GPU) || !c->span->live_allocs || c->span->in_flight ||
        c->move != PSA_SETTLED || !c->last_use)
      continue;
    oldest[n++] = (psp_cand){.chunk = (uint32_t)i, .bytes = d->chunk_size, .dirty = true, .next_use = now - c->last_use};
  }
  psp_sort_farthest(oldest, n, batch);
  uint32_t moved = 0;
  for (size_t k = 0; k < n && moved < batch; k++)
    if (psa_movable(d, oldest[k].chunk) && psa_move(d, oldest[k].chunk, PSA_HOST) == CUDA_SUCCESS)
      moved++;
  d->stats.room_page_outs += moved;
  return moved;
}

uint32_t psa_frame_by_age(struct device *d)
{
  PSA_HELD(d);
  for (;;) {
    psa_moves_poll(d);
    uint32_t f = psa_frame_take(d, PSA_GPU);
    if (f != PSA_NO_FRAME)
      return f;
    /* A GPU frame that a page-out's copy still reads comes back once the copy is done. */
    struct psa_mark *leaving = NULL;
    for (uint32_t i = 0; i < d->moves->ndeferred && !leaving; i++)
      if (d->fr.frames[d->moves->deferred[i].frame].where == PSA_GPU)
        leaving = d->moves->deferred[i].copy;
    if (leaving) {
      uint64_t start = psa_now_ns();
      psa_mark_wait_unlocked(d, leaving); /* an error shows at the next poll, which waits it out */
      d->stats.room_wait_ns += psa_now_ns() - start;
    } else if (!host_frames_ample(d) || !page_out_oldest(d))
      return PSA_NO_FRAME;
  }
}

/* Counted apart (room_ns): these moves are made on the allocating threads. */
uint32_t psa_room_frame(struct device *d)
{
  PSA_HELD(d);
  if (!room_by_age(d))
    return PSA_NO_FRAME;
  uint64_t start = psa_now_ns();
  uint32_t f = psa_frame_by_age(d);
  d->stats.room_ns += psa_now_ns() - start;
  return f;
}
