/* Graph-capture doors: the runtime's and the driver's begin and end of a stream capture,
 * passed through untouched, telling the allocator when a capture is underway so that no
 * call of psshim's breaks it (allocator/capture.c). A capture that ends invalidated has
 * ended too. */
#include "allocator/allocator.h"
#include "shim/shim.h"

#include <cuda_runtime_api.h>

cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);

static void begun(bool ok)
{
  if (ok)
    psa_capture_begun();
}

static void ended(bool ok)
{
  if (ok)
    psa_capture_ended();
}

PS_DEFAULT_VISIBILITY cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
  PS_REAL_CUDART(cudaStreamBeginCapture);
  cudaError_t e = real_cudaStreamBeginCapture ? real_cudaStreamBeginCapture(stream, mode) : cudaErrorInitializationError;
  begun(e == cudaSuccess);
  return e;
}

PS_DEFAULT_VISIBILITY cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
  PS_REAL_CUDART(cudaStreamBeginCapture_ptsz);
  cudaError_t e =
      real_cudaStreamBeginCapture_ptsz ? real_cudaStreamBeginCapture_ptsz(stream, mode) : cudaErrorInitializationError;
  begun(e == cudaSuccess);
  return e;
}

PS_DEFAULT_VISIBILITY cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
  PS_REAL_CUDART(cudaStreamEndCapture);
  cudaError_t e = real_cudaStreamEndCapture ? real_cudaStreamEndCapture(stream, pGraph) : cudaErrorInitializationError;
  ended(e == cudaSuccess || e == cudaErrorStreamCaptureInvalidated);
  return e;
}

PS_DEFAULT_VISIBILITY cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph)
{
  PS_REAL_CUDART(cudaStreamEndCapture_ptsz);
  cudaError_t e =
      real_cudaStreamEndCapture_ptsz ? real_cudaStreamEndCapture_ptsz(stream, pGraph) : cudaErrorInitializationError;
  ended(e == cudaSuccess || e == cudaErrorStreamCaptureInvalidated);
  return e;
}

/* The driver's entry point of that name, looked up once. */
#define DRIVER_REAL(name) \
  static __typeof__(&name) real_##name; \
  if (!real_##name && ps_driver_load()) real_##name = (__typeof__(&name))ps_driver_symbol(#name)

PS_DEFAULT_VISIBILITY CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
  DRIVER_REAL(cuStreamBeginCapture_v2);
  CUresult r = real_cuStreamBeginCapture_v2 ? real_cuStreamBeginCapture_v2(hStream, mode) : CUDA_ERROR_NOT_INITIALIZED;
  begun(r == CUDA_SUCCESS);
  return r;
}

PS_DEFAULT_VISIBILITY CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
  DRIVER_REAL(cuStreamBeginCapture_v2_ptsz);
  CUresult r = real_cuStreamBeginCapture_v2_ptsz ? real_cuStreamBeginCapture_v2_ptsz(hStream, mode) : CUDA_ERROR_NOT_FOUND;
  begun(r == CUDA_SUCCESS);
  return r;
}

PS_DEFAULT_VISIBILITY CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
  DRIVER_REAL(cuStreamEndCapture);
  CUresult r = real_cuStreamEndCapture ? real_cuStreamEndCapture(hStream, phGraph) : CUDA_ERROR_NOT_INITIALIZED;
  ended(r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  return r;
}

PS_DEFAULT_VISIBILITY CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
  DRIVER_REAL(cuStreamEndCapture_ptsz);
  CUresult r = real_cuStreamEndCapture_ptsz ? real_cuStreamEndCapture_ptsz(hStream, phGraph) : CUDA_ERROR_NOT_FOUND;
  ended(r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  return r;
}
