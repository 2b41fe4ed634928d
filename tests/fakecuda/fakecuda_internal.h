/* Shared inside the fake libcuda only (hidden symbols). Exported entry points are thin:
 * they check arguments, report to the API hook (FC_TRACED) and call an fc_* function;
 * fc_* functions never call exported ones, so an LD_PRELOADed interposer of, say,
 * cuMemAlloc_v2 sees exactly the application's calls. */
#ifndef FAKECUDA_INTERNAL_H
#define FAKECUDA_INTERNAL_H

#include <cuda.h>
#include <cupti.h> /* CUPTI's parameter structs and callback ids, reported by the hook */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fakecuda.h"

#define FC_EXPORT __attribute__((visibility("default")))
#define FC_MAX_DEVICES 16
#define FC_GRANULARITY ((size_t)2 << 20) /* the H200's VMM granularity, device and host */
#define FC_HOST (-1)                     /* "device" index of the host-frame budget */
#define FC_DRIVER_VERSION 13000

/* The per-thread-default-stream forms are declared by cuda.h only when the including
 * file asks for per-thread semantics; the fake exports both, so it declares them. */
CUresult cuMemcpy_ptds(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyAsync_ptsz(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2_ptds(void *, CUdeviceptr, size_t);
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemsetD8_v2_ptds(CUdeviceptr, unsigned char, size_t);
CUresult cuMemsetD32_v2_ptds(CUdeviceptr, unsigned int, size_t);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr, unsigned char, size_t, CUstream);
CUresult cuMemsetD32Async_ptsz(CUdeviceptr, unsigned int, size_t, CUstream);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuStreamSynchronize_ptsz(CUstream);
CUresult cuStreamQuery_ptsz(CUstream);
CUresult cuStreamIsCapturing_ptsz(CUstream, CUstreamCaptureStatus *);
CUresult cuStreamWaitEvent_ptsz(CUstream, CUevent, unsigned int);
CUresult cuEventRecord_ptsz(CUevent, CUstream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream, CUstreamCaptureMode);
CUresult cuStreamEndCapture_ptsz(CUstream, CUgraph *);
/* Old (pre-_v2) names the real driver still exports; cuda.h's macros rename them in C,
 * so they are defined under other names and given the old symbol with an asm label.
 * (The _v1 forms taking 32-bit pointers, like the old cuMemAlloc, are not provided.) */
CUresult fc_cuGetProcAddress_v1(const char *, void **, int, cuuint64_t) __asm__("cuGetProcAddress");
CUresult fc_cuEventElapsedTime_v1(float *, CUevent, CUevent) __asm__("cuEventElapsedTime");
CUresult fc_cuStreamDestroy_v1(CUstream) __asm__("cuStreamDestroy");
CUresult fc_cuEventDestroy_v1(CUevent) __asm__("cuEventDestroy");
CUresult fc_cuCtxPushCurrent_v1(CUcontext) __asm__("cuCtxPushCurrent");
CUresult fc_cuCtxPopCurrent_v1(CUcontext *) __asm__("cuCtxPopCurrent");
CUresult fc_cuDevicePrimaryCtxRelease_v1(CUdevice) __asm__("cuDevicePrimaryCtxRelease");
CUresult fc_cuIpcOpenMemHandle_v1(CUdeviceptr *, CUipcMemHandle, unsigned int) __asm__("cuIpcOpenMemHandle");

/* ---- configuration and init (init.c) ---- */
struct fc_config {
  size_t device_mem;
  size_t host_mem;
  int device_count;
  _Atomic unsigned copy_delay_us, event_delay_us, kernel_delay_us, remap_delay_us;
};
extern struct fc_config fc_cfg;
/* CUDA_ERROR_NOT_INITIALIZED until cuInit succeeded, else CUDA_SUCCESS. */
CUresult fc_check_init(void);
CUresult fc_check_device(CUdevice dev);
void fc_sleep_us(unsigned us);

/* ---- the API hook (api.c) ---- */
/* Returns true when a hook was called; only then must fc_api_exit follow. */
/* Whether a CUPTI subscriber's callback is running on this thread (api.c). */
bool fc_in_cupti_callback(void);
bool fc_api_enter(int cbid, const char *name, const void *params, CUresult *result, void *slots);
void fc_api_exit(int cbid, const char *name, const void *params, CUresult *result, void *slots);
struct fc_api_slots { fakecuda_api_callback cb[2]; void *user[2]; };
/* Stream capture's rules (capture.c): CUDA_SUCCESS, or the error CUDA gives this call now. */
CUresult fc_capture_gate(int cbid, const void *params);

/* Wraps one call: builds the CUPTI parameter struct NAME##_params from the arguments,
 * reports enter, runs CALL, reports exit, returns CALL's result. */
#define FC_TRACED(name, call, ...)                                                         \
  do {                                                                                      \
    name##_params fc_p_ = {__VA_ARGS__};                                                    \
    struct fc_api_slots fc_s_;                                                              \
    CUresult fc_r_ = CUDA_SUCCESS;                                                          \
    bool fc_t_ = fc_api_enter(CUPTI_DRIVER_TRACE_CBID_##name, #name, &fc_p_, &fc_r_, &fc_s_); \
    fc_r_ = fc_capture_gate(CUPTI_DRIVER_TRACE_CBID_##name, &fc_p_);                        \
    if (fc_r_ == CUDA_SUCCESS) fc_r_ = (call);                                              \
    if (fc_t_) fc_api_exit(CUPTI_DRIVER_TRACE_CBID_##name, #name, &fc_p_, &fc_r_, &fc_s_);  \
    return fc_r_;                                                                           \
  } while (0)
/* For entry points without arguments (CUPTI passes no parameter struct). */
#define FC_TRACED0(name, call)                                                              \
  do {                                                                                      \
    struct fc_api_slots fc_s_;                                                              \
    CUresult fc_r_ = CUDA_SUCCESS;                                                          \
    bool fc_t_ = fc_api_enter(CUPTI_DRIVER_TRACE_CBID_##name, #name, NULL, &fc_r_, &fc_s_); \
    fc_r_ = fc_capture_gate(CUPTI_DRIVER_TRACE_CBID_##name, NULL);                          \
    if (fc_r_ == CUDA_SUCCESS) fc_r_ = (call);                                              \
    if (fc_t_) fc_api_exit(CUPTI_DRIVER_TRACE_CBID_##name, #name, NULL, &fc_r_, &fc_s_);    \
    return fc_r_;                                                                           \
  } while (0)

/* ---- handle sets: which pointers are live handles of one kind (handles.c) ---- */
struct fc_handles {
  pthread_mutex_t mu;
  void **v;
  size_t n, cap;
};
#define FC_HANDLES_INIT {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0}
bool fc_handles_add(struct fc_handles *h, void *p);
bool fc_handles_remove(struct fc_handles *h, void *p);
bool fc_handles_has(struct fc_handles *h, const void *p);

/* ---- devices and contexts (context.c) ---- */
struct CUstream_st;
struct CUctx_st {
  CUdevice dev;
  int retains;          /* primary-context retain count (fc_ctx_mu) */
  pthread_mutex_t mu;   /* orders enqueues: the legacy-stream rule needs a consistent view */
  struct CUstream_st *streams; /* every stream whose worker still runs, legacy included */
  struct CUstream_st *legacy;  /* created on first use */
};
struct CUmemPoolHandle_st {
  CUdevice dev; /* the device's default pool; fakecuda has no other pools */
};
extern struct CUctx_st fc_ctx[FC_MAX_DEVICES];
extern struct CUmemPoolHandle_st fc_pool[FC_MAX_DEVICES];
void fc_contexts_init(int count);
/* The calling thread's current context, or CUDA_ERROR_INVALID_CONTEXT (after the init check). */
CUresult fc_current_ctx(struct CUctx_st **out);
struct CUctx_st *fc_ctx_of(CUcontext c); /* NULL unless c is one of fc_ctx */

/* ---- streams, operations and events (streams.c, events.c) ---- */
struct fc_signal { /* one event record: done once its stream has reached it */
  atomic_int refs;
  bool done;                 /* under fc_sig_mu */
  struct timespec when;      /* completion time, for cuEventElapsedTime */
};
extern pthread_mutex_t fc_sig_mu;
extern pthread_cond_t fc_sig_cv;
struct fc_signal *fc_signal_new(void);
void fc_signal_unref(struct fc_signal *s);
void fc_signal_wait(struct fc_signal *s);

enum fc_op_kind {
  FC_OP_NOP, FC_OP_COPY, FC_OP_MEMSET, FC_OP_KERNEL, FC_OP_RECORD, FC_OP_WAIT_SIGNAL,
  FC_OP_WAIT_STREAM, FC_OP_FREE, FC_OP_EXIT
};
struct CUfunc_st;
struct fc_hit { /* a parameter word that holds a reserved address (launch.c) */
  size_t off;     /* in the parameter buffer */
  CUdeviceptr va; /* as launched: the buffer's copy is translated when the kernel runs */
};
struct fc_op {
  struct fc_op *next;
  enum fc_op_kind kind;
  size_t size; /* bytes allocated for it (a graph replays copies) */
  union {
    struct { void *dst; const void *src; size_t n; } copy;
    struct { void *dst; uint32_t value; unsigned elem; size_t count; } memset;
    struct { /* args, the buffer and the hits follow the op */
      struct CUfunc_st *f;
      void **args;
      unsigned char *buf;
      struct fc_hit *hits;
      size_t nhits;
    } kernel;
    struct { struct fc_signal *sig; } signal;           /* RECORD and WAIT_SIGNAL */
    struct { struct CUstream_st *s; uint64_t seq; } wait; /* holds a ref on s */
    struct { CUdeviceptr ptr; } free;
  } u;
};
enum fc_stream_kind { FC_STREAM_USER, FC_STREAM_LEGACY, FC_STREAM_PER_THREAD };
struct CUstream_st {
  struct CUctx_st *ctx;
  unsigned flags; /* CU_STREAM_NON_BLOCKING or 0 */
  int priority;
  enum fc_stream_kind kind;
  pthread_mutex_t mu;
  pthread_cond_t work_cv, done_cv;
  struct fc_op *head, *tail; /* head is running or next to run */
  uint64_t submitted, completed;
  atomic_int refs; /* the handle, the worker, and each WAIT_STREAM op on it */
  bool dead;       /* destroyed: takes no more work (ctx->mu) */
  _Atomic bool capturing; /* fakecuda_stream_set_capturing: capture's API rules apply */
  _Atomic bool capture_broken; /* a call broke those rules: CUDA would invalidate the capture */
  struct fc_capture *cap; /* the capture it takes part in (capture.c's lock) */
  struct CUstream_st *next; /* in ctx->streams (ctx->mu) */
};
/* Resolves a stream argument: 0 means the legacy stream (or the per-thread one when
 * per_thread, for the _ptsz/_ptds entry points), CU_STREAM_LEGACY / CU_STREAM_PER_THREAD
 * mean those of the current context, anything else must be a live stream handle. */
CUresult fc_stream_resolve(CUstream h, bool per_thread, struct CUstream_st **out);
/* Queues op (ownership passes) with the legacy-stream ordering rule; *seq gets its number. */
CUresult fc_enqueue(struct CUstream_st *s, struct fc_op *op, uint64_t *seq);
void fc_stream_wait_seq(struct CUstream_st *s, uint64_t seq);
CUresult fc_stream_sync(struct CUstream_st *s);
CUresult fc_ctx_sync(struct CUctx_st *ctx);
struct fc_op *fc_op_new(enum fc_op_kind kind, size_t extra);
/* Frees an op that will not run, dropping the references it holds. */
void fc_op_discard(struct fc_op *op);
CUresult fc_stream_query(struct CUstream_st *s);
/* Queues op on s and, when sync, waits until it has run. */
CUresult fc_submit(struct CUstream_st *s, struct fc_op *op, bool sync);
/* Aborts the process, naming the work, when an operation queued (or running) on any
 * stream will touch [p, p+n): `what` (cuMemUnmap, cuMemMap) must not change that range's
 * frame under it. Kernels touch the reserved addresses their parameters hold. */
void fc_check_unqueued(CUdeviceptr p, size_t n, const char *what);

/* ---- stream capture (capture.c) ---- */
struct fc_capture;
/* Takes op when s is capturing (recorded, not run) or when queueing it breaks a capture's
 * rule; then *r is the call's result. */
bool fc_capture_enqueue(struct CUstream_st *s, struct fc_op *op, CUresult *r);
/* s waits for an event last recorded on recorded_in (NULL: never in a capture). */
CUresult fc_capture_wait(struct CUstream_st *s, struct CUstream_st *recorded_in);
CUstreamCaptureStatus fc_capture_status(struct CUstream_st *s);

/* ---- memory (memory.c, vmm.c) ---- */
extern pthread_mutex_t fc_mem_mu;
bool fc_charge(int dev, size_t bytes); /* false when dev's capacity would be exceeded */
void fc_uncharge(int dev, size_t bytes);
/* Worker side of cuMemFreeAsync. */
void fc_alloc_release(CUdeviceptr ptr);
/* True when [p, p+n) lies inside one cuMemAlloc allocation or one VA reservation:
 * the address space a device pointer may name (mapping is checked by faulting). */
bool fc_is_device_range(CUdeviceptr p, size_t n);
struct fc_ptr_info {
  CUdeviceptr base;
  size_t size;
  int dev;      /* owning device, FC_HOST for a host frame */
  bool mapped;  /* VMM: a frame is mapped there */
};
bool fc_alloc_lookup(CUdeviceptr p, struct fc_ptr_info *info);
/* The mapping containing p (mapped = true) or, if none, its reservation (mapped = false). */
bool fc_vmm_lookup(CUdeviceptr p, struct fc_ptr_info *info);
bool fc_vmm_reserved(CUdeviceptr p, size_t n); /* [p, p+n) inside one reservation */
/* Where work of device dev reaches address p: inside a reservation, that device's view of
 * it; elsewhere (host memory, cuMemAlloc allocations) p itself. */
void *fc_device_view(int dev, CUdeviceptr p);

/* ---- kernels (launch.c) ---- */
struct CUfunc_st {
  char *name;
  fakecuda_kernel_fn fn;
  void *user;
  size_t nparams;
  size_t *sizes, *offsets;
  size_t bufsize;
};
void fc_run_kernel(struct fc_op *op, int dev);

#endif
