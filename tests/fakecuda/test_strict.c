/* The fake driver refuses or faults where CUDA would: the host cannot touch a device frame
 * (nor a host frame without a host descriptor), each device reaches only what its own
 * descriptor opened, and remapping a range that queued work will touch ends the process,
 * as does psshim's own rule that a CUPTI callback never synchronizes the device.
 * Two devices; each expected death happens in a child that makes its own streams. */
#include <stdatomic.h>
#include <string.h>

#include "test_common.h"

static CUcontext ctx0, ctx1;

static void touch(void *p) { *(volatile char *)p = 1; }

/* write(char *p, uint64 v): *p = (char)v.  read(const char *p, char *out): *out = *p. */
static void write_fn(void **args, void *user) {
  (void)user;
  **(char **)args[0] = (char)*(uint64_t *)args[1];
}
static void read_fn(void **args, void *user) {
  (void)user;
  **(char **)args[1] = **(const char **)args[0];
}
/* stall(): holds its stream 300 ms, so what is queued behind it is still queued. */
static void stall_fn(void **args, void *user) {
  (void)args, (void)user;
  usleep(300000);
}
static CUfunction write_k, read_k, stall_k;

static void launch2(CUfunction f, CUstream s, void *a, void *b) {
  void *params[] = {a, b};
  CU_OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
}

/* A child's kernel on a stream of its own, on device dev: 0 exit when it ran. */
struct job {
  int dev;
  CUfunction f;
  char *p;
};
static void kernel_in_child(void *arg) {
  struct job *j = arg;
  CUstream s;
  uint64_t v = 7;
  char out = 0;
  void *a = &j->p, *b = j->f == read_k ? (void *)&(char *){&out} : (void *)&v;
  if (cuCtxSetCurrent(j->dev ? ctx1 : ctx0) || cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)) _exit(2);
  void *params[] = {a, b};
  if (cuLaunchKernel(j->f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL) || cuStreamSynchronize(s)) _exit(3);
}

static void copy_in_child(void *arg) {
  struct job *j = arg;
  CUstream s;
  char byte;
  if (cuCtxSetCurrent(j->dev ? ctx1 : ctx0) || cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)) _exit(2);
  if (cuMemcpyDtoHAsync_v2(&byte, (CUdeviceptr)(uintptr_t)j->p, 1, s) || cuStreamSynchronize(s)) _exit(3);
}

static char read_back(CUdeviceptr p) {
  char b = 0;
  CU_OK(cuMemcpyDtoH_v2(&b, p, 1));
  return b;
}

/* A device frame: its device reaches it, the host never does, and a host descriptor for it
 * is refused. A host frame: the host reaches it only once a host descriptor says so. */
static void test_host_touches_host_frames_only(void **state) {
  (void)state;
  CU_OK(cuCtxSetCurrent(ctx0));
  CUdeviceptr va;
  CU_OK(cuMemAddressReserve(&va, 2 * GRAN, 0, 0, 0));
  CUmemGenericAllocationHandle dev = make_frame(GRAN), host = make_host_frame(GRAN);
  CU_OK(cuMemMap(va, GRAN, 0, dev, 0));
  CU_OK(cuMemMap(va + GRAN, GRAN, 0, host, 0));
  allow_rw(va, 2 * GRAN);
  char *d = (char *)(uintptr_t)va, *h = d + GRAN;

  struct job j = {0, write_k, d};
  assert_exited_ok(run_in_child(kernel_in_child, &j));
  assert_int_equal(read_back(va), 7);
  assert_killed_by_segv(run_in_child(touch, d));
  CUmemAccessDesc host_rw = {{CU_MEM_LOCATION_TYPE_HOST_NUMA, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  assert_int_equal(cuMemSetAccess(va, 2 * GRAN, &host_rw, 1), CUDA_ERROR_INVALID_VALUE);
  assert_killed_by_segv(run_in_child(touch, d));

  j.p = h;
  assert_exited_ok(run_in_child(kernel_in_child, &j)); /* the device reaches the host frame */
  assert_killed_by_segv(run_in_child(touch, h));       /* the host not yet */
  allow_host(va + GRAN, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  assert_int_equal(h[0], 7);
  unsigned long long flags = 0;
  CUmemLocation host_loc = {CU_MEM_LOCATION_TYPE_HOST_NUMA, 0}, dev_loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CU_OK(cuMemGetAccess(&flags, &host_loc, va + GRAN));
  assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CU_OK(cuMemGetAccess(&flags, &host_loc, va));
  assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CU_OK(cuMemGetAccess(&flags, &dev_loc, va));
  assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

  CU_OK(cuMemUnmap(va, 2 * GRAN));
  CU_OK(cuMemRelease(dev));
  CU_OK(cuMemRelease(host));
  CU_OK(cuMemAddressFree(va, 2 * GRAN));
}

/* Access is per device: device 1 reaches nothing of device 0's frame until its own
 * descriptor opens it, read-only first; device 0's access is its own throughout. */
static void test_access_is_per_device(void **state) {
  (void)state;
  CU_OK(cuCtxSetCurrent(ctx0));
  CUdeviceptr va;
  CU_OK(cuMemAddressReserve(&va, GRAN, 0, 0, 0));
  CUmemGenericAllocationHandle h = make_frame(GRAN);
  CU_OK(cuMemMap(va, GRAN, 0, h, 0));
  allow_rw(va, GRAN);
  char *p = (char *)(uintptr_t)va;
  struct job w0 = {0, write_k, p}, w1 = {1, write_k, p}, r1 = {1, read_k, p};
  assert_exited_ok(run_in_child(kernel_in_child, &w0));
  assert_killed_by_segv(run_in_child(kernel_in_child, &w1));
  assert_killed_by_segv(run_in_child(kernel_in_child, &r1));
  assert_killed_by_segv(run_in_child(copy_in_child, &r1)); /* a copy on device 1's stream too */

  CUmemAccessDesc ro1 = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READ};
  CU_OK(cuMemSetAccess(va, GRAN, &ro1, 1));
  assert_exited_ok(run_in_child(kernel_in_child, &r1));
  assert_exited_ok(run_in_child(copy_in_child, &r1));
  assert_killed_by_segv(run_in_child(kernel_in_child, &w1));
  assert_exited_ok(run_in_child(kernel_in_child, &w0)); /* device 1's descriptor left device 0's alone */
  CUmemAccessDesc none0 = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_NONE};
  CU_OK(cuMemSetAccess(va, GRAN, &none0, 1));
  assert_killed_by_segv(run_in_child(kernel_in_child, &w0));
  assert_exited_ok(run_in_child(kernel_in_child, &r1));

  CU_OK(cuMemUnmap(va, GRAN));
  CU_OK(cuMemRelease(h));
  CU_OK(cuMemAddressFree(va, GRAN));
}

/* ---- remapping under queued work ---- */

enum remap_case {
  UNMAP_KERNEL,      /* a kernel queued behind a stall points into the range: unmap */
  UNMAP_OTHER_STREAM, /* the same, the kernel on another stream than the unmapping thread's work */
  UNMAP_COPY,        /* a copy into the range is queued */
  UNMAP_MEMSET,      /* a memset of the range is queued */
  UNMAP_IN_STRUCT,   /* the kernel's pointer sits at a 4-byte offset inside a struct parameter */
  MAP_KERNEL,        /* a kernel queued while the range was unmapped: map a frame there */
  UNMAP_ELSEWHERE,   /* the queued kernel points into another mapping: no error */
  UNMAP_AFTER_SYNC,  /* the kernel ran before the unmap: no error */
};

struct packed_arg { /* a pointer at offset 4, as a packed struct parameter carries it */
  uint32_t tag;
  char *p;
} __attribute__((packed));

static void struct_write_fn(void **args, void *user) {
  (void)user;
  struct packed_arg a;
  memcpy(&a, args[0], sizeof a);
  *a.p = (char)a.tag;
}

static void remap_in_child(void *arg) {
  enum remap_case c = *(enum remap_case *)arg;
  CUdeviceptr va;
  CUstream s, other;
  uint64_t v = 5;
  char byte = 0;
  if (cuCtxSetCurrent(ctx0) || cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) ||
      cuStreamCreate(&other, CU_STREAM_NON_BLOCKING) || cuMemAddressReserve(&va, 2 * GRAN, 0, 0, 0))
    _exit(2);
  CUmemGenericAllocationHandle h = make_frame(GRAN), h2 = make_frame(GRAN);
  if (cuMemMap(va, GRAN, 0, h, 0) || cuMemMap(va + GRAN, GRAN, 0, h2, 0)) _exit(3);
  allow_rw(va, 2 * GRAN);
  char *p = (char *)(uintptr_t)va, *q = p + GRAN;
  launch2(stall_k, s, &v, &v);
  switch (c) {
    case UNMAP_KERNEL:
    case UNMAP_AFTER_SYNC:
      launch2(write_k, s, &p, &v);
      break;
    case UNMAP_OTHER_STREAM:
      launch2(stall_k, other, &v, &v);
      launch2(write_k, other, &p, &v);
      break;
    case UNMAP_COPY:
      if (cuMemcpyHtoDAsync_v2(va + 100, &byte, 1, s)) _exit(4);
      break;
    case UNMAP_MEMSET:
      if (cuMemsetD8Async(va + GRAN - 1, 1, 1, s)) _exit(4);
      break;
    case UNMAP_IN_STRUCT: {
      static const size_t size[] = {sizeof(struct packed_arg)}, off[] = {0};
      CUfunction f = fakecuda_register_kernel_layout("struct_write", struct_write_fn, NULL, 1, size, off);
      struct packed_arg a = {9, p + 64};
      void *params[] = {&a};
      if (!f || cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL)) _exit(4);
      break;
    }
    case MAP_KERNEL:
      if (cuMemUnmap(va, GRAN)) _exit(4);
      launch2(write_k, s, &p, &v);
      if (cuMemMap(va, GRAN, 0, h, 0)) _exit(5); /* dies here */
      _exit(6);
    case UNMAP_ELSEWHERE:
      launch2(write_k, s, &q, &v);
      break;
  }
  if (c == UNMAP_AFTER_SYNC && cuStreamSynchronize(s)) _exit(7);
  if (cuMemUnmap(va, GRAN)) _exit(8); /* dies here, unless the work is elsewhere or over */
  if (cuStreamSynchronize(s) || cuStreamSynchronize(other)) _exit(9);
}

static void assert_aborted(int status) { assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT); }

static void test_remap_under_queued_work_aborts(void **state) {
  (void)state;
  static const enum remap_case aborts[] = {UNMAP_KERNEL, UNMAP_OTHER_STREAM, UNMAP_COPY, UNMAP_MEMSET,
                                           UNMAP_IN_STRUCT, MAP_KERNEL};
  for (size_t i = 0; i < sizeof aborts / sizeof aborts[0]; i++) {
    fprintf(stderr, "remap case %d (an abort and its line expected):\n", (int)aborts[i]);
    assert_aborted(run_in_child(remap_in_child, (void *)&aborts[i]));
  }
  static const enum remap_case fine[] = {UNMAP_ELSEWHERE, UNMAP_AFTER_SYNC};
  for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++)
    assert_exited_ok(run_in_child(remap_in_child, (void *)&fine[i]));
}

/* A CUPTI subscriber that waits for the whole device inside a launch's callback. */
static void sync_in_callback(int cbid, int site, const char *name, const void *params, CUresult *result, void *user) {
  (void)cbid, (void)name, (void)params, (void)result, (void)user;
  if (site == 0 && strcmp(name, "cuLaunchKernel") == 0) cuCtxSynchronize();
}

static void launch_under_subscriber(void *arg) {
  bool syncing = *(bool *)arg;
  CUstream s;
  uint64_t v = 1;
  if (cuCtxSetCurrent(ctx0) || cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)) _exit(2);
  if (syncing) fakecuda_set_cupti_callback(sync_in_callback, NULL);
  launch2(stall_k, s, &v, &v); /* dies here when the subscriber syncs */
  fakecuda_set_cupti_callback(NULL, NULL);
  if (cuCtxSynchronize()) _exit(3); /* outside any callback: fine */
}

static void test_sync_in_cupti_callback_aborts(void **state) {
  (void)state;
  bool syncing = true, quiet = false;
  fprintf(stderr, "a sync inside a CUPTI callback (an abort and its line expected):\n");
  assert_aborted(run_in_child(launch_under_subscriber, &syncing));
  assert_exited_ok(run_in_child(launch_under_subscriber, &quiet));
}

int main(void) {
  setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
  setenv("FAKECUDA_HOST_MEM", "64M", 1);
  ctx0 = setup_context();
  CU_OK(cuDevicePrimaryCtxRetain(&ctx1, 1));
  static const size_t two[] = {8, 8};
  write_k = fakecuda_register_kernel("write", write_fn, NULL, 2, two);
  read_k = fakecuda_register_kernel("read", read_fn, NULL, 2, two);
  stall_k = fakecuda_register_kernel("stall", stall_fn, NULL, 2, two);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_touches_host_frames_only),
      cmocka_unit_test(test_access_is_per_device),
      cmocka_unit_test(test_remap_under_queued_work_aborts),
      cmocka_unit_test(test_sync_in_cupti_callback_aborts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
