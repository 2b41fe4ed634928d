/* Stream capture on the fake driver follows CUDA's rules (capture.c): captured work is
 * recorded and replayed, not run; calls that conflict with a capture fail and invalidate
 * it in every mode; potentially unsafe calls fail by the thread's and the capture's mode;
 * ending a capture checks its stream and thread. */
#include <pthread.h>

#include "test_common.h"

/* add(int *dst, int value): *dst += value. */
static void add_kernel(void **args, void *user) {
  (void)user;
  int *dst = *(int **)args[0];
  *dst += *(int *)args[1];
}
static CUfunction add_fn;

static CUresult launch_add(CUstream s, CUdeviceptr dst, int value) {
  int *p = (int *)(uintptr_t)dst;
  void *params[] = {&p, &value};
  return cuLaunchKernel(add_fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
}

static CUdeviceptr counter;

static int counter_value(void) { return *(volatile int *)(uintptr_t)counter; }

static CUstream new_stream(unsigned flags) {
  CUstream s;
  CU_OK(cuStreamCreate(&s, flags));
  return s;
}

static CUstreamCaptureStatus status_of(CUstream s) {
  CUstreamCaptureStatus st;
  CU_OK(cuStreamIsCapturing(s, &st));
  return st;
}

/* Ends an invalidated capture as CUDA wants: INVALIDATED, no graph, stream usable again. */
static void end_invalidated(CUstream s) {
  CUgraph g = (CUgraph)(uintptr_t)1;
  assert_int_equal(status_of(s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  assert_int_equal(launch_add(s, counter, 1), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  assert_int_equal(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  assert_null(g);
  assert_int_equal(status_of(s), CU_STREAM_CAPTURE_STATUS_NONE);
}

static void end_valid(CUstream s) {
  CUgraph g = NULL;
  CU_OK(cuStreamEndCapture(s, &g));
  assert_non_null(g);
  CU_OK(cuGraphDestroy(g));
}

static int group_setup(void **state) {
  (void)state;
  setup_context();
  size_t sizes[] = {sizeof(int *), sizeof(int)};
  add_fn = fakecuda_register_kernel("add", add_kernel, NULL, 2, sizes);
  CU_OK(cuMemAlloc_v2(&counter, sizeof(int)));
  return add_fn ? 0 : -1;
}

static int reset(void **state) {
  (void)state;
  CU_OK(cuCtxSynchronize());
  CU_OK(cuMemsetD32_v2(counter, 0, 1));
  return 0;
}

/* Captured work does not run; each launch of the graph's instance runs it once, in order. */
static void test_captured_work_runs_at_replay(void **state) {
  (void)state;
  CUstream s = new_stream(CU_STREAM_NON_BLOCKING), r = new_stream(0);
  CU_OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  assert_int_equal(status_of(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CU_OK(launch_add(s, counter, 5));
  CU_OK(cuMemsetD32Async(counter, 100, 1, s)); /* order matters: memset, then add */
  CU_OK(launch_add(s, counter, 1));
  CUgraph g;
  CU_OK(cuStreamEndCapture(s, &g));
  assert_int_equal(counter_value(), 0);
  CUgraphExec e;
  CU_OK(cuGraphInstantiateWithFlags(&e, g, 0));
  CU_OK(cuGraphDestroy(g)); /* the instance keeps its own copy */
  for (int i = 0; i < 3; i++) CU_OK(cuGraphLaunch(e, r));
  CU_OK(cuStreamSynchronize(r));
  assert_int_equal(counter_value(), 101);
  CU_OK(cuGraphExecDestroy(e));
  CU_OK(cuStreamDestroy_v2(s));
  CU_OK(cuStreamDestroy_v2(r));
}

/* Synchronizing or querying a capturing stream, or its context, invalidates the capture in
 * every mode, the thread's own mode RELAXED too. */
static void test_conflicting_calls_invalidate(void **state) {
  (void)state;
  CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
  CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
  CU_OK(cuThreadExchangeStreamCaptureMode(&relaxed));
  for (int mode = CU_STREAM_CAPTURE_MODE_GLOBAL; mode <= CU_STREAM_CAPTURE_MODE_RELAXED; mode++) {
    for (int call = 0; call < 3; call++) {
      CU_OK(cuStreamBeginCapture_v2(s, (CUstreamCaptureMode)mode));
      CU_OK(launch_add(s, counter, 1));
      CUresult r = call == 0 ? cuStreamSynchronize(s) : call == 1 ? cuStreamQuery(s) : cuCtxSynchronize();
      assert_int_equal(r, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
      end_invalidated(s);
    }
  }
  CU_OK(cuThreadExchangeStreamCaptureMode(&relaxed));
  assert_int_equal(relaxed, CU_STREAM_CAPTURE_MODE_RELAXED);
  CU_OK(launch_add(s, counter, 1)); /* the stream works again, and nothing captured ran */
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(counter_value(), 1);
  CU_OK(cuStreamDestroy_v2(s));
}

/* An event recorded in a capture cannot be queried or waited for from the host. */
static void test_captured_event(void **state) {
  (void)state;
  CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
  CUevent ev;
  CU_OK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  CU_OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CU_OK(cuEventRecord(ev, s));
  assert_int_equal(status_of(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(cuEventQuery(ev), CUDA_ERROR_CAPTURED_EVENT);
  end_invalidated(s);
  CU_OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CU_OK(cuEventRecord(ev, s));
  assert_int_equal(cuEventSynchronize(ev), CUDA_ERROR_CAPTURED_EVENT);
  end_invalidated(s);
  CU_OK(cuEventRecord(ev, s)); /* recorded outside a capture: usable again */
  CU_OK(cuEventSynchronize(ev));
  CU_OK(cuEventDestroy_v2(ev));
  CU_OK(cuStreamDestroy_v2(s));
}

/* While a blocking stream captures, the legacy stream may not be used (IMPLICIT); asking
 * whether it captures is an error that invalidates nothing. A non-blocking stream's
 * capture leaves the legacy stream alone. */
static void test_legacy_stream_implicit(void **state) {
  (void)state;
  CUstream s = new_stream(0), nb = new_stream(CU_STREAM_NON_BLOCKING);
  CUstreamCaptureStatus st;
  CU_OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  assert_int_equal(cuStreamIsCapturing(CU_STREAM_LEGACY, &st), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  assert_int_equal(status_of(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(launch_add(NULL, counter, 1), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  end_invalidated(s);
  CU_OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  assert_int_equal(cuStreamQuery(CU_STREAM_LEGACY), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  end_invalidated(s);
  CU_OK(cuStreamBeginCapture_v2(nb, CU_STREAM_CAPTURE_MODE_RELAXED));
  CU_OK(launch_add(NULL, counter, 1));
  CUresult q = cuStreamQuery(CU_STREAM_LEGACY);
  assert_true(q == CUDA_SUCCESS || q == CUDA_ERROR_NOT_READY);
  end_valid(nb);
  assert_int_equal(cuStreamBeginCapture_v2(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL),
                   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CU_OK(cuStreamDestroy_v2(s));
  CU_OK(cuStreamDestroy_v2(nb));
}

/* ---- the modes: which threads may make potentially unsafe calls ---- */

struct other {
  CUcontext ctx;
  CUstreamCaptureMode mode; /* the other thread's own mode */
  CUresult result;          /* of its unsafe call */
};

static void *unsafe_elsewhere(void *arg) {
  struct other *o = arg;
  CUdeviceptr p;
  CUstreamCaptureMode m = o->mode;
  CU_OK(cuCtxSetCurrent(o->ctx));
  CU_OK(cuThreadExchangeStreamCaptureMode(&m));
  o->result = cuMemAlloc_v2(&p, 4096);
  if (o->result == CUDA_SUCCESS) CU_OK(cuMemFree_v2(p));
  return NULL;
}

static CUresult unsafe_on_other_thread(CUstreamCaptureMode mode) {
  struct other o = {.mode = mode};
  pthread_t t;
  CU_OK(cuCtxGetCurrent(&o.ctx));
  assert_int_equal(pthread_create(&t, NULL, unsafe_elsewhere, &o), 0);
  pthread_join(t, NULL);
  return o.result;
}

/* Each row: the capture's mode, the other thread's mode, whether its unsafe call is
 * refused, whether the capturing thread's own (default GLOBAL) unsafe call is refused. */
static void test_modes(void **state) {
  (void)state;
  static const struct {
    CUstreamCaptureMode capture, other;
    bool other_refused, own_refused;
  } rows[] = {
      {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL, true, true},
      {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, false, true},
      {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED, false, true},
      {CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_GLOBAL, false, true},
      {CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_GLOBAL, false, false},
  };
  CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    CU_OK(cuStreamBeginCapture_v2(s, rows[i].capture));
    CUresult other = unsafe_on_other_thread(rows[i].other);
    assert_int_equal(other, rows[i].other_refused ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS);
    if (rows[i].other_refused) {
      end_invalidated(s);
      continue;
    }
    CUdeviceptr p;
    CUresult own = cuMemAlloc_v2(&p, 4096);
    assert_int_equal(own, rows[i].own_refused ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS);
    if (own == CUDA_SUCCESS) {
      CU_OK(cuMemFree_v2(p));
      end_valid(s);
    } else {
      end_invalidated(s);
    }
  }
  CU_OK(cuStreamDestroy_v2(s));
}

/* The capturing thread in RELAXED mode may make unsafe calls (VMM, event queries on events
 * recorded elsewhere); put back in GLOBAL mode, it may not. */
static void test_relaxed_thread(void **state) {
  (void)state;
  CUstream s = new_stream(CU_STREAM_NON_BLOCKING), other = new_stream(CU_STREAM_NON_BLOCKING);
  CUevent ev;
  CU_OK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  CU_OK(cuEventRecord(ev, other));
  CU_OK(cuStreamSynchronize(other));
  CU_OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  CU_OK(cuThreadExchangeStreamCaptureMode(&m));
  assert_int_equal(m, CU_STREAM_CAPTURE_MODE_GLOBAL);
  CUmemGenericAllocationHandle h = make_frame(GRAN);
  CU_OK(cuMemRelease(h));
  CU_OK(cuEventQuery(ev));
  CU_OK(cuThreadExchangeStreamCaptureMode(&m));
  assert_int_equal(cuEventQuery(ev), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  end_invalidated(s);
  CU_OK(cuEventDestroy_v2(ev));
  CU_OK(cuStreamDestroy_v2(s));
  CU_OK(cuStreamDestroy_v2(other));
}

/* ---- ending, ids, forks and joins ---- */

struct ender {
  CUstream s;
  CUresult result;
  CUgraph g;
};

static void *end_elsewhere(void *arg) {
  struct ender *e = arg;
  e->result = cuStreamEndCapture(e->s, &e->g);
  return NULL;
}

static CUresult end_on_other_thread(CUstream s, CUgraph *g) {
  struct ender e = {.s = s};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, end_elsewhere, &e), 0);
  pthread_join(t, NULL);
  *g = e.g;
  return e.result;
}

static void test_end_rules(void **state) {
  (void)state;
  CUstream s = new_stream(CU_STREAM_NON_BLOCKING);
  CUgraph g;
  assert_int_equal(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
  CU_OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  assert_int_equal(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_ERROR_ILLEGAL_STATE);
  assert_int_equal(end_on_other_thread(s, &g), CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
  assert_int_equal(status_of(s), CU_STREAM_CAPTURE_STATUS_ACTIVE); /* still capturing, still valid */
  end_valid(s);
  CU_OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CU_OK(end_on_other_thread(s, &g)); /* a RELAXED capture may end anywhere */
  assert_non_null(g);
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuStreamDestroy_v2(s));
}

/* A stream that waits for an event recorded in a capture joins it (same id); ending on the
 * joined stream is UNMATCHED, ending on the origin ends both. Waiting in a capture for an
 * event recorded outside it breaks isolation. */
static void test_fork_join_and_ids(void **state) {
  (void)state;
  CUstream s = new_stream(CU_STREAM_NON_BLOCKING), side = new_stream(CU_STREAM_NON_BLOCKING),
           r = new_stream(CU_STREAM_NON_BLOCKING);
  CUevent fork, join, outside;
  CU_OK(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  CU_OK(cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));
  CU_OK(cuEventCreate(&outside, CU_EVENT_DISABLE_TIMING));
  CU_OK(cuEventRecord(outside, r));
  cuuint64_t ids[2] = {0, 0}, side_id = 0;
  CUstreamCaptureStatus st;
  for (int k = 0; k < 2; k++) {
    CU_OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cuStreamGetCaptureInfo_v3(s, &st, &ids[k], NULL, NULL, NULL, NULL));
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CU_OK(cuEventRecord(fork, s));
    CU_OK(cuStreamWaitEvent(side, fork, 0));
    CU_OK(cuStreamGetCaptureInfo_v3(side, &st, &side_id, NULL, NULL, NULL, NULL));
    assert_int_equal(side_id, ids[k]);
    CU_OK(launch_add(side, counter, 10));
    CU_OK(cuEventRecord(join, side));
    CU_OK(cuStreamWaitEvent(s, join, 0));
    CUgraph g;
    assert_int_equal(cuStreamEndCapture(side, &g), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    end_valid(s);
    assert_int_equal(status_of(side), CU_STREAM_CAPTURE_STATUS_NONE);
  }
  assert_true(ids[0] != 0 && ids[1] != 0 && ids[0] != ids[1]);
  assert_int_equal(counter_value(), 0); /* captured, never launched */
  CU_OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  assert_int_equal(cuStreamWaitEvent(s, outside, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  end_invalidated(s);
  CU_OK(cuEventDestroy_v2(fork));
  CU_OK(cuEventDestroy_v2(join));
  CU_OK(cuEventDestroy_v2(outside));
  CU_OK(cuStreamDestroy_v2(s));
  CU_OK(cuStreamDestroy_v2(side));
  CU_OK(cuStreamDestroy_v2(r));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_captured_work_runs_at_replay, reset),
      cmocka_unit_test_setup(test_conflicting_calls_invalidate, reset),
      cmocka_unit_test_setup(test_captured_event, reset),
      cmocka_unit_test_setup(test_legacy_stream_implicit, reset),
      cmocka_unit_test_setup(test_modes, reset),
      cmocka_unit_test_setup(test_relaxed_thread, reset),
      cmocka_unit_test_setup(test_end_rules, reset),
      cmocka_unit_test_setup(test_fork_join_and_ids, reset),
  };
  return cmocka_run_group_tests(tests, group_setup, NULL);
}
