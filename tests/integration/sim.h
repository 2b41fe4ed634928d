/* What the integration test programs share: failing loudly on a CUDA error, and launching
 * a fake kernel on one thread. Each program names itself in SIM_NAME before including. */
#ifndef PSSHIM_TESTS_SIM_H
#define PSSHIM_TESTS_SIM_H

#include "tests/fakecuda/fakecuda.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static inline void check(cudaError_t e, const char *what)
{
  if (e != cudaSuccess) {
    fprintf(stderr, SIM_NAME ": %s failed: %s\n", what, cudaGetErrorString(e));
    exit(2);
  }
}

static inline void launch(CUfunction f, void **params, cudaStream_t s)
{
  if (cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, (CUstream)s, params, NULL) != CUDA_SUCCESS) {
    fprintf(stderr, SIM_NAME ": launch failed\n");
    exit(2);
  }
}

/* The training loops' forward kernel: act[i] = param[i] * 3 + step, with parameters
 * (param, act, n, step), each 8 bytes. */
static void sim_forward_fn(void **args, void *user)
{
  (void)user;
  const uint32_t *param = *(uint32_t **)args[0];
  uint32_t *act = *(uint32_t **)args[1];
  uint64_t n = *(uint64_t *)args[2], step = *(uint64_t *)args[3];
  for (uint64_t i = 0; i < n; i++)
    act[i] = param[i] * 3u + (uint32_t)step;
}

static inline CUfunction sim_forward_kernel(void)
{
  static const size_t sizes[] = {8, 8, 8, 8};
  return fakecuda_register_kernel("forward", sim_forward_fn, NULL, 4, sizes);
}

#endif
