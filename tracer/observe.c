/* Launch observation through CUPTI's callback API: every kernel launch (cuLaunchKernel,
 * cuLaunchKernelEx, cooperative launches, their _ptsz forms) has its parameter buffer
 * scanned for values inside psshim's chunk space; copies and memsets report the ranges
 * they touch. Consumers: the trace file and the one observer (tracer/observe.h).
 *
 * CUPTI allows one subscriber per process (torch.profiler, Nsight and psshim compete):
 * when it is taken or missing, psshim says so once and runs unobserved; a subscriber that
 * comes after psshim's rides on it (cupti_guest.c). */
#include "core/core.h"
#include "tracer/cupti_guest.h"
#include "tracer/observe.h"
#include "tracer/tracer.h"

#include <cupti.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
  CUptiResult (*subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
  CUptiResult (*enable_callback)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
  CUptiResult (*enable_domain)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain);
  CUptiResult (*unsubscribe)(CUpti_SubscriberHandle);
  CUptiResult (*result_string)(CUptiResult, const char **);
} cupti;

static CUpti_SubscriberHandle subscriber;
static _Atomic(void (*)(const struct ps_moment *, bool, void *)) consumer;
static void *consumer_user;
/* Set before the subscription that makes the first callback, never changed after. */
static bool (*claims)(uint64_t);

static bool claimed(uint64_t v) { return claims && claims(v); }
static _Atomic uint64_t launch_seq;

/* ---- parameter layouts, cached per function handle ---- */

struct param_layout {
  void *func;
  uint32_t n;
  uint32_t *offset, *size;
  struct param_layout *next;
};

/* Read on every launch without a lock: a layout is complete before it is published at
 * its bucket's head, and never changes or goes away. Two threads may publish the same
 * function twice; the lookup takes either. */
#define LAYOUT_BUCKETS 4096
static _Atomic(struct param_layout *) layouts[LAYOUT_BUCKETS];

/* cudart launches library kernels by CUkernel handle cast to CUfunction, so a handle
 * cuFuncGetParamInfo refuses is asked again as a CUkernel. */
static CUresult param_info(void *func, size_t i, size_t *off, size_t *size)
{
  CUresult r = ps_driver.cuFuncGetParamInfo((CUfunction)func, i, off, size);
  if (r != CUDA_SUCCESS && ps_driver.cuKernelGetParamInfo)
    r = ps_driver.cuKernelGetParamInfo((CUkernel)func, i, off, size);
  return r;
}

static struct param_layout *layout_of(void *func)
{
  size_t b = ((uintptr_t)func >> 4) % LAYOUT_BUCKETS;
  struct param_layout *l = atomic_load_explicit(&layouts[b], memory_order_acquire);
  while (l && l->func != func)
    l = l->next;
  if (l)
    return l;
  size_t n = 0, off, size;
  while (n < 4096 && param_info(func, n, &off, &size) == CUDA_SUCCESS)
    n++;
  l = calloc(1, sizeof *l);
  uint32_t *arrays = calloc(2 * (n ? n : 1), sizeof *arrays);
  if (!l || !arrays) {
    free(l);
    free(arrays);
    return NULL;
  }
  l->func = func;
  l->n = (uint32_t)n;
  l->offset = arrays;
  l->size = arrays + n;
  for (size_t i = 0; i < n; i++)
    if (param_info(func, i, &off, &size) == CUDA_SUCCESS) {
      l->offset[i] = (uint32_t)off;
      l->size[i] = (uint32_t)size;
    }
  l->next = atomic_load_explicit(&layouts[b], memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(&layouts[b], &l->next, l, memory_order_release, memory_order_relaxed))
    ;
  return l;
}

/* ---- scanning ---- */

struct found {
  uint64_t ptr[PST_LAUNCH_MAX_PTRS];
  uint32_t n;
  bool truncated;
};

static void add_ptr(struct found *f, uint64_t v)
{
  if (f->n == PST_LAUNCH_MAX_PTRS) {
    f->truncated = true;
    return;
  }
  f->ptr[f->n++] = v;
}

/* Every 8-byte value at a 4-byte step: pointers inside structs passed by value, packed
 * ones included, are found wherever the compiler put them. */
static void scan_bytes(struct found *f, const unsigned char *p, size_t len)
{
  for (size_t at = 0; at + 8 <= len; at += 4) {
    uint64_t v;
    memcpy(&v, p + at, sizeof v);
    if (claimed(v))
      add_ptr(f, v);
  }
}

static void scan_launch(struct found *f, void *func, void **params, void **extra)
{
  if (params) {
    struct param_layout *l = layout_of(func);
    for (uint32_t i = 0; l && i < l->n; i++)
      if (params[i])
        scan_bytes(f, params[i], l->size[i]);
  }
  for (size_t i = 0; extra && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] != CU_LAUNCH_PARAM_BUFFER_POINTER)
      continue;
    const void *buf = extra[i + 1];
    size_t len = 0;
    for (size_t j = 0; extra[j] != CU_LAUNCH_PARAM_END; j += 2)
      if (extra[j] == CU_LAUNCH_PARAM_BUFFER_SIZE)
        len = *(size_t *)extra[j + 1];
    if (buf)
      scan_bytes(f, buf, len);
  }
}

/* ---- transfers: copies and memsets. A copy touches whole allocations, and an allocation
 * lies in one span, so the device pointer each side starts at is all the pager needs. ---- */

enum transfer_layout {
  L_LINEAR, /* (dst, src or value, count[, stream]): the 1D copies and memsets */
  L_SET2D,  /* (dst, pitch, value, width, height[, stream]) */
  L_COPY2D, /* (const CUDA_MEMCPY2D *[, stream]) */
  L_COPY3D, /* (const CUDA_MEMCPY3D *[, stream]) */
  L_PEER,   /* (dst, dst context, src, src context, count[, stream]) */
  L_BATCH,  /* (dsts, srcs, sizes, count, ...) */
  L_UNSEEN, /* arrays, 3D peer and 3D batch copies: not parsed, so paging stops */
};
enum { T_ANY, T_H2D, T_D2H, T_D2D, T_SET8, T_SET16, T_SET32 };
struct transfer_kind {
  CUpti_CallbackId cbid;
  uint8_t layout, kind;
  int16_t stream_at; /* offset of the stream in the parameter struct, -1: none */
};

struct linear_params {
  uint64_t dst, src;
  size_t count;
  CUstream stream;
};
_Static_assert(offsetof(cuMemsetD32Async_params, N) == offsetof(struct linear_params, count), "memset layout");
_Static_assert(offsetof(cuMemsetD16Async_params, N) == offsetof(struct linear_params, count), "memset layout");
_Static_assert(offsetof(cuMemcpyHtoDAsync_v2_params, hStream) == offsetof(struct linear_params, stream), "copy layout");

#define NO_STREAM (-1)
#define LIN_STREAM ((int16_t)offsetof(struct linear_params, stream))
#define SET2D_STREAM ((int16_t)offsetof(cuMemsetD2D8Async_params, hStream))
#define COPY2D_STREAM ((int16_t)offsetof(cuMemcpy2DAsync_v2_params, hStream))
#define COPY3D_STREAM ((int16_t)offsetof(cuMemcpy3DAsync_v2_params, hStream))
#define PEER_STREAM ((int16_t)offsetof(cuMemcpyPeerAsync_params, hStream))
#define CB(name) CUPTI_DRIVER_TRACE_CBID_##name

static const struct transfer_kind transfers[] = {
    {CB(cuMemcpy), L_LINEAR, T_ANY, NO_STREAM},
    {CB(cuMemcpy_ptds), L_LINEAR, T_ANY, NO_STREAM},
    {CB(cuMemcpyAsync), L_LINEAR, T_ANY, LIN_STREAM},
    {CB(cuMemcpyAsync_ptsz), L_LINEAR, T_ANY, LIN_STREAM},
    {CB(cuMemcpyHtoD_v2), L_LINEAR, T_H2D, NO_STREAM},
    {CB(cuMemcpyHtoD_v2_ptds), L_LINEAR, T_H2D, NO_STREAM},
    {CB(cuMemcpyHtoDAsync_v2), L_LINEAR, T_H2D, LIN_STREAM},
    {CB(cuMemcpyHtoDAsync_v2_ptsz), L_LINEAR, T_H2D, LIN_STREAM},
    {CB(cuMemcpyDtoH_v2), L_LINEAR, T_D2H, NO_STREAM},
    {CB(cuMemcpyDtoH_v2_ptds), L_LINEAR, T_D2H, NO_STREAM},
    {CB(cuMemcpyDtoHAsync_v2), L_LINEAR, T_D2H, LIN_STREAM},
    {CB(cuMemcpyDtoHAsync_v2_ptsz), L_LINEAR, T_D2H, LIN_STREAM},
    {CB(cuMemcpyDtoD_v2), L_LINEAR, T_D2D, NO_STREAM},
    {CB(cuMemcpyDtoD_v2_ptds), L_LINEAR, T_D2D, NO_STREAM},
    {CB(cuMemcpyDtoDAsync_v2), L_LINEAR, T_D2D, LIN_STREAM},
    {CB(cuMemcpyDtoDAsync_v2_ptsz), L_LINEAR, T_D2D, LIN_STREAM},
    {CB(cuMemsetD8_v2), L_LINEAR, T_SET8, NO_STREAM},
    {CB(cuMemsetD8_v2_ptds), L_LINEAR, T_SET8, NO_STREAM},
    {CB(cuMemsetD8Async), L_LINEAR, T_SET8, LIN_STREAM},
    {CB(cuMemsetD8Async_ptsz), L_LINEAR, T_SET8, LIN_STREAM},
    {CB(cuMemsetD16_v2), L_LINEAR, T_SET16, NO_STREAM},
    {CB(cuMemsetD16_v2_ptds), L_LINEAR, T_SET16, NO_STREAM},
    {CB(cuMemsetD16Async), L_LINEAR, T_SET16, LIN_STREAM},
    {CB(cuMemsetD16Async_ptsz), L_LINEAR, T_SET16, LIN_STREAM},
    {CB(cuMemsetD32_v2), L_LINEAR, T_SET32, NO_STREAM},
    {CB(cuMemsetD32_v2_ptds), L_LINEAR, T_SET32, NO_STREAM},
    {CB(cuMemsetD32Async), L_LINEAR, T_SET32, LIN_STREAM},
    {CB(cuMemsetD32Async_ptsz), L_LINEAR, T_SET32, LIN_STREAM},
    {CB(cuMemsetD2D8_v2), L_SET2D, T_SET8, NO_STREAM},
    {CB(cuMemsetD2D8_v2_ptds), L_SET2D, T_SET8, NO_STREAM},
    {CB(cuMemsetD2D8Async), L_SET2D, T_SET8, SET2D_STREAM},
    {CB(cuMemsetD2D8Async_ptsz), L_SET2D, T_SET8, SET2D_STREAM},
    {CB(cuMemsetD2D16_v2), L_SET2D, T_SET16, NO_STREAM},
    {CB(cuMemsetD2D16_v2_ptds), L_SET2D, T_SET16, NO_STREAM},
    {CB(cuMemsetD2D16Async), L_SET2D, T_SET16, SET2D_STREAM},
    {CB(cuMemsetD2D16Async_ptsz), L_SET2D, T_SET16, SET2D_STREAM},
    {CB(cuMemsetD2D32_v2), L_SET2D, T_SET32, NO_STREAM},
    {CB(cuMemsetD2D32_v2_ptds), L_SET2D, T_SET32, NO_STREAM},
    {CB(cuMemsetD2D32Async), L_SET2D, T_SET32, SET2D_STREAM},
    {CB(cuMemsetD2D32Async_ptsz), L_SET2D, T_SET32, SET2D_STREAM},
    {CB(cuMemcpy2D_v2), L_COPY2D, T_ANY, NO_STREAM},
    {CB(cuMemcpy2D_v2_ptds), L_COPY2D, T_ANY, NO_STREAM},
    {CB(cuMemcpy2DUnaligned_v2), L_COPY2D, T_ANY, NO_STREAM},
    {CB(cuMemcpy2DUnaligned_v2_ptds), L_COPY2D, T_ANY, NO_STREAM},
    {CB(cuMemcpy2DAsync_v2), L_COPY2D, T_ANY, COPY2D_STREAM},
    {CB(cuMemcpy2DAsync_v2_ptsz), L_COPY2D, T_ANY, COPY2D_STREAM},
    {CB(cuMemcpy3D_v2), L_COPY3D, T_ANY, NO_STREAM},
    {CB(cuMemcpy3D_v2_ptds), L_COPY3D, T_ANY, NO_STREAM},
    {CB(cuMemcpy3DAsync_v2), L_COPY3D, T_ANY, COPY3D_STREAM},
    {CB(cuMemcpy3DAsync_v2_ptsz), L_COPY3D, T_ANY, COPY3D_STREAM},
    {CB(cuMemcpyPeer), L_PEER, T_ANY, NO_STREAM},
    {CB(cuMemcpyPeer_ptds), L_PEER, T_ANY, NO_STREAM},
    {CB(cuMemcpyPeerAsync), L_PEER, T_ANY, PEER_STREAM},
    {CB(cuMemcpyPeerAsync_ptsz), L_PEER, T_ANY, PEER_STREAM},
    {CB(cuMemcpyBatchAsync), L_BATCH, T_ANY, (int16_t)offsetof(cuMemcpyBatchAsync_params, hStream)},
    {CB(cuMemcpyBatchAsync_ptsz), L_BATCH, T_ANY, (int16_t)offsetof(cuMemcpyBatchAsync_ptsz_params, hStream)},
    {CB(cuMemcpyBatchAsync_v2), L_BATCH, T_ANY, (int16_t)offsetof(cuMemcpyBatchAsync_v2_params, hStream)},
    {CB(cuMemcpyBatchAsync_v2_ptsz), L_BATCH, T_ANY, (int16_t)offsetof(cuMemcpyBatchAsync_v2_ptsz_params, hStream)},
    {CB(cuMemcpyAtoD_v2), L_UNSEEN, T_ANY, NO_STREAM},
    {CB(cuMemcpyAtoD_v2_ptds), L_UNSEEN, T_ANY, NO_STREAM},
    {CB(cuMemcpyDtoA_v2), L_UNSEEN, T_ANY, NO_STREAM},
    {CB(cuMemcpyDtoA_v2_ptds), L_UNSEEN, T_ANY, NO_STREAM},
    {CB(cuMemcpy3DPeer), L_UNSEEN, T_ANY, NO_STREAM},
    {CB(cuMemcpy3DPeer_ptds), L_UNSEEN, T_ANY, NO_STREAM},
    {CB(cuMemcpy3DPeerAsync), L_UNSEEN, T_ANY, (int16_t)offsetof(cuMemcpy3DPeerAsync_params, hStream)},
    {CB(cuMemcpy3DPeerAsync_ptsz), L_UNSEEN, T_ANY, (int16_t)offsetof(cuMemcpy3DPeerAsync_ptsz_params, hStream)},
    {CB(cuMemcpy3DBatchAsync), L_UNSEEN, T_ANY, (int16_t)offsetof(cuMemcpy3DBatchAsync_params, hStream)},
    {CB(cuMemcpy3DBatchAsync_ptsz), L_UNSEEN, T_ANY, (int16_t)offsetof(cuMemcpy3DBatchAsync_ptsz_params, hStream)},
    {CB(cuMemcpy3DBatchAsync_v2), L_UNSEEN, T_ANY, (int16_t)offsetof(cuMemcpy3DBatchAsync_v2_params, hStream)},
    {CB(cuMemcpy3DBatchAsync_v2_ptsz), L_UNSEEN, T_ANY,
     (int16_t)offsetof(cuMemcpy3DBatchAsync_v2_ptsz_params, hStream)},
};

/* The stream a call's work goes to: the per-thread default stream for a _ptsz/_ptds entry
 * point given no stream (waits and marks must go there, not to the legacy stream). */
static uint64_t stream_of(const char *function, CUstream s)
{
  size_t n = function ? strlen(function) : 0;
  if (!s && n > 5 && (!strcmp(function + n - 5, "_ptsz") || !strcmp(function + n - 5, "_ptds")))
    s = CU_STREAM_PER_THREAD;
  return (uint64_t)(uintptr_t)s;
}

static const CUpti_CallbackId launches[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,        CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,      CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,         CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
};

/* The driver callbacks psshim handles (launches and transfers): a guest may enable others
 * on the same subscription. Written before the first is enabled, then only read. */
static uint64_t own[(CUPTI_DRIVER_TRACE_CBID_SIZE + 63) / 64];

static void own_add(CUpti_CallbackId cbid) { own[cbid / 64] |= 1ull << (cbid % 64); }

static bool own_callback(CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
  return domain == CUPTI_CB_DOMAIN_DRIVER_API && cbid < CUPTI_DRIVER_TRACE_CBID_SIZE &&
         (own[cbid / 64] >> (cbid % 64) & 1);
}

static const struct transfer_kind *transfer_of(CUpti_CallbackId cbid)
{
  for (size_t i = 0; i < sizeof transfers / sizeof transfers[0]; i++)
    if (transfers[i].cbid == cbid)
      return &transfers[i];
  return NULL;
}

static uint32_t copy_kind(const struct transfer_kind *t, uint64_t dst, uint64_t src)
{
  switch (t->kind) {
  case T_H2D: return PST_COPY_H2D;
  case T_D2H: return PST_COPY_D2H;
  case T_D2D: return PST_COPY_D2D;
  case T_SET8: case T_SET16: case T_SET32: return PST_COPY_MEMSET;
  default: /* unified addresses: judge by which side psshim holds */
    if (claimed(dst) && !claimed(src))
      return PST_COPY_H2D;
    if (claimed(src) && !claimed(dst))
      return PST_COPY_D2H;
    return PST_COPY_D2D;
  }
}

/* The enter callback's findings, kept for the exit callback of the same call. */
static PS_THREAD_LOCAL struct found tls_found;
static PS_THREAD_LOCAL struct ps_moment tls_launch;
static PS_THREAD_LOCAL bool tls_handling; /* inside on_api on this thread */

static void on_launch(CUpti_CallbackId cbid, const CUpti_CallbackData *cb, struct ps_moment *l, struct found *f)
{
  void *func = NULL, **params = NULL, **extra = NULL;
  CUstream stream = NULL;
  switch (cbid) {
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz: {
    const cuLaunchKernel_params *p = cb->functionParams;
    func = p->f, params = p->kernelParams, extra = p->extra, stream = p->hStream;
    break;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: {
    const cuLaunchKernelEx_params *p = cb->functionParams;
    func = p->f, params = p->kernelParams, extra = p->extra, stream = p->config ? p->config->hStream : NULL;
    break;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz: {
    const cuLaunchCooperativeKernel_params *p = cb->functionParams;
    func = p->f, params = p->kernelParams, stream = p->hStream;
    break;
  }
  default: { /* graph launches: the graph's kernels and what they touch are not visible */
    const cuGraphLaunch_params *p = cb->functionParams;
    stream = p->hStream;
    l->opaque = true;
    break;
  }
  }
  if (func)
    scan_launch(f, func, params, extra);
  l->kind = PS_MOMENT_KERNEL;
  l->stream = stream_of(cb->functionName, stream);
  l->name = cb->symbolName;
  l->signature = (uint64_t)(uintptr_t)func * 0x9E3779B97F4A7C15ull;
}

static uint64_t device_side(CUmemorytype type, CUdeviceptr p)
{
  return type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED ? p : 0;
}

_Static_assert(offsetof(cuMemsetD2D32Async_params, Height) == offsetof(cuMemsetD2D8Async_params, Height), "2D memsets");
_Static_assert(offsetof(cuMemsetD2D16_v2_params, Height) == offsetof(cuMemsetD2D8_v2_params, Height), "2D memsets");
_Static_assert(offsetof(cuMemcpyBatchAsync_params, count) == offsetof(cuMemcpyBatchAsync_v2_params, count), "batches");

static void on_transfer(const struct transfer_kind *t, const CUpti_CallbackData *cb, struct ps_moment *l,
                        struct found *f)
{
  const void *params = cb->functionParams;
  uint64_t dst = 0, src = 0, bytes = 0;
  switch (t->layout) {
  case L_LINEAR: {
    const struct linear_params *p = params;
    dst = p->dst, src = p->src;
    bytes = p->count * (t->kind == T_SET32 ? 4 : t->kind == T_SET16 ? 2 : 1);
    break;
  }
  case L_SET2D: {
    const cuMemsetD2D8_v2_params *p = params;
    dst = p->dstDevice, bytes = p->dstPitch * p->Height;
    break;
  }
  case L_COPY2D: {
    const CUDA_MEMCPY2D *c = *(const CUDA_MEMCPY2D *const *)params;
    if (c)
      dst = device_side(c->dstMemoryType, c->dstDevice), src = device_side(c->srcMemoryType, c->srcDevice),
      bytes = c->WidthInBytes * c->Height;
    break;
  }
  case L_COPY3D: {
    const CUDA_MEMCPY3D *c = *(const CUDA_MEMCPY3D *const *)params;
    if (c)
      dst = device_side(c->dstMemoryType, c->dstDevice), src = device_side(c->srcMemoryType, c->srcDevice),
      bytes = c->WidthInBytes * c->Height * c->Depth;
    break;
  }
  case L_PEER: {
    const cuMemcpyPeer_params *p = params;
    dst = p->dstDevice, src = p->srcDevice, bytes = p->ByteCount;
    break;
  }
  case L_BATCH: {
    const cuMemcpyBatchAsync_v2_params *p = params;
    for (size_t i = 0; i < p->count; i++) {
      if (claimed(p->dsts[i]))
        add_ptr(f, p->dsts[i]);
      if (claimed(p->srcs[i]))
        add_ptr(f, p->srcs[i]);
      bytes += p->sizes[i];
    }
    break;
  }
  default: /* L_UNSEEN */
    l->opaque = true;
    break;
  }
  bool set = t->kind == T_SET8 || t->kind == T_SET16 || t->kind == T_SET32;
  l->kind = set ? PS_MOMENT_MEMSET : PS_MOMENT_COPY;
  l->stream = stream_of(cb->functionName,
                        t->stream_at >= 0 ? *(const CUstream *)((const char *)params + t->stream_at) : NULL);
  l->name = cb->functionName;
  l->bytes = bytes;
  l->copy_kind = copy_kind(t, dst, set ? 0 : src);
  l->signature = (uint64_t)t->cbid * 0xC2B2AE3D27D4EB4Full ^ bytes;
  if (claimed(dst))
    add_ptr(f, dst);
  if (!set && claimed(src))
    add_ptr(f, src);
  l->dst = dst;
  l->src = set ? 0 : src;
}

static void trace_moment(const struct ps_moment *l, bool truncated)
{
  struct pst_record r = {0};
  if (l->kind == PS_MOMENT_KERNEL || l->kind == PS_MOMENT_COLLECTIVE) {
    r.type = PST_REC_LAUNCH;
    r.flags = truncated ? PST_RF_TRUNCATED : 0;
    r.launch.stream = l->stream;
    r.launch.seq = l->seq;
    r.launch.function = l->name ? pst_trace_intern(l->name) : 0;
    r.launch.n = l->nptrs;
    r.launch.ptrs = l->ptrs;
  } else {
    r.type = PST_REC_COPY;
    r.copy.kind = l->copy_kind;
    r.copy.bytes = l->bytes;
    r.copy.src = l->src;
    r.copy.dst = l->dst;
    r.copy.stream = l->stream;
  }
  pst_trace_emit(&r);
}

static void CUPTIAPI on_api(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data)
{
  (void)user;
  const CUpti_CallbackData *cb = data;
  pst_guest_dispatch(domain, cbid, data);
  if (!own_callback(domain, cbid))
    return;
  /* CUPTI reports the driver calls made while handling a callback too (psshim's own
   * copies, when the pager moves a chunk from inside a launch's callback): those are
   * psshim's, not the program's, and must not re-enter the handler. */
  if (tls_handling)
    return;
  tls_handling = true;
  bool enter = cb->callbackSite == CUPTI_API_ENTER;
  struct ps_moment *l = &tls_launch;
  struct found *f = &tls_found;
  if (enter) {
    memset(l, 0, sizeof *l);
    f->n = 0;
    f->truncated = false;
    const struct transfer_kind *t = transfer_of(cbid);
    if (t)
      on_transfer(t, cb, l, f);
    else
      on_launch(cbid, cb, l, f);
    f->n = pst_sort_unique(f->ptr, f->n);
    l->ptrs = f->ptr;
    l->nptrs = f->n;
    l->truncated = f->truncated;
  } else if (cb->functionReturnValue && *(const CUresult *)cb->functionReturnValue != CUDA_SUCCESS) {
    l->failed = true;
  }
  pst_observe_moment(l, enter);
  tls_handling = false;
}

void pst_observe_moment(struct ps_moment *l, bool enter)
{
  if (ps_in_own_calls()) /* psshim's own NCCL calls (a gather's) are not the program's */
    return;
  if (enter) {
    l->seq = atomic_fetch_add_explicit(&launch_seq, 1, memory_order_relaxed);
    if (pst_trace_enabled())
      trace_moment(l, l->truncated);
  }
  void (*fn)(const struct ps_moment *, bool, void *) = atomic_load_explicit(&consumer, memory_order_acquire);
  if (fn)
    fn(l, enter, consumer_user);
}

/* ---- finding and loading CUPTI ---- */

static int find_cudart_dir(struct dl_phdr_info *info, size_t size, void *out)
{
  (void)size;
  const char *slash = strrchr(info->dlpi_name, '/');
  if (slash && strstr(slash, "libcudart.so")) {
    snprintf(out, 4096, "%.*s", (int)(slash - info->dlpi_name), info->dlpi_name);
    return 1;
  }
  return 0;
}

static void *open_cupti(void)
{
  if (ps_options.cupti_path)
    return dlopen(ps_options.cupti_path, RTLD_NOW | RTLD_LOCAL);
  void *lib = dlopen("libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
  if (lib)
    return lib;
  /* Next to the framework's CUDA libraries (pip's nvidia/cu13/lib), then the toolkit. */
  char dir[4096] = "", path[4200];
  if (dl_iterate_phdr(find_cudart_dir, dir)) {
    const char *rel[] = {"libcupti.so.13", "../../cuda_cupti/lib/libcupti.so.13", "../extras/CUPTI/lib64/libcupti.so.13"};
    for (size_t i = 0; !lib && i < sizeof rel / sizeof rel[0]; i++) {
      snprintf(path, sizeof path, "%s/%s", dir, rel[i]);
      lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
  }
  const char *toolkit[] = {"/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13", "/usr/local/cuda/lib64/libcupti.so.13"};
  for (size_t i = 0; !lib && i < sizeof toolkit / sizeof toolkit[0]; i++)
    lib = dlopen(toolkit[i], RTLD_NOW | RTLD_LOCAL);
  return lib;
}

static void trace_note(const char *text)
{
  if (!pst_trace_enabled())
    return;
  struct pst_record r = {.type = PST_REC_NOTE, .note = {.len = 0, .text = text}};
  pst_trace_emit(&r);
}

static const char *cupti_error(CUptiResult r)
{
  const char *s = NULL;
  if (cupti.result_string)
    cupti.result_string(r, &s);
  return s ? s : "unknown CUPTI error";
}

static CUptiResult enable_own(void)
{
  CUptiResult r = CUPTI_SUCCESS;
  for (CUpti_CallbackId cbid = 1; cbid < CUPTI_DRIVER_TRACE_CBID_SIZE && r == CUPTI_SUCCESS; cbid++)
    if (own_callback(CUPTI_CB_DOMAIN_DRIVER_API, cbid))
      r = cupti.enable_callback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, cbid);
  return r;
}

/* Launches go unobserved, said once: where paging depends on them (o->required) at the
 * default log level with what that costs, else (a trace alone) as a warning. */
static void unobserved(const struct pst_observer *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void unobserved(const struct pst_observer *o, const char *fmt, ...)
{
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  if (o->required)
    ps_error("%s: kernel launches are not observed, so under PSSHIM_POLICY=%s nothing moves: chunks beyond the GPU "
             "budget are read in place", why, ps_policy_name(ps_options.policy));
  else
    ps_log(PS_LOG_WARN, "%s: kernel launches are not observed", why);
}

bool pst_observe_start(const struct pst_observer *o)
{
  if (subscriber)
    return true;
  void *lib = open_cupti();
  if (!lib) {
    if (ps_options.cupti_path)
      unobserved(o, "PSSHIM_CUPTI=%s does not load (%s)", ps_options.cupti_path, dlerror());
    else
      unobserved(o, "CUPTI (libcupti.so.13) not found beside the CUDA libraries nor the toolkit (set PSSHIM_CUPTI)");
    trace_note("CUPTI unavailable: launches not observed");
    return false;
  }
  cupti.subscribe = (__typeof__(cupti.subscribe))ps_real_dlsym(lib, "cuptiSubscribe");
  cupti.enable_callback = (__typeof__(cupti.enable_callback))ps_real_dlsym(lib, "cuptiEnableCallback");
  cupti.enable_domain = (__typeof__(cupti.enable_domain))ps_real_dlsym(lib, "cuptiEnableDomain");
  cupti.unsubscribe = (__typeof__(cupti.unsubscribe))ps_real_dlsym(lib, "cuptiUnsubscribe");
  cupti.result_string = (__typeof__(cupti.result_string))ps_real_dlsym(lib, "cuptiGetResultString");
  if (!cupti.subscribe || !cupti.enable_callback || !cupti.unsubscribe) {
    unobserved(o, "CUPTI lacks the callback API");
    return false;
  }
  claims = o->claims;
  consumer_user = o->user;
  atomic_store_explicit(&consumer, o->moment, memory_order_release);
  CUptiResult r = cupti.subscribe(&subscriber, (CUpti_CallbackFunc)on_api, NULL);
  if (r != CUPTI_SUCCESS) {
    subscriber = NULL;
    unobserved(o, "CUPTI is taken (%s; a profiler holds it?)", cupti_error(r));
    trace_note("CUPTI taken by another subscriber: launches not observed");
    return false;
  }
  for (size_t i = 0; i < sizeof launches / sizeof launches[0]; i++)
    own_add(launches[i]);
  for (size_t i = 0; i < sizeof transfers / sizeof transfers[0]; i++)
    own_add(transfers[i].cbid);
  /* A launch kind psshim cannot see would make paging unsafe: all or nothing. */
  r = enable_own();
  if (r != CUPTI_SUCCESS) {
    unobserved(o, "CUPTI refused a launch callback (%s)", cupti_error(r));
    trace_note("CUPTI refused a callback: launches not observed");
    pst_observe_stop();
    return false;
  }
  return true;
}

void pst_observe_stop(void)
{
  if (!subscriber)
    return;
  atomic_store_explicit(&consumer, NULL, memory_order_release);
  if (pst_guest_active())
    return; /* the guest's callbacks still come through psshim's subscription */
  CUptiResult r = cupti.unsubscribe(subscriber);
  if (r != CUPTI_SUCCESS)
    ps_log(PS_LOG_WARN, "cuptiUnsubscribe failed: %s", cupti_error(r));
  subscriber = NULL;
}

/* ---- the subscription, as a guest subscriber uses it (cupti_guest.c) ---- */

bool pst_observe_subscribed(void) { return subscriber != NULL; }

CUptiResult pst_observe_enable(uint32_t enable, CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
  if (!enable && own_callback(domain, cbid))
    return CUPTI_SUCCESS; /* psshim's own stays on; the guest no longer gets it */
  return cupti.enable_callback(enable, subscriber, domain, cbid);
}

CUptiResult pst_observe_enable_domain(uint32_t enable, CUpti_CallbackDomain domain)
{
  if (!cupti.enable_domain)
    return CUPTI_ERROR_NOT_SUPPORTED;
  CUptiResult r = cupti.enable_domain(enable, subscriber, domain);
  if (r == CUPTI_SUCCESS && !enable && domain == CUPTI_CB_DOMAIN_DRIVER_API)
    r = enable_own();
  return r;
}
