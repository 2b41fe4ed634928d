/* The node group's life: join (rendezvous + agreement), host-side barriers and exchanges,
 * the NCCL communicator's creation, and leaving. */
#include <stdio.h>
#include <string.h>

#include "comm/nccl_table.h"
#include "comm/node.h"

struct psc_state psc_state;

static int me(void) { return psc_state.ranks.local_rank; }

static bool barrier(const char *during) {
  struct psg_failure f;
  if (psg_barrier(&psc_state.node->group, me(), psc_state.ranks.timeout_s, &f) == PSG_OK)
    return true;
  psc_report_wait(during, f);
  return false;
}

static bool agree(const struct psc_config *cfg, uint64_t shard_align) {
  struct psc_node *node = psc_state.node;
  node->slot[me()].config = *cfg;
  if (me() == 0) node->host_budget = cfg->host_budget;
  if (!barrier("the node rendezvous")) return false;
  struct psc_config records[PSG_MAX_MEMBERS];
  for (int i = 0; i < node->nranks; i++) records[i] = node->slot[i].config;
  char line[256];
  if (!psc_check_config(records, node->nranks, line, sizeof line)) {
    psc_errorf("%s", line);
    return false;
  }
  return psc_shard_check(cfg->chunk_size, node->nranks, shard_align);
}

enum psc_found psc_node_join(const struct psc_config *cfg, uint64_t shard_align) {
  if (psc_state.node) return PSC_GROUP;
  struct psc_ranks r;
  enum psc_found found = psc_ranks_read(&r);
  if (found != PSC_GROUP) return found;
  psc_state.ranks = r;
  if (!psc_rendezvous_open(&r)) return PSC_BAD;
  if (!agree(cfg, shard_align)) {
    psc_node_leave();
    return PSC_BAD;
  }
  return PSC_GROUP;
}

int psc_rank(void) { return psc_state.node ? me() : 0; }
int psc_nranks(void) { return psc_state.node ? psc_state.node->nranks : 1; }

bool psc_barrier(void) { return !psc_state.node || barrier("psc_barrier"); }

bool psc_exchange_u64(uint64_t mine, uint64_t all[PSG_MAX_MEMBERS], const char *during) {
  struct psc_node *node = psc_state.node;
  /* Alternating halves: a rank can start exchange k+1 before a slower one has read
   * exchange k, but not k+2, since k+1's barrier waits for everyone. */
  unsigned half = psc_state.exchanges++ & 1;
  atomic_store(&node->slot[me()].exchange[half], mine);
  if (!barrier(during)) return false;
  for (int i = 0; i < node->nranks; i++) all[i] = atomic_load(&node->slot[i].exchange[half]);
  return true;
}

bool psc_check_alloc_hash(uint64_t hash) {
  if (!psc_state.node) return true;
  uint64_t all[PSG_MAX_MEMBERS];
  if (!psc_exchange_u64(hash, all, "the allocation-sequence check")) return false;
  for (int i = 1; i < psc_state.node->nranks; i++) {
    if (all[i] != all[0]) {
      psc_errorf("rank %d allocated differently from rank 0 up to the first iteration boundary "
                 "(allocation sequence hash %016llx vs %016llx): its replicated chunks cannot "
                 "be sharded", i, (unsigned long long)all[i], (unsigned long long)all[0]);
      return false;
    }
  }
  return true;
}

bool psc_comm_init(CUresult (*stream_query)(CUstream)) {
  struct psc_node *node = psc_state.node;
  if (!node) {
    psc_errorf("psc_comm_init before psc_node_join formed a group");
    return false;
  }
  if (psc_state.comm || psc_state.comm_aborted) return psc_state.comm != NULL;
  if (!stream_query) {
    psc_errorf("psc_comm_init needs cuStreamQuery to bound its waits");
    return psc_comm_abort(NULL);
  }
  psc_state.stream_query = stream_query;
  if (!psc_nccl_load()) return psc_comm_abort(NULL);
  ncclUniqueId id;
  if (me() == 0) {
    ncclResult_t r = psc_nccl.ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      psc_errorf("ncclGetUniqueId failed: %s", psc_nccl.ncclGetErrorString(r));
      return psc_comm_abort(NULL);
    }
    memcpy(node->unique_id, &id, sizeof id);
  }
  if (!barrier("the NCCL unique id exchange")) return false;
  memcpy(&id, node->unique_id, sizeof id);
  /* An older NCCL reads only the leading fields it knows of this newer struct. */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0; /* so that psc_settle can bound the wait */
  config.commName = "psshim";
  ncclComm_t comm = NULL;
  ncclResult_t r = psc_nccl.ncclCommInitRankConfig(&comm, node->nranks, id, me(), &config);
  psc_state.comm = comm;
  return psc_settle(r, "ncclCommInitRankConfig");
}

void psc_node_leave(void) {
  if (psc_state.comm) {
    ncclResult_t r = psc_nccl.ncclCommDestroy(psc_state.comm);
    if (r != ncclSuccess && r != ncclInProgress) /* in progress: it finishes on its own */
      psc_errorf("ncclCommDestroy failed: %s", psc_nccl.ncclGetErrorString(r));
  }
  psc_state.comm = NULL;
  psc_state.comm_aborted = false;
  psc_star_close();
  psc_rendezvous_close();
}
