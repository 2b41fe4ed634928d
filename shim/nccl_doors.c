/* NCCL doors: NCCL's kernels find their buffers through work structures in device memory,
 * so scanning launch parameters cannot see what a collective touches. psshim exports the
 * collective entry points, reports each call's buffers as a moment (the trace, and the
 * pager's bracketing, so no chunk a collective uses is remapped under it), and calls the
 * real NCCL. Inside ncclGroupStart/End the work is enqueued at the group's end, so the
 * moments' exits wait for it. psshim's own communicator (comm/) calls NCCL directly. */
#include "allocator/allocator.h"
#include "shim/shim.h"
#include "tracer/observe.h"
#include "tracer/tracer.h"

#include <nccl.h>
#include <string.h>

static const char *const nccl_sonames[] = {"libnccl.so.2", "libnccl.so", NULL};

#define REAL_NCCL(name) PS_REAL(name, nccl_sonames)

struct collective {
  struct ps_moment l;
  uint64_t ptrs[2];
};

#define GROUP_PENDING_MAX 256
static PS_THREAD_LOCAL int group_depth;
static PS_THREAD_LOCAL struct collective group_pending[GROUP_PENDING_MAX];
static PS_THREAD_LOCAL int group_n;

static size_t type_size(ncclDataType_t t)
{
  switch (t) {
  case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
  case ncclFloat16: case ncclBfloat16: return 2;
  case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
  default: return 8;
  }
}

static void enter(struct collective *c, const char *name, const void *a, const void *b, size_t bytes,
                  cudaStream_t stream)
{
  memset(c, 0, sizeof *c);
  uint64_t pa = (uint64_t)(uintptr_t)a, pb = (uint64_t)(uintptr_t)b;
  if (a && psa_owns(pa))
    c->ptrs[c->l.nptrs++] = pa;
  if (b && pb != pa && psa_owns(pb))
    c->ptrs[c->l.nptrs++] = pb;
  if (c->l.nptrs == 2 && c->ptrs[0] > c->ptrs[1]) { /* consumers expect them sorted */
    c->ptrs[0] = pb;
    c->ptrs[1] = pa;
  }
  c->l.ptrs = c->ptrs;
  c->l.kind = PS_MOMENT_COLLECTIVE;
  c->l.name = name;
  c->l.stream = (uint64_t)(uintptr_t)stream;
  c->l.bytes = bytes;
  pst_observe_moment(&c->l, true);
}

static void leave(struct collective *c)
{
  c->l.ptrs = c->ptrs;
  pst_observe_moment(&c->l, false);
}

/* After the real call: at once, or (inside a group) when the group ends. */
static ncclResult_t finish(struct collective *c, ncclResult_t r)
{
  c->l.failed = r != ncclSuccess;
  if (!group_depth) {
    leave(c);
  } else if (group_n < GROUP_PENDING_MAX) {
    group_pending[group_n++] = *c;
  } else {
    /* More calls in one group than psshim tracks: bracket stays open too long is safe,
     * closing it before the work is enqueued is not, so the group waits for none. */
    leave(c);
    ps_log(PS_LOG_WARN, "more than %d NCCL calls in one group: paging may race them", GROUP_PENDING_MAX);
  }
  return r;
}

PS_DEFAULT_VISIBILITY ncclResult_t ncclGroupStart(void)
{
  REAL_NCCL(ncclGroupStart);
  if (!real_ncclGroupStart)
    return ncclSystemError;
  ncclResult_t r = real_ncclGroupStart();
  if (r == ncclSuccess)
    group_depth++;
  return r;
}

PS_DEFAULT_VISIBILITY ncclResult_t ncclGroupEnd(void)
{
  REAL_NCCL(ncclGroupEnd);
  if (!real_ncclGroupEnd)
    return ncclSystemError;
  ncclResult_t r = real_ncclGroupEnd();
  if (group_depth && --group_depth == 0) {
    for (int i = 0; i < group_n; i++)
      leave(&group_pending[i]);
    group_n = 0;
  }
  return r;
}

PS_DEFAULT_VISIBILITY ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                                 cudaStream_t stream)
{
  REAL_NCCL(ncclAllReduce);
  if (!real_ncclAllReduce)
    return ncclSystemError;
  struct collective c;
  enter(&c, "ncclAllReduce", sendbuff, recvbuff, count * type_size(datatype), stream);
  return finish(&c, real_ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream));
}

PS_DEFAULT_VISIBILITY ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                                              ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                                              cudaStream_t stream)
{
  REAL_NCCL(ncclReduce);
  if (!real_ncclReduce)
    return ncclSystemError;
  struct collective c;
  enter(&c, "ncclReduce", sendbuff, recvbuff, count * type_size(datatype), stream);
  return finish(&c, real_ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream));
}

PS_DEFAULT_VISIBILITY ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                                 ncclDataType_t datatype, int root, ncclComm_t comm,
                                                 cudaStream_t stream)
{
  REAL_NCCL(ncclBroadcast);
  if (!real_ncclBroadcast)
    return ncclSystemError;
  struct collective c;
  enter(&c, "ncclBroadcast", sendbuff, recvbuff, count * type_size(datatype), stream);
  return finish(&c, real_ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream));
}

PS_DEFAULT_VISIBILITY ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                                     cudaStream_t stream)
{
  REAL_NCCL(ncclReduceScatter);
  if (!real_ncclReduceScatter)
    return ncclSystemError;
  struct collective c;
  enter(&c, "ncclReduceScatter", sendbuff, recvbuff, recvcount * type_size(datatype), stream);
  return finish(&c, real_ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream));
}

PS_DEFAULT_VISIBILITY ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
  REAL_NCCL(ncclAllGather);
  if (!real_ncclAllGather)
    return ncclSystemError;
  struct collective c;
  enter(&c, "ncclAllGather", sendbuff, recvbuff, sendcount * type_size(datatype), stream);
  return finish(&c, real_ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream));
}

PS_DEFAULT_VISIBILITY ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                            ncclComm_t comm, cudaStream_t stream)
{
  REAL_NCCL(ncclSend);
  if (!real_ncclSend)
    return ncclSystemError;
  struct collective c;
  enter(&c, "ncclSend", sendbuff, NULL, count * type_size(datatype), stream);
  return finish(&c, real_ncclSend(sendbuff, count, datatype, peer, comm, stream));
}

PS_DEFAULT_VISIBILITY ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                            ncclComm_t comm, cudaStream_t stream)
{
  REAL_NCCL(ncclRecv);
  if (!real_ncclRecv)
    return ncclSystemError;
  struct collective c;
  enter(&c, "ncclRecv", recvbuff, NULL, count * type_size(datatype), stream);
  return finish(&c, real_ncclRecv(recvbuff, count, datatype, peer, comm, stream));
}
