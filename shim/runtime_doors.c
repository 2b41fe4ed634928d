/* Runtime-API doors: what PyTorch actually calls (libtorch_cuda links libcudart
 * dynamically, so these exported names win under LD_PRELOAD), and PyTorch's
 * pluggable-allocator entry points. What psshim does not serve goes to the real cudart. */
#include "allocator/allocator.h"
#include "shim/shim.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);
cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream);

const char *const ps_cudart_sonames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", NULL};

cudaError_t ps_to_runtime(CUresult r)
{
  switch (r) {
  case CUDA_SUCCESS: return cudaSuccess;
  case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
  case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
  case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
  case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
  default: return cudaErrorUnknown;
  }
}

/* Makes sure a context is current the way the runtime would (its primary context of the
 * current device), so psshim's first allocation uses the context the framework will use. */
bool ps_runtime_device(int *ordinal)
{
  if (!ps_active())
    return false;
  if (ps_current_device(ordinal))
    return true;
  PS_REAL_CUDART(cudaFree);
  if (real_cudaFree) {
    if (real_cudaFree(NULL) != cudaSuccess) /* the runtime's own "initialise the context" */
      return false;
  } else {
    CUdevice dev;
    CUcontext ctx;
    if (PS_CU(ps_driver.cuDeviceGet(&dev, 0)) || PS_CU(ps_driver.cuDevicePrimaryCtxRetain(&ctx, dev)) ||
        PS_CU(ps_driver.cuCtxSetCurrent(ctx)))
      return false;
  }
  return ps_current_device(ordinal);
}

static cudaError_t serve(void **p, size_t size, CUstream stream, bool *served)
{
  int ordinal;
  *served = false;
  if (!p || !ps_runtime_device(&ordinal))
    return cudaSuccess;
  CUresult r = psa_alloc(ordinal, size, stream, (CUdeviceptr *)p);
  *served = r != CUDA_ERROR_NOT_SUPPORTED;
  return ps_to_runtime(r);
}

PS_DEFAULT_VISIBILITY cudaError_t cudaMalloc(void **devPtr, size_t size)
{
  bool served;
  cudaError_t e = serve(devPtr, size, PSA_SYNC_STREAM, &served);
  if (served)
    return e;
  PS_REAL_CUDART(cudaMalloc);
  return real_cudaMalloc ? real_cudaMalloc(devPtr, size) : cudaErrorInitializationError;
}

PS_DEFAULT_VISIBILITY cudaError_t cudaFree(void *devPtr)
{
  if (psa_owns((CUdeviceptr)devPtr))
    return ps_to_runtime(psa_free((CUdeviceptr)devPtr, 0, true));
  PS_REAL_CUDART(cudaFree);
  return real_cudaFree ? real_cudaFree(devPtr) : cudaErrorInitializationError;
}

PS_DEFAULT_VISIBILITY cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
  bool served;
  cudaError_t e = serve(devPtr, size, (CUstream)hStream, &served);
  if (served)
    return e;
  PS_REAL_CUDART(cudaMallocAsync);
  return real_cudaMallocAsync ? real_cudaMallocAsync(devPtr, size, hStream) : cudaErrorInitializationError;
}

PS_DEFAULT_VISIBILITY cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
  if (psa_owns((CUdeviceptr)devPtr))
    return ps_to_runtime(psa_free((CUdeviceptr)devPtr, (CUstream)hStream, false));
  PS_REAL_CUDART(cudaFreeAsync);
  return real_cudaFreeAsync ? real_cudaFreeAsync(devPtr, hStream) : cudaErrorInitializationError;
}

/* The runtime's pool check: a context as the runtime would make it, then the driver's. */
static bool runtime_pool_is_current(cudaMemPool_t pool)
{
  int ordinal;
  return ps_runtime_device(&ordinal) && ps_pool_is_current((CUmemoryPool)pool);
}

PS_DEFAULT_VISIBILITY cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                                          cudaStream_t stream)
{
  bool served = false;
  cudaError_t e = runtime_pool_is_current(memPool) ? serve(ptr, size, (CUstream)stream, &served) : cudaSuccess;
  if (served)
    return e;
  PS_REAL_CUDART(cudaMallocFromPoolAsync);
  return real_cudaMallocFromPoolAsync ? real_cudaMallocFromPoolAsync(ptr, size, memPool, stream)
                                      : cudaErrorInitializationError;
}

/* The current pool's memory counters answer for psshim's memory: with
 * backend:cudaMallocAsync, torch reads torch.cuda.memory_allocated and its peaks from
 * them, and resets the peaks by setting the high marks. */
PS_DEFAULT_VISIBILITY cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value)
{
  int ordinal;
  struct psa_usage u;
  if (value && runtime_pool_is_current(pool) && ps_current_device(&ordinal) && psa_usage_get(ordinal, &u)) {
    switch (attr) {
    case cudaMemPoolAttrReservedMemCurrent: *(cuuint64_t *)value = u.reserved; return cudaSuccess;
    case cudaMemPoolAttrReservedMemHigh: *(cuuint64_t *)value = u.reserved_high; return cudaSuccess;
    case cudaMemPoolAttrUsedMemCurrent: *(cuuint64_t *)value = u.used; return cudaSuccess;
    case cudaMemPoolAttrUsedMemHigh: *(cuuint64_t *)value = u.used_high; return cudaSuccess;
    default: break;
    }
  }
  PS_REAL_CUDART(cudaMemPoolGetAttribute);
  return real_cudaMemPoolGetAttribute ? real_cudaMemPoolGetAttribute(pool, attr, value) : cudaErrorInitializationError;
}

PS_DEFAULT_VISIBILITY cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value)
{
  int ordinal;
  bool high = attr == cudaMemPoolAttrReservedMemHigh || attr == cudaMemPoolAttrUsedMemHigh;
  if (value && high && runtime_pool_is_current(pool) && ps_current_device(&ordinal))
    psa_usage_reset_high(ordinal, attr == cudaMemPoolAttrReservedMemHigh, attr == cudaMemPoolAttrUsedMemHigh);
  PS_REAL_CUDART(cudaMemPoolSetAttribute);
  return real_cudaMemPoolSetAttribute ? real_cudaMemPoolSetAttribute(pool, attr, value) : cudaErrorInitializationError;
}

static cudaStream_t per_thread(cudaStream_t s) { return s ? s : cudaStreamPerThread; }

PS_DEFAULT_VISIBILITY cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
  bool served;
  cudaError_t e = serve(devPtr, size, (CUstream)per_thread(hStream), &served);
  if (served)
    return e;
  PS_REAL_CUDART(cudaMallocAsync_ptsz);
  return real_cudaMallocAsync_ptsz ? real_cudaMallocAsync_ptsz(devPtr, size, hStream) : cudaErrorInitializationError;
}

PS_DEFAULT_VISIBILITY cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
  if (psa_owns((CUdeviceptr)devPtr))
    return ps_to_runtime(psa_free((CUdeviceptr)devPtr, (CUstream)per_thread(hStream), false));
  PS_REAL_CUDART(cudaFreeAsync_ptsz);
  return real_cudaFreeAsync_ptsz ? real_cudaFreeAsync_ptsz(devPtr, hStream) : cudaErrorInitializationError;
}

PS_DEFAULT_VISIBILITY cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                                               cudaStream_t stream)
{
  bool served = false;
  cudaError_t e =
      runtime_pool_is_current(memPool) ? serve(ptr, size, (CUstream)per_thread(stream), &served) : cudaSuccess;
  if (served)
    return e;
  PS_REAL_CUDART(cudaMallocFromPoolAsync_ptsz);
  return real_cudaMallocFromPoolAsync_ptsz ? real_cudaMallocFromPoolAsync_ptsz(ptr, size, memPool, stream)
                                           : cudaErrorInitializationError;
}

PS_DEFAULT_VISIBILITY cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
  int ordinal;
  if (free_bytes && total_bytes && ps_runtime_device(&ordinal)) {
    psa_mem_info(ordinal, free_bytes, total_bytes);
    if (*total_bytes)
      return cudaSuccess;
  }
  PS_REAL_CUDART(cudaMemGetInfo);
  return real_cudaMemGetInfo ? real_cudaMemGetInfo(free_bytes, total_bytes) : cudaErrorInitializationError;
}

/* torch.cuda.memory.CUDAPluggableAllocator(path, "psshim_malloc", "psshim_free"): the
 * framework names the device and has made it current. */
PS_DEFAULT_VISIBILITY void *psshim_malloc(ssize_t size, int device, cudaStream_t stream)
{
  CUdeviceptr p = 0;
  if (size < 0 || !ps_active() || psa_alloc(device, (size_t)size, (CUstream)stream, &p) != CUDA_SUCCESS)
    return NULL;
  return (void *)p;
}

PS_DEFAULT_VISIBILITY void psshim_free(void *ptr, ssize_t size, int device, cudaStream_t stream)
{
  (void)size;
  (void)device;
  if (psa_owns((CUdeviceptr)ptr))
    psa_free((CUdeviceptr)ptr, (CUstream)stream, false);
}

/* 1 when p lies in psshim's chunk space: for tests and tools that want to know who
 * served an allocation (dlsym(RTLD_DEFAULT, "psshim_owns")). */
PS_DEFAULT_VISIBILITY int psshim_owns(const void *p) { return psa_owns((CUdeviceptr)p); }

/* The statistics of PSSHIM_STATS as JSON, now: a program (a benchmark's per-step figures)
 * or a test reads them through dlsym(RTLD_DEFAULT, "psshim_stats_json"). Writes at most
 * len bytes with the terminating NUL; returns the JSON's length (0 on failure), as
 * snprintf does. */
PS_DEFAULT_VISIBILITY size_t psshim_stats_json(char *buf, size_t len)
{
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  if (!f)
    return 0;
  struct psa_progress progress = ps_wiring_progress();
  psa_stats_write(f, true, &progress);
  if (fclose(f) != 0) {
    free(text);
    return 0;
  }
  if (buf && len) {
    size_t k = n < len - 1 ? n : len - 1;
    memcpy(buf, text, k);
    buf[k] = '\0';
  }
  free(text);
  return n;
}
