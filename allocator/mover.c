/* Paging's execution: every observed launch bracketed, the host held to the run-ahead
 * bound, and the pager's turns taken, on the launching threads or on the mover.
 *
 * The protocol never makes a launch wait on the host for a copy (the host is held back only
 * by the run-ahead bound, PSSHIM_RUNAHEAD launches ahead of the GPU, so that chunks become
 * quiescent and one move, move.c, may take them):
 * - Every observed launch brackets the spans it names, and so all their chunks: between its
 *   enter and exit they are "in flight"; after it is enqueued, a mark (an event) recorded
 *   behind it on its stream is kept on each chunk it touched, one per stream.
 * - A launch that reaches a chunk while a move remaps it waits for the remap; one that
 *   touches it before its copy is seen complete makes its stream wait for the copy (a
 *   stream wait, not a host wait): kernels always find the data in place.
 * The launching threads take the pager's turns (pager.c) every few launches, or wake a
 * thread per device (the mover) that takes them: once the iteration's own allocations
 * outgrow the GPU (PSSHIM_MOVER=crowded, the default), or always (=1). Work psshim cannot
 * see (graph launches, array copies, graph capture) stops paging for good. */
#include "allocator/paging.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

struct psa_paging_hooks psa_paging_hooks;

static PS_THREAD_LOCAL bool tls_inplace; /* this thread's current moment read a host frame in place */

/* A device's paging state, made at its set-up. */
static bool pager_setup(struct device *d)
{
  if (!psa_moves_setup(d) || !(d->pager = calloc(1, sizeof *d->pager)))
    return false;
  d->pager->cands = calloc(2 * d->nchunks, sizeof *d->pager->cands); /* fetches, then victims */
  /* Under plan the owner bounds the host's run-ahead (owner.c): no hold. */
  if (ps_options.policy == PS_POLICY_AUTO)
    d->pager->recent = calloc(psa_hold_slots(ps_options.runahead), sizeof *d->pager->recent);
  ps_mutex_init(&d->pager->mover.mutex, PS_RANK_MOVER, "a device's mover wake-up lock");
  pthread_cond_init(&d->pager->mover.wake, NULL);
  return d->pager->cands && (ps_options.policy != PS_POLICY_AUTO || d->pager->recent);
}

void psa_paging_wire(void)
{
  psa_owners_setup();
  psa_space_hooks.setup = pager_setup;
  psa_space_hooks.gpu_room = psa_room_frame;
}

/* Calls fn for every span that the launch's pointers fall in, once per span, with the
 * chunks of it the launch touches (chunk_ranges, ascending): each allocation's that a
 * pointer names by its start, or the whole span's where a pointer is not an allocation's
 * start. Holds each device's lock once per launch (pointers come sorted, so pointers of
 * one span, and of one device, are neighbours). When a pointer stood for its whole span,
 * far over budget nearly every GPU chunk sat in a span some launch had just named (tensors
 * of every lifetime share spans), half the plans found no victim, and steps took twice as
 * long. */
struct visit {
  const struct ps_moment *l;
  uint64_t period, position; /* as psa_on_moment got them */
  struct device *marked; /* the device `mark` belongs to */
  struct psa_mark *mark;
  struct psa_mark *ahead; /* exit: the mark PSSHIM_RUNAHEAD launches back on ahead_dev */
  struct device *ahead_dev;
  struct psa_launch_chunks *named; /* before the gate: the chunks of its first device */
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
  if (!ps_mutex_trylock(&d->lock))
    return;
  uint64_t start = psa_now_ns();
  ps_mutex_lock(&d->lock);
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
        psa_mark_put(locked, locked == v->marked ? v->mark : NULL);
        ps_mutex_unlock(&locked->lock);
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
    psa_mark_put(locked, locked == v->marked ? v->mark : NULL);
    ps_mutex_unlock(&locked->lock);
  }
}

/* Drops d->lock while a move remaps the chunk (it waits: the move came late) and when it
 * makes a shared chunk private (psa_paging_hooks.unshare). */
static void enter_chunk(struct device *d, uint64_t chunk, struct visit *v)
{
  PSA_HELD(d);
  struct chunk *c = &d->chunks[chunk];
  if (c->moving) {
    uint64_t start = psa_now_ns();
    d->stats.late_waits++;
    while (c->moving)
      ps_cond_wait(&d->moves->moved, &d->lock);
    d->stats.late_wait_ns += psa_now_ns() - start;
  }
  if (c->frame == psa_shared_frame(d) && psa_paging_hooks.unshare)
    psa_paging_hooks.unshare(d, chunk); /* it may write: its own copy first */
  if (!psa_copy_done(d, chunk, false)) {
    /* The copy that put its data here is still running: this launch waits for it. */
    if (PS_CU(ps_driver.cuStreamWaitEvent((CUstream)(uintptr_t)v->l->stream, c->copy->event, 0)))
      psa_copy_done(d, chunk, true);
    else
      d->stats.copy_waits++;
  }
  if (psa_chunk_on(d, c, PSA_HOST)) {
    d->stats.touches_host++;
    tls_inplace = true;
  }
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
  if (use > d->space.clock)
    d->space.clock = use;
  /* Every chunk on a GPU frame, none moving or copied to, none shared: nothing to check. */
  bool checked = s->where != PSA_GPU || d->moves->nmoving || d->marks.ncopying || d->shard ||
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
  if (v->l->failed || atomic_load(&psa_moves_off))
    return; /* nothing enqueued, or nothing will move again: no mark needed */
  if (v->marked != d) {
    v->marked = d;
    v->mark = psa_mark_new(d, (CUstream)(uintptr_t)v->l->stream);
    /* The first device a launch touches; every stride-th launch, whose hold stands for them all. */
    if (v->mark && d->pager->recent && !v->ahead_dev && d->pager->marked++ % psa_hold_stride(ps_options.runahead) == 0) {
      v->mark->refs++;
      v->ahead_dev = d;
      v->ahead = d->pager->recent[d->pager->recent_pos]; /* the ring's reference passes to the visit */
      d->pager->recent[d->pager->recent_pos] = v->mark;
      d->pager->recent_pos = (d->pager->recent_pos + 1) % psa_hold_slots(ps_options.runahead);
    }
  }
  if (tls_inplace && v->mark && d->marks.inplace != v->mark) {
    psa_mark_put(d, d->marks.inplace);
    d->marks.inplace = v->mark;
    v->mark->refs++;
  }
  if (!v->mark) /* no mark: wait for the launch here rather than lose track of it */
    PS_CU(ps_driver.cuStreamSynchronize((CUstream)(uintptr_t)v->l->stream));
  for (uint32_t k = 0; k < cr->n; k++)
    for (uint64_t i = cr->r[k].first; i < cr->r[k].end; i++)
      if (v->mark)
        psa_add_user(d, &d->chunks[i], v->mark);
      else
        psa_users_passed(d, &d->chunks[i], true);
}

/* The chunks the launch names on the first device it touches (too many: none), and which
 * lie in host frames, for the owner (owner.c). */
static void name_chunks(struct device *d, struct span *s, const struct chunk_ranges *cr, struct visit *v)
{
  (void)s;
  struct psa_launch_chunks *lc = v->named;
  if (lc->n == 0 && lc->ordinal < 0)
    lc->ordinal = d->ordinal;
  if (lc->ordinal != d->ordinal || lc->n > PSA_DEMAND_MAX)
    return;
  for (uint32_t k = 0; k < cr->n; k++)
    for (uint64_t i = cr->r[k].first; i < cr->r[k].end; i++) {
      if (lc->n == PSA_DEMAND_MAX) {
        lc->n = PSA_DEMAND_MAX + 1; /* too many to keep: asks for none */
        lc->nhost = 0;
        return;
      }
      lc->chunk[lc->n++] = i;
      lc->nhost += psa_chunk_on(d, &d->chunks[i], PSA_HOST) && d->chunks[i].frame != psa_shared_frame(d);
    }
}

/* fn(d, l) for every ready device, under its lock. */
static void each_device(void (*fn)(struct device *, const struct ps_moment *), const struct ps_moment *l)
{
  for (int i = 0; i < PSA_MAX_DEVICES; i++) {
    struct device *d = &psa_devices[i];
    if (!d->ready)
      continue;
    ps_mutex_lock(&d->lock);
    fn(d, l);
    ps_mutex_unlock(&d->lock);
  }
}

/* The launch's stream waits for every copy still in flight on the device, once no remap is
 * underway (none starts any more: paging is off). */
static void wait_copies(struct device *d, const struct ps_moment *l)
{
  while (d->moves->nmoving)
    ps_cond_wait(&d->moves->moved, &d->lock);
  for (uint32_t k = 0; k < d->marks.ncopying;) {
    uint64_t chunk = d->marks.copying[k];
    struct psa_mark *copy = d->chunks[chunk].copy;
    if (!psa_copy_done(d, chunk, false) &&
        PS_CU(ps_driver.cuStreamWaitEvent((CUstream)(uintptr_t)l->stream, copy->event, 0)))
      psa_copy_done(d, chunk, true);
    if (k < d->marks.ncopying && d->marks.copying[k] == chunk)
      k++; /* else the slot now holds another chunk */
  }
}

/* Work whose accesses psshim cannot see (a CUDA graph, an array copy) may touch any chunk,
 * and so may work being captured into a graph, which runs later: paging stops for good,
 * said once. Nothing moves again, so only the copies already in flight matter: work that
 * runs now (stream not capturing) waits for them on its stream. */
static void stop_paging(const struct ps_moment *l, bool capturing)
{
  if (psa_paging_hooks.stop_sharing)
    psa_paging_hooks.stop_sharing();
  if (!atomic_exchange(&psa_moves_off, true))
    ps_log(PS_LOG_WARN, "%s: its memory accesses cannot be observed, so paging stops (placement stays as it is)",
           capturing ? "a stream is capturing a CUDA graph" : l->name ? l->name : "a CUDA graph launch");
  if (!capturing)
    each_device(wait_copies, l);
}

static PS_THREAD_LOCAL bool tls_unbracketed; /* this thread's current moment is not bracketed */

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
      return true; /* an error ends the wait too: the work is over, or failed (as in psa_mark_passed) */
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
  ps_mutex_lock(&d->lock);
  struct psa_mark *stuck = d->pager->runahead_stuck;
  if (stuck && psa_mark_passed(d, stuck, false)) {
    psa_mark_put(d, stuck);
    stuck = d->pager->runahead_stuck = NULL;
  }
  ps_mutex_unlock(&d->lock);
  uint64_t start = psa_now_ns();
  bool passed = !stuck && runahead_wait(ahead->event); /* without the lock: the reference keeps the event */
  ps_mutex_lock(&d->lock);
  uint64_t held = psa_now_ns() - start;
  d->stats.runahead_wait_ns += held;
  if (passed) {
    ahead->done = true;
  } else if (!stuck && !d->pager->runahead_stuck) {
    d->pager->runahead_stuck = ahead;
    ahead->refs++;
    d->stats.runahead_timeouts++;
  }
  psa_mark_put(d, ahead);
  ps_mutex_unlock(&d->lock);
  return held;
}

/* The mover: plans and moves off the launching threads, which only wake it (mover_wake).
 * Remaps serialize in the driver but do not slow another thread's launches, so a launch
 * no longer pays for a move, unless it needs the very
 * chunk being remapped (enter_chunk: a late wait). Its driver calls are psshim's own, and
 * relaxed so that they never break another thread's capture. */
static void *mover_main(void *arg)
{
  struct device *d = arg;
  bool ready = !PS_CU(ps_driver.cuCtxSetCurrent(d->ctx));
  psa_moves_settle = true;
  if (ready) {
    psa_relax(true);
    ps_own_work(true);
    ps_mutex_lock(&d->lock);
    d->stats.movers = 1;
    ps_mutex_unlock(&d->lock);
  }
  ps_mutex_lock(&d->pager->mover.mutex);
  if (!ready) {
    d->pager->mover.running = false;
    ps_log(PS_LOG_WARN, "the mover of device %d has no context: launching threads make the moves", d->ordinal);
  }
  while (ready) {
    while (!d->pager->mover.due)
      ps_cond_wait(&d->pager->mover.wake, &d->pager->mover.mutex);
    d->pager->mover.due = false;
    uint64_t seq = d->pager->mover.seq, period = d->pager->mover.period, position = d->pager->mover.position;
    uint64_t launch_ns = d->pager->mover.launch_ns;
    ps_mutex_unlock(&d->pager->mover.mutex);
    ps_mutex_lock(&d->lock);
    d->stats.launch_ns = launch_ns;
    if (!atomic_load(&psa_moves_off))
      psa_pager_turn(d, seq, period, position);
    ps_mutex_unlock(&d->lock);
    ps_mutex_lock(&d->pager->mover.mutex);
  }
  ps_mutex_unlock(&d->pager->mover.mutex);
  return NULL;
}

static PS_THREAD_LOCAL uint64_t tls_launch_ns; /* this thread's time in the pager not yet told to a mover */

/* Whether the device's turns go to a mover: with PSSHIM_MOVER=crowded, once a plan has
 * found the iteration's own allocations outgrowing the GPU (its largest margin above the
 * budget). The mover measured faster on every such run and slower or no faster on every
 * other one: where few moves are made the launching threads have time for them, and
 * remaps made beside kernels reading host frames in place cost many times more. */
static bool mover_wanted(struct device *d)
{
  return ps_options.mover == PS_MOVER_ON || (ps_options.mover == PS_MOVER_CROWDED && atomic_load(&d->pager->mover.crowded));
}

/* Asks the device's mover for a turn as of this launch, starting it the first time it is
 * wanted; without one the turn is taken here. */
static void mover_wake(struct device *d, uint64_t seq, uint64_t period, uint64_t position)
{
  ps_mutex_lock(&d->pager->mover.mutex);
  d->pager->mover.seq = seq;
  d->pager->mover.period = period;
  d->pager->mover.position = position;
  d->pager->mover.launch_ns += tls_launch_ns;
  tls_launch_ns = 0;
  if (!d->pager->mover.started && mover_wanted(d)) {
    d->pager->mover.started = true;
    d->pager->mover.running = !pthread_create(&d->pager->mover.thread, NULL, mover_main, d);
    if (!d->pager->mover.running)
      ps_log(PS_LOG_WARN, "no mover thread for device %d: launching threads make the moves", d->ordinal);
  }
  bool here = !d->pager->mover.running;
  if (!here && !d->pager->mover.due) {
    d->pager->mover.due = true;
    pthread_cond_signal(&d->pager->mover.wake);
  }
  uint64_t launch_ns = d->pager->mover.launch_ns;
  ps_mutex_unlock(&d->pager->mover.mutex);
  if (here) {
    ps_mutex_lock(&d->lock);
    d->stats.launch_ns = launch_ns;
    psa_pager_turn(d, seq, period, position);
    ps_mutex_unlock(&d->lock);
  }
}

/* The devices whose plan is made tell their owner the moment it starts at (plan_exec.c). */
static void start_owners(uint64_t period, uint64_t position, uint64_t moment)
{
  for (int i = 0; i < PSA_MAX_DEVICES; i++) {
    struct device *d = &psa_devices[i];
    if (!d->ready || !atomic_load(&d->pager->owner_due))
      continue;
    ps_mutex_lock(&d->lock);
    psa_plan_own(d, period, position, moment);
    ps_mutex_unlock(&d->lock);
  }
}

void psa_on_moment(const struct ps_moment *l, bool enter, uint64_t period, uint64_t position, uint64_t moment)
{
  uint64_t start = psa_now_ns(), held_back = 0;
  struct psa_relaxed relaxed PSA_RELAXED_SCOPE = psa_relax(psa_capture_underway());
  if (enter) {
    /* Captured work runs later, when the graph replays; a failed query counts as captured:
     * psshim must not add events or waits it cannot account for. */
    bool capture = l->nptrs && psa_stream_capture((CUstream)(uintptr_t)l->stream) != 0;
    tls_unbracketed = l->opaque || capture;
    tls_inplace = false;
    if (tls_unbracketed)
      stop_paging(l, capture);
  }
  if (tls_unbracketed)
    return;
  bool planned = ps_options.policy == PS_POLICY_PLAN && period;
  struct visit v = {.l = l, .period = period, .position = position};
  if (enter && planned) {
    /* What the plan fetches for it is on the GPU first, and what it names in host frames
     * besides is fetched for it (owner.c). */
    struct psa_launch_chunks named = {.ordinal = -1};
    v.named = &named;
    if (l->nptrs)
      for_each_span(&v, name_chunks);
    psa_owner_gate(moment, named.n <= PSA_DEMAND_MAX ? &named : NULL);
  }
  if (l->nptrs)
    for_each_span(&v, enter ? enter_span : exit_span);
  if (!enter && planned) {
    psa_owner_exited(moment);
    start_owners(period, position, moment);
  }
  /* Flow control: the host stays at most PSSHIM_RUNAHEAD launches ahead of the GPU, so a
   * chunk is quiescent soon after its last use and can move before its next one. */
  if (v.ahead)
    held_back = hold_back(v.ahead_dev, v.ahead);
  if (ps_options.policy == PS_POLICY_STATIC || atomic_load(&psa_moves_off))
    return;
  if (!enter && l->seq % psa_plan_every() == 0)
    for (int i = 0; i < PSA_MAX_DEVICES; i++)
      if (psa_devices[i].ready)
        mover_wake(&psa_devices[i], l->seq, period, position);
  tls_launch_ns += psa_now_ns() - start - held_back; /* told at this thread's next wake */
}
