/* What does remapping an idle 16 MiB range (cuMemUnmap + cuMemMap + cuMemSetAccess) cost,
 * and does it slow the GPU work running beside it? The pager remaps hundreds of chunks a
 * step while kernels run. One stream runs a fixed queue of large memsets (the "kernels":
 * 3000 of 256 MiB, ~60 us each, or 188 of 4 GiB, ~1 ms each, as a training step's GEMMs;
 * does a remap wait for the kernel running?);
 * the host thread that queues them remaps a separate, idle range every K memsets, as the
 * launching thread does under psshim, between two device frames or between a device and
 * a host (HOST_NUMA) frame, with or without 2000 other 16 MiB chunks mapped in the same
 * reservation (as psshim's chunk space has; or 1024 mapped host frames, 16 GiB pinned, as
 * psshim's host frames at 1.25x the budget), and with or without a copy just queued on a
 * second stream that reads the range's frame through another mapping (as the pager's
 * copies read a frame through its staging address). Prints, per case, the GPU time of the
 * queue (events) against the same queue with no remaps, and the host time of each call:
 *   {"frames": F, "others": N, "others_on": O, "copy_in_flight": C, "memset_mib": S, "remap_every": K, "remaps": R,
 *    "gpu_ms": G, "base_gpu_ms": B, "unmap_us": U, "map_us": M, "access_us": A}
 * Build: tests/gpu/build_remap_stall.sh remap_stall */
#define BENCH_NAME "remap_stall"
#include "driver_bench.h"

#include <cupti.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


enum { CHUNK = 16 << 20, OTHERS = 2000, HOST_OTHERS = 1024 };
#define WORK_BYTES (3000ull << 28) /* the whole queue's memset bytes */
#define LONG_MEMSET (4ull << 30)

struct queue {
  CUstream s;
  CUdeviceptr work; /* LONG_MEMSET bytes */
  size_t memset_bytes; /* each memset's */
  const char *cupti; /* "off"; "attached": subscribed, remaps on the host thread; "in_callback" */
};

static double now_us(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

struct range {
  CUdeviceptr va; /* the remapped chunk: the first of the reservation */
  CUdeviceptr staging; /* both frames again, mapped side by side: what copies read */
  CUdeviceptr scratch; /* where they copy to */
  CUstream copy_stream; /* NULL: no copy before each remap */
  CUmemGenericAllocationHandle frames[2];
  CUmemAccessDesc access;
  int mapped;
  double unmap_us, map_us, access_us;
};

static void remap(void *arg)
{
  struct range *r = arg;
  if (r->copy_stream)
    CHECK(cuMemcpyAsync(r->scratch, r->staging + (size_t)r->mapped * CHUNK, CHUNK, r->copy_stream));
  double t0 = now_us();
  CHECK(cuMemUnmap(r->va, CHUNK));
  double t1 = now_us();
  r->mapped ^= 1;
  CHECK(cuMemMap(r->va, CHUNK, 0, r->frames[r->mapped], 0));
  double t2 = now_us();
  CHECK(cuMemSetAccess(r->va, CHUNK, &r->access, 1));
  double t3 = now_us();
  r->unmap_us += t1 - t0;
  r->map_us += t2 - t1;
  r->access_us += t3 - t2;
}

/* The remaps done from CUPTI's callback at the return of each memset, as the pager moves
 * chunks from inside a launch's callback. */
static struct {
  void (*remap)(void *);
  void *arg;
  int every, calls, *remaps;
} in_callback;

static void CUPTIAPI on_memset(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void *data)
{
  (void)user, (void)domain, (void)id;
  const CUpti_CallbackData *cb = data;
  if (cb->callbackSite != CUPTI_API_EXIT || !in_callback.remap || ++in_callback.calls % in_callback.every)
    return;
  in_callback.remap(in_callback.arg);
  (*in_callback.remaps)++;
}

/* Queues WORK_BYTES of memsets, calling remap(arg) every `every` of them (0: never);
 * returns the GPU ms. */
static float run_queue(const struct queue *q, void (*remap)(void *), void *arg, int every, int *remaps)
{
  CUstream s = q->s;
  bool from_callback = every && strcmp(q->cupti, "in_callback") == 0;
  if (from_callback)
    in_callback.remap = remap, in_callback.arg = arg, in_callback.every = every, in_callback.calls = 0,
    in_callback.remaps = remaps;
  CUevent start, stop;
  CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
  CHECK(cuEventCreate(&stop, CU_EVENT_DEFAULT));
  CHECK(cuEventRecord(start, s));
  for (int i = 0; i < (int)(WORK_BYTES / q->memset_bytes); i++) {
    CHECK(cuMemsetD32Async(q->work, (unsigned)i, q->memset_bytes / 4, s));
    if (every && !from_callback && i % every == every - 1) {
      remap(arg);
      (*remaps)++;
    }
  }
  in_callback.remap = NULL;
  CHECK(cuEventRecord(stop, s));
  CHECK(cuEventSynchronize(stop));
  float ms = 0;
  CHECK(cuEventElapsedTime(&ms, start, stop));
  CHECK(cuEventDestroy(start));
  CHECK(cuEventDestroy(stop));
  return ms;
}

static CUmemGenericAllocationHandle make_frame(CUmemLocation where, size_t size)
{
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED, .location = where};
  CUmemGenericAllocationHandle h;
  CHECK(cuMemCreate(&h, size, &prop, 0));
  return h;
}

/* One case: frames[1] on the host or not, `others` more chunks mapped after the first
 * (sharing one device frame, or each its own host frame: pinned host memory as psshim's
 * host frames hold it), a copy queued before each remap or not. */
static void run_case(const struct queue *q, CUdevice dev, int host, int others, int others_on_host,
                     CUstream copy_stream)
{
  CUmemLocation gpu = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev};
  CUmemLocation numa = {.type = CU_MEM_LOCATION_TYPE_HOST_NUMA, .id = 0};
  struct range r = {.access = {.location = gpu, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE}};
  size_t span = (size_t)(others + 1) * CHUNK;
  CHECK(cuMemAddressReserve(&r.va, span, 0, 0, 0));
  r.frames[0] = make_frame(gpu, CHUNK);
  r.frames[1] = make_frame(host ? numa : gpu, CHUNK);
  CUmemGenericAllocationHandle *other = calloc((size_t)others + 1, sizeof *other);
  if (!other)
    exit(1);
  for (int i = 0; i < others; i++)
    other[i] = others_on_host ? make_frame(numa, CHUNK) : i ? other[0] : make_frame(gpu, CHUNK);
  r.copy_stream = copy_stream;
  CHECK(cuMemAddressReserve(&r.staging, 2 * CHUNK, 0, 0, 0));
  for (int i = 0; i < 2; i++) {
    CHECK(cuMemMap(r.staging + (size_t)i * CHUNK, CHUNK, 0, r.frames[i], 0));
    CHECK(cuMemSetAccess(r.staging + (size_t)i * CHUNK, CHUNK, &r.access, 1));
  }
  CHECK(cuMemAlloc(&r.scratch, CHUNK));
  for (int i = 0; i <= others; i++) {
    CHECK(cuMemMap(r.va + (size_t)i * CHUNK, CHUNK, 0, i ? other[i - 1] : r.frames[0], 0));
    CHECK(cuMemSetAccess(r.va + (size_t)i * CHUNK, CHUNK, &r.access, 1));
  }
  int none = 0;
  run_queue(q, remap, &r, 4, &none); /* warm-up */
  const int every[] = {1, 16};
  for (size_t k = 0; k < sizeof every / sizeof every[0]; k++) {
    int remaps = 0;
    r.unmap_us = r.map_us = r.access_us = 0;
    float base = run_queue(q, remap, &r, 0, &none);
    float ms = run_queue(q, remap, &r, every[k], &remaps);
    printf("{\"frames\": \"%s\", \"others\": %d, \"others_on\": \"%s\", \"copy_in_flight\": %d, \"memset_mib\": %zu, "
           "\"cupti\": \"%s\", "
           "\"remap_every\": %d, \"remaps\": %d, \"gpu_ms\": %.2f, \"base_gpu_ms\": %.2f, \"unmap_us\": %.1f, "
           "\"map_us\": %.1f, \"access_us\": %.1f}\n",
           host ? "device<->host" : "device<->device", others, others_on_host ? "host" : "device",
           copy_stream != NULL, q->memset_bytes >> 20, q->cupti, every[k], remaps, ms, base, r.unmap_us / remaps, r.map_us / remaps,
           r.access_us / remaps);
  }
  CHECK(cuCtxSynchronize());
  CHECK(cuMemUnmap(r.staging, 2 * CHUNK));
  CHECK(cuMemAddressFree(r.staging, 2 * CHUNK));
  CHECK(cuMemFree(r.scratch));
  CHECK(cuMemUnmap(r.va, span));
  CHECK(cuMemRelease(r.frames[0]));
  CHECK(cuMemRelease(r.frames[1]));
  for (int i = 0; i < others; i++)
    if (others_on_host || i == 0)
      CHECK(cuMemRelease(other[i]));
  free(other);
  CHECK(cuMemAddressFree(r.va, span));
}

/* "batch": n chunks side by side, each with a device and a host frame, all moved to their
 * other frames at once: each chunk on its own (unmap, map, access), or as the pager could
 * batch them, one cuMemUnmap and one cuMemSetAccess over the whole range and a cuMemMap per
 * chunk (CUDA takes a range spanning several mappings). */
struct batch {
  CUdeviceptr va;
  size_t size; /* a chunk's */
  int n, side; /* side: 0 device frames mapped, 1 host */
  bool batched;
  CUmemGenericAllocationHandle *frames; /* [side * n + i] */
  CUmemAccessDesc access;
  double unmap_us, map_us, access_us;
};

static void move_batch(void *arg)
{
  struct batch *b = arg;
  int ranges = b->batched ? 1 : b->n, per = b->batched ? b->n : 1;
  b->side ^= 1;
  for (int k = 0; k < ranges; k++) {
    CUdeviceptr va = b->va + (size_t)k * b->size;
    double t0 = now_us();
    CHECK(cuMemUnmap(va, (size_t)per * b->size));
    double t1 = now_us();
    for (int i = 0; i < per; i++)
      CHECK(cuMemMap(va + (size_t)i * b->size, b->size, 0, b->frames[b->side * b->n + k + i], 0));
    double t2 = now_us();
    CHECK(cuMemSetAccess(va, (size_t)per * b->size, &b->access, 1));
    double t3 = now_us();
    b->unmap_us += t1 - t0;
    b->map_us += t2 - t1;
    b->access_us += t3 - t2;
  }
}

/* One batch case beside the memset queue, a batch every 16 memsets (~1 ms of GPU work).
 * Prints the host time per chunk moved and the queue's GPU time against none moved. */
static void run_batch(const struct queue *q, CUdevice dev, size_t size, int n, bool batched)
{
  CUmemLocation gpu = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev};
  CUmemLocation numa = {.type = CU_MEM_LOCATION_TYPE_HOST_NUMA, .id = 0};
  struct batch b = {.size = size, .n = n, .batched = batched,
                    .access = {.location = gpu, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE}};
  if (!(b.frames = calloc(2 * (size_t)n, sizeof *b.frames)))
    exit(1);
  CHECK(cuMemAddressReserve(&b.va, (size_t)n * size, 0, 0, 0));
  for (int i = 0; i < 2 * n; i++)
    b.frames[i] = make_frame(i < n ? gpu : numa, size);
  for (int i = 0; i < n; i++)
    CHECK(cuMemMap(b.va + (size_t)i * size, size, 0, b.frames[i], 0));
  CHECK(cuMemSetAccess(b.va, (size_t)n * size, &b.access, 1));
  int none = 0, batches = 0;
  run_queue(q, move_batch, &b, 16, &none); /* warm-up */
  b.unmap_us = b.map_us = b.access_us = 0;
  float base = run_queue(q, move_batch, &b, 0, &none);
  float ms = run_queue(q, move_batch, &b, 16, &batches);
  double moved = (double)batches * n;
  printf("{\"batch\": %d, \"chunk_mib\": %zu, \"one_call_per_range\": %d, \"batches\": %d, \"gpu_ms\": %.2f, "
         "\"base_gpu_ms\": %.2f, \"unmap_us\": %.1f, \"map_us\": %.1f, \"access_us\": %.1f, \"us_per_chunk\": %.1f}\n",
         n, size >> 20, batched, batches, ms, base, b.unmap_us / moved, b.map_us / moved, b.access_us / moved,
         (b.unmap_us + b.map_us + b.access_us) / moved);
  CHECK(cuCtxSynchronize());
  CHECK(cuMemUnmap(b.va, (size_t)n * size));
  for (int i = 0; i < 2 * n; i++)
    CHECK(cuMemRelease(b.frames[i]));
  CHECK(cuMemAddressFree(b.va, (size_t)n * size));
  free(b.frames);
}

#define CUPTI_CHECK(call)                                                                \
  do {                                                                                   \
    if ((call) != CUPTI_SUCCESS) {                                                       \
      fprintf(stderr, "remap_stall: %s failed\n", #call);                                \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

/* remap_stall [long|cupti|batch]: every case with 256 MiB memsets, then the long-kernel cases;
 * "long": only those; "cupti": device<->host remaps with CUPTI off, then subscribed to the
 * memsets' callbacks (as psshim's tracer is) with remaps on the host thread, then with the
 * remaps made inside the callback (as the pager's are); "batch": the batch cases. */
int main(int argc, char **argv)
{
  CUdevice dev;
  CUcontext ctx;
  struct queue q = {.memset_bytes = 256 << 20, .cupti = "off"};
  const char *mode = argc > 1 ? argv[1] : "all";
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CHECK(cuStreamCreate(&q.s, CU_STREAM_NON_BLOCKING));
  CHECK(cuMemAlloc(&q.work, LONG_MEMSET));
  CUstream copies;
  CHECK(cuStreamCreate(&copies, CU_STREAM_NON_BLOCKING));
  if (strcmp(mode, "batch") == 0) {
    const size_t sizes[] = {4 << 20, 16 << 20};
    const int counts[] = {1, 8, 64};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
      for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
        for (int batched = 0; batched < 2; batched++)
          if (counts[c] > 1 || !batched) /* one chunk: both ways are the same calls */
            run_batch(&q, dev, sizes[k], counts[c], batched);
  } else if (strcmp(mode, "cupti") == 0) {
    run_case(&q, dev, 1, 0, 0, NULL);
    CUpti_SubscriberHandle sub;
    CUPTI_CHECK(cuptiSubscribe(&sub, on_memset, NULL));
    CUPTI_CHECK(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async));
    q.cupti = "attached";
    run_case(&q, dev, 1, 0, 0, NULL);
    q.cupti = "in_callback";
    run_case(&q, dev, 1, 0, 0, NULL);
    CUPTI_CHECK(cuptiUnsubscribe(sub));
  } else {
    if (strcmp(mode, "long") != 0) {
      for (int host = 0; host < 2; host++) {
        run_case(&q, dev, host, 0, 0, NULL);
        run_case(&q, dev, host, OTHERS, 0, NULL);
        run_case(&q, dev, host, 0, 0, copies);
      }
      run_case(&q, dev, 1, HOST_OTHERS, 1, NULL); /* 16 GiB pinned, as psshim's host frames at 1.25x */
    }
    q.memset_bytes = LONG_MEMSET;
    for (int host = 0; host < 2; host++)
      run_case(&q, dev, host, 0, 0, NULL);
  }
  CHECK(cuStreamDestroy(copies));
  CHECK(cuMemFree(q.work));
  CHECK(cuStreamDestroy(q.s));
  return 0;
}
