/* Latency of a cudaMallocAsync + cudaFreeAsync pair on one stream, at a few sizes, as a
 * framework's per-tensor allocator calls them. Run it natively (the driver's own pool)
 * and under LD_PRELOAD=libpsshim.so, side by side. Prints one JSON line per size:
 *   {"size": N, "pairs": P, "median_ns": M, "p90_ns": Q}
 * Build: cc -O2 -I$CUDA/include bench/alloc_latency.c -L$CUDA/lib64 -lcudart -o alloc_latency */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
  int pairs = argc > 1 ? atoi(argv[1]) : 20000;
  const size_t sizes[] = {4096, 1 << 20, 32u << 20};
  cudaStream_t s;
  if (cudaStreamCreate(&s) != cudaSuccess) {
    fprintf(stderr, "alloc_latency: no CUDA device\n");
    return 1;
  }
  double *t = malloc(sizeof *t * (size_t)pairs);
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    for (int i = -100; i < pairs; i++) { /* the first 100 warm the pools */
      void *p;
      double t0 = now_ns();
      if (cudaMallocAsync(&p, sizes[k], s) != cudaSuccess || cudaFreeAsync(p, s) != cudaSuccess) {
        fprintf(stderr, "alloc_latency: allocation of %zu bytes failed\n", sizes[k]);
        return 1;
      }
      if (i >= 0)
        t[i] = now_ns() - t0;
    }
    cudaStreamSynchronize(s);
    qsort(t, (size_t)pairs, sizeof *t, cmp);
    printf("{\"size\": %zu, \"pairs\": %d, \"median_ns\": %.0f, \"p90_ns\": %.0f}\n", sizes[k], pairs,
           t[pairs / 2], t[pairs * 9 / 10]);
  }
  free(t);
  return 0;
}
