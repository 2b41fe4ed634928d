/* Streams: one worker thread per stream runs its operations in order, so work queued
 * on a stream is really still pending when the call returns (ordering bugs show).
 *
 * The legacy NULL stream follows CUDA's rule: an operation on it waits for all work
 * already queued on the context's blocking streams, and an operation queued later on a
 * blocking stream waits for the legacy work queued before it. Both directions are made
 * of WAIT_STREAM ops ("wait until stream T completed its first N ops") inserted at
 * enqueue time under ctx->mu, so the view of every queue is consistent.
 * Non-blocking streams (CU_STREAM_NON_BLOCKING) take no part. The per-thread default
 * stream is a blocking stream per (thread, context), created on first use and retired
 * when its thread exits.
 *
 * After fork() the child has none of the parent's worker threads: a child must only
 * use streams it created itself (tests that expect a crash fork first). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fakecuda_internal.h"

pthread_mutex_t fc_sig_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t fc_sig_cv = PTHREAD_COND_INITIALIZER;
static struct fc_handles stream_handles = FC_HANDLES_INIT;
static pthread_mutex_t create_mu = PTHREAD_MUTEX_INITIALIZER; /* legacy / per-thread creation */

/* ---- signals (event records) ---- */
struct fc_signal *fc_signal_new(void) {
  struct fc_signal *s = calloc(1, sizeof *s);
  if (s) atomic_init(&s->refs, 1);
  return s;
}

void fc_signal_unref(struct fc_signal *s) {
  if (s && atomic_fetch_sub(&s->refs, 1) == 1) free(s);
}

void fc_signal_wait(struct fc_signal *s) {
  pthread_mutex_lock(&fc_sig_mu);
  while (!s->done) pthread_cond_wait(&fc_sig_cv, &fc_sig_mu);
  pthread_mutex_unlock(&fc_sig_mu);
}

/* ---- operations ---- */
struct fc_op *fc_op_new(enum fc_op_kind kind, size_t extra) {
  struct fc_op *op = calloc(1, sizeof *op + extra);
  if (op) {
    op->kind = kind;
    op->size = sizeof *op + extra;
  }
  return op;
}

static void stream_unref(struct CUstream_st *s) {
  if (atomic_fetch_sub(&s->refs, 1) != 1) return;
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->work_cv);
  pthread_cond_destroy(&s->done_cv);
  free(s);
}

void fc_op_discard(struct fc_op *op) {
  if (op->kind == FC_OP_RECORD || op->kind == FC_OP_WAIT_SIGNAL) fc_signal_unref(op->u.signal.sig);
  if (op->kind == FC_OP_WAIT_STREAM) stream_unref(op->u.wait.s);
  free(op);
}

void fc_stream_wait_seq(struct CUstream_st *s, uint64_t seq) {
  pthread_mutex_lock(&s->mu);
  while (s->completed < seq) pthread_cond_wait(&s->done_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

#define VA(p) ((CUdeviceptr)(uintptr_t)(p))

/* Runs op on a stream of device dev, which reaches reserved addresses through its view. */
static void run_op(struct fc_op *op, int dev) {
  switch (op->kind) {
    case FC_OP_NOP:
    case FC_OP_EXIT:
      break;
    case FC_OP_COPY:
      fc_sleep_us(atomic_load(&fc_cfg.copy_delay_us));
      memmove(fc_device_view(dev, VA(op->u.copy.dst)), fc_device_view(dev, VA(op->u.copy.src)), op->u.copy.n);
      break;
    case FC_OP_MEMSET:
      fc_sleep_us(atomic_load(&fc_cfg.copy_delay_us));
      if (op->u.memset.elem == 1) {
        memset(fc_device_view(dev, VA(op->u.memset.dst)), (int)op->u.memset.value, op->u.memset.count);
      } else {
        unsigned char *d = fc_device_view(dev, VA(op->u.memset.dst));
        unsigned elem = op->u.memset.elem;
        uint16_t v16 = (uint16_t)op->u.memset.value;
        const void *v = elem == 2 ? (const void *)&v16 : (const void *)&op->u.memset.value;
        for (size_t i = 0; i < op->u.memset.count; i++) memcpy(d + elem * i, v, elem);
      }
      break;
    case FC_OP_KERNEL:
      fc_sleep_us(atomic_load(&fc_cfg.kernel_delay_us));
      fc_run_kernel(op, dev);
      break;
    case FC_OP_RECORD:
      /* The delay holds the stream too: after a stream synchronize every event
       * recorded on it is complete, as on CUDA. The signal is set in finish_op. */
      fc_sleep_us(atomic_load(&fc_cfg.event_delay_us));
      break;
    case FC_OP_WAIT_SIGNAL:
      fc_signal_wait(op->u.signal.sig);
      fc_signal_unref(op->u.signal.sig);
      break;
    case FC_OP_WAIT_STREAM:
      fc_stream_wait_seq(op->u.wait.s, op->u.wait.seq);
      stream_unref(op->u.wait.s);
      break;
    case FC_OP_FREE:
      fc_alloc_release(op->u.free.ptr);
      break;
  }
}

/* Called with s->mu held as the op becomes complete, so that an event's completion
 * and its stream's progress are seen together: once the last event on a stream is
 * complete, cuStreamQuery says the stream is idle. */
static void finish_op(struct fc_op *op) {
  if (op->kind != FC_OP_RECORD) return;
  pthread_mutex_lock(&fc_sig_mu);
  clock_gettime(CLOCK_MONOTONIC, &op->u.signal.sig->when);
  op->u.signal.sig->done = true;
  pthread_cond_broadcast(&fc_sig_cv);
  pthread_mutex_unlock(&fc_sig_mu);
  fc_signal_unref(op->u.signal.sig);
}

static void *worker(void *arg) {
  struct CUstream_st *s = arg;
  struct fc_op *op;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head) pthread_cond_wait(&s->work_cv, &s->mu);
    op = s->head;
    pthread_mutex_unlock(&s->mu);
    run_op(op, s->ctx->dev); /* the op stays at the head while it runs: it is not complete yet */
    pthread_mutex_lock(&s->mu);
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    s->completed++;
    finish_op(op);
    pthread_cond_broadcast(&s->done_cv);
    if (op->kind == FC_OP_EXIT) break;
    free(op);
  }
  pthread_mutex_unlock(&s->mu);
  free(op);
  /* Retired: leave the context's list (the legacy rule no longer needs to wait on us). */
  struct CUctx_st *c = s->ctx;
  pthread_mutex_lock(&c->mu);
  for (struct CUstream_st **pp = &c->streams; *pp; pp = &(*pp)->next) {
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  }
  pthread_mutex_unlock(&c->mu);
  stream_unref(s);
  return NULL;
}

static CUresult stream_new(struct CUctx_st *c, unsigned flags, int priority, enum fc_stream_kind kind,
                           struct CUstream_st **out) {
  struct CUstream_st *s = calloc(1, sizeof *s);
  pthread_t t;
  if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
  s->ctx = c;
  s->flags = flags;
  s->priority = priority;
  s->kind = kind;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work_cv, NULL);
  pthread_cond_init(&s->done_cv, NULL);
  atomic_init(&s->refs, 2); /* the handle and the worker */
  if (pthread_create(&t, NULL, worker, s) != 0) {
    atomic_store(&s->refs, 1);
    stream_unref(s);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_detach(t);
  pthread_mutex_lock(&c->mu);
  s->next = c->streams;
  c->streams = s;
  pthread_mutex_unlock(&c->mu);
  *out = s;
  return CUDA_SUCCESS;
}

/* Queues EXIT: the worker drains what was queued before, then frees the stream
 * (cuStreamDestroy returns at once, as on CUDA). Drops the handle's reference. */
static void stream_retire(struct CUstream_st *s) {
  struct fc_op *op = fc_op_new(FC_OP_EXIT, 0);
  struct CUctx_st *c = s->ctx;
  pthread_mutex_lock(&c->mu);
  s->dead = true;
  pthread_mutex_lock(&s->mu);
  if (op) {
    if (s->tail) s->tail->next = op; else s->head = op;
    s->tail = op;
    s->submitted++;
    pthread_cond_signal(&s->work_cv);
  }
  pthread_mutex_unlock(&s->mu);
  pthread_mutex_unlock(&c->mu);
  stream_unref(s); /* without memory for EXIT the worker stays parked: a leak, not a crash */
}

/* ---- the per-thread default streams ---- */
struct ptds_set { struct CUstream_st *s[FC_MAX_DEVICES]; };
static pthread_key_t ptds_key;
static pthread_once_t ptds_once = PTHREAD_ONCE_INIT;
static void ptds_exit(void *p) {
  struct ptds_set *set = p;
  for (int i = 0; i < FC_MAX_DEVICES; i++)
    if (set->s[i]) stream_retire(set->s[i]);
  free(set);
}
static void ptds_key_init(void) { pthread_key_create(&ptds_key, ptds_exit); }

static CUresult per_thread_stream(struct CUctx_st *c, struct CUstream_st **out) {
  pthread_once(&ptds_once, ptds_key_init);
  struct ptds_set *set = pthread_getspecific(ptds_key);
  if (!set) {
    set = calloc(1, sizeof *set);
    if (!set) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_setspecific(ptds_key, set);
  }
  if (!set->s[c->dev]) {
    CUresult r = stream_new(c, 0, 0, FC_STREAM_PER_THREAD, &set->s[c->dev]);
    if (r != CUDA_SUCCESS) return r;
  }
  *out = set->s[c->dev];
  return CUDA_SUCCESS;
}

static CUresult legacy_stream(struct CUctx_st *c, struct CUstream_st **out) {
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&create_mu);
  if (!c->legacy) r = stream_new(c, 0, 0, FC_STREAM_LEGACY, &c->legacy);
  pthread_mutex_unlock(&create_mu);
  *out = c->legacy;
  return r;
}

CUresult fc_stream_resolve(CUstream h, bool per_thread, struct CUstream_st **out) {
  if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    struct CUctx_st *c;
    CUresult r = fc_current_ctx(&c);
    if (r != CUDA_SUCCESS) return r;
    if (h == CU_STREAM_PER_THREAD || (h == NULL && per_thread)) return per_thread_stream(c, out);
    return legacy_stream(c, out);
  }
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!fc_handles_has(&stream_handles, h)) return CUDA_ERROR_INVALID_HANDLE;
  *out = h;
  return CUDA_SUCCESS;
}

/* ---- queueing ---- */
static void push(struct CUstream_st *s, struct fc_op *op, uint64_t *seq) {
  pthread_mutex_lock(&s->mu);
  if (s->tail) s->tail->next = op; else s->head = op;
  s->tail = op;
  *seq = ++s->submitted;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
}

/* Makes s wait for everything queued on t so far (nothing when t is idle). */
static CUresult wait_for(struct CUstream_st *s, struct CUstream_st *t) {
  uint64_t target, seq;
  pthread_mutex_lock(&t->mu);
  bool pending = t->completed < t->submitted;
  target = t->submitted;
  pthread_mutex_unlock(&t->mu);
  if (!pending) return CUDA_SUCCESS;
  struct fc_op *w = fc_op_new(FC_OP_WAIT_STREAM, 0);
  if (!w) return CUDA_ERROR_OUT_OF_MEMORY;
  atomic_fetch_add(&t->refs, 1);
  w->u.wait.s = t;
  w->u.wait.seq = target;
  push(s, w, &seq);
  return CUDA_SUCCESS;
}

CUresult fc_enqueue(struct CUstream_st *s, struct fc_op *op, uint64_t *seq) {
  struct CUctx_st *c = s->ctx;
  CUresult r = CUDA_SUCCESS;
  if (fc_capture_enqueue(s, op, &r)) return r;
  pthread_mutex_lock(&c->mu);
  if (s->dead) r = CUDA_ERROR_INVALID_HANDLE;
  if (r == CUDA_SUCCESS && !(s->flags & CU_STREAM_NON_BLOCKING)) {
    if (s->kind == FC_STREAM_LEGACY) {
      for (struct CUstream_st *t = c->streams; t && r == CUDA_SUCCESS; t = t->next)
        if (t != s && !(t->flags & CU_STREAM_NON_BLOCKING)) r = wait_for(s, t);
    } else if (c->legacy) {
      r = wait_for(s, c->legacy);
    }
  }
  if (r == CUDA_SUCCESS) push(s, op, seq);
  pthread_mutex_unlock(&c->mu);
  if (r != CUDA_SUCCESS) fc_op_discard(op);
  return r;
}

CUresult fc_submit(struct CUstream_st *s, struct fc_op *op, bool sync) {
  uint64_t seq;
  CUresult r = fc_enqueue(s, op, &seq);
  if (r == CUDA_SUCCESS && sync) fc_stream_wait_seq(s, seq);
  return r;
}

static bool overlaps(CUdeviceptr a, size_t an, CUdeviceptr b, size_t bn) { return a < b + bn && b < a + an; }

/* Whether op will touch [p, p+n), and what it is (for the message). */
static const char *touching(const struct fc_op *op, CUdeviceptr p, size_t n) {
  switch (op->kind) {
    case FC_OP_COPY:
      return overlaps(VA(op->u.copy.dst), op->u.copy.n, p, n) || overlaps(VA(op->u.copy.src), op->u.copy.n, p, n)
                 ? "a copy"
                 : NULL;
    case FC_OP_MEMSET:
      return overlaps(VA(op->u.memset.dst), op->u.memset.count * op->u.memset.elem, p, n) ? "a memset" : NULL;
    case FC_OP_KERNEL:
      for (size_t i = 0; i < op->u.kernel.nhits; i++)
        if (overlaps(op->u.kernel.hits[i].va, 1, p, n)) return op->u.kernel.f->name;
      return NULL;
    default:
      return NULL;
  }
}

void fc_check_unqueued(CUdeviceptr p, size_t n, const char *what) {
  for (int d = 0; d < fc_cfg.device_count; d++) {
    struct CUctx_st *c = &fc_ctx[d];
    pthread_mutex_lock(&c->mu);
    for (struct CUstream_st *t = c->streams; t; t = t->next) {
      pthread_mutex_lock(&t->mu);
      for (const struct fc_op *op = t->head; op; op = op->next) {
        const char *work = touching(op, p, n);
        if (!work) continue;
        /* No unlock: the process ends here, as a GPU fault would end it. */
        fprintf(stderr, "fakecuda: %s of [%#llx, +%zu) while %s%s queued on a stream of device %d will touch it; "
                "CUDA would run it against whatever is mapped there then\n", what, (unsigned long long)p, n,
                op->kind == FC_OP_KERNEL ? "kernel " : "", work, d);
        abort();
      }
      pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&c->mu);
  }
}

CUresult fc_stream_sync(struct CUstream_st *s) {
  if (s->kind == FC_STREAM_LEGACY) {
    /* A no-op on the legacy stream completes only after the blocking streams' work. */
    struct fc_op *op = fc_op_new(FC_OP_NOP, 0);
    return op ? fc_submit(s, op, true) : CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&s->mu);
  while (s->completed < s->submitted) pthread_cond_wait(&s->done_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return CUDA_SUCCESS;
}

static bool stream_idle(struct CUstream_st *s) {
  pthread_mutex_lock(&s->mu);
  bool idle = s->completed == s->submitted;
  pthread_mutex_unlock(&s->mu);
  return idle;
}

CUresult fc_stream_query(struct CUstream_st *s) {
  bool idle = stream_idle(s);
  if (idle && s->kind == FC_STREAM_LEGACY) {
    pthread_mutex_lock(&s->ctx->mu);
    for (struct CUstream_st *t = s->ctx->streams; t && idle; t = t->next)
      if (!(t->flags & CU_STREAM_NON_BLOCKING)) idle = stream_idle(t);
    pthread_mutex_unlock(&s->ctx->mu);
  }
  return idle ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

/* Waits for everything queued on any stream of the context so far. */
CUresult fc_ctx_sync(struct CUctx_st *c) {
  struct pending { struct CUstream_st *s; uint64_t seq; } *v = NULL;
  size_t n = 0, cap = 0;
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&c->mu);
  for (struct CUstream_st *t = c->streams; t; t = t->next) {
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      struct pending *nv = realloc(v, cap * sizeof *v);
      if (!nv) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      v = nv;
    }
    pthread_mutex_lock(&t->mu);
    v[n].seq = t->submitted;
    pthread_mutex_unlock(&t->mu);
    atomic_fetch_add(&t->refs, 1);
    v[n++].s = t;
  }
  pthread_mutex_unlock(&c->mu);
  for (size_t i = 0; i < n; i++) {
    fc_stream_wait_seq(v[i].s, v[i].seq);
    stream_unref(v[i].s);
  }
  free(v);
  return r;
}

/* ---- entry points ---- */
static CUresult stream_create(CUstream *ph, unsigned flags, int priority) {
  struct CUctx_st *c;
  struct CUstream_st *s;
  CUresult r = fc_current_ctx(&c);
  if (r != CUDA_SUCCESS) return r;
  if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
  /* CUDA clamps priorities to [greatest, least] = [-5, 0]. */
  priority = priority > 0 ? 0 : priority < -5 ? -5 : priority;
  r = stream_new(c, flags, priority, FC_STREAM_USER, &s);
  if (r != CUDA_SUCCESS) return r;
  if (!fc_handles_add(&stream_handles, s)) {
    stream_retire(s);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *ph = s;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
  FC_TRACED(cuStreamCreate, stream_create(phStream, Flags, 0), phStream, Flags);
}
FC_EXPORT CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
  FC_TRACED(cuStreamCreateWithPriority, stream_create(phStream, flags, priority), phStream, flags, priority);
}

static CUresult stream_destroy(CUstream h) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!fc_handles_remove(&stream_handles, h)) return CUDA_ERROR_INVALID_HANDLE;
  stream_retire(h);
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  FC_TRACED(cuStreamDestroy_v2, stream_destroy(hStream), hStream);
}
FC_EXPORT CUresult fc_cuStreamDestroy_v1(CUstream hStream) {
  FC_TRACED(cuStreamDestroy, stream_destroy(hStream), hStream);
}

static CUresult stream_synchronize(CUstream h, bool per_thread) {
  struct CUstream_st *s;
  CUresult r = fc_stream_resolve(h, per_thread, &s);
  if (r == CUDA_SUCCESS && atomic_load(&s->capturing)) {
    atomic_store(&s->capture_broken, true);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  return r != CUDA_SUCCESS ? r : fc_stream_sync(s);
}
FC_EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
  FC_TRACED(cuStreamSynchronize, stream_synchronize(hStream, false), hStream);
}
FC_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  FC_TRACED(cuStreamSynchronize_ptsz, stream_synchronize(hStream, true), hStream);
}

static CUresult stream_query(CUstream h, bool per_thread) {
  struct CUstream_st *s;
  CUresult r = fc_stream_resolve(h, per_thread, &s);
  return r != CUDA_SUCCESS ? r : fc_stream_query(s);
}
FC_EXPORT CUresult cuStreamQuery(CUstream hStream) { FC_TRACED(cuStreamQuery, stream_query(hStream, false), hStream); }
FC_EXPORT CUresult cuStreamQuery_ptsz(CUstream hStream) {
  FC_TRACED(cuStreamQuery_ptsz, stream_query(hStream, true), hStream);
}

static CUresult stream_is_capturing(CUstream h, CUstreamCaptureStatus *status, bool per_thread) {
  struct CUstream_st *s;
  CUresult r = fc_stream_resolve(h, per_thread, &s);
  if (r != CUDA_SUCCESS) return r;
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  *status = fc_capture_status(s);
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
  FC_TRACED(cuStreamIsCapturing, stream_is_capturing(hStream, captureStatus, false), hStream, captureStatus);
}
FC_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
  FC_TRACED(cuStreamIsCapturing_ptsz, stream_is_capturing(hStream, captureStatus, true), hStream, captureStatus);
}

FC_EXPORT void fakecuda_stream_set_capturing(CUstream h, bool on) {
  struct CUstream_st *s;
  if (fc_stream_resolve(h, false, &s) != CUDA_SUCCESS) return;
  if (on && !atomic_load(&s->capturing)) atomic_store(&s->capture_broken, false);
  atomic_store(&s->capturing, on);
}

FC_EXPORT void *fakecuda_stream_view(CUstream h, CUdeviceptr p) {
  struct CUstream_st *s;
  return fc_stream_resolve(h, false, &s) == CUDA_SUCCESS ? fc_device_view(s->ctx->dev, p) : NULL;
}

FC_EXPORT bool fakecuda_stream_capture_broken(CUstream h) {
  struct CUstream_st *s;
  return fc_stream_resolve(h, false, &s) == CUDA_SUCCESS && atomic_load(&s->capture_broken);
}
