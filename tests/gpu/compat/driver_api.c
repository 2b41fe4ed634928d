/* A plain C program on the driver API alone (linked with -lcuda): a module loaded from PTX,
 * cuMemAlloc for its vectors, cuMemAllocAsync/cuMemFreeAsync for each step's temporaries,
 * cuLaunchKernel; its sums are in a fixed order, so two runs agree bitwise. Usage: driver_api KERNELS.ptx. Prints COMPAT {json} last. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CK(x) do { CUresult r_ = (x); if (r_) { const char *n_ = "?"; cuGetErrorName(r_, &n_); \
  fprintf(stderr, "%s: %s\n", #x, n_); return 1; } } while (0)

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  FILE *f = fopen(argv[1], "rb");
  if (!f) return 2;
  static char ptx[1 << 20];
  size_t len = fread(ptx, 1, sizeof ptx - 1, f);
  fclose(f);
  ptx[len] = 0;
  CUdevice dev;
  CUcontext ctx;
  CUmodule mod;
  CUfunction scale_add, square_sum, sum_partials;
  CUstream st;
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CK(cuModuleLoadData(&mod, ptx));
  CK(cuModuleGetFunction(&scale_add, mod, "scale_add"));
  CK(cuModuleGetFunction(&square_sum, mod, "square_sum"));
  CK(cuModuleGetFunction(&sum_partials, mod, "sum_partials"));
  CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  int n = 1 << 24, iters = 30;
  CUdeviceptr x, y;
  CK(cuMemAlloc(&x, (size_t)n * 4));
  CK(cuMemAlloc(&y, (size_t)n * 4));
  float *h = malloc((size_t)n * 4);
  for (int i = 0; i < n; i++) h[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
  CK(cuMemcpyHtoD(x, h, (size_t)n * 4));
  CK(cuMemsetD32(y, 0, n));
  double losses[64], times[64];
  unsigned blocks = (unsigned)((n + 255) / 256);
  for (int it = 0; it < iters; it++) {
    double t0 = now_ms();
    CUdeviceptr acc, partials;
    CK(cuMemAllocAsync(&acc, sizeof(double), st));
    CK(cuMemAllocAsync(&partials, blocks * sizeof(double), st));
    float a = 0.5f;
    int count = (int)blocks;
    void *p1[] = {&y, &x, &a, &n};
    CK(cuLaunchKernel(scale_add, blocks, 1, 1, 256, 1, 1, 0, st, p1, NULL));
    void *p2[] = {&y, &partials, &n};
    CK(cuLaunchKernel(square_sum, blocks, 1, 1, 256, 1, 1, 0, st, p2, NULL));
    void *p3[] = {&partials, &acc, &count};
    CK(cuLaunchKernel(sum_partials, 1, 1, 1, 256, 1, 1, 0, st, p3, NULL));
    double sum = 0;
    CK(cuMemcpyDtoHAsync(&sum, acc, sizeof sum, st));
    CK(cuMemFreeAsync(acc, st));
    CK(cuMemFreeAsync(partials, st));
    CK(cuStreamSynchronize(st));
    times[it] = now_ms() - t0;
    losses[it] = sum / n;
  }
  CK(cuMemFree(x));
  CK(cuMemFree(y));
  printf("COMPAT {\"losses\": [");
  for (int i = 0; i < iters; i++) printf("%s\"%.17g\"", i ? ", " : "", losses[i]);
  printf("], \"step_ms\": %.3f, \"peak_reserved\": %zu}\n", times[iters / 2], (size_t)n * 8 + blocks * 8 + 8);
  free(h);
  return 0;
}
