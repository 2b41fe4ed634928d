/* Stream capture, with the rules CUDA documents (cuStreamBeginCapture,
 * cuThreadExchangeStreamCaptureMode, cuStreamIsCapturing, the programming guide's
 * "prohibited and unhandled operations"), so that a call psshim makes at the wrong moment
 * fails here as it would on a GPU:
 * - Work queued on a capturing stream is recorded, not run; cuStreamEndCapture returns it
 *   as a graph, and each cuGraphLaunch of an instance queues a copy of it, in the order it
 *   was captured. A stream that waits for an event recorded in a capture joins that capture.
 * - A call that conflicts with any capture fails in every mode and invalidates the captures
 *   concerned: synchronizing or querying a capturing stream, synchronizing the context of
 *   one, querying or waiting for an event recorded in a capture (CAPTURED_EVENT), any use of
 *   the legacy stream while a blocking stream of its context captures (IMPLICIT).
 * - A potentially unsafe call (synchronous allocation and free, VMM create/release/map/unmap/
 *   access, event and stream queries and synchronization, synchronous copies and memsets)
 *   is refused with STREAM_CAPTURE_UNSUPPORTED, invalidating the captures that forbid it,
 *   when the calling thread's mode is not RELAXED and either the thread has a capture of its
 *   own not begun RELAXED, or its mode is GLOBAL and another thread has a GLOBAL capture.
 *   Which calls CUDA counts as unsafe is not listed anywhere; the set here errs on the
 *   strict side, so code that passes here passes on a GPU.
 * - Work queued on an invalidated capture fails with INVALIDATED; ending it returns
 *   INVALIDATED and no graph. A capture not begun RELAXED must end on its thread
 *   (WRONG_THREAD); ending a stream that did not begin one is UNMATCHED.
 * Not modelled: graph memory nodes (cuMemFreeAsync on a capturing stream is NOT_SUPPORTED;
 * cuMemAllocAsync there allocates at once), unjoined forks, graph editing. */
#include <stdlib.h>
#include <string.h>

#include "fakecuda_internal.h"

struct fc_capture {
  uint64_t id;
  CUstreamCaptureMode mode;
  pthread_t thread; /* the thread that began it */
  struct CUstream_st *origin;
  bool invalidated;
  struct CUstream_st **members; /* the origin and the streams that joined */
  size_t nmembers, cap_members;
  struct fc_op **ops; /* captured work, in the order it was queued */
  size_t nops, cap_ops;
  struct fc_capture *next; /* in `underway` */
};

struct CUgraph_st {
  struct fc_op **ops;
  size_t nops;
};
struct CUgraphExec_st {
  struct CUgraph_st g; /* its own copy of the graph's work */
};

static pthread_mutex_t cap_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fc_capture *underway; /* cap_mu */
static atomic_int nunderway;        /* fast path: no capture, no rule to check */
static uint64_t next_id;            /* cap_mu */
static _Thread_local CUstreamCaptureMode thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static struct fc_handles graphs = FC_HANDLES_INIT, execs = FC_HANDLES_INIT;

/* ---- captures ---- */

static bool grow(void **v, size_t *cap, size_t n, size_t elem) {
  if (n < *cap) return true;
  size_t c = *cap ? 2 * *cap : 16;
  void *p = realloc(*v, c * elem);
  if (!p) return false;
  *v = p;
  *cap = c;
  return true;
}

static bool invalid(const struct fc_capture *c) {
  if (c->invalidated) return true;
  for (size_t i = 0; i < c->nmembers; i++)
    if (atomic_load(&c->members[i]->capture_broken)) return true;
  return false;
}

static void invalidate(struct fc_capture *c) {
  c->invalidated = true;
  for (size_t i = 0; i < c->nmembers; i++) atomic_store(&c->members[i]->capture_broken, true);
}

static bool join(struct fc_capture *c, struct CUstream_st *s) {
  if (!grow((void **)&c->members, &c->cap_members, c->nmembers, sizeof *c->members)) return false;
  c->members[c->nmembers++] = s;
  s->cap = c;
  atomic_store(&s->capture_broken, false);
  atomic_store(&s->capturing, true);
  return true;
}

static bool blocking_in(const struct fc_capture *c, const struct CUctx_st *ctx) {
  for (size_t i = 0; i < c->nmembers; i++)
    if (c->members[i]->ctx == ctx && !(c->members[i]->flags & CU_STREAM_NON_BLOCKING)) return true;
  return false;
}

static bool in_ctx(const struct fc_capture *c, const struct CUctx_st *ctx) {
  for (size_t i = 0; i < c->nmembers; i++)
    if (c->members[i]->ctx == ctx) return true;
  return false;
}

/* Invalidates the captures that `which` selects; returns how many (cap_mu held). */
static int invalidate_where(bool (*which)(const struct fc_capture *, const void *), const void *arg) {
  int n = 0;
  for (struct fc_capture *c = underway; c; c = c->next)
    if (which(c, arg)) {
      invalidate(c);
      n++;
    }
  return n;
}

static bool has_blocking(const struct fc_capture *c, const void *ctx) { return blocking_in(c, ctx); }
static bool has_stream_of(const struct fc_capture *c, const void *ctx) { return in_ctx(c, ctx); }

/* Whether capture c forbids this thread's potentially unsafe calls. */
static bool forbids(const struct fc_capture *c, const void *unused) {
  (void)unused;
  if (thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED || c->mode == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
  if (pthread_equal(c->thread, pthread_self())) return true;
  return c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL && thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
}

/* ---- the gate every traced entry point passes first ---- */

static bool unsafe(int cbid) {
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost:
    case CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc:
    case CUPTI_DRIVER_TRACE_CBID_cuMemCreate:
    case CUPTI_DRIVER_TRACE_CBID_cuMemRelease:
    case CUPTI_DRIVER_TRACE_CBID_cuMemMap:
    case CUPTI_DRIVER_TRACE_CBID_cuMemUnmap:
    case CUPTI_DRIVER_TRACE_CBID_cuMemSetAccess:
    case CUPTI_DRIVER_TRACE_CBID_cuEventQuery:
    case CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamQuery:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamQuery_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpy:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpy_ptds:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2_ptds:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2_ptds:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2_ptds:
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2_ptds:
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2_ptds:
      return true;
    default:
      return false;
  }
}

/* The stream a query names, for the rules on capturing and legacy streams; NULL if none. */
static struct CUstream_st *queried_stream(int cbid, const void *params) {
  CUstream h;
  bool per_thread = false;
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuStreamQuery_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamIsCapturing_ptsz:
      per_thread = true;
      /* fall through */
    case CUPTI_DRIVER_TRACE_CBID_cuStreamQuery:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamIsCapturing:
      h = ((const cuStreamQuery_params *)params)->hStream; /* hStream comes first in each */
      break;
    default:
      return NULL;
  }
  struct CUstream_st *s;
  return fc_stream_resolve(h, per_thread, &s) == CUDA_SUCCESS ? s : NULL;
}

CUresult fc_capture_gate(int cbid, const void *params) {
  if (!atomic_load(&nunderway)) return CUDA_SUCCESS;
  CUresult r = CUDA_SUCCESS;
  struct CUstream_st *s = params ? queried_stream(cbid, params) : NULL;
  bool is_capturing = cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamIsCapturing ||
                      cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamIsCapturing_ptsz;
  struct CUctx_st *ctx = NULL;
  pthread_mutex_lock(&cap_mu);
  if (s && s->kind == FC_STREAM_LEGACY) {
    /* The legacy stream stands for every blocking stream of its context. Asking whether
     * it captures is an error that invalidates nothing; using it invalidates. */
    bool implicit = false;
    for (struct fc_capture *c = underway; c && !implicit; c = c->next) implicit = blocking_in(c, s->ctx);
    if (implicit && !is_capturing) invalidate_where(has_blocking, s->ctx);
    if (implicit) r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  } else if (s && s->cap && !is_capturing) {
    invalidate(s->cap);
    r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (r == CUDA_SUCCESS && (cbid == CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize ||
                            cbid == CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize_v2) &&
      fc_current_ctx(&ctx) == CUDA_SUCCESS && invalidate_where(has_stream_of, ctx))
    r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (r == CUDA_SUCCESS && unsafe(cbid) && invalidate_where(forbids, NULL))
    r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  pthread_mutex_unlock(&cap_mu);
  return r;
}

/* ---- queueing on a capturing stream ---- */

bool fc_capture_enqueue(struct CUstream_st *s, struct fc_op *op, CUresult *r) {
  if (!atomic_load(&nunderway)) return false;
  pthread_mutex_lock(&cap_mu);
  struct fc_capture *c = s->cap;
  bool taken = c != NULL;
  *r = CUDA_SUCCESS;
  if (!c) {
    if (s->kind == FC_STREAM_LEGACY && invalidate_where(has_blocking, s->ctx)) {
      taken = true;
      *r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
  } else if (invalid(c)) {
    *r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  } else if (op->kind == FC_OP_FREE) {
    *r = CUDA_ERROR_NOT_SUPPORTED; /* graph memory nodes are not modelled */
  } else if (op->kind == FC_OP_COPY || op->kind == FC_OP_MEMSET || op->kind == FC_OP_KERNEL) {
    if (grow((void **)&c->ops, &c->cap_ops, c->nops, sizeof *c->ops)) {
      c->ops[c->nops++] = op;
      op = NULL;
    } else {
      *r = CUDA_ERROR_OUT_OF_MEMORY;
    }
  } else if (op->kind == FC_OP_RECORD) {
    /* An event recorded in a capture orders the graph's nodes; nothing waits for it on the
     * host (that is an error), so it never holds a stream back. */
    pthread_mutex_lock(&fc_sig_mu);
    op->u.signal.sig->done = true;
    pthread_mutex_unlock(&fc_sig_mu);
  } /* waits inside the capture: the graph keeps the order in which work was queued */
  pthread_mutex_unlock(&cap_mu);
  if (taken && op) fc_op_discard(op);
  return taken;
}

CUresult fc_capture_wait(struct CUstream_st *s, struct CUstream_st *recorded_in) {
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&cap_mu);
  struct fc_capture *c = recorded_in ? recorded_in->cap : NULL;
  if (!atomic_load(&s->capturing)) {
    if (c && !join(c, s)) r = CUDA_ERROR_OUT_OF_MEMORY; /* a fork: s joins the capture */
  } else if (recorded_in != s && (!c || c != s->cap)) {
    /* Recorded outside this capture: in another one, or outside any. */
    if (s->cap) invalidate(s->cap);
    atomic_store(&s->capture_broken, true);
    r = c ? CUDA_ERROR_STREAM_CAPTURE_MERGE : CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  }
  pthread_mutex_unlock(&cap_mu);
  return r;
}

CUstreamCaptureStatus fc_capture_status(struct CUstream_st *s) {
  if (!atomic_load(&s->capturing)) return CU_STREAM_CAPTURE_STATUS_NONE;
  pthread_mutex_lock(&cap_mu);
  bool bad = s->cap ? invalid(s->cap) : atomic_load(&s->capture_broken);
  pthread_mutex_unlock(&cap_mu);
  return bad ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

/* ---- entry points ---- */

static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, bool per_thread) {
  struct CUstream_st *s;
  CUresult r = fc_stream_resolve(h, per_thread, &s);
  if (r != CUDA_SUCCESS) return r;
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  if (s->kind == FC_STREAM_LEGACY) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  struct fc_capture *c = calloc(1, sizeof *c);
  if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
  c->mode = mode;
  c->thread = pthread_self();
  c->origin = s;
  pthread_mutex_lock(&cap_mu);
  if (atomic_load(&s->capturing)) {
    r = CUDA_ERROR_ILLEGAL_STATE;
  } else if (!join(c, s)) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    c->id = ++next_id;
    c->next = underway;
    underway = c;
    atomic_fetch_add(&nunderway, 1);
  }
  pthread_mutex_unlock(&cap_mu);
  if (r != CUDA_SUCCESS) {
    free(c->members);
    free(c);
  }
  return r;
}
FC_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  FC_TRACED(cuStreamBeginCapture_v2, begin_capture(hStream, mode, false), hStream, mode);
}
FC_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  FC_TRACED(cuStreamBeginCapture_v2_ptsz, begin_capture(hStream, mode, true), hStream, mode);
}

static void free_ops(struct fc_op **ops, size_t n) {
  for (size_t i = 0; i < n; i++) fc_op_discard(ops[i]);
  free(ops);
}

static CUresult end_capture(CUstream h, CUgraph *out, bool per_thread) {
  struct CUstream_st *s;
  CUresult r = fc_stream_resolve(h, per_thread, &s);
  if (r != CUDA_SUCCESS) return r;
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&cap_mu);
  struct fc_capture *c = s->cap;
  if (!c || c->origin != s) {
    pthread_mutex_unlock(&cap_mu);
    return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  }
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self())) {
    pthread_mutex_unlock(&cap_mu);
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  for (struct fc_capture **pp = &underway; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  atomic_fetch_sub(&nunderway, 1);
  bool bad = invalid(c);
  for (size_t i = 0; i < c->nmembers; i++) {
    c->members[i]->cap = NULL;
    atomic_store(&c->members[i]->capturing, false);
    atomic_store(&c->members[i]->capture_broken, false);
  }
  pthread_mutex_unlock(&cap_mu);
  free(c->members);
  struct CUgraph_st *g = bad ? NULL : malloc(sizeof *g);
  if (g) {
    *g = (struct CUgraph_st){c->ops, c->nops};
    if (!fc_handles_add(&graphs, g)) {
      free(g);
      g = NULL;
    }
  }
  if (!g) free_ops(c->ops, c->nops);
  free(c);
  *out = g;
  return bad ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : g ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
FC_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
  FC_TRACED(cuStreamEndCapture, end_capture(hStream, phGraph, false), hStream, phGraph);
}
FC_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) {
  FC_TRACED(cuStreamEndCapture_ptsz, end_capture(hStream, phGraph, true), hStream, phGraph);
}

static CUresult capture_info(CUstream h, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                             const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps,
                             bool per_thread) {
  struct CUstream_st *s;
  CUresult r = fc_stream_resolve(h, per_thread, &s);
  if (r != CUDA_SUCCESS) return r;
  if (!status || (edges && !deps)) return CUDA_ERROR_INVALID_VALUE;
  *status = fc_capture_status(s);
  pthread_mutex_lock(&cap_mu);
  if (id) *id = s->cap ? s->cap->id : 0;
  pthread_mutex_unlock(&cap_mu);
  if (graph) *graph = NULL; /* the graph being built is not exposed */
  if (deps) *deps = NULL;
  if (edges) *edges = NULL;
  if (ndeps) *ndeps = 0;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                             cuuint64_t *id_out, CUgraph *graph_out,
                                             const CUgraphNode **dependencies_out,
                                             const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out) {
  FC_TRACED(cuStreamGetCaptureInfo_v3,
            capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                         numDependencies_out, false),
            hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out, numDependencies_out);
}
FC_EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                                  cuuint64_t *id_out, CUgraph *graph_out,
                                                  const CUgraphNode **dependencies_out,
                                                  const CUgraphEdgeData **edgeData_out,
                                                  size_t *numDependencies_out) {
  FC_TRACED(cuStreamGetCaptureInfo_v3_ptsz,
            capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                         numDependencies_out, true),
            hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out, numDependencies_out);
}

static CUresult exchange_mode(CUstreamCaptureMode *mode) {
  if (!mode || (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
                *mode != CU_STREAM_CAPTURE_MODE_RELAXED))
    return CUDA_ERROR_INVALID_VALUE;
  CUstreamCaptureMode old = thread_mode;
  thread_mode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  FC_TRACED(cuThreadExchangeStreamCaptureMode, exchange_mode(mode), mode);
}

/* ---- graphs: a list of work, replayed in order ---- */

/* A copy of op. An op may point into its own allocation (a kernel's argument array and
 * parameter buffer follow it): every aligned word of the copy whose value lies inside the
 * original is moved by the same distance, whatever the layout of the kind. */
static struct fc_op *clone_op(const struct fc_op *op) {
  struct fc_op *n = malloc(op->size);
  if (!n) return NULL;
  memcpy(n, op, op->size);
  n->next = NULL;
  uintptr_t lo = (uintptr_t)op, hi = lo + op->size, delta = (uintptr_t)n - lo;
  for (size_t at = 0; at + sizeof(uintptr_t) <= op->size; at += sizeof(uintptr_t)) {
    uintptr_t w;
    memcpy(&w, (char *)n + at, sizeof w);
    if (w >= lo && w < hi) {
      w += delta;
      memcpy((char *)n + at, &w, sizeof w);
    }
  }
  return n;
}

static CUresult instantiate(CUgraphExec *out, CUgraph g, unsigned long long flags) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!out || flags) return CUDA_ERROR_INVALID_VALUE;
  if (!fc_handles_has(&graphs, g)) return CUDA_ERROR_INVALID_HANDLE;
  struct CUgraphExec_st *e = calloc(1, sizeof *e);
  if (!e || (g->nops && !(e->g.ops = calloc(g->nops, sizeof *e->g.ops)))) {
    free(e);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  for (; e->g.nops < g->nops; e->g.nops++)
    if (!(e->g.ops[e->g.nops] = clone_op(g->ops[e->g.nops]))) break;
  if (e->g.nops < g->nops || !fc_handles_add(&execs, e)) {
    free_ops(e->g.ops, e->g.nops);
    free(e);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *out = e;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
  FC_TRACED(cuGraphInstantiateWithFlags, instantiate(phGraphExec, hGraph, flags), phGraphExec, hGraph, flags);
}

static CUresult graph_launch(CUgraphExec e, CUstream h, bool per_thread) {
  struct CUstream_st *s;
  CUresult r = fc_check_init();
  if (r == CUDA_SUCCESS && !fc_handles_has(&execs, e)) r = CUDA_ERROR_INVALID_HANDLE;
  if (r == CUDA_SUCCESS) r = fc_stream_resolve(h, per_thread, &s);
  for (size_t i = 0; r == CUDA_SUCCESS && i < e->g.nops; i++) {
    struct fc_op *op = clone_op(e->g.ops[i]);
    uint64_t seq;
    r = op ? fc_enqueue(s, op, &seq) : CUDA_ERROR_OUT_OF_MEMORY;
  }
  return r;
}
FC_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  FC_TRACED(cuGraphLaunch, graph_launch(hGraphExec, hStream, false), hGraphExec, hStream);
}
FC_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  FC_TRACED(cuGraphLaunch_ptsz, graph_launch(hGraphExec, hStream, true), hGraphExec, hStream);
}

static CUresult graph_destroy(CUgraph g) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!fc_handles_remove(&graphs, g)) return CUDA_ERROR_INVALID_VALUE;
  free_ops(g->ops, g->nops);
  free(g);
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) { FC_TRACED(cuGraphDestroy, graph_destroy(hGraph), hGraph); }

/* Work already queued from the instance keeps its own copies. */
static CUresult exec_destroy(CUgraphExec e) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!fc_handles_remove(&execs, e)) return CUDA_ERROR_INVALID_VALUE;
  free_ops(e->g.ops, e->g.nops);
  free(e);
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  FC_TRACED(cuGraphExecDestroy, exec_destroy(hGraphExec), hGraphExec);
}
