/* Paging's execution at each launch: every observed launch bracketed, and gated by the
 * devices' owners (owner.c).
 * - Every observed launch brackets the spans it names, and so all their chunks: between its
 *   enter and exit they are "in flight"; after it is enqueued, a mark (an event) recorded
 *   behind it on its stream is kept on each chunk it touched, one per stream. A chunk moves
 *   only once every such mark has passed (move.c): no remap races a kernel.
 * - Once an owner follows a plan, a launch waits before it enters until its moment is
 *   published, so what the plan fetched for it is on GPU frames, and asks the owner for the
 *   chunks it names that still lie in host frames (the host runs ahead only as far as the
 *   frames allow).
 * - A launch that reaches a chunk while a move remaps it waits for the remap; one that
 *   touches it before its copy is seen complete makes its stream wait for the copy (a
 *   stream wait, not a host wait): kernels always find the data in place.
 * Work psshim cannot see (graph launches, array copies, graph capture) stops paging for
 * good. */
#include "allocator/paging.h"

#include <stdatomic.h>
#include <stdlib.h>

struct psa_paging_hooks psa_paging_hooks;

static PS_THREAD_LOCAL bool tls_inplace; /* this thread's current moment read a host frame in place */
static PS_THREAD_LOCAL bool tls_unbracketed; /* this thread's current moment is not bracketed */
static PS_THREAD_LOCAL uint64_t tls_launch_ns; /* this thread's time in the pager not yet counted */

/* A device's paging state, made at its set-up. */
static bool pager_setup(struct device *d)
{
  if (!psa_moves_setup(d) || !(d->pager = calloc(1, sizeof *d->pager)))
    return false;
  d->pager->cands = calloc(d->nchunks, sizeof *d->pager->cands);
  return d->pager->cands != NULL;
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

/* Takes d->lock, counting the time a launch waited for it (an owner holds it to move). */
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
  if (c->move == PSA_REMAPPING) {
    uint64_t start = psa_now_ns();
    d->stats.late_waits++;
    while (c->move == PSA_REMAPPING)
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
  if (v->period)
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
  /* Every chunk on a GPU frame, none moving or copied to, none shared, no plan to record:
   * nothing to check. */
  bool checked = s->where != PSA_GPU || d->moves->nmoving || d->marks.ncopying || d->shard || v->period;
  for (uint32_t k = 0; k < cr->n; k++)
    for (uint64_t i = cr->r[k].first; i < cr->r[k].end; i++) {
      struct chunk *c = &d->chunks[i];
      c->last_use = use;
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
  d->stats.launch_ns += tls_launch_ns; /* counted here, where the lock is held anyway */
  tls_launch_ns = 0;
  if (v->l->failed || atomic_load(&psa_moves_off))
    return; /* nothing enqueued, or nothing will move again: no mark needed */
  if (v->marked != d) {
    v->marked = d;
    v->mark = psa_mark_new(d, (CUstream)(uintptr_t)v->l->stream);
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
      lc->nhost += psa_chunk_on(d, &d->chunks[i], PSA_HOST); /* shared ones too: a page-in wants a free frame */
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

static void stop_owner(struct device *d, const struct ps_moment *l)
{
  (void)l;
  psa_owner_stop(d);
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
  each_device(stop_owner, l);
  if (!capturing)
    each_device(wait_copies, l);
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
  uint64_t start = psa_now_ns();
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
  if (enter && period)
    psa_plan_entered(position, moment);
  bool owned = psa_owners_following();
  struct visit v = {.l = l, .period = period, .position = position};
  if (enter && owned) {
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
  if (!enter) {
    if (owned)
      psa_owner_exited(moment);
    if (period)
      start_owners(period, position, moment);
  }
  tls_launch_ns += psa_now_ns() - start;
}
