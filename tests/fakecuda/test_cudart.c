/* The fake runtime reaches the driver through its exported symbols: this program
 * defines cuMemAlloc_v2 / cuMemFree_v2 itself (exported, like an LD_PRELOADed shim
 * would) and forwards to the next definition, the fake libcuda. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <string.h>

#include "test_common.h"

static int alloc_calls, free_calls;

__attribute__((visibility("default"))) CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
  static CUresult (*next)(CUdeviceptr *, size_t);
  if (!next) next = (CUresult(*)(CUdeviceptr *, size_t))dlsym(RTLD_NEXT, "cuMemAlloc_v2");
  alloc_calls++;
  return next(dptr, bytesize);
}

__attribute__((visibility("default"))) CUresult cuMemFree_v2(CUdeviceptr dptr) {
  static CUresult (*next)(CUdeviceptr);
  if (!next) next = (CUresult(*)(CUdeviceptr))dlsym(RTLD_NEXT, "cuMemFree_v2");
  free_calls++;
  return next(dptr);
}

/* (g) */
static void test_malloc_free_reach_the_driver(void **state) {
  (void)state;
  void *p = NULL;
  size_t free0, free1, total;
  assert_int_equal(cudaFree(NULL), cudaSuccess); /* initialises; no driver free */
  assert_int_equal(free_calls, 0);
  assert_int_equal(cudaMemGetInfo(&free0, &total), cudaSuccess);
  assert_int_equal(total, (size_t)1 << 30);

  assert_int_equal(cudaMalloc(&p, 3 * MiB), cudaSuccess);
  assert_int_equal(alloc_calls, 1);
  assert_non_null(p);
  assert_int_equal(cudaMemGetInfo(&free1, &total), cudaSuccess);
  assert_int_equal(free0 - free1, 3 * MiB);
  unsigned int type = 0;
  CU_OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p));
  assert_int_equal(type, CU_MEMORYTYPE_DEVICE);

  /* The runtime made device 0's primary context current. */
  CUcontext cur, primary;
  CU_OK(cuCtxGetCurrent(&cur));
  CU_OK(cuDevicePrimaryCtxRetain(&primary, 0));
  assert_ptr_equal(cur, primary);
  CU_OK(cuDevicePrimaryCtxRelease_v2(0));

  assert_int_equal(cudaFree(p), cudaSuccess);
  assert_int_equal(free_calls, 1);
  assert_int_equal(cudaMemGetInfo(&free1, &total), cudaSuccess);
  assert_int_equal(free1, free0);
  assert_int_equal(cudaFree(p), cudaErrorInvalidValue);
  assert_int_equal(free_calls, 2);
}

static void test_copies_and_streams(void **state) {
  (void)state;
  char in[100], out[100];
  void *d = NULL;
  cudaStream_t s;
  for (int i = 0; i < 100; i++) in[i] = (char)i;
  assert_int_equal(cudaMalloc(&d, 100), cudaSuccess);
  assert_int_equal(cudaMemcpy(d, in, 100, cudaMemcpyHostToDevice), cudaSuccess);
  assert_int_equal(cudaMemset((char *)d + 10, 0x5a, 5), cudaSuccess);
  memset(out, 0, sizeof out);
  assert_int_equal(cudaMemcpy(out, d, 100, cudaMemcpyDeviceToHost), cudaSuccess);
  assert_int_equal(out[9], 9);
  assert_int_equal(out[10], 0x5a);
  assert_int_equal(out[14], 0x5a);
  assert_int_equal(out[15], 15);
  assert_int_equal(cudaMemcpy(out, d, 100, (enum cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection);

  assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
  void *a = NULL, *b = NULL;
  assert_int_equal(cudaMallocAsync(&a, 100, s), cudaSuccess);
  cudaMemPool_t pool;
  assert_int_equal(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  assert_int_equal(cudaMallocFromPoolAsync(&b, 100, pool, s), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(a, d, 100, cudaMemcpyDeviceToDevice, s), cudaSuccess);
  assert_int_equal(cudaMemcpyAsync(b, a, 100, cudaMemcpyDefault, s), cudaSuccess);
  memset(out, 0, sizeof out);
  assert_int_equal(cudaMemcpyAsync(out, b, 100, cudaMemcpyDeviceToHost, s), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_int_equal(out[50], 50);
  assert_int_equal(cudaFreeAsync(a, s), cudaSuccess);
  assert_int_equal(cudaFreeAsync(b, s), cudaSuccess);
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
  assert_int_equal(cudaFree(d), cudaSuccess);
}

static void add_kernel(void **args, void *user) {
  (void)user;
  int *p = *(int **)args[0];
  *p += *(int *)args[1];
}

static void test_launch_and_events(void **state) {
  (void)state;
  static const size_t sizes[] = {sizeof(int *), sizeof(int)};
  CUfunction f = fakecuda_register_kernel("add", add_kernel, NULL, 2, sizes);
  int *d = NULL, host = 0, inc = 4;
  cudaEvent_t ev;
  assert_int_equal(cudaMalloc((void **)&d, sizeof(int)), cudaSuccess);
  assert_int_equal(cudaMemset(d, 0, sizeof(int)), cudaSuccess);
  void *args[] = {&d, &inc};
  dim3 one = {1, 1, 1};
  assert_int_equal(cudaLaunchKernel((const void *)f, one, one, args, 0, NULL), cudaSuccess);
  assert_int_equal(cudaLaunchKernel((const void *)f, one, one, args, 0, NULL), cudaSuccess);
  assert_int_equal(cudaEventCreate(&ev), cudaSuccess);
  assert_int_equal(cudaEventRecord(ev, NULL), cudaSuccess);
  assert_int_equal(cudaEventSynchronize(ev), cudaSuccess);
  assert_int_equal(cudaMemcpy(&host, d, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
  assert_int_equal(host, 8);
  assert_int_equal(cudaLaunchKernel((const void *)&host, one, one, args, 0, NULL), cudaErrorInvalidDeviceFunction);
  assert_int_equal(cudaGetLastError(), cudaErrorInvalidDeviceFunction);
  assert_int_equal(cudaEventDestroy(ev), cudaSuccess);
  assert_int_equal(cudaFree(d), cudaSuccess);
}

static void test_errors_and_devices(void **state) {
  (void)state;
  void *p = NULL;
  int dev = -1, count = 0, version = 0;
  assert_int_equal(cudaGetLastError(), cudaSuccess);
  assert_int_equal(cudaMalloc(&p, (size_t)2 << 30), cudaErrorMemoryAllocation); /* past the 1 GiB device */
  assert_int_equal(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
  assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
  assert_int_equal(cudaGetLastError(), cudaSuccess);
  assert_string_equal(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
  assert_string_equal(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue");
  assert_string_equal(cudaGetErrorString((cudaError_t)123456), "unrecognized error code");

  assert_int_equal(cudaGetDeviceCount(&count), cudaSuccess);
  assert_int_equal(count, 1);
  assert_int_equal(cudaSetDevice(1), cudaErrorInvalidDevice);
  assert_int_equal(cudaSetDevice(0), cudaSuccess);
  assert_int_equal(cudaGetDevice(&dev), cudaSuccess);
  assert_int_equal(dev, 0);
  assert_int_equal(cudaDriverGetVersion(&version), cudaSuccess);
  assert_int_equal(version, 13000);
  assert_int_equal(cudaRuntimeGetVersion(&version), cudaSuccess);
  assert_int_equal(version, CUDART_VERSION);
}

int main(void) {
  /* No cuInit here: the runtime initialises the driver itself. */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_malloc_free_reach_the_driver),
      cmocka_unit_test(test_copies_and_streams),
      cmocka_unit_test(test_launch_and_events),
      cmocka_unit_test(test_errors_and_devices),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
