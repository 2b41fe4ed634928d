/* Private to tracer/: observe.c's CUPTI subscription as cupti_guest.c shares it. */
#ifndef PSSHIM_CUPTI_GUEST_H
#define PSSHIM_CUPTI_GUEST_H

#include <cupti.h>
#include <stdbool.h>

/* observe.c: whether psshim holds CUPTI's subscription; enabling on it for a guest
 * (disabling one of psshim's own callbacks, alone or with its domain, leaves it on). */
bool pst_observe_subscribed(void);
CUptiResult pst_observe_enable(uint32_t enable, CUpti_CallbackDomain domain, CUpti_CallbackId cbid);
CUptiResult pst_observe_enable_domain(uint32_t enable, CUpti_CallbackDomain domain);

/* cupti_guest.c: gives the guest a callback it enabled (called for every callback). */
void pst_guest_dispatch(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data);
/* Whether a guest rides on the subscription now. */
bool pst_guest_active(void);

#endif
