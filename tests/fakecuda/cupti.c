/* A fake libcupti: the callback API for the driver domain, on the fake driver's API
 * hook. One subscriber per process, as real CUPTI enforces — a second gets
 * CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED. Callbacks come with a
 * CUpti_CallbackData (site, function name, CUPTI parameter struct, return value,
 * current context, correlation id and data, the kernel's name for launches) and only
 * for enabled callback ids. The other domains (runtime, resource, synchronize, ...)
 * are not produced by the fake: enabling them is CUPTI_ERROR_NOT_SUPPORTED. */
#include <cuda.h>
#include <cupti.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cupti_cbids.h"
#include "cupti_results.h"
#include "fakecuda.h"

#define CUPTI_EXPORT __attribute__((visibility("default")))

struct CUpti_Subscriber_st {
  CUpti_CallbackFunc callback;
  void *userdata;
  char name[CUPTI_SUBSCRIBER_NAME_MAX_LEN + 1];
  _Atomic unsigned char enabled[CUPTI_DRIVER_TRACE_CBID_SIZE];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct CUpti_Subscriber_st *current; /* the one subscriber (mu) */
static _Thread_local CUptiResult last_error;
static atomic_uint next_correlation;

/* Correlation of enter and exit on this thread: driver calls do not nest in a hook. */
#define DEPTH_MAX 16
static _Thread_local struct { uint32_t id; uint64_t data; } corr[DEPTH_MAX];
static _Thread_local int corr_depth;

static CUptiResult ret(CUptiResult r) {
  if (r != CUPTI_SUCCESS) last_error = r;
  return r;
}

static const char *kernel_name(int cbid, const void *params) {
  CUfunction f = NULL;
  const char *name = NULL;
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel: f = ((const cuLaunchKernel_params *)params)->f; break;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz: f = ((const cuLaunchKernel_ptsz_params *)params)->f; break;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx: f = ((const cuLaunchKernelEx_params *)params)->f; break;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: f = ((const cuLaunchKernelEx_ptsz_params *)params)->f; break;
    default: return NULL;
  }
  return f && cuFuncGetName(&name, f) == CUDA_SUCCESS ? name : NULL;
}

static _Thread_local bool asking; /* dispatch's own driver calls: not reported */

/* Runs on the fake driver's hook, for the program's calls and for calls made inside a
 * subscriber's callback, as real CUPTI does. */
static void dispatch(int cbid, int site, const char *name, const void *params, CUresult *result, void *unused) {
  (void)unused;
  if (asking) return;
  if (site == CUPTI_API_ENTER) {
    if (corr_depth == DEPTH_MAX) return;
    corr[corr_depth].id = atomic_fetch_add(&next_correlation, 1) + 1;
    corr[corr_depth++].data = 0;
  }
  if (corr_depth == 0) return;
  pthread_mutex_lock(&mu);
  struct CUpti_Subscriber_st *s = current;
  CUpti_CallbackFunc fn = s ? s->callback : NULL;
  void *userdata = s ? s->userdata : NULL;
  bool on = s && cbid > 0 && cbid < CUPTI_DRIVER_TRACE_CBID_SIZE && atomic_load(&s->enabled[cbid]);
  pthread_mutex_unlock(&mu);
  if (on && fn) {
    CUpti_CallbackData data;
    CUcontext ctx = NULL;
    CUdevice dev = -1;
    memset(&data, 0, sizeof data);
    asking = true;
    cuCtxGetCurrent(&ctx);
    if (ctx) cuCtxGetDevice(&dev);
    data.symbolName = kernel_name(cbid, params);
    asking = false;
    data.callbackSite = site == 0 ? CUPTI_API_ENTER : CUPTI_API_EXIT;
    data.functionName = name;
    data.functionParams = params;
    data.functionReturnValue = result;
    data.context = ctx;
    data.contextUid = ctx ? (uint32_t)dev + 1 : 0;
    data.correlationData = &corr[corr_depth - 1].data;
    data.correlationId = corr[corr_depth - 1].id;
    fn(userdata, CUPTI_CB_DOMAIN_DRIVER_API, (CUpti_CallbackId)cbid, &data);
  }
  if (site != CUPTI_API_ENTER) corr_depth--;
}

static CUptiResult subscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback, void *userdata,
                             CUpti_SubscriberParams *params) {
  if (!subscriber) return CUPTI_ERROR_INVALID_PARAMETER;
  struct CUpti_Subscriber_st *s = calloc(1, sizeof *s);
  if (!s) return CUPTI_ERROR_OUT_OF_MEMORY;
  s->callback = callback;
  s->userdata = userdata;
  strncpy(s->name, params && params->subscriberName ? params->subscriberName : "unnamed", CUPTI_SUBSCRIBER_NAME_MAX_LEN);
  pthread_mutex_lock(&mu);
  if (current) {
    if (params && params->oldSubscriberName && params->oldSubscriberSize) {
      strncpy(params->oldSubscriberName, current->name, params->oldSubscriberSize - 1);
      params->oldSubscriberName[params->oldSubscriberSize - 1] = '\0';
    }
    pthread_mutex_unlock(&mu);
    free(s);
    return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  }
  current = s;
  pthread_mutex_unlock(&mu);
  fakecuda_set_cupti_callback(dispatch, NULL);
  *subscriber = s;
  return CUPTI_SUCCESS;
}

CUPTI_EXPORT CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback,
                                        void *userdata) {
  return ret(subscribe(subscriber, callback, userdata, NULL));
}

CUPTI_EXPORT CUptiResult cuptiSubscribe_v2(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback,
                                           void *userdata, CUpti_SubscriberParams *pParams) {
  return ret(subscribe(subscriber, callback, userdata, pParams));
}

/* The hook stays installed (a callback may be running on another thread); with no
 * subscriber it delivers nothing. */
CUPTI_EXPORT CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle subscriber) {
  pthread_mutex_lock(&mu);
  bool ok = subscriber && subscriber == current;
  if (ok) current = NULL;
  pthread_mutex_unlock(&mu);
  if (!ok) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  free(subscriber);
  return CUPTI_SUCCESS;
}

/* Detaches CUPTI from the process: the subscriber is gone (a later subscribe attaches again). */
CUPTI_EXPORT CUptiResult cuptiFinalize(void) {
  pthread_mutex_lock(&mu);
  struct CUpti_Subscriber_st *s = current;
  current = NULL;
  pthread_mutex_unlock(&mu);
  free(s);
  return CUPTI_SUCCESS;
}

static CUptiResult check(CUpti_SubscriberHandle subscriber, CUpti_CallbackDomain domain) {
  pthread_mutex_lock(&mu);
  bool ok = subscriber && subscriber == current;
  pthread_mutex_unlock(&mu);
  if (!ok || domain <= CUPTI_CB_DOMAIN_INVALID || domain >= CUPTI_CB_DOMAIN_SIZE) return CUPTI_ERROR_INVALID_PARAMETER;
  return domain == CUPTI_CB_DOMAIN_DRIVER_API ? CUPTI_SUCCESS : CUPTI_ERROR_NOT_SUPPORTED;
}

CUPTI_EXPORT CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                             CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  CUptiResult r = check(subscriber, domain);
  if (r != CUPTI_SUCCESS) return ret(r);
  if (cbid == 0 || cbid >= CUPTI_DRIVER_TRACE_CBID_SIZE) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  atomic_store(&subscriber->enabled[cbid], enable ? 1 : 0);
  return CUPTI_SUCCESS;
}

CUPTI_EXPORT CUptiResult cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                           CUpti_CallbackDomain domain) {
  CUptiResult r = check(subscriber, domain);
  if (r != CUPTI_SUCCESS) return ret(r);
  for (int i = 1; i < CUPTI_DRIVER_TRACE_CBID_SIZE; i++) atomic_store(&subscriber->enabled[i], enable ? 1 : 0);
  return CUPTI_SUCCESS;
}

CUPTI_EXPORT CUptiResult cuptiGetCallbackState(uint32_t *enable, CUpti_SubscriberHandle subscriber,
                                               CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  CUptiResult r = check(subscriber, domain);
  if (r != CUPTI_SUCCESS) return ret(r);
  if (!enable || cbid == 0 || cbid >= CUPTI_DRIVER_TRACE_CBID_SIZE) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  *enable = atomic_load(&subscriber->enabled[cbid]);
  return CUPTI_SUCCESS;
}

CUPTI_EXPORT CUptiResult cuptiGetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid, const char **name) {
  if (!name) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API) return ret(CUPTI_ERROR_NOT_SUPPORTED);
  for (size_t i = 0; i < sizeof fc_driver_cbids / sizeof fc_driver_cbids[0]; i++) {
    if (fc_driver_cbids[i].code == (int)cbid) {
      *name = fc_driver_cbids[i].name;
      return CUPTI_SUCCESS;
    }
  }
  return ret(CUPTI_ERROR_INVALID_PARAMETER);
}

CUPTI_EXPORT CUptiResult cuptiGetResultString(CUptiResult result, const char **str) {
  if (!str) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  for (size_t i = 0; i < sizeof fc_cupti_results / sizeof fc_cupti_results[0]; i++) {
    if (fc_cupti_results[i].code == (int)result) {
      *str = fc_cupti_results[i].name;
      return CUPTI_SUCCESS;
    }
  }
  return ret(CUPTI_ERROR_INVALID_PARAMETER);
}

CUPTI_EXPORT CUptiResult cuptiGetLastError(void) {
  CUptiResult r = last_error;
  last_error = CUPTI_SUCCESS;
  return r;
}

CUPTI_EXPORT CUptiResult cuptiGetVersion(uint32_t *version) {
  if (!version) return ret(CUPTI_ERROR_INVALID_PARAMETER);
  *version = CUPTI_API_VERSION;
  return CUPTI_SUCCESS;
}
