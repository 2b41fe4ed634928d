/* What bench/'s driver-API microbenchmarks share (C, and CUDA C++ under nvcc): the check of
 * a driver call (one line naming the call and its error, then exit; BENCH_NAME names the
 * program), a monotonic clock, a comparison for qsort, and VMM frames of the device or of
 * host memory (HOST_NUMA) mapped with the device's access. */
#ifndef BENCH_DRIVER_BENCH_H
#define BENCH_DRIVER_BENCH_H

#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                                      \
  do {                                                                                   \
    CUresult r_ = (call);                                                                \
    if (r_ != CUDA_SUCCESS) {                                                            \
      const char *name_ = NULL;                                                          \
      cuGetErrorName(r_, &name_);                                                        \
      fprintf(stderr, "%s: %s failed: %s\n", BENCH_NAME, #call, name_ ? name_ : "?");   \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

static inline uint64_t bench_now_ns(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static inline int bench_cmp_u64(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static inline CUmemGenericAllocationHandle bench_frame(CUdevice dev, int on_host, size_t bytes)
{
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = on_host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = on_host ? 0 : (int)dev;
  CUmemGenericAllocationHandle h;
  CHECK(cuMemCreate(&h, bytes, &p, 0));
  return h;
}

static inline void bench_map(CUdevice dev, CUdeviceptr va, CUmemGenericAllocationHandle h, size_t bytes)
{
  CUmemAccessDesc a;
  memset(&a, 0, sizeof a);
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = (int)dev;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK(cuMemMap(va, bytes, 0, h, 0));
  CHECK(cuMemSetAccess(va, bytes, &a, 1));
}

/* A new frame of `bytes` mapped at an address of its own. */
static inline CUdeviceptr bench_mapped(CUdevice dev, int on_host, size_t bytes, size_t align)
{
  CUdeviceptr va;
  CHECK(cuMemAddressReserve(&va, bytes, align, 0, 0));
  bench_map(dev, va, bench_frame(dev, on_host, bytes), bytes);
  return va;
}

/* n chunks of `chunk` bytes reserved at *base, each with a device frame, mapped, and a host
 * frame: what a remap case moves between. */
static inline void bench_chunks(CUdevice dev, CUdeviceptr *base, CUmemGenericAllocationHandle *gpu,
                                CUmemGenericAllocationHandle *host, int n, size_t chunk)
{
  CHECK(cuMemAddressReserve(base, (uint64_t)n * chunk, chunk, 0, 0));
  for (int i = 0; i < n; i++) {
    gpu[i] = bench_frame(dev, 0, chunk);
    host[i] = bench_frame(dev, 1, chunk);
    bench_map(dev, *base + (uint64_t)i * chunk, gpu[i], chunk);
  }
}

/* One JSON line: the case, how many remaps, the median, mean and 90th percentile of us[n]
 * (sorted here), then `extra` (more fields, each starting with a comma, or ""). */
static inline void bench_print_times(const char *name, uint64_t *us, int n, const char *extra)
{
  uint64_t sum = 0;
  for (int k = 0; k < n; k++)
    sum += us[k];
  qsort(us, (size_t)n, sizeof us[0], bench_cmp_u64);
  printf("{\"case\": \"%s\", \"remaps\": %d, \"median_us\": %llu, \"mean_us\": %llu, \"p90_us\": %llu%s}\n", name, n,
         (unsigned long long)us[n / 2], (unsigned long long)(sum / (uint64_t)n), (unsigned long long)us[n * 9 / 10],
         extra);
  fflush(stdout);
}

#endif
