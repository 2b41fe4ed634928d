/* What the integration test programs share: failing loudly on a CUDA error, and launching
 * a fake kernel on one thread. Each program names itself in SIM_NAME before including. */
#ifndef PSSHIM_TESTS_SIM_H
#define PSSHIM_TESTS_SIM_H

#include "tests/fakecuda/fakecuda.h"

#include <cuda_runtime_api.h>
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

#endif
