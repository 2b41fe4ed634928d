/* The implicit synchronization of a free, under LD_PRELOAD=libpsshim.so on the test driver:
 * cudaFree and cuMemFree_v2 of psshim's memory wait for the device as CUDA's do, so work
 * queued on any stream (here a slow kernel on a non-blocking stream, writing a host flag)
 * has finished when they return; cudaFreeAsync and cuMemFreeAsync are stream-ordered and
 * return without waiting for another stream's work; after a capture that ended invalidated
 * the synchronous frees wait again. Each check prints its name; any failure exits non-zero. */
#define SIM_NAME "free_sim"
#include "tests/integration/check.h"
#include "tests/integration/sim.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

static _Atomic int done; /* set by slow() when it has run */

/* slow(): 300 ms on its stream, then marks that it ran. */
static void slow_fn(void **args, void *user)
{
  (void)args, (void)user;
  usleep(300000);
  atomic_store(&done, 1);
}

static CUfunction slow_kernel;

/* Queues slow() on s; returns whether it is still pending then. */
static bool queue_slow(cudaStream_t s)
{
  atomic_store(&done, 0);
  launch(slow_kernel, NULL, s);
  return !atomic_load(&done);
}

int main(void)
{
  int (*owns)(const void *) = (int (*)(const void *))dlsym(RTLD_DEFAULT, "psshim_owns");
  CHECK("psshim is preloaded", owns != NULL);
  if (!owns)
    return 1;
  slow_kernel = fakecuda_register_kernel("slow", slow_fn, NULL, 0, NULL);
  cudaStream_t s, other;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  check(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  void *p[4] = {NULL};
  for (int i = 0; i < 4; i++)
    check(cudaMalloc(&p[i], 1 << 20), "cudaMalloc");
  CHECK("the buffers are psshim's", owns(p[0]) && owns(p[1]) && owns(p[2]) && owns(p[3]));

  bool pending = queue_slow(s);
  cudaError_t e = cudaFree(p[0]);
  CHECK("cudaFree returns after work queued on another stream has run",
        pending && e == cudaSuccess && atomic_load(&done));

  pending = queue_slow(s);
  CUresult r = cuMemFree_v2((CUdeviceptr)(uintptr_t)p[1]);
  CHECK("cuMemFree_v2 returns after work queued on another stream has run",
        pending && r == CUDA_SUCCESS && atomic_load(&done));

  pending = queue_slow(s);
  e = cudaFreeAsync(p[2], other);
  CHECK("cudaFreeAsync on another stream returns without waiting for it",
        pending && e == cudaSuccess && !atomic_load(&done));
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  pending = queue_slow(s);
  r = cuMemFreeAsync((CUdeviceptr)(uintptr_t)p[3], (CUstream)other);
  CHECK("cuMemFreeAsync on another stream returns without waiting for it",
        pending && r == CUDA_SUCCESS && !atomic_load(&done));
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  /* A capture that ends invalidated has ended: a free waits for the device again (while one
   * is underway it must not, and leaves its bytes until none is). The query of the capturing
   * stream conflicts with the capture and invalidates it. */
  void *q = NULL;
  check(cudaMalloc(&q, 1 << 20), "cudaMalloc");
  CUgraph cugraph = NULL;
  check(cuStreamBeginCapture_v2((CUstream)other, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS ? cudaSuccess
                                                                                                : cudaErrorUnknown,
        "cuStreamBeginCapture_v2");
  (void)cuStreamQuery((CUstream)other);
  r = cuStreamEndCapture((CUstream)other, &cugraph);
  CHECK("a capture queried midway ends invalidated", r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  pending = queue_slow(s);
  r = cuMemFree_v2((CUdeviceptr)(uintptr_t)q);
  CHECK("cuMemFree_v2 after a capture that ended invalidated waits for the device",
        pending && r == CUDA_SUCCESS && atomic_load(&done));
  return failures ? 1 : 0;
}
