/* A stand-in libnccl.so.2 for tests: collectives between processes of one host through a
 * shared-memory segment, on "device" buffers that are plain host memory (as under
 * tests/fakecuda/). Collectives run at call time, after the work already enqueued on their
 * stream when a libcuda (tests/fakecuda/'s) is loaded; later work on the stream naturally
 * comes after. Every wait is
 * bounded (FAKENCCL_TIMEOUT_S, default 30): a dead rank makes the others return
 * ncclRemoteError, a stuck one ncclSystemError, and a rank that aborts makes the others
 * return ncclRemoteError; nothing hangs.
 *
 * Fault injection: FAKENCCL_KILL_IN_OP=N makes this process SIGKILL itself in the middle of
 * its Nth collective (after everyone contributed, before anyone finished).
 *
 * As real NCCL sets up a communicator's device memory from threads of its own, init makes
 * and frees one device allocation on a thread of its own, on the caller's context, through
 * the process's cuMemAlloc_v2 (a preloaded allocator's door, if there is one). */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "comm/shm_group.h"

#define FAKE_API __attribute__((visibility("default")))
#define FAKE_STAGE (256u * 1024u) /* bytes each rank stages per step; a multiple of 8 */
#define FAKE_ID_MAGIC "fakencl1"

struct fake_id {
  char magic[8];
  char name[64];
};

struct fake_seg {
  _Atomic uint32_t init; /* 0, 1 = being set up by the first rank, 2 = ready */
  struct psg_group group;
  unsigned char stage[]; /* n * FAKE_STAGE */
};

struct ncclComm {
  struct fake_seg *seg;
  size_t map_len;
  int rank, n;
  double timeout_s;
  ncclResult_t error; /* sticky, as NCCL's asynchronous error */
  long ops, kill_in_op;
  /* A non-blocking communicator's call returns ncclInProgress (a group's at its end) and
   * reports it through ncclCommGetAsyncError for `settling` more polls, as NCCL may. */
  bool nonblocking;
  unsigned settling;
};

static _Thread_local int group_depth; /* open ncclGroupStart calls, per thread as NCCL keeps them */
static _Thread_local ncclComm_t group_comm; /* the communicator the open group's calls went to */

/* What a call that finished returns: in progress for a non-blocking communicator. */
static ncclResult_t finished(ncclComm_t c) {
  if (!c->nonblocking) return ncclSuccess;
  if (group_depth) {
    group_comm = c;
    return ncclSuccess;
  }
  c->error = ncclInProgress;
  c->settling = 2;
  return ncclInProgress;
}

static double env_double(const char *name, double dflt) {
  const char *t = getenv(name);
  return t && *t ? strtod(t, NULL) : dflt;
}

FAKE_API ncclResult_t ncclGetVersion(int *version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

FAKE_API const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
  case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
  case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

FAKE_API ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  static _Atomic unsigned counter;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct fake_id f;
  memset(&f, 0, sizeof f);
  memcpy(f.magic, FAKE_ID_MAGIC, sizeof f.magic);
  snprintf(f.name, sizeof f.name, "/fakenccl-%d-%u-%lx", (int)getpid(), counter++,
           (unsigned long)ts.tv_nsec);
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &f, sizeof f);
  return ncclSuccess;
}

/* Waits for the segment's first rank to have set it up. */
static bool wait_ready(struct fake_seg *seg, int n, double timeout_s) {
  uint32_t expected = 0;
  if (atomic_compare_exchange_strong(&seg->init, &expected, 1)) {
    psg_init(&seg->group, n);
    atomic_store_explicit(&seg->init, 2, memory_order_release);
    return true;
  }
  double until = psg_now() + timeout_s;
  unsigned round = 0;
  while (atomic_load_explicit(&seg->init, memory_order_acquire) != 2) {
    if (psg_now() >= until) return false;
    psg_backoff(&round);
  }
  return true;
}

struct setup {
  CUcontext ctx;
  CUresult r;
};

static void *setup_main(void *arg) {
  struct setup *s = arg;
  CUresult (*set)(CUcontext) = (CUresult(*)(CUcontext))dlsym(RTLD_DEFAULT, "cuCtxSetCurrent");
  CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
  CUresult (*release_mem)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))dlsym(RTLD_DEFAULT, "cuMemFree_v2");
  CUdeviceptr p = 0;
  s->r = !set || !alloc || !release_mem ? CUDA_ERROR_NOT_FOUND : set(s->ctx);
  if (s->r == CUDA_SUCCESS) s->r = alloc(&p, 1u << 20);
  if (s->r == CUDA_SUCCESS) s->r = release_mem(p);
  return NULL;
}

/* The device-memory setup on a thread of its own; true when no context is current (the
 * comm unit tests run without a driver). */
static bool device_setup(void) {
  CUresult (*get)(CUcontext *) = (CUresult(*)(CUcontext *))dlsym(RTLD_DEFAULT, "cuCtxGetCurrent");
  struct setup s = {0};
  if (!get || get(&s.ctx) != CUDA_SUCCESS || !s.ctx) return true;
  pthread_t t;
  if (pthread_create(&t, NULL, setup_main, &s) != 0) return false;
  pthread_join(t, NULL);
  return s.r == CUDA_SUCCESS;
}

FAKE_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int n, ncclUniqueId id, int rank,
                                             ncclConfig_t *config) {
  /* Blocking or not, the fake does every call's work before returning. */
  struct fake_id f;
  memcpy(&f, id.internal, sizeof f);
  if (memcmp(f.magic, FAKE_ID_MAGIC, sizeof f.magic) != 0 || n < 1 || n > PSG_MAX_MEMBERS ||
      rank < 0 || rank >= n)
    return ncclInvalidArgument;
  size_t len = sizeof(struct fake_seg) + (size_t)n * FAKE_STAGE;
  int fd = shm_open(f.name, O_RDWR | O_CREAT, 0600);
  if (fd < 0) return ncclSystemError;
  if (ftruncate(fd, (off_t)len) != 0) {
    close(fd);
    return ncclSystemError;
  }
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return ncclSystemError;
  struct ncclComm *c = calloc(1, sizeof *c);
  *c = (struct ncclComm){.seg = p, .map_len = len, .rank = rank, .n = n,
                         .timeout_s = env_double("FAKENCCL_TIMEOUT_S", 30),
                         .kill_in_op = (long)env_double("FAKENCCL_KILL_IN_OP", 0),
                         .nonblocking = config && !config->blocking};
  int32_t holder;
  bool alive;
  struct psg_failure why;
  ncclResult_t r = ncclSuccess;
  if (!wait_ready(c->seg, n, c->timeout_s) || c->seg->group.n != n)
    r = ncclInvalidUsage;
  else if (!psg_claim(&c->seg->group, rank, &holder, &alive))
    r = ncclInvalidUsage;
  else if (psg_barrier(&c->seg->group, rank, c->timeout_s, &why) != PSG_OK)
    r = why.kind == PSG_TIMEOUT ? ncclSystemError : ncclRemoteError;
  if (r != ncclSuccess) {
    munmap(p, len);
    free(c);
    return r;
  }
  if (rank == 0) shm_unlink(f.name); /* everyone has it mapped now */
  if (!device_setup()) {
    munmap(p, len);
    free(c);
    return ncclUnhandledCudaError;
  }
  *out = c;
  return ncclSuccess;
}

FAKE_API ncclResult_t ncclCommInitRank(ncclComm_t *out, int n, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(out, n, id, rank, NULL);
}

FAKE_API ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err) {
  if (c->error == ncclInProgress && c->settling && --c->settling == 0) c->error = ncclSuccess;
  *err = c->error;
  return ncclSuccess;
}

static void release(ncclComm_t c) {
  munmap(c->seg, c->map_len);
  free(c);
}

FAKE_API ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  psg_leave(&c->seg->group, c->rank);
  release(c);
  return ncclSuccess;
}

FAKE_API ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (!c) return ncclSuccess;
  struct psg_failure f = {PSG_GAVE_UP, c->rank, (int32_t)getpid()};
  psg_fail(&c->seg->group, c->rank, &f); /* the peers stop waiting for this rank */
  release(c);
  return ncclSuccess;
}

/* Groups only batch launches; collectives here finish at call time, so nothing to do. */
FAKE_API ncclResult_t ncclGroupStart(void) {
  if (!group_depth++) group_comm = NULL;
  return ncclSuccess;
}

FAKE_API ncclResult_t ncclGroupEnd(void) {
  if (group_depth <= 0) return ncclInvalidUsage;
  if (--group_depth || !group_comm) return ncclSuccess;
  return finished(group_comm);
}

static size_t type_size(ncclDataType_t t) {
  switch (t) {
  case ncclInt8: case ncclUint8: return 1;
  case ncclFloat16: case ncclBfloat16: return 2;
  case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
  case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  default: return 0;
  }
}

static CUresult (*stream_sync)(CUstream);
static void *(*stream_view)(CUstream, CUdeviceptr); /* tests/fakecuda's: the host cannot touch device frames */

/* Only a libcuda the process already loaded: the fake never brings one in itself. */
static void find_stream_sync(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (h) *(void **)&stream_sync = dlsym(h, "cuStreamSynchronize");
  if (h) *(void **)&stream_view = dlsym(h, "fakecuda_stream_view");
}

/* Where the stream's device reaches p (a kernel would run there). */
static void *on_device(cudaStream_t stream, const void *p) {
  return p && stream_view ? stream_view((CUstream)stream, (CUdeviceptr)(uintptr_t)p) : (void *)p;
}

/* The collective reads what earlier work on its stream wrote (the own shard's copy before
 * an all-gather): under fakecuda that work runs on the stream's thread, so wait for it. */
static ncclResult_t after_stream(cudaStream_t stream) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, find_stream_sync);
  return !stream_sync || stream_sync(stream) == CUDA_SUCCESS ? ncclSuccess : ncclUnhandledCudaError;
}

static ncclResult_t step_barrier(ncclComm_t c) {
  struct psg_failure why;
  if (psg_barrier(&c->seg->group, c->rank, c->timeout_s, &why) == PSG_OK) return ncclSuccess;
  c->error = why.kind == PSG_TIMEOUT ? ncclSystemError : ncclRemoteError;
  return c->error;
}

static unsigned char *stage(ncclComm_t c, int rank) {
  return c->seg->stage + (size_t)rank * FAKE_STAGE;
}

/* What one step of a collective does once every rank's piece is staged. */
struct op {
  enum { GATHER, REDUCE, BCAST } kind;
  const unsigned char *send; /* this rank's contribution, NULL if none */
  unsigned char *recv;
  size_t per_rank;           /* bytes each rank contributes */
  ncclDataType_t type;
  ncclRedOp_t red;
  int root;
};

#define FAKE_REDUCE(T)                                                                     \
  static void reduce_##T(ncclComm_t c, ncclRedOp_t op, size_t off, size_t len, T *out) {   \
    size_t k = len / sizeof(T);                                                            \
    for (size_t i = 0; i < k; i++) {                                                       \
      T acc;                                                                               \
      memcpy(&acc, stage(c, 0) + i * sizeof(T), sizeof(T));                                \
      for (int r = 1; r < c->n; r++) {                                                     \
        T v;                                                                               \
        memcpy(&v, stage(c, r) + i * sizeof(T), sizeof(T));                                \
        acc = op == ncclSum ? acc + v : op == ncclProd ? acc * v                           \
            : op == ncclMax ? (v > acc ? v : acc) : (v < acc ? v : acc);                   \
      }                                                                                    \
      memcpy((unsigned char *)out + off + i * sizeof(T), &acc, sizeof(T));                 \
    }                                                                                      \
  }
FAKE_REDUCE(int32_t)
FAKE_REDUCE(uint32_t)
FAKE_REDUCE(int64_t)
FAKE_REDUCE(uint64_t)
FAKE_REDUCE(float)
FAKE_REDUCE(double)

static void consume(ncclComm_t c, const struct op *op, size_t off, size_t len) {
  switch (op->kind) {
  case GATHER:
    for (int r = 0; r < c->n; r++) memcpy(op->recv + (size_t)r * op->per_rank + off, stage(c, r), len);
    break;
  case BCAST:
    memcpy(op->recv + off, stage(c, op->root), len);
    break;
  case REDUCE:
    switch (op->type) {
    case ncclInt32: reduce_int32_t(c, op->red, off, len, (int32_t *)op->recv); break;
    case ncclUint32: reduce_uint32_t(c, op->red, off, len, (uint32_t *)op->recv); break;
    case ncclInt64: reduce_int64_t(c, op->red, off, len, (int64_t *)op->recv); break;
    case ncclUint64: reduce_uint64_t(c, op->red, off, len, (uint64_t *)op->recv); break;
    case ncclFloat32: reduce_float(c, op->red, off, len, (float *)op->recv); break;
    default: reduce_double(c, op->red, off, len, (double *)op->recv); break;
    }
    break;
  }
}

/* Every collective: stage a piece, meet, consume every rank's piece, meet again (so the
 * stage can be reused). */
static ncclResult_t run(ncclComm_t c, const struct op *given, cudaStream_t stream) {
  if (c->error != ncclSuccess) return c->error;
  ncclResult_t waited = after_stream(stream);
  if (waited != ncclSuccess) return c->error = waited;
  struct op device_op = *given, *op = &device_op;
  op->send = on_device(stream, given->send);
  op->recv = on_device(stream, given->recv);
  c->ops++;
  size_t off = 0;
  do { /* once even for 0 bytes: every rank still meets */
    size_t len = op->per_rank - off < FAKE_STAGE ? op->per_rank - off : FAKE_STAGE;
    if (op->send) memcpy(stage(c, c->rank), op->send + off, len);
    ncclResult_t r = step_barrier(c);
    if (r != ncclSuccess) return r;
    if (c->ops == c->kill_in_op) raise(SIGKILL);
    consume(c, op, off, len);
    if ((r = step_barrier(c)) != ncclSuccess) return r;
    off += len;
  } while (off < op->per_rank);
  return finished(c);
}

FAKE_API ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t,
                                    ncclComm_t c, cudaStream_t stream) {
  size_t es = type_size(t);
  if (!c || !es) return ncclInvalidArgument;
  struct op op = {.kind = GATHER, .send = send, .recv = recv, .per_rank = count * es};
  return run(c, &op, stream);
}

FAKE_API ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                                    ncclRedOp_t red, ncclComm_t c, cudaStream_t stream) {
  size_t es = type_size(t);
  bool supported = t == ncclInt32 || t == ncclUint32 || t == ncclInt64 || t == ncclUint64 ||
                   t == ncclFloat32 || t == ncclFloat64;
  if (!c || !supported || red < ncclSum || red > ncclMin) return ncclInvalidArgument;
  struct op op = {.kind = REDUCE, .send = send, .recv = recv, .per_rank = count * es, .type = t,
                  .red = red};
  return run(c, &op, stream);
}

FAKE_API ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t,
                                    int root, ncclComm_t c, cudaStream_t stream) {
  size_t es = type_size(t);
  if (!c || !es || root < 0 || root >= c->n) return ncclInvalidArgument;
  struct op op = {.kind = BCAST, .send = c->rank == root ? send : NULL, .recv = recv,
                  .per_rank = count * es, .root = root};
  return run(c, &op, stream);
}
