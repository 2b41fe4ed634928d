/* The wiring of observation to paging and sharing, started when the allocator sets up its
 * first device: opens the trace (PSSHIM_TRACE), subscribes to launches (for the trace, and
 * for the pager when PSSHIM_POLICY is auto or plan), finds the training iteration's period in the
 * launch sequence and hands it down with each moment, meets iteration boundaries (the
 * ranks' checks and sharing rounds), and samples memory every PSSHIM_SAMPLE_MS. */
#include "allocator/allocator.h"
#include "core/core.h"
#include "policy/policy.h"
#include "shim/shim.h"
#include "tracer/observe.h"
#include "tracer/tracer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_PERIOD 65536     /* launches per iteration that can be recognised */
#define PERIOD_ASK_MAX 4096 /* launches between period queries (each costs up to ms) */
#define PERIOD_ASK_UNTRUSTED 1024 /* while no period is trusted: those steps are the slow ones */
#define HISTORY (4 * MAX_PERIOD) /* launches whose live bytes are kept: a power of two */

static ps_mutex period_lock = PS_MUTEX_INITIALIZER(PS_RANK_PERIOD, "the period lock");
static psp_period *detector;
static uint64_t fed, next_ask, next_boundary, iteration;
static uint32_t period, candidate; /* adopted period, and the last one the detector gave */
static psp_trust trust; /* whether period is the iteration (policy.h) */
static _Atomic uint32_t adopted; /* period once trusted (else 0), readable without the lock */
static uint64_t adopted_at; /* launches fed when it was */
/* Live bytes and allocations made as each launch was fed (fed & (HISTORY - 1)), so that a
 * period the detector gives can be judged on the boundaries it already passed. */
static struct {
  uint64_t live, allocs;
} *history;
static pthread_t sampler;
static _Atomic bool sampling, in_sample;
static CUcontext sampler_ctx;

/* A new period, or none: the pager runs without one until it is trusted. Called under
 * period_lock, which is taken before the devices' locks. */
static void distrust(void)
{
  psp_trust_reset(&trust);
  atomic_store_explicit(&adopted, 0, memory_order_relaxed);
}

/* Whether period p's last two boundaries before `next` (its next one) found the same live
 * bytes, by the rule psp_trust_boundary applies as boundaries come. Then the next boundary
 * can trust it without waiting two more iterations: before trust placement is static's,
 * and a crowded run's steps then are many times a steady one. Not at once, mid-iteration:
 * that saves one more slow step, but plans begun mid-iteration left a placement that
 * slowed the steady steps of an uncrowded run. */
static bool passed_steady(uint32_t p, uint64_t next)
{
  uint64_t last = next - p;
  if (!history || last < (uint64_t)p + 1 || fed - (last - p) >= HISTORY)
    return false;
  uint64_t a = (last - p) & (HISTORY - 1), b = last & (HISTORY - 1);
  return psp_trust_steady(history[a].live, history[a].allocs, history[b].live, history[b].allocs);
}

/* Device memory in use beyond psshim's GPU frames and what was in use when psshim set the
 * device up (the CUDA context, the libraries loaded by then: CONTEXT_MOST at most, so that a
 * pool made before, as XLA's is when its client is, counts) is the program's own, got in a
 * way psshim does not serve: outside the budget and never paged, which the user is told
 * once, at an iteration boundary or a memory sample. Below UNMANAGED_SAY
 * (PSSHIM_GPU_RESERVE's default), or a quarter of the budget, it is taken for what
 * libraries add later (workspaces, NCCL's buffers). Of the device the calling thread's
 * context is on, against psshim's frames on every device. */
#define CONTEXT_MOST (1ull << 30)
#define UNMANAGED_SAY (2ull << 30)
static uint64_t used_at_start;
static _Atomic bool unmanaged_said; /* or nothing to compare with */

static uint64_t device_used(void)
{
  size_t free_b = 0, total_b = 0;
  return ps_driver.cuMemGetInfo_v2(&free_b, &total_b) == CUDA_SUCCESS ? total_b - free_b : UINT64_MAX;
}

/* used: device_used()'s answer (UINT64_MAX: none). */
static void say_unmanaged(const struct psa_stats *s, uint64_t used)
{
  uint64_t known = used_at_start + s->gpu_frames * s->chunk_size;
  uint64_t say = s->gpu_budget / 4 > UNMANAGED_SAY ? s->gpu_budget / 4 : UNMANAGED_SAY;
  if (atomic_load(&unmanaged_said) || used == UINT64_MAX || used <= known + say)
    return;
  if (atomic_exchange(&unmanaged_said, true))
    return; /* the sampler and a launching thread both found it */
  ps_error("%.1f GiB of the device's memory in use is not psshim's: the program allocates it in a way psshim does not "
           "serve (its own cuMemCreate, managed memory, a CUDA runtime linked into it), or another process holds it; "
           "it lies outside PSSHIM_GPU_BUDGET and is never paged", (double)(used - known) / (1 << 30));
}

/* Iteration boundaries from the period detector, once trusted: an ITERATION record as each
 * passes. Returns the moment's position in the iteration (0 at a boundary), and in *moment
 * its place among all moments fed (positions follow it: one moment, one position). */
static uint64_t track_iteration(const struct ps_moment *l, uint64_t *moment)
{
  ps_mutex_lock(&period_lock);
  psp_period_feed(detector, l->signature);
  *moment = fed++;
  if (history)
    psa_live_now(&history[fed & (HISTORY - 1)].live, &history[fed & (HISTORY - 1)].allocs);
  if (fed >= next_ask) {
    /* Ask early and then more rarely: short programs get their period, long ones pay
     * little. By launches, not time: ranks must meet the same boundaries. */
    uint64_t most = trust.trusted ? PERIOD_ASK_MAX : PERIOD_ASK_UNTRUSTED;
    next_ask = fed + (fed < most ? (fed < 64 ? 64 : fed) : most);
    uint32_t p = 0;
    uint64_t phase = 0;
    /* A run of one kernel repeated (an optimizer's per-tensor launches, say) is no
     * iteration: on the 2.68B GPT a period of 1 stood for half the run before the real one. */
    bool found = psp_period_get(detector, &p, &phase) && p > 1;
    /* Early in a run a layer's pattern looks periodic: a period is adopted only when two
     * queries in a row agree or its boundaries passed already look steady, and dropped
     * when the stream stops being periodic. */
    if (!found) {
      period = candidate = 0;
      distrust();
    } else if (p != period) {
      uint64_t next = phase + p;
      while (next < fed)
        next += p;
      bool seen = passed_steady(p, next);
      if (p == candidate) {
        period = p;
        distrust();
        next_boundary = next;
        if (seen) /* the next boundary trusts it, if steady once more */
          psp_trust_passed(&trust, history[(next - p) & (HISTORY - 1)].live,
                           history[(next - p) & (HISTORY - 1)].allocs);
      } else {
        /* A new candidate is confirmed (or not) two of its periods later, not after the
         * doubling wait: a 24-launch loop asked at 130 and 260 launches would otherwise
         * first agree at 520. When its passed boundaries look steady already, a quarter
         * period later (at least 64 launches: a short pattern early in a run still waits
         * two of its periods): the steps before trust are the slow ones. */
        uint64_t twice = 2 * (uint64_t)p, quarter = p / 4 > 64 ? p / 4 : 64;
        uint64_t wait = (seen && quarter < twice ? quarter : twice) + 64;
        if (fed + wait < next_ask)
          next_ask = fed + wait;
      }
    }
    candidate = found ? p : 0;
  }
  bool boundary = period && fed >= next_boundary, trusted_before = trust.trusted;
  if (boundary) {
    next_boundary += period;
    if (!trusted_before) {
      uint64_t live, allocs;
      psa_live_now(&live, &allocs);
      if (psp_trust_boundary(&trust, live, allocs)) {
        adopted_at = fed;
        atomic_store_explicit(&adopted, period, memory_order_relaxed);
      }
    }
    boundary = trust.trusted;
  }
  uint64_t it = boundary ? ++iteration : iteration;
  uint32_t per = period;
  uint64_t position = per ? (fed + per - next_boundary) % per : 0; /* next_boundary is in (fed, fed + per] */
  ps_mutex_unlock(&period_lock);
  if (boundary) {
    struct psa_stats s;
    psa_stats_boundary(!trusted_before, &s); /* the boundary that trusted it starts anew */
    if (!atomic_load(&unmanaged_said))
      say_unmanaged(&s, device_used());
    struct pst_record r = {.type = PST_REC_ITERATION,
                           .iteration = {.iteration = it, .period = per, .pager_ns = s.launch_ns,
                                         .turns_ns = s.move_ns, .late_waits = s.late_waits,
                                         .late_wait_ns = s.late_wait_ns}};
    pst_trace_emit(&r);
    psa_shard_boundary(per);
  }
  return position;
}

static void on_moment(const struct ps_moment *l, bool enter, void *user)
{
  (void)user;
  static PS_THREAD_LOCAL uint64_t position, moment; /* of this thread's latest enter: its exit's too */
  if (enter && detector)
    position = track_iteration(l, &moment);
  if (ps_options.policy != PS_POLICY_STATIC)
    psa_on_moment(l, enter, atomic_load_explicit(&adopted, memory_order_relaxed), position, moment);
}

static bool claims(uint64_t value) { return psa_owns((CUdeviceptr)value); }

static void *sample_main(void *arg)
{
  (void)arg;
  if (sampler_ctx && PS_CU(ps_driver.cuCtxSetCurrent(sampler_ctx)))
    return NULL;
  bool said = false;
  struct timespec period_ts = {.tv_sec = ps_options.sample_ms / 1000,
                               .tv_nsec = (long)(ps_options.sample_ms % 1000) * 1000000L};
  for (;;) {
    atomic_store(&in_sample, true);
    if (!atomic_load(&sampling))
      break;
    struct psa_stats s;
    psa_stats_get(&s);
    size_t free_b = 0, total_b = 0;
    /* The real driver's figures (psshim's door is not in the table); without them the
     * sample carries psshim's own counts only. */
    bool known = ps_driver.cuMemGetInfo_v2(&free_b, &total_b) == CUDA_SUCCESS;
    if (!known) {
      if (!said)
        ps_log(PS_LOG_WARN, "memory samples carry psshim's own counts only: cuMemGetInfo failed");
      said = true;
      free_b = total_b = 0;
    }
    uint64_t gpu = s.gpu_frames * s.chunk_size, used = total_b - free_b;
    struct pst_record r = {.type = PST_REC_SAMPLE,
                           .sample = {.gpu_chunk_bytes = gpu,
                                      .host_chunk_bytes = s.host_frames * s.chunk_size,
                                      .nonmodel_gpu_bytes = used > gpu ? used - gpu : 0,
                                      .device_free_bytes = free_b}};
    pst_trace_emit(&r);
    say_unmanaged(&s, known ? used : UINT64_MAX); /* a program with no period has no boundary to say it at */
    atomic_store(&in_sample, false);
    nanosleep(&period_ts, NULL);
  }
  atomic_store(&in_sample, false);
  return NULL;
}

/* Stops the sampler and waits (a little) for a sample in progress: the CUDA runtime's
 * exit handlers destroy the context under it. Registered with atexit after the runtime's
 * own, so it runs before them. */
static void stop_sampling(void)
{
  atomic_store(&sampling, false);
  if (ps_in_forked_child())
    return; /* a forked child (a DataLoader worker) has no sampler to wait for */
  struct timespec ms = {.tv_nsec = 1000000};
  for (int i = 0; i < 200 && atomic_load(&in_sample); i++)
    nanosleep(&ms, NULL);
}

static void start(const struct pst_trace_header *h, void *user)
{
  (void)user;
  used_at_start = device_used();
  atomic_store(&unmanaged_said, used_at_start == UINT64_MAX);
  if (used_at_start > CONTEXT_MOST)
    used_at_start = CONTEXT_MOST;
  bool tracing = ps_options.trace_path && pst_trace_open(ps_options.trace_path, h);
  if (tracing) { /* the header has the budgets and chunk size in effect; these, as asked */
    char text[1024] = "settings: ";
    ps_options_settings(text + strlen(text), sizeof text - strlen(text));
    pst_trace_emit(&(struct pst_record){.type = PST_REC_NOTE, .note = {.len = 0, .text = text}});
  }
  if (!tracing && ps_options.policy == PS_POLICY_STATIC)
    return; /* nothing to observe for */
  /* Two repeats, not three: on the 2.68B GPT's trace replayed here the step's period came
   * at launch 27062 instead of 31721, a step sooner, and every test still finds its own. */
  detector = psp_period_new(MAX_PERIOD, 2, 0.02);
  history = calloc(HISTORY, sizeof *history); /* without it, periods are judged as boundaries come */
  struct pst_observer o = {.moment = on_moment, .claims = claims, .required = ps_options.policy != PS_POLICY_STATIC};
  pst_observe_start(&o);
  if (tracing) {
    if (PS_CU(ps_driver.cuCtxGetCurrent(&sampler_ctx)))
      sampler_ctx = NULL;
    atomic_store(&sampling, true);
    /* Detached: at exit it may be waiting for a lock a dying thread holds, and the
     * process must not wait for it. */
    if (pthread_create(&sampler, NULL, sample_main, NULL) == 0) {
      pthread_detach(sampler);
      atexit(stop_sampling);
    } else {
      atomic_store(&sampling, false);
    }
  }
}

void ps_wiring_init(void) { psa_on_first_device(start, NULL); }

void ps_wiring_end(void)
{
  /* At exit the CUDA runtime may already be torn down: no CUPTI calls here. */
  stop_sampling();
  pst_trace_close();
  ps_mutex_lock(&period_lock);
  psp_period_free(detector);
  detector = NULL;
  free(history);
  history = NULL;
  ps_mutex_unlock(&period_lock);
}

struct psa_progress ps_wiring_progress(void)
{
  ps_mutex_lock(&period_lock);
  struct psa_progress p = {.launches = fed, .iterations = iteration,
                           .period = atomic_load_explicit(&adopted, memory_order_relaxed),
                           .adopted_at = adopted_at};
  ps_mutex_unlock(&period_lock);
  return p;
}
