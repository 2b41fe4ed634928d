/* A training step captured into a CUDA graph and replayed, as torch.cuda.graph does, run
 * under LD_PRELOAD=libpsshim.so on the fake driver with a GPU budget below the capture's
 * peak, so the capture allocates into new spans, spilling to host frames.
 *
 * Usage: capture_sim MODE   (global, thread_local or relaxed: the capture's mode)
 *
 * Before the capture, warm-up steps allocate and free on the capture stream and on a second
 * stream (frees pending on both). During it, the step allocates a small and a large
 * temporary (the large one past the budget), combines them into the output, frees them,
 * allocates again (the graph may reuse what it freed) and frees that; meanwhile another
 * thread, in the default GLOBAL mode, allocates, computes and frees on its own stream.
 * After it, tensors as large as all of the capture's temporaries are allocated and filled,
 * then the graph replayed three times: the output must be right each time, and the tensors
 * untouched (the graph's memory is its own).
 * Exit 0 when all holds; otherwise one line on stderr and a code naming the step. */
#include "tests/fakecuda/fakecuda.h"

#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1 << 20)
#define WORDS (MiB / 8)

static _Atomic int mismatches;
static CUfunction fill_fn, check_fn, mix_fn;

static uint64_t pattern(uint64_t seed, uint64_t i) { return (seed * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull); }

static void fill_kernel(void **args, void *user)
{
  (void)user;
  uint64_t *p = *(uint64_t **)args[0], n = *(uint64_t *)args[1], seed = *(uint64_t *)args[2];
  for (uint64_t i = 0; i < n; i++)
    p[i] = pattern(seed, i);
}

/* check(p, n, seed): counts a mismatch unless p holds fill(seed), or (seed 0) the step's output. */
static void check_kernel(void **args, void *user)
{
  (void)user;
  const uint64_t *p = *(uint64_t **)args[0], n = *(uint64_t *)args[1], seed = *(uint64_t *)args[2];
  for (uint64_t i = 0; i < n; i++) {
    uint64_t want = seed ? pattern(seed, i) : pattern(1, i) ^ pattern(2, i) ^ pattern(3, i) ^ pattern(4, i);
    if (p[i] != want) {
      atomic_fetch_add(&mismatches, 1);
      return;
    }
  }
}

/* mix(out, a, b, n): out = a ^ b. */
static void mix_kernel(void **args, void *user)
{
  (void)user;
  uint64_t *out = *(uint64_t **)args[0];
  const uint64_t *a = *(uint64_t **)args[1], *b = *(uint64_t **)args[2];
  uint64_t n = *(uint64_t *)args[3];
  for (uint64_t i = 0; i < n; i++)
    out[i] = a[i] ^ b[i];
}

static void die(int code, const char *what, CUresult r)
{
  const char *name = NULL;
  cuGetErrorName(r, &name);
  fprintf(stderr, "capture_sim: %s: %s\n", what, name ? name : "?");
  exit(code);
}

static void run(CUfunction f, void **params, CUstream s, int code)
{
  CUresult r = cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
  if (r)
    die(code, "a launch failed", r);
}

static void fill(CUdeviceptr p, uint64_t seed, CUstream s, int code)
{
  uint64_t n = WORDS;
  void *params[] = {&p, &n, &seed};
  run(fill_fn, params, s, code);
}

static void check(CUdeviceptr p, uint64_t seed, CUstream s, int code)
{
  uint64_t n = WORDS;
  void *params[] = {&p, &n, &seed};
  run(check_fn, params, s, code);
}

static void mix(CUdeviceptr out, CUdeviceptr a, CUdeviceptr b, CUstream s, int code)
{
  uint64_t n = WORDS;
  void *params[] = {&out, &a, &b, &n};
  run(mix_fn, params, s, code);
}

static CUdeviceptr alloc(size_t bytes, CUstream s, int code)
{
  CUdeviceptr p;
  CUresult r = cuMemAllocAsync(&p, bytes, s);
  if (r)
    die(code, "an allocation failed", r);
  return p;
}

static void release(CUdeviceptr p, CUstream s, int code)
{
  CUresult r = cuMemFreeAsync(p, s);
  if (r)
    die(code, "a free failed", r);
}

/* The capture's step: out = x ^ a ^ b ^ c, with a, b, c temporaries made and freed in it. */
static void step(CUdeviceptr out, CUdeviceptr x, CUstream s)
{
  CUdeviceptr a = alloc(MiB, s, 20), b = alloc(6 * MiB, s, 21);
  fill(a, 2, s, 22);
  fill(b, 3, s, 22);
  mix(out, x, a, s, 22);
  mix(out, out, b, s, 22);
  release(a, s, 23);
  release(b, s, 23);
  CUdeviceptr c = alloc(MiB, s, 24);
  fill(c, 4, s, 22);
  mix(out, out, c, s, 22);
  release(c, s, 23);
}

struct elsewhere {
  CUcontext ctx;
  CUstream t;
  _Atomic bool go, done;
};

/* Another thread's work during the capture: it must neither fail nor break the capture. */
static void *other_thread(void *arg)
{
  struct elsewhere *e = arg;
  if (cuCtxSetCurrent(e->ctx))
    exit(30);
  while (!atomic_load(&e->go))
    ;
  for (int k = 0; k < 4; k++) {
    CUdeviceptr p = alloc(MiB, e->t, 31), q = alloc(3 * MiB, e->t, 31);
    fill(p, 7, e->t, 32);
    fill(q, 7, e->t, 32);
    check(p, 7, e->t, 32);
    check(q, 7, e->t, 32);
    release(p, e->t, 33);
    release(q, e->t, 33);
  }
  atomic_store(&e->done, true);
  return NULL;
}

int main(int argc, char **argv)
{
  CUstreamCaptureMode mode;
  if (argc != 2)
    return 2;
  if (!strcmp(argv[1], "global"))
    mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  else if (!strcmp(argv[1], "thread_local"))
    mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
  else if (!strcmp(argv[1], "relaxed"))
    mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  else
    return 2;
  CUdevice dev;
  CUcontext ctx;
  CUstream s, t;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
      cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) || cuStreamCreate(&t, CU_STREAM_NON_BLOCKING))
    return 3;
  size_t three[] = {8, 8, 8}, four[] = {8, 8, 8, 8};
  fill_fn = fakecuda_register_kernel("fill", fill_kernel, NULL, 3, three);
  check_fn = fakecuda_register_kernel("check", check_kernel, NULL, 3, three);
  mix_fn = fakecuda_register_kernel("mix", mix_kernel, NULL, 4, four);

  CUdeviceptr x = alloc(MiB, s, 10), out = alloc(MiB, s, 10);
  fill(x, 1, s, 11);
  for (int k = 0; k < 3; k++) { /* warm-up, as torch.cuda.graph asks: frees pending on both streams */
    step(out, x, s);
    check(out, 0, s, 12);
    CUdeviceptr p = alloc(2 * MiB, t, 13);
    fill(p, 5, t, 13);
    release(p, t, 13);
  }
  if (cuStreamSynchronize(s) || cuStreamSynchronize(t) || atomic_load(&mismatches))
    return 14;

  struct elsewhere e = {.ctx = ctx, .t = t};
  pthread_t th;
  if (pthread_create(&th, NULL, other_thread, &e))
    return 15;
  CUresult r = cuStreamBeginCapture_v2(s, mode);
  if (r)
    die(16, "cuStreamBeginCapture", r);
  atomic_store(&e.go, true);
  step(out, x, s);
  while (!atomic_load(&e.done)) /* the other thread's work overlaps the capture */
    ;
  CUgraph g;
  r = cuStreamEndCapture(s, &g);
  if (r)
    die(17, "the capture was invalidated", r);
  pthread_join(th, NULL);
  CUgraphExec exec;
  if ((r = cuGraphInstantiateWithFlags(&exec, g, 0)))
    die(18, "cuGraphInstantiateWithFlags", r);

  /* Allocated after the capture: they must not share bytes with the graph's temporaries. */
  enum { NAFTER = 12 };
  CUdeviceptr y[NAFTER];
  for (int k = 0; k < NAFTER; k++) {
    y[k] = alloc(MiB, s, 19);
    fill(y[k], 100 + (uint64_t)k, s, 19);
  }
  if ((r = cuMemsetD32Async(out, 0, MiB / 4, s)))
    die(19, "cuMemsetD32Async", r);
  for (int k = 0; k < 3; k++) {
    if ((r = cuGraphLaunch(exec, s)))
      die(25, "cuGraphLaunch", r);
    check(out, 0, s, 26);
    for (int j = 0; j < NAFTER; j++)
      check(y[j], 100 + (uint64_t)j, s, 26);
  }
  check(x, 1, s, 26);
  if ((r = cuStreamSynchronize(s)) || (r = cuStreamSynchronize(t)))
    die(27, "synchronize", r);
  if (atomic_load(&mismatches)) {
    fprintf(stderr, "capture_sim: %d checks found wrong data after the replays\n", atomic_load(&mismatches));
    return 28;
  }
  for (int k = 0; k < NAFTER; k++)
    release(y[k], s, 29);
  release(x, s, 29);
  release(out, s, 29);
  cuGraphExecDestroy(exec);
  cuGraphDestroy(g);
  if (cuStreamSynchronize(s))
    return 29;
  printf("capture_sim %s: graph replayed 3 times, results right\n", argv[1]);
  return 0;
}
