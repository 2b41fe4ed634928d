/* Where this process sits, from torchrun's environment. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/node.h"
#include "core/core.h"

/* A whole-string decimal integer in [lo, hi]. */
static bool parse_int(const char *text, long lo, long hi, int *out) {
  if (!text || !*text) return false;
  errno = 0;
  char *end;
  long v = strtol(text, &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = (int)v;
  return true;
}

/* Reads variable `name` as an integer in [lo, hi]; unset leaves *out alone. False, after
 * the line naming it, when set but not such an integer. */
static bool env_int(const char *name, long lo, long hi, const char *what, int *out) {
  const char *text = getenv(name);
  if (!text) return true;
  if (parse_int(text, lo, hi, out)) return true;
  psc_errorf("%s=%s is not %s: expected an integer from %ld to %ld", name, text, what, lo, hi);
  return false;
}

/* The job key: every field that tells this job (and restart, and node) from another one
 * that might run on the same host under the same user. */
static bool job_key(const struct psc_ranks *r, char *key, size_t len) {
  const char *run_id = getenv("TORCHELASTIC_RUN_ID");
  const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");
  const char *addr = getenv("MASTER_ADDR");
  int port = 0;
  if (!env_int("MASTER_PORT", 1, 65535, "a port", &port)) return false;
  bool have_run = run_id && *run_id, have_master = addr && *addr && port;
  if (!have_run && !have_master) {
    psc_errorf("WORLD_SIZE=%d but neither TORCHELASTIC_RUN_ID nor MASTER_ADDR and MASTER_PORT "
               "are set: psshim's ranks cannot name their meeting place", r->world_size);
    return false;
  }
  snprintf(key, len, "run=%s restart=%s master=%s:%d uid=%u node=%d", have_run ? run_id : "",
           restart ? restart : "", have_master ? addr : "", port, (unsigned)getuid(), r->node_rank);
  return true;
}

enum psc_found psc_ranks_read(struct psc_ranks *r) {
  /* The one check a single-process run pays. */
  const char *ws = getenv("WORLD_SIZE");
  if (!ws || strcmp(ws, "1") == 0) return PSC_ALONE;

  memset(r, 0, sizeof *r);
  if (!parse_int(ws, 1, 1 << 20, &r->world_size)) {
    psc_errorf("WORLD_SIZE=%s is not a world size: expected an integer from 1 to %d", ws, 1 << 20);
    return PSC_BAD;
  }
  if (r->world_size == 1) return PSC_ALONE;
  if (!getenv("RANK")) {
    psc_errorf("WORLD_SIZE=%d but RANK is unset", r->world_size);
    return PSC_BAD;
  }
  if (!env_int("RANK", 0, r->world_size - 1, "a rank", &r->rank)) return PSC_BAD;

  /* Without LOCAL_WORLD_SIZE the job is taken to be one node: then LOCAL_RANK, if set,
   * must be RANK. */
  r->local_world_size = r->world_size;
  if (!env_int("LOCAL_WORLD_SIZE", 1, r->world_size, "a local world size", &r->local_world_size))
    return PSC_BAD;
  r->local_rank = r->rank;
  if (getenv("LOCAL_WORLD_SIZE") && !getenv("LOCAL_RANK")) {
    psc_errorf("LOCAL_WORLD_SIZE=%d but LOCAL_RANK is unset", r->local_world_size);
    return PSC_BAD;
  }
  if (!env_int("LOCAL_RANK", 0, r->local_world_size - 1, "a local rank", &r->local_rank))
    return PSC_BAD;
  if (!getenv("LOCAL_WORLD_SIZE") && r->local_rank != r->rank) {
    psc_errorf("LOCAL_WORLD_SIZE is unset and LOCAL_RANK=%d differs from RANK=%d: set "
               "LOCAL_WORLD_SIZE to the number of ranks on this node", r->local_rank, r->rank);
    return PSC_BAD;
  }
  if (r->local_world_size > PSG_MAX_MEMBERS) {
    psc_errorf("LOCAL_WORLD_SIZE=%d: psshim's node group holds at most %d ranks",
               r->local_world_size, PSG_MAX_MEMBERS);
    return PSC_BAD;
  }
  const char *node_var = getenv("GROUP_RANK") ? "GROUP_RANK" : "NODE_RANK";
  if (!env_int(node_var, 0, 1 << 20, "a node rank", &r->node_rank)) return PSC_BAD;
  r->timeout_s = ps_options.comm_timeout_s; /* core's options table refused a bad value at start */
  if (!job_key(r, r->job_key, sizeof r->job_key)) return PSC_BAD;
  return r->local_world_size == 1 ? PSC_ALONE : PSC_GROUP;
}

int psc_node_size_hint(void) {
  int n = 1;
  if (!parse_int(getenv("LOCAL_WORLD_SIZE"), 1, PSG_MAX_MEMBERS, &n))
    parse_int(getenv("WORLD_SIZE"), 1, PSG_MAX_MEMBERS, &n);
  return n;
}
