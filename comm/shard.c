/* Which part of a replicated chunk each rank keeps on host. */
#include "comm/node.h"

#define PSC_DEFAULT_SHARD_ALIGN 256 /* NCCL's and the copy engines' comfortable alignment */

bool psc_shard_check(uint64_t chunk_size, int n, uint64_t align) {
  if (!align) align = PSC_DEFAULT_SHARD_ALIGN;
  uint64_t unit = align * (uint64_t)n;
  if (n >= 1 && chunk_size != 0 && chunk_size % unit == 0) return true;
  char chunk[32], a[32], u[32];
  psc_errorf("PSSHIM_CHUNK_SIZE=%s does not split into %d shards of a multiple of %s "
             "(LOCAL_WORLD_SIZE=%d): use a multiple of %s",
             psc_format_size(chunk_size, chunk), n, psc_format_size(align, a), n,
             psc_format_size(unit, u));
  return false;
}

struct psc_shard psc_shard_of(uint64_t chunk_size, int n, int rank) {
  uint64_t len = chunk_size / (uint64_t)n;
  return (struct psc_shard){.offset = (uint64_t)rank * len, .len = len};
}

uint64_t psc_shardable_chunk_size(uint64_t preferred, uint64_t align) {
  uint64_t unit = align * (uint64_t)psc_node_size_hint();
  return (preferred + unit - 1) / unit * unit;
}
