/* A group of processes that share one mapping: each member's identity and a count of the
 * barriers it has reached. Every wait is bounded by a timeout and ends early when a
 * lagging member's process is gone or another member gave up, so no member ever hangs on
 * a dead peer. Used by comm/ (node segment) and by the fake NCCL in tests/fakenccl/. */
#ifndef PSSHIM_COMM_SHM_GROUP_H
#define PSSHIM_COMM_SHM_GROUP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "comm/proc.h"

#define PSG_MAX_MEMBERS 64

/* One cache line each: members spin on each other's seq. */
struct psg_member {
  _Atomic int32_t pid;    /* 0 until claimed */
  _Atomic uint64_t start; /* see struct psc_proc */
  _Atomic uint64_t seq;   /* barriers this member has reached */
  _Atomic uint32_t left;  /* left the group, or gave up (psg_fail): its exit is no death */
} __attribute__((aligned(64)));

enum psg_result {
  PSG_OK = 0,
  PSG_TIMEOUT, /* `who` had not arrived in time */
  PSG_DEAD,    /* `who` (pid `pid`) is gone */
  PSG_GAVE_UP, /* `who` stopped waiting (see struct psg_failure) or aborted */
  PSG_LEFT,    /* `who` left the group without reaching this barrier */
};

struct psg_failure {
  enum psg_result kind;
  int who;     /* member index */
  int32_t pid; /* its pid when known, else 0 */
};

struct psg_group {
  /* The first failure any member saw, so the others report the cause, not the echo. */
  _Atomic uint32_t failed;
  int32_t failed_by;
  struct psg_failure failure;
  int32_t n;
  struct psg_member m[PSG_MAX_MEMBERS];
};

/* By the creator, on zeroed memory, before anyone else looks. */
void psg_init(struct psg_group *g, int n);
/* Takes member slot `self` for this process. False if another process holds it; *holder
 * then says which pid and whether it still lives. */
bool psg_claim(struct psg_group *g, int self, int32_t *holder, bool *holder_alive);
/* Arrives at this member's next barrier and waits for every member to reach it, for at
 * most timeout_s seconds. On failure records it in the group (so the others stop
 * waiting at once) and describes it in *f. */
enum psg_result psg_barrier(struct psg_group *g, int self, double timeout_s,
                            struct psg_failure *f);
/* Records a failure seen by `self` (an abort, an error from below) so the others stop; the
 * first recorded is kept. `self` counts as left from then on. */
void psg_fail(struct psg_group *g, int self, const struct psg_failure *f);
/* The first member that has not reached barrier `below`, has not left, and whose process
 * is gone, as a failure; PSG_OK if none. Members already past it may have exited normally. */
struct psg_failure psg_check_alive(struct psg_group *g, int self, uint64_t below);
/* Marks `self` as leaving; true if no other member is still in the group (alive and not
 * left), so the caller is the last out. Of two members leaving at once, at least one sees
 * itself last. */
bool psg_leave(struct psg_group *g, int self);
/* The failure already recorded in the group, PSG_OK if none. */
struct psg_failure psg_recorded(struct psg_group *g, int *by);
/* Seconds on the monotonic clock. */
double psg_now(void);
/* Sleeps a little longer on each call of one wait (from spinning to 1 ms naps). */
void psg_backoff(unsigned *round);

#endif
