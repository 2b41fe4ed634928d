/* Events. Each cuEventRecord makes a new signal that the record's stream completes when
 * it reaches it; the event points at its latest signal. Queries and waits capture the
 * signal current at call time, so re-recording an event never changes what an earlier
 * cuStreamWaitEvent waits for (CUDA semantics), and destroying an event or a stream
 * never frees a signal someone still waits on (signals are reference counted). */
#include <stdlib.h>

#include "fakecuda_internal.h"

struct CUevent_st {
  unsigned flags;
  struct fc_signal *sig; /* latest record, NULL if never recorded (fc_sig_mu) */
  _Atomic(struct CUstream_st *) captured; /* the capturing stream it was last recorded in */
};

/* A host wait or query on an event recorded in a capture: an error, and CUDA invalidates
 * the capture. */
static bool captured(struct CUevent_st *e) {
  struct CUstream_st *s = atomic_load(&e->captured);
  if (s) atomic_store(&s->capture_broken, true);
  return s != NULL;
}
static struct fc_handles event_handles = FC_HANDLES_INIT;

/* The event's latest signal with a reference taken, or NULL if never recorded. */
static struct fc_signal *latest(struct CUevent_st *e) {
  pthread_mutex_lock(&fc_sig_mu);
  struct fc_signal *s = e->sig;
  if (s) atomic_fetch_add(&s->refs, 1);
  pthread_mutex_unlock(&fc_sig_mu);
  return s;
}

static CUresult check_event(CUevent e) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  return fc_handles_has(&event_handles, e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult event_create(CUevent *ph, unsigned flags) {
  struct CUctx_st *c;
  CUresult r = fc_current_ctx(&c);
  if (r != CUDA_SUCCESS) return r;
  if (!ph || (flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS)))
    return CUDA_ERROR_INVALID_VALUE;
  if (flags & CU_EVENT_INTERPROCESS) return CUDA_ERROR_NOT_SUPPORTED;
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
  e->flags = flags;
  if (!fc_handles_add(&event_handles, e)) {
    free(e);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *ph = e;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
  FC_TRACED(cuEventCreate, event_create(phEvent, Flags), phEvent, Flags);
}

/* Returns at once even if a record is pending; the signal outlives the event. */
static CUresult event_destroy(CUevent e) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!fc_handles_remove(&event_handles, e)) return CUDA_ERROR_INVALID_HANDLE;
  fc_signal_unref(e->sig);
  free(e);
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) { FC_TRACED(cuEventDestroy_v2, event_destroy(hEvent), hEvent); }
FC_EXPORT CUresult fc_cuEventDestroy_v1(CUevent hEvent) { FC_TRACED(cuEventDestroy, event_destroy(hEvent), hEvent); }

static CUresult event_record(CUevent e, CUstream h, bool per_thread) {
  struct CUstream_st *s;
  CUresult r = check_event(e);
  if (r == CUDA_SUCCESS) r = fc_stream_resolve(h, per_thread, &s);
  if (r != CUDA_SUCCESS) return r;
  atomic_store(&e->captured, atomic_load(&s->capturing) ? s : NULL);
  struct fc_signal *sig = fc_signal_new();
  struct fc_op *op = fc_op_new(FC_OP_RECORD, 0);
  if (!sig || !op) {
    free(sig);
    free(op);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  atomic_fetch_add(&sig->refs, 1); /* one for the op, one for the event */
  op->u.signal.sig = sig;
  uint64_t seq;
  r = fc_enqueue(s, op, &seq);
  if (r != CUDA_SUCCESS) {
    fc_signal_unref(sig);
    return r;
  }
  pthread_mutex_lock(&fc_sig_mu);
  struct fc_signal *old = e->sig;
  e->sig = sig;
  pthread_mutex_unlock(&fc_sig_mu);
  fc_signal_unref(old);
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  FC_TRACED(cuEventRecord, event_record(hEvent, hStream, false), hEvent, hStream);
}
FC_EXPORT CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  FC_TRACED(cuEventRecord_ptsz, event_record(hEvent, hStream, true), hEvent, hStream);
}

static CUresult event_query(CUevent e) {
  CUresult r = check_event(e);
  if (r != CUDA_SUCCESS) return r;
  if (captured(e)) return CUDA_ERROR_CAPTURED_EVENT;
  pthread_mutex_lock(&fc_sig_mu);
  bool done = !e->sig || e->sig->done;
  pthread_mutex_unlock(&fc_sig_mu);
  return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
FC_EXPORT CUresult cuEventQuery(CUevent hEvent) { FC_TRACED(cuEventQuery, event_query(hEvent), hEvent); }

static CUresult event_synchronize(CUevent e) {
  CUresult r = check_event(e);
  if (r != CUDA_SUCCESS) return r;
  if (captured(e)) return CUDA_ERROR_CAPTURED_EVENT;
  struct fc_signal *s = latest(e);
  if (s) {
    fc_signal_wait(s);
    fc_signal_unref(s);
  }
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
  FC_TRACED(cuEventSynchronize, event_synchronize(hEvent), hEvent);
}

static CUresult elapsed_time(float *ms, CUevent start, CUevent end) {
  CUresult r = check_event(start);
  if (r == CUDA_SUCCESS) r = check_event(end);
  if (r != CUDA_SUCCESS) return r;
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  if ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&fc_sig_mu);
  struct fc_signal *a = start->sig, *b = end->sig;
  if (!a || !b) {
    r = CUDA_ERROR_INVALID_HANDLE; /* never recorded */
  } else if (!a->done || !b->done) {
    r = CUDA_ERROR_NOT_READY;
  } else {
    *ms = (float)((double)(b->when.tv_sec - a->when.tv_sec) * 1e3 +
                  (double)(b->when.tv_nsec - a->when.tv_nsec) / 1e6);
  }
  pthread_mutex_unlock(&fc_sig_mu);
  return r;
}
FC_EXPORT CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
  FC_TRACED(cuEventElapsedTime_v2, elapsed_time(pMilliseconds, hStart, hEnd), pMilliseconds, hStart, hEnd);
}
FC_EXPORT CUresult fc_cuEventElapsedTime_v1(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
  FC_TRACED(cuEventElapsedTime, elapsed_time(pMilliseconds, hStart, hEnd), pMilliseconds, hStart, hEnd);
}

/* Work queued on the stream after this waits for the event's latest record as of now. */
static CUresult stream_wait_event(CUstream h, CUevent e, unsigned flags, bool per_thread) {
  struct CUstream_st *s;
  CUresult r = check_event(e);
  if (r == CUDA_SUCCESS) r = fc_stream_resolve(h, per_thread, &s);
  if (r != CUDA_SUCCESS) return r;
  if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL) return CUDA_ERROR_INVALID_VALUE;
  r = fc_capture_wait(s, atomic_load(&e->captured));
  if (r != CUDA_SUCCESS) return r;
  struct fc_signal *sig = latest(e);
  if (!sig) return CUDA_SUCCESS; /* never recorded: nothing to wait for */
  struct fc_op *op = fc_op_new(FC_OP_WAIT_SIGNAL, 0);
  if (!op) {
    fc_signal_unref(sig);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  op->u.signal.sig = sig;
  uint64_t seq;
  return fc_enqueue(s, op, &seq);
}
FC_EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  FC_TRACED(cuStreamWaitEvent, stream_wait_event(hStream, hEvent, Flags, false), hStream, hEvent, Flags);
}
FC_EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  FC_TRACED(cuStreamWaitEvent_ptsz, stream_wait_event(hStream, hEvent, Flags, true), hStream, hEvent, Flags);
}
