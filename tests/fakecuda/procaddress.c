/* cuGetProcAddress: resolves a base name ("cuMemAlloc") to the newest entry point whose
 * version is <= the caller's cudaVersion, and to the _ptds/_ptsz form when the caller
 * asks for per-thread default-stream semantics — the same functions dlsym would find.
 * A name fakecuda does not implement is CUDA_ERROR_NOT_FOUND / SYMBOL_NOT_FOUND; a
 * version older than the oldest form fakecuda has is VERSION_NOT_SUFFICIENT (the
 * 32-bit-pointer _v1 forms are not provided). Works before cuInit, as on CUDA. */
#include <string.h>

#include "fakecuda_internal.h"

struct proc {
  const char *name;
  int version;   /* the CUDA version that introduced this form */
  void *legacy;  /* default / legacy-stream form */
  void *per_thread; /* _ptds / _ptsz form, NULL when the function has none */
};

#define F(p) ((void *)(p))
/* Rows for one name are ordered oldest first; the lookup keeps the last that fits. */
static const struct proc procs[] = {
    {"cuInit", 2000, F(cuInit), NULL},
    {"cuDriverGetVersion", 2020, F(cuDriverGetVersion), NULL},
    {"cuGetErrorString", 6000, F(cuGetErrorString), NULL},
    {"cuGetErrorName", 6000, F(cuGetErrorName), NULL},
    {"cuGetProcAddress", 11030, F(fc_cuGetProcAddress_v1), NULL},
    {"cuGetProcAddress", 12000, F(cuGetProcAddress_v2), NULL},
    {"cuDeviceGet", 2000, F(cuDeviceGet), NULL},
    {"cuDeviceGetCount", 2000, F(cuDeviceGetCount), NULL},
    {"cuDeviceGetAttribute", 2000, F(cuDeviceGetAttribute), NULL},
    {"cuDeviceGetName", 2000, F(cuDeviceGetName), NULL},
    {"cuDeviceTotalMem", 3020, F(cuDeviceTotalMem_v2), NULL},
    {"cuDeviceGetDefaultMemPool", 11020, F(cuDeviceGetDefaultMemPool), NULL},
    {"cuDeviceGetMemPool", 11020, F(cuDeviceGetMemPool), NULL},
    {"cuDevicePrimaryCtxRetain", 7000, F(cuDevicePrimaryCtxRetain), NULL},
    {"cuDevicePrimaryCtxRelease", 7000, F(fc_cuDevicePrimaryCtxRelease_v1), NULL},
    {"cuDevicePrimaryCtxRelease", 11000, F(cuDevicePrimaryCtxRelease_v2), NULL},
    {"cuCtxGetCurrent", 4000, F(cuCtxGetCurrent), NULL},
    {"cuCtxSetCurrent", 4000, F(cuCtxSetCurrent), NULL},
    {"cuCtxGetDevice", 2000, F(cuCtxGetDevice), NULL},
    {"cuCtxSynchronize", 2000, F(cuCtxSynchronize), NULL},
    {"cuCtxPushCurrent", 2000, F(fc_cuCtxPushCurrent_v1), NULL},
    {"cuCtxPushCurrent", 4000, F(cuCtxPushCurrent_v2), NULL},
    {"cuCtxPopCurrent", 2000, F(fc_cuCtxPopCurrent_v1), NULL},
    {"cuCtxPopCurrent", 4000, F(cuCtxPopCurrent_v2), NULL},
    {"cuMemGetInfo", 3020, F(cuMemGetInfo_v2), NULL},
    {"cuMemAlloc", 3020, F(cuMemAlloc_v2), NULL},
    {"cuMemFree", 3020, F(cuMemFree_v2), NULL},
    {"cuMemAllocAsync", 11020, F(cuMemAllocAsync), F(cuMemAllocAsync_ptsz)},
    {"cuMemFreeAsync", 11020, F(cuMemFreeAsync), F(cuMemFreeAsync_ptsz)},
    {"cuMemAllocFromPoolAsync", 11020, F(cuMemAllocFromPoolAsync), F(cuMemAllocFromPoolAsync_ptsz)},
    {"cuMemAddressReserve", 10020, F(cuMemAddressReserve), NULL},
    {"cuMemAddressFree", 10020, F(cuMemAddressFree), NULL},
    {"cuMemCreate", 10020, F(cuMemCreate), NULL},
    {"cuMemRelease", 10020, F(cuMemRelease), NULL},
    {"cuMemMap", 10020, F(cuMemMap), NULL},
    {"cuMemUnmap", 10020, F(cuMemUnmap), NULL},
    {"cuMemSetAccess", 10020, F(cuMemSetAccess), NULL},
    {"cuMemGetAccess", 10020, F(cuMemGetAccess), NULL},
    {"cuMemGetAllocationGranularity", 10020, F(cuMemGetAllocationGranularity), NULL},
    {"cuMemRetainAllocationHandle", 11000, F(cuMemRetainAllocationHandle), NULL},
    {"cuMemGetAllocationPropertiesFromHandle", 10020, F(cuMemGetAllocationPropertiesFromHandle), NULL},
    {"cuPointerGetAttribute", 4000, F(cuPointerGetAttribute), NULL},
    {"cuIpcGetMemHandle", 4010, F(cuIpcGetMemHandle), NULL},
    {"cuIpcOpenMemHandle", 4010, F(fc_cuIpcOpenMemHandle_v1), NULL},
    {"cuIpcOpenMemHandle", 11000, F(cuIpcOpenMemHandle_v2), NULL},
    {"cuIpcCloseMemHandle", 4010, F(cuIpcCloseMemHandle), NULL},
    {"cuStreamCreate", 2000, F(cuStreamCreate), NULL},
    {"cuStreamCreateWithPriority", 5050, F(cuStreamCreateWithPriority), NULL},
    {"cuStreamDestroy", 2000, F(fc_cuStreamDestroy_v1), NULL},
    {"cuStreamDestroy", 4000, F(cuStreamDestroy_v2), NULL},
    {"cuStreamSynchronize", 2000, F(cuStreamSynchronize), F(cuStreamSynchronize_ptsz)},
    {"cuStreamQuery", 2000, F(cuStreamQuery), F(cuStreamQuery_ptsz)},
    {"cuStreamIsCapturing", 10000, F(cuStreamIsCapturing), F(cuStreamIsCapturing_ptsz)},
    {"cuStreamWaitEvent", 3020, F(cuStreamWaitEvent), F(cuStreamWaitEvent_ptsz)},
    /* CUDA 10.0's form took no mode: not provided, so 10000 finds nothing. */
    {"cuStreamBeginCapture", 10010, F(cuStreamBeginCapture_v2), F(cuStreamBeginCapture_v2_ptsz)},
    {"cuStreamEndCapture", 10000, F(cuStreamEndCapture), F(cuStreamEndCapture_ptsz)},
    {"cuEventCreate", 2000, F(cuEventCreate), NULL},
    {"cuEventDestroy", 2000, F(fc_cuEventDestroy_v1), NULL},
    {"cuEventDestroy", 4000, F(cuEventDestroy_v2), NULL},
    {"cuEventRecord", 2000, F(cuEventRecord), F(cuEventRecord_ptsz)},
    {"cuEventQuery", 2000, F(cuEventQuery), NULL},
    {"cuEventSynchronize", 2000, F(cuEventSynchronize), NULL},
    {"cuEventElapsedTime", 2000, F(fc_cuEventElapsedTime_v1), NULL},
    {"cuEventElapsedTime", 12080, F(cuEventElapsedTime_v2), NULL},
    {"cuMemcpy", 4000, F(cuMemcpy), F(cuMemcpy_ptds)},
    {"cuMemcpyAsync", 4000, F(cuMemcpyAsync), F(cuMemcpyAsync_ptsz)},
    {"cuMemcpyHtoD", 3020, F(cuMemcpyHtoD_v2), F(cuMemcpyHtoD_v2_ptds)},
    {"cuMemcpyDtoH", 3020, F(cuMemcpyDtoH_v2), F(cuMemcpyDtoH_v2_ptds)},
    {"cuMemcpyDtoD", 3020, F(cuMemcpyDtoD_v2), F(cuMemcpyDtoD_v2_ptds)},
    {"cuMemcpyHtoDAsync", 3020, F(cuMemcpyHtoDAsync_v2), F(cuMemcpyHtoDAsync_v2_ptsz)},
    {"cuMemcpyDtoHAsync", 3020, F(cuMemcpyDtoHAsync_v2), F(cuMemcpyDtoHAsync_v2_ptsz)},
    {"cuMemcpyDtoDAsync", 3020, F(cuMemcpyDtoDAsync_v2), F(cuMemcpyDtoDAsync_v2_ptsz)},
    {"cuMemsetD8", 3020, F(cuMemsetD8_v2), F(cuMemsetD8_v2_ptds)},
    {"cuMemsetD32", 3020, F(cuMemsetD32_v2), F(cuMemsetD32_v2_ptds)},
    {"cuMemsetD8Async", 3020, F(cuMemsetD8Async), F(cuMemsetD8Async_ptsz)},
    {"cuMemsetD32Async", 3020, F(cuMemsetD32Async), F(cuMemsetD32Async_ptsz)},
    {"cuLaunchKernel", 4000, F(cuLaunchKernel), F(cuLaunchKernel_ptsz)},
    {"cuLaunchKernelEx", 11060, F(cuLaunchKernelEx), F(cuLaunchKernelEx_ptsz)},
    {"cuFuncGetParamInfo", 12040, F(cuFuncGetParamInfo), NULL},
    {"cuFuncGetName", 12030, F(cuFuncGetName), NULL},
    {"cuKernelGetParamInfo", 12040, F(cuKernelGetParamInfo), NULL},
    {"cuKernelGetName", 12030, F(cuKernelGetName), NULL},
};

/* The per-thread forms exist since CUDA 7.0. */
#define PER_THREAD_SINCE 7000

static CUresult get_proc(const char *symbol, void **pfn, int version, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status) {
  const cuuint64_t known = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if (!symbol || !pfn || (flags & ~known)) return CUDA_ERROR_INVALID_VALUE;
  const struct proc *hit = NULL;
  bool named = false;
  for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
    if (strcmp(procs[i].name, symbol) != 0) continue;
    named = true;
    if (procs[i].version <= version) hit = &procs[i];
  }
  *pfn = NULL;
  if (!hit) {
    if (status) *status = named ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
  bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && version >= PER_THREAD_SINCE;
  *pfn = per_thread && hit->per_thread ? hit->per_thread : hit->legacy;
  if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus) {
  FC_TRACED(cuGetProcAddress_v2, get_proc(symbol, pfn, cudaVersion, flags, symbolStatus), symbol, pfn, cudaVersion,
            flags, symbolStatus);
}
FC_EXPORT CUresult fc_cuGetProcAddress_v1(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
  FC_TRACED(cuGetProcAddress, get_proc(symbol, pfn, cudaVersion, flags, NULL), symbol, pfn, cudaVersion, flags);
}
FC_EXPORT CUresult fakecuda_proc_address(const char *symbol, int cuda_version, cuuint64_t flags, void **pfn) {
  return get_proc(symbol, pfn, cuda_version, flags, NULL);
}
