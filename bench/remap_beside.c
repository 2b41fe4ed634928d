/* What slows a remap made on a thread of its own (the pager's mover) inside a training run?
 * Inside the 2.68B GPT at 3x over budget a mover's remap (cuMemUnmap + cuMemMap +
 * cuMemSetAccess of a 4 MiB chunk between a device and a HOST_NUMA frame) took 1.8 ms of
 * driver time against 0.25 ms on the launching thread. Here one mover thread remaps idle
 * chunks back and forth, 400 times per case, beside:
 *   idle       nothing else;
 *   poll       another thread polling cuEventQuery every 20 us (the run-ahead hold);
 *   launch     another thread bracketing work as a launch under psshim does: a small
 *              memset on its stream, an event record behind it, a stream wait on another
 *              event, nonstop;
 *   pcie       copies of 4 MiB both ways between other device and host frames, kept queued
 *              on two streams (kernels reading host frames in place load PCIe as they do);
 *   launch+pcie both;
 *   evict      no other thread; the mover queues a 4 MiB device-to-host copy after each
 *              remap, as a burst of page-outs does;
 *   evict+launch both;
 *   busy       the GPU kept busy: a queue of 256 MiB memsets (~64 of them, milliseconds of
 *              work) kept full by another thread, as the run-ahead keeps the GPU's queue;
 *   busy+poll  and a thread polling, every 20 us, an event recorded at that queue's end (not
 *              yet reached: the run-ahead hold waits on such a one);
 *   callback   the launch-like thread of `launch` observed through a CUPTI driver callback,
 *              as psshim observes launches, which spends 200 us in the callback (as
 *              psshim's run-ahead hold does inside the launch's callback): does a thread
 *              inside a callback hold back another thread's remap?
 * Prints one line per case: {"case": ..., "remaps": N, "median_us": M, "mean_us": A, "p90_us": P}.
 * Build: tests/gpu/build_remap_stall.sh remap_beside bench/remap_beside.c */
#define BENCH_NAME "remap_beside"
#include "driver_bench.h"

#include <cupti.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


enum { CHUNK = 4 << 20, MOVED = 32, COPIERS = 8, REMAPS = 400 };

static CUcontext ctx;
static CUdevice dev;
static CUdeviceptr base;                            /* MOVED chunks the mover remaps */
static CUmemGenericAllocationHandle gpu[MOVED], host[MOVED];
static CUdeviceptr copy_dev[COPIERS], copy_host[COPIERS]; /* the PCIe load's frames, mapped */
static atomic_bool stop_others;
static CUdeviceptr big;                 /* the busy queue's memset target */
static _Atomic(CUevent) busy_tail;      /* an event at the busy queue's end */

static void map(CUdeviceptr va, CUmemGenericAllocationHandle h) { bench_map(dev, va, h, CHUNK); }

static void *poller(void *arg)
{
  (void)arg;
  CHECK(cuCtxSetCurrent(ctx));
  CUstream s;
  CUevent e;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CHECK(cuMemsetD8Async(copy_dev[0], 0, CHUNK, s));
  CHECK(cuEventRecord(e, s));
  const struct timespec nap = {0, 20000};
  while (!atomic_load(&stop_others)) {
    CUresult r = cuEventQuery(e);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY)
      CHECK(r);
    nanosleep(&nap, NULL);
  }
  return NULL;
}

static void *launcher(void *arg)
{
  (void)arg;
  CHECK(cuCtxSetCurrent(ctx));
  CUstream s, t;
  CUevent e[2];
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING));
  for (int i = 0; i < 2; i++)
    CHECK(cuEventCreate(&e[i], CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventRecord(e[1], t));
  for (uint64_t n = 0; !atomic_load(&stop_others); n++) {
    CHECK(cuMemsetD8Async(copy_dev[1], (unsigned char)n, 1024, s));
    CHECK(cuEventRecord(e[0], s));
    CHECK(cuStreamWaitEvent(s, e[1], 0));
    if (n % 256 == 0)
      CHECK(cuStreamSynchronize(s)); /* a bounded queue, as the run-ahead keeps it */
  }
  CHECK(cuStreamSynchronize(s));
  return NULL;
}

static void *copier(void *arg)
{
  (void)arg;
  CHECK(cuCtxSetCurrent(ctx));
  CUstream in, out;
  CHECK(cuStreamCreate(&in, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&out, CU_STREAM_NON_BLOCKING));
  for (uint64_t n = 0; !atomic_load(&stop_others); n++) {
    int i = (int)(n % (COPIERS / 2));
    CHECK(cuMemcpyAsync(copy_dev[i], copy_host[i], CHUNK, in));
    CHECK(cuMemcpyAsync(copy_host[i + COPIERS / 2], copy_dev[i + COPIERS / 2], CHUNK, out));
    if (n % 16 == 15) { /* 16 of each queued at most */
      CHECK(cuStreamSynchronize(in));
      CHECK(cuStreamSynchronize(out));
    }
  }
  CHECK(cuStreamSynchronize(in));
  CHECK(cuStreamSynchronize(out));
  return NULL;
}

static atomic_bool in_callback_sleep; /* the callback case: the observer sleeps */

static void CUPTIAPI observer(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data)
{
  (void)user;
  const CUpti_CallbackData *cb = data;
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API || cbid != CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async ||
      cb->callbackSite != CUPTI_API_ENTER || !atomic_load(&in_callback_sleep))
    return;
  const struct timespec hold = {0, 200000};
  nanosleep(&hold, NULL);
}

#define BIG (256ull << 20)

static void *filler(void *arg)
{
  (void)arg;
  CHECK(cuCtxSetCurrent(ctx));
  CUstream s;
  CUevent ring[4];
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  for (int i = 0; i < 4; i++)
    CHECK(cuEventCreate(&ring[i], CU_EVENT_DISABLE_TIMING));
  for (uint64_t n = 0; !atomic_load(&stop_others); n++) {
    CHECK(cuMemsetD8Async(big, (unsigned char)n, BIG, s));
    if (n % 16 == 15) { /* an event every 16 memsets; the queue holds at most 4 of them */
      CUevent e = ring[(n / 16) % 4];
      if (n >= 64)
        CHECK(cuEventSynchronize(e));
      CHECK(cuEventRecord(e, s));
      atomic_store(&busy_tail, e);
    }
  }
  CHECK(cuStreamSynchronize(s));
  atomic_store(&busy_tail, NULL);
  return NULL;
}

static void *tail_poller(void *arg)
{
  (void)arg;
  CHECK(cuCtxSetCurrent(ctx));
  const struct timespec nap = {0, 20000};
  while (!atomic_load(&stop_others)) {
    CUevent e = atomic_load(&busy_tail);
    if (e) {
      CUresult r = cuEventQuery(e);
      if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY)
        CHECK(r);
    }
    nanosleep(&nap, NULL);
  }
  return NULL;
}

/* The mover: REMAPS remaps of the MOVED chunks, each onto its other frame; evict: a 4 MiB
 * device-to-host copy queued after each, from a device frame to a host frame. */
static void run_case(const char *name, bool poll, bool launch, bool pcie, bool evict, bool busy, bool tail_poll)
{
  static bool on_host[MOVED];
  static uint64_t us[REMAPS];
  pthread_t others[5];
  int nothers = 0;
  atomic_store(&stop_others, false);
  if (busy)
    pthread_create(&others[nothers++], NULL, filler, NULL);
  if (tail_poll)
    pthread_create(&others[nothers++], NULL, tail_poller, NULL);
  if (poll)
    pthread_create(&others[nothers++], NULL, poller, NULL);
  if (launch)
    pthread_create(&others[nothers++], NULL, launcher, NULL);
  if (pcie)
    pthread_create(&others[nothers++], NULL, copier, NULL);
  CUstream out;
  CHECK(cuStreamCreate(&out, CU_STREAM_NON_BLOCKING));
  struct timespec settle = {0, 50000000};
  nanosleep(&settle, NULL);
  for (int k = 0; k < REMAPS; k++) {
    int i = k % MOVED;
    CUdeviceptr va = base + (uint64_t)i * CHUNK;
    uint64_t start = bench_now_ns();
    CHECK(cuMemUnmap(va, CHUNK));
    on_host[i] = !on_host[i];
    map(va, on_host[i] ? host[i] : gpu[i]);
    us[k] = (bench_now_ns() - start) / 1000;
    if (evict)
      CHECK(cuMemcpyAsync(copy_host[COPIERS - 1], copy_dev[COPIERS - 1], CHUNK, out));
  }
  CHECK(cuStreamSynchronize(out));
  CHECK(cuStreamDestroy(out));
  atomic_store(&stop_others, true);
  for (int i = 0; i < nothers; i++)
    pthread_join(others[i], NULL);
  bench_print_times(name, us, REMAPS, "");
}

int main(void)
{
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  bench_chunks(dev, &base, gpu, host, MOVED, CHUNK);
  for (int i = 0; i < COPIERS; i++) {
    copy_dev[i] = bench_mapped(dev, false, CHUNK, CHUNK);
    copy_host[i] = bench_mapped(dev, true, CHUNK, CHUNK);
  }
  CHECK(cuMemAlloc(&big, BIG));
  run_case("idle", false, false, false, false, false, false);
  run_case("poll", true, false, false, false, false, false);
  run_case("launch", false, true, false, false, false, false);
  run_case("pcie", false, false, true, false, false, false);
  run_case("launch+pcie", false, true, true, false, false, false);
  run_case("evict", false, false, false, true, false, false);
  run_case("evict+launch", false, true, false, true, false, false);
  run_case("busy", false, false, false, false, true, false);
  run_case("busy+poll", false, false, false, false, true, true);
  run_case("busy+launch", false, true, false, false, true, false);
  CUpti_SubscriberHandle sub;
  if (cuptiSubscribe(&sub, observer, NULL) != CUPTI_SUCCESS ||
      cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async) != CUPTI_SUCCESS) {
    fprintf(stderr, "remap_beside: CUPTI subscription failed\n");
    return 1;
  }
  run_case("launch observed", false, true, false, false, false, false);
  atomic_store(&in_callback_sleep, true);
  run_case("callback", false, true, false, false, false, false);
  atomic_store(&in_callback_sleep, false);
  run_case("idle again", false, false, false, false, false, false);
  return 0;
}
