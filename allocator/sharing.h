/* The allocator's fourth floor, sharing: chunks replicated on every rank of the node kept
 * once, in pieces, while no rank touches them (shard.c), the ranks' meetings (rounds.c), and
 * psshim's memory shared with other processes (ipc.c). Above paging (paging.h); private to
 * allocator/. */
#ifndef PSSHIM_ALLOCATOR_SHARING_H
#define PSSHIM_ALLOCATOR_SHARING_H

#include "allocator/paging.h"

/* shard.c (called with d->lock held, but for psa_shard_stop and psa_shard_round) */
/* Registers sharing's hooks in the floors below (before the first device is set up). */
void psa_sharing_wire(void);
/* Makes a shared chunk this rank's own before anything may touch it (a move: copy, remap):
 * paged in onto a GPU frame with its pieces kept when one can be had, else onto a host
 * frame; when no memory at all can be had for it, its addresses are left unmapped (the
 * touching work fails on this rank, the other ranks' data stays theirs) and sharing ends.
 * Drops d->lock (struct device). */
void psa_unshare(struct device *d, uint64_t chunk);
/* Whether the chunk is a shared one paged in (on a GPU frame of its own, pieces kept). */
bool psa_shard_paged_in(const struct device *d, uint64_t chunk);
/* A paged-in shared chunk leaves the GPU (quiescent): true when its bytes are the node's
 * copy's and it is mapped onto the pieces again, with no copy (the caller gives its GPU
 * frame back); else false, the pieces let go, and the chunk moves as any other. */
bool psa_shard_leave(struct device *d, uint64_t chunk);
/* A shared chunk's span is deleted, or a paged-in one's emptied: its pieces are unmapped
 * (if mapped) and let go. Drops d->lock while a gather reads the chunk (struct device). */
void psa_shard_drop(struct device *d, uint64_t chunk);
/* Work psshim cannot see may touch any chunk: every shared chunk becomes private and no
 * chunk is shared again (called without locks). */
void psa_shard_stop(void);
/* A sharing round at a meeting, when one is due. */
void psa_shard_round(uint64_t period);
/* The sharing checksum of n bytes at p, continuing h: page by page (PSA_SUM_PAGE bytes), each
 * page's hash a function of its bytes alone, mixed into h in order. So a test can change every
 * byte of a page one at a time, and every page of a chunk, in seconds rather than hours. */
#define PSA_SUM_PAGE 4096
uint64_t psa_shard_sum(uint64_t h, const unsigned char *p, uint64_t n);

/* rounds.c: the ranks meet for the boundaries met since the last meeting, in order, at an
 * allocation or a free (called without locks; waits for the other ranks,
 * PSSHIM_COMM_TIMEOUT_S at most). */
void psa_meet_ranks(void);

#endif
