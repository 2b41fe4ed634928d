/* A program with its own CUPTI subscriber, as a profiler in the process has, run under
 * psshim. Under PSSHIM_POLICY=auto psshim holds CUPTI's one subscription from the first
 * allocation: the program's must still be served, see the callbacks it enabled (driver
 * calls psshim does not handle, and launches it does), see none after disabling or after
 * cuptiFinalize, while psshim goes on seeing every launch. Under static the calls go to
 * CUPTI itself. Prints the launches made ("launches N") for the stats check; any failed
 * check exits non-zero naming it. */
#define SIM_NAME "cupti_guest"
#include "tests/integration/check.h"
#include "tests/integration/sim.h"

#include <cupti.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

static atomic_int launches_seen, syncs_seen;
static int launches_made;

static void CUPTIAPI on_callback(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data)
{
  (void)data;
  if (user != (void *)&launches_seen || domain != CUPTI_CB_DOMAIN_DRIVER_API)
    return;
  if (cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel)
    atomic_fetch_add(&launches_seen, 1);
  else if (cbid == CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize)
    atomic_fetch_add(&syncs_seen, 1);
}

static void touch_fn(void **args, void *user)
{
  (void)user;
  (**(int **)args[0])++;
}

static void run(CUfunction touch, int *buf, int launches, int syncs)
{
  for (int i = 0; i < launches; i++) {
    void *params[] = {&buf};
    launch(touch, params, 0);
    launches_made++;
  }
  for (int i = 0; i < syncs; i++)
    if (cuCtxSynchronize() != CUDA_SUCCESS)
      exit(2);
}

int main(void)
{
  size_t sizes[] = {8};
  CUfunction touch = fakecuda_register_kernel("touch", touch_fn, NULL, 1, sizes);
  int *buf;
  check(cudaMalloc((void **)&buf, 1 << 20), "cudaMalloc"); /* psshim sets up the device, and observes */
  CUpti_SubscriberHandle h = NULL, h2 = NULL;
  CHECK("the program's cuptiSubscribe succeeds", cuptiSubscribe(&h, on_callback, &launches_seen) == CUPTI_SUCCESS);
  CHECK("a second one is refused as CUPTI refuses it",
        cuptiSubscribe(&h2, on_callback, NULL) == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
  CHECK("it enables the launch callback",
        cuptiEnableCallback(1, h, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel) == CUPTI_SUCCESS);
  CHECK("and a driver call psshim does not handle",
        cuptiEnableCallback(1, h, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize) == CUPTI_SUCCESS);
  uint32_t on = 0;
  CHECK("cuptiGetCallbackState says it is on",
        cuptiGetCallbackState(&on, h, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel) ==
                CUPTI_SUCCESS && on == 1);
  run(touch, buf, 10, 3);
  CHECK("it sees each launch, entering and leaving", atomic_load(&launches_seen) == 20);
  CHECK("it sees each cuCtxSynchronize", atomic_load(&syncs_seen) == 6);
  CHECK("it disables the launch callback",
        cuptiEnableCallback(0, h, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel) == CUPTI_SUCCESS);
  run(touch, buf, 5, 1);
  CHECK("then sees no launch, but still the synchronize", atomic_load(&launches_seen) == 20 && syncs_seen == 8);
  CHECK("cuptiFinalize succeeds", cuptiFinalize() == CUPTI_SUCCESS);
  run(touch, buf, 7, 2);
  CHECK("after it the program's callback gets nothing", atomic_load(&launches_seen) == 20 && syncs_seen == 8);
  int value = 0;
  check(cudaMemcpy(&value, buf, sizeof value, cudaMemcpyDeviceToHost), "cudaMemcpy");
  CHECK("every launch ran", value == launches_made);
  check(cudaFree(buf), "cudaFree");
  printf("launches %d\n", launches_made);
  return failures ? 1 : 0;
}
