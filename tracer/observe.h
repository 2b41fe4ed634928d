/* tracer/ — observation of the process: CUPTI callbacks on kernel launches, copies and
 * memsets, each reported as a moment (core/core.h) to one observer. Each launch's
 * parameters are scanned for values the observer claims (pointers into its memory);
 * every moment is also written to the trace (tracer/tracer.h) when one is open.
 * Observation knows nothing of paging or sharing: the observer decides what a moment
 * means. */
#ifndef PSSHIM_OBSERVE_H
#define PSSHIM_OBSERVE_H

#include "core/core.h"

#include <stdbool.h>
#include <stdint.h>

struct pst_observer {
  /* Called on the launching thread before the driver enqueues the work (enter = true)
   * and after (enter = false), with the same moment. */
  void (*moment)(const struct ps_moment *m, bool enter, void *user);
  /* Whether a value is a pointer into the memory whose touches the observer wants: asked
   * of every word of every launch's parameters, so it must be quick and lock-free. */
  bool (*claims)(uint64_t value);
  void *user;
  /* Paging depends on the launches (not a trace alone): failing to observe them is said at
   * the default log level. */
  bool required;
};

/* Subscribes to CUPTI (PSSHIM_CUPTI, else next to the framework's CUDA libraries, else the
 * toolkit) for the observer o (copied). False, after one log line and a trace NOTE, when
 * CUPTI is missing or taken. */
bool pst_observe_start(const struct pst_observer *o);
void pst_observe_stop(void);
/* Reports a moment seen elsewhere than CUPTI (psshim's NCCL doors) exactly like a launch:
 * numbered and traced at enter, then given to the observer at enter and at exit. Works
 * for the trace even when CUPTI is not observed. */
void pst_observe_moment(struct ps_moment *m, bool enter);

/* CUPTI allows one callback subscriber per process. While psshim holds it, a subscriber
 * the program makes after psshim's (a profiler: torch.profiler) is served from psshim's
 * subscription through psshim's CUPTI doors (cupti_guest.c): a stand-in handle, its
 * callbacks enabled there and passed on to it; cuptiFinalize only ends its subscription.
 * Each returns a CUptiResult, or PST_GUEST_PASS when the call is CUPTI's to answer (psshim
 * holds no subscription, or the handle is not the stand-in). */
#define PST_GUEST_PASS (-1)
#define PST_GUEST_ALL_DOMAINS (-1) /* pst_guest_enable_domain: every domain */
typedef void (*pst_any_fn)(void);
int pst_guest_subscribe(void **handle, pst_any_fn fn, void *userdata);
int pst_guest_unsubscribe(void *handle);
int pst_guest_enable(uint32_t enable, void *handle, int domain, uint32_t cbid);
int pst_guest_enable_domain(uint32_t enable, void *handle, int domain);
int pst_guest_state(uint32_t *enable, void *handle, int domain, uint32_t cbid);
int pst_guest_finalize(void);

#endif
