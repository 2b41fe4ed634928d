/* Driver basics on the fake: initialisation, devices, contexts (thread-local current
 * context), error strings and cuGetProcAddress. Two devices (set in main). */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "test_common.h"

static void test_before_init(void **state) {
  (void)state;
  int n = -1, version = 0;
  void *fn = NULL;
  assert_int_equal(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
  CU_OK(cuDriverGetVersion(&version));
  assert_int_equal(version, 13000);
  CU_OK(cuGetProcAddress_v2("cuInit", &fn, 13000, 0, NULL)); /* how runtimes find cuInit */
  assert_ptr_equal(fn, (void *)cuInit);
  assert_int_equal(cuInit(1), CUDA_ERROR_INVALID_VALUE);
  CU_OK(cuInit(0));
  CU_OK(cuInit(0));
}

static void test_devices(void **state) {
  (void)state;
  int n = 0, v = -1;
  CUdevice dev;
  char name[64];
  size_t bytes = 0;
  CU_OK(cuDeviceGetCount(&n));
  assert_int_equal(n, 2);
  CU_OK(cuDeviceGet(&dev, 1));
  assert_int_equal(dev, 1);
  assert_int_equal(cuDeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
  CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  assert_int_equal(v, 1);
  CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 1));
  assert_int_equal(v, 9);
  CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 1));
  assert_int_equal(v, 0);
  CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0));
  assert_int_equal(v, 1);
  assert_int_equal(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 0), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 2), CUDA_ERROR_INVALID_DEVICE);
  CU_OK(cuDeviceGetName(name, sizeof name, 0));
  assert_non_null(strstr(name, "fakecuda"));
  CU_OK(cuDeviceTotalMem_v2(&bytes, 1));
  assert_int_equal(bytes, (size_t)1 << 30);
}

struct thread_view {
  CUcontext seen;
  CUresult get_device;
};
static void *other_thread(void *arg) {
  struct thread_view *v = arg;
  CUdevice d;
  cuCtxGetCurrent(&v->seen);
  v->get_device = cuCtxGetDevice(&d);
  return NULL;
}

static void test_contexts(void **state) {
  (void)state;
  CUcontext c0, c1, cur = (CUcontext)1, popped;
  CUdevice dev = -1;
  CUdeviceptr d;
  CU_OK(cuCtxGetCurrent(&cur));
  assert_null(cur);
  assert_int_equal(cuCtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT);
  assert_int_equal(cuMemAlloc_v2(&d, 16), CUDA_ERROR_INVALID_CONTEXT);
  assert_int_equal(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
  assert_int_equal(cuCtxPopCurrent_v2(&popped), CUDA_ERROR_INVALID_CONTEXT);

  CU_OK(cuDevicePrimaryCtxRetain(&c0, 0));
  CU_OK(cuDevicePrimaryCtxRetain(&c1, 1));
  assert_ptr_not_equal(c0, c1);
  CU_OK(cuCtxSetCurrent(c0));
  CU_OK(cuCtxGetDevice(&dev));
  assert_int_equal(dev, 0);
  CU_OK(cuCtxPushCurrent_v2(c1));
  CU_OK(cuCtxGetDevice(&dev));
  assert_int_equal(dev, 1);
  CU_OK(cuCtxPopCurrent_v2(&popped));
  assert_ptr_equal(popped, c1);
  CU_OK(cuCtxGetCurrent(&cur));
  assert_ptr_equal(cur, c0);

  /* The current context is per thread. */
  struct thread_view v = {(CUcontext)1, CUDA_SUCCESS};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, other_thread, &v), 0);
  pthread_join(t, NULL);
  assert_null(v.seen);
  assert_int_equal(v.get_device, CUDA_ERROR_INVALID_CONTEXT);

  /* Released to zero retains, the primary context cannot be used until retained again. */
  CU_OK(cuDevicePrimaryCtxRelease_v2(1));
  assert_int_equal(cuDevicePrimaryCtxRelease_v2(1), CUDA_ERROR_INVALID_CONTEXT);
  CU_OK(cuCtxSetCurrent(c1));
  assert_int_equal(cuMemAlloc_v2(&d, 16), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CU_OK(cuDevicePrimaryCtxRetain(&c1, 1));
  CU_OK(cuMemAlloc_v2(&d, 16));
  CU_OK(cuMemFree_v2(d));
  CU_OK(cuCtxSynchronize());
  CU_OK(cuCtxSetCurrent(NULL)); /* pops */
  CU_OK(cuCtxGetCurrent(&cur));
  assert_null(cur);
}

static void test_error_strings(void **state) {
  (void)state;
  const char *s = NULL;
  CU_OK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
  assert_string_equal(s, "out of memory");
  CU_OK(cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &s));
  assert_string_equal(s, "CUDA_ERROR_INVALID_VALUE");
  CU_OK(cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &s));
  assert_string_equal(s, "CUDA_ERROR_ILLEGAL_ADDRESS");
  assert_int_equal(cuGetErrorString((CUresult)54321, &s), CUDA_ERROR_INVALID_VALUE);
  assert_null(s);
}

static void *proc(const char *name, int version, cuuint64_t flags, CUresult expect,
                  CUdriverProcAddressQueryResult expect_status) {
  void *fn = (void *)1;
  CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)99;
  assert_int_equal(cuGetProcAddress_v2(name, &fn, version, flags, &st), expect);
  assert_int_equal(st, expect_status);
  return fn;
}

static void test_get_proc_address(void **state) {
  (void)state;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(lib);
  const cuuint64_t PT = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, LEG = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
  const CUdriverProcAddressQueryResult OK = CU_GET_PROC_ADDRESS_SUCCESS;
  struct {
    const char *name;
    int version;
    cuuint64_t flags;
    const char *symbol;
  } cases[] = {
      {"cuMemAlloc", 13000, 0, "cuMemAlloc_v2"},
      {"cuMemAlloc", 3020, PT, "cuMemAlloc_v2"},
      {"cuMemGetInfo", 12000, 0, "cuMemGetInfo_v2"},
      {"cuMemcpyHtoD", 13000, LEG, "cuMemcpyHtoD_v2"},
      {"cuMemcpyHtoD", 13000, PT, "cuMemcpyHtoD_v2_ptds"},
      {"cuMemcpyAsync", 13000, PT, "cuMemcpyAsync_ptsz"},
      {"cuMemcpyAsync", 13000, 0, "cuMemcpyAsync"},
      {"cuLaunchKernel", 12000, PT, "cuLaunchKernel_ptsz"},
      {"cuLaunchKernelEx", 12000, PT, "cuLaunchKernelEx_ptsz"},
      {"cuStreamDestroy", 13000, 0, "cuStreamDestroy_v2"},
      {"cuStreamDestroy", 3000, 0, "cuStreamDestroy"},
      {"cuEventElapsedTime", 13000, 0, "cuEventElapsedTime_v2"},
      {"cuEventElapsedTime", 12000, 0, "cuEventElapsedTime"},
      {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
      {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
      {"cuDevicePrimaryCtxRelease", 12000, 0, "cuDevicePrimaryCtxRelease_v2"},
      {"cuFuncGetParamInfo", 12040, 0, "cuFuncGetParamInfo"},
      {"cuMemAllocAsync", 12000, PT, "cuMemAllocAsync_ptsz"},
      {"cuDeviceGetMemPool", 12000, 0, "cuDeviceGetMemPool"},
      {"cuKernelGetParamInfo", 13000, PT, "cuKernelGetParamInfo"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    void *want = dlsym(lib, cases[i].symbol);
    assert_non_null(want);
    assert_ptr_equal(proc(cases[i].name, cases[i].version, cases[i].flags, CUDA_SUCCESS, OK), want);
  }
  assert_null(proc("cuMemAlloc", 3000, 0, CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT));
  assert_null(proc("cuFuncGetParamInfo", 12030, 0, CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT));
  assert_null(proc("cuNoSuchThing", 13000, 0, CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND));
  assert_null(proc("cuMemAlloc_v2", 13000, 0, CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND));
  void *fn;
  assert_int_equal(cuGetProcAddress_v2("cuInit", &fn, 13000, 8, NULL), CUDA_ERROR_INVALID_VALUE);
  dlclose(lib);
}

int main(void) {
  setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
  unsetenv("FAKECUDA_DEVICE_MEM");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_before_init), /* first: the others rely on its cuInit */
      cmocka_unit_test(test_devices),
      cmocka_unit_test(test_contexts),
      cmocka_unit_test(test_error_strings),
      cmocka_unit_test(test_get_proc_address),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
