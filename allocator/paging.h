/* The allocator's third floor, paging (PSSHIM_POLICY=auto, plan): which chunks move and
 * when (pager.c, plan_exec.c), and the launches' bracketing, the run-ahead bound and the
 * mover thread that carry it out (mover.c). Above one move (move.h); private to allocator/. */
#ifndef PSSHIM_ALLOCATOR_PAGING_H
#define PSSHIM_ALLOCATOR_PAGING_H

#include "allocator/move.h"
#include "policy/policy.h"

/* Bytes one plan may start moving, and the bytes of copies in flight beyond which a plan
 * starts no move (a copy a launch would wait for, queued behind many others, stalls it).
 * In bytes, so smaller chunks move as fast; at least 8 chunks. */
#define PSA_PLAN_BYTES (512ull << 20)
/* The run-ahead bound is held at every psa_hold_stride()-th marked launch, a sixteenth of
 * the window (16 at the default 256): a query of the mark PSSHIM_RUNAHEAD launches back
 * costs about a microsecond, too much for every launch. */
static inline uint32_t psa_hold_stride(uint32_t runahead) { return runahead >= 32 ? runahead / 16 : 1; }
/* The ring of those launches' marks: its length, so that it spans the window. */
static inline uint32_t psa_hold_slots(uint32_t runahead) { return runahead / psa_hold_stride(runahead); }

/* A device's paging state (d->pager, made at set-up): d->lock, but for the mover's group. */
struct psa_pager {
  struct psa_mark **recent; /* marks of every psa_hold_stride()-th launch of the latest PSSHIM_RUNAHEAD, a ring */
  uint32_t recent_pos;
  uint64_t marked;          /* launches marked */
  struct psa_mark *runahead_stuck; /* a run-ahead wait gave up on it: no holding back until it passes */
  uint64_t margin;          /* most GPU frames spans allocated into within an iteration held */
  psp_phase_max young;      /* the frames they held, by phase of the iteration */
  uint64_t predicted_for;   /* the period the chunks' next_use were predicted with */
  uint64_t next_plan, plan_gap; /* plans back off while they move nothing */
  uint64_t period;          /* the trusted period as of the latest turn (0: none) */
  psp_cand *cands; /* scratch for the plans, two per chunk */
  _Atomic bool owner_due; /* a plan is made and its owner not yet started (plan_exec.c) */
  /* The mover (mover.c, PSSHIM_MOVER): the thread that plans and makes the moves, woken
   * by launches. Its own mutex, never held with d->lock, so a launch that wakes it never
   * waits for a plan. */
  struct {
    ps_mutex mutex;
    pthread_cond_t wake;
    pthread_t thread;
    _Atomic bool crowded;  /* a plan found the iteration's own allocations outgrowing the GPU */
    bool started, running; /* running: the thread takes the turns; else the launching threads do */
    bool due;             /* a launch asked for a plan since the last one began */
    uint64_t seq, period, position; /* the latest such launch's */
    uint64_t launch_ns;   /* the launching threads' time in the pager so far (stats.launch_ns) */
  } mover;
};

/* What this floor asks of the floor above (see struct psa_space_hooks). */
struct psa_paging_hooks {
  /* A launch touches a chunk on the shared frame: sharing makes it this rank's own first
   * (the launch may write it). Drops d->lock. */
  void (*unshare)(struct device *d, uint64_t chunk);
  /* Work psshim cannot see may touch any chunk: every shared chunk becomes private and no
   * chunk is shared again (called without locks). */
  void (*stop_sharing)(void);
};
extern struct psa_paging_hooks psa_paging_hooks;

/* mover.c: registers this floor's hooks in the floors below (before the first device is
 * set up: it sets up d->moves and d->pager). */
void psa_paging_wire(void);

/* pager.c (called with d->lock held; psa_frame_for and psa_room_frame drop it while they
 * take frames and move, and check again what they read before) */
/* A GPU frame taken for a chunk needed at moment `need`: one free or makeable beyond the
 * margin (what the coming part of the iteration's short-lived allocations will want), else
 * the frame of the model chunk on the GPU needed farthest after `need` (Belady), paged out
 * and waited for; PSA_NO_FRAME when none is needed later. Drops d->lock. */
uint32_t psa_frame_for(struct device *d, uint64_t period, uint64_t need);
/* A GPU frame for an allocation that finds none free, made by paging out the live chunks
 * on the GPU unused for longest, a batch at a time, waiting for the copy out, where room by
 * age is wanted (see pager.c); PSA_NO_FRAME when it is not, or none can move. Drops d->lock. */
uint32_t psa_room_frame(struct device *d);
/* Launches between the pager's turns. */
uint64_t psa_plan_every(void);
/* One turn of the pager as of launch `seq`: auto's plan, or (PSSHIM_POLICY=plan) policy/'s
 * plan once made (plan_exec.c), auto's decisions until then. */
void psa_pager_turn(struct device *d, uint64_t seq, uint64_t period, uint64_t position);

/* plan_exec.c (called with d->lock held; PSSHIM_POLICY=plan): a launch at `position` of a
 * `period`-moment iteration touched the chunk (recorded for the plan); and, every few
 * launches, the plan's moves that are due issued: false while there is no plan to follow.
 * psa_plan_follow drops d->lock (its moves do). */
void psa_plan_note(struct device *d, uint64_t chunk, uint64_t period, uint64_t position);
bool psa_plan_follow(struct device *d, uint64_t period, uint64_t position);

/* owner.c: the plan's owner thread, one per device (see owner.c). psa_owner_follow starts
 * it (or gives it a new plan) at absolute moment `first`, a moment's position in the
 * iteration being (moment - base) % period; psa_owner_stop ends its following; both under
 * d->lock. The schedule, plan and fixes stay the caller's, read under d->lock, until a stop. */
void psa_owners_setup(void);
void psa_owner_follow(struct device *d, const psp_schedule *sched, const psp_plan *plan, const psp_move *fixes,
                      size_t nfix, uint64_t first, uint64_t base, uint64_t period);
void psa_owner_stop(struct device *d);
/* The chunks of one device a launch names (up to PSA_DEMAND_MAX; more: none listed), and
 * how many of them lie in host frames. */
#define PSA_DEMAND_MAX 64
struct psa_launch_chunks {
  int ordinal;
  uint32_t n, nhost;
  uint64_t moment;
  uint64_t chunk[PSA_DEMAND_MAX];
};
/* A launch at an absolute moment: before it enters, it waits (holding no lock) until every
 * following owner has published the moment, and, where lc names chunks in host frames, until
 * the owner has fetched them; as it exits, it tells them. */
void psa_owner_gate(uint64_t moment, const struct psa_launch_chunks *lc);
void psa_owner_exited(uint64_t moment);
/* plan_exec.c: a plan made waits for a launch to tell the moment its owner starts at
 * (called with d->lock held, at a launch's exit, while the device's pager->owner_due). */
void psa_plan_own(struct device *d, uint64_t period, uint64_t position, uint64_t moment);

#endif
