/* Driver-API doors: the allocation entry points of libcuda, exported under their real
 * (versioned) names so LD_PRELOAD, dlsym and cuGetProcAddress all reach them. Anything
 * psshim does not serve goes to the real entry point in ps_driver. */
#include "allocator/allocator.h"
#include "shim/shim.h"

#include <stdint.h>

/* The device of the calling thread's current context, as the driver API defines it;
 * false when there is none (then the real call reports the error the caller expects). */
bool ps_current_device(int *ordinal)
{
  CUcontext ctx = NULL;
  CUdevice dev;
  if (ps_driver.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx || ps_driver.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
    return false;
  *ordinal = (int)dev;
  return true;
}

/* Allocates through psshim on the current device; CUDA_ERROR_NOT_SUPPORTED = not served. */
static CUresult serve_alloc(CUdeviceptr *dptr, size_t size, CUstream stream)
{
  int ordinal;
  if (!ps_active() || !ps_current_device(&ordinal))
    return CUDA_ERROR_NOT_SUPPORTED;
  return psa_alloc(ordinal, size, stream, dptr);
}

bool ps_pool_is_current(CUmemoryPool pool)
{
  int ordinal;
  CUmemoryPool current = NULL;
  return ps_driver.cuDeviceGetMemPool && ps_current_device(&ordinal) &&
         ps_driver.cuDeviceGetMemPool(&current, (CUdevice)ordinal) == CUDA_SUCCESS &&
         current == pool;
}

PS_DEFAULT_VISIBILITY CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
  CUresult r = dptr ? serve_alloc(dptr, bytesize, PSA_SYNC_STREAM) : CUDA_ERROR_NOT_SUPPORTED;
  if (r != CUDA_ERROR_NOT_SUPPORTED)
    return r;
  return ps_driver_load() ? ps_driver.cuMemAlloc_v2(dptr, bytesize) : CUDA_ERROR_NOT_INITIALIZED;
}

PS_DEFAULT_VISIBILITY CUresult cuMemFree_v2(CUdeviceptr dptr)
{
  if (psa_owns(dptr))
    return psa_free(dptr, 0, true);
  return ps_driver_load() ? ps_driver.cuMemFree_v2(dptr) : CUDA_ERROR_NOT_INITIALIZED;
}

PS_DEFAULT_VISIBILITY CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
  CUresult r = dptr ? serve_alloc(dptr, bytesize, hStream) : CUDA_ERROR_NOT_SUPPORTED;
  if (r != CUDA_ERROR_NOT_SUPPORTED)
    return r;
  return ps_driver_load() ? ps_driver.cuMemAllocAsync(dptr, bytesize, hStream) : CUDA_ERROR_NOT_INITIALIZED;
}

PS_DEFAULT_VISIBILITY CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
  if (psa_owns(dptr))
    return psa_free(dptr, hStream, false);
  return ps_driver_load() ? ps_driver.cuMemFreeAsync(dptr, hStream) : CUDA_ERROR_NOT_INITIALIZED;
}

PS_DEFAULT_VISIBILITY CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                       CUstream hStream)
{
  CUresult r = dptr && ps_active() && ps_pool_is_current(pool) ? serve_alloc(dptr, bytesize, hStream) : CUDA_ERROR_NOT_SUPPORTED;
  if (r != CUDA_ERROR_NOT_SUPPORTED)
    return r;
  return ps_driver_load() ? ps_driver.cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream) : CUDA_ERROR_NOT_INITIALIZED;
}

static CUstream per_thread(CUstream s) { return s ? s : CU_STREAM_PER_THREAD; }

PS_DEFAULT_VISIBILITY CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
  CUresult r = dptr ? serve_alloc(dptr, bytesize, per_thread(hStream)) : CUDA_ERROR_NOT_SUPPORTED;
  if (r != CUDA_ERROR_NOT_SUPPORTED)
    return r;
  return ps_driver.cuMemAllocAsync_ptsz ? ps_driver.cuMemAllocAsync_ptsz(dptr, bytesize, hStream) : CUDA_ERROR_NOT_FOUND;
}

PS_DEFAULT_VISIBILITY CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
  if (psa_owns(dptr))
    return psa_free(dptr, per_thread(hStream), false);
  return ps_driver.cuMemFreeAsync_ptsz ? ps_driver.cuMemFreeAsync_ptsz(dptr, hStream) : CUDA_ERROR_NOT_FOUND;
}

PS_DEFAULT_VISIBILITY CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                            CUstream hStream)
{
  CUresult r = dptr && ps_active() && ps_pool_is_current(pool) ? serve_alloc(dptr, bytesize, per_thread(hStream))
                                                           : CUDA_ERROR_NOT_SUPPORTED;
  if (r != CUDA_ERROR_NOT_SUPPORTED)
    return r;
  return ps_driver.cuMemAllocFromPoolAsync_ptsz ? ps_driver.cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, hStream)
                                                : CUDA_ERROR_NOT_FOUND;
}

PS_DEFAULT_VISIBILITY CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
  int ordinal;
  if (free_bytes && total_bytes && ps_active() && ps_current_device(&ordinal)) {
    psa_mem_info(ordinal, free_bytes, total_bytes);
    if (*total_bytes)
      return CUDA_SUCCESS;
  }
  return ps_driver_load() ? ps_driver.cuMemGetInfo_v2(free_bytes, total_bytes) : CUDA_ERROR_NOT_INITIALIZED;
}
