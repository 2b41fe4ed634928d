/* The allocator's third floor, paging (PSSHIM_POLICY=auto): every observed launch bracketed,
 * and gated by the device's owner (launches.c); the trusted iteration recorded and its plan
 * made (plan_exec.c); the owner, one thread per device that runs the plan ahead of the
 * launches (owner.c); until there is a plan, room by age for allocations (room.c). Above one
 * move (move.h); private to allocator/. */
#ifndef PSSHIM_ALLOCATOR_PAGING_H
#define PSSHIM_ALLOCATOR_PAGING_H

#include "allocator/move.h"
#include "policy/policy.h"

/* A device's paging state (d->pager, made at set-up): d->lock. */
struct psa_pager {
  psp_cand *cands; /* room by age's scratch, one per chunk */
  _Atomic bool owner_due; /* a plan is made and its owner not yet started (plan_exec.c) */
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

/* launches.c: registers this floor's hooks in the floors below (before the first device is
 * set up: it sets up d->moves and d->pager). */
void psa_paging_wire(void);

/* room.c (d->lock held; drops it while it moves): a GPU frame for an allocation that finds
 * none free, made by paging out the live chunks on the GPU unused for longest, a batch at a
 * time, waiting for the copy out, where room by age is wanted (see room.c); PSA_NO_FRAME
 * when it is not, or none can move. */
uint32_t psa_room_frame(struct device *d);
/* A GPU frame, free or made free by paging out what lay unused longest, whatever the
 * policy wants (sharing's gathers at a round); PSA_NO_FRAME when none can move or host
 * frames are scarce. Drops d->lock. */
uint32_t psa_frame_by_age(struct device *d);

/* plan_exec.c (called with d->lock held): a launch at `position` of a `period`-moment
 * iteration touched the chunk: recorded for the plan, which is made when the recorded
 * iteration ends. */
void psa_plan_note(struct device *d, uint64_t chunk, uint64_t period, uint64_t position);

/* plan_exec.c: the recorded iteration's allocations recalled. A launch of a trusted period
 * entered at `position` (absolute `moment`), any thread: later allocations are known by it.
 * psa_plan_recall, before an allocation of size bytes is placed (d->lock held): where the
 * recorded iteration placed the same allocation, 0 when it did not or no plan is followed;
 * psa_plan_placed, after: where it went, and whether that was the recalled address. */
void psa_plan_entered(uint64_t position, uint64_t moment);
CUdeviceptr psa_plan_recall(struct device *d, uint64_t size);
void psa_plan_placed(struct device *d, CUdeviceptr ptr, uint64_t size, bool recalled);

/* owner.c: the plan's owner thread, one per device (see owner.c). psa_owner_follow starts
 * it (or gives it a new plan) at absolute moment `first`, a moment's position in the
 * iteration being (moment - base) % period; psa_owner_stop ends its following; both under
 * d->lock. The schedule, plan and fixes stay the caller's, read under d->lock, until a stop. */
void psa_owners_setup(void);
void psa_owner_follow(struct device *d, const psp_schedule *sched, const psp_plan *plan, const psp_move *fixes,
                      size_t nfix, uint64_t first, uint64_t base, uint64_t period);
void psa_owner_stop(struct device *d);
/* Whether any device's owner follows a plan (read without locks: launches ask it first). */
bool psa_owners_following(void);
/* Whether the device's owner follows a plan (d->lock held): it alone then places chunks. */
bool psa_owner_following(const struct device *d);
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
