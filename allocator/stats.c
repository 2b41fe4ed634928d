/* PSSHIM_STATS: what the allocator did, summed over devices, as text or JSON. */
#include "allocator/allocator_internal.h"

#include <string.h>

void psa_stats_get(struct psa_stats *out)
{
  memset(out, 0, sizeof *out);
  for (int i = 0; i < PSA_MAX_DEVICES; i++) {
    struct device *d = &psa_devices[i];
    if (!d->ready)
      continue;
    pthread_mutex_lock(&d->lock);
    const uint64_t *src = (const uint64_t *)&d->stats;
    uint64_t *dst = (uint64_t *)out;
    /* Every field is a uint64_t count or size: sum them all, then fix the one that is
     * a setting rather than an amount. */
    for (size_t k = 0; k < sizeof *out / sizeof(uint64_t); k++)
      dst[k] += src[k];
    out->chunk_size = d->stats.chunk_size;
    pthread_mutex_unlock(&d->lock);
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

void psa_stats_write(FILE *f, bool json, const struct psa_progress *p)
{
  struct psa_stats s;
  psa_stats_get(&s);
  uint64_t launches = p->launches, iterations = p->iterations;
  /* Fill at the peak: how much of the mapped chunk space live tensors used when it counted. */
  double fill = s.mapped_at_peak ? 100.0 * (double)s.peak_live_bytes / (double)s.mapped_at_peak : 0;
  if (json) {
    fprintf(f,
            "{\"allocs\": %llu, \"frees\": %llu, \"failed_allocs\": %llu, \"live_bytes\": %llu, "
            "\"peak_live_bytes\": %llu, \"chunk_size\": %llu, \"gpu_budget\": %llu, \"host_budget\": %llu, "
            "\"gpu_frames\": %llu, \"peak_gpu_frames\": %llu, \"peak_gpu_bytes\": %llu, "
            "\"host_frames\": %llu, \"peak_host_frames\": %llu, \"peak_host_bytes\": %llu, "
            "\"gpu_frames_made\": %llu, \"host_frames_made\": %llu, \"chunk_fill_pct\": %.1f, "
            "\"migrations_to_gpu\": %llu, \"migrations_to_host\": %llu, \"bytes_h2d\": %llu, \"bytes_d2h\": %llu, "
            "\"copy_waits\": %llu, \"touches_gpu\": %llu, \"touches_host\": %llu, \"launches\": %llu, "
            "\"iterations\": %llu, \"period\": %llu, \"plans\": %llu, \"plans_no_fetch\": %llu, "
            "\"plans_no_victim\": %llu, \"plans_belady\": %llu, \"plans_no_gain\": %llu, \"margin_frames\": %llu, "
            "\"plan_ns\": %llu, \"move_ns\": %llu, \"remap_ns\": %llu, \"scan_ns\": %llu, \"poll_ns\": %llu, "
            "\"frame_wait_ns\": %llu, \"frame_make_ns\": %llu, \"runahead_wait_ns\": %llu, \"runahead_timeouts\": %llu, "
            "\"event_queries\": %llu, \"share_rounds\": %llu, \"share_round_ns\": %llu, \"shares\": %llu, "
            "\"unshares\": %llu, \"shared_pageins\": %llu, \"shared_clean_leaves\": %llu, \"shared_gathers\": %llu, "
            "\"gathered_bytes\": %llu, \"gather_ns\": %llu, \"comm_init_ns\": %llu, "
            "\"shared_chunks\": %llu, \"shared_host_bytes\": %llu, "
            "\"shard_saved_bytes\": %llu, \"peak_shard_saved_bytes\": %llu}\n",
            (unsigned long long)s.allocs, (unsigned long long)s.frees, (unsigned long long)s.failed_allocs,
            (unsigned long long)s.live_bytes, (unsigned long long)s.peak_live_bytes,
            (unsigned long long)s.chunk_size, (unsigned long long)s.gpu_budget, (unsigned long long)s.host_budget,
            (unsigned long long)s.gpu_frames, (unsigned long long)s.peak_gpu_frames,
            (unsigned long long)(s.peak_gpu_frames * s.chunk_size), (unsigned long long)s.host_frames,
            (unsigned long long)s.peak_host_frames, (unsigned long long)(s.peak_host_frames * s.chunk_size),
            (unsigned long long)s.gpu_frames_made, (unsigned long long)s.host_frames_made, fill,
            (unsigned long long)s.migrations_to_gpu, (unsigned long long)s.migrations_to_host,
            (unsigned long long)s.bytes_h2d, (unsigned long long)s.bytes_d2h,
            (unsigned long long)s.copy_waits, (unsigned long long)s.touches_gpu,
            (unsigned long long)s.touches_host, (unsigned long long)launches, (unsigned long long)iterations,
            (unsigned long long)p->period, (unsigned long long)s.plans,
            (unsigned long long)s.plans_no_fetch, (unsigned long long)s.plans_no_victim,
            (unsigned long long)s.plans_belady, (unsigned long long)s.plans_no_gain,
            (unsigned long long)s.margin_frames, (unsigned long long)s.plan_ns, (unsigned long long)s.move_ns,
            (unsigned long long)s.remap_ns, (unsigned long long)s.scan_ns, (unsigned long long)s.poll_ns,
            (unsigned long long)s.frame_wait_ns, (unsigned long long)s.frame_make_ns,
            (unsigned long long)s.runahead_wait_ns,
            (unsigned long long)s.runahead_timeouts, (unsigned long long)s.event_queries,
            (unsigned long long)s.share_rounds, (unsigned long long)s.share_round_ns, (unsigned long long)s.shares,
            (unsigned long long)s.unshares, (unsigned long long)s.shared_pageins,
            (unsigned long long)s.shared_clean_leaves, (unsigned long long)s.shared_gathers,
            (unsigned long long)s.gathered_bytes, (unsigned long long)s.gather_ns, (unsigned long long)s.comm_init_ns,
            (unsigned long long)s.shared_chunks,
            (unsigned long long)s.shared_host_bytes, (unsigned long long)s.shard_saved_bytes,
            (unsigned long long)s.peak_shard_saved_bytes);
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
  if (s.shares)
    fprintf(f, "psshim: sharing: %llu chunks shared with the node's ranks, %llu made private again; host frames "
            "saved: %.1f MiB now, %.1f MiB at most\n", (unsigned long long)s.shares, (unsigned long long)s.unshares,
            mib(s.shard_saved_bytes), mib(s.peak_shard_saved_bytes));
  if (s.shared_gathers)
    fprintf(f, "psshim: gathered page-in: %llu shared chunks, %.1f MiB onto GPU frames at %.2f GB/s (and %.1f ms "
            "making the communicator)\n", (unsigned long long)s.shared_gathers, mib(s.gathered_bytes),
            s.gather_ns ? (double)s.gathered_bytes / (double)s.gather_ns : 0.0, (double)s.comm_init_ns / 1e6);
}
