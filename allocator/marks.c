/* Marks: points in a stream's work (an event recorded behind a launch or a move's copy),
 * counted by everything that waits for them to pass. A chunk keeps the marks of the launches
 * that touched it, one per stream (its users), and the mark of its last move's copy: it may
 * move, or be reused, only once they have passed. */
#include "allocator/space.h"

#include <stdlib.h>
#include <string.h>

struct psa_mark *psa_mark_new(struct device *d, CUstream s)
{
  struct psa_mark *m = d->marks.free;
  if (m)
    d->marks.free = m->next_free;
  else if (!(m = calloc(1, sizeof *m)))
    return NULL;
  *m = (struct psa_mark){.event = psa_event_get(d), .stream = s, .refs = 1};
  if (!m->event || PS_CU(ps_driver.cuEventRecord(m->event, s))) {
    psa_event_put(d, m->event);
    m->next_free = d->marks.free;
    d->marks.free = m;
    return NULL;
  }
  return m;
}

void psa_mark_put(struct device *d, struct psa_mark *m)
{
  if (!m || --m->refs)
    return;
  psa_event_put(d, m->event);
  m->next_free = d->marks.free;
  d->marks.free = m;
}

#ifdef PS_CHECKS
void psa_marks_check(struct device *d)
{
  for (const struct psa_mark *m = d->marks.free; m; m = m->next_free)
    if (m->refs)
      ps_check_failed("a mark on the free list still has %u references", m->refs);
  for (uint64_t i = 0; i < d->space.chunks_high; i++) {
    const struct chunk *c = &d->chunks[i];
    if (c->nusers > PSA_USER_MARKS)
      ps_check_failed("chunk %llu keeps %u marks, more than %d", (unsigned long long)i, c->nusers, PSA_USER_MARKS);
    for (uint32_t k = 0; k < c->nusers; k++) {
      if (!c->users[k] || !c->users[k]->refs)
        ps_check_failed("chunk %llu keeps a mark that was let go", (unsigned long long)i);
      for (uint32_t j = 0; j < k; j++)
        if (c->users[j]->stream == c->users[k]->stream && c->users[k]->stream != CU_STREAM_PER_THREAD)
          ps_check_failed("chunk %llu keeps two marks of one stream", (unsigned long long)i);
    }
    if (c->copy && !c->copy->refs)
      ps_check_failed("chunk %llu keeps a copy mark that was let go", (unsigned long long)i);
  }
  for (uint32_t k = 0; k < d->marks.ncopying; k++)
    if (!d->chunks[d->marks.copying[k]].copy)
      ps_check_failed("chunk %llu is listed as copying with no copy mark", (unsigned long long)d->marks.copying[k]);
}
#endif

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
void psa_add_user(struct device *d, struct chunk *c, struct psa_mark *m)
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

/* A span deleted (spans.c) is idle: its frees' events have passed, and with them the work
 * its chunks' marks stand for. Their last use is forgotten too: the chunks will hold other data. */
void psa_span_forget_users(struct device *d, struct span *s)
{
  for (uint64_t i = s->first_chunk; i < s->first_chunk + s->nchunks; i++) {
    struct chunk *c = &d->chunks[i];
    while (c->nusers)
      psa_mark_put(d, c->users[--c->nusers]);
    c->last_use = 0;
  }
}

/* Waits for the work before mark m with d->lock dropped, so that the device's other
 * threads go on meanwhile (a launch, or the owner, that wants the lock would wait out a
 * copy queued behind others); the reference taken keeps m. */
CUresult psa_mark_wait_unlocked(struct device *d, struct psa_mark *m)
{
  PSA_HELD(d);
  m->refs++;
  ps_mutex_unlock(&d->lock);
  CUresult r = ps_driver.cuEventSynchronize(m->event);
  ps_mutex_lock(&d->lock);
  m->done = m->done || r == CUDA_SUCCESS;
  psa_mark_put(d, m);
  return r;
}

bool psa_copy_done(struct device *d, uint64_t chunk, bool sync)
{
  struct chunk *c = &d->chunks[chunk];
  if (!c->copy)
    return true; /* SETTLED, or REMAPPING with no copy queued yet */
  if (!psa_mark_passed(d, c->copy, sync))
    return false;
  psa_mark_put(d, c->copy);
  c->copy = NULL;
  if (c->move == PSA_COPYING)
    c->move = PSA_SETTLED;
  for (uint32_t i = 0; i < d->marks.ncopying; i++)
    if (d->marks.copying[i] == chunk) {
      d->marks.copying[i] = d->marks.copying[--d->marks.ncopying];
      break;
    }
  return true;
}
