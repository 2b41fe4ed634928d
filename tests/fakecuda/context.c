/* Primary contexts (one per device; fakecuda has no cuCtxCreate) and the per-thread
 * stack of current contexts that cuCtxSetCurrent / Push / Pop manage. */
#include <stddef.h>

#include <stdio.h>
#include <stdlib.h>

#include "fakecuda_internal.h"

struct CUctx_st fc_ctx[FC_MAX_DEVICES];
struct CUmemPoolHandle_st fc_pool[FC_MAX_DEVICES];
static pthread_mutex_t fc_ctx_mu = PTHREAD_MUTEX_INITIALIZER; /* guards retains */

#define STACK_MAX 64
static _Thread_local struct CUctx_st *ctx_stack[STACK_MAX];
static _Thread_local int ctx_depth;

void fc_contexts_init(int count) {
  for (int i = 0; i < count; i++) {
    fc_ctx[i].dev = i;
    pthread_mutex_init(&fc_ctx[i].mu, NULL);
    fc_pool[i].dev = i;
  }
}

struct CUctx_st *fc_ctx_of(CUcontext c) {
  for (int i = 0; i < fc_cfg.device_count; i++)
    if (c == &fc_ctx[i]) return c;
  return NULL;
}

static bool ctx_active(struct CUctx_st *c) {
  pthread_mutex_lock(&fc_ctx_mu);
  bool active = c->retains > 0;
  pthread_mutex_unlock(&fc_ctx_mu);
  return active;
}

/* A primary context released down to zero retains is destroyed on CUDA; here its
 * handle stays valid (it is the same when retained again) but using it fails. */
CUresult fc_current_ctx(struct CUctx_st **out) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (!ctx_active(ctx_stack[ctx_depth - 1])) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = ctx_stack[ctx_depth - 1];
  return CUDA_SUCCESS;
}

static CUresult primary_retain(CUcontext *pctx, CUdevice dev) {
  CUresult r = fc_check_device(dev);
  if (r != CUDA_SUCCESS) return r;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fc_ctx_mu);
  fc_ctx[dev].retains++;
  pthread_mutex_unlock(&fc_ctx_mu);
  *pctx = &fc_ctx[dev];
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  FC_TRACED(cuDevicePrimaryCtxRetain, primary_retain(pctx, dev), pctx, dev);
}

static CUresult primary_release(CUdevice dev) {
  CUresult r = fc_check_device(dev);
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&fc_ctx_mu);
  if (fc_ctx[dev].retains > 0)
    fc_ctx[dev].retains--;
  else
    r = CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_unlock(&fc_ctx_mu);
  return r;
}
FC_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  FC_TRACED(cuDevicePrimaryCtxRelease_v2, primary_release(dev), dev);
}
FC_EXPORT CUresult fc_cuDevicePrimaryCtxRelease_v1(CUdevice dev) {
  FC_TRACED(cuDevicePrimaryCtxRelease, primary_release(dev), dev);
}

static CUresult ctx_get_current(CUcontext *pctx) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) { FC_TRACED(cuCtxGetCurrent, ctx_get_current(pctx), pctx); }

/* Replaces the top of the stack; NULL pops it (a no-op on an empty stack). */
static CUresult ctx_set_current(CUcontext ctx) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!ctx) {
    if (ctx_depth) ctx_depth--;
    return CUDA_SUCCESS;
  }
  if (!fc_ctx_of(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx_depth == 0) ctx_depth = 1;
  ctx_stack[ctx_depth - 1] = ctx;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) { FC_TRACED(cuCtxSetCurrent, ctx_set_current(ctx), ctx); }

static CUresult ctx_push(CUcontext ctx) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  if (!fc_ctx_of(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx_depth == STACK_MAX) return CUDA_ERROR_OUT_OF_MEMORY;
  ctx_stack[ctx_depth++] = ctx;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) { FC_TRACED(cuCtxPushCurrent_v2, ctx_push(ctx), ctx); }
FC_EXPORT CUresult fc_cuCtxPushCurrent_v1(CUcontext ctx) { FC_TRACED(cuCtxPushCurrent, ctx_push(ctx), ctx); }

static CUresult ctx_pop(CUcontext *pctx) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
  ctx_depth--;
  if (pctx) *pctx = ctx_stack[ctx_depth];
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) { FC_TRACED(cuCtxPopCurrent_v2, ctx_pop(pctx), pctx); }
FC_EXPORT CUresult fc_cuCtxPopCurrent_v1(CUcontext *pctx) { FC_TRACED(cuCtxPopCurrent, ctx_pop(pctx), pctx); }

static CUresult ctx_get_device(CUdevice *device) {
  struct CUctx_st *c;
  CUresult r = fc_current_ctx(&c);
  if (r != CUDA_SUCCESS) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  *device = c->dev;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuCtxGetDevice(CUdevice *device) { FC_TRACED(cuCtxGetDevice, ctx_get_device(device), device); }

static CUresult ctx_synchronize(void) {
  /* psshim's rule, held to here: a launch's callback never waits for the whole device (the
   * node's meetings, which do, run at an allocation instead). CUDA would let it, and wait
   * with the program's launching thread held inside the driver. */
  if (fc_in_cupti_callback()) {
    fprintf(stderr, "fakecuda: cuCtxSynchronize inside a CUPTI callback\n");
    abort();
  }
  struct CUctx_st *c;
  CUresult r = fc_current_ctx(&c);
  return r != CUDA_SUCCESS ? r : fc_ctx_sync(c);
}
FC_EXPORT CUresult cuCtxSynchronize(void) { FC_TRACED0(cuCtxSynchronize, ctx_synchronize()); }
