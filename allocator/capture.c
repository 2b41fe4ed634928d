/* CUDA graph capture: what psshim may do while a stream of the process captures.
 *
 * Work queued on a capturing stream is recorded into a graph, not run, and replayed later
 * at the same addresses. CUDA refuses, and invalidates the capture (the program's graph
 * dies with it), any call that conflicts with it: synchronizing the context or a capturing
 * stream, querying an event recorded in the capture, using the legacy stream beside a
 * capturing blocking stream. In the GLOBAL and THREAD_LOCAL modes it refuses "potentially
 * unsafe" calls too (synchronous allocation, VMM calls, event queries) on the capturing
 * thread, and in GLOBAL mode on every thread. So:
 * - psshim's own calls run in RELAXED mode while a capture may be underway (the thread's
 *   mode is swapped back and forth, as cuThreadExchangeStreamCaptureMode asks callers to
 *   do); its frame pool thread runs in RELAXED mode for good;
 * - it records no event on a capturing stream and never synchronizes the context while a
 *   capture is known to be underway (frees that would wait wait until none is);
 * - memory the graph names stays the graph's, as CUDA's graph memory nodes do: an
 *   allocation made in a capture, and any free made in one, leaves its bytes held by that
 *   capture; only later allocations of the same capture on the same stream reuse them
 *   (they run after the free in the graph's own order), nothing else ever does, since the
 *   graph may be replayed at any time (psshim does not follow graphs to their destruction).
 * Captures are counted by the doors that begin and end them (shim/); a capture begun where
 * psshim has no door still shows on the stream of each allocation and free. */
#include "allocator/space.h"

static _Atomic int captures; /* begun minus ended, through the doors */

void psa_capture_begun(void) { atomic_fetch_add(&captures, 1); }

void psa_capture_ended(void)
{
  int n = atomic_load(&captures);
  while (n > 0 && !atomic_compare_exchange_weak(&captures, &n, n - 1))
    ;
}

bool psa_capture_underway(void) { return atomic_load(&captures) > 0; }

uint64_t psa_stream_capture(CUstream stream)
{
  if (stream == PSA_SYNC_STREAM)
    return 0;
  /* Asked on every launch, allocation and free: the plain query first, the capture's id
   * only for a stream that captures (bench/capture_query.c times both). */
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (ps_driver.cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS)
    return PSA_CAPTURE_UNKNOWN; /* the legacy stream beside a capturing blocking stream (IMPLICIT) */
  if (status == CU_STREAM_CAPTURE_STATUS_NONE)
    return 0;
  cuuint64_t id = 0;
  if (!ps_driver.cuStreamGetCaptureInfo_v3 ||
      ps_driver.cuStreamGetCaptureInfo_v3(stream, &status, &id, NULL, NULL, NULL, NULL) != CUDA_SUCCESS)
    return PSA_CAPTURE_UNKNOWN;
  return id && id < PSA_CAPTURE_UNKNOWN ? id : PSA_CAPTURE_UNKNOWN;
}

struct psa_relaxed psa_relax(bool capture)
{
  struct psa_relaxed r = {.mode = CU_STREAM_CAPTURE_MODE_RELAXED};
  r.on = capture && ps_driver.cuThreadExchangeStreamCaptureMode &&
         ps_driver.cuThreadExchangeStreamCaptureMode(&r.mode) == CUDA_SUCCESS;
  return r;
}

void psa_unrelax(struct psa_relaxed *r)
{
  if (r->on)
    ps_driver.cuThreadExchangeStreamCaptureMode(&r->mode);
}

static PS_THREAD_LOCAL uint64_t placing; /* the capture of the allocation this thread places */

void psa_placing_capture(uint64_t capture) { placing = capture; }

CUstream psa_stream_key(CUstream stream)
{
  static _Atomic uint64_t threads;
  static PS_THREAD_LOCAL uint64_t thread; /* never reused, unlike a dead thread's id */
  if (stream != CU_STREAM_PER_THREAD)
    return stream;
  if (!thread)
    thread = atomic_fetch_add(&threads, 1) + 1;
  return (CUstream)(uintptr_t)(0xFFF0000000000000ull | thread); /* no pointer, no handle psshim names */
}

bool psa_range_usable(const struct range *r, CUstream stream)
{
  stream = psa_stream_key(stream);
  if (r->graph) /* the graph's: only later work of its own capture, on the same stream */
    return r->graph == placing && placing < PSA_CAPTURE_UNKNOWN && r->stream == stream;
  /* Outside the capture the stream's pending frees are ordered before what it queues;
   * the graph may be replayed on any stream, so it must wait for them like any stream. */
  return !r->pending || (r->stream == stream && !placing);
}
