/* Legacy CUDA IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle), as far
 * as the test driver can honour it. As on CUDA, VMM memory (addresses in a reservation)
 * has no legacy handle: CUDA_ERROR_INVALID_VALUE. A plain allocation's base gets a handle
 * (the test driver's mark, its pid and address), but a plain allocation is host memory of
 * its own process, so another process cannot map it: opening such a handle answers
 * CUDA_ERROR_NOT_SUPPORTED, which tells a test that the call reached this driver; any
 * other handle is CUDA_ERROR_INVALID_VALUE. Nothing is ever opened, so nothing closes. */
#include <string.h>
#include <unistd.h>

#include "fakecuda_internal.h"

#define MARK "fakecuda-ipc"

struct fc_ipc_handle {
  char mark[sizeof MARK];
  int32_t pid;
  CUdeviceptr base;
};
_Static_assert(sizeof(struct fc_ipc_handle) <= sizeof(CUipcMemHandle), "the mark fits a handle");

static CUresult get_handle(CUipcMemHandle *h, CUdeviceptr p) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  struct fc_ptr_info info;
  if (!h || !fc_alloc_lookup(p, &info) || info.base != p) return CUDA_ERROR_INVALID_VALUE;
  struct fc_ipc_handle mine = {.mark = MARK, .pid = getpid(), .base = p};
  memset(h, 0, sizeof *h);
  memcpy(h, &mine, sizeof mine);
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
  FC_TRACED(cuIpcGetMemHandle, get_handle(pHandle, dptr), pHandle, dptr);
}

static CUresult open_handle(CUdeviceptr *p, const CUipcMemHandle *h) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  return memcmp(h->reserved, MARK, sizeof MARK) == 0 ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
}
FC_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags) {
  FC_TRACED(cuIpcOpenMemHandle_v2, open_handle(pdptr, &handle), pdptr, handle, Flags);
}
FC_EXPORT CUresult fc_cuIpcOpenMemHandle_v1(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags) {
  FC_TRACED(cuIpcOpenMemHandle, open_handle(pdptr, &handle), pdptr, handle, Flags);
}

static CUresult close_handle(void) {
  CUresult r = fc_check_init();
  return r != CUDA_SUCCESS ? r : CUDA_ERROR_INVALID_VALUE;
}
FC_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) { FC_TRACED(cuIpcCloseMemHandle, close_handle(), dptr); }
