/* Legacy CUDA IPC doors, runtime and driver: a handle of memory psshim serves is psshim's
 * own (allocator/ipc.c), since CUDA's handles do not cover VMM memory. A pointer psshim
 * does not own, and a handle without psshim's mark, go to the real call untouched. */
#include "allocator/allocator.h"
#include "shim/shim.h"

#include <cuda_runtime_api.h>
#include <string.h>

#undef cuIpcOpenMemHandle /* cuda.h maps it to _v2; the driver exports both, and so does psshim */
CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);

/* Whether psshim makes the handle of p: it owns p, and may use CUDA here (a forked child may
 * not; the real call then fails as CUDA's rule says). */
static bool exported_by_psshim(CUdeviceptr p) { return psa_owns(p) && !ps_in_forked_child(); }

/* The device a handle of psshim's is opened for: the current context's (made current the
 * runtime's way for the runtime doors); false after one line when there is none. */
static bool open_device(bool runtime, int *ordinal)
{
  if (!ps_active())
    ps_error("a CUDA IPC handle of memory psshim serves in another process cannot be opened here: psshim does "
             "not serve this process (PSSHIM_DISABLE, a forked child, or no driver)");
  else if (!(runtime ? ps_runtime_device(ordinal) : ps_current_device(ordinal)))
    ps_error("a CUDA IPC handle of psshim's was opened with no CUDA context current");
  else
    return true;
  return false;
}

static CUresult open_ours(bool runtime, CUdeviceptr *p, const CUipcMemHandle *h)
{
  int ordinal;
  return open_device(runtime, &ordinal) ? psa_ipc_open(ordinal, h, p) : CUDA_ERROR_INVALID_VALUE;
}

PS_DEFAULT_VISIBILITY cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
  if (exported_by_psshim((CUdeviceptr)devPtr))
    return ps_to_runtime(psa_ipc_export((CUdeviceptr)devPtr, (CUipcMemHandle *)handle));
  PS_REAL_CUDART(cudaIpcGetMemHandle);
  return real_cudaIpcGetMemHandle ? real_cudaIpcGetMemHandle(handle, devPtr) : cudaErrorInitializationError;
}

PS_DEFAULT_VISIBILITY cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
  CUipcMemHandle h;
  _Static_assert(sizeof h == sizeof handle, "the runtime's handle is the driver's");
  memcpy(&h, &handle, sizeof h);
  if (psa_ipc_handle_ours(&h))
    return ps_to_runtime(open_ours(true, (CUdeviceptr *)devPtr, &h));
  PS_REAL_CUDART(cudaIpcOpenMemHandle);
  return real_cudaIpcOpenMemHandle ? real_cudaIpcOpenMemHandle(devPtr, handle, flags) : cudaErrorInitializationError;
}

PS_DEFAULT_VISIBILITY cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
  CUresult r = psa_ipc_close((CUdeviceptr)devPtr);
  if (r != CUDA_ERROR_NOT_SUPPORTED)
    return ps_to_runtime(r);
  PS_REAL_CUDART(cudaIpcCloseMemHandle);
  return real_cudaIpcCloseMemHandle ? real_cudaIpcCloseMemHandle(devPtr) : cudaErrorInitializationError;
}

PS_DEFAULT_VISIBILITY CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
  if (exported_by_psshim(dptr))
    return psa_ipc_export(dptr, pHandle);
  return ps_driver_load() && ps_driver.cuIpcGetMemHandle ? ps_driver.cuIpcGetMemHandle(pHandle, dptr)
                                                         : CUDA_ERROR_NOT_INITIALIZED;
}

PS_DEFAULT_VISIBILITY CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
  if (psa_ipc_handle_ours(&handle))
    return open_ours(false, pdptr, &handle);
  return ps_driver_load() && ps_driver.cuIpcOpenMemHandle_v2 ? ps_driver.cuIpcOpenMemHandle_v2(pdptr, handle, Flags)
                                                             : CUDA_ERROR_NOT_INITIALIZED;
}

PS_DEFAULT_VISIBILITY CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
  if (psa_ipc_handle_ours(&handle))
    return open_ours(false, pdptr, &handle);
  static CUresult (*real_v1)(CUdeviceptr *, CUipcMemHandle, unsigned int);
  if (!real_v1)
    real_v1 = (CUresult(*)(CUdeviceptr *, CUipcMemHandle, unsigned int))ps_driver_symbol("cuIpcOpenMemHandle");
  return real_v1 ? real_v1(pdptr, handle, Flags) : CUDA_ERROR_NOT_FOUND;
}

PS_DEFAULT_VISIBILITY CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
  CUresult r = psa_ipc_close(dptr);
  if (r != CUDA_ERROR_NOT_SUPPORTED)
    return r;
  return ps_driver_load() && ps_driver.cuIpcCloseMemHandle ? ps_driver.cuIpcCloseMemHandle(dptr)
                                                           : CUDA_ERROR_NOT_INITIALIZED;
}
