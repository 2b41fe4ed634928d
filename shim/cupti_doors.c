/* CUPTI doors: the program's own CUPTI subscriber (a profiler) shares psshim's
 * subscription instead of being refused (tracer/cupti_guest.c); what psshim does not
 * serve goes to the real CUPTI. */
#include "shim/shim.h"
#include "tracer/observe.h"
#include "tracer/tracer.h"

#include <cupti.h>

static const char *const cupti_sonames[] = {"libcupti.so.13", "libcupti.so", NULL};

#define REAL_CUPTI(name) PS_REAL(name, cupti_sonames)
#define SERVED(call) \
  do { \
    int served = (call); \
    if (served != PST_GUEST_PASS) \
      return (CUptiResult)served; \
  } while (0)

PS_DEFAULT_VISIBILITY CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback,
                                                 void *userdata)
{
  SERVED(pst_guest_subscribe((void **)subscriber, (pst_any_fn)callback, userdata));
  REAL_CUPTI(cuptiSubscribe);
  return real_cuptiSubscribe ? real_cuptiSubscribe(subscriber, callback, userdata) : CUPTI_ERROR_NOT_INITIALIZED;
}

PS_DEFAULT_VISIBILITY CUptiResult cuptiSubscribe_v2(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback,
                                                    void *userdata, CUpti_SubscriberParams *params)
{
  SERVED(pst_guest_subscribe((void **)subscriber, (pst_any_fn)callback, userdata));
  REAL_CUPTI(cuptiSubscribe_v2);
  return real_cuptiSubscribe_v2 ? real_cuptiSubscribe_v2(subscriber, callback, userdata, params)
                                : CUPTI_ERROR_NOT_INITIALIZED;
}

PS_DEFAULT_VISIBILITY CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle subscriber)
{
  SERVED(pst_guest_unsubscribe(subscriber));
  REAL_CUPTI(cuptiUnsubscribe);
  return real_cuptiUnsubscribe ? real_cuptiUnsubscribe(subscriber) : CUPTI_ERROR_NOT_INITIALIZED;
}

PS_DEFAULT_VISIBILITY CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                                      CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
  SERVED(pst_guest_enable(enable, subscriber, (int)domain, cbid));
  REAL_CUPTI(cuptiEnableCallback);
  return real_cuptiEnableCallback ? real_cuptiEnableCallback(enable, subscriber, domain, cbid)
                                  : CUPTI_ERROR_NOT_INITIALIZED;
}

PS_DEFAULT_VISIBILITY CUptiResult cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                                    CUpti_CallbackDomain domain)
{
  SERVED(pst_guest_enable_domain(enable, subscriber, (int)domain));
  REAL_CUPTI(cuptiEnableDomain);
  return real_cuptiEnableDomain ? real_cuptiEnableDomain(enable, subscriber, domain) : CUPTI_ERROR_NOT_INITIALIZED;
}

PS_DEFAULT_VISIBILITY CUptiResult cuptiEnableAllDomains(uint32_t enable, CUpti_SubscriberHandle subscriber)
{
  SERVED(pst_guest_enable_domain(enable, subscriber, PST_GUEST_ALL_DOMAINS));
  REAL_CUPTI(cuptiEnableAllDomains);
  return real_cuptiEnableAllDomains ? real_cuptiEnableAllDomains(enable, subscriber) : CUPTI_ERROR_NOT_INITIALIZED;
}

PS_DEFAULT_VISIBILITY CUptiResult cuptiGetCallbackState(uint32_t *enable, CUpti_SubscriberHandle subscriber,
                                                        CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
  SERVED(pst_guest_state(enable, subscriber, (int)domain, cbid));
  REAL_CUPTI(cuptiGetCallbackState);
  return real_cuptiGetCallbackState ? real_cuptiGetCallbackState(enable, subscriber, domain, cbid)
                                    : CUPTI_ERROR_NOT_INITIALIZED;
}

PS_DEFAULT_VISIBILITY CUptiResult cuptiFinalize(void)
{
  SERVED(pst_guest_finalize());
  REAL_CUPTI(cuptiFinalize);
  return real_cuptiFinalize ? real_cuptiFinalize() : CUPTI_ERROR_NOT_INITIALIZED;
}
