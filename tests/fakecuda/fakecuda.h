/* fakecuda — a stand-in CUDA stack on host memory, so psshim's allocator, tracer and
 * shim run on a machine without a GPU (see DESIGN.md, "Testing without a GPU").
 *
 * libcuda.so.1 (this header's functions plus the driver subset psshim uses),
 * libcupti.so.13 and libcudart.so.13 are built in tests/fakecuda/; a test program
 * links or dlopens them through LD_LIBRARY_PATH (meson: fakecuda_env).
 *
 * Model: device memory is host memory. A VA reservation is an mmap(PROT_NONE); a
 * frame (cuMemCreate) is a memfd; cuMemMap maps it MAP_FIXED|MAP_SHARED but keeps it
 * PROT_NONE until cuMemSetAccess; cuMemUnmap turns the range back to anonymous
 * PROT_NONE. So any touch of an unmapped chunk — by the host or by a "kernel" — dies
 * by SIGSEGV, as a GPU fault kills a real job. Work on a stream of device d reaches mapped
 * memory through d's own view of the reservation (kernel parameters are translated when
 * the kernel runs), opened by d's access descriptor only; the addresses themselves open
 * only to a host descriptor on a host frame: the host faults on device frames. Remapping
 * a range that queued work will touch aborts the process with a line naming the work. Each stream is a worker thread running
 * its operations in order; the legacy NULL stream synchronises with the blocking
 * streams as CUDA's does.
 *
 * Environment, read once at cuInit:
 *   FAKECUDA_DEVICE_MEM      device capacity per device, bytes (K/M/G/T suffix), default 1G
 *   FAKECUDA_HOST_MEM        capacity for HOST/HOST_NUMA frames, default 4G
 *   FAKECUDA_DEVICE_COUNT    number of devices, default 1 (0 makes cuInit fail NO_DEVICE)
 *   FAKECUDA_COPY_DELAY_US   each copy/memset sleeps this long on its stream before it runs
 *   FAKECUDA_EVENT_DELAY_US  each event record completes this long after its stream reaches
 *                            it (the stream waits too: after a stream sync its events are done)
 *   FAKECUDA_KERNEL_DELAY_US each kernel sleeps this long on its stream before it runs
 *   FAKECUDA_REMAP_DELAY_US  each cuMemMap sleeps this long first (a slow remap: the range
 *                            stays unmapped meanwhile)
 * A malformed value makes cuInit print one line and return CUDA_ERROR_INVALID_VALUE.
 *
 * fork(): the child has none of the parent's stream worker threads, so a child may only
 * use streams it creates itself (fork while the parent's streams are idle). Tests that
 * expect a fault fork, touch or launch in the child, and check it died by SIGSEGV;
 * fakecuda_env adds handle_segv=0 to ASAN_OPTIONS so sanitizers let SIGSEGV kill. */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>

#define FAKECUDA_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/* A "kernel": runs once per launch on the launching stream's worker thread.
 * args[i] points at parameter i inside the launch's own copy of the parameter buffer. */
typedef void (*fakecuda_kernel_fn)(void **args, void *user);

/* Registers fn as a kernel with nparams parameters of the given sizes. Offsets follow
 * C layout: each parameter is aligned to min(size, 8) rounded down to a power of two.
 * Returns NULL on a bad argument or out of memory. Kernels live until the process ends.
 * cuFuncGetParamInfo, cuFuncGetName, both cuLaunchKernel forms, and (as CUkernel)
 * cuKernelGetParamInfo / cuKernelGetName work on the result. */
FAKECUDA_API CUfunction fakecuda_register_kernel(const char *name, fakecuda_kernel_fn fn,
                                                 void *user, size_t nparams,
                                                 const size_t *param_sizes);
/* The same with explicit offsets, for layouts the rule above does not give (a 12-byte
 * struct of ints is 4-aligned in C). Offsets must not overlap. */
FAKECUDA_API CUfunction fakecuda_register_kernel_layout(const char *name, fakecuda_kernel_fn fn,
                                                        void *user, size_t nparams,
                                                        const size_t *param_sizes,
                                                        const size_t *param_offsets);

/* API hook: cb runs at the enter (site 0) and exit (site 1) of every driver entry
 * point fakecuda implements that has a CUPTI callback id (launches, copies, memsets,
 * allocation, VMM, streams, events, contexts ...). cbid is the
 * CUPTI_DRIVER_TRACE_CBID_* value, name the exported name ("cuMemcpyHtoDAsync_v2"),
 * params the CUPTI parameter struct (cuLaunchKernel_params ..., from cupti.h's
 * generated_cuda_meta.h; NULL for functions without arguments) and result the call's
 * CUresult (CUDA_SUCCESS at enter). Driver calls made from inside cb are not reported.
 * NULL removes the hook. The fake libcupti uses a separate slot, so both can be set. */
typedef void (*fakecuda_api_callback)(int cbid, int site, const char *name, const void *params,
                                      CUresult *result, void *user);
FAKECUDA_API void fakecuda_set_api_callback(fakecuda_api_callback cb, void *user);
/* The slot the fake libcupti uses; tests use fakecuda_set_api_callback. */
FAKECUDA_API void fakecuda_set_cupti_callback(fakecuda_api_callback cb, void *user);

/* Puts a stream in (or out of) graph-capture mode as far as the API is concerned: the fake
 * builds no graph and still runs the work, but cuStreamIsCapturing says so, an event
 * recorded there cannot be queried or waited for from the host (CUDA_ERROR_CAPTURED_EVENT),
 * and the stream may not wait for an event recorded outside the capture
 * (CUDA_ERROR_STREAM_CAPTURE_ISOLATION) nor be synchronized. */
FAKECUDA_API void fakecuda_stream_set_capturing(CUstream stream, bool on);
/* Whether a call broke those rules since the stream began capturing (CUDA would have
 * invalidated the capture, and the program's graph with it). */
FAKECUDA_API bool fakecuda_stream_capture_broken(CUstream stream);

/* Where work on stream s reaches device address p: reserved addresses through the view of
 * s's device (the host faults on device frames), anything else as it is; NULL when s is
 * not a stream. For stand-ins of libraries whose kernels run on a stream (fake NCCL). */
FAKECUDA_API void *fakecuda_stream_view(CUstream s, CUdeviceptr p);

/* While on, cuMemcpyAsync (and _ptsz) fails with CUDA_ERROR_UNKNOWN: a driver that refuses
 * the copy a failure path depends on. */
FAKECUDA_API void fakecuda_fail_async_copies(bool on);

/* What cuGetProcAddress answers for the request from the fake's own table, with no door
 * or hook in between: the answer a program under psshim must get (psshim's door in its
 * place where psshim replaces that entry point). */
FAKECUDA_API CUresult fakecuda_proc_address(const char *symbol, int cuda_version, cuuint64_t flags, void **pfn);

/* Changes the FAKECUDA_*_DELAY_US values at run time (for tests that need several). */
FAKECUDA_API void fakecuda_set_delays(unsigned copy_us, unsigned event_us, unsigned kernel_us);

/* Bytes charged now against device dev's capacity (dev >= 0) or the host-frame
 * capacity (dev == -1): what cuMemGetInfo subtracts. */
FAKECUDA_API size_t fakecuda_used_bytes(int dev);
/* The most fakecuda_used_bytes(dev) has been since cuInit: a budget check that does not
 * trust the allocator's own counters. */
FAKECUDA_API size_t fakecuda_peak_bytes(int dev);

#ifdef __cplusplus
}
#endif

#endif
