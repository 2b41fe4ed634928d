/* The owner: one thread per device that runs the plan's moves ahead of the launches, once
 * plan_exec.c has made the plan. For each moment of the iteration in
 * order it makes the moves the plan issues before that moment, then publishes the moment;
 * a launch, before it enters, waits until its moment is published. So the chunks the plan
 * fetched for a launch are on GPU frames when it is enqueued (its stream waits for their
 * copies, as for any move's), and the host runs ahead of the GPU only as far as frames
 * allow: nothing the plan moves is read in place.
 *
 * A moment's moves wait, on this thread, for the launches before it to have left their
 * marks (they are published already, so they go on) and then for the GPU to pass the marks
 * on the chunks to move (a remap never races a kernel: move.c takes only quiet chunks).
 * A fetch without a free GPU frame takes an eviction's frame (psa_swap_in: the fetch's copy
 * waits for the write-back on the copy streams, not on the host). The owner waits only for
 * launches already published, and a launching thread waits for the owner holding no lock:
 * no wait cycle. Correctness never rests on it: a launch whose wait gives up (GATE_NS: work
 * queued ahead may itself wait on the launching thread, such as a host function that needs
 * Python's GIL) goes on and reads in place what is not on the GPU. */
#include "allocator/paging.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RING 4096                 /* launches tracked above the oldest not yet exited */
#define GATE_NS 1000000000ull     /* the longest a launch waits for its moment */
#define STRAGGLER_NS 100000000ull /* the longest the owner waits for a launch to leave its marks */

struct psa_owner {
  ps_mutex lock;
  pthread_cond_t published_cv; /* launches wait on it */
  pthread_cond_t progress_cv;  /* the owner waits on it: exits, a plan, the end */
  pthread_t thread;
  bool started, stopping;
  /* Following a plan: from moment `first` (launches before it go freely), published below
   * `published`; every launch below exited_low has exited (exited[m % RING] = m + 1 above). */
  _Atomic bool running; /* read without the lock by launches that find no owner */
  uint64_t generation; /* a new plan or a stop: the thread drops what it was doing */
  uint64_t first, published, exited_low;
  uint64_t gave_up_at; /* a launch's wait gave up with `published` here (+1; 0: none) */
  uint64_t exited[RING];
  /* The plan and its schedule, d->lock's: a moment's position is (m - base) % period. */
  const psp_schedule *sched;
  const psp_plan *plan;
  const psp_move *fixes;
  size_t nfix, next; /* next: the plan's first move not run in this lap */
  uint64_t moves_at;  /* a moment found to have moves, not yet run (UINT64_MAX: none) */
  uint64_t base, period;
  uint32_t *victims; /* evictions due and not yet made, oldest first */
  size_t nvictims, cap;
  /* A launch that names chunks in host frames (the plan did not foresee it, or its chunks
   * lie elsewhere than recorded) asks for them, one launch at a time: the owner fetches
   * them before anything else, the launch waiting (o->lock). */
  bool asked;
  struct psa_launch_chunks demand;
};

static struct psa_owner owners[PSA_MAX_DEVICES];

static void owner_init_once(struct psa_owner *o)
{
  ps_mutex_init(&o->lock, PS_RANK_OWNER, "a device's owner lock");
  pthread_cond_init(&o->published_cv, NULL);
  pthread_cond_init(&o->progress_cv, NULL);
}

/* Waits on the condition for at most ns (its clock is the realtime one: the bound is
 * approximate). */
static void timed_wait(pthread_cond_t *cv, ps_mutex *mx, uint64_t ns)
{
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  uint64_t at = (uint64_t)t.tv_nsec + ns;
  t.tv_sec += (time_t)(at / 1000000000ull);
  t.tv_nsec = (long)(at % 1000000000ull);
  ps_cond_timedwait(cv, mx, &t);
}

/* Waits, with d->lock dropped meanwhile, until the chunk may move: every launch that touched
 * it and its last move's copy have passed. False when it cannot (in flight, being remapped
 * or built, not mapped, shared or exported, or the plan is gone). */
static bool quiet(struct device *d, struct psa_owner *o, uint64_t chunk, uint64_t generation)
{
  PSA_HELD(d);
  for (int tries = 0; tries < PSA_USER_MARKS + 2; tries++) {
    struct chunk *c = &d->chunks[chunk];
    if (o->generation != generation || !c->span || c->frame == PSA_NO_FRAME || c->frame == psa_shared_frame(d) ||
        c->span->exported || c->span->building)
      return false;
    if (psa_movable(d, chunk))
      return true;
    if (c->move == PSA_REMAPPING || c->span->in_flight)
      return false; /* an ungated launch, or another move: not this moment's to wait for */
    struct psa_mark *m = c->move == PSA_COPYING && !c->copy->done ? c->copy : c->nusers ? c->users[0] : NULL;
    if (!m)
      return false;
    uint64_t start = psa_now_ns();
    psa_mark_wait_unlocked(d, m);
    d->stats.owner_wait_ns += psa_now_ns() - start;
  }
  return false;
}

static void want_victim(struct psa_owner *o, uint32_t chunk)
{
  if (o->nvictims == o->cap) {
    size_t cap = o->cap ? 2 * o->cap : 64;
    uint32_t *v = realloc(o->victims, cap * sizeof *v);
    if (!v)
      return; /* the eviction is left out: a fetch that needs a frame picks its own victim */
    o->victims = v;
    o->cap = cap;
  }
  o->victims[o->nvictims++] = chunk;
}

static bool on(const struct device *d, uint64_t chunk, enum psa_where w)
{
  return chunk < d->nchunks && psa_chunk_on(d, &d->chunks[chunk], w) && d->chunks[chunk].frame != psa_shared_frame(d);
}

/* The oldest due eviction still on a GPU frame, taken off the list; UINT64_MAX if none. */
static uint64_t take_victim(struct device *d, struct psa_owner *o)
{
  while (o->nvictims) {
    uint32_t v = o->victims[0];
    memmove(o->victims, o->victims + 1, --o->nvictims * sizeof *o->victims);
    if (on(d, v, PSA_GPU))
      return v;
  }
  return UINT64_MAX;
}

/* A victim the plan did not name, for a fetch that finds no frame (an allocation took the
 * one the plan freed, say): of the chunks on GPU frames that moment `at` does not use, the
 * one the schedule uses farthest ahead, a quiet one first (Belady, on demand). */
static bool named(const struct psa_launch_chunks *lc, uint64_t chunk)
{
  for (uint32_t k = 0; lc && k < lc->n; k++)
    if (lc->chunk[k] == chunk)
      return true;
  return false;
}

static uint64_t any_victim(struct device *d, struct psa_owner *o, uint64_t at, uint64_t chunk,
                           const struct psa_launch_chunks *keep)
{
  uint64_t best = UINT64_MAX, best_next = 0;
  bool best_quiet = false;
  uint32_t known = o->sched ? psp_schedule_chunks(o->sched) : 0;
  for (uint64_t i = 0; i < d->space.chunks_high; i++) {
    const struct chunk *c = &d->chunks[i];
    if (i == chunk || !c->span || !on(d, i, PSA_GPU) || c->span->exported || named(keep, i))
      continue;
    uint64_t next = i < known ? psp_next_use(o->sched, (uint32_t)i, at + o->period - 1) : PSP_NEVER;
    if (next == at + o->period)
      continue; /* the moment's own */
    bool q = psa_movable(d, i);
    if (best == UINT64_MAX || (q && !best_quiet) || (q == best_quiet && next > best_next))
      best = i, best_next = next, best_quiet = q;
  }
  return best;
}

/* A fetch: onto a free GPU frame, or onto a due eviction's (swapped), or on demand onto
 * another victim's, never one of `keep`'s. A chunk not allocated yet, or shared with the
 * node's ranks, needs no copy, only a frame free when its allocation comes or its touch
 * pages it in (shard.c): the eviction is made and its write-back waited for, and the frame
 * is promised (*promised: the moment's frames so kept free; two chunks of one allocation
 * need two). The allocation may come while the lock is dropped: each try sees what is. */
static void fetch(struct device *d, struct psa_owner *o, uint64_t at, uint64_t chunk,
                  const struct psa_launch_chunks *keep, uint64_t generation, uint64_t *promised)
{
  if (chunk >= d->nchunks)
    return;
  struct chunk *c = &d->chunks[chunk];
  /* The chunk quiet first: the wait drops the lock, and a free frame may be gone after
   * it. Each wait for a victim drops it too: a frame may come free meanwhile (its chunk
   * freed), the victim may be gone, or the chunk busy again (its span growing); then the
   * next try sees what is. */
  for (int tries = 0; tries < 4 && o->generation == generation; tries++) {
    if (on(d, chunk, PSA_GPU)) {
      d->stats.owner_moot += tries == 0;
      return;
    }
    bool copy = c->span && c->frame != psa_shared_frame(d);
    if (copy && !quiet(d, o, chunk, generation))
      break;
    if (psa_gpu_frames_free(d) > *promised) {
      if (copy && psa_move(d, chunk, PSA_GPU) != CUDA_SUCCESS)
        break;
      d->stats.owner_fetches += copy;
      *promised += !copy; /* its allocation or touch takes the free frame */
      return;
    }
    uint64_t v = keep ? UINT64_MAX : take_victim(d, o);
    if (v == UINT64_MAX && (v = any_victim(d, o, at, chunk, keep)) != UINT64_MAX)
      d->stats.owner_unplanned_victims++;
    if (v == UINT64_MAX)
      break;
    if (!quiet(d, o, v, generation) || !on(d, v, PSA_GPU) || (copy && !psa_movable(d, chunk)))
      continue;
    if (copy && on(d, chunk, PSA_HOST) && psa_swap_in(d, chunk, v)) {
      d->stats.owner_fetches++;
      d->stats.owner_evictions++;
      return;
    }
    /* No swap (or no copy needed): the victim out alone, its write-back waited for, so that
     * its frame is free for the chunk, its allocation or its touch. */
    if (on(d, v, PSA_GPU) && psa_move(d, v, PSA_HOST) != CUDA_SUCCESS)
      continue;
    d->stats.owner_evictions += !on(d, v, PSA_GPU);
    struct psa_mark *out = d->chunks[v].copy;
    if (out && !out->done)
      psa_mark_wait_unlocked(d, out);
    psa_moves_poll(d);
  }
  d->stats.owner_missed++;
}

/* Runs the plan's moves issued before moment m (absolute), d->lock held. */
static void run_moves(struct device *d, struct psa_owner *o, uint64_t m, uint64_t generation)
{
  uint64_t at = (m - o->base) % o->period, in = d->stats.bytes_h2d, out = d->stats.bytes_d2h, promised = 0;
  if (at == 0) {
    for (size_t i = 0; i < o->nfix && o->generation == generation; i++) {
      const psp_move *f = &o->fixes[i];
      if (f->dir == PSP_TO_HOST && on(d, f->chunk, PSA_GPU))
        want_victim(o, f->chunk);
      else if (f->dir == PSP_TO_GPU)
        fetch(d, o, at, f->chunk, NULL, generation, &promised);
    }
  }
  for (; o->generation == generation && o->next < o->plan->n_moves && o->plan->moves[o->next].at == at; o->next++) {
    const psp_move *mv = &o->plan->moves[o->next];
    if (mv->dir == PSP_TO_HOST)
      want_victim(o, mv->chunk);
    else
      fetch(d, o, at, mv->chunk, NULL, generation, &promised);
  }
  psa_moves_poll(d);
  d->stats.plan_moved_in += d->stats.bytes_h2d - in;
  d->stats.plan_moved_out += d->stats.bytes_d2h - out;
}

/* Whether the plan issues any move before moment m: the owner then waits for the launches
 * before it; a moment without moves is published at once. A new lap starts the plan's moves
 * over. d->lock held. */
static bool has_moves(struct device *d, struct psa_owner *o, uint64_t m)
{
  uint64_t at = (m - o->base) % o->period;
  if (at == 0) {
    o->next = 0;
    d->stats.plan_laps++;
    if (o->nfix)
      return true;
  }
  while (o->next < o->plan->n_moves && o->plan->moves[o->next].at < at)
    o->next++; /* moments the owner started past */
  return o->next < o->plan->n_moves && o->plan->moves[o->next].at == at;
}

/* Serves the launch that asked (o->lock held on entry and on return, dropped meanwhile):
 * its chunks in host frames (shared ones too) fetched, its other chunks kept. */
static void serve(struct device *d, struct psa_owner *o)
{
  struct psa_launch_chunks lc = o->demand;
  uint64_t generation = o->generation;
  ps_mutex_unlock(&o->lock);
  ps_mutex_lock(&d->lock);
  uint64_t at = (lc.moment - o->base) % o->period, promised = 0;
  for (uint32_t k = 0; k < lc.n && o->generation == generation; k++)
    if (psa_chunk_on(d, &d->chunks[lc.chunk[k]], PSA_HOST)) {
      uint64_t fetched = d->stats.owner_fetches;
      fetch(d, o, at, lc.chunk[k], &lc, generation, &promised);
      d->stats.owner_demand_fetches += d->stats.owner_fetches - fetched;
    }
  ps_mutex_unlock(&d->lock);
  ps_mutex_lock(&o->lock);
  o->asked = false;
  pthread_cond_broadcast(&o->published_cv);
}

/* Waits (no device lock held) until every launch before moment m has exited, so that each
 * left its marks; false after STRAGGLER_NS (a launch stuck before its driver call) or when
 * the plan changed. */
static bool launches_before(struct device *d, struct psa_owner *o, uint64_t m, uint64_t generation,
                            uint64_t *waited)
{
  uint64_t start = psa_now_ns();
  ps_mutex_lock(&o->lock);
  while (o->exited_low < m && o->generation == generation && !o->stopping && psa_now_ns() - start < STRAGGLER_NS) {
    if (o->asked) /* a launch before m waits for its chunks: served first */
      serve(d, o);
    else
      timed_wait(&o->progress_cv, &o->lock, STRAGGLER_NS);
  }
  bool ok = o->exited_low >= m && o->generation == generation && !o->stopping;
  ps_mutex_unlock(&o->lock);
  *waited += psa_now_ns() - start;
  return ok;
}

static void *owner_main(void *arg)
{
  struct device *d = arg;
  struct psa_owner *o = &owners[d->ordinal];
  if (PS_CU(ps_driver.cuCtxSetCurrent(d->ctx)))
    return NULL;
  psa_relax(true);    /* for good: its driver calls must not break another thread's capture */
  ps_own_work(true);  /* its copies are not the program's moments */
  psa_moves_settle = true;
  ps_mutex_lock(&o->lock);
  for (;;) {
    while (!o->stopping && !o->asked && (!o->running || o->published >= o->exited_low + RING - 1))
      ps_cond_wait(&o->progress_cv, &o->lock);
    if (o->stopping)
      break;
    if (o->asked) {
      serve(d, o);
      continue;
    }
    uint64_t m = o->published, generation = o->generation, waited = 0, limit = o->exited_low + RING - 1;
    ps_mutex_unlock(&o->lock);
    /* The moments up to the next with moves are published at once, together: launches
     * then seldom wait for this thread where nothing moves. */
    ps_mutex_lock(&d->lock);
    uint64_t end = m;
    bool moves = o->moves_at == m;
    while (!moves && o->plan && o->generation == generation && end < limit && !(moves = has_moves(d, o, end)))
      end++;
    o->moves_at = moves ? end : UINT64_MAX;
    ps_mutex_unlock(&d->lock);
    if (end > m) {
      ps_mutex_lock(&o->lock);
      if (o->generation == generation && o->published == m) {
        o->published = end;
        pthread_cond_broadcast(&o->published_cv);
      }
      continue;
    }
    if (moves && launches_before(d, o, m, generation, &waited)) {
      ps_mutex_lock(&d->lock);
      if (o->plan && o->generation == generation)
        run_moves(d, o, m, generation);
      d->stats.owner_wait_ns += waited;
      ps_mutex_unlock(&d->lock);
    }
    ps_mutex_lock(&o->lock);
    if (o->generation == generation && o->published == m) {
      o->published = m + 1;
      pthread_cond_broadcast(&o->published_cv);
    }
  }
  ps_mutex_unlock(&o->lock);
  return NULL;
}

void psa_owner_follow(struct device *d, const psp_schedule *sched, const psp_plan *plan, const psp_move *fixes,
                      size_t nfix, uint64_t first, uint64_t base, uint64_t period)
{
  PSA_HELD(d);
  struct psa_owner *o = &owners[d->ordinal];
  ps_mutex_lock(&o->lock);
  if (!o->started) {
    o->started = true;
    if (pthread_create(&o->thread, NULL, owner_main, d)) {
      ps_log(PS_LOG_WARN, "no owner thread for device %d: the plan is not followed", d->ordinal);
      ps_mutex_unlock(&o->lock);
      return;
    }
  }
  o->sched = sched;
  o->plan = plan;
  o->fixes = fixes;
  o->nfix = nfix;
  o->next = 0;
  o->moves_at = UINT64_MAX;
  o->nvictims = 0;
  o->base = base;
  o->period = period;
  o->generation++;
  o->first = o->published = o->exited_low = first;
  o->gave_up_at = 0;
  atomic_store(&o->running, true);
  d->stats.owners = 1;
  pthread_cond_broadcast(&o->progress_cv);
  ps_mutex_unlock(&o->lock);
}

void psa_owner_stop(struct device *d)
{
  PSA_HELD(d);
  struct psa_owner *o = &owners[d->ordinal];
  ps_mutex_lock(&o->lock);
  o->plan = NULL;
  atomic_store(&o->running, false);
  o->generation++;
  pthread_cond_broadcast(&o->published_cv);
  pthread_cond_broadcast(&o->progress_cv);
  ps_mutex_unlock(&o->lock);
}

/* Waits on the owner's published_cv until done(); whether it is. It is not when the owner
 * stops following, after GATE_NS from start (*gave_up), or at once where a wait gave up
 * since the owner last published: each later launch lies behind the same stuck work.
 * *waited (the time since start) is set only by a wait, so that a launch that found its
 * moment published takes no device lock to count one. */
static bool gate_wait(struct psa_owner *o, bool (*done)(const struct psa_owner *, uint64_t), uint64_t moment,
                      uint64_t start, uint64_t *waited, bool *gave_up)
{
  bool slept = false, ok;
  while (!(ok = done(o, moment)) && atomic_load(&o->running) && o->gave_up_at != o->published + 1) {
    if ((*waited = psa_now_ns() - start) >= GATE_NS) {
      o->gave_up_at = o->published + 1;
      *gave_up = true;
      break;
    }
    timed_wait(&o->published_cv, &o->lock, GATE_NS - *waited);
    slept = true;
  }
  if (slept)
    *waited = psa_now_ns() - start;
  return ok;
}

static bool published(const struct psa_owner *o, uint64_t moment)
{
  return moment < o->first || moment < o->published;
}

static bool unasked(const struct psa_owner *o, uint64_t moment)
{
  (void)moment;
  return !o->asked;
}

void psa_owner_gate(uint64_t moment, const struct psa_launch_chunks *lc)
{
  ps_lock_check_none("a launch waiting for its moment");
  for (int i = 0; i < PSA_MAX_DEVICES; i++) {
    struct psa_owner *o = &owners[i];
    if (!atomic_load(&o->running))
      continue;
    uint64_t start = psa_now_ns(), waited = 0;
    bool gave_up = false;
    ps_mutex_lock(&o->lock);
    /* Its chunks in host frames, asked for once the plan's moves before it are made. */
    if (gate_wait(o, published, moment, start, &waited, &gave_up) && lc && lc->ordinal == i && lc->nhost &&
        moment >= o->first && gate_wait(o, unasked, moment, start, &waited, &gave_up)) {
      o->demand = *lc;
      o->demand.moment = moment;
      o->asked = true;
      pthread_cond_signal(&o->progress_cv);
      gate_wait(o, unasked, moment, start, &waited, &gave_up);
    }
    ps_mutex_unlock(&o->lock);
    if (waited) {
      struct device *d = &psa_devices[i];
      ps_mutex_lock(&d->lock);
      d->stats.gate_wait_ns += waited;
      d->stats.gate_timeouts += gave_up;
      ps_mutex_unlock(&d->lock);
    }
  }
}

void psa_owner_exited(uint64_t moment)
{
  for (int i = 0; i < PSA_MAX_DEVICES; i++) {
    struct psa_owner *o = &owners[i];
    if (!atomic_load(&o->running))
      continue;
    ps_mutex_lock(&o->lock);
    if (moment >= o->exited_low && moment < o->exited_low + RING) {
      o->exited[moment % RING] = moment + 1;
      uint64_t low = o->exited_low;
      while (o->exited[o->exited_low % RING] == o->exited_low + 1)
        o->exited_low++;
      if (o->exited_low != low)
        pthread_cond_signal(&o->progress_cv);
    }
    ps_mutex_unlock(&o->lock);
  }
}

bool psa_owners_following(void)
{
  for (int i = 0; i < PSA_MAX_DEVICES; i++)
    if (atomic_load_explicit(&owners[i].running, memory_order_relaxed))
      return true;
  return false;
}

bool psa_owner_following(const struct device *d)
{
  return atomic_load(&owners[d->ordinal].running);
}

void psa_owners_setup(void)
{
  for (int i = 0; i < PSA_MAX_DEVICES; i++)
    owner_init_once(&owners[i]);
}
