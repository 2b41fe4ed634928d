/* What psshim's per-launch bracketing costs the launching thread in driver calls: a launch
 * alone, an event recorded behind it (psshim's mark), and a query of the event recorded
 * RUNAHEAD launches back (its run-ahead hold), each call timed on its own, with the host
 * kept RUNAHEAD launches ahead of a GPU busy with short kernels, as in training.
 * Build on the GPU machine: cc -O2 -std=c11 -I$CUDA/include bench/mark_cost.c
 *   -L$CUDA/lib64/stubs -lcuda -o mark_cost; run: ./mark_cost [launches] [kernel_us] */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define RUNAHEAD 256

static const char spin_ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n"
                               ".visible .entry spin(.param .u64 cycles)\n{\n"
                               "  .reg .u64 %rd<5>;\n  .reg .pred %p;\n"
                               "  ld.param.u64 %rd1, [cycles];\n  mov.u64 %rd2, %clock64;\n"
                               "LOOP:\n  mov.u64 %rd3, %clock64;\n  sub.u64 %rd4, %rd3, %rd2;\n"
                               "  setp.lt.u64 %p, %rd4, %rd1;\n  @%p bra LOOP;\n  ret;\n}\n";

static double now_ns(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, long n)
{
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static double mean(const double *v, long n)
{
  double s = 0;
  for (long i = 0; i < n; i++)
    s += v[i];
  return s / n;
}

#define CHECK(call)                                                                                                    \
  do {                                                                                                                 \
    CUresult r_ = (call);                                                                                              \
    if (r_ != CUDA_SUCCESS) {                                                                                          \
      fprintf(stderr, "mark_cost: %s failed (%d)\n", #call, (int)r_);                                                  \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

int main(int argc, char **argv)
{
  long n = argc > 1 ? atol(argv[1]) : 50000;
  double kernel_us = argc > 2 ? atof(argv[2]) : 8;
  CUdevice dev;
  CUcontext ctx;
  CUstream s;
  CUmodule mod;
  CUfunction spin;
  int clock_khz;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuModuleLoadData(&mod, spin_ptx));
  CHECK(cuModuleGetFunction(&spin, mod, "spin"));
  CHECK(cuDeviceGetAttribute(&clock_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev));
  unsigned long long cycles = (unsigned long long)(kernel_us * clock_khz / 1000.0);
  void *args[] = {&cycles};
  CUevent ev[RUNAHEAD];
  for (int i = 0; i < RUNAHEAD; i++)
    CHECK(cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
  double *launch = malloc(n * sizeof *launch), *record = malloc(n * sizeof *record),
         *query = malloc(n * sizeof *query);
  if (!launch || !record || !query)
    return 1;
  printf("mark_cost: %ld launches of a %.1f us kernel, host held %d launches ahead\n", n, kernel_us, RUNAHEAD);
  printf("%-26s %8s %8s %8s %8s %8s %8s %9s  (ns a call)\n", "mode", "launch", "mean", "record", "mean", "query",
         "mean", "not ready");
  /* Mode 0: launches only (the hold by a synchronize every RUNAHEAD launches); mode 1: a mark
   * per launch and the hold by querying the mark RUNAHEAD back; mode 2: as 1 with a mark
   * every 16 launches and the hold on every 16th. */
  static const char *names[] = {"launch only", "mark + hold every launch", "mark + hold every 16th"};
  for (int round = 0; round < 2; round++)
    for (int mode = 0; mode < 3; mode++) {
      long nrec = 0, nq = 0, not_ready = 0;
      int every = mode == 2 ? 16 : 1;
      CHECK(cuStreamSynchronize(s));
      double start = now_ns();
      for (long i = 0; i < n; i++) {
        double t0 = now_ns();
        CHECK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
        double t1 = now_ns();
        launch[i] = t1 - t0;
        if (mode == 0) {
          if (i % RUNAHEAD == 0)
            CHECK(cuStreamSynchronize(s));
          continue;
        }
        if (i % every)
          continue;
        int slot = (int)(i / every % (RUNAHEAD / every));
        if (i >= RUNAHEAD) { /* the event in this slot was recorded RUNAHEAD launches back */
          double q0 = now_ns();
          CUresult r = cuEventQuery(ev[slot]);
          query[nq++] = now_ns() - q0;
          if (r == CUDA_ERROR_NOT_READY) {
            not_ready++;
            CHECK(cuEventSynchronize(ev[slot]));
          } else {
            CHECK(r);
          }
        }
        double r0 = now_ns();
        CHECK(cuEventRecord(ev[slot], s));
        record[nrec++] = now_ns() - r0;
      }
      CHECK(cuStreamSynchronize(s));
      double wall = now_ns() - start;
      if (round == 0)
        continue; /* the first round warms up */
      double launch_mean = mean(launch, n), record_mean = nrec ? mean(record, nrec) : 0,
             query_mean = nq ? mean(query, nq) : 0;
      printf("%-26s %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f %9ld  (%.2f us a launch overall)\n", names[mode],
             median(launch, n), launch_mean, nrec ? median(record, nrec) : 0, record_mean,
             nq ? median(query, nq) : 0, query_mean, not_ready, wall / n / 1000);
    }
  return 0;
}
