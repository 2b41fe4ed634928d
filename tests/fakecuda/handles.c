/* Handle sets: the fake hands out pointers as handles (streams, events, kernels,
 * frames) and checks every handle an application passes back against the set of live
 * ones, so a stale or made-up handle gets CUDA_ERROR_INVALID_HANDLE instead of a crash
 * inside the fake. Linear scans: tests hold few handles. */
#include <stdlib.h>

#include "fakecuda_internal.h"

bool fc_handles_add(struct fc_handles *h, void *p) {
  bool ok = true;
  pthread_mutex_lock(&h->mu);
  if (h->n == h->cap) {
    size_t cap = h->cap ? h->cap * 2 : 16;
    void **v = realloc(h->v, cap * sizeof *v);
    if (v) {
      h->v = v;
      h->cap = cap;
    } else {
      ok = false;
    }
  }
  if (ok) h->v[h->n++] = p;
  pthread_mutex_unlock(&h->mu);
  return ok;
}

bool fc_handles_remove(struct fc_handles *h, void *p) {
  bool found = false;
  pthread_mutex_lock(&h->mu);
  for (size_t i = 0; i < h->n; i++) {
    if (h->v[i] == p) {
      h->v[i] = h->v[--h->n];
      found = true;
      break;
    }
  }
  pthread_mutex_unlock(&h->mu);
  return found;
}

bool fc_handles_has(struct fc_handles *h, const void *p) {
  bool found = false;
  if (!p) return false;
  pthread_mutex_lock(&h->mu);
  for (size_t i = 0; i < h->n && !found; i++) found = h->v[i] == p;
  pthread_mutex_unlock(&h->mu);
  return found;
}
