/* Kernel launches on the fake driver: the parameter buffer is laid out at the
 * registered offsets, from either launch form; cuFuncGetParamInfo agrees; a kernel
 * touching an unmapped chunk kills the process by SIGSEGV. */
#include <string.h>

#include "test_common.h"

struct triple { /* 24 bytes, 8-aligned */
  double x;
  int64_t y;
  char z[8];
};

struct seen {
  int32_t a;
  uint64_t b;
  struct triple t;
  char c;
  ptrdiff_t off[4]; /* where args[i] pointed, relative to args[0] */
  int runs;
};

static void mixed_kernel(void **args, void *user) {
  struct seen *s = user;
  memcpy(&s->a, args[0], 4);
  memcpy(&s->b, args[1], 8);
  memcpy(&s->t, args[2], sizeof s->t);
  memcpy(&s->c, args[3], 1);
  for (int i = 0; i < 4; i++) s->off[i] = (char *)args[i] - (char *)args[0];
  s->runs++;
}

static const size_t mixed_sizes[] = {4, 8, sizeof(struct triple), 1};
static const size_t mixed_offsets[] = {0, 8, 16, 40}; /* C layout of (int32, u64, triple, char) */

static void check_seen(const struct seen *s, int runs) {
  assert_int_equal(s->runs, runs);
  assert_int_equal(s->a, 0x11223344);
  assert_true(s->b == 0x8877665544332211ull);
  assert_true(s->t.x == 2.5);
  assert_true(s->t.y == -77);
  assert_string_equal(s->t.z, "triple");
  assert_int_equal(s->c, 'q');
  for (int i = 0; i < 4; i++) assert_int_equal(s->off[i], (ptrdiff_t)mixed_offsets[i]);
}

/* (d) */
static void test_param_info_and_both_launch_forms(void **state) {
  (void)state;
  struct seen seen = {0};
  CUfunction f = fakecuda_register_kernel("mixed", mixed_kernel, &seen, 4, mixed_sizes);
  assert_non_null(f);

  for (size_t i = 0; i < 4; i++) {
    size_t off = 99, size = 99;
    CU_OK(cuFuncGetParamInfo(f, i, &off, &size));
    assert_int_equal(off, mixed_offsets[i]);
    assert_int_equal(size, mixed_sizes[i]);
  }
  size_t off, size;
  assert_int_equal(cuFuncGetParamInfo(f, 4, &off, &size), CUDA_ERROR_INVALID_VALUE);
  const char *name = NULL;
  CU_OK(cuFuncGetName(&name, f));
  assert_string_equal(name, "mixed");
  CU_OK(cuKernelGetParamInfo((CUkernel)(void *)f, 2, &off, &size)); /* the CUkernel view */
  assert_int_equal(off, 16);
  assert_int_equal(size, 24);

  int32_t a = 0x11223344;
  uint64_t b = 0x8877665544332211ull;
  struct triple t = {2.5, -77, "triple"};
  char c = 'q';
  void *params[] = {&a, &b, &t, &c};
  CU_OK(cuLaunchKernel(f, 4, 2, 1, 128, 1, 1, 0, NULL, params, NULL));
  a = 0; /* the launch copied the arguments: changing them now changes nothing */
  CU_OK(cuCtxSynchronize());
  check_seen(&seen, 1);

  /* The packed form: one buffer in the same layout. */
  unsigned char buf[48];
  memset(buf, 0xee, sizeof buf);
  a = 0x11223344;
  memcpy(buf + 0, &a, 4);
  memcpy(buf + 8, &b, 8);
  memcpy(buf + 16, &t, sizeof t);
  memcpy(buf + 40, &c, 1);
  size_t bufsize = sizeof buf;
  void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &bufsize, CU_LAUNCH_PARAM_END};
  CU_OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra));
  CU_OK(cuCtxSynchronize());
  check_seen(&seen, 2);

  /* cuLaunchKernelEx with its config struct. */
  CUstream s;
  CU_OK(cuStreamCreate(&s, 0));
  CUlaunchConfig cfg = {0};
  cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = 32;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.hStream = s;
  CU_OK(cuLaunchKernelEx(&cfg, f, params, NULL));
  CU_OK(cuStreamSynchronize(s));
  check_seen(&seen, 3);

  /* Errors. */
  assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, extra), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(cuLaunchKernel(f, 0, 1, 1, 1, 1, 1, 0, NULL, params, NULL), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1025, 1, 1, 0, NULL, params, NULL), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
  bufsize = 40; /* too small for the char at 40 */
  assert_int_equal(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(cuLaunchKernel((CUfunction)&seen, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL),
                   CUDA_ERROR_INVALID_HANDLE);
  assert_int_equal(cuLaunchKernelEx(NULL, f, params, NULL), CUDA_ERROR_INVALID_VALUE);
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(seen.runs, 3);
  CU_OK(cuStreamDestroy_v2(s));
}

static void nop_kernel(void **args, void *user) {
  (void)args;
  (void)user;
}

static void test_layouts(void **state) {
  (void)state;
  /* Alignment is min(size, 8) rounded down to a power of two. */
  static const size_t sizes[] = {1, 2, 3, 12, 1, 16};
  static const size_t expect[] = {0, 2, 4, 8, 20, 24};
  CUfunction f = fakecuda_register_kernel("layout", nop_kernel, NULL, 6, sizes);
  for (size_t i = 0; i < 6; i++) {
    size_t off;
    CU_OK(cuFuncGetParamInfo(f, i, &off, NULL));
    assert_int_equal(off, expect[i]);
  }
  /* Explicit offsets for layouts the rule does not give. */
  static const size_t s2[] = {4, 12}, o2[] = {0, 4};
  CUfunction g = fakecuda_register_kernel_layout("explicit", nop_kernel, NULL, 2, s2, o2);
  size_t off;
  CU_OK(cuFuncGetParamInfo(g, 1, &off, NULL));
  assert_int_equal(off, 4);
  static const size_t bad[] = {0, 2};
  assert_null(fakecuda_register_kernel_layout("overlap", nop_kernel, NULL, 2, s2, bad));
  /* No parameters at all. */
  CUfunction h = fakecuda_register_kernel("none", nop_kernel, NULL, 0, NULL);
  assert_int_equal(cuFuncGetParamInfo(h, 0, &off, NULL), CUDA_ERROR_INVALID_VALUE);
  CU_OK(cuLaunchKernel(h, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
  CU_OK(cuCtxSynchronize());
}

/* write(char *p): *p = 1 — on the GPU this would be a fault that kills the job. */
static void write_kernel(void **args, void *user) {
  (void)user;
  char *p = *(char **)args[0];
  *p = 1;
}

static void launch_write_in_child(void *arg) {
  static const size_t sizes[] = {sizeof(char *)};
  CUfunction f = fakecuda_register_kernel("write", write_kernel, NULL, 1, sizes);
  CUstream s; /* a stream made in the child: the parent's workers are not here */
  char *p = arg;
  void *params[] = {&p};
  if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) _exit(2);
  if (cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL) != CUDA_SUCCESS) _exit(3);
  if (cuStreamSynchronize(s) != CUDA_SUCCESS) _exit(4);
  char got = 0; /* the host cannot read a device frame: a copy brings the byte back */
  if (cuMemcpyDtoHAsync_v2(&got, (CUdeviceptr)(uintptr_t)p, 1, s) || cuStreamSynchronize(s) || got != 1) _exit(5);
}

static void test_kernel_touching_unmapped_chunk_dies(void **state) {
  (void)state;
  CUdeviceptr va;
  CU_OK(cuMemAddressReserve(&va, 2 * GRAN, 0, 0, 0));
  CUmemGenericAllocationHandle h = make_frame(GRAN);
  CU_OK(cuMemMap(va, GRAN, 0, h, 0));
  allow_rw(va, GRAN);
  char *mapped = (char *)(uintptr_t)va, *unmapped = mapped + GRAN;

  assert_exited_ok(run_in_child(launch_write_in_child, mapped));
  assert_killed_by_segv(run_in_child(launch_write_in_child, unmapped));
  CU_OK(cuMemUnmap(va, GRAN));
  assert_killed_by_segv(run_in_child(launch_write_in_child, mapped));

  CU_OK(cuMemRelease(h));
  CU_OK(cuMemAddressFree(va, 2 * GRAN));
}

int main(void) {
  setup_context();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_param_info_and_both_launch_forms),
      cmocka_unit_test(test_layouts),
      cmocka_unit_test(test_kernel_touching_unmapped_chunk_dies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
