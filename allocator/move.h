/* The allocator's second floor, one move (move.c): a quiescent chunk's remap onto another
 * frame and the copy of its live bytes, on the device's copy streams. Above the chunk space
 * (space.h); private to allocator/. */
#ifndef PSSHIM_ALLOCATOR_MOVE_H
#define PSSHIM_ALLOCATOR_MOVE_H

#include "allocator/space.h"

/* A frame that becomes free once the copy out of it has completed. */
struct deferred_frame {
  uint32_t frame;
  struct psa_mark *copy;
};

/* A device's moves (d->moves, made at set-up by psa_moves_setup): d->lock. */
struct psa_moves {
  CUstream copy_in, copy_out; /* made at the first move */
  struct deferred_frame deferred[PSA_MAX_MIGRATIONS];
  uint32_t ndeferred;
  uint32_t nmoving;       /* chunks `moving` */
  pthread_cond_t moved;   /* on d->lock: a chunk stopped REMAPPING */
  uint64_t move_ns_mean;  /* a move's time (remap, queue the copy) on the thread that makes it */
};

/* What this floor asks of the floors above (see struct psa_space_hooks). */
struct psa_move_hooks {
  /* A paged-in shared chunk leaves the GPU: true when sharing mapped it back onto its
   * pieces with no copy (the move's GPU frame is then free); false, it moves as any other. */
  bool (*shared_leave)(struct device *d, uint64_t chunk);
};
extern struct psa_move_hooks psa_move_hooks;

/* Set once work psshim cannot see may touch any chunk: no move starts again. */
extern _Atomic bool psa_moves_off;
/* The calling thread is an owner (owner.c): before a remap it lets the copies in flight
 * drain to a few (move.c). */
extern PS_THREAD_LOCAL bool psa_moves_settle;

/* Calls below with d->lock held; psa_move and psa_swap_in drop it while they take frames,
 * and check again what they read before. */
bool psa_moves_setup(struct device *d); /* d->moves; false when out of memory */
/* Moves a chunk no launch is using onto a frame of `to` (see move.c); NOT_READY when it is
 * busy or too many copies are in flight, OUT_OF_MEMORY without a frame. Drops d->lock. */
CUresult psa_move(struct device *d, uint64_t chunk, enum psa_where to);
/* Whether a move of the chunk may start now: mapped, its own, no launch in flight, every
 * launch that touched it passed, its last move's copy done, its span not being built. */
bool psa_movable(struct device *d, uint64_t chunk);
/* Swaps a host chunk in for a GPU victim, both quiescent: the victim moves to a new host
 * frame, and the chunk onto the victim's GPU frame once the victim's copy out of it is
 * done (ordered on the copy streams, no host wait). False when nothing moved, or the chunk
 * could not follow the victim out (then the victim's move stands). Drops d->lock. */
bool psa_swap_in(struct device *d, uint64_t chunk, uint64_t victim);
/* Frees what completed copies held: marks, and frames moved away from. */
void psa_moves_poll(struct device *d);

#endif
