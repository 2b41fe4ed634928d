/* Marks: points in a stream's work that paging waits to see passed (an event recorded
 * there, shared by count among everything that waits on it): a launch's chunks, a move's
 * copy and the frame it copies out of. Called with the device's lock held. */
#include "allocator/allocator_internal.h"

#include <stdlib.h>

/* A mark recorded now on stream s, or NULL. */
struct psa_mark *psa_mark_new(struct device *d, CUstream s)
{
  struct psa_mark *m = d->free_marks;
  if (m)
    d->free_marks = m->next_free;
  else if (!(m = calloc(1, sizeof *m)))
    return NULL;
  *m = (struct psa_mark){.event = psa_event_get(d), .stream = s, .refs = 1};
  if (!m->event || PS_CU(ps_driver.cuEventRecord(m->event, s))) {
    psa_event_put(d, m->event);
    m->next_free = d->free_marks;
    d->free_marks = m;
    return NULL;
  }
  return m;
}

void psa_mark_put(struct device *d, struct psa_mark *m)
{
  if (!m || --m->refs)
    return;
  psa_event_put(d, m->event);
  m->next_free = d->free_marks;
  d->free_marks = m;
}

/* Whether the work before the mark has completed (sync: wait for it). */
bool psa_mark_passed(struct device *d, struct psa_mark *m, bool sync)
{
  if (m->done)
    return true;
  d->stats.event_queries += !sync;
  CUresult r = sync ? ps_driver.cuEventSynchronize(m->event) : ps_driver.cuEventQuery(m->event);
  if (r == CUDA_ERROR_NOT_READY)
    return false;
  if (r != CUDA_SUCCESS && !sync)
    PS_CU(ps_driver.cuEventSynchronize(m->event)); /* an error: be sure the work is over */
  m->done = true;
  return true;
}

/* Drops the chunk's marks that have passed; true when none is left (sync: wait for all). */
bool psa_users_passed(struct device *d, struct chunk *c, bool sync)
{
  for (uint32_t i = 0; i < c->nusers;)
    if (psa_mark_passed(d, c->users[i], sync)) {
      psa_mark_put(d, c->users[i]);
      c->users[i] = c->users[--c->nusers];
    } else {
      i++;
    }
  return c->nusers == 0;
}

/* Keeps launch mark m on the chunk. A later mark on the same stream stands for an earlier
 * one, except on the per-thread default stream, whose handle names a different stream on
 * every thread. */
void psa_mark_add_user(struct device *d, struct chunk *c, struct psa_mark *m)
{
  for (uint32_t i = 0; i < c->nusers; i++)
    if (c->users[i]->stream == m->stream && m->stream != CU_STREAM_PER_THREAD) {
      psa_mark_put(d, c->users[i]);
      c->users[i] = m;
      m->refs++;
      return;
    }
  if (c->nusers == PSA_USER_MARKS && !psa_users_passed(d, c, false) && c->nusers == PSA_USER_MARKS) {
    /* More streams at once than tracked (rare): wait for the oldest. */
    psa_mark_passed(d, c->users[0], true);
    psa_users_passed(d, c, false);
  }
  c->users[c->nusers++] = m;
  m->refs++;
}
