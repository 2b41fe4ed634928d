/* Frames: physical memory of one chunk each, on the GPU or in pinned host memory, made
 * with cuMemCreate and kept for reuse (making them is slow: ~30 us on the GPU, ~20 ms per
 * 64 MiB on the host). Host frames are made ahead by a pool thread once GPU frames run
 * low, so spilling past the GPU budget does not stall the allocating thread. */
#include "allocator/space.h"
#include "comm/comm.h"

static uint32_t *free_list(struct device *d, enum psa_where w) { return w == PSA_GPU ? &d->fr.free_gpu : &d->fr.free_host; }

static uint64_t *frames_made(struct device *d, enum psa_where w)
{
  return w == PSA_GPU ? &d->stats.gpu_frames_made : &d->stats.host_frames_made;
}

static uint64_t *frame_limit(struct device *d, enum psa_where w)
{
  return w == PSA_GPU ? &d->fr.gpu_limit : &d->fr.host_limit;
}

/* Frames are exportable where the device allows it, so that a CUDA IPC handle of an
 * allocation (ipc.c) hands out the frames its chunks hold now, with no copy into frames
 * made for it. */
CUmemAllocationProp psa_frame_prop(const struct device *d, enum psa_where where)
{
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED};
  if (where == PSA_GPU)
    prop.location = (CUmemLocation){.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = d->ordinal};
  else
    prop.location = (CUmemLocation){.type = d->host_numa ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_HOST,
                                    .id = 0};
  if (d->exportable)
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

static CUresult create(struct device *d, enum psa_where where, struct frame *f, CUdeviceptr staging)
{
  CUmemAllocationProp prop = psa_frame_prop(d, where);
  CUresult r = ps_driver.cuMemCreate(&f->handle, d->chunk_size, &prop, 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    return r; /* the caller says which budget ran out */
  if (PS_CU(r))
    return r;
  r = psa_map(d, staging, f->handle);
  if (r) {
    PS_CU(ps_driver.cuMemRelease(f->handle));
    return r;
  }
  f->staging = staging;
  f->where = where;
  return CUDA_SUCCESS;
}

/* Called with d->lock held; drops d->lock while the driver works so other threads go on. The
 * frame's index is claimed first so the staging address is fixed. */
static uint32_t make(struct device *d, enum psa_where where)
{
  PSA_HELD(d);
  uint64_t *made = frames_made(d, where);
  if (*made >= *frame_limit(d, where) || d->fr.made > d->max_frames)
    return PSA_NO_FRAME;
  /* Host frames count against the node's budget too when ranks share the node. */
  if (where == PSA_HOST && !psc_host_reserve(d->chunk_size)) {
    if (!d->fr.node_budget_said)
      ps_error("the ranks of this node hold all of PSSHIM_HOST_BUDGET (%llu MiB together): no more host frames "
               "for this rank", (unsigned long long)(d->stats.host_budget >> 20));
    d->fr.node_budget_said = true;
    return PSA_NO_FRAME;
  }
  uint32_t id = d->fr.dead;
  if (id == PSA_NO_FRAME)
    id = d->fr.made++;
  else
    d->fr.dead = d->fr.frames[id].next_free; /* a destroyed frame's slot and staging address */
  (*made)++;
  d->fr.in_making[where]++;
  struct frame f = {0};
  ps_mutex_unlock(&d->lock);
  CUresult r = create(d, where, &f, d->staging_base + (uint64_t)id * d->chunk_size);
  ps_mutex_lock(&d->lock);
  d->fr.in_making[where]--;
  pthread_cond_broadcast(&d->fr.made_one);
  if (r) {
    if (where == PSA_HOST)
      psc_host_release(d->chunk_size);
    /* The device or host has less than the budget promised (memory used outside psshim):
     * the budget shrinks to what was made, said once. */
    (*made)--;
    *frame_limit(d, where) = *made;
    d->fr.frames[id].next_free = d->fr.dead;
    d->fr.dead = id;
    ps_log(PS_LOG_WARN, "%s frame %u could not be made (%s): %s budget now %llu MiB", where == PSA_GPU ? "GPU" : "host",
           id, ps_cu_error_name(r), where == PSA_GPU ? "GPU" : "host",
           (unsigned long long)((*made * d->chunk_size) >> 20));
    return PSA_NO_FRAME;
  }
  d->fr.frames[id] = f;
  d->fr.frames[id].next_free = PSA_NO_FRAME;
  return id;
}

static void push_free(struct device *d, uint32_t id)
{
  uint32_t *head = free_list(d, d->fr.frames[id].where);
  d->fr.frames[id].next_free = *head;
  *head = id;
}

static uint32_t count_free(struct device *d, enum psa_where w)
{
  uint32_t n = 0;
  for (uint32_t id = *free_list(d, w); id != PSA_NO_FRAME; id = d->fr.frames[id].next_free)
    n++;
  return n;
}

static void *pool_main(void *arg)
{
  struct device *d = arg;
  if (PS_CU(ps_driver.cuCtxSetCurrent(d->ctx)))
    return NULL;
  psa_relax(true); /* for good: making frames must not break another thread's capture */
  ps_mutex_lock(&d->lock);
  while (d->pool.running) {
    bool wanted = d->fr.gpu_held * 4 >= d->fr.gpu_limit * 3 && count_free(d, PSA_HOST) < d->pool.target &&
                  d->stats.host_frames_made < d->fr.host_limit;
    if (!wanted) {
      ps_cond_wait(&d->pool.wake, &d->lock);
      continue;
    }
    uint32_t id = make(d, PSA_HOST);
    if (id == PSA_NO_FRAME)
      break;
    push_free(d, id);
  }
  ps_mutex_unlock(&d->lock);
  return NULL;
}

CUresult psa_frames_init(struct device *d)
{
  d->fr.free_gpu = d->fr.free_host = d->fr.dead = PSA_NO_FRAME;
  /* HOST_NUMA frames are what the driver documents for device-accessible host memory;
   * older drivers know only HOST. Probe once. */
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .location = {.type = CU_MEM_LOCATION_TYPE_HOST_NUMA, .id = 0}};
  size_t gran = 0;
  d->host_numa = ps_driver.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS;
  int fd_handles = 0;
  d->exportable = ps_driver.cuDeviceGetAttribute(&fd_handles, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                                 d->dev) == CUDA_SUCCESS && fd_handles;
  d->pool.target = 4;
  pthread_cond_init(&d->pool.wake, NULL);
  pthread_cond_init(&d->fr.made_one, NULL);
  if (d->fr.host_limit == 0)
    return CUDA_SUCCESS;
  d->pool.running = true;
  if (pthread_create(&d->pool.thread, NULL, pool_main, d)) {
    d->pool.running = false;
    ps_log(PS_LOG_WARN, "no host frame pool thread: host frames are made on demand");
  }
  return CUDA_SUCCESS;
}

static void count_held(struct device *d, enum psa_where w, int delta)
{
  if (w == PSA_GPU) {
    d->fr.gpu_held += (uint64_t)(int64_t)delta;
    d->stats.gpu_frames = d->fr.gpu_held;
    if (d->fr.gpu_held > d->stats.peak_gpu_frames)
      d->stats.peak_gpu_frames = d->fr.gpu_held;
  } else {
    d->fr.host_held += (uint64_t)(int64_t)delta;
    d->stats.host_frames = d->fr.host_held;
    if (d->fr.host_held > d->stats.peak_host_frames)
      d->stats.peak_host_frames = d->fr.host_held;
  }
}

#ifdef PS_CHECKS
void psa_frames_check(struct device *d)
{
  uint8_t *seen = calloc(d->fr.made ? d->fr.made : 1, 1); /* 1: under a chunk, 2: free */
  if (!seen)
    return;
  for (uint64_t i = 0; i < d->space.chunks_high; i++) {
    uint32_t f = d->chunks[i].frame;
    if (f == PSA_NO_FRAME || f == psa_shared_frame(d))
      continue;
    if (f >= d->fr.made || seen[f])
      ps_check_failed("chunk %llu is on frame %u, which is %s", (unsigned long long)i, f,
                      f >= d->fr.made ? "not made" : "under another chunk too");
    seen[f] = 1;
  }
  uint64_t free_n[3] = {0};
  for (enum psa_where w = PSA_GPU; w <= PSA_HOST; w++)
    for (uint32_t f = *free_list(d, w); f != PSA_NO_FRAME; f = d->fr.frames[f].next_free) {
      if (f >= d->fr.made || seen[f] || d->fr.frames[f].where != w)
        ps_check_failed("frame %u on the %s free list is %s", f, w == PSA_GPU ? "GPU" : "host",
                        f >= d->fr.made ? "not made" : seen[f] ? "mapped or listed twice" : "of the other kind");
      seen[f] = 2;
      free_n[w]++;
    }
  free(seen);
  /* Frames made: held (under a chunk, or moved away from and not yet given back), free, or
   * still being made (counted made before the driver makes them, with the lock dropped). */
  if (d->fr.gpu_held + free_n[PSA_GPU] + d->fr.in_making[PSA_GPU] != d->stats.gpu_frames_made ||
      d->fr.host_held + free_n[PSA_HOST] + d->fr.in_making[PSA_HOST] != d->stats.host_frames_made)
    ps_check_failed("frames made (GPU %llu, host %llu) are not those held (%llu, %llu) and free (%llu, %llu)",
                    (unsigned long long)d->stats.gpu_frames_made, (unsigned long long)d->stats.host_frames_made,
                    (unsigned long long)d->fr.gpu_held, (unsigned long long)d->fr.host_held,
                    (unsigned long long)free_n[PSA_GPU], (unsigned long long)free_n[PSA_HOST]);
  if (d->fr.gpu_held > d->fr.gpu_limit || d->fr.host_held > d->fr.host_limit)
    ps_check_failed("frames held (GPU %llu, host %llu) beyond the budgets (%llu, %llu)",
                    (unsigned long long)d->fr.gpu_held, (unsigned long long)d->fr.host_held,
                    (unsigned long long)d->fr.gpu_limit, (unsigned long long)d->fr.host_limit);
}
#endif

uint32_t psa_frame_take(struct device *d, enum psa_where where)
{
  PSA_HELD(d);
  uint32_t *head = free_list(d, where), id;
  for (;;) {
    if ((id = *head) != PSA_NO_FRAME) {
      *head = d->fr.frames[id].next_free;
      break;
    }
    uint64_t start = psa_now_ns();
    id = make(d, where);
    d->stats.frame_make_ns += psa_now_ns() - start;
    if (id != PSA_NO_FRAME)
      break;
    /* At the limit, but another thread (the host pool) may be making the last frames. */
    if (!d->fr.in_making[where])
      return PSA_NO_FRAME;
    start = psa_now_ns();
    ps_cond_wait(&d->fr.made_one, &d->lock);
    d->stats.frame_wait_ns += psa_now_ns() - start;
  }
  count_held(d, where, +1);
  if (where == PSA_GPU && d->pool.running && d->fr.gpu_held * 4 >= d->fr.gpu_limit * 3)
    pthread_cond_signal(&d->pool.wake);
  if (where == PSA_HOST && d->pool.running)
    pthread_cond_signal(&d->pool.wake);
  return id;
}

void psa_frame_give(struct device *d, uint32_t id)
{
  count_held(d, d->fr.frames[id].where, -1);
  push_free(d, id);
}

void psa_frame_destroy(struct device *d, uint32_t id)
{
  struct frame *f = &d->fr.frames[id];
  count_held(d, f->where, -1);
  PS_CU(ps_driver.cuMemUnmap(f->staging, d->chunk_size));
  PS_CU(ps_driver.cuMemRelease(f->handle));
  if (f->where == PSA_HOST)
    psc_host_release(d->chunk_size);
  (*frames_made(d, f->where))--;
  f->next_free = d->fr.dead;
  d->fr.dead = id;
}
