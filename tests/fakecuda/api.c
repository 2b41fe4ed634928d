/* The API hook: what CUPTI's callback API sees on a real driver. Two slots, one for
 * tests (fakecuda_set_api_callback) and one for the fake libcupti, so a test can watch
 * the driver while a CUPTI subscriber does too. Calls made from inside a hook reach the
 * CUPTI slot, as on the real driver (a subscriber must guard against re-entering itself),
 * but not the tests' raw hook, which may call the driver freely. */
#include <stddef.h>

#include "fakecuda_internal.h"

static pthread_mutex_t api_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fc_api_slots api_slots;
static _Thread_local bool in_hook;
static _Thread_local int in_cupti; /* depth of CUPTI subscriber callbacks on this thread */

static void set_slot(int i, fakecuda_api_callback cb, void *user) {
  pthread_mutex_lock(&api_mu);
  api_slots.cb[i] = cb;
  api_slots.user[i] = user;
  pthread_mutex_unlock(&api_mu);
}

FC_EXPORT void fakecuda_set_api_callback(fakecuda_api_callback cb, void *user) { set_slot(0, cb, user); }
FC_EXPORT void fakecuda_set_cupti_callback(fakecuda_api_callback cb, void *user) { set_slot(1, cb, user); }

static void call_slots(int cbid, int site, const char *name, const void *params, CUresult *result,
                       const struct fc_api_slots *s) {
  bool nested = in_hook;
  in_hook = true;
  for (int i = nested ? 1 : 0; i < 2; i++)
    if (s->cb[i]) {
      in_cupti += i == 1;
      s->cb[i](cbid, site, name, params, result, s->user[i]);
      in_cupti -= i == 1;
    }
  in_hook = nested;
}

bool fc_in_cupti_callback(void) { return in_cupti > 0; }

/* The slots are copied at enter so that exit goes to the same hooks even if one is
 * replaced meanwhile: a subscriber always sees enter and exit in pairs. */
bool fc_api_enter(int cbid, const char *name, const void *params, CUresult *result, void *slots) {
  struct fc_api_slots *s = slots;
  pthread_mutex_lock(&api_mu);
  *s = api_slots;
  pthread_mutex_unlock(&api_mu);
  if (in_hook) s->cb[0] = NULL;
  if (!s->cb[0] && !s->cb[1]) return false;
  call_slots(cbid, 0, name, params, result, s);
  return true;
}

void fc_api_exit(int cbid, const char *name, const void *params, CUresult *result, void *slots) {
  call_slots(cbid, 1, name, params, result, slots);
}
