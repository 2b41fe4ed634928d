/* Start and end of the process: options, the PyTorch allocator setting, fork handlers,
 * statistics at exit. The driver itself is loaded at the first door that needs it, so a
 * process that never touches CUDA (a DataLoader worker, a shell) pays nothing. */
#include "shim/shim.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool options_ok;

bool ps_active(void)
{
  return options_ok && !ps_options.disabled && !ps_own_calls_anywhere() && !ps_in_forked_child() && ps_driver_load();
}

/* With torch's default caching allocator psshim would see ~60 large segments; with
 * backend:cudaMallocAsync it sees every tensor, which is what chunk placement needs. */
static void steer_pytorch(void)
{
  if (ps_options.keep_torch_allocator || getenv("PYTORCH_CUDA_ALLOC_CONF") || getenv("PYTORCH_ALLOC_CONF"))
    return;
  setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync", 0);
}

__attribute__((constructor)) static void psshim_start(void)
{
  char err[512];
  if (!ps_options_parse(err, sizeof err)) {
    ps_log_level = PS_LOG_ERROR;
    ps_error("%s", err);
    exit(2); /* as the launcher's for a bad option: the program never ran */
  }
  ps_log_level = ps_options.log_level;
  ps_options_say_unknown();
  options_ok = true;
  if (ps_options.disabled)
    return;
  steer_pytorch();
  ps_wiring_init();
  pthread_atfork(psa_atfork_prepare, psa_atfork_parent, psa_atfork_child);
}

/* A budget was set and kernels read chunks in host memory in place, yet nothing was paged:
 * one line at exit says why, at the default log level. */
static void say_unpaged(const struct psa_progress *p)
{
  if (ps_options.policy != PS_POLICY_AUTO || (!ps_options.gpu_budget && !ps_options.gpu_budget_frac) ||
      !psa_any_device())
    return;
  struct psa_stats s;
  psa_stats_get(&s);
  if (s.migrations_to_gpu + s.migrations_to_host || !s.touches_host)
    return;
  char why[160];
  if (psa_paging_stopped())
    snprintf(why, sizeof why, "work psshim cannot observe (a CUDA graph, an array copy) stopped paging");
  else if (!p->period)
    snprintf(why, sizeof why, "no training iteration was found in its %llu launches (paging follows one)",
             (unsigned long long)p->launches);
  else if (!s.plan_builds)
    snprintf(why, sizeof why, "the run ended before an iteration was recorded and planned");
  else
    snprintf(why, sizeof why, "the plan moves nothing");
  ps_error("nothing was paged: %s; %llu of %llu chunk touches read host memory in place", why,
           (unsigned long long)s.touches_host, (unsigned long long)(s.touches_host + s.touches_gpu));
}

__attribute__((destructor)) static void psshim_end(void)
{
  if (!options_ok || ps_in_forked_child())
    return;
  ps_wiring_end();
  struct psa_progress progress = ps_wiring_progress();
  say_unpaged(&progress);
  /* A launcher (timeout, torchrun) that never used the GPU would overwrite the statistics
   * of the program it ran. */
  if (!ps_options.stats || !psa_any_device())
    return;
  if (!ps_options.stats_path) {
    psa_stats_write(stderr, false, &progress);
    return;
  }
  FILE *f = fopen(ps_options.stats_path, "w");
  if (!f) {
    ps_error("PSSHIM_STATS=%s: cannot write the file: %s", ps_options.stats_path, strerror(errno));
    return;
  }
  psa_stats_write(f, true, &progress);
  /* A full disk fails at the flush: said, since the file is what the user asked for. */
  const bool failed = ferror(f);
  if (fclose(f) != 0 || failed)
    ps_error("PSSHIM_STATS=%s: writing the statistics failed: %s", ps_options.stats_path,
             failed ? "write error" : strerror(errno));
}
