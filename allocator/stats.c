/* PSSHIM_STATS: what the allocator did, summed over devices, as text or JSON. */
#include "allocator/allocator_internal.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

void psa_stats_get(struct psa_stats *out)
{
  memset(out, 0, sizeof *out);
  for (int i = 0; i < PSA_MAX_DEVICES; i++) {
    struct device *d = &psa_devices[i];
    if (!d->ready)
      continue;
    ps_mutex_lock(&d->lock);
#define SUM(name) out->name += d->stats.name;
#define SAME(name) out->name = d->stats.name;
#define COMBINE(name, how) how(name)
    PSA_STATS_FIELDS(COMBINE)
#undef COMBINE
#undef SAME
#undef SUM
    ps_mutex_unlock(&d->lock);
  }
}

bool psa_any_device(void)
{
  for (int i = 0; i < PSA_MAX_DEVICES; i++)
    if (psa_devices[i].ready)
      return true;
  return false;
}

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

/* ---- the steady iteration ---- */

#define STEADY_KEEP 256 /* trusted iterations kept, the newest */

struct iteration_cost {
  uint64_t wall_ns;
  uint64_t pager_permille; /* launch_ns per wall_ns */
#define STEADY_FIELD(name) uint64_t name;
  PSA_STEADY_FIELDS(STEADY_FIELD)
#undef STEADY_FIELD
};

static ps_mutex steady_lock = PS_MUTEX_INITIALIZER(PS_RANK_STEADY, "the steady statistics lock");
static struct psa_stats at_boundary; /* the statistics at the last boundary */
static uint64_t boundary_ns;          /* 0: none yet */
static struct iteration_cost kept[STEADY_KEEP];
static uint64_t nkept; /* iterations recorded; the newest STEADY_KEEP are in kept[] */

void psa_stats_boundary(bool first, struct psa_stats *taken)
{
  psa_stats_get(taken);
  uint64_t t = psa_now_ns();
  ps_mutex_lock(&steady_lock);
  if (first) /* a period newly trusted: a first step's short stretches are no iteration */
    nkept = 0;
  else if (boundary_ns) {
    struct iteration_cost *c = &kept[nkept++ % STEADY_KEEP];
    c->wall_ns = t - boundary_ns;
#define STEADY_DELTA(name) c->name = taken->name - at_boundary.name;
    PSA_STEADY_FIELDS(STEADY_DELTA)
#undef STEADY_DELTA
    c->pager_permille = c->wall_ns ? 1000 * c->launch_ns / c->wall_ns : 0;
  }
  at_boundary = *taken;
  boundary_ns = t;
  ps_mutex_unlock(&steady_lock);
}

static int cmp_u64(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* The median of one field of kept[from..from+n), through scratch v. */
static uint64_t median_at(size_t offset, uint64_t from, uint64_t n, uint64_t *v)
{
  for (uint64_t k = 0; k < n; k++)
    memcpy(&v[k], (const char *)&kept[(from + k) % STEADY_KEEP] + offset, sizeof *v);
  qsort(v, n, sizeof *v, cmp_u64);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The steady iteration: each figure's median over the kept iterations, the first trusted
 * one left out while it is kept. Returns how many iterations it is the median of. */
static uint64_t steady_median(struct iteration_cost *m)
{
  uint64_t v[STEADY_KEEP];
  ps_mutex_lock(&steady_lock);
  uint64_t from = nkept > STEADY_KEEP ? nkept - STEADY_KEEP : 1, n = nkept > from ? nkept - from : 0;
  if (n) {
#define STEADY_MEDIAN(name) m->name = median_at(offsetof(struct iteration_cost, name), from, n, v);
    STEADY_MEDIAN(wall_ns)
    STEADY_MEDIAN(pager_permille)
    PSA_STEADY_FIELDS(STEADY_MEDIAN)
#undef STEADY_MEDIAN
  }
  ps_mutex_unlock(&steady_lock);
  return n;
}

void psa_stats_write(FILE *f, bool json, const struct psa_progress *p)
{
  struct psa_stats s;
  psa_stats_get(&s);
  uint64_t launches = p->launches, iterations = p->iterations;
  /* Fill at the peak: how much of the mapped chunk space live tensors used when it counted. */
  double fill = s.mapped_at_peak ? 100.0 * (double)s.peak_live_bytes / (double)s.mapped_at_peak : 0;
  struct iteration_cost m = {0};
  uint64_t steady = steady_median(&m);
  if (json) {
    fputc('{', f);
#define JSON_FIELD(name, how) fprintf(f, "\"" #name "\": %llu, ", (unsigned long long)s.name);
    PSA_STATS_FIELDS(JSON_FIELD)
#undef JSON_FIELD
    if (steady) {
      fprintf(f, "\"steady_iterations\": %llu, \"steady_wall_ns\": %llu, \"steady_pager_pct\": %.1f, ",
              (unsigned long long)steady, (unsigned long long)m.wall_ns, m.pager_permille / 10.0);
#define JSON_STEADY(name) fprintf(f, "\"steady_" #name "\": %llu, ", (unsigned long long)m.name);
      PSA_STEADY_FIELDS(JSON_STEADY)
#undef JSON_STEADY
    }
    fprintf(f,
            "\"peak_gpu_bytes\": %llu, \"peak_host_bytes\": %llu, \"chunk_fill_pct\": %.1f, \"launches\": %llu, "
            "\"iterations\": %llu, \"period\": %llu, \"period_adopted_at\": %llu}\n",
            (unsigned long long)(s.peak_gpu_frames * s.chunk_size),
            (unsigned long long)(s.peak_host_frames * s.chunk_size), fill, (unsigned long long)launches,
            (unsigned long long)iterations, (unsigned long long)p->period, (unsigned long long)p->adopted_at);
    return;
  }
  fprintf(f, "psshim: allocations %llu, frees %llu, failed %llu; live %.1f MiB, peak %.1f MiB\n",
          (unsigned long long)s.allocs, (unsigned long long)s.frees, (unsigned long long)s.failed_allocs,
          mib(s.live_bytes), mib(s.peak_live_bytes));
  fprintf(f, "psshim: GPU frames: peak %llu (%.1f MiB) of budget %.1f MiB, made %llu\n",
          (unsigned long long)s.peak_gpu_frames, mib(s.peak_gpu_frames * s.chunk_size), mib(s.gpu_budget),
          (unsigned long long)s.gpu_frames_made);
  fprintf(f, "psshim: host frames: peak %llu (%.1f MiB) of budget %.1f MiB, made %llu\n",
          (unsigned long long)s.peak_host_frames, mib(s.peak_host_frames * s.chunk_size), mib(s.host_budget),
          (unsigned long long)s.host_frames_made);
  fprintf(f, "psshim: chunk %.0f MiB, fill %.1f%%; migrations to GPU %llu (%.1f MiB), to host %llu (%.1f MiB)\n",
          mib(s.chunk_size), fill, (unsigned long long)s.migrations_to_gpu, mib(s.bytes_h2d),
          (unsigned long long)s.migrations_to_host, mib(s.bytes_d2h));
  if (s.migrations_to_gpu + s.migrations_to_host)
    fprintf(f, "psshim: pager: moves %.1f ms (remaps %.1f ms); launching threads in the pager %.1f ms, %llu late "
            "waits for a remap (%.1f ms)\n", (double)s.move_ns / 1e6, (double)s.remap_ns / 1e6,
            (double)s.launch_ns / 1e6, (unsigned long long)s.late_waits, (double)s.late_wait_ns / 1e6);
  if (steady)
    fprintf(f, "psshim: steady iteration (median of %llu): %.1f ms, the launching threads %.1f ms in the pager "
            "(%.1f%%); moved in %.1f MiB, out %.1f MiB; %llu late waits\n", (unsigned long long)steady,
            (double)m.wall_ns / 1e6, (double)m.launch_ns / 1e6, m.pager_permille / 10.0, mib(m.bytes_h2d),
            mib(m.bytes_d2h), (unsigned long long)m.late_waits);
  if (s.shares)
    fprintf(f, "psshim: sharing: %llu chunks shared with the node's ranks, %llu made private again; host frames "
            "saved: %.1f MiB now, %.1f MiB at most\n", (unsigned long long)s.shares, (unsigned long long)s.unshares,
            mib(s.shard_saved_bytes), mib(s.peak_shard_saved_bytes));
  if (s.shared_gathers)
    fprintf(f, "psshim: gathered page-in: %llu shared chunks, %.1f MiB onto GPU frames at %.2f GB/s (and %.1f ms "
            "making the communicator)\n", (unsigned long long)s.shared_gathers, mib(s.gathered_bytes),
            s.gather_ns ? (double)s.gathered_bytes / (double)s.gather_ns : 0.0, (double)s.comm_init_ns / 1e6);
  if (s.plan_builds)
    fprintf(f, "psshim: plan: %llu made in %.1f ms, %.1f MiB in and %.1f MiB out per iteration; its owner fetched %llu, "
            "evicted %llu, missed %llu, found done %llu; over %llu iterations moved %.1f MiB in, %.1f MiB out; waited "
            "%.1f ms, launches %.1f ms (%llu gave up); allocations recalled %llu, not %llu\n",
            (unsigned long long)s.plan_builds, (double)s.plan_build_ns / 1e6, mib(s.plan_bytes_in),
            mib(s.plan_bytes_out), (unsigned long long)s.owner_fetches, (unsigned long long)s.owner_evictions,
            (unsigned long long)s.owner_missed, (unsigned long long)s.owner_moot, (unsigned long long)s.plan_laps,
            mib(s.plan_moved_in), mib(s.plan_moved_out), (double)s.owner_wait_ns / 1e6, (double)s.gate_wait_ns / 1e6,
            (unsigned long long)s.gate_timeouts, (unsigned long long)s.recalled_allocs,
            (unsigned long long)s.recall_misses);
}
