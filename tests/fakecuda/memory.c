/* Plain device allocations (cuMemAlloc, the stream-ordered cuMemAllocAsync family),
 * the capacity accounting every allocation goes through, cuMemGetInfo and
 * cuPointerGetAttribute. Allocations are host memory from posix_memalign, so ASan
 * sees overruns by "kernels"; they exist so that psshim's pass-through of pointers it
 * does not own can be tested. */
#include <stdlib.h>

#include "fakecuda_internal.h"

pthread_mutex_t fc_mem_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- capacity ---- */
static pthread_mutex_t acct_mu = PTHREAD_MUTEX_INITIALIZER;
static size_t dev_used[FC_MAX_DEVICES], host_used, dev_peak[FC_MAX_DEVICES], host_peak;

bool fc_charge(int dev, size_t bytes) {
  size_t *used = dev == FC_HOST ? &host_used : &dev_used[dev];
  size_t cap = dev == FC_HOST ? fc_cfg.host_mem : fc_cfg.device_mem;
  pthread_mutex_lock(&acct_mu);
  bool ok = bytes <= cap - *used;
  if (ok) *used += bytes;
  size_t *peak = dev == FC_HOST ? &host_peak : &dev_peak[dev];
  if (*used > *peak) *peak = *used;
  pthread_mutex_unlock(&acct_mu);
  return ok;
}

void fc_uncharge(int dev, size_t bytes) {
  pthread_mutex_lock(&acct_mu);
  if (dev == FC_HOST)
    host_used -= bytes;
  else
    dev_used[dev] -= bytes;
  pthread_mutex_unlock(&acct_mu);
}

static size_t read_acct(int dev, const size_t *per_dev, const size_t *host) {
  if (dev != FC_HOST && (dev < 0 || dev >= FC_MAX_DEVICES)) return 0;
  pthread_mutex_lock(&acct_mu);
  size_t v = dev == FC_HOST ? *host : per_dev[dev];
  pthread_mutex_unlock(&acct_mu);
  return v;
}
FC_EXPORT size_t fakecuda_used_bytes(int dev) { return read_acct(dev, dev_used, &host_used); }
FC_EXPORT size_t fakecuda_peak_bytes(int dev) { return read_acct(dev, dev_peak, &host_peak); }

/* ---- allocations (fc_mem_mu) ---- */
struct fc_alloc {
  CUdeviceptr base;
  size_t size;
  int dev;
  bool freeing; /* a free is queued or running: a second free is an error */
  struct fc_alloc *next;
};
static struct fc_alloc *allocs;

static CUresult alloc_on(int dev, CUdeviceptr *dptr, size_t size) {
  void *p;
  if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (!fc_charge(dev, size)) return CUDA_ERROR_OUT_OF_MEMORY;
  struct fc_alloc *a = malloc(sizeof *a);
  if (!a || posix_memalign(&p, 256, size) != 0) { /* cudaMalloc guarantees 256-byte alignment */
    free(a);
    fc_uncharge(dev, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  a->base = (CUdeviceptr)(uintptr_t)p;
  a->size = size;
  a->dev = dev;
  a->freeing = false;
  pthread_mutex_lock(&fc_mem_mu);
  a->next = allocs;
  allocs = a;
  pthread_mutex_unlock(&fc_mem_mu);
  *dptr = a->base;
  return CUDA_SUCCESS;
}

/* Marks the allocation starting at ptr as being freed; false if there is none. */
static bool begin_free(CUdeviceptr ptr, int *dev) {
  bool ok = false;
  pthread_mutex_lock(&fc_mem_mu);
  for (struct fc_alloc *a = allocs; a; a = a->next) {
    if (a->base == ptr && !a->freeing) {
      a->freeing = true;
      *dev = a->dev;
      ok = true;
      break;
    }
  }
  pthread_mutex_unlock(&fc_mem_mu);
  return ok;
}

void fc_alloc_release(CUdeviceptr ptr) {
  struct fc_alloc *a = NULL;
  pthread_mutex_lock(&fc_mem_mu);
  for (struct fc_alloc **pp = &allocs; *pp; pp = &(*pp)->next) {
    if ((*pp)->base == ptr) {
      a = *pp;
      *pp = a->next;
      break;
    }
  }
  pthread_mutex_unlock(&fc_mem_mu);
  if (!a) return;
  free((void *)(uintptr_t)a->base);
  fc_uncharge(a->dev, a->size);
  free(a);
}

bool fc_alloc_lookup(CUdeviceptr p, struct fc_ptr_info *info) {
  bool found = false;
  pthread_mutex_lock(&fc_mem_mu);
  for (struct fc_alloc *a = allocs; a && !found; a = a->next) {
    if (p >= a->base && p - a->base < a->size) {
      *info = (struct fc_ptr_info){a->base, a->size, a->dev, true};
      found = true;
    }
  }
  pthread_mutex_unlock(&fc_mem_mu);
  return found;
}

bool fc_is_device_range(CUdeviceptr p, size_t n) {
  struct fc_ptr_info info;
  if (fc_alloc_lookup(p, &info)) return n <= info.size - (p - info.base);
  return fc_vmm_reserved(p, n);
}

static CUresult mem_alloc(CUdeviceptr *dptr, size_t size) {
  struct CUctx_st *c;
  CUresult r = fc_current_ctx(&c);
  return r != CUDA_SUCCESS ? r : alloc_on(c->dev, dptr, size);
}
FC_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
  FC_TRACED(cuMemAlloc_v2, mem_alloc(dptr, bytesize), dptr, bytesize);
}

/* cuMemFree waits for the device's queued work first, as CUDA's does, so a kernel
 * still reading the buffer never sees it freed. */
static CUresult mem_free(CUdeviceptr ptr) {
  int dev;
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!begin_free(ptr, &dev)) return CUDA_ERROR_INVALID_VALUE;
  fc_ctx_sync(&fc_ctx[dev]);
  fc_alloc_release(ptr);
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { FC_TRACED(cuMemFree_v2, mem_free(dptr), dptr); }

/* Page-locked host memory: plain host memory here (every pointer is usable by the "device"),
 * known so that cuMemFreeHost refuses anything else. */
static struct fc_handles host_allocs = FC_HANDLES_INIT;

static CUresult alloc_host(void **pp, size_t size) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!pp || size == 0) return CUDA_ERROR_INVALID_VALUE;
  void *p = malloc(size);
  if (!p || !fc_handles_add(&host_allocs, p)) {
    free(p);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *pp = p;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) {
  FC_TRACED(cuMemAllocHost_v2, alloc_host(pp, bytesize), pp, bytesize);
}

static CUresult free_host(void *p) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!fc_handles_remove(&host_allocs, p)) return CUDA_ERROR_INVALID_VALUE;
  free(p);
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuMemFreeHost(void *p) { FC_TRACED(cuMemFreeHost, free_host(p), p); }

/* Stream-ordered allocation: the memory exists from the call on (a valid way to be
 * ready "in stream order"); the free happens when the stream reaches it. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream h, bool per_thread) {
  struct CUstream_st *s;
  CUresult r = fc_stream_resolve(h, per_thread, &s);
  if (r != CUDA_SUCCESS) return r;
  int dev = s->ctx->dev;
  if (pool) {
    int i = 0;
    while (i < fc_cfg.device_count && pool != &fc_pool[i]) i++;
    if (i == fc_cfg.device_count) return CUDA_ERROR_INVALID_VALUE;
    dev = i;
  }
  return alloc_on(dev, dptr, size);
}
FC_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
  FC_TRACED(cuMemAllocAsync, alloc_async(dptr, bytesize, NULL, hStream, false), dptr, bytesize, hStream);
}
FC_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
  FC_TRACED(cuMemAllocAsync_ptsz, alloc_async(dptr, bytesize, NULL, hStream, true), dptr, bytesize, hStream);
}

static CUresult from_pool(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream h, bool per_thread) {
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  return alloc_async(dptr, size, pool, h, per_thread);
}
FC_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
  FC_TRACED(cuMemAllocFromPoolAsync, from_pool(dptr, bytesize, pool, hStream, false), dptr, bytesize, pool,
            hStream);
}
FC_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                CUstream hStream) {
  FC_TRACED(cuMemAllocFromPoolAsync_ptsz, from_pool(dptr, bytesize, pool, hStream, true), dptr, bytesize, pool,
            hStream);
}

static CUresult free_async(CUdeviceptr ptr, CUstream h, bool per_thread) {
  struct CUstream_st *s;
  int dev;
  CUresult r = fc_stream_resolve(h, per_thread, &s);
  if (r != CUDA_SUCCESS) return r;
  if (!begin_free(ptr, &dev)) return CUDA_ERROR_INVALID_VALUE;
  struct fc_op *op = fc_op_new(FC_OP_FREE, 0);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  op->u.free.ptr = ptr;
  return fc_submit(s, op, false);
}
FC_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  FC_TRACED(cuMemFreeAsync, free_async(dptr, hStream, false), dptr, hStream);
}
FC_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  FC_TRACED(cuMemFreeAsync_ptsz, free_async(dptr, hStream, true), dptr, hStream);
}

static CUresult default_pool(CUmemoryPool *out, CUdevice dev) {
  CUresult r = fc_check_device(dev);
  if (r != CUDA_SUCCESS) return r;
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  *out = &fc_pool[dev];
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
  FC_TRACED(cuDeviceGetDefaultMemPool, default_pool(pool_out, dev), pool_out, dev);
}

/* fakecuda has only the default pools, so a device's current pool is its default one. */
FC_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
  FC_TRACED(cuDeviceGetMemPool, default_pool(pool, dev), pool, dev);
}

/* free = capacity minus the device frames and allocations alive now. */
static CUresult mem_get_info(size_t *free_b, size_t *total) {
  struct CUctx_st *c;
  CUresult r = fc_current_ctx(&c);
  if (r != CUDA_SUCCESS) return r;
  if (!free_b || !total) return CUDA_ERROR_INVALID_VALUE;
  *total = fc_cfg.device_mem;
  *free_b = fc_cfg.device_mem - fakecuda_used_bytes(c->dev);
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
  FC_TRACED(cuMemGetInfo_v2, mem_get_info(free, total), free, total);
}

/* Answers for pointers fakecuda made: cuMemAlloc allocations and mapped VMM ranges.
 * Anything else (a malloc'd host pointer, an unmapped chunk) is CUDA_ERROR_INVALID_VALUE. */
static CUresult pointer_attribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr) {
  struct fc_ptr_info info;
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  if (!fc_alloc_lookup(ptr, &info) && !(fc_vmm_lookup(ptr, &info) && info.mapped)) return CUDA_ERROR_INVALID_VALUE;
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *(CUcontext *)data = info.dev == FC_HOST ? NULL : &fc_ctx[info.dev];
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *(int *)data = info.dev == FC_HOST ? CU_DEVICE_CPU : info.dev;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *(unsigned int *)data = info.dev == FC_HOST ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *(CUdeviceptr *)data = ptr;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *(CUdeviceptr *)data = info.base;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *(size_t *)data = info.size;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}
FC_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  FC_TRACED(cuPointerGetAttribute, pointer_attribute(data, attribute, ptr), data, attribute, ptr);
}
