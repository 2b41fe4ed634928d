/* The driver door for programs that never link libcuda: dlsym and cuGetProcAddress.
 *
 * dlsym: exact names only (a prefix match would also catch cudnn* and recurse), and only
 * when the real lookup finds the symbol, so "not found" stays "not found". RTLD_NEXT is
 * resolved from the caller's place in the link map, since glibc would otherwise search
 * after psshim instead of after the caller.
 * cuGetProcAddress: the real driver resolves the name for the requested version and
 * flags; psshim swaps in its door only when the address returned is one it replaces,
 * so version and per-thread-stream choices are the driver's. */
#include "allocator/allocator.h"
#include "shim/shim.h"

#include <cuda_runtime_api.h>
#include <cupti.h>
#include <nccl.h>
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>

#undef cuGetProcAddress /* cuda.h maps it to _v2; psshim exports both */
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
#undef cuIpcOpenMemHandle /* likewise */
CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);
cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream);
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);

struct door {
  const char *name;
  void *door;
  bool driver; /* a libcuda entry point (cuGetProcAddress can hand it out) */
};

static const struct door doors[] = {
    {"cuMemAlloc_v2", (void *)cuMemAlloc_v2, true},
    {"cuMemFree_v2", (void *)cuMemFree_v2, true},
    {"cuMemAllocAsync", (void *)cuMemAllocAsync, true},
    {"cuMemFreeAsync", (void *)cuMemFreeAsync, true},
    {"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync, true},
    {"cuMemAllocAsync_ptsz", (void *)cuMemAllocAsync_ptsz, true},
    {"cuMemFreeAsync_ptsz", (void *)cuMemFreeAsync_ptsz, true},
    {"cuMemAllocFromPoolAsync_ptsz", (void *)cuMemAllocFromPoolAsync_ptsz, true},
    {"cuMemGetInfo_v2", (void *)cuMemGetInfo_v2, true},
    {"cuStreamBeginCapture_v2", (void *)cuStreamBeginCapture_v2, true},
    {"cuStreamBeginCapture_v2_ptsz", (void *)cuStreamBeginCapture_v2_ptsz, true},
    {"cuStreamEndCapture", (void *)cuStreamEndCapture, true},
    {"cuStreamEndCapture_ptsz", (void *)cuStreamEndCapture_ptsz, true},
    {"cuGetProcAddress", (void *)cuGetProcAddress, true},
    {"cuIpcGetMemHandle", (void *)cuIpcGetMemHandle, true},
    {"cuIpcOpenMemHandle_v2", (void *)cuIpcOpenMemHandle_v2, true},
    {"cuIpcOpenMemHandle", (void *)cuIpcOpenMemHandle, true},
    {"cuIpcCloseMemHandle", (void *)cuIpcCloseMemHandle, true},
    {"cuGetProcAddress_v2", (void *)cuGetProcAddress_v2, true},
    {"cudaMalloc", (void *)cudaMalloc, false},
    {"cudaFree", (void *)cudaFree, false},
    {"cudaMallocAsync", (void *)cudaMallocAsync, false},
    {"cudaFreeAsync", (void *)cudaFreeAsync, false},
    {"cudaMallocFromPoolAsync", (void *)cudaMallocFromPoolAsync, false},
    {"cudaMallocAsync_ptsz", (void *)cudaMallocAsync_ptsz, false},
    {"cudaFreeAsync_ptsz", (void *)cudaFreeAsync_ptsz, false},
    {"cudaMallocFromPoolAsync_ptsz", (void *)cudaMallocFromPoolAsync_ptsz, false},
    {"cudaMemGetInfo", (void *)cudaMemGetInfo, false},
    {"cudaStreamBeginCapture", (void *)cudaStreamBeginCapture, false},
    {"cudaStreamBeginCapture_ptsz", (void *)cudaStreamBeginCapture_ptsz, false},
    {"cudaStreamEndCapture", (void *)cudaStreamEndCapture, false},
    {"cudaStreamEndCapture_ptsz", (void *)cudaStreamEndCapture_ptsz, false},
    {"cudaMemPoolGetAttribute", (void *)cudaMemPoolGetAttribute, false},
    {"cudaMemPoolSetAttribute", (void *)cudaMemPoolSetAttribute, false},
    {"cudaIpcGetMemHandle", (void *)cudaIpcGetMemHandle, false},
    {"cudaIpcOpenMemHandle", (void *)cudaIpcOpenMemHandle, false},
    {"cudaIpcCloseMemHandle", (void *)cudaIpcCloseMemHandle, false},
    {"ncclGroupStart", (void *)ncclGroupStart, false},
    {"ncclGroupEnd", (void *)ncclGroupEnd, false},
    {"ncclAllReduce", (void *)ncclAllReduce, false},
    {"ncclReduce", (void *)ncclReduce, false},
    {"ncclBroadcast", (void *)ncclBroadcast, false},
    {"ncclReduceScatter", (void *)ncclReduceScatter, false},
    {"ncclAllGather", (void *)ncclAllGather, false},
    {"ncclSend", (void *)ncclSend, false},
    {"ncclRecv", (void *)ncclRecv, false},
    {"cuptiSubscribe", (void *)cuptiSubscribe, false},
    {"cuptiSubscribe_v2", (void *)cuptiSubscribe_v2, false},
    {"cuptiUnsubscribe", (void *)cuptiUnsubscribe, false},
    {"cuptiEnableCallback", (void *)cuptiEnableCallback, false},
    {"cuptiEnableDomain", (void *)cuptiEnableDomain, false},
    {"cuptiEnableAllDomains", (void *)cuptiEnableAllDomains, false},
    {"cuptiGetCallbackState", (void *)cuptiGetCallbackState, false},
    {"cuptiFinalize", (void *)cuptiFinalize, false},
};
#define NDOORS (sizeof doors / sizeof doors[0])

PS_NO_SANITIZE static const struct door *door_named(const char *name)
{
  /* Cheap reject first: every served name starts with "cu" or "nccl". */
  if (!(name[0] == 'c' && name[1] == 'u') && !(name[0] == 'n' && name[1] == 'c'))
    return NULL;
  for (size_t i = 0; i < NDOORS; i++)
    if (strcmp(doors[i].name, name) == 0)
      return &doors[i];
  return NULL;
}

/* The real driver's address of each driver door, resolved once the driver is loaded. */
static void *driver_real[NDOORS];
static pthread_once_t driver_real_once = PTHREAD_ONCE_INIT;

static void resolve_driver_real(void)
{
  for (size_t i = 0; i < NDOORS; i++)
    if (doors[i].driver)
      driver_real[i] = ps_driver_symbol(doors[i].name);
}

static void *door_replacing(void *real)
{
  pthread_once(&driver_real_once, resolve_driver_real);
  for (size_t i = 0; i < NDOORS; i++)
    if (real && driver_real[i] == real)
      return doors[i].door;
  return NULL;
}

/* RTLD_NEXT from the caller's place: the objects after the caller in load order. A
 * link_map is not a usable dlsym handle for objects the loader brought in, so each is
 * reopened with RTLD_NOLOAD (a handle also searches that object's dependencies: a
 * slightly wider search than glibc's, which matters only for symbols defined twice). */
static void *next_after(const void *caller, const char *name)
{
  Dl_info info;
  struct link_map *self = NULL;
  if (!dladdr1(caller, &info, (void **)&self, RTLD_DL_LINKMAP) || !self)
    return NULL;
  for (struct link_map *l = self->l_next; l; l = l->l_next) {
    if (!l->l_name || !l->l_name[0])
      continue;
    void *h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
      continue;
    void *f = ps_real_dlsym(h, name);
    dlclose(h);
    if (f)
      return f;
  }
  return NULL;
}

/* glibc's dlsym finds RTLD_NEXT relative to its caller's return address. A name psshim
 * does not serve goes to glibc as a tail call, so that address is still our caller's and
 * the lookup is exactly glibc's (sanitizer runtimes and other interposers resolve their
 * RTLD_NEXT symbols this way before any constructor has run). */
#if defined(__clang__)
#define PS_TAIL __attribute__((musttail))
#define PS_SIBCALLS
#else
#define PS_TAIL
#define PS_SIBCALLS __attribute__((optimize("O2", "optimize-sibling-calls")))
#endif

PS_DEFAULT_VISIBILITY PS_SIBCALLS PS_NO_SANITIZE void *dlsym(void *handle, const char *name)
{
  /* psshim's own lookups (comm/ loading NCCL) get the real functions, not the doors. */
  const struct door *d = ps_in_own_calls() ? NULL : door_named(name);
  if (!d)
    PS_TAIL return ps_glibc_dlsym()(handle, name);
  void *real = handle == RTLD_NEXT ? next_after(__builtin_return_address(0), name) : ps_real_dlsym(handle, name);
  if (!real || real == d->door)
    return real;
  /* Route to psshim's door; the door itself passes what it does not serve to the real
   * function it finds on its own (the driver table or cudart). */
  return d->door;
}

void *ps_next_symbol(const char *name, const char *const *sonames)
{
  void *f = ps_real_dlsym(RTLD_NEXT, name);
  for (size_t i = 0; !f && sonames[i]; i++) {
    void *lib = dlopen(sonames[i], RTLD_LAZY | RTLD_NOLOAD);
    if (lib) {
      f = ps_real_dlsym(lib, name);
      dlclose(lib);
    }
  }
  return f;
}

static CUresult wrap_proc(CUresult r, void **pfn)
{
  if (r == CUDA_SUCCESS && pfn && *pfn) {
    void *door = door_replacing(*pfn);
    if (door)
      *pfn = door;
  }
  return r;
}

PS_DEFAULT_VISIBILITY CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                                   CUdriverProcAddressQueryResult *symbolStatus)
{
  if (!ps_driver_load())
    return CUDA_ERROR_NOT_INITIALIZED;
  return wrap_proc(ps_driver.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus), pfn);
}

PS_DEFAULT_VISIBILITY CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
  /* By its exported name: cuda.h makes cuGetProcAddress a macro for the _v2 form. */
  static CUresult (*real_v1)(const char *, void **, int, cuuint64_t);
  if (!real_v1)
    real_v1 = (CUresult(*)(const char *, void **, int, cuuint64_t))ps_driver_symbol("cuGetProcAddress");
  if (!real_v1)
    return CUDA_ERROR_NOT_FOUND;
  return wrap_proc(real_v1(symbol, pfn, cudaVersion, flags), pfn);
}
