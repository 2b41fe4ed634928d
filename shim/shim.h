/* shim/ — psshim's doors to the process, and the wiring above everything else.
 *
 * The doors: exported CUDA runtime and driver allocation symbols, the dlsym and
 * cuGetProcAddress overrides, PyTorch's pluggable-allocator entry points, the CUPTI and
 * NCCL doors, constructor and destructor. The wiring (wiring.c) connects observation
 * (tracer/) to paging and sharing (allocator/). Nothing below shim/ includes this header;
 * its exported symbols are the program's, never another folder's. */
#ifndef PSSHIM_SHIM_H
#define PSSHIM_SHIM_H

#include "allocator/allocator.h"
#include "core/core.h"

#include <cuda_runtime_api.h>

/* wiring.c: registered at start (observation starts with the first device set up); the
 * progress it saw, for the statistics; its end at exit (no CUPTI calls). */
void ps_wiring_init(void);
struct psa_progress ps_wiring_progress(void);
void ps_wiring_end(void);

/* psshim serves allocations: the driver loaded, not disabled, not a forked child. */
bool ps_active(void);
/* The real definition of a symbol psshim exports: next in the search order after psshim,
 * else in the first already-loaded library of `sonames` (NULL-terminated; a library
 * loaded privately with RTLD_LOCAL). NULL when there is none. */
void *ps_next_symbol(const char *name, const char *const *sonames);
/* Declares real_<name>, the real definition of the exported door <name>, found once. */
#define PS_REAL(name, sonames) \
  static __typeof__(&name) real_##name; \
  if (!real_##name) real_##name = (__typeof__(&name))ps_next_symbol(#name, sonames)
/* The CUDA runtime's libraries (runtime_doors.c), and real_<name> among them. */
extern const char *const ps_cudart_sonames[];
#define PS_REAL_CUDART(name) PS_REAL(name, ps_cudart_sonames)

/* pool is the current memory pool of the current context's device: the only pool psshim
 * serves (a pool the program made has properties, IPC export or a host location, that
 * psshim's chunks would not honour). cudaMemPool_t is the same handle. */
bool ps_pool_is_current(CUmemoryPool pool);

/* The device of the calling thread's current context; false when there is none. */
bool ps_current_device(int *ordinal);
/* The runtime's error for a driver result (runtime_doors.c). */
cudaError_t ps_to_runtime(CUresult r);
/* A context current the way the runtime makes one (its primary context of the current
 * device), and its device; false when psshim does not serve (runtime_doors.c). */
bool ps_runtime_device(int *ordinal);

/* The per-thread-default-stream forms of the driver doors (cuda.h declares them only
 * under CUDA_API_PER_THREAD_DEFAULT_STREAM): stream 0 means the thread's own stream. */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
/* The exported door functions, for the lookup tables. */
#define PS_DEFAULT_VISIBILITY __attribute__((visibility("default")))

#endif
