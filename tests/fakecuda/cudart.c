/* A minimal CUDA runtime over the fake driver, enough for test programs written the
 * way a framework uses CUDA. Each cuda* function makes sure a context is current (the
 * one already current to the thread, else the primary context of the thread's device,
 * retained once as the real runtime does) and then calls the driver's exported entry
 * point (cuMemAlloc_v2, ...) through the dynamic linker — so a preloaded library that
 * interposes either the runtime or the driver symbol sees the call, and its
 * pass-through reaches the fake driver. Errors are kept per thread for cudaGetLastError. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cudart_errors.h"

#define RT_EXPORT __attribute__((visibility("default")))
#define RT_MAX_DEVICES 16

static pthread_mutex_t rt_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary[RT_MAX_DEVICES]; /* retained on first use, never released */
static _Thread_local int rt_device;
static _Thread_local cudaError_t last_error;

static cudaError_t from_cu(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_NO_DEVICE: return cudaErrorNoDevice;
    case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
    case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_CONTEXT_IS_DESTROYED: return cudaErrorContextIsDestroyed;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
    case CUDA_ERROR_NOT_READY: return cudaErrorNotReady;
    case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
    case CUDA_ERROR_ILLEGAL_ADDRESS: return cudaErrorIllegalAddress;
    case CUDA_ERROR_LAUNCH_FAILED: return cudaErrorLaunchFailure;
    default: return cudaErrorUnknown;
  }
}

/* Records a failure for cudaGetLastError; cudaErrorNotReady is a status, not an error. */
static cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) last_error = e;
  return e;
}
static cudaError_t ret_cu(CUresult r) { return ret(from_cu(r)); }

static CUresult primary_of(int dev, CUcontext *ctx) {
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&rt_mu);
  if (!primary[dev]) r = cuDevicePrimaryCtxRetain(&primary[dev], dev);
  *ctx = primary[dev];
  pthread_mutex_unlock(&rt_mu);
  return r;
}

/* The runtime's lazy initialisation: driver, then a current context. */
static CUresult ensure_context(void) {
  CUcontext cur, ctx;
  CUresult r = cuInit(0);
  if (r == CUDA_SUCCESS) r = cuCtxGetCurrent(&cur);
  if (r != CUDA_SUCCESS || cur) return r;
  r = primary_of(rt_device, &ctx);
  return r == CUDA_SUCCESS ? cuCtxSetCurrent(ctx) : r;
}

#define ENSURE()                                       \
  do {                                                 \
    CUresult ensure_r_ = ensure_context();             \
    if (ensure_r_ != CUDA_SUCCESS) return ret_cu(ensure_r_); \
  } while (0)

#define DPTR(p) ((CUdeviceptr)(uintptr_t)(p))

/* ---- errors and versions ---- */
RT_EXPORT cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
RT_EXPORT cudaError_t cudaPeekAtLastError(void) { return last_error; }

static int find_error(cudaError_t e) {
  for (size_t i = 0; i < sizeof fc_rt_errors / sizeof fc_rt_errors[0]; i++)
    if (fc_rt_errors[i].code == (int)e) return (int)i;
  return -1;
}
RT_EXPORT const char *cudaGetErrorString(cudaError_t error) {
  int i = find_error(error);
  return i < 0 ? "unrecognized error code" : fc_rt_errors[i].text;
}
RT_EXPORT const char *cudaGetErrorName(cudaError_t error) {
  int i = find_error(error);
  return i < 0 ? "unrecognized error code" : fc_rt_errors[i].name;
}
RT_EXPORT cudaError_t cudaDriverGetVersion(int *driverVersion) { return ret_cu(cuDriverGetVersion(driverVersion)); }
RT_EXPORT cudaError_t cudaRuntimeGetVersion(int *runtimeVersion) {
  if (!runtimeVersion) return ret(cudaErrorInvalidValue);
  *runtimeVersion = CUDART_VERSION;
  return cudaSuccess;
}

/* ---- devices ---- */
RT_EXPORT cudaError_t cudaGetDeviceCount(int *count) {
  CUresult r = cuInit(0);
  return ret_cu(r == CUDA_SUCCESS ? cuDeviceGetCount(count) : r);
}

/* Makes the device's primary context current at once, as CUDA 12+ does. */
RT_EXPORT cudaError_t cudaSetDevice(int device) {
  CUcontext ctx;
  int count;
  CUresult r = cuInit(0);
  if (r == CUDA_SUCCESS) r = cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS) return ret_cu(r);
  if (device < 0 || device >= count || device >= RT_MAX_DEVICES) return ret(cudaErrorInvalidDevice);
  r = primary_of(device, &ctx);
  if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(ctx);
  if (r == CUDA_SUCCESS) rt_device = device;
  return ret_cu(r);
}

RT_EXPORT cudaError_t cudaGetDevice(int *device) {
  CUcontext cur;
  if (!device) return ret(cudaErrorInvalidValue);
  CUresult r = cuInit(0);
  if (r == CUDA_SUCCESS) r = cuCtxGetCurrent(&cur);
  if (r != CUDA_SUCCESS) return ret_cu(r);
  if (!cur) {
    *device = rt_device;
    return cudaSuccess;
  }
  CUdevice d;
  r = cuCtxGetDevice(&d);
  if (r == CUDA_SUCCESS) *device = d;
  return ret_cu(r);
}

RT_EXPORT cudaError_t cudaDeviceSynchronize(void) {
  ENSURE();
  return ret_cu(cuCtxSynchronize());
}

RT_EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device) {
  CUresult r = cuInit(0);
  return ret_cu(r == CUDA_SUCCESS ? cuDeviceGetDefaultMemPool(memPool, device) : r);
}

RT_EXPORT cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device) {
  CUresult r = cuInit(0);
  return ret_cu(r == CUDA_SUCCESS ? cuDeviceGetMemPool(memPool, device) : r);
}

/* The fake's default pool keeps no statistics: its memory counters read 0, its other
 * attributes are not modelled. Setting the counters' high marks (a reset) is accepted. */
RT_EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  if (!pool || !value) return ret(cudaErrorInvalidValue);
  switch (attr) {
  case cudaMemPoolAttrReservedMemCurrent: case cudaMemPoolAttrReservedMemHigh:
  case cudaMemPoolAttrUsedMemCurrent: case cudaMemPoolAttrUsedMemHigh:
    *(cuuint64_t *)value = 0;
    return cudaSuccess;
  default:
    return ret(cudaErrorNotSupported);
  }
}

RT_EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  if (!pool || !value) return ret(cudaErrorInvalidValue);
  return attr == cudaMemPoolAttrReservedMemHigh || attr == cudaMemPoolAttrUsedMemHigh ? cudaSuccess
                                                                                       : ret(cudaErrorNotSupported);
}

/* ---- memory ---- */
RT_EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size) {
  CUdeviceptr p;
  if (!devPtr) return ret(cudaErrorInvalidValue);
  ENSURE();
  if (size == 0) { /* cudaMalloc(0) succeeds with NULL */
    *devPtr = NULL;
    return cudaSuccess;
  }
  CUresult r = cuMemAlloc_v2(&p, size);
  if (r == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
  return ret_cu(r);
}

RT_EXPORT cudaError_t cudaFree(void *devPtr) {
  ENSURE(); /* cudaFree(NULL) is the classic way to initialise the runtime */
  return devPtr ? ret_cu(cuMemFree_v2(DPTR(devPtr))) : cudaSuccess;
}

RT_EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) {
  CUdeviceptr p;
  if (!devPtr) return ret(cudaErrorInvalidValue);
  ENSURE();
  CUresult r = cuMemAllocAsync(&p, size, hStream);
  if (r == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
  return ret_cu(r);
}

RT_EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
  ENSURE();
  return ret_cu(cuMemFreeAsync(DPTR(devPtr), hStream));
}

RT_EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
  CUdeviceptr p;
  if (!ptr) return ret(cudaErrorInvalidValue);
  ENSURE();
  CUresult r = cuMemAllocFromPoolAsync(&p, size, memPool, stream);
  if (r == CUDA_SUCCESS) *ptr = (void *)(uintptr_t)p;
  return ret_cu(r);
}

RT_EXPORT cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
  ENSURE();
  return ret_cu(cuMemGetInfo_v2(free, total));
}

/* Legacy IPC: the driver's (tests/fakecuda/ipc.c says what it honours). */
RT_EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr) {
  ENSURE();
  return ret_cu(cuIpcGetMemHandle((CUipcMemHandle *)handle, DPTR(devPtr)));
}
RT_EXPORT cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
  CUdeviceptr p;
  CUipcMemHandle h;
  if (!devPtr) return ret(cudaErrorInvalidValue);
  ENSURE();
  memcpy(&h, &handle, sizeof h);
  CUresult r = cuIpcOpenMemHandle_v2(&p, h, flags);
  if (r == CUDA_SUCCESS) *devPtr = (void *)(uintptr_t)p;
  return ret_cu(r);
}
RT_EXPORT cudaError_t cudaIpcCloseMemHandle(void *devPtr) {
  ENSURE();
  return ret_cu(cuIpcCloseMemHandle(DPTR(devPtr)));
}

/* Unified addressing: the driver's generic copy serves every kind. */
static bool valid_kind(enum cudaMemcpyKind kind) { return kind >= cudaMemcpyHostToHost && kind <= cudaMemcpyDefault; }

RT_EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  if (!valid_kind(kind)) return ret(cudaErrorInvalidMemcpyDirection);
  ENSURE();
  return ret_cu(cuMemcpy(DPTR(dst), DPTR(src), count));
}

RT_EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                                      cudaStream_t stream) {
  if (!valid_kind(kind)) return ret(cudaErrorInvalidMemcpyDirection);
  ENSURE();
  return ret_cu(cuMemcpyAsync(DPTR(dst), DPTR(src), count, stream));
}

RT_EXPORT cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
  ENSURE();
  return ret_cu(cuMemsetD8_v2(DPTR(devPtr), (unsigned char)value, count));
}

RT_EXPORT cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
  ENSURE();
  return ret_cu(cuMemsetD8Async(DPTR(devPtr), (unsigned char)value, count, stream));
}

/* ---- streams and events ---- */
RT_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  ENSURE();
  return ret_cu(cuStreamCreate(pStream, flags));
}
RT_EXPORT cudaError_t cudaStreamCreate(cudaStream_t *pStream) { return cudaStreamCreateWithFlags(pStream, 0); }
RT_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  ENSURE();
  return ret_cu(cuStreamDestroy_v2(stream));
}
RT_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  ENSURE();
  return ret_cu(cuStreamSynchronize(stream));
}
RT_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  ENSURE();
  return ret_cu(cuStreamWaitEvent(stream, event, flags));
}
RT_EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  ENSURE();
  return ret_cu(cuEventCreate(event, flags));
}
RT_EXPORT cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, 0); }
RT_EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  ENSURE();
  return ret_cu(cuEventRecord(event, stream));
}
RT_EXPORT cudaError_t cudaEventQuery(cudaEvent_t event) {
  ENSURE();
  return ret_cu(cuEventQuery(event));
}
RT_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  ENSURE();
  return ret_cu(cuEventSynchronize(event));
}
RT_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event) {
  ENSURE();
  return ret_cu(cuEventDestroy_v2(event));
}
RT_EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  ENSURE();
  return ret_cu(cuEventElapsedTime_v2(ms, start, end));
}

/* func is a CUfunction from fakecuda_register_kernel (fakecuda has no fatbinaries to
 * register host stubs from); launches go through cuLaunchKernel, as CUPTI shows for
 * real runtime launches. */
RT_EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                                       cudaStream_t stream) {
  ENSURE();
  if (sharedMem > UINT32_MAX) return ret(cudaErrorInvalidValue);
  CUresult r = cuLaunchKernel((CUfunction)(uintptr_t)func, gridDim.x, gridDim.y, gridDim.z, blockDim.x, blockDim.y,
                              blockDim.z, (unsigned)sharedMem, stream, args, NULL);
  return ret(r == CUDA_ERROR_INVALID_HANDLE ? cudaErrorInvalidDeviceFunction : from_cu(r));
}
