/* Pinned host memory shared by the node's ranks: each rank's slot says how many bytes it
 * holds, and a reservation succeeds only if the live ranks' total stays within the node's
 * budget. A robust process-shared mutex serialises reservations, so a rank that dies holding
 * it never blocks the rest; releases only lower a slot, so they need no lock. */
#include <errno.h>
#include <string.h>

#include "comm/node.h"
#include "core/core.h"

static uint64_t live_total(struct psc_node *node) {
  uint64_t total = 0;
  for (int i = 0; i < node->nranks; i++) total += atomic_load(&node->slot[i].host_bytes);
  return total;
}

/* A dead rank's pinned memory went back to the kernel with its process. */
static void reclaim_dead(struct psc_node *node) {
  for (int i = 0; i < node->nranks; i++) {
    struct psg_member *m = &node->group.m[i];
    int32_t pid = atomic_load(&m->pid);
    if (i != psc_state.ranks.local_rank && pid && !psc_proc_alive(pid, atomic_load(&m->start)))
      atomic_store(&node->slot[i].host_bytes, 0);
  }
}

static bool lock(struct psc_node *node) {
  ps_lock_check_take(&node->host_lock, PS_RANK_NODE_HOST, "the node's host-memory lock", false);
  int rc = pthread_mutex_lock(&node->host_lock);
  if (rc == EOWNERDEAD) rc = pthread_mutex_consistent(&node->host_lock);
  if (rc == 0) return true;
  ps_lock_check_give(&node->host_lock, "the node's host-memory lock");
  psc_errorf("cannot take the node's host-memory lock: %s", strerror(rc));
  return false;
}

static void unlock(struct psc_node *node) {
  ps_lock_check_give(&node->host_lock, "the node's host-memory lock");
  pthread_mutex_unlock(&node->host_lock);
}

bool psc_host_reserve(uint64_t bytes) {
  struct psc_node *node = psc_state.node;
  if (!node) return true;
  _Atomic uint64_t *mine = &node->slot[psc_state.ranks.local_rank].host_bytes;
  if (node->host_budget == 0) {
    atomic_fetch_add(mine, bytes);
    return true;
  }
  if (!lock(node)) return false;
  uint64_t total = live_total(node);
  if (total + bytes > node->host_budget) {
    /* Only when short: reading /proc for every peer on each reservation would cost more. */
    reclaim_dead(node);
    total = live_total(node);
  }
  bool ok = total + bytes <= node->host_budget;
  if (ok) atomic_fetch_add(mine, bytes);
  unlock(node);
  return ok;
}

void psc_host_release(uint64_t bytes) {
  struct psc_node *node = psc_state.node;
  if (node) atomic_fetch_sub(&node->slot[psc_state.ranks.local_rank].host_bytes, bytes);
}

uint64_t psc_host_reserved(void) { return psc_state.node ? live_total(psc_state.node) : 0; }
