/* Helpers shared by the fakecuda tests (cmocka). */
#ifndef FAKECUDA_TEST_COMMON_H
#define FAKECUDA_TEST_COMMON_H

#include <setjmp.h> /* cmocka needs these first */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <cuda.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fakecuda.h"

#define MiB ((size_t)1 << 20)
#define GRAN (2 * MiB)

#define CU_OK(call) assert_int_equal((call), CUDA_SUCCESS)

/* Runs fn in a forked child with the default SIGSEGV action (no sanitizer handler, no
 * core file) and returns its wait status. The child must only touch memory or use
 * streams it creates itself: the parent's stream workers do not exist there. */
static inline int run_in_child(void (*fn)(void *), void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    signal(SIGSEGV, SIG_DFL);
    fn(arg);
    _exit(0);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  return status;
}
#define assert_killed_by_segv(status) assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV)
#define assert_exited_ok(status) assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0)

/* cuInit and the primary context of device 0 made current. */
static inline CUcontext setup_context(void) {
  CUcontext ctx;
  CU_OK(cuInit(0));
  CU_OK(cuDevicePrimaryCtxRetain(&ctx, 0));
  CU_OK(cuCtxSetCurrent(ctx));
  return ctx;
}

static inline CUmemAllocationProp frame_prop(CUmemLocationType type, int id) {
  CUmemAllocationProp p = {0};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = type;
  p.location.id = id;
  return p;
}

static inline CUmemGenericAllocationHandle make_frame(size_t size) {
  CUmemGenericAllocationHandle h;
  CUmemAllocationProp p = frame_prop(CU_MEM_LOCATION_TYPE_DEVICE, 0);
  CU_OK(cuMemCreate(&h, size, &p, 0));
  return h;
}

static inline void allow_rw(CUdeviceptr p, size_t size) {
  CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CU_OK(cuMemSetAccess(p, size, &d, 1));
}

/* A host frame, and host access (with flags) to a mapped range of host frames: what host
 * code needs to dereference it. */
static inline CUmemGenericAllocationHandle make_host_frame(size_t size) {
  CUmemGenericAllocationHandle h;
  CUmemAllocationProp p = frame_prop(CU_MEM_LOCATION_TYPE_HOST_NUMA, 0);
  CU_OK(cuMemCreate(&h, size, &p, 0));
  return h;
}

static inline void allow_host(CUdeviceptr p, size_t size, CUmemAccess_flags flags) {
  CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_HOST_NUMA, 0}, flags};
  CU_OK(cuMemSetAccess(p, size, &d, 1));
}

#endif
