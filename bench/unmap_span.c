/* Can one cuMemUnmap take back a whole span, and what does it save? psshim takes an idle
 * span's frames back for page-outs by unmapping its chunks one by one: on ResNet-50 at half
 * its peak that was most of the 76 ms a step its plans spent beyond moves and surveys
 * (bench/results/README.md). The driver's documentation says the range "must be the entire
 * contiguous address range that was mapped to", which leaves open whether a range holding
 * several mappings (one per chunk, each its own host frame) may go in one call.
 * For spans of 4, 16 and 64 chunks of 4 MiB on HOST_NUMA frames, REPEATS times each:
 *   per_chunk  one cuMemUnmap per chunk, as psshim does now;
 *   one_call   one cuMemUnmap over the span; where the driver refuses it, its error is
 *              printed once and the chunks are unmapped one by one.
 * After each, the span is mapped again and a chunk's first bytes are read back through
 * the device to show the frames came through whole. One JSON line per case and span:
 * {"case": ..., "remaps": REPEATS, "median_us": M, "mean_us": A, "p90_us": P, "chunks": N,
 *  "result": the first one_call's result}, the times those of taking the span's mappings down.
 * The test driver takes one call (it proves nothing about the driver).
 * Build: tests/gpu/build_remap_stall.sh unmap_span bench/unmap_span.c */
#define BENCH_NAME "unmap_span"
#include "driver_bench.h"

enum { CHUNK = 4 << 20, REPEATS = 50, MOST = 64 };

static CUdevice dev;

static void map_span(CUdeviceptr base, const CUmemGenericAllocationHandle *h, int n)
{
  for (int i = 0; i < n; i++)
    bench_map(dev, base + (uint64_t)i * CHUNK, h[i], CHUNK);
}

static void unmap_each(CUdeviceptr base, int n)
{
  for (int i = 0; i < n; i++)
    CHECK(cuMemUnmap(base + (uint64_t)i * CHUNK, CHUNK));
}

/* The span's frames hold their chunk's index in the first word: read back after a remap. */
static void check_span(CUdeviceptr base, int n)
{
  for (int i = 0; i < n; i++) {
    uint32_t got = 0;
    CHECK(cuMemcpyDtoH(&got, base + (uint64_t)i * CHUNK, sizeof got));
    if (got != (uint32_t)i) {
      fprintf(stderr, "unmap_span: chunk %d of %d reads %u after mapping again\n", i, n, got);
      exit(1);
    }
  }
}

static void run_case(const char *name, CUdeviceptr base, const CUmemGenericAllocationHandle *h, int n, int one_call)
{
  uint64_t us[REPEATS];
  CUresult first = CUDA_SUCCESS;
  for (int k = 0; k < REPEATS; k++) {
    uint64_t start = bench_now_ns();
    CUresult r = one_call ? cuMemUnmap(base, (size_t)n * CHUNK) : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS && k == 0)
      first = r;
    if (!one_call || r != CUDA_SUCCESS)
      unmap_each(base, n);
    us[k] = (bench_now_ns() - start) / 1000;
    map_span(base, h, n);
    check_span(base, n);
  }
  const char *result = NULL;
  cuGetErrorName(first, &result);
  char extra[96];
  snprintf(extra, sizeof extra, ", \"chunks\": %d, \"result\": \"%s\"", n, result ? result : "?");
  bench_print_times(name, us, REPEATS, extra);
}

int main(void)
{
  CUcontext ctx;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CUmemGenericAllocationHandle h[MOST];
  CUdeviceptr base;
  CHECK(cuMemAddressReserve(&base, (size_t)MOST * CHUNK, CHUNK, 0, 0));
  for (int i = 0; i < MOST; i++) {
    h[i] = bench_frame(dev, 1, CHUNK);
    bench_map(dev, base + (uint64_t)i * CHUNK, h[i], CHUNK);
    uint32_t mark = (uint32_t)i;
    CHECK(cuMemcpyHtoD(base + (uint64_t)i * CHUNK, &mark, sizeof mark));
  }
  unmap_each(base, MOST);
  const int spans[] = {4, 16, MOST};
  for (int s = 0; s < 3; s++) {
    int n = spans[s];
    map_span(base, h, n);
    run_case("per_chunk", base, h, n, 0);
    run_case("one_call", base, h, n, 1);
    unmap_each(base, n);
  }
  for (int i = 0; i < MOST; i++)
    CHECK(cuMemRelease(h[i]));
  CHECK(cuMemAddressFree(base, (size_t)MOST * CHUNK));
  return 0;
}
