/* What asking whether a stream captures costs the host, per call: cuStreamIsCapturing
 * against cuStreamGetCaptureInfo_v3 (which also gives the capture's id), on a stream that
 * does not capture, as psshim asks on every launch, allocation and free.
 * Build on the GPU machine: cc -O2 -std=c11 -I$CUDA/include bench/capture_query.c
 *   -L$CUDA/lib64/stubs -lcuda -o capture_query; run: ./capture_query [calls] */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv)
{
  long calls = argc > 1 ? atol(argv[1]) : 1000000;
  CUdevice dev;
  CUcontext ctx;
  CUstream s;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
      cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)) {
    fprintf(stderr, "capture_query: no CUDA device\n");
    return 1;
  }
  CUstreamCaptureStatus st;
  cuuint64_t id;
  for (int round = 0; round < 3; round++) {
    double t0 = now_ns();
    for (long i = 0; i < calls; i++)
      if (cuStreamIsCapturing(s, &st))
        return 1;
    double t1 = now_ns();
    for (long i = 0; i < calls; i++)
      if (cuStreamGetCaptureInfo_v3(s, &st, &id, NULL, NULL, NULL, NULL))
        return 1;
    double t2 = now_ns();
    printf("round %d: cuStreamIsCapturing %.1f ns, cuStreamGetCaptureInfo_v3 %.1f ns per call\n", round,
           (t1 - t0) / calls, (t2 - t1) / calls);
  }
  return 0;
}
