/* The fake CUPTI's callback API and the fake driver's own API hook. */
#include <cupti.h>
#include <string.h>

#include "test_common.h"

struct record {
  CUpti_CallbackDomain domain;
  CUpti_CallbackId cbid;
  CUpti_ApiCallbackSite site;
  char function[64];
  char symbol[64];
  cuLaunchKernel_params launch; /* copied at the callback */
  CUresult result;
  CUcontext context;
  uint32_t correlation;
  uint64_t data_at_exit;
};
struct log {
  struct record r[16];
  int n;
};

static void CUPTIAPI on_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                 const void *cbdata) {
  struct log *log = userdata;
  const CUpti_CallbackData *d = cbdata;
  if (log->n == 16) return;
  struct record *r = &log->r[log->n++];
  r->domain = domain;
  r->cbid = cbid;
  r->site = d->callbackSite;
  snprintf(r->function, sizeof r->function, "%s", d->functionName);
  snprintf(r->symbol, sizeof r->symbol, "%s", d->symbolName ? d->symbolName : "(null)");
  if (cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel) r->launch = *(const cuLaunchKernel_params *)d->functionParams;
  r->context = d->context;
  r->correlation = d->correlationId;
  if (d->callbackSite == CUPTI_API_ENTER) {
    *d->correlationData = 0xabc; /* handed from enter to exit */
  } else {
    r->result = *(const CUresult *)d->functionReturnValue;
    r->data_at_exit = *d->correlationData;
  }
}

static void nop_kernel(void **args, void *user) {
  (void)args;
  (void)user;
}

/* (f) */
static void test_one_subscriber_gets_launch_callbacks(void **state) {
  (void)state;
  static struct log log;
  CUpti_SubscriberHandle sub, second;
  CUcontext ctx;
  CU_OK(cuCtxGetCurrent(&ctx));
  static const size_t sizes[] = {8};
  CUfunction f = fakecuda_register_kernel("scale_kernel", nop_kernel, NULL, 1, sizes);
  uint64_t arg = 5;
  void *params[] = {&arg};

  assert_int_equal(cuptiSubscribe(&sub, on_callback, &log), CUPTI_SUCCESS);
  assert_int_equal(cuptiSubscribe(&second, on_callback, &log), CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
  assert_int_equal(cuptiGetLastError(), CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
  assert_int_equal(cuptiGetLastError(), CUPTI_SUCCESS);
  assert_int_equal(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel),
                   CUPTI_SUCCESS);

  CU_OK(cuLaunchKernel(f, 3, 1, 1, 64, 1, 1, 0, NULL, params, NULL));
  CU_OK(cuCtxSynchronize()); /* not enabled: no callback */
  assert_int_equal(log.n, 2);
  for (int i = 0; i < 2; i++) {
    struct record *r = &log.r[i];
    assert_int_equal(r->domain, CUPTI_CB_DOMAIN_DRIVER_API);
    assert_int_equal(r->cbid, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);
    assert_int_equal(r->site, i == 0 ? CUPTI_API_ENTER : CUPTI_API_EXIT);
    assert_string_equal(r->function, "cuLaunchKernel");
    assert_string_equal(r->symbol, "scale_kernel");
    assert_ptr_equal(r->launch.f, f);
    assert_int_equal(r->launch.gridDimX, 3);
    assert_int_equal(r->launch.blockDimX, 64);
    assert_ptr_equal(r->launch.kernelParams, params);
    assert_null(r->launch.hStream);
    assert_ptr_equal(r->context, ctx);
  }
  assert_int_not_equal(log.r[0].correlation, 0);
  assert_int_equal(log.r[0].correlation, log.r[1].correlation);
  assert_int_equal(log.r[1].result, CUDA_SUCCESS);
  assert_int_equal(log.r[1].data_at_exit, 0xabc);

  /* A failing launch is reported with its result. */
  assert_int_equal(cuLaunchKernel(f, 0, 1, 1, 1, 1, 1, 0, NULL, params, NULL), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(log.n, 4);
  assert_int_equal(log.r[3].result, CUDA_ERROR_INVALID_VALUE);
  assert_true(log.r[2].correlation > log.r[1].correlation);

  /* cuLaunchKernelEx: only once its callback is enabled (here by the whole domain). */
  CUlaunchConfig cfg = {0};
  cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
  CU_OK(cuLaunchKernelEx(&cfg, f, params, NULL));
  assert_int_equal(log.n, 4);
  assert_int_equal(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API), CUPTI_SUCCESS);
  CU_OK(cuLaunchKernelEx(&cfg, f, params, NULL));
  assert_int_equal(log.n, 6);
  assert_int_equal(log.r[4].cbid, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx);
  assert_string_equal(log.r[4].symbol, "scale_kernel");
  uint32_t on = 9;
  assert_int_equal(cuptiGetCallbackState(&on, sub, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemcpy),
                   CUPTI_SUCCESS);
  assert_int_equal(on, 1);
  CU_OK(cuCtxSynchronize());
  assert_int_equal(log.n, 8);
  assert_null(log.r[6].launch.f); /* not a launch: only the launch struct is copied */
  assert_string_equal(log.r[6].function, "cuCtxSynchronize");
  assert_string_equal(log.r[6].symbol, "(null)");

  assert_int_equal(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API), CUPTI_ERROR_NOT_SUPPORTED);
  assert_int_equal(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, 100000), CUPTI_ERROR_INVALID_PARAMETER);

  assert_int_equal(cuptiUnsubscribe(sub), CUPTI_SUCCESS);
  CU_OK(cuCtxSynchronize());
  assert_int_equal(log.n, 8);
  assert_int_equal(cuptiUnsubscribe(sub), CUPTI_ERROR_INVALID_PARAMETER);

  /* Once the first has gone, a new subscriber is accepted. */
  CUpti_SubscriberParams sp = {CUpti_SubscriberParams_STRUCT_SIZE, "tracer", NULL, 0};
  assert_int_equal(cuptiSubscribe_v2(&sub, on_callback, &log, &sp), CUPTI_SUCCESS);
  char old[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN] = "";
  CUpti_SubscriberParams sp2 = {CUpti_SubscriberParams_STRUCT_SIZE, "profiler", old, sizeof old};
  assert_int_equal(cuptiSubscribe_v2(&second, on_callback, &log, &sp2), CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
  assert_string_equal(old, "tracer");
  assert_int_equal(cuptiUnsubscribe(sub), CUPTI_SUCCESS);
}

static void test_strings(void **state) {
  (void)state;
  const char *s = NULL;
  assert_int_equal(cuptiGetResultString(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, &s), CUPTI_SUCCESS);
  assert_string_equal(s, "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED");
  assert_int_equal(cuptiGetResultString((CUptiResult)12345, &s), CUPTI_ERROR_INVALID_PARAMETER);
  assert_int_equal(cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, &s),
                   CUPTI_SUCCESS);
  assert_string_equal(s, "cuLaunchKernelEx");
  uint32_t v = 0;
  assert_int_equal(cuptiGetVersion(&v), CUPTI_SUCCESS);
  assert_int_equal(v, CUPTI_API_VERSION);
}

/* The raw hook: same parameter structs, enter and exit, and calls made inside it are
 * not reported. */
struct hook_log {
  int n;
  int cbid[8], site[8];
  char name[8][40];
  cuMemcpyHtoDAsync_v2_params copy;
  CUresult exit_result;
};
static void on_api(int cbid, int site, const char *name, const void *params, CUresult *result, void *user) {
  struct hook_log *h = user;
  CUcontext c;
  cuCtxGetCurrent(&c); /* not reported: we are inside the hook */
  if (h->n == 8) return;
  h->cbid[h->n] = cbid;
  h->site[h->n] = site;
  snprintf(h->name[h->n], sizeof h->name[0], "%s", name);
  if (cbid == CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2) h->copy = *(const cuMemcpyHtoDAsync_v2_params *)params;
  if (site == 1) h->exit_result = *result;
  h->n++;
}

static void test_api_hook(void **state) {
  (void)state;
  static struct hook_log h;
  CUdeviceptr d;
  int v = 3;
  CU_OK(cuMemAlloc_v2(&d, 64));
  fakecuda_set_api_callback(on_api, &h);
  CU_OK(cuMemcpyHtoDAsync_v2(d + 4, &v, sizeof v, NULL));
  fakecuda_set_api_callback(NULL, NULL);
  CU_OK(cuCtxSynchronize());
  assert_int_equal(h.n, 2);
  assert_int_equal(h.cbid[0], CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2);
  assert_int_equal(h.site[0], 0);
  assert_int_equal(h.site[1], 1);
  assert_string_equal(h.name[1], "cuMemcpyHtoDAsync_v2");
  assert_int_equal(h.copy.dstDevice, d + 4);
  assert_ptr_equal(h.copy.srcHost, &v);
  assert_int_equal(h.copy.ByteCount, sizeof v);
  assert_int_equal(h.exit_result, CUDA_SUCCESS);
  CU_OK(cuMemFree_v2(d));
}

int main(void) {
  setup_context();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_subscriber_gets_launch_callbacks),
      cmocka_unit_test(test_strings),
      cmocka_unit_test(test_api_hook),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
