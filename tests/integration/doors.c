/* psshim's doors under LD_PRELOAD on the fake driver: dlsym of exact names only,
 * cuGetProcAddress (both forms) answering as the driver's table does at every version and
 * flag, foreign pointers passed through, cudaMemGetInfo and cuMemGetInfo answering for
 * psshim's budgets and live bytes exactly, a forked child passing through, also when
 * another thread was inside psshim at the fork.
 * Each check prints its name; any failure exits non-zero naming it. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*proc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*proc_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*table_fn)(const char *, int, cuuint64_t, void **);
typedef CUresult (*mem_info_fn)(size_t *, size_t *);

/* What a program under psshim must get for the driver's entry point `real`: the function
 * its exported name resolves to, which is psshim's door where psshim exports that name
 * (it is preloaded) and the driver's own otherwise. */
static void *as_program_sees(void *real)
{
  Dl_info info;
  if (!real || !dladdr(real, &info) || !info.dli_sname)
    return real;
  void *by_name = dlsym(RTLD_DEFAULT, info.dli_sname);
  return by_name ? by_name : real;
}

/* Both forms of cuGetProcAddress, for names psshim serves and names it does not, at
 * versions on each side of where entry points changed, with each flag: the same result
 * and function as the driver's own table gives, door for door. Returns the mismatches. */
static int proc_mismatches(void *cuda)
{
  static const char *const names[] = {
      "cuMemAlloc", "cuMemFree", "cuMemAllocAsync", "cuMemFreeAsync", "cuMemAllocFromPoolAsync", "cuMemGetInfo",
      "cuIpcGetMemHandle", "cuIpcOpenMemHandle", "cuIpcCloseMemHandle", "cuGetProcAddress", "cuStreamBeginCapture",
      "cuStreamEndCapture", "cuEventElapsedTime", "cuStreamDestroy", "cuMemcpyAsync", "cuLaunchKernel", "cuInit",
      "cuNoSuchThing",
  };
  static const int versions[] = {2000, 3020, 4000, 4010, 7000, 10000, 10010, 11000, 11020, 11030, 12000, 12080, 13000};
  static const cuuint64_t flags[] = {CU_GET_PROC_ADDRESS_DEFAULT, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                                     CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};
  table_fn table = (table_fn)dlsym(cuda, "fakecuda_proc_address");
  proc_fn v2 = (proc_fn)dlsym(cuda, "cuGetProcAddress_v2");
  proc_v1_fn v1 = (proc_v1_fn)dlsym(cuda, "cuGetProcAddress");
  if (!table || !v2 || !v1)
    return -1;
  int bad = 0;
  for (size_t n = 0; n < sizeof names / sizeof names[0]; n++)
    for (size_t v = 0; v < sizeof versions / sizeof versions[0]; v++)
      for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++) {
        void *real = NULL, *got2 = NULL, *got1 = NULL;
        CUdriverProcAddressQueryResult st;
        CUresult want = table(names[n], versions[v], flags[f], &real);
        CUresult r2 = v2(names[n], &got2, versions[v], flags[f], &st);
        CUresult r1 = v1(names[n], &got1, versions[v], flags[f]);
        void *expect = as_program_sees(real);
        if (r2 != want || r1 != want || got2 != expect || got1 != expect) {
          if (bad++ < 5)
            printf("  cuGetProcAddress(%s, %d, flags %llu): %d/%d %p/%p, the table's %d %p (as seen %p)\n", names[n],
                   versions[v], (unsigned long long)flags[f], (int)r1, (int)r2, got1, got2, (int)want, real, expect);
        }
      }
  return bad;
}

/* Whether f is one of psshim's doors. */
static bool in_psshim(void *f)
{
  Dl_info info;
  return f && dladdr(f, &info) && strstr(info.dli_fname, "libpsshim");
}

/* cudaMemGetInfo, cuMemGetInfo (by dlsym and by cuGetProcAddress) all answer total =
 * GPU + host budget and free = total - the live bytes the pool reports used. */
static bool mem_info_exact(void *cuda, cudaMemPool_t pool, size_t total_want, size_t *free_out)
{
  mem_info_fn by_dlsym = (mem_info_fn)dlsym(cuda, "cuMemGetInfo_v2"), by_proc = NULL;
  proc_fn proc = (proc_fn)dlsym(cuda, "cuGetProcAddress_v2");
  CUdriverProcAddressQueryResult st;
  cuuint64_t used = 0;
  size_t f[3] = {0}, t[3] = {0};
  bool ok = by_dlsym && proc && !proc("cuMemGetInfo", (void **)&by_proc, 12000, 0, &st) && by_proc &&
            !cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) &&
            cudaMemGetInfo(&f[0], &t[0]) == cudaSuccess && !by_dlsym(&f[1], &t[1]) && !by_proc(&f[2], &t[2]);
  for (int i = 0; ok && i < 3; i++)
    ok = t[i] == total_want && f[i] == total_want - used;
  *free_out = f[0];
  return ok;
}

/* A thread allocating and freeing without pause: it holds a device's lock much of the time. */
static atomic_bool hammer_stop;

static void *hammer(void *arg)
{
  (void)arg;
  while (!atomic_load(&hammer_stop)) {
    void *p = NULL;
    if (cudaMallocAsync(&p, 4096, 0) == cudaSuccess)
      cudaFreeAsync(p, 0);
  }
  return NULL;
}

/* Forks while the hammer runs; each child reads psshim's statistics, which takes every
 * device's lock, and must return within a second. Returns the first fork whose child did
 * not (or that failed, or 0 when the hammer cannot start), or -1. */
static int forks_beside_hammer(int forks)
{
  size_t (*stats_json)(char *, size_t) = (size_t(*)(char *, size_t))dlsym(RTLD_DEFAULT, "psshim_stats_json");
  pthread_t t;
  if (!stats_json || pthread_create(&t, NULL, hammer, NULL))
    return 0;
  int stuck = -1;
  for (int i = 0; i < forks && stuck < 0; i++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
      stuck = i;
      break;
    }
    if (pid == 0) {
      alarm(1); /* a lock inherited held never comes free: SIGALRM ends the child */
      char buf[64];
      _exit(stats_json(buf, sizeof buf) ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      stuck = i;
  }
  atomic_store(&hammer_stop, true);
  pthread_join(t, NULL);
  return stuck;
}

int main(void)
{
  int (*owns)(const void *) = (int (*)(const void *))dlsym(RTLD_DEFAULT, "psshim_owns");
  CHECK("psshim is preloaded", owns != NULL);
  if (!owns)
    return 1;
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
  CHECK("libcuda.so.1 loads", cuda != NULL);
  CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(cuda, "cuInit");
  CHECK("cuInit resolves", init && init(0) == CUDA_SUCCESS);
  Dl_info info;
  CHECK("dlsym(cuInit) is the driver's own", dladdr((void *)init, &info) && strstr(info.dli_fname, "libcuda"));
  /* a context, as a driver-API program makes one */
  CUdevice dev;
  CUcontext ctx;
  CUresult (*dev_get)(CUdevice *, int) = (CUresult(*)(CUdevice *, int))dlsym(cuda, "cuDeviceGet");
  CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))dlsym(cuda, "cuDevicePrimaryCtxRetain");
  CUresult (*set_cur)(CUcontext) = (CUresult(*)(CUcontext))dlsym(cuda, "cuCtxSetCurrent");
  CHECK("primary context current", !dev_get(&dev, 0) && !retain(&ctx, dev) && !set_cur(ctx));

  alloc_fn alloc = (alloc_fn)dlsym(cuda, "cuMemAlloc_v2");
  CUdeviceptr p = 0;
  CHECK("dlsym(cuMemAlloc_v2) allocates in psshim's space", alloc && !alloc(&p, 1 << 20) && owns((void *)p));
  CHECK("dlsym(cudnnCreate) stays not found", dlsym(cuda, "cudnnCreate") == NULL);
  CHECK("dlsym(cuMemAlloc_v2x) stays not found", dlsym(cuda, "cuMemAlloc_v2x") == NULL);
  /* dlvsym is not overridden: glibc's own answer for this caller */
  CHECK("dlsym(RTLD_NEXT, malloc) is what glibc gives the caller",
        dlsym(RTLD_NEXT, "malloc") == dlvsym(RTLD_NEXT, "malloc", "GLIBC_2.2.5"));
  CHECK("dlsym twice gives the same door", dlsym(cuda, "cuMemAlloc_v2") == (void *)alloc);

  proc_fn proc = (proc_fn)dlsym(cuda, "cuGetProcAddress_v2");
  void *fn = NULL;
  CUdriverProcAddressQueryResult st;
  CHECK("cuGetProcAddress_v2 resolves", proc && !proc("cuMemAlloc", &fn, 13000, 0, &st) && fn);
  CUdeviceptr q = 0;
  CHECK("cuGetProcAddress(cuMemAlloc, 13000) allocates in psshim's space", fn && !((alloc_fn)fn)(&q, 4096) && owns((void *)q));
  fn = NULL;
  proc("cuMemAllocAsync", &fn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
  CHECK("per-thread-stream flag gives the _ptsz door", fn && fn == dlsym(RTLD_DEFAULT, "cuMemAllocAsync_ptsz"));
  fn = NULL;
  proc("cuMemAllocAsync", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
  CHECK("default flag gives the plain door", fn && fn == dlsym(RTLD_DEFAULT, "cuMemAllocAsync"));
  fn = NULL;
  proc("cuInit", &fn, 13000, 0, &st);
  CHECK("cuGetProcAddress(cuInit) is the driver's own", fn == (void *)init);
  fn = NULL;
  CHECK("cuGetProcAddress(no such symbol) fails as the driver does",
        proc("cuNoSuchThing", &fn, 13000, 0, &st) != CUDA_SUCCESS || fn == NULL);

  void *r = NULL;
  CHECK("cudaMalloc is served", cudaMalloc(&r, 1000) == cudaSuccess && owns(r));
  cudaMemPool_t pool = NULL;
  cuuint64_t used = 0, high = 0, zero = 0, reserved = 0;
  CHECK("the current pool's counters answer for psshim",
        !cudaDeviceGetMemPool(&pool, 0) && !cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) &&
            !cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) &&
            used >= (1 << 20) + 4096 + 1000 && reserved >= used);
  cudaFree(r);
  CHECK("a free lowers used bytes, not the high mark",
        !cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &zero) && zero < used &&
            !cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high) && high >= used);
  CHECK("setting the high mark resets it to the current value",
        !cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &(cuuint64_t){0}) &&
            !cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high) && high == zero);
  CHECK("cudaMalloc again", cudaMalloc(&r, 1000) == cudaSuccess && owns(r));
  char host[64];
  CHECK("cudaFree(host pointer) passes through to an error", cudaFree(host) != cudaSuccess);
  CHECK("cudaFree(NULL) succeeds", cudaFree(NULL) == cudaSuccess);
  CHECK("cudaFree(served) succeeds", cudaFree(r) == cudaSuccess);
  CHECK("a second free of it is refused", cudaFree(r) != cudaSuccess);
  size_t free_b = 0, total_b = 0;
  const char *want = getenv("EXPECT_TOTAL_BYTES");
  CHECK("cudaMemGetInfo answers psshim's budgets",
        cudaMemGetInfo(&free_b, &total_b) == cudaSuccess && want && total_b == strtoull(want, NULL, 10) && free_b <= total_b);
  /* Exactly: free is the budgets less the live bytes, before and after an allocation that
   * takes a chunk and a half (its mapped bytes differ from its live ones) and its free. */
  size_t total_want = want ? strtoull(want, NULL, 10) : 0, free0 = 0, free1 = 0, free2 = 0;
  const size_t odd = 3 * (1 << 20) + 512;
  void *big = NULL;
  CHECK("free = budgets - live bytes, in every door", mem_info_exact(cuda, pool, total_want, &free0));
  CHECK("cudaMalloc of 3M + 512", cudaMalloc(&big, odd) == cudaSuccess && owns(big));
  CHECK("an allocation takes its size from free, exactly",
        mem_info_exact(cuda, pool, total_want, &free1) && free1 == free0 - odd);
  CHECK("its free gives it back, exactly",
        cudaFree(big) == cudaSuccess && mem_info_exact(cuda, pool, total_want, &free2) && free2 == free0);
  int mismatches = proc_mismatches(cuda);
  CHECK("cuGetProcAddress (both forms) answers as the driver's table, at every version and flag", mismatches == 0);
  void *old_open = NULL, *new_open = NULL;
  CUdriverProcAddressQueryResult qs;
  CHECK("an older version gets the older door (cuIpcOpenMemHandle at 4010 and 11000)",
        !proc("cuIpcOpenMemHandle", &old_open, 4010, 0, &qs) && !proc("cuIpcOpenMemHandle", &new_open, 11000, 0, &qs) &&
            in_psshim(old_open) && in_psshim(new_open) && old_open != new_open &&
            old_open == dlsym(RTLD_DEFAULT, "cuIpcOpenMemHandle"));

  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    void *c = NULL, *c2 = NULL;
    cudaError_t e = cudaMalloc(&c, 4096);
    if (e != cudaSuccess || owns(c)) /* the child passes through */
      _exit(1);
    /* and so do its frees of what it did not get from psshim: the driver's memory goes back */
    _exit(cudaFree(c) == cudaSuccess && cudaMalloc(&c2, 4096) == cudaSuccess && cudaFreeAsync(c2, 0) == cudaSuccess
              ? 0 : 2);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK("a forked child passes through, its frees too", WIFEXITED(status) && WEXITSTATUS(status) == 0);
  void *after = NULL;
  CHECK("the parent still allocates after fork", cudaMalloc(&after, 4096) == cudaSuccess && owns(after));
  CHECK("forks beside a thread inside psshim: no child inherits a held lock", forks_beside_hammer(200) < 0);
  return failures ? 1 : 0;
}
