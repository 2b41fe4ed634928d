/* VMM on the fake driver: unmapped chunks fault, data lives in frames across remaps,
 * capacity and cuMemGetInfo follow frames and allocations. The host touches only host
 * frames it was given access to (test_strict: device frames, per-device access). Capacities
 * are set in main (before cuInit): device 64 MiB, host frames 8 MiB. */
#include <string.h>
#include <sys/socket.h>

#include "test_common.h"

static void touch(void *p) { *(volatile char *)p = 1; }

/* (a) reserved-but-unmapped faults; mapped without access faults; mapped with access
 * works; unmapped again faults (touched by the host, so a host frame). */
static void test_unmapped_touch_faults(void **state) {
  (void)state;
  CUdeviceptr va;
  CU_OK(cuMemAddressReserve(&va, 4 * GRAN, 0, 0, 0));
  assert_int_equal(va % GRAN, 0);
  char *p = (char *)(uintptr_t)va + GRAN;

  assert_killed_by_segv(run_in_child(touch, p));

  CUmemGenericAllocationHandle h = make_host_frame(GRAN);
  CU_OK(cuMemMap(va + GRAN, GRAN, 0, h, 0));
  assert_killed_by_segv(run_in_child(touch, p)); /* no access set yet, as on CUDA */
  allow_rw(va + GRAN, GRAN);
  assert_killed_by_segv(run_in_child(touch, p)); /* the device's access is not the host's */

  allow_host(va + GRAN, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  assert_exited_ok(run_in_child(touch, p));
  assert_exited_ok(run_in_child(touch, p + GRAN - 1));
  p[7] = 42;
  assert_int_equal(p[7], 42);
  assert_killed_by_segv(run_in_child(touch, p + GRAN)); /* the next chunk is not mapped */

  CU_OK(cuMemUnmap(va + GRAN, GRAN));
  assert_killed_by_segv(run_in_child(touch, p));

  CU_OK(cuMemRelease(h));
  CU_OK(cuMemAddressFree(va, 4 * GRAN));
}

static void read_byte(void *p) {
  if (*(volatile char *)p != 42) _exit(3);
}

/* cuMemSetAccess sets the protection it is given: read-only faults on a write,
 * PROT_NONE on a read. */
static void test_access_flags(void **state) {
  (void)state;
  CUdeviceptr va;
  CU_OK(cuMemAddressReserve(&va, GRAN, 0, 0, 0));
  CUmemGenericAllocationHandle h = make_host_frame(GRAN);
  CU_OK(cuMemMap(va, GRAN, 0, h, 0));
  allow_host(va, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  char *p = (char *)(uintptr_t)va;
  p[0] = 42;
  allow_host(va, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READ);
  assert_exited_ok(run_in_child(read_byte, p));
  assert_killed_by_segv(run_in_child(touch, p));
  allow_host(va, GRAN, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  assert_killed_by_segv(run_in_child(read_byte, p));
  CUmemAccessDesc bad = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, (CUmemAccess_flags)2};
  assert_int_equal(cuMemSetAccess(va, GRAN, &bad, 1), CUDA_ERROR_INVALID_VALUE);
  CU_OK(cuMemUnmap(va, GRAN));
  CU_OK(cuMemRelease(h));
  CU_OK(cuMemAddressFree(va, GRAN));
}

/* A copy engine reading an unmapped chunk is a fault too: the stream's worker dies. */
static void copy_in_child(void *arg) {
  CUstream s; /* made in the child: the parent's workers are not here */
  char host[64];
  if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) _exit(2);
  if (cuMemcpyDtoHAsync_v2(host, (CUdeviceptr)(uintptr_t)arg, sizeof host, s) != CUDA_SUCCESS) _exit(3);
  if (cuStreamSynchronize(s) != CUDA_SUCCESS) _exit(4);
}

static void test_copy_from_unmapped_chunk_faults(void **state) {
  (void)state;
  CUdeviceptr va;
  CU_OK(cuMemAddressReserve(&va, 2 * GRAN, 0, 0, 0));
  CUmemGenericAllocationHandle h = make_frame(GRAN);
  CU_OK(cuMemMap(va, GRAN, 0, h, 0));
  allow_rw(va, GRAN);
  assert_exited_ok(run_in_child(copy_in_child, (void *)(uintptr_t)va));
  assert_killed_by_segv(run_in_child(copy_in_child, (void *)(uintptr_t)(va + GRAN)));
  CU_OK(cuMemUnmap(va, GRAN));
  CU_OK(cuMemRelease(h));
  CU_OK(cuMemAddressFree(va, 2 * GRAN));
}

/* (b) data written through one mapping is there after unmap and remap elsewhere,
 * and two mappings of one frame alias. */
static void test_data_survives_remap(void **state) {
  (void)state;
  CUdeviceptr a, b;
  CU_OK(cuMemAddressReserve(&a, 2 * GRAN, 0, 0, 0));
  CU_OK(cuMemAddressReserve(&b, 4 * GRAN, 0, 0, 0));
  CUmemGenericAllocationHandle h = make_host_frame(2 * GRAN);

  CU_OK(cuMemMap(a, 2 * GRAN, 0, h, 0));
  allow_host(a, 2 * GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  uint32_t *pa = (uint32_t *)(uintptr_t)a;
  for (size_t i = 0; i < 2 * GRAN / 4; i += 1024) pa[i] = (uint32_t)(i * 2654435761u);
  CU_OK(cuMemUnmap(a, 2 * GRAN));

  CU_OK(cuMemMap(b + 2 * GRAN, 2 * GRAN, 0, h, 0));
  allow_host(b + 2 * GRAN, 2 * GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  uint32_t *pb = (uint32_t *)(uintptr_t)(b + 2 * GRAN);
  for (size_t i = 0; i < 2 * GRAN / 4; i += 1024) assert_int_equal(pb[i], (uint32_t)(i * 2654435761u));

  /* The second half of the frame mapped alone at a as well: both views see one memory. */
  CU_OK(cuMemMap(a, GRAN, GRAN, h, 0));
  allow_host(a, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  pb[GRAN / 4 + 5] = 0xdeadbeef;
  assert_int_equal(((uint32_t *)(uintptr_t)a)[5], 0xdeadbeef);

  CU_OK(cuMemUnmap(a, GRAN));
  CU_OK(cuMemUnmap(b + 2 * GRAN, 2 * GRAN));
  CU_OK(cuMemRelease(h));
  CU_OK(cuMemAddressFree(a, 2 * GRAN));
  CU_OK(cuMemAddressFree(b, 4 * GRAN));
}

/* (e) capacity: FAKECUDA_DEVICE_MEM=64M, FAKECUDA_HOST_MEM=8M. */
static void test_capacity_and_mem_get_info(void **state) {
  (void)state;
  size_t free_b, total;
  CUmemGenericAllocationHandle h[4];
  CUmemAllocationProp dev = frame_prop(CU_MEM_LOCATION_TYPE_DEVICE, 0);
  CUmemAllocationProp host = frame_prop(CU_MEM_LOCATION_TYPE_HOST_NUMA, 0);

  CU_OK(cuMemGetInfo_v2(&free_b, &total));
  assert_int_equal(total, 64 * MiB);
  assert_int_equal(free_b, 64 * MiB);

  for (int i = 0; i < 3; i++) CU_OK(cuMemCreate(&h[i], 16 * MiB, &dev, 0));
  CU_OK(cuMemGetInfo_v2(&free_b, &total));
  assert_int_equal(free_b, 16 * MiB);

  CUmemGenericAllocationHandle big;
  assert_int_equal(cuMemCreate(&big, 32 * MiB, &dev, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CU_OK(cuMemGetInfo_v2(&free_b, &total));
  assert_int_equal(free_b, 16 * MiB); /* a refused create charges nothing */

  /* cuMemAlloc counts against the same capacity. */
  CUdeviceptr d;
  CU_OK(cuMemAlloc_v2(&d, 10 * MiB));
  CU_OK(cuMemGetInfo_v2(&free_b, &total));
  assert_int_equal(free_b, 6 * MiB);
  assert_int_equal(cuMemCreate(&h[3], 8 * MiB, &dev, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CU_OK(cuMemFree_v2(d));
  CU_OK(cuMemCreate(&h[3], 16 * MiB, &dev, 0));
  CU_OK(cuMemGetInfo_v2(&free_b, &total));
  assert_int_equal(free_b, 0);

  /* Host frames have their own budget and leave the device's alone. */
  CUmemGenericAllocationHandle hh[2];
  CU_OK(cuMemCreate(&hh[0], 8 * MiB, &host, 0));
  assert_int_equal(cuMemCreate(&hh[1], GRAN, &host, 0), CUDA_ERROR_OUT_OF_MEMORY);
  assert_int_equal(fakecuda_used_bytes(-1), 8 * MiB);
  CU_OK(cuMemRelease(hh[0]));
  assert_int_equal(fakecuda_used_bytes(-1), 0);

  /* Memory of a released frame stays in use until its last mapping goes. */
  CUdeviceptr va;
  CU_OK(cuMemAddressReserve(&va, 16 * MiB, 0, 0, 0));
  CU_OK(cuMemMap(va, 16 * MiB, 0, h[0], 0));
  CU_OK(cuMemRelease(h[0]));
  CU_OK(cuMemGetInfo_v2(&free_b, &total));
  assert_int_equal(free_b, 0);
  CU_OK(cuMemUnmap(va, 16 * MiB));
  CU_OK(cuMemGetInfo_v2(&free_b, &total));
  assert_int_equal(free_b, 16 * MiB);
  CU_OK(cuMemAddressFree(va, 16 * MiB));

  for (int i = 1; i < 4; i++) CU_OK(cuMemRelease(h[i]));
  CU_OK(cuMemGetInfo_v2(&free_b, &total));
  assert_int_equal(free_b, 64 * MiB);
  assert_int_equal(fakecuda_peak_bytes(0), 64 * MiB); /* the most held at once, above */
  assert_int_equal(fakecuda_peak_bytes(-1), 8 * MiB);
}

static void test_argument_errors(void **state) {
  (void)state;
  CUmemGenericAllocationHandle h;
  CUmemAllocationProp dev = frame_prop(CU_MEM_LOCATION_TYPE_DEVICE, 0);
  size_t g = 0;
  CU_OK(cuMemGetAllocationGranularity(&g, &dev, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  assert_int_equal(g, GRAN);
  CUmemAllocationProp host = frame_prop(CU_MEM_LOCATION_TYPE_HOST, 0);
  CU_OK(cuMemGetAllocationGranularity(&g, &host, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  assert_int_equal(g, GRAN);

  assert_int_equal(cuMemCreate(&h, GRAN + 4096, &dev, 0), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(cuMemCreate(&h, 0, &dev, 0), CUDA_ERROR_INVALID_VALUE);
  CUmemAllocationProp bad = frame_prop(CU_MEM_LOCATION_TYPE_DEVICE, 3);
  assert_int_equal(cuMemCreate(&h, GRAN, &bad, 0), CUDA_ERROR_INVALID_DEVICE);

  CUdeviceptr va;
  assert_int_equal(cuMemAddressReserve(&va, GRAN + 1, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  /* Alignment is honoured. */
  CU_OK(cuMemAddressReserve(&va, GRAN, 64 * MiB, 0, 0));
  assert_int_equal(va % (64 * MiB), 0);

  h = make_frame(GRAN);
  assert_int_equal(cuMemMap(va + 4096, GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* unaligned */
  assert_int_equal(cuMemMap(va, 2 * GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);    /* past the reservation */
  assert_int_equal(cuMemMap(va, GRAN, GRAN, h, 0), CUDA_ERROR_INVALID_VALUE);     /* past the frame */
  CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  assert_int_equal(cuMemSetAccess(va, GRAN, &d, 1), CUDA_ERROR_INVALID_VALUE);    /* nothing mapped */
  assert_int_equal(cuMemUnmap(va, GRAN), CUDA_ERROR_INVALID_VALUE);
  CU_OK(cuMemMap(va, GRAN, 0, h, 0));
  assert_int_equal(cuMemMap(va, GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);        /* already mapped */
  assert_int_equal(cuMemAddressFree(va, GRAN), CUDA_ERROR_INVALID_VALUE);         /* still mapped */

  unsigned long long flags = 99;
  CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CU_OK(cuMemGetAccess(&flags, &loc, va));
  assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CU_OK(cuMemSetAccess(va, GRAN, &d, 1));
  CU_OK(cuMemGetAccess(&flags, &loc, va));
  assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

  CUmemGenericAllocationHandle again;
  CU_OK(cuMemRetainAllocationHandle(&again, (void *)(uintptr_t)(va + 100)));
  assert_int_equal(again, h);
  CUmemAllocationProp got;
  CU_OK(cuMemGetAllocationPropertiesFromHandle(&got, again));
  assert_int_equal(got.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  CU_OK(cuMemRelease(again));

  CU_OK(cuMemUnmap(va, GRAN));
  CU_OK(cuMemRelease(h));
  assert_int_equal(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE); /* released already */
  CU_OK(cuMemAddressFree(va, GRAN));
}

static void test_pointer_attributes(void **state) {
  (void)state;
  CUdeviceptr d, va;
  CUcontext ctx = NULL, cur;
  unsigned int type = 0;
  int ordinal = -5;
  CU_OK(cuCtxGetCurrent(&cur));
  CU_OK(cuMemAlloc_v2(&d, 1000));
  assert_int_equal(d % 256, 0);
  CU_OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 10));
  assert_int_equal(type, CU_MEMORYTYPE_DEVICE);
  CU_OK(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, d));
  assert_ptr_equal(ctx, cur);
  CU_OK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d + 999));
  assert_int_equal(ordinal, 0);
  CUdeviceptr start = 0;
  size_t size = 0;
  CU_OK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 500));
  CU_OK(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, d + 500));
  assert_int_equal(start, d);
  assert_int_equal(size, 1000);
  assert_int_equal(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 1000), CUDA_ERROR_INVALID_VALUE);
  int on_stack;
  assert_int_equal(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)&on_stack),
                   CUDA_ERROR_INVALID_VALUE);
  CU_OK(cuMemFree_v2(d));
  assert_int_equal(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(cuMemFree_v2(d), CUDA_ERROR_INVALID_VALUE); /* double free */

  CU_OK(cuMemAddressReserve(&va, GRAN, 0, 0, 0));
  assert_int_equal(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va), CUDA_ERROR_INVALID_VALUE);
  CUmemGenericAllocationHandle h = make_frame(GRAN);
  CU_OK(cuMemMap(va, GRAN, 0, h, 0));
  CU_OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + 7));
  assert_int_equal(type, CU_MEMORYTYPE_DEVICE);
  CU_OK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va + 7));
  assert_int_equal(ordinal, 0);
  CU_OK(cuMemUnmap(va, GRAN));
  CU_OK(cuMemRelease(h));
  CU_OK(cuMemAddressFree(va, GRAN));
}

/* An exportable host frame shared with another process: the fd crosses a unix socket
 * (SCM_RIGHTS), the child imports and maps it, and each side sees the other's writes. The
 * importer is charged nothing; a frame not created exportable, or another handle type,
 * is refused. */
static void send_fd(int sock, int fd) {
  char byte = 0, ctl[CMSG_SPACE(sizeof(int))] = {0};
  struct iovec iov = {&byte, 1};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof fd);
  assert_int_equal(sendmsg(sock, &m, 0), 1);
}

static int recv_fd(int sock) {
  char byte, ctl[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {&byte, 1};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  if (recvmsg(sock, &m, 0) != 1 || !CMSG_FIRSTHDR(&m)) return -1;
  int fd;
  memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
  return fd;
}

static void import_and_write(void *arg) {
  int sock = *(int *)arg, fd = recv_fd(sock);
  CUmemGenericAllocationHandle h;
  CUdeviceptr va;
  if (fd < 0 || cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    _exit(2);
  close(fd); /* the imported handle keeps the memory */
  size_t charged = fakecuda_used_bytes(-1);
  CUmemAccessDesc rw = {{CU_MEM_LOCATION_TYPE_HOST_NUMA, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  if (cuMemAddressReserve(&va, GRAN, 0, 0, 0) || cuMemMap(va, GRAN, 0, h, 0) || cuMemSetAccess(va, GRAN, &rw, 1))
    _exit(3);
  char *p = (char *)(uintptr_t)va;
  if (p[5] != 42 || fakecuda_used_bytes(-1) != charged) _exit(4);
  p[6] = 43;
  if (cuMemUnmap(va, GRAN) || cuMemRelease(h)) _exit(5);
  if (write(sock, "k", 1) != 1) _exit(6);
}

static void test_export_import(void **state) {
  (void)state;
  CUmemAllocationProp plain = frame_prop(CU_MEM_LOCATION_TYPE_HOST_NUMA, 0), shared = plain;
  shared.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h, p;
  int fd = -1;
  CU_OK(cuMemCreate(&p, GRAN, &plain, 0));
  assert_int_equal(cuMemExportToShareableHandle(&fd, p, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                   CUDA_ERROR_INVALID_VALUE);
  CU_OK(cuMemRelease(p));
  CU_OK(cuMemCreate(&h, GRAN, &shared, 0));
  assert_int_equal(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_FABRIC, 0), CUDA_ERROR_NOT_SUPPORTED);
  CU_OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CUdeviceptr va;
  CU_OK(cuMemAddressReserve(&va, GRAN, 0, 0, 0));
  CU_OK(cuMemMap(va, GRAN, 0, h, 0));
  allow_host(va, GRAN, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  char *mine = (char *)(uintptr_t)va;
  mine[5] = 42;
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  send_fd(sv[0], fd);
  close(fd);
  int status = run_in_child(import_and_write, &sv[1]);
  assert_exited_ok(status);
  char ack;
  assert_int_equal(read(sv[0], &ack, 1), 1);
  assert_int_equal(mine[6], 43); /* the child's write, in this process's mapping */
  close(sv[0]);
  close(sv[1]);
  CU_OK(cuMemUnmap(va, GRAN));
  CU_OK(cuMemRelease(h));
  CU_OK(cuMemAddressFree(va, GRAN));
  assert_int_equal(fakecuda_used_bytes(-1), 0);
  assert_int_equal(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)-1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                   CUDA_ERROR_INVALID_VALUE);
}

int main(void) {
  setenv("FAKECUDA_DEVICE_MEM", "64M", 1);
  setenv("FAKECUDA_HOST_MEM", "8M", 1);
  setup_context();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unmapped_touch_faults),
      cmocka_unit_test(test_access_flags),
      cmocka_unit_test(test_copy_from_unmapped_chunk_faults),
      cmocka_unit_test(test_data_survives_remap),
      cmocka_unit_test(test_capacity_and_mem_get_info),
      cmocka_unit_test(test_argument_errors),
      cmocka_unit_test(test_pointer_attributes),
      cmocka_unit_test(test_export_import),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
