/* CUDA's stream semantics that psshim's own bookkeeping must keep, in process on the strict
 * test driver (which aborts on a remap under queued work):
 * - the per-thread default stream (CU_STREAM_PER_THREAD, one handle) is a different stream
 *   on every thread: a launch's mark on one thread's stands not for another thread's, so a
 *   chunk that another thread's queued kernel will touch is not quiescent, and is not moved;
 * - the legacy default stream (NULL) is one stream for all threads: a later mark there
 *   stands for an earlier one, and the chunk moves once it has passed;
 * - a range freed on a thread's per-thread default stream, its last use still queued there,
 *   is not handed at once to another thread's (the same handle, another stream);
 * - nor is one freed on the legacy stream handed at once to a non-blocking stream, which
 *   does not wait for the legacy stream's work, nor one freed on a stream to another.
 * Each case runs in a child process: the allocator's configuration is per process. */
#include "allocator/allocator.h"
#include "allocator/move.h"
#include "core/core.h"
#include "shim/shim.h"
#include "tests/fakecuda/fakecuda.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1024ull * 1024)

static CUcontext ctx;
static CUfunction stall_k, touch_k;
static _Atomic int touched; /* each touch adds its tag */

/* stall(): holds its stream 400 ms, so what is queued behind it stays queued. */
static void stall_fn(void **args, void *user)
{
  (void)args, (void)user;
  usleep(400000);
}

/* touch(p, tag): writes p's first byte, counts tag. */
static void touch_fn(void **args, void *user)
{
  (void)user;
  **(volatile char **)args[0] = 1;
  atomic_fetch_add(&touched, (int)*(uint64_t *)args[1]);
}

static void launch(CUfunction f, CUstream s, CUdeviceptr p, uint64_t tag)
{
  void *params[] = {&p, &tag};
  if (cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, f == touch_k ? params : NULL, NULL) != CUDA_SUCCESS)
    exit(20);
}

static void start(void)
{
  setenv("PSSHIM_CHUNK_SIZE", "2M", 1);
  setenv("PSSHIM_POLICY", "auto", 1); /* launches observed: their marks kept on chunks; all fits, so no
                                         * move but the test's own */
  setenv("PSSHIM_GPU_BUDGET", "64M", 1);
  setenv("PSSHIM_HOST_BUDGET", "64M", 1);
  char err[256];
  if (!ps_options_parse(err, sizeof err) || !ps_driver_load()) {
    fprintf(stderr, "start: %s\n", err);
    exit(3);
  }
  ps_log_level = ps_options.log_level;
  ps_wiring_init();
  CUdevice dev;
  if (ps_driver.cuInit(0) || ps_driver.cuDeviceGet(&dev, 0) || ps_driver.cuDevicePrimaryCtxRetain(&ctx, dev) ||
      ps_driver.cuCtxSetCurrent(ctx))
    exit(4);
  size_t sizes[] = {8, 8};
  stall_k = fakecuda_register_kernel("stall", stall_fn, NULL, 0, NULL);
  touch_k = fakecuda_register_kernel("touch", touch_fn, NULL, 2, sizes);
}

static int in_child(void (*fn)(void *), void *arg)
{
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    fn(arg);
    exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* One move of the chunk to a host frame, as the pager would start it. */
static CUresult move_to_host(uint64_t chunk)
{
  struct device *d = &psa_devices[0];
  ps_mutex_lock(&d->lock);
  CUresult r = psa_move(d, chunk, PSA_HOST);
  ps_mutex_unlock(&d->lock);
  return r;
}

struct thread_work {
  CUstream stream;
  CUdeviceptr p;
  bool stall_first, sync;
  uint64_t tag;
};

static void *work(void *arg)
{
  struct thread_work *w = arg;
  if (cuCtxSetCurrent(ctx))
    exit(21);
  if (w->stall_first)
    launch(stall_k, w->stream, 0, 0);
  launch(touch_k, w->stream, w->p, w->tag);
  if (w->sync && cuStreamSynchronize(w->stream))
    exit(22);
  return NULL;
}

static void run_thread(struct thread_work *w)
{
  pthread_t t;
  if (pthread_create(&t, NULL, work, w) || pthread_join(t, NULL))
    exit(23);
}

/* Thread A queues a touch of x behind a stall on its default stream and leaves it queued;
 * thread B then touches x on its own default stream and waits for it. The chunk is not
 * quiescent until A's touch has run. */
static void marks_per_thread(void *arg)
{
  CUstream stream = (CUstream)arg;
  start();
  CUstream s;
  CUdeviceptr x;
  if (ps_driver.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) || psa_alloc(0, 2 * MiB, s, &x) ||
      ps_driver.cuStreamSynchronize(s))
    exit(30);
  uint64_t chunk = (uint64_t)psa_chunk_of(x, NULL);
  run_thread(&(struct thread_work){stream, x, true, false, 1});
  run_thread(&(struct thread_work){stream, x, false, true, 2});
  int seen = atomic_load(&touched);
  CUresult early = move_to_host(chunk);
  if (stream == CU_STREAM_PER_THREAD) {
    /* B's touch ran, A's is still queued behind its stall: no move may start */
    if (seen != 2 || early != CUDA_ERROR_NOT_READY) {
      fprintf(stderr, "marks_per_thread: touched %d, early move %d (want 2, NOT_READY)\n", seen, early);
      exit(31);
    }
  } else if (seen != 3 || early != CUDA_SUCCESS) {
    /* one legacy stream: B's wait covered A's work, and its mark stands for A's */
    fprintf(stderr, "marks_per_thread (legacy): touched %d, move %d (want 3, SUCCESS)\n", seen, early);
    exit(32);
  }
  if (ps_driver.cuCtxSynchronize() || atomic_load(&touched) != 3)
    exit(33);
  /* everything passed: it moves (so the refusal above was the marks', nothing else's) */
  if (stream == CU_STREAM_PER_THREAD && move_to_host(chunk) != CUDA_SUCCESS)
    exit(34);
  if (ps_driver.cuCtxSynchronize() || psa_chunk_where(0, chunk) != PSA_HOST)
    exit(35);
  if (psa_free(x, s, true))
    exit(36);
}

static void test_per_thread_default_stream_marks(void **state)
{
  (void)state;
  assert_int_equal(in_child(marks_per_thread, (void *)CU_STREAM_PER_THREAD), 0);
}

static void test_legacy_default_stream_marks(void **state)
{
  (void)state;
  assert_int_equal(in_child(marks_per_thread, (void *)CU_STREAM_LEGACY), 0);
}

#define REUSE_SIZE (64 * 1024)

struct reuse_work {
  CUstream stream;
  CUdeviceptr p;
};

/* Thread A, on its stream: allocates p, then frees it behind a stall and a touch of it (the
 * touch still queued); the same stream takes the range back at once (later work there runs
 * after the free: the test can see a reuse) and frees it again. */
static void *free_behind_touch(void *arg)
{
  struct reuse_work *w = arg;
  CUdeviceptr again = 0;
  if (cuCtxSetCurrent(ctx) || psa_alloc(0, REUSE_SIZE, w->stream, &w->p) || ps_driver.cuCtxSynchronize())
    exit(40);
  launch(stall_k, w->stream, 0, 0);
  launch(touch_k, w->stream, w->p, 1);
  if (psa_free(w->p, w->stream, false) || psa_alloc(0, REUSE_SIZE, w->stream, &again))
    exit(41);
  if (again != w->p) {
    fprintf(stderr, "free_behind_touch: the stream that freed the range did not take it back\n");
    exit(42);
  }
  if (psa_free(again, w->stream, false))
    exit(43);
  return NULL;
}

/* Thread B: allocates on its stream. */
static void *alloc_on(void *arg)
{
  struct reuse_work *w = arg;
  if (cuCtxSetCurrent(ctx) || psa_alloc(0, REUSE_SIZE, w->stream, &w->p))
    exit(44);
  return NULL;
}

static void on_thread(void *(*fn)(void *), void *arg)
{
  pthread_t t;
  if (pthread_create(&t, NULL, fn, arg) || pthread_join(t, NULL))
    exit(45);
}

/* A range freed on thread A's stream `freed`, its last use still queued there, must not be
 * handed to thread B's allocation on `other`, a stream not ordered after it: B's kernels
 * could write the bytes before A's queued use reads them. */
struct reuse_case {
  CUstream freed, other;
};
#define NEW_STREAM ((CUstream)(uintptr_t)0x10) /* in a reuse_case: a non-blocking stream made for it */

static void reuse_after_free(void *arg)
{
  const struct reuse_case *c = arg;
  start();
  struct reuse_work a = {.stream = c->freed}, b = {.stream = c->other};
  if ((a.stream == NEW_STREAM && ps_driver.cuStreamCreate(&a.stream, CU_STREAM_NON_BLOCKING)) ||
      (b.stream == NEW_STREAM && ps_driver.cuStreamCreate(&b.stream, CU_STREAM_NON_BLOCKING)))
    exit(50);
  on_thread(free_behind_touch, &a);
  on_thread(alloc_on, &b);
  if (b.p == a.p && atomic_load(&touched) == 0) {
    fprintf(stderr, "reuse_after_free: the range freed on %p, its use still queued, went at once to another "
            "thread's %p\n", (void *)c->freed, (void *)b.stream);
    exit(51);
  }
  if (ps_driver.cuCtxSynchronize() || atomic_load(&touched) != 1 || psa_free(b.p, b.stream, false) ||
      ps_driver.cuCtxSynchronize())
    exit(52);
}

static void test_per_thread_default_stream_frees(void **state)
{
  (void)state;
  struct reuse_case c = {CU_STREAM_PER_THREAD, CU_STREAM_PER_THREAD};
  assert_int_equal(in_child(reuse_after_free, &c), 0);
}

static void test_legacy_free_not_reused_by_non_blocking(void **state)
{
  (void)state;
  struct reuse_case c = {CU_STREAM_LEGACY, NEW_STREAM};
  assert_int_equal(in_child(reuse_after_free, &c), 0);
}

/* cudaFreeAsync on stream A, then an allocation on stream B: B is not ordered after A's
 * free, so it must not take the bytes before A passed it. */
static void test_async_free_not_reused_by_another_stream(void **state)
{
  (void)state;
  struct reuse_case c = {NEW_STREAM, NEW_STREAM};
  assert_int_equal(in_child(reuse_after_free, &c), 0);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_per_thread_default_stream_marks),
      cmocka_unit_test(test_legacy_default_stream_marks),
      cmocka_unit_test(test_per_thread_default_stream_frees),
      cmocka_unit_test(test_legacy_free_not_reused_by_non_blocking),
      cmocka_unit_test(test_async_free_not_reused_by_another_stream),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
