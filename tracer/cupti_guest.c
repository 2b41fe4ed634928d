/* A second CUPTI subscriber in the process, riding on psshim's subscription.
 *
 * CUPTI allows one callback subscriber per process and refuses the next with
 * CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED. Under PSSHIM_POLICY=auto psshim holds it
 * from the first allocation, so a profiler started later (torch.profiler's Kineto) would be
 * refused and record no kernels. psshim's
 * CUPTI doors (shim/cupti_doors.c) send such a subscriber here instead: it gets a stand-in
 * handle, what it enables is enabled on psshim's subscription, and its callbacks are
 * passed on to it. cuptiFinalize would end psshim's observation too, and paging must not
 * go on blind, so while psshim observes it only ends the guest's subscription. */
#include "core/core.h"
#include "tracer/cupti_guest.h"
#include "tracer/observe.h"
#include "tracer/tracer.h"

#include <pthread.h>
#include <stdatomic.h>

#define GUEST_CBIDS 1024 /* callback ids per domain a guest may enable (CUDA 13: < 807) */
#define GUEST_WORDS (GUEST_CBIDS / 64)

static struct {
  ps_mutex lock; /* the guest's calls, one at a time */
  _Atomic(CUpti_CallbackFunc) fn;
  void *userdata;
  _Atomic uint64_t on[CUPTI_CB_DOMAIN_SIZE][GUEST_WORDS];
} guest = {.lock = PS_MUTEX_INITIALIZER(PS_RANK_CUPTI_GUEST, "the CUPTI guest lock")};

static char stand_in_byte; /* its address is the guest's handle: nothing else has it */
#define STAND_IN ((void *)&stand_in_byte)

static bool valid_domain(int domain) { return domain > CUPTI_CB_DOMAIN_INVALID && domain < CUPTI_CB_DOMAIN_SIZE; }

/* Whether the guest has the callback on (a valid domain, cbid < GUEST_CBIDS). */
static bool guest_on(int domain, uint32_t cbid)
{
  return atomic_load_explicit(&guest.on[domain][cbid / 64], memory_order_relaxed) >> (cbid % 64) & 1;
}

void pst_guest_dispatch(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data)
{
  if (!valid_domain((int)domain) || cbid >= GUEST_CBIDS || !guest_on((int)domain, cbid))
    return;
  CUpti_CallbackFunc fn = atomic_load_explicit(&guest.fn, memory_order_acquire);
  if (fn)
    fn(guest.userdata, domain, cbid, data);
}

bool pst_guest_active(void) { return atomic_load_explicit(&guest.fn, memory_order_acquire) != NULL; }

int pst_guest_subscribe(void **handle, pst_any_fn fn, void *userdata)
{
  if (!pst_observe_subscribed())
    return PST_GUEST_PASS;
  if (!handle || !fn)
    return CUPTI_ERROR_INVALID_PARAMETER;
  ps_mutex_lock(&guest.lock);
  int r = CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED; /* as CUPTI answers a third */
  if (!pst_guest_active()) {
    guest.userdata = userdata;
    atomic_store_explicit(&guest.fn, (CUpti_CallbackFunc)fn, memory_order_release);
    *handle = STAND_IN;
    r = CUPTI_SUCCESS;
    ps_log(PS_LOG_INFO, "a second CUPTI subscriber (a profiler?) shares psshim's subscription");
  }
  ps_mutex_unlock(&guest.lock);
  return r;
}

/* Sets the guest's bits for cbid (or, with cbid GUEST_CBIDS, the whole domain). */
static void set_on(int domain, uint32_t cbid, bool enable)
{
  for (uint32_t w = 0; w < GUEST_WORDS; w++) {
    uint64_t mask = cbid == GUEST_CBIDS ? ~0ull : w == cbid / 64 ? 1ull << (cbid % 64) : 0;
    if (enable)
      atomic_fetch_or_explicit(&guest.on[domain][w], mask, memory_order_relaxed);
    else
      atomic_fetch_and_explicit(&guest.on[domain][w], ~mask, memory_order_relaxed);
  }
}

static bool domain_on(int domain)
{
  for (uint32_t w = 0; w < GUEST_WORDS; w++)
    if (atomic_load_explicit(&guest.on[domain][w], memory_order_relaxed))
      return true;
  return false;
}

/* Off for the guest: every domain it has anything on in (psshim's own callbacks stay on). */
static void drop_guest(void)
{
  for (int d = CUPTI_CB_DOMAIN_INVALID + 1; d < CUPTI_CB_DOMAIN_SIZE; d++)
    if (domain_on(d)) {
      set_on(d, GUEST_CBIDS, false);
      pst_observe_enable_domain(0, (CUpti_CallbackDomain)d);
    }
  atomic_store_explicit(&guest.fn, NULL, memory_order_release);
}

int pst_guest_unsubscribe(void *handle)
{
  if (handle != STAND_IN)
    return PST_GUEST_PASS;
  ps_mutex_lock(&guest.lock);
  int r = pst_guest_active() ? CUPTI_SUCCESS : CUPTI_ERROR_INVALID_PARAMETER;
  drop_guest();
  ps_mutex_unlock(&guest.lock);
  return r;
}

int pst_guest_enable(uint32_t enable, void *handle, int domain, uint32_t cbid)
{
  if (handle != STAND_IN)
    return PST_GUEST_PASS;
  if (!valid_domain(domain) || cbid >= GUEST_CBIDS)
    return CUPTI_ERROR_INVALID_PARAMETER;
  ps_mutex_lock(&guest.lock);
  int r = CUPTI_ERROR_INVALID_PARAMETER;
  if (pst_guest_active() && (r = pst_observe_enable(enable, (CUpti_CallbackDomain)domain, cbid)) == CUPTI_SUCCESS)
    set_on(domain, cbid, enable);
  ps_mutex_unlock(&guest.lock);
  return r;
}

int pst_guest_enable_domain(uint32_t enable, void *handle, int domain)
{
  if (handle != STAND_IN)
    return PST_GUEST_PASS;
  int first = domain, last = domain;
  if (domain == PST_GUEST_ALL_DOMAINS)
    first = CUPTI_CB_DOMAIN_INVALID + 1, last = CUPTI_CB_DOMAIN_SIZE - 1;
  else if (!valid_domain(domain))
    return CUPTI_ERROR_INVALID_PARAMETER;
  ps_mutex_lock(&guest.lock);
  int r = pst_guest_active() ? CUPTI_SUCCESS : CUPTI_ERROR_INVALID_PARAMETER;
  for (int d = first; d <= last && r == CUPTI_SUCCESS; d++)
    if ((r = pst_observe_enable_domain(enable, (CUpti_CallbackDomain)d)) == CUPTI_SUCCESS)
      set_on(d, GUEST_CBIDS, enable);
  ps_mutex_unlock(&guest.lock);
  return r;
}

int pst_guest_state(uint32_t *enable, void *handle, int domain, uint32_t cbid)
{
  if (handle != STAND_IN)
    return PST_GUEST_PASS;
  if (!enable || !valid_domain(domain) || cbid >= GUEST_CBIDS || !pst_guest_active())
    return CUPTI_ERROR_INVALID_PARAMETER;
  *enable = guest_on(domain, cbid);
  return CUPTI_SUCCESS;
}

int pst_guest_finalize(void)
{
  if (!pst_observe_subscribed())
    return PST_GUEST_PASS;
  ps_mutex_lock(&guest.lock);
  if (pst_guest_active())
    drop_guest();
  ps_mutex_unlock(&guest.lock);
  ps_log(PS_LOG_INFO, "cuptiFinalize kept from CUPTI: psshim observes launches through it");
  return CUPTI_SUCCESS;
}
