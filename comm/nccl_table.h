/* The NCCL entry points comm/ uses, filled by dlopen at run time (never linked), so
 * libpsshim.so loads where NCCL is absent and single-GPU runs never touch it. Inside a
 * PyTorch process dlopen by soname returns the libnccl.so.2 torch already loaded. */
#ifndef PSSHIM_COMM_NCCL_TABLE_H
#define PSSHIM_COMM_NCCL_TABLE_H

#include <nccl.h>
#include <stdbool.h>

/* Non-blocking communicators (ncclCommInitRankConfig + ncclCommGetAsyncError, NCCL 2.14)
 * are what let every wait carry a timeout. */
#define PSC_NCCL_FUNCS(X)                                                                    \
  X(ncclGetUniqueId, ncclResult_t, (ncclUniqueId *))                                         \
  X(ncclCommInitRankConfig, ncclResult_t, (ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *)) \
  X(ncclCommGetAsyncError, ncclResult_t, (ncclComm_t, ncclResult_t *))                       \
  X(ncclCommDestroy, ncclResult_t, (ncclComm_t))                                             \
  X(ncclCommAbort, ncclResult_t, (ncclComm_t))                                               \
  X(ncclGetErrorString, const char *, (ncclResult_t))                                        \
  X(ncclAllGather, ncclResult_t,                                                             \
    (const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t))                \
  X(ncclAllReduce, ncclResult_t,                                                             \
    (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t))   \
  X(ncclBroadcast, ncclResult_t,                                                             \
    (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))           \
  X(ncclGroupStart, ncclResult_t, (void))                                                    \
  X(ncclGroupEnd, ncclResult_t, (void))

struct psc_nccl {
#define PSC_NCCL_FIELD(name, ret, args) ret(*name) args;
  PSC_NCCL_FUNCS(PSC_NCCL_FIELD)
#undef PSC_NCCL_FIELD
};
extern struct psc_nccl psc_nccl;

/* Loads libnccl.so.2 (PSSHIM_NCCL overrides the path) once; false after one line naming
 * what is missing. */
bool psc_nccl_load(void);

#endif
