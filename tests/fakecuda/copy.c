/* Copies and memsets. Every form is an operation on a stream's worker; the synchronous
 * ones (cuMemcpy, cuMemcpyHtoD ..., cuMemsetD8 ...) go to the legacy stream (or the
 * per-thread one for _ptds) and wait for completion. The side a function names as
 * device memory must lie in a cuMemAlloc allocation or a VA reservation, else
 * CUDA_ERROR_INVALID_VALUE; whether it is mapped is found out when the copy runs —
 * an unmapped chunk faults, as a copy engine would. Generic cuMemcpy/cuMemcpyAsync take
 * any pointers (unified addressing). */
#include <stdatomic.h>

#include "fakecuda_internal.h"

enum { DST_DEV = 1, SRC_DEV = 2 };

#define PTR(x) ((void *)(uintptr_t)(x))

static CUresult copy(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h, bool per_thread, bool sync,
                     unsigned dev_sides) {
  struct CUctx_st *c;
  struct CUstream_st *s;
  CUresult r = fc_current_ctx(&c);
  if (r != CUDA_SUCCESS) return r;
  if (n == 0) return CUDA_SUCCESS;
  if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
  if (((dev_sides & DST_DEV) && !fc_is_device_range(dst, n)) || ((dev_sides & SRC_DEV) && !fc_is_device_range(src, n)))
    return CUDA_ERROR_INVALID_VALUE;
  r = fc_stream_resolve(h, per_thread, &s);
  if (r != CUDA_SUCCESS) return r;
  struct fc_op *op = fc_op_new(FC_OP_COPY, 0);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  op->u.copy.dst = PTR(dst);
  op->u.copy.src = PTR(src);
  op->u.copy.n = n;
  return fc_submit(s, op, sync);
}

static CUresult fill(CUdeviceptr dst, uint32_t value, unsigned elem, size_t count, CUstream h, bool per_thread,
                     bool sync) {
  struct CUctx_st *c;
  struct CUstream_st *s;
  CUresult r = fc_current_ctx(&c);
  if (r != CUDA_SUCCESS) return r;
  if (count == 0) return CUDA_SUCCESS;
  if (!dst || dst % elem || count > SIZE_MAX / elem || !fc_is_device_range(dst, count * elem))
    return CUDA_ERROR_INVALID_VALUE;
  r = fc_stream_resolve(h, per_thread, &s);
  if (r != CUDA_SUCCESS) return r;
  struct fc_op *op = fc_op_new(FC_OP_MEMSET, 0);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  op->u.memset.dst = PTR(dst);
  op->u.memset.value = value;
  op->u.memset.elem = elem;
  op->u.memset.count = count;
  return fc_submit(s, op, sync);
}

#define H(p) ((CUdeviceptr)(uintptr_t)(p))

/* ---- generic ---- */
static _Atomic bool fail_async; /* fakecuda_fail_async_copies */

FC_EXPORT void fakecuda_fail_async_copies(bool on) { atomic_store(&fail_async, on); }

FC_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  FC_TRACED(cuMemcpy, copy(dst, src, ByteCount, NULL, false, true, 0), dst, src, ByteCount);
}
FC_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  FC_TRACED(cuMemcpy_ptds, copy(dst, src, ByteCount, NULL, true, true, 0), dst, src, ByteCount);
}
FC_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  FC_TRACED(cuMemcpyAsync, atomic_load(&fail_async) ? CUDA_ERROR_UNKNOWN : copy(dst, src, ByteCount, hStream, false, false, 0),
            dst, src, ByteCount, hStream);
}
FC_EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  FC_TRACED(cuMemcpyAsync_ptsz,
            atomic_load(&fail_async) ? CUDA_ERROR_UNKNOWN : copy(dst, src, ByteCount, hStream, true, false, 0), dst, src,
            ByteCount, hStream);
}

/* ---- synchronous, typed ---- */
FC_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
  FC_TRACED(cuMemcpyHtoD_v2, copy(dstDevice, H(srcHost), ByteCount, NULL, false, true, DST_DEV), dstDevice, srcHost,
            ByteCount);
}
FC_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
  FC_TRACED(cuMemcpyHtoD_v2_ptds, copy(dstDevice, H(srcHost), ByteCount, NULL, true, true, DST_DEV), dstDevice,
            srcHost, ByteCount);
}
FC_EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  FC_TRACED(cuMemcpyDtoH_v2, copy(H(dstHost), srcDevice, ByteCount, NULL, false, true, SRC_DEV), dstHost, srcDevice,
            ByteCount);
}
FC_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  FC_TRACED(cuMemcpyDtoH_v2_ptds, copy(H(dstHost), srcDevice, ByteCount, NULL, true, true, SRC_DEV), dstHost,
            srcDevice, ByteCount);
}
FC_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  FC_TRACED(cuMemcpyDtoD_v2, copy(dstDevice, srcDevice, ByteCount, NULL, false, true, DST_DEV | SRC_DEV), dstDevice,
            srcDevice, ByteCount);
}
FC_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  FC_TRACED(cuMemcpyDtoD_v2_ptds, copy(dstDevice, srcDevice, ByteCount, NULL, true, true, DST_DEV | SRC_DEV),
            dstDevice, srcDevice, ByteCount);
}

/* ---- asynchronous, typed ---- */
FC_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                        CUstream hStream) {
  FC_TRACED(cuMemcpyHtoDAsync_v2, copy(dstDevice, H(srcHost), ByteCount, hStream, false, false, DST_DEV), dstDevice,
            srcHost, ByteCount, hStream);
}
FC_EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                             CUstream hStream) {
  FC_TRACED(cuMemcpyHtoDAsync_v2_ptsz, copy(dstDevice, H(srcHost), ByteCount, hStream, true, false, DST_DEV),
            dstDevice, srcHost, ByteCount, hStream);
}
FC_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  FC_TRACED(cuMemcpyDtoHAsync_v2, copy(H(dstHost), srcDevice, ByteCount, hStream, false, false, SRC_DEV), dstHost,
            srcDevice, ByteCount, hStream);
}
FC_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                             CUstream hStream) {
  FC_TRACED(cuMemcpyDtoHAsync_v2_ptsz, copy(H(dstHost), srcDevice, ByteCount, hStream, true, false, SRC_DEV),
            dstHost, srcDevice, ByteCount, hStream);
}
FC_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                        CUstream hStream) {
  FC_TRACED(cuMemcpyDtoDAsync_v2, copy(dstDevice, srcDevice, ByteCount, hStream, false, false, DST_DEV | SRC_DEV),
            dstDevice, srcDevice, ByteCount, hStream);
}
FC_EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                             CUstream hStream) {
  FC_TRACED(cuMemcpyDtoDAsync_v2_ptsz, copy(dstDevice, srcDevice, ByteCount, hStream, true, false, DST_DEV | SRC_DEV),
            dstDevice, srcDevice, ByteCount, hStream);
}

/* ---- memsets ---- */
FC_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  FC_TRACED(cuMemsetD8_v2, fill(dstDevice, uc, 1, N, NULL, false, true), dstDevice, uc, N);
}
FC_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  FC_TRACED(cuMemsetD8_v2_ptds, fill(dstDevice, uc, 1, N, NULL, true, true), dstDevice, uc, N);
}
FC_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  FC_TRACED(cuMemsetD32_v2, fill(dstDevice, ui, 4, N, NULL, false, true), dstDevice, ui, N);
}
FC_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  FC_TRACED(cuMemsetD32_v2_ptds, fill(dstDevice, ui, 4, N, NULL, true, true), dstDevice, ui, N);
}
FC_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  FC_TRACED(cuMemsetD8Async, fill(dstDevice, uc, 1, N, hStream, false, false), dstDevice, uc, N, hStream);
}
FC_EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  FC_TRACED(cuMemsetD8Async_ptsz, fill(dstDevice, uc, 1, N, hStream, true, false), dstDevice, uc, N, hStream);
}
FC_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  FC_TRACED(cuMemsetD32Async, fill(dstDevice, ui, 4, N, hStream, false, false), dstDevice, ui, N, hStream);
}
FC_EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  FC_TRACED(cuMemsetD32Async_ptsz, fill(dstDevice, ui, 4, N, hStream, true, false), dstDevice, ui, N, hStream);
}
FC_EXPORT CUresult cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N) {
  FC_TRACED(cuMemsetD16_v2, fill(dstDevice, us, 2, N, NULL, false, true), dstDevice, us, N);
}

/* ---- 2D copies between linear memories (the fake has no arrays), row by row ---- */
static CUdeviceptr side(CUmemorytype type, const void *host, CUdeviceptr dev) {
  return type == CU_MEMORYTYPE_HOST ? H(host) : type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED ? dev : 0;
}

static CUresult copy2d(const CUDA_MEMCPY2D *p, CUstream h, bool per_thread, bool sync) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr dst = side(p->dstMemoryType, p->dstHost, p->dstDevice), src = side(p->srcMemoryType, p->srcHost, p->srcDevice);
  if (!dst || !src) return CUDA_ERROR_NOT_SUPPORTED;
  unsigned sides = (p->dstMemoryType == CU_MEMORYTYPE_DEVICE ? DST_DEV : 0) | (p->srcMemoryType == CU_MEMORYTYPE_DEVICE ? SRC_DEV : 0);
  for (size_t y = 0; y < p->Height; y++) {
    CUresult r = copy(dst + (p->dstY + y) * p->dstPitch + p->dstXInBytes, src + (p->srcY + y) * p->srcPitch + p->srcXInBytes,
                      p->WidthInBytes, h, per_thread, sync && y + 1 == p->Height, sides);
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream) {
  FC_TRACED(cuMemcpy2DAsync_v2, copy2d(pCopy, hStream, false, false), pCopy, hStream);
}

/* Arrays are not simulated: the call is reported (an observer must treat it as unseen). */
FC_EXPORT CUresult cuMemcpyAtoD_v2(CUdeviceptr dstDevice, CUarray srcArray, size_t srcOffset, size_t ByteCount) {
  FC_TRACED(cuMemcpyAtoD_v2, CUDA_ERROR_NOT_SUPPORTED, dstDevice, srcArray, srcOffset, ByteCount);
}
