/* Replays a psshim trace of a real program (PSSHIM_TRACE) on the test driver, under
 * LD_PRELOAD=libpsshim.so: its allocations and frees, kernel launches (one fake kernel per
 * traced function, taking the traced pointers, translated into the replay's allocations),
 * device-to-device copies, memsets and synchronizations, in time order on one thread. So
 * the pager meets a real framework's pattern (torch's autograd, autocast, fused optimizer)
 * on the CPU; PSSHIM_STATS then tells what it did. Each kernel reads a byte at every
 * pointer it is given, so a touch of an unmapped chunk faults.
 * Usage: trace_replay [--scale N] TRACE
 * --scale N divides every size and every offset into an allocation by N, so a trace of a
 * model larger than this machine replays here in proportion (with PSSHIM_CHUNK_SIZE and
 * the budgets divided by N too). */
#define SIM_NAME "trace_replay"
#include "tests/integration/sim.h"
#include "tracer/tracer.h"

#include <stdint.h>
#include <string.h>

struct event { /* one record to replay, in time order */
  uint64_t ts;
  uint16_t type;
  uint32_t function, n, kind;
  uint64_t a, b, c; /* ALLOC addr size stream; FREE addr stream; COPY bytes src dst; SYNC what stream */
  uint64_t stream;
  uint64_t *ptrs;
};

struct live { /* a traced allocation alive in the replay */
  uint64_t addr, size;
  CUdeviceptr now;
};

static struct live *lives;
static size_t nlives, cap_lives;
static uint64_t scale = 1;

static uint64_t scaled(uint64_t bytes)
{
  return bytes ? (bytes + scale - 1) / scale : 0;
}

static void *grow(void *p, size_t *cap, size_t need, size_t elem)
{
  if (need <= *cap)
    return p;
  size_t c = *cap ? *cap * 2 : 1024;
  while (c < need)
    c *= 2;
  p = realloc(p, c * elem);
  if (!p) {
    fprintf(stderr, SIM_NAME ": out of memory\n");
    exit(2);
  }
  *cap = c;
  return p;
}

static void check_cu(CUresult r, const char *what)
{
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, SIM_NAME ": %s failed: error %d\n", what, (int)r);
    exit(2);
  }
}

/* Index of the first live allocation starting above addr. */
static size_t upper(uint64_t addr)
{
  size_t lo = 0, hi = nlives;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (lives[mid].addr <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* The live allocation holding a traced pointer, else NULL. */
static const struct live *holder(uint64_t p)
{
  size_t i = upper(p);
  return i && p < lives[i - 1].addr + lives[i - 1].size ? &lives[i - 1] : NULL;
}

/* The replay's address for a traced pointer inside a live allocation, else 0. */
static CUdeviceptr translate(uint64_t p)
{
  const struct live *l = holder(p);
  return l ? l->now + (p - l->addr) / scale : 0;
}

/* The replay's address for traced [p, p + bytes) inside one live allocation, else 0. */
static CUdeviceptr translate_range(uint64_t p, uint64_t bytes)
{
  const struct live *l = holder(p);
  return l && bytes && holder(p + bytes - 1) == l ? translate(p) : 0;
}

static int by_time(const void *x, const void *y)
{
  const struct event *a = x, *b = y;
  return a->ts < b->ts ? -1 : a->ts > b->ts;
}

/* The kernel: a byte read at every pointer (a fault if its chunk is unmapped). */
static void touch_fn(void **args, void *user)
{
  uintptr_t n = (uintptr_t)user;
  for (uintptr_t i = 0; i < n; i++) {
    const volatile unsigned char *p = *(const volatile unsigned char **)args[i];
    if (p)
      (void)*p;
  }
}

/* One fake kernel per traced function and pointer count: the period detector tells
 * launches apart by function. */
struct kernel {
  uint32_t function, n;
  CUfunction f;
};
static struct kernel *kernels;
static size_t nkernels, cap_kernels;

static CUfunction kernel_for(uint32_t function, uint32_t n)
{
  for (size_t i = 0; i < nkernels; i++)
    if (kernels[i].function == function && kernels[i].n == n)
      return kernels[i].f;
  static size_t sizes[PST_LAUNCH_MAX_PTRS];
  for (size_t i = 0; i < PST_LAUNCH_MAX_PTRS; i++)
    sizes[i] = 8;
  char name[32];
  snprintf(name, sizeof name, "f%u_%u", function, n);
  kernels = grow(kernels, &cap_kernels, nkernels + 1, sizeof *kernels);
  CUfunction f = fakecuda_register_kernel(name, touch_fn, (void *)(uintptr_t)n, n, sizes);
  kernels[nkernels] = (struct kernel){function, n, f};
  return kernels[nkernels++].f;
}

struct stream_map {
  uint64_t traced;
  CUstream now;
};
static struct stream_map *streams;
static size_t nstreams, cap_streams;

/* The legacy (1) and per-thread (2) default streams are handles in every process; other
 * traced streams become streams of the replay's own. */
static CUstream stream_for(uint64_t traced)
{
  if (traced <= 2)
    return (CUstream)(uintptr_t)traced;
  for (size_t i = 0; i < nstreams; i++)
    if (streams[i].traced == traced)
      return streams[i].now;
  streams = grow(streams, &cap_streams, nstreams + 1, sizeof *streams);
  streams[nstreams].traced = traced;
  check_cu(cuStreamCreate(&streams[nstreams].now, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  return streams[nstreams++].now;
}

static void replay_alloc(const struct event *e)
{
  CUdeviceptr p;
  check(cudaMallocAsync((void **)&p, scaled(e->b), (cudaStream_t)stream_for(e->c)), "cudaMallocAsync");
  size_t i = upper(e->a);
  if (i && lives[i - 1].addr == e->a) { /* traced twice without a free between: keep the newer */
    lives[i - 1] = (struct live){e->a, e->b, p};
    return;
  }
  lives = grow(lives, &cap_lives, nlives + 1, sizeof *lives);
  memmove(&lives[i + 1], &lives[i], (nlives - i) * sizeof *lives);
  lives[i] = (struct live){e->a, e->b, p};
  nlives++;
}

static void replay_free(const struct event *e)
{
  size_t i = upper(e->a);
  if (!i || lives[i - 1].addr != e->a)
    return; /* allocated before the trace began */
  check(cudaFreeAsync((void *)lives[i - 1].now, (cudaStream_t)stream_for(e->b)), "cudaFreeAsync");
  memmove(&lives[i - 1], &lives[i], (nlives - i) * sizeof *lives);
  nlives--;
}

static void replay_launch(const struct event *e)
{
  CUdeviceptr args[PST_LAUNCH_MAX_PTRS];
  void *params[PST_LAUNCH_MAX_PTRS];
  for (uint32_t i = 0; i < e->n; i++) {
    args[i] = translate(e->ptrs[i]);
    params[i] = &args[i];
  }
  check_cu(cuLaunchKernel(kernel_for(e->function, e->n), 1, 1, 1, 1, 1, 1, 0, stream_for(e->stream), params, NULL),
           "cuLaunchKernel");
}

static void replay_copy(const struct event *e)
{
  CUdeviceptr dst = translate_range(e->c, e->a), src = translate_range(e->b, e->a);
  if (!dst || !(e->a / scale))
    return; /* not within one live allocation: nothing of the replay's to touch */
  if (e->kind == PST_COPY_MEMSET)
    check_cu(cuMemsetD8Async(dst, 0, e->a / scale, stream_for(e->stream)), "cuMemsetD8Async");
  else if (e->kind == PST_COPY_D2D && src)
    check_cu(cuMemcpyDtoDAsync(dst, src, e->a / scale, stream_for(e->stream)), "cuMemcpyDtoDAsync");
}

int main(int argc, char **argv)
{
  if (argc == 4 && !strcmp(argv[1], "--scale")) {
    char *end;
    scale = strtoull(argv[2], &end, 10);
    if (*end || !scale)
      scale = 0;
    argv += 2;
    argc -= 2;
  }
  if (argc != 2 || !scale) {
    fprintf(stderr, "usage: trace_replay [--scale N] TRACE\n");
    return 2;
  }
  char err[256];
  struct pst_reader *rd = pst_reader_open(argv[1], err, sizeof err);
  if (!rd) {
    fprintf(stderr, SIM_NAME ": %s\n", err);
    return 2;
  }
  struct event *ev = NULL;
  size_t n = 0, cap = 0;
  struct pst_record r;
  while (pst_reader_next(rd, &r)) {
    struct event e = {.ts = r.ts_ns, .type = r.type};
    switch (r.type) {
    case PST_REC_ALLOC:
      e.a = r.alloc.addr, e.b = r.alloc.size, e.c = r.alloc.stream;
      break;
    case PST_REC_FREE:
      e.a = r.free.addr, e.b = r.free.stream;
      break;
    case PST_REC_LAUNCH:
      e.function = r.launch.function, e.n = r.launch.n, e.stream = r.launch.stream;
      e.ptrs = malloc((r.launch.n ? r.launch.n : 1) * sizeof *e.ptrs);
      if (!e.ptrs)
        return 2;
      memcpy(e.ptrs, r.launch.ptrs, r.launch.n * sizeof *e.ptrs);
      break;
    case PST_REC_COPY:
      e.kind = r.copy.kind, e.a = r.copy.bytes, e.b = r.copy.src, e.c = r.copy.dst, e.stream = r.copy.stream;
      break;
    case PST_REC_SYNC:
      e.kind = r.sync.what, e.stream = r.sync.stream;
      break;
    default:
      continue;
    }
    ev = grow(ev, &cap, n + 1, sizeof *ev);
    ev[n++] = e;
  }
  pst_reader_close(rd);
  qsort(ev, n, sizeof *ev, by_time);
  uint64_t launches = 0;
  for (size_t i = 0; i < n; i++)
    switch (ev[i].type) {
    case PST_REC_ALLOC:
      replay_alloc(&ev[i]);
      break;
    case PST_REC_FREE:
      replay_free(&ev[i]);
      break;
    case PST_REC_LAUNCH:
      replay_launch(&ev[i]);
      launches++;
      break;
    case PST_REC_COPY:
      replay_copy(&ev[i]);
      break;
    case PST_REC_SYNC:
      if (ev[i].kind == PST_SYNC_STREAM)
        check_cu(cuStreamSynchronize(stream_for(ev[i].stream)), "cuStreamSynchronize");
      else
        check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      break;
    }
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  printf("trace_replay: %zu records, %llu launches replayed, %zu allocations left live\n", n,
         (unsigned long long)launches, nlives);
  return 0;
}
