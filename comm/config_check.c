/* Configuration agreement: the node's ranks must page and shard alike. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "comm/node.h"

static const struct {
  const char *var;
  size_t offset;
} size_fields[] = {
    {"PSSHIM_CHUNK_SIZE", offsetof(struct psc_config, chunk_size)},
    {"PSSHIM_GPU_BUDGET", offsetof(struct psc_config, gpu_budget)},
    {"PSSHIM_HOST_BUDGET", offsetof(struct psc_config, host_budget)},
};

static uint64_t field(const struct psc_config *c, size_t offset) {
  uint64_t v;
  memcpy(&v, (const char *)c + offset, sizeof v);
  return v;
}

bool psc_check_config(const struct psc_config *records, int n, char *line, size_t len) {
  const struct psc_config *first = &records[0];
  for (int r = 1; r < n; r++) {
    const struct psc_config *c = &records[r];
    for (size_t f = 0; f < sizeof size_fields / sizeof size_fields[0]; f++) {
      uint64_t mine = field(c, size_fields[f].offset), theirs = field(first, size_fields[f].offset);
      if (mine != theirs) {
        char a[32], b[32];
        snprintf(line, len, "rank %d has %s=%s but rank 0 has %s", r, size_fields[f].var,
                 psc_format_size(mine, a), psc_format_size(theirs, b));
        return false;
      }
    }
    if (strncmp(c->policy, first->policy, sizeof c->policy) != 0) {
      snprintf(line, len, "rank %d has PSSHIM_POLICY=%.*s but rank 0 has %.*s", r,
               (int)sizeof c->policy, c->policy, (int)sizeof first->policy, first->policy);
      return false;
    }
  }
  return true;
}
