/* psshim's NCCL doors under LD_PRELOAD, against the fake NCCL loaded the way frameworks
 * load it (dlopen): the collective entry points resolve to psshim's doors, an all-reduce
 * on psshim's memory gives the right sum, and grouped calls work. With PSSHIM_TRACE the
 * trace names the collectives (the harness checks it with psshim-report). */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

int main(void)
{
  void *nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  CHECK("libnccl.so.2 loads", nccl != NULL);
  if (!nccl)
    return 1;
  __typeof__(&ncclAllReduce) all_reduce = (__typeof__(&ncclAllReduce))dlsym(nccl, "ncclAllReduce");
  __typeof__(&ncclGroupStart) group_start = (__typeof__(&ncclGroupStart))dlsym(nccl, "ncclGroupStart");
  __typeof__(&ncclGroupEnd) group_end = (__typeof__(&ncclGroupEnd))dlsym(nccl, "ncclGroupEnd");
  __typeof__(&ncclGetUniqueId) unique_id = (__typeof__(&ncclGetUniqueId))dlsym(nccl, "ncclGetUniqueId");
  __typeof__(&ncclCommInitRank) init_rank = (__typeof__(&ncclCommInitRank))dlsym(nccl, "ncclCommInitRank");
  Dl_info info;
  CHECK("dlsym(ncclAllReduce) is psshim's door",
        all_reduce && dladdr((void *)all_reduce, &info) && strstr(info.dli_fname, "libpsshim"));
  CHECK("dlsym(ncclGetUniqueId) is NCCL's own",
        unique_id && dladdr((void *)unique_id, &info) && strstr(info.dli_fname, "libnccl"));
  ncclUniqueId id;
  ncclComm_t comm;
  CHECK("a one-rank communicator", !unique_id(&id) && !init_rank(&comm, 1, id, 0));
  int (*owns)(const void *) = (int (*)(const void *))dlsym(RTLD_DEFAULT, "psshim_owns");
  float *buf = NULL, host[256];
  CHECK("cudaMalloc served by psshim", !cudaMalloc((void **)&buf, sizeof host) && owns && owns(buf));
  for (int i = 0; i < 256; i++)
    host[i] = (float)i;
  cudaMemcpy(buf, host, sizeof host, cudaMemcpyHostToDevice);
  CHECK("ncclAllReduce through the door", all_reduce(buf, buf, 256, ncclFloat32, ncclSum, comm, 0) == ncclSuccess);
  CHECK("a grouped all-reduce", !group_start() && !all_reduce(buf, buf, 128, ncclFloat32, ncclSum, comm, 0) &&
                                    !group_end());
  cudaDeviceSynchronize();
  cudaMemcpy(host, buf, sizeof host, cudaMemcpyDeviceToHost);
  CHECK("one rank's sum is the input", host[3] == 3.0f && host[200] == 200.0f);
  cudaFree(buf);
  __typeof__(&ncclCommDestroy) destroy = (__typeof__(&ncclCommDestroy))dlsym(nccl, "ncclCommDestroy");
  CHECK("the communicator is destroyed", destroy && destroy(comm) == ncclSuccess);
  return failures ? 1 : 0;
}
