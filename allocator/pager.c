/* Paging's decisions (PSSHIM_POLICY=auto, and plan until policy/'s plan is made): which
 * chunks move, and when. Nothing moves until the iteration's period is known; then room is
 * kept for the iteration's short-lived allocations (the margin), and chunks in host frames
 * that will be used soonest are fetched into free GPU frames or into the frames of GPU
 * chunks used later (OPT on predicted next uses), where the uses saved outweigh the moves'
 * measured cost. An allocation that finds no GPU frame may have one made by paging out what
 * lay unused longest (room by age). Correctness never depends on any of it: the moves are
 * one move's (move.c), made under its quiescence rule. The turns are taken by the launching
 * threads or by the mover (mover.c). */
#include "allocator/paging.h"
#include "comm/comm.h"

#include <stdatomic.h>

#define MARGIN_LOOKAHEAD 8 /* room is made for the margin 1/8 of an iteration ahead */

/* Moves per plan, and copies in flight a plan may add to (see PSA_PLAN_BYTES). */
static uint32_t plan_moves(const struct device *d)
{
  uint64_t n = PSA_PLAN_BYTES / d->chunk_size;
  return n < 8 ? 8 : n > PSA_MAX_MIGRATIONS / 2 ? PSA_MAX_MIGRATIONS / 2 : (uint32_t)n;
}

/* What a use of a chunk left in a host frame costs: a kernel reads (and writes back) it in
 * place at PSSHIM_INPLACE_RATE. Moves cost what the launching thread measurably spends on
 * them (d->moves->move_ns_mean); see psp_fetch_pays. */
static uint64_t use_ns(const struct device *d)
{
  return (uint64_t)((double)d->chunk_size * 1e9 / (double)ps_options.inplace_rate);
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

/* What a plan needs of the chunks, in one pass over them (over a large model's chunks,
 * three passes took most of a plan's time):
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
    bool gpu = psa_chunk_on(d, c, PSA_GPU), live = sp->live_allocs, yng = live && young(sp, now, period);
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
          psp_fetch_pays(psp_uses_within(d->uses[i].at, PSA_USES, now, period), use_ns(d), d->moves->move_ns_mean))
        fetch[s->nfetch++] = (psp_cand){.chunk = (uint32_t)i, .bytes = d->chunk_size, .dirty = true,
                                        .next_use = PSP_NEVER - next};
    }
  }
  for (uint32_t i = 0; i < d->moves->ndeferred; i++)
    s->room += d->fr.frames[d->moves->deferred[i].frame].where == PSA_GPU;
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
 * iteration: the most they held in that part last time. More than the GPU has (a large
 * model far over budget) makes that part crowded: those that wait are paged as model
 * data is. PatrickStar's margin assumes they fit. */
static uint64_t coming_margin(const struct device *d, uint64_t now, uint64_t period)
{
  return psp_phase_ahead(&d->pager->young, now, period / MARGIN_LOOKAHEAD);
}

uint32_t psa_frame_for(struct device *d, uint64_t period, uint64_t need)
{
  PSA_HELD(d);
  uint64_t margin = coming_margin(d, d->space.clock, period);
  if (d->fr.gpu_held + margin < d->fr.gpu_limit)
    return psa_frame_take(d, PSA_GPU);
  psp_cand *victims = d->pager->cands + d->nchunks;
  struct survey sv;
  survey(d, d->space.clock, period, margin > d->fr.gpu_limit, &sv, NULL, victims);
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
 *   in host frames (far over budget, the first steps then run many times slower than the
 *   steady ones, reading their operands across PCIe in place), room by age stands in for
 *   the pager. Where few touches find host frames, static placement stands: it costs
 *   nothing then.
 * - Once trusted, where the coming part of the iteration is crowded (its own allocations
 *   outgrow the GPU), the margin's page-outs ahead of time cannot make room for them all,
 *   and what they leave out lands in host frames: there room by age goes on (it measured
 *   faster there). */
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

/* Whether an allocation that finds no GPU frame free should have one made (frame_by_age)
 * rather than be placed in host frames: before the period is trusted where kernels find
 * more than a tenth of their chunks in host frames, after it where the coming part of the
 * iteration is crowded. */
static bool room_by_age(const struct device *d)
{
  if (ps_options.policy != PS_POLICY_AUTO || atomic_load(&psa_moves_off) || psa_capture_underway() ||
      !host_frames_ample(d))
    return false;
  if (d->pager->period)
    return coming_margin(d, d->space.clock, d->pager->period) > d->fr.gpu_limit;
  return d->stats.touches_host * ROOM_CROWDED_SHARE > d->stats.touches_host + d->stats.touches_gpu;
}

/* Pages out up to a batch of the live chunks on the GPU unused for longest; how many. */
static uint32_t page_out_oldest(struct device *d)
{
  psp_cand *oldest = d->pager->cands + d->nchunks;
  size_t n = 0, batch = ROOM_BATCH_BYTES / d->chunk_size;
  if (batch > d->fr.gpu_limit / 16)
    batch = d->fr.gpu_limit / 16;
  if (!batch)
    batch = 1;
  uint64_t now = d->space.clock;
  for (uint64_t i = 0; i < d->space.chunks_high; i++) {
    struct chunk *c = &d->chunks[i];
    if (c->frame == PSA_NO_FRAME || !psa_chunk_on(d, c, PSA_GPU) || !c->span->live_allocs || !settled(c, now))
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

static uint32_t frame_by_age(struct device *d)
{
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

/* Counted apart (room_ns): these moves are made on the allocating threads whoever takes the
 * pager's turns, outside the launching threads' time in the pager (launch_ns). */
uint32_t psa_room_frame(struct device *d)
{
  PSA_HELD(d);
  if (!room_by_age(d))
    return PSA_NO_FRAME;
  uint64_t start = psa_now_ns();
  uint32_t f = frame_by_age(d);
  d->stats.room_ns += psa_now_ns() - start;
  return f;
}

/* Nothing moves until the iteration's period is known: without it nothing tells the
 * iteration's short-lived allocations from model data. (Filling free frames with recently
 * used host chunks meanwhile made auto's first steps several times slower than static
 * placement's; the cause was not isolated.) Then: first room on
 * the GPU for the iteration's short-lived allocations of the coming part of the iteration
 * (PatrickStar's margin: the most frames they held in that part last time, less those
 * that wait beyond it, up to the whole budget, less what the others hold on the GPU now),
 * made by paging out what is needed farthest ahead, model data or young chunks that wait,
 * so the activations in use do not land in host frames (far over budget the young alone
 * outgrow the GPU). Then the host chunks needed soonest go into free
 * GPU frames beyond the margin, or into the frames of GPU chunks needed later than they
 * are (Belady), where the move pays. */
static void plan(struct device *d, uint64_t now, uint64_t period)
{
  if (!period)
    return;
  psp_cand *fetch = d->pager->cands, *victims = d->pager->cands + d->nchunks;
  uint32_t most = plan_moves(d);
  if (period != d->pager->predicted_for) { /* predictions made with another period are void */
    for (uint64_t i = 0; i < d->space.chunks_high; i++)
      d->chunks[i].next_use = 0;
    d->pager->predicted_for = period;
  }
  uint64_t scan_start = psa_now_ns();
  /* Judged before this moment is noted, since counting needs it. */
  bool crowded = coming_margin(d, now, period) > d->fr.gpu_limit;
  struct survey sv;
  survey(d, now, period, crowded, &sv, fetch, victims);
  d->stats.scan_ns += psa_now_ns() - scan_start;
  if (sv.young_all > d->pager->margin) /* counted in host frames too: what did not fit counts */
    d->stats.margin_frames = d->pager->margin = sv.young_all;
  if (d->pager->margin > d->fr.gpu_limit)
    atomic_store(&d->pager->mover.crowded, true);
  psp_phase_note(&d->pager->young, now, period, sv.young_all);
  uint64_t margin = coming_margin(d, now, period);
  margin = margin > sv.waiting ? margin - sv.waiting : 0;
  if (margin > d->fr.gpu_limit)
    margin = d->fr.gpu_limit;
  uint64_t keep = margin > sv.young_gpu ? margin - sv.young_gpu : 0, room = sv.room;
  size_t nf = sv.nfetch, nv = sv.nvictims;
  size_t v = 0, moves = 0;
  d->stats.plans++;
  d->stats.plans_no_fetch += nf == 0;
  for (; room < keep && v < nv && moves < most && d->marks.ncopying < most; v++)
    if (psa_movable(d, victims[v].chunk) && psa_move(d, victims[v].chunk, PSA_HOST) == CUDA_SUCCESS) {
      room++;
      moves++;
    }
  for (size_t i = 0; i < nf && moves < most; i++) {
    if (d->marks.ncopying + 2 > most) { /* the copies in flight are at their bound */
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
                       d->moves->move_ns_mean)) {
      d->stats.plans_no_gain++;
      continue; /* a later fetch, used more often, may still pay */
    }
    psa_swap_in(d, chunk, victims[v++].chunk);
    moves++;
  }
}

/* Chunks become movable on the scale of the run-ahead window: planning far more often
 * than that finds nothing new, and each plan scans every chunk. */
uint64_t psa_plan_every(void)
{
  unsigned every = ps_options.runahead / 16;
  return every < 1 ? 1 : every > 16 ? 16 : every;
}

/* A plan that moved nothing is likely to be followed by more: the next one waits twice as
 * long, up to the run-ahead window and one phase of the margin (1/PSP_PHASES of the
 * iteration), so room is still made in time and short iterations keep every plan. A move
 * brings plans back to every psa_plan_every() launches. On a large model's trace replayed
 * here, that cut the plans to a third and their time by half, moving as much. Backing off
 * further, to period/16, cut the plans' time where everything fits (where nothing moves),
 * but the test driver's random programs then fetched about half as
 * many chunks (4-18 a run against 8-28).
 * Frames left behind by moves are freed as often as plans were. */
static void poll_and_plan(struct device *d, uint64_t seq, uint64_t period)
{
  uint64_t every = psa_plan_every();
  uint64_t start = psa_now_ns();
  d->pager->period = period;
  psa_moves_poll(d); /* frames whose copies are done come back as room */
  d->stats.poll_ns += psa_now_ns() - start;
  if (seq >= d->pager->next_plan) {
    uint64_t moves = d->stats.migrations_to_gpu + d->stats.migrations_to_host;
    plan(d, seq + 1, period);
    uint64_t most = period / PSP_PHASES;
    if (most > ps_options.runahead)
      most = ps_options.runahead;
    bool idle = moves == d->stats.migrations_to_gpu + d->stats.migrations_to_host;
    if (!idle || d->pager->plan_gap < every)
      d->pager->plan_gap = every;
    else
      d->pager->plan_gap = d->pager->plan_gap * 2 > most ? most : d->pager->plan_gap * 2;
    d->pager->next_plan = seq + d->pager->plan_gap;
  }
  d->stats.plan_ns += psa_now_ns() - start;
}

void psa_pager_turn(struct device *d, uint64_t seq, uint64_t period, uint64_t position)
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
