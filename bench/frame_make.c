/* How fast can frames be made, and does making them on several threads help? psshim makes
 * every chunk's frame with cuMemCreate and maps it at the frame's staging address
 * (cuMemMap + cuMemSetAccess). At 3x over budget on the 2.68B GPT the first step makes
 * ~8350 host frames of 4 MiB, and the program's threads spent 15.2 s of it making them
 * (frame_make_ns), since one pool thread keeping four frames ahead cannot keep up.
 *
 * Each case makes FRAMES frames of CHUNK bytes in all, split among T threads (1, 2, 4, 8),
 * each thread with the device's primary context, as psshim makes them: HOST_NUMA (or
 * device) memory, exportable as a POSIX file descriptor where the device allows it, mapped
 * read-write for the device. Then the frames are unmapped and released, timed too. Three
 * rounds per case; the median round is printed:
 *   {"case": "host", "threads": T, "frames": F, "make_ms": M, "frames_per_s": R, "GB_per_s": G, "release_ms": X}
 * Usage: frame_make [CHUNK_MIB=4] [FRAMES=512]
 * Build: tests/gpu/build_remap_stall.sh frame_make bench/frame_make.c */
#define BENCH_NAME "frame_make"
#include "driver_bench.h"

#include <pthread.h>

#define ROUNDS 3

struct maker {
  CUcontext ctx;
  CUdevice dev;
  int on_host, exportable;
  size_t chunk;
  int first, count; /* this thread's frames */
  CUdeviceptr base;
  CUmemGenericAllocationHandle *handles;
};

static void *make_frames(void *arg)
{
  struct maker *m = arg;
  CHECK(cuCtxSetCurrent(m->ctx));
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = m->on_host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = m->on_host ? 0 : (int)m->dev;
  if (m->exportable)
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  for (int i = m->first; i < m->first + m->count; i++) {
    CHECK(cuMemCreate(&m->handles[i], m->chunk, &p, 0));
    bench_map(m->dev, m->base + (uint64_t)i * m->chunk, m->handles[i], m->chunk);
  }
  return NULL;
}

static void *release_frames(void *arg)
{
  struct maker *m = arg;
  CHECK(cuCtxSetCurrent(m->ctx));
  for (int i = m->first; i < m->first + m->count; i++) {
    CHECK(cuMemUnmap(m->base + (uint64_t)i * m->chunk, m->chunk));
    CHECK(cuMemRelease(m->handles[i]));
  }
  return NULL;
}

/* Runs fn on `threads` threads over the frames; returns the wall time in ns. */
static uint64_t on_threads(void *(*fn)(void *), struct maker *makers, int threads)
{
  pthread_t t[8];
  uint64_t start = bench_now_ns();
  for (int k = 0; k < threads; k++)
    if (pthread_create(&t[k], NULL, fn, &makers[k])) {
      fprintf(stderr, "frame_make: no thread\n");
      exit(1);
    }
  for (int k = 0; k < threads; k++)
    pthread_join(t[k], NULL);
  return bench_now_ns() - start;
}

int main(int argc, char **argv)
{
  size_t chunk = (size_t)(argc > 1 ? atoi(argv[1]) : 4) << 20;
  int frames = argc > 2 ? atoi(argv[2]) : 512;
  if (chunk == 0 || frames < 8) {
    fprintf(stderr, "usage: frame_make [CHUNK_MIB=4] [FRAMES=512 (at least 8)]\n");
    return 2;
  }
  CHECK(cuInit(0));
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  int fd_handles = 0;
  CHECK(cuDeviceGetAttribute(&fd_handles, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev));
  CUdeviceptr base;
  CHECK(cuMemAddressReserve(&base, (uint64_t)frames * chunk, chunk, 0, 0));
  CUmemGenericAllocationHandle *handles = calloc((size_t)frames, sizeof *handles);
  if (!handles)
    return 1;
  static const int thread_counts[] = {1, 2, 4, 8};
  for (int on_host = 1; on_host >= 0; on_host--)
    for (size_t c = 0; c < sizeof thread_counts / sizeof thread_counts[0]; c++) {
      int threads = thread_counts[c];
      if (!on_host && threads > 2)
        continue; /* device frames are fast; two counts show whether they scale */
      struct maker makers[8];
      for (int k = 0; k < threads; k++)
        makers[k] = (struct maker){.ctx = ctx, .dev = dev, .on_host = on_host, .exportable = fd_handles,
                                   .chunk = chunk, .first = frames * k / threads,
                                   .count = frames * (k + 1) / threads - frames * k / threads, .base = base,
                                   .handles = handles};
      uint64_t make_ns[ROUNDS], release_ns[ROUNDS];
      for (int r = 0; r < ROUNDS; r++) {
        make_ns[r] = on_threads(make_frames, makers, threads);
        release_ns[r] = on_threads(release_frames, makers, threads);
      }
      qsort(make_ns, ROUNDS, sizeof make_ns[0], bench_cmp_u64);
      qsort(release_ns, ROUNDS, sizeof release_ns[0], bench_cmp_u64);
      double ms = (double)make_ns[ROUNDS / 2] / 1e6;
      printf("{\"case\": \"%s\", \"threads\": %d, \"frames\": %d, \"chunk_mib\": %zu, \"exportable\": %d, "
             "\"make_ms\": %.1f, \"frames_per_s\": %.0f, \"GB_per_s\": %.2f, \"release_ms\": %.1f}\n",
             on_host ? "host" : "device", threads, frames, chunk >> 20, fd_handles, ms, frames / (ms / 1e3),
             (double)frames * (double)chunk / (ms * 1e6), (double)release_ns[ROUNDS / 2] / 1e6);
      fflush(stdout);
    }
  CHECK(cuMemAddressFree(base, (uint64_t)frames * chunk));
  free(handles);
  return 0;
}
