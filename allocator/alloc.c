/* The allocator's entry points: allocate, free, memory info, migrate, fork. */
#include "allocator/allocator_internal.h"
#include "tracer/tracer.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <string.h>

static _Atomic uint64_t live_all, allocs_all; /* psa_live_now's */

void psa_live_now(uint64_t *live_bytes, uint64_t *allocs)
{
  *live_bytes = atomic_load_explicit(&live_all, memory_order_relaxed);
  *allocs = atomic_load_explicit(&allocs_all, memory_order_relaxed);
}

/* The floors' hooks (space.h) are registered before the first device is set up, and so
 * before any is called: each is called on a ready device, or from an observed launch, and
 * launches are observed only once a device is (psa_on_first_device). */
static void wire_floors(void)
{
  psa_paging_wire();
  psa_sharing_wire();
}

static struct device *device_get(int ordinal)
{
  static pthread_once_t wired = PTHREAD_ONCE_INIT;
  pthread_once(&wired, wire_floors);
  return psa_device_get(ordinal);
}

static struct device *device_of(CUdeviceptr p)
{
  int ordinal;
  return psa_chunk_of(p, &ordinal) < 0 ? NULL : &psa_devices[ordinal];
}

static bool fits(struct device *d, struct span *s, uint64_t size)
{
  return s->nchunks * d->chunk_size - s->live_bytes >= size;
}

/* Best fit over every span of the list: fragmentation is what decides how much of a
 * budget the tensors really get. */
static struct span *carve_in(struct device *d, enum psa_where w, uint64_t size, CUstream stream, uint64_t *off)
{
  struct span *best = NULL;
  int64_t best_i = -1;
  uint64_t best_len = UINT64_MAX;
  for (struct span *s = d->space.spans[w]; s && best_len != size; s = s->next) {
    if (!fits(d, s, size))
      continue;
    int64_t i = psa_span_best(d, s, size, stream);
    if (i >= 0 && s->ranges[i].len < best_len) {
      best = s;
      best_i = i;
      best_len = s->ranges[i].len;
    }
  }
  if (best)
    *off = psa_span_take(d, best, (uint32_t)best_i, size);
  return best;
}

/* Whether a GPU frame is free or can be made, by paging out (psa_room_frame) if need be:
 * then that frame is free. Where room by age is wanted but nothing can leave the GPU, the
 * allocation goes into room in host spans as static placement puts it, not into a new span
 * of host frames (the test driver's demo held 64 host frames where 36 hold what does not
 * fit). Drops d->lock. */
static bool gpu_frame_coming(struct device *d)
{
  PSA_HELD(d);
  if (psa_gpu_frame_available(d))
    return true;
  uint32_t f = psa_room_frame(d);
  if (f == PSA_NO_FRAME)
    return false;
  psa_frame_give(d, f); /* for the span below to take */
  return true;
}

/* The bytes at `want` (psa_plan_recall), where they are free: in the span that holds them,
 * or in a span made there where no span holds their chunks. Drops d->lock while frames are
 * taken. */
static struct span *place_at(struct device *d, CUdeviceptr want, uint64_t size, CUstream stream, uint64_t *off)
{
  uint64_t at = want - d->base, first = at / d->chunk_size, n = (at + size - 1) / d->chunk_size + 1 - first;
  if (want < d->base || first + n > d->nchunks)
    return NULL;
  struct span *s = d->chunks[first].span;
  if (s && (s->building || first + n > s->first_chunk + s->nchunks))
    return NULL;
  if (!s && !(s = psa_span_new(d, n, first)))
    return NULL;
  *off = at - s->first_chunk * d->chunk_size;
  return psa_span_take_at(d, s, *off, size, stream) ? s : NULL;
}

/* Static placement: where the plan's recorded iteration put the same allocation (its chunks
 * then hold what the plan moves), else room in GPU spans; once GPU frames run out (and none
 * is made by paging out), room in host spans; then the latest allocation's span grown, or a
 * new one, on GPU frames while the budget lasts, then on host frames. Drops d->lock while
 * frames are taken. */
static struct span *place(struct device *d, uint64_t size, CUstream stream, bool capture, uint64_t *off,
                          bool *recalled)
{
  PSA_HELD(d);
  CUdeviceptr want = capture ? 0 : psa_plan_recall(d, size);
  struct span *s = want ? place_at(d, want, size, stream, off) : NULL;
  *recalled = s != NULL;
  if (s || (s = carve_in(d, PSA_GPU, size, stream, off)))
    return s;
  uint64_t nchunks = (size + d->chunk_size - 1) / d->chunk_size;
  if ((!gpu_frame_coming(d) && (s = carve_in(d, PSA_HOST, size, stream, off))) ||
      (s = psa_span_extend(d, size, stream, off)))
    return s;
  s = psa_span_new(d, nchunks, PSA_ANYWHERE);
  if (s)
    *off = psa_span_take(d, s, 0, size); /* a new span is one free range of at least size */
  return s;
}

CUresult psa_alloc(int ordinal, size_t size, CUstream stream, CUdeviceptr *p)
{
  *p = 0;
  if (size == 0)
    return CUDA_SUCCESS;
  psa_meet_ranks();
  uint64_t capture = psa_stream_capture(stream);
  struct psa_relaxed relaxed PSA_RELAXED_SCOPE = psa_relax(capture || psa_capture_underway());
  psa_placing_capture(capture);
  struct device *d = device_get(ordinal);
  if (!d) /* a device refused by the configuration fails the call; any other failure passes it on */
    return ordinal >= 0 && ordinal < PSA_MAX_DEVICES && psa_devices[ordinal].refused ? CUDA_ERROR_INVALID_VALUE
                                                                                     : CUDA_ERROR_NOT_SUPPORTED;
  uint64_t asize = psa_round_up(size, PSA_ALIGN), off = 0;
  if (asize < size)
    return CUDA_ERROR_OUT_OF_MEMORY;
  ps_mutex_lock(&d->lock);
  bool recalled;
  struct span *s = place(d, asize, stream, capture, &off, &recalled);
  CUdeviceptr ptr = s ? d->base + s->first_chunk * d->chunk_size + off : 0;
  if (s && !psa_map_put(d, ptr, asize, s)) {
    psa_span_release(d, s, off, asize, stream, NULL, capture);
    s = NULL;
  }
  if (s && !capture)
    psa_plan_placed(d, ptr, asize, recalled);
  if (s && capture)
    psa_map_find(d, ptr)->graph = capture; /* the graph names it: its bytes are the graph's for good */
  if (!s) {
    d->stats.failed_allocs++;
    /* What would have held it: the live bytes and this one, less the GPU budget, on the host
     * (a lower bound: chunks also hold freed gaps); read under the lock. */
    uint64_t live = d->stats.live_bytes, need = live + asize, gpu = d->stats.gpu_budget, host = d->stats.host_budget;
    ps_mutex_unlock(&d->lock);
    ps_error("out of memory on device %d: %zu bytes asked; GPU budget (%llu MiB) and host budget (%llu MiB) are "
             "both in use, %llu MiB live: PSSHIM_HOST_BUDGET of at least %lluM would hold it",
             ordinal, size, (unsigned long long)(gpu >> 20), (unsigned long long)(host >> 20),
             (unsigned long long)(live >> 20),
             (unsigned long long)(((need > gpu ? need - gpu : 0) + d->chunk_size - 1) / d->chunk_size * d->chunk_size >> 20));
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  s->live_bytes += asize;
  s->live_allocs++;
  d->space.last_span = s;
  s->last_alloc = d->space.clock;
  psa_digest_alloc(d, asize);
  d->stats.allocs++;
  d->stats.live_bytes += asize;
  atomic_fetch_add_explicit(&live_all, asize, memory_order_relaxed);
  atomic_fetch_add_explicit(&allocs_all, 1, memory_order_relaxed);
  if (d->stats.live_bytes > d->stats.peak_live_bytes) {
    d->stats.peak_live_bytes = d->stats.live_bytes;
    d->stats.mapped_at_peak = d->stats.mapped_chunk_bytes;
  }
  if (d->stats.live_bytes > d->space.used_high)
    d->space.used_high = d->stats.live_bytes;
  if (d->stats.mapped_chunk_bytes > d->space.reserved_high)
    d->space.reserved_high = d->stats.mapped_chunk_bytes;
  uint64_t chunk = (ptr - d->base) / d->chunk_size;
  enum psa_where where = d->fr.frames[d->chunks[chunk].frame].where;
  ps_mutex_unlock(&d->lock);
  *p = ptr;
  if (pst_trace_enabled()) {
    struct pst_record r = {.type = PST_REC_ALLOC,
                           .alloc = {.addr = ptr, .size = asize, .stream = (uint64_t)(uintptr_t)stream,
                                     .stack = pst_trace_stack_here(2), .chunk = (uint32_t)chunk,
                                     .placement = where == PSA_GPU ? PST_PLACE_GPU : PST_PLACE_HOST}};
    pst_trace_emit(&r);
  }
  return CUDA_SUCCESS;
}

/* A free may come from a thread that never made a context current (a framework's
 * deleter thread): the runtime would make the primary context current, and so does psshim,
 * since the event and the synchronisation below need one. */
static void ensure_context(struct device *d)
{
  CUcontext cur = NULL;
  if (ps_driver.cuCtxGetCurrent(&cur) != CUDA_SUCCESS || !cur)
    PS_CU(ps_driver.cuCtxSetCurrent(d->ctx));
}

CUresult psa_free(CUdeviceptr p, CUstream stream, bool sync)
{
  struct device *d = device_of(p);
  if (!d)
    return CUDA_ERROR_INVALID_VALUE;
  ensure_context(d);
  psa_meet_ranks();
  bool underway = psa_capture_underway();
  uint64_t capture = sync ? 0 : psa_stream_capture(stream);
  struct psa_relaxed relaxed PSA_RELAXED_SCOPE = psa_relax(capture || underway);
  /* cudaFree and cuMemFree wait for the device; then the bytes are free for every stream.
   * While a capture is underway that wait would break it: the bytes wait until none is. */
  if (sync && !underway && PS_CU(ps_driver.cuCtxSynchronize()))
    return CUDA_ERROR_UNKNOWN;
  ps_mutex_lock(&d->lock);
  struct alloc_entry *e = psa_map_find(d, p);
  if (!e) {
    ps_mutex_unlock(&d->lock);
    ps_log(PS_LOG_WARN, "free of %#" PRIx64 ": not a live allocation (freed twice, or inside one)", (uint64_t)p);
    return CUDA_ERROR_INVALID_VALUE;
  }
  /* An event recorded in a capture could never be queried: a free there, or of memory a
   * graph names, leaves the bytes to the graph instead. */
  uint64_t hold = e->graph ? e->graph : capture ? capture : sync && underway ? PSA_AFTER_CAPTURE : 0;
  CUevent ev = NULL;
  if (!sync && !hold && (ev = psa_event_get(d)) && PS_CU(ps_driver.cuEventRecord(ev, stream))) {
    psa_event_put(d, ev);
    ev = NULL;
    if (psa_capture_underway())
      hold = PSA_AFTER_CAPTURE;
    else
      PS_CU(ps_driver.cuCtxSynchronize()); /* no event: make the free safe the slow way */
  }
  struct span *s = e->span;
  uint64_t size = e->size, off = p - (d->base + s->first_chunk * d->chunk_size);
  psa_map_remove(e);
  s->live_bytes -= size; /* before the release, so that the span's bytes add up at its check */
  psa_span_release(d, s, off, size, stream, ev, hold);
  s->live_allocs--;
  for (uint64_t i = s->first_chunk; !s->live_allocs && i < s->first_chunk + s->nchunks; i++)
    if (psa_shard_paged_in(d, i))
      psa_shard_drop(d, i); /* its bytes are dead: the node's copy is let go */
  d->stats.frees++;
  d->stats.live_bytes -= size;
  psa_frames_check(d);
  psa_marks_check(d);
  atomic_fetch_sub_explicit(&live_all, size, memory_order_relaxed);
  ps_mutex_unlock(&d->lock);
  if (pst_trace_enabled()) {
    struct pst_record r = {.type = PST_REC_FREE, .free = {.addr = p, .stream = (uint64_t)(uintptr_t)stream}};
    pst_trace_emit(&r);
  }
  return CUDA_SUCCESS;
}

void psa_mem_info(int ordinal, size_t *free_bytes, size_t *total_bytes)
{
  *free_bytes = *total_bytes = 0;
  struct device *d = device_get(ordinal);
  if (!d)
    return;
  ps_mutex_lock(&d->lock);
  uint64_t total = d->stats.gpu_budget + d->stats.host_budget;
  *total_bytes = total;
  *free_bytes = total > d->stats.live_bytes ? total - d->stats.live_bytes : 0;
  ps_mutex_unlock(&d->lock);
}

bool psa_usage_get(int ordinal, struct psa_usage *u)
{
  if (ordinal < 0 || ordinal >= PSA_MAX_DEVICES || !psa_devices[ordinal].ready)
    return false;
  struct device *d = &psa_devices[ordinal];
  ps_mutex_lock(&d->lock);
  *u = (struct psa_usage){.reserved = d->stats.mapped_chunk_bytes, .used = d->stats.live_bytes,
                          .reserved_high = d->space.reserved_high, .used_high = d->space.used_high};
  ps_mutex_unlock(&d->lock);
  return true;
}

/* As a pool's high marks are reset: to the current value. */
void psa_usage_reset_high(int ordinal, bool reserved, bool used)
{
  if (ordinal < 0 || ordinal >= PSA_MAX_DEVICES || !psa_devices[ordinal].ready)
    return;
  struct device *d = &psa_devices[ordinal];
  ps_mutex_lock(&d->lock);
  if (reserved)
    d->space.reserved_high = d->stats.mapped_chunk_bytes;
  if (used)
    d->space.used_high = d->stats.live_bytes;
  ps_mutex_unlock(&d->lock);
}

CUresult psa_chunk_migrate(int ordinal, uint64_t chunk, enum psa_where to)
{
  if (ordinal < 0 || ordinal >= PSA_MAX_DEVICES || !psa_devices[ordinal].ready || (to != PSA_GPU && to != PSA_HOST))
    return CUDA_ERROR_INVALID_VALUE;
  struct device *d = &psa_devices[ordinal];
  if (PS_CU(ps_driver.cuCtxSynchronize()))
    return CUDA_ERROR_UNKNOWN;
  ps_mutex_lock(&d->lock);
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  if (chunk < d->nchunks && d->chunks[chunk].frame != PSA_NO_FRAME) {
    psa_copy_done(d, chunk, true);
    r = d->fr.frames[d->chunks[chunk].frame].where == to ? CUDA_SUCCESS : psa_move(d, chunk, to);
    psa_copy_done(d, chunk, true);
    psa_moves_poll(d);
  }
  ps_mutex_unlock(&d->lock);
  return r;
}

void psa_atfork_prepare(void)
{
  for (int i = 0; i < PSA_MAX_DEVICES; i++)
    if (psa_devices[i].ready)
      ps_mutex_lock(&psa_devices[i].lock);
}

void psa_atfork_parent(void)
{
  for (int i = PSA_MAX_DEVICES - 1; i >= 0; i--)
    if (psa_devices[i].ready)
      ps_mutex_unlock(&psa_devices[i].lock);
}

void psa_atfork_child(void)
{
  ps_mark_forked_child();
  psa_atfork_parent();
}
