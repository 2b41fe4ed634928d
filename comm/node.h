/* comm/ internals: the node segment every local rank maps, and this process's view of it. */
#ifndef PSSHIM_COMM_NODE_H
#define PSSHIM_COMM_NODE_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "comm/comm.h"
#include "comm/shm_group.h"

_Static_assert(PSG_MAX_MEMBERS == PSC_MAX_RANKS, "comm.h promises PSC_MAX_RANKS ranks");

/* Bump when struct psc_node changes: ranks of different builds then refuse to meet. */
#define PSC_NODE_LAYOUT 2u
#define PSC_NODE_MAGIC (0x7073636e6f646500ull | PSC_NODE_LAYOUT) /* "pscnode" + layout */

struct psc_node_slot {
  struct psc_config config;
  int32_t local_world_size;
  _Atomic uint64_t exchange[2]; /* psc_exchange_u64, alternating so one barrier suffices */
  _Atomic uint64_t host_bytes;  /* pinned host bytes this rank holds (host_accounting.c) */
};

struct psc_node {
  _Atomic uint64_t magic; /* stored last by the creator: the segment is ready */
  struct psc_proc creator;
  int32_t nranks;
  uint64_t host_budget;     /* the node's total for psc_host_reserve; 0 = no limit */
  pthread_mutex_t host_lock; /* robust and process-shared: a holder may die */
  unsigned char unique_id[128];
  uint64_t star_salt;            /* random: names the socket star, unguessable outside the job */
  _Atomic int32_t star_refused;  /* rank 0 could not open the star: its peers stop waiting */
  struct psg_group group;
  struct psc_node_slot slot[PSG_MAX_MEMBERS];
};

struct psc_state {
  struct psc_ranks ranks;
  struct psc_node *node; /* NULL: alone, or the join failed */
  int32_t joined_pid;    /* a forked child inherits the mapping but is not the rank */
  char shm_name[48];
  uint64_t exchanges;    /* psc_exchange_u64 calls so far: picks the slot's exchange[] */
  void *comm;            /* ncclComm_t */
  bool comm_aborted;
  CUresult (*stream_query)(CUstream);
  int star[PSG_MAX_MEMBERS]; /* star.c: rank 0's connections by rank; others' [0], to rank 0 */
  bool star_up, star_down;   /* down: failed or closed, for good */
};
extern struct psc_state psc_state;

/* One failure line through the error sink. */
void psc_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The line for a failed wait of the group, naming the rank and what it was waiting for. */
void psc_report_wait(const char *during, struct psg_failure f);
/* "64M"-style text of a byte count (exact suffixes only). */
const char *psc_format_size(uint64_t bytes, char buf[32]);

/* ranks.c: the node's rank count from torchrun's variables, read without complaint; 1 when unset. */
int psc_node_size_hint(void);

/* rendezvous.c: maps the node segment named from r->job_key (rank 0 creates it) and claims
 * this rank's slot; sets psc_state.node and shm_name. */
bool psc_rendezvous_open(const struct psc_ranks *r);
/* Unmaps it; the last rank out (or the last one alive) removes the name. */
void psc_rendezvous_close(void);
/* Names the node segment may take, in order: rank 0 passes over those another user holds. */
#define PSC_SEGMENT_NAMES 4
/* "/psshim-" + hash of the job key, then "-k" for the k-th other name. */
void psc_segment_name(const char *job_key, int k, char name[48]);

/* star.c: the star's abstract socket address, from the segment's name and salt. */
bool psc_star_address(struct sockaddr_un *a, socklen_t *len);

/* comm.c: every rank passes a value and gets all ranks' values (index = rank). */
bool psc_exchange_u64(uint64_t mine, uint64_t all[PSG_MAX_MEMBERS], const char *during);
/* collectives.c: finishes an NCCL call that returned r on the non-blocking communicator
 * (polling while it is in progress, bounded by the timeout and the peers' lives); on
 * failure one line naming `what` and the communicator is aborted. */
bool psc_settle(int r, const char *what);
/* Ends the communicator (if any) after a failure: ncclCommAbort releases kernels stuck
 * waiting for a dead peer; the group records the cause (NULL: this rank gave up) so no peer
 * waits on this rank; later calls fail at once. Returns false. */
bool psc_comm_abort(const struct psg_failure *cause);

#endif
