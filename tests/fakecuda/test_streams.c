/* Stream ordering on the fake driver: work is really asynchronous, in order on a
 * stream, ordered across streams by events and by the legacy NULL stream's rule.
 * Kernels sleep DELAY_US (FAKECUDA_KERNEL_DELAY_US) so that unordered work shows. */
#include <pthread.h>
#include <string.h>

#include "test_common.h"

#define DELAY_US 200000

/* store(int *dst, int value): *dst = value. */
static void store_kernel(void **args, void *user) {
  (void)user;
  int *dst = *(int **)args[0];
  *dst = *(int *)args[1];
}
static CUfunction store_fn;

static void launch_store(CUstream s, CUdeviceptr dst, int value) {
  int *p = (int *)(uintptr_t)dst;
  void *params[] = {&p, &value};
  CU_OK(cuLaunchKernel(store_fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
}

static CUdeviceptr zeroed_int(void) {
  CUdeviceptr d;
  CU_OK(cuMemAlloc_v2(&d, sizeof(int)));
  CU_OK(cuMemsetD32_v2(d, 0, 1));
  return d;
}


/* (c) a copy after a slow kernel on the same stream sees its result; an event recorded
 * after them is not complete before they are. */
static void test_same_stream_order_and_event(void **state) {
  (void)state;
  CUstream s;
  CUevent ev;
  int host = -1;
  CUdeviceptr d = zeroed_int();
  CU_OK(cuStreamCreate(&s, 0));
  CU_OK(cuEventCreate(&ev, 0));

  launch_store(s, d, 42);
  CU_OK(cuMemcpyDtoHAsync_v2(&host, d, sizeof host, s));
  CU_OK(cuEventRecord(ev, s));
  assert_int_equal(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
  assert_int_equal(cuStreamQuery(s), CUDA_ERROR_NOT_READY);

  CU_OK(cuEventSynchronize(ev));
  assert_int_equal(host, 42);
  CU_OK(cuEventQuery(ev));
  CU_OK(cuStreamQuery(s));

  CU_OK(cuEventDestroy_v2(ev));
  CU_OK(cuStreamDestroy_v2(s));
  CU_OK(cuMemFree_v2(d));
}

/* (c) cuStreamWaitEvent orders two streams; without it they overlap. */
static void test_wait_event_orders_streams(void **state) {
  (void)state;
  CUstream a, b;
  CUevent ev;
  int host = -1;
  CUdeviceptr d = zeroed_int();
  CU_OK(cuStreamCreate(&a, 0));
  CU_OK(cuStreamCreate(&b, 0));
  CU_OK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));

  /* Unordered: b's copy runs while a's kernel still sleeps. */
  launch_store(a, d, 7);
  CU_OK(cuMemcpyDtoHAsync_v2(&host, d, sizeof host, b));
  CU_OK(cuStreamSynchronize(b));
  assert_int_equal(host, 0);
  CU_OK(cuStreamSynchronize(a));

  /* Ordered by the event. */
  CU_OK(cuMemsetD32_v2(d, 0, 1));
  launch_store(a, d, 8);
  CU_OK(cuEventRecord(ev, a));
  CU_OK(cuStreamWaitEvent(b, ev, 0));
  CU_OK(cuMemcpyDtoHAsync_v2(&host, d, sizeof host, b));
  CU_OK(cuStreamSynchronize(b));
  assert_int_equal(host, 8);

  /* The wait captured that record: recording ev again later does not change it. */
  CU_OK(cuEventRecord(ev, b));
  CU_OK(cuEventSynchronize(ev));

  CU_OK(cuEventDestroy_v2(ev));
  CU_OK(cuStreamDestroy_v2(a));
  CU_OK(cuStreamDestroy_v2(b));
  CU_OK(cuMemFree_v2(d));
}

/* The legacy NULL stream waits for blocking streams and blocks them; non-blocking
 * streams take no part. */
static void test_legacy_stream_rule(void **state) {
  (void)state;
  CUstream blocking, nonblocking;
  int host = -1;
  CUdeviceptr d = zeroed_int();
  CU_OK(cuStreamCreate(&blocking, 0));
  CU_OK(cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING));

  launch_store(blocking, d, 5);
  CU_OK(cuMemcpyDtoH_v2(&host, d, sizeof host)); /* legacy: after the blocking stream's kernel */
  assert_int_equal(host, 5);

  launch_store(nonblocking, d, 6);
  CU_OK(cuMemcpyDtoH_v2(&host, d, sizeof host)); /* does not wait for a non-blocking stream */
  assert_int_equal(host, 5);
  CU_OK(cuStreamSynchronize(nonblocking));

  launch_store(NULL, d, 9); /* legacy first, then a blocking stream must wait for it */
  CU_OK(cuMemcpyDtoHAsync_v2(&host, d, sizeof host, blocking));
  CU_OK(cuStreamSynchronize(blocking));
  assert_int_equal(host, 9);

  launch_store(CU_STREAM_LEGACY, d, 10); /* ... a non-blocking one need not */
  CU_OK(cuMemcpyDtoHAsync_v2(&host, d, sizeof host, nonblocking));
  CU_OK(cuStreamSynchronize(nonblocking));
  assert_int_equal(host, 9);
  assert_int_equal(cuStreamQuery(NULL), CUDA_ERROR_NOT_READY);
  CU_OK(cuCtxSynchronize());
  CU_OK(cuStreamQuery(NULL));

  CU_OK(cuStreamDestroy_v2(blocking));
  CU_OK(cuStreamDestroy_v2(nonblocking));
  CU_OK(cuMemFree_v2(d));
}

/* FAKECUDA_EVENT_DELAY_US: a record completes that much after its stream reaches it. */
static void test_event_delay_and_elapsed(void **state) {
  (void)state;
  CUstream s;
  CUevent a, b;
  float ms = -1;
  CU_OK(cuStreamCreate(&s, 0));
  CU_OK(cuEventCreate(&a, 0));
  CU_OK(cuEventCreate(&b, 0));
  assert_int_equal(cuEventElapsedTime_v2(&ms, a, b), CUDA_ERROR_INVALID_HANDLE); /* never recorded */
  CU_OK(cuEventQuery(a)); /* never recorded: complete */

  fakecuda_set_delays(0, 100000, 0);
  CU_OK(cuEventRecord(a, s));
  CU_OK(cuEventRecord(b, s));
  assert_int_equal(cuEventQuery(a), CUDA_ERROR_NOT_READY);
  assert_int_equal(cuEventElapsedTime_v2(&ms, a, b), CUDA_ERROR_NOT_READY);
  CU_OK(cuStreamSynchronize(s)); /* a stream sync completes the records on it */
  CU_OK(cuEventQuery(a));
  CU_OK(cuEventQuery(b));
  CU_OK(cuEventElapsedTime_v2(&ms, a, b));
  assert_true(ms >= 90.0f && ms < 5000.0f);
  fakecuda_set_delays(0, 0, DELAY_US);

  CU_OK(cuEventDestroy_v2(a));
  CU_OK(cuEventDestroy_v2(b));
  CU_OK(cuStreamDestroy_v2(s));
}

/* cuStreamDestroy returns at once; the queued work still completes. */
static void test_destroy_with_pending_work(void **state) {
  (void)state;
  CUstream s;
  int host = -1;
  CUdeviceptr d = zeroed_int();
  CU_OK(cuStreamCreate(&s, 0));
  launch_store(s, d, 11);
  CU_OK(cuStreamDestroy_v2(s));
  assert_int_equal(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
  CU_OK(cuCtxSynchronize());
  CU_OK(cuMemcpyDtoH_v2(&host, d, sizeof host));
  assert_int_equal(host, 11);
  CU_OK(cuMemFree_v2(d));
}

/* cuMemFreeAsync frees when the stream gets there, not before. */
static void test_free_async_in_stream_order(void **state) {
  (void)state;
  CUstream s;
  CUdeviceptr d;
  size_t before = fakecuda_used_bytes(0);
  CU_OK(cuStreamCreate(&s, 0));
  CU_OK(cuMemAllocAsync(&d, 4096, s));
  assert_int_equal(fakecuda_used_bytes(0), before + 4096);
  launch_store(s, d, 1);
  CU_OK(cuMemFreeAsync(d, s));
  assert_int_equal(cuMemFreeAsync(d, s), CUDA_ERROR_INVALID_VALUE); /* already being freed */
  assert_int_equal(fakecuda_used_bytes(0), before + 4096);          /* the kernel still uses it */
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(fakecuda_used_bytes(0), before);

  CUmemoryPool pool, current;
  CU_OK(cuDeviceGetDefaultMemPool(&pool, 0));
  CU_OK(cuDeviceGetMemPool(&current, 0));
  assert_ptr_equal(pool, current);
  assert_int_equal(cuMemAllocFromPoolAsync(&d, 512, (CUmemoryPool)&before, s), CUDA_ERROR_INVALID_VALUE);
  CU_OK(cuMemAllocFromPoolAsync(&d, 512, pool, s));
  assert_int_equal(fakecuda_used_bytes(0), before + 512);
  CU_OK(cuMemFreeAsync(d, s));
  CU_OK(cuStreamDestroy_v2(s));
  CU_OK(cuCtxSynchronize());
  assert_int_equal(fakecuda_used_bytes(0), before);
}

/* The per-thread forms, found the way a per-thread-default-stream program finds them
 * (cuGetProcAddress with the per-thread flag), on a thread of their own; the thread's
 * per-thread stream is retired when it exits (ASan checks nothing leaks). */
static void *proc(const char *name) {
  void *fn = NULL;
  CUdriverProcAddressQueryResult st;
  CU_OK(cuGetProcAddress_v2(name, &fn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st));
  assert_int_equal(st, CU_GET_PROC_ADDRESS_SUCCESS);
  return fn;
}
typedef CUresult (*memset32_fn)(CUdeviceptr, unsigned, size_t, CUstream);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*sync_fn)(CUstream);
struct per_thread_job {
  CUcontext ctx;
  memset32_fn memset32;
  dtoh_fn dtoh;
  sync_fn sync;
  int host;
  CUresult r[5];
};
/* No cmocka asserts off the main thread: results go back in the job. */
static void *per_thread_body(void *arg) {
  struct per_thread_job *j = arg;
  CUdeviceptr d = 0;
  j->r[0] = cuCtxSetCurrent(j->ctx);
  j->r[1] = cuMemAlloc_v2(&d, sizeof(int));
  j->r[2] = j->memset32(d, 77, 1, NULL);
  j->r[3] = j->dtoh(&j->host, d, sizeof j->host, CU_STREAM_PER_THREAD);
  j->r[4] = j->sync(NULL);
  cuMemFree_v2(d);
  return NULL;
}
static void test_per_thread_stream(void **state) {
  (void)state;
  struct per_thread_job j = {0};
  pthread_t t;
  CU_OK(cuCtxGetCurrent(&j.ctx));
  j.memset32 = (memset32_fn)proc("cuMemsetD32Async");
  j.dtoh = (dtoh_fn)proc("cuMemcpyDtoHAsync");
  j.sync = (sync_fn)proc("cuStreamSynchronize");
  assert_int_equal(pthread_create(&t, NULL, per_thread_body, &j), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  for (int i = 0; i < 5; i++) CU_OK(j.r[i]);
  assert_int_equal(j.host, 77);
}

static void test_copy_argument_errors(void **state) {
  (void)state;
  int host = 0;
  CUdeviceptr d = zeroed_int();
  assert_int_equal(cuMemcpyHtoD_v2((CUdeviceptr)(uintptr_t)&host, &host, sizeof host), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(cuMemcpyDtoH_v2(&host, d, 2 * sizeof host), CUDA_ERROR_INVALID_VALUE); /* past the end */
  assert_int_equal(cuMemsetD32_v2(d + 1, 0, 1), CUDA_ERROR_INVALID_VALUE);                /* misaligned */
  assert_int_equal(cuMemcpyAsync(d, d, 4, (CUstream)(uintptr_t)0x1234), CUDA_ERROR_INVALID_HANDLE);
  CU_OK(cuMemcpyHtoD_v2(d, &host, 0)); /* zero bytes: nothing to check */
  CU_OK(cuMemFree_v2(d));
}

int main(void) {
  /* The kernel delay comes from the environment, read by cuInit. */
  char delay[16];
  snprintf(delay, sizeof delay, "%d", DELAY_US);
  setenv("FAKECUDA_KERNEL_DELAY_US", delay, 1);
  setup_context();
  static const size_t sizes[] = {sizeof(int *), sizeof(int)};
  store_fn = fakecuda_register_kernel("store", store_kernel, NULL, 2, sizes);
  assert_non_null(store_fn);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_stream_order_and_event),
      cmocka_unit_test(test_wait_event_orders_streams),
      cmocka_unit_test(test_legacy_stream_rule),
      cmocka_unit_test(test_event_delay_and_elapsed),
      cmocka_unit_test(test_destroy_with_pending_work),
      cmocka_unit_test(test_free_async_in_stream_order),
      cmocka_unit_test(test_per_thread_stream),
      cmocka_unit_test(test_copy_argument_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
