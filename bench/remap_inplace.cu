/* Does a remap cost more when made on a thread of its own than on the thread that launches,
 * while kernels read host memory in place? Inside the 2.68B GPT's training at 3x a remap on
 * the pager's mover thread took 1.7-1.8 ms of driver time against 0.2 ms on the launching
 * thread (`git show 50f48a8:bench/results/README.md`, "A mover thread, opt-in");
 * bench/remap_beside.c found only queued PCIe copies slowing a remap, with nothing
 * launching kernels that read host memory. Here
 * 4 MiB chunks are remapped between a device and a HOST_NUMA frame, 300 times per case:
 *   idle            nothing else runs;
 *   inplace-same    one thread keeps kernels queued (at most 4) that read a 512 MiB host
 *                   frame in place across PCIe, and remaps once after each launch;
 *   inplace-other   one thread keeps those kernels queued, another remaps nonstop;
 *   copies-same     the same with 4 MiB copies both ways (16 queued each way) instead of
 *   copies-other    kernels.
 * Prints one line per case: {"case": ..., "remaps": N, "median_us": M, "mean_us": A, "p90_us": P,
 * "work_per_s": W} (W: kernels or copy pairs completed per second beside the remaps).
 * Build: tests/gpu/build_remap_stall.sh remap_inplace bench/remap_inplace.cu */
#define BENCH_NAME "remap_inplace"
#include "driver_bench.h"

#include <cuda_runtime.h>
#include <atomic>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK_RT(call)                                                                   \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "remap_inplace: %s failed: %s\n", #call, cudaGetErrorName(e_));    \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

enum { CHUNK = 4 << 20, MOVED = 32, REMAPS = 300, QUEUED = 4, COPY_DEPTH = 16 };
#define HOST_BYTES (512ull << 20)

static CUcontext ctx;
static CUdevice dev;
static CUdeviceptr base, host_buf, dev_sink, copy_dev, copy_host;
static CUmemGenericAllocationHandle gpu[MOVED], host[MOVED];
static bool on_host[MOVED];
static std::atomic<bool> stop_work;
static std::atomic<unsigned long long> work_done;

__global__ void read_in_place(const uint4 *p, size_t n, unsigned *sink)
{
  unsigned acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) /* never in practice: keeps the loads */
    sink[0] = acc;
}

/* One remap of chunk k % MOVED onto its other frame; its microseconds. */
static uint64_t remap_one(int k)
{
  int i = k % MOVED;
  CUdeviceptr va = base + (uint64_t)i * CHUNK;
  uint64_t start = bench_now_ns();
  CHECK(cuMemUnmap(va, CHUNK));
  on_host[i] = !on_host[i];
  bench_map(dev, va, on_host[i] ? host[i] : gpu[i], CHUNK);
  return (bench_now_ns() - start) / 1000;
}

/* Queues one unit of work on s (a kernel reading the host frame, or a copy each way) and
 * keeps at most `depth` queued, waiting on the oldest beyond that. */
static void queue_work(bool kernels, CUstream s, CUstream s2, cudaEvent_t *ring, int depth, uint64_t n)
{
  if (kernels) {
    read_in_place<<<264, 512, 0, (cudaStream_t)s>>>((const uint4 *)host_buf, HOST_BYTES / sizeof(uint4),
                                                    (unsigned *)dev_sink);
    CHECK_RT(cudaGetLastError());
  } else {
    CHECK(cuMemcpyAsync(copy_dev, copy_host, CHUNK, s));
    CHECK(cuMemcpyAsync(copy_host + CHUNK, copy_dev + CHUNK, CHUNK, s2));
  }
  cudaEvent_t e = ring[n % depth];
  if (n >= (uint64_t)depth) {
    CHECK_RT(cudaEventSynchronize(e));
    work_done.fetch_add(1);
  }
  CHECK_RT(cudaEventRecord(e, (cudaStream_t)(kernels ? s : s2)));
}

struct worker_args {
  bool kernels;
};

static void *worker(void *arg)
{
  const struct worker_args *w = (const struct worker_args *)arg;
  CHECK(cuCtxSetCurrent(ctx));
  CUstream s, s2;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  int depth = w->kernels ? QUEUED : COPY_DEPTH;
  cudaEvent_t ring[COPY_DEPTH];
  for (int i = 0; i < depth; i++)
    CHECK_RT(cudaEventCreateWithFlags(&ring[i], cudaEventDisableTiming));
  for (uint64_t n = 0; !stop_work.load(); n++)
    queue_work(w->kernels, s, s2, ring, depth, n);
  CHECK(cuStreamSynchronize(s));
  CHECK(cuStreamSynchronize(s2));
  return NULL;
}

/* work: 0 none, 1 kernels, 2 copies; same: the remapping thread also queues the work. */
static void run_case(const char *name, int work, bool same)
{
  static uint64_t us[REMAPS];
  pthread_t other;
  struct worker_args w = {work == 1};
  stop_work.store(false);
  work_done.store(0);
  CUstream s, s2;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  cudaEvent_t ring[COPY_DEPTH];
  int depth = work == 1 ? QUEUED : COPY_DEPTH;
  for (int i = 0; i < depth; i++)
    CHECK_RT(cudaEventCreateWithFlags(&ring[i], cudaEventDisableTiming));
  if (work && !same)
    pthread_create(&other, NULL, worker, &w);
  if (work && same) /* fill the queue first, as a run-ahead keeps it full */
    for (int i = 0; i < depth; i++)
      queue_work(work == 1, s, s2, ring, depth, (uint64_t)i);
  struct timespec settle = {0, 50000000};
  nanosleep(&settle, NULL);
  uint64_t start = bench_now_ns();
  for (int k = 0; k < REMAPS; k++) {
    if (work && same)
      queue_work(work == 1, s, s2, ring, depth, (uint64_t)(k + depth));
    us[k] = remap_one(k);
  }
  double secs = (double)(bench_now_ns() - start) / 1e9;
  stop_work.store(true);
  if (work && !same)
    pthread_join(other, NULL);
  CHECK(cuStreamSynchronize(s));
  CHECK(cuStreamSynchronize(s2));
  char extra[64];
  snprintf(extra, sizeof extra, ", \"work_per_s\": %.1f", (double)work_done.load() / secs);
  bench_print_times(name, us, REMAPS, extra);
}

int main(void)
{
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CHECK_RT(cudaSetDevice(0)); /* the runtime on the same primary context */
  bench_chunks(dev, &base, gpu, host, MOVED, CHUNK);
  host_buf = bench_mapped(dev, true, HOST_BYTES, CHUNK);
  CHECK(cuMemsetD8(host_buf, 1, HOST_BYTES));
  dev_sink = bench_mapped(dev, false, CHUNK, CHUNK);
  copy_dev = bench_mapped(dev, false, 2 * CHUNK, CHUNK);
  copy_host = bench_mapped(dev, true, 2 * CHUNK, CHUNK);
  run_case("idle", 0, false);
  run_case("inplace-same", 1, true);
  run_case("inplace-other", 1, false);
  run_case("copies-same", 2, true);
  run_case("copies-other", 2, false);
  run_case("idle again", 0, false);
  return 0;
}
