/* core/ — the ground every other folder stands on; it includes nothing else of psshim's.
 *
 * ps_driver, the single table of CUDA driver entry points (filled by dlopen of
 * libcuda.so.1 at run time; the test driver stands in the same way); the options table
 * read from the environment; logging; the marking of psshim's own calls; glibc's real
 * dlsym; the forked-child flag; ranked locks; and the moment, what observation reports of
 * a launch. */
#ifndef PSSHIM_CORE_H
#define PSSHIM_CORE_H

#include <cuda.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- logging: nothing unless PSSHIM_LOG asks; always stderr, always "psshim: " ---- */
enum ps_log_level { PS_LOG_OFF = 0, PS_LOG_ERROR, PS_LOG_WARN, PS_LOG_INFO, PS_LOG_DEBUG };
extern int ps_log_level;
void ps_log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define ps_log(level, ...) \
  do { if ((level) <= ps_log_level) ps_log_write((level), __VA_ARGS__); } while (0)
/* An error the user must see (bad configuration, both budgets exhausted): printed at
 * PSSHIM_LOG=error and above, and error is the default level. */
#define ps_error(...) ps_log(PS_LOG_ERROR, __VA_ARGS__)

/* ---- locks: every psshim mutex has a rank, and a thread takes locks in rising rank ----
 * Checked where NDEBUG is not defined (debug and test builds; lock.c): taking a lock not
 * above every lock the thread holds, releasing one it does not hold, or a function that
 * drops a lock called without it, aborts with both locks named. Release builds keep only
 * the pthread calls. Devices' locks rank by ordinal: the fork handler, the one place that
 * holds several, takes them in rising order. A trylock never waits, so it may take any rank. */
enum ps_lock_rank {
  PS_RANK_PERIOD = 1,    /* shim/wiring.c: the iteration's period, before any device */
  PS_RANK_MEETING,       /* allocator/rounds.c: one thread meets the node's ranks */
  PS_RANK_COMM_IPC,      /* comm/ipc.c: the IPC service; never held with a device's lock */
  PS_RANK_SETUP,         /* allocator/space.c: devices being set up */
  PS_RANK_DEVICE,        /* allocator's device locks: PS_RANK_DEVICE + ordinal */
  PS_RANK_OWNER = PS_RANK_DEVICE + 64, /* allocator/owner.c: a device's owner and its launches */
  PS_RANK_IMPORTS,       /* allocator/ipc.c: handles opened from other processes */
  PS_RANK_STEADY,        /* allocator/stats.c: steady-state statistics */
  PS_RANK_NODE_HOST,     /* comm/: the node's pinned host memory, shared among processes */
  PS_RANK_CUPTI_GUEST,   /* tracer/cupti_guest.c */
  PS_RANK_TRACE_OPEN,    /* tracer/trace_writer.c: open and close */
  PS_RANK_TRACE_FLUSH,   /*   the file and the block */
  PS_RANK_TRACE_DICT,    /*   strings, stacks, meta */
  PS_RANK_TRACE_WAKE,    /*   the flusher's wake-ups */
};
typedef struct {
  pthread_mutex_t m;
  unsigned rank;
  const char *name;
} ps_mutex;
#define PS_MUTEX_INITIALIZER(rank_, name_) {.m = PTHREAD_MUTEX_INITIALIZER, .rank = (rank_), .name = (name_)}
void ps_mutex_init(ps_mutex *m, unsigned rank, const char *name);
#ifndef NDEBUG
#define PS_CHECKS 1
/* A debug check failed: one line on stderr (no stdio, no malloc: it runs inside hooks),
 * prefixed "psshim: check failed: ", then abort. */
__attribute__((noreturn, format(printf, 1, 2))) void ps_check_failed(const char *fmt, ...);
/* The lock at `lock` of `rank` about to be taken (order checked unless trying), taken, given
 * back; and asserts that the calling thread holds it (`why`: the caller, for the message). */
void ps_lock_check_take(const void *lock, unsigned rank, const char *name, bool trying);
void ps_lock_check_give(const void *lock, const char *name);
void ps_lock_check_held(const void *lock, const char *name, const char *why);
/* The thread holds no psshim lock (before a wait others' progress must not depend on). */
void ps_lock_check_none(const char *why);
#define ps_mutex_assert_held(mx) ps_lock_check_held((mx), (mx)->name, __func__)
#else
#define ps_lock_check_take(lock, rank, name, trying) ((void)0)
#define ps_lock_check_give(lock, name) ((void)0)
#define ps_lock_check_none(why) ((void)0)
#define ps_mutex_assert_held(mx) ((void)0)
#endif
static inline void ps_mutex_lock(ps_mutex *mx)
{
  ps_lock_check_take(mx, mx->rank, mx->name, false);
  pthread_mutex_lock(&mx->m);
}
/* 0 when taken, as pthread_mutex_trylock. */
static inline int ps_mutex_trylock(ps_mutex *mx)
{
  int r = pthread_mutex_trylock(&mx->m);
  if (!r)
    ps_lock_check_take(mx, mx->rank, mx->name, true);
  return r;
}
static inline void ps_mutex_unlock(ps_mutex *mx)
{
  ps_lock_check_give(mx, mx->name);
  pthread_mutex_unlock(&mx->m);
}
static inline void ps_cond_wait(pthread_cond_t *c, ps_mutex *mx)
{
  ps_mutex_assert_held(mx);
  pthread_cond_wait(c, &mx->m);
}
static inline int ps_cond_timedwait(pthread_cond_t *c, ps_mutex *mx, const struct timespec *until)
{
  ps_mutex_assert_held(mx);
  return pthread_cond_timedwait(c, &mx->m, until);
}

/* ---- the driver table ---- */
#define PS_DRIVER_FUNCS(X)                                                            \
  X(cuInit, CUresult, (unsigned int))                                                 \
  X(cuDriverGetVersion, CUresult, (int *))                                            \
  X(cuGetErrorName, CUresult, (CUresult, const char **))                              \
  X(cuDeviceGet, CUresult, (CUdevice *, int))                                         \
  X(cuDeviceGetCount, CUresult, (int *))                                              \
  X(cuDeviceGetAttribute, CUresult, (int *, CUdevice_attribute, CUdevice))            \
  X(cuDeviceTotalMem_v2, CUresult, (size_t *, CUdevice))                              \
  X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext *, CUdevice))                      \
  X(cuCtxGetCurrent, CUresult, (CUcontext *))                                         \
  X(cuCtxSetCurrent, CUresult, (CUcontext))                                           \
  X(cuCtxGetDevice, CUresult, (CUdevice *))                                           \
  X(cuCtxSynchronize, CUresult, (void))                                               \
  X(cuMemGetInfo_v2, CUresult, (size_t *, size_t *))                                  \
  X(cuMemAlloc_v2, CUresult, (CUdeviceptr *, size_t))                                 \
  X(cuMemFree_v2, CUresult, (CUdeviceptr))                                            \
  X(cuMemAllocAsync, CUresult, (CUdeviceptr *, size_t, CUstream))                     \
  X(cuMemFreeAsync, CUresult, (CUdeviceptr, CUstream))                                \
  X(cuMemAllocFromPoolAsync, CUresult, (CUdeviceptr *, size_t, CUmemoryPool, CUstream)) \
  X(cuMemAddressReserve, CUresult, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)) \
  X(cuMemAddressFree, CUresult, (CUdeviceptr, size_t))                                \
  X(cuMemCreate, CUresult, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long)) \
  X(cuMemRelease, CUresult, (CUmemGenericAllocationHandle))                           \
  X(cuMemMap, CUresult, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)) \
  X(cuMemUnmap, CUresult, (CUdeviceptr, size_t))                                      \
  X(cuMemSetAccess, CUresult, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t)) \
  X(cuMemExportToShareableHandle, CUresult, (void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long)) \
  X(cuMemImportFromShareableHandle, CUresult, (CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType)) \
  X(cuMemAllocHost_v2, CUresult, (void **, size_t))                                   \
  X(cuMemFreeHost, CUresult, (void *))                                                \
  X(cuMemGetAllocationGranularity, CUresult, (size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags)) \
  X(cuStreamCreate, CUresult, (CUstream *, unsigned int))                             \
  X(cuStreamDestroy_v2, CUresult, (CUstream))                                         \
  X(cuStreamSynchronize, CUresult, (CUstream))                                        \
  X(cuStreamQuery, CUresult, (CUstream))                                              \
  X(cuStreamWaitEvent, CUresult, (CUstream, CUevent, unsigned int))                   \
  X(cuStreamIsCapturing, CUresult, (CUstream, CUstreamCaptureStatus *))                \
  X(cuEventCreate, CUresult, (CUevent *, unsigned int))                               \
  X(cuEventDestroy_v2, CUresult, (CUevent))                                           \
  X(cuEventRecord, CUresult, (CUevent, CUstream))                                     \
  X(cuEventQuery, CUresult, (CUevent))                                                \
  X(cuEventSynchronize, CUresult, (CUevent))                                          \
  X(cuMemcpyAsync, CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream))            \
  X(cuMemcpy, CUresult, (CUdeviceptr, CUdeviceptr, size_t))                           \
  X(cuMemcpyDtoHAsync_v2, CUresult, (void *, CUdeviceptr, size_t, CUstream))          \
  X(cuFuncGetParamInfo, CUresult, (CUfunction, size_t, size_t *, size_t *))           \
  X(cuGetProcAddress_v2, CUresult, (const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))

/* Entry points psshim uses when the driver has them: NULL in the table when it does not. */
#define PS_DRIVER_OPTIONAL_FUNCS(X)                                                    \
  X(cuDeviceGetName, CUresult, (char *, int, CUdevice))                               \
  X(cuDeviceGetMemPool, CUresult, (CUmemoryPool *, CUdevice))                         \
  X(cuKernelGetParamInfo, CUresult, (CUkernel, size_t, size_t *, size_t *))           \
  X(cuMemAllocAsync_ptsz, CUresult, (CUdeviceptr *, size_t, CUstream))                \
  X(cuMemFreeAsync_ptsz, CUresult, (CUdeviceptr, CUstream))                           \
  X(cuMemAllocFromPoolAsync_ptsz, CUresult, (CUdeviceptr *, size_t, CUmemoryPool, CUstream)) \
  X(cuThreadExchangeStreamCaptureMode, CUresult, (CUstreamCaptureMode *))             \
  X(cuIpcGetMemHandle, CUresult, (CUipcMemHandle *, CUdeviceptr))                     \
  X(cuIpcOpenMemHandle_v2, CUresult, (CUdeviceptr *, CUipcMemHandle, unsigned int))   \
  X(cuIpcCloseMemHandle, CUresult, (CUdeviceptr))                                     \
  X(cuStreamGetCaptureInfo_v3, CUresult, (CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *, \
                                          const CUgraphNode **, const CUgraphEdgeData **, size_t *))

struct ps_driver {
#define PS_DRIVER_FIELD(name, ret, args) ret (*name) args;
  PS_DRIVER_FUNCS(PS_DRIVER_FIELD)
  PS_DRIVER_OPTIONAL_FUNCS(PS_DRIVER_FIELD)
#undef PS_DRIVER_FIELD
};
extern struct ps_driver ps_driver;

/* Loads libcuda.so.1 (PSSHIM_LIBCUDA overrides the path) and fills ps_driver once.
 * Returns false, after one log line naming what is missing, if it cannot. */
bool ps_driver_load(void);
/* Set while psshim itself calls NCCL (its communicator's set-up and gathers). Meanwhile
 * no allocation is served, on any thread: NCCL allocates from threads of its own too, and
 * its buffers, used by kernels psshim does not observe, must never be paged. On this
 * thread, moments are not observed and dlsym finds the real functions, not the doors. */
void ps_own_calls(bool on);
/* Brackets psshim's own driver calls made outside a launch callback (a meeting of the
 * node's ranks): on this thread, as within ps_own_calls, moments are not observed and
 * dlsym finds the real functions; other threads' allocations are served as usual. */
void ps_own_work(bool on);
bool ps_in_own_calls(void);       /* on this thread */
bool ps_own_calls_anywhere(void); /* on any thread */
/* Code that may run before a sanitizer runtime has initialised (it calls dlsym from its
 * own start-up): no instrumentation, so a sanitized build of psshim can be preloaded. */
#define PS_NO_SANITIZE __attribute__((no_sanitize("address", "undefined")))
/* Every psshim thread-local: initial-exec, the model of a library loaded with the program,
 * so that a first touch never calls __tls_get_addr, which may malloc (inside a hook). */
#define PS_THREAD_LOCAL _Thread_local __attribute__((tls_model("initial-exec")))

/* glibc's own dlsym: psshim overrides the exported dlsym, so its own lookups use this. */
void *ps_real_dlsym(void *handle, const char *name);
/* glibc's dlsym itself (a stand-in that finds nothing if it cannot be found). */
void *(*ps_glibc_dlsym(void))(void *, const char *);
/* Any entry point of the loaded driver by its exported name (NULL if absent): for the
 * doors, which forward whatever name the program asked for. */
void *ps_driver_symbol(const char *name);
/* "CUDA_ERROR_OUT_OF_MEMORY"-style name for logs, never NULL. */
const char *ps_cu_error_name(CUresult r);
/* Calls a driver entry point and logs a failure with the call's text; yields the CUresult. */
#define PS_CU(call) ps_cu_checked((call), #call, __FILE__, __LINE__)
CUresult ps_cu_checked(CUresult r, const char *what, const char *file, int line);

/* ---- fork: the child of a process that used CUDA cannot use it (CUDA's rule) ----
 * Set in the child by the shim's fork handler; every part of psshim passes through or
 * stops quietly from then on. */
void ps_mark_forked_child(void);
bool ps_in_forked_child(void);

/* ---- the moment: one kernel launch or transfer, as the launching thread enqueues it ----
 * Observation (tracer/) and psshim's NCCL doors report moments; paging and sharing
 * consume them. A collective is an NCCL call seen at the NCCL doors. */
enum ps_moment_kind { PS_MOMENT_KERNEL = 0, PS_MOMENT_COPY, PS_MOMENT_MEMSET, PS_MOMENT_COLLECTIVE };
struct ps_moment {
  uint64_t seq;       /* process-wide order of moments */
  uint64_t stream;    /* CUstream as an integer (0: legacy default stream) */
  uint64_t signature; /* same kernel (or same transfer kind and size) -> same value */
  const char *name;   /* kernel symbol or driver function name; may be NULL */
  enum ps_moment_kind kind;
  uint32_t copy_kind; /* the trace's copy kind (tracer.h), for copies and memsets */
  uint64_t bytes, src, dst;
  uint32_t nptrs;     /* values inside psshim's chunk space found in the parameters */
  const uint64_t *ptrs; /* sorted, unique; valid during the report */
  bool failed;        /* exit only: the driver call returned an error */
  bool opaque;        /* its memory accesses cannot be seen (a CUDA graph launch) */
  bool truncated;     /* more pointers were found than a moment carries */
};

/* ---- options: read once from the environment at start (see options.c for the table) ---- */
enum ps_policy_kind { PS_POLICY_STATIC = 0, PS_POLICY_AUTO };
/* A policy's PSSHIM_POLICY value ("static", "auto"). */
const char *ps_policy_name(enum ps_policy_kind p);
struct ps_options {
  uint64_t gpu_budget;       /* bytes of GPU frames; 0 = default (device memory minus reserve) */
  double gpu_budget_frac;    /* when given as NN%, fraction of device memory; else 0 */
  uint64_t gpu_reserve;      /* bytes left to what psshim does not manage */
  uint64_t host_budget;      /* bytes of pinned host frames; 0 = default */
  double host_budget_frac;
  uint64_t chunk_size;       /* bytes; 0 = the allocator's default for this node */
  enum ps_policy_kind policy;
  int log_level;
  bool stats;                /* PSSHIM_STATS set to 1 or a path */
  const char *stats_path;    /* PSSHIM_STATS=file.json: JSON at exit instead of text on stderr */
  bool keep_torch_allocator; /* PSSHIM_TORCH_ALLOC=keep: leave PYTORCH_CUDA_ALLOC_CONF unset */
  bool disabled;             /* PSSHIM_DISABLE=1: every door passes through */
  const char *trace_path;    /* PSSHIM_TRACE */
  unsigned sample_ms;        /* PSSHIM_SAMPLE_MS */
  const char *cupti_path;    /* PSSHIM_CUPTI */
  const char *libcuda_path;  /* PSSHIM_LIBCUDA */
  const char *nccl_path;     /* PSSHIM_NCCL: the NCCL of psshim's own communicator */
  double comm_timeout_s;     /* PSSHIM_COMM_TIMEOUT_S: longest wait among a node's ranks */
};
extern struct ps_options ps_options;
/* Parses every PSSHIM_* variable. On a bad value: one line naming the variable and what it
 * accepts into err (if non-NULL) and false. Never exits: the caller decides. */
bool ps_options_parse(char *err, size_t errlen);
/* One line at the default log level for each PSSHIM_* variable of the environment that the
 * table does not hold (a misspelling would otherwise be ignored without a word). */
void ps_options_say_unknown(void);
/* The run's settings for its trace: "policy auto; given: PSSHIM_GPU_BUDGET=24G ...", each
 * variable of the table the environment sets, as given; buf returned (truncated to fit). */
const char *ps_options_settings(char *buf, size_t len);
/* A size for a message: "24.0 MiB", "2.0 TiB", "512 bytes"; buf returned. */
const char *ps_size_text(uint64_t bytes, char *buf, size_t len);
/* A setting for a message, as the user gave it: "PSSHIM_GPU_BUDGET=2T (psshim --budget)",
 * the launcher's option named where one sets the variable; buf returned. */
const char *ps_setting_text(const char *var, char *buf, size_t len);
/* Parses "64M", "1.5G", "512", "25%" (percent only when pct is non-NULL). */
bool ps_parse_size(const char *text, uint64_t *bytes, double *pct);

#endif
