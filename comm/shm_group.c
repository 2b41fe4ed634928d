#include "comm/shm_group.h"

#include <sched.h>
#include <string.h>
#include <time.h>

/* How often a waiter looks at its peers' processes: reading /proc costs microseconds. */
#define PSG_LIVENESS_PERIOD_S 0.05

double psg_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void psg_backoff(unsigned *round) {
  unsigned r = (*round)++;
  if (r < 64) return;
  if (r < 256) {
    sched_yield();
    return;
  }
  long ns = r < 1024 ? 20000L : 1000000L;
  struct timespec ts = {0, ns};
  nanosleep(&ts, NULL);
}

void psg_init(struct psg_group *g, int n) {
  g->n = n;
  atomic_store(&g->failed, 0);
}

bool psg_claim(struct psg_group *g, int self, int32_t *holder, bool *holder_alive) {
  struct psg_member *m = &g->m[self];
  struct psc_proc me = psc_proc_self();
  int32_t expected = 0;
  if (!atomic_compare_exchange_strong(&m->pid, &expected, me.pid)) {
    *holder = expected;
    *holder_alive = psc_proc_alive(expected, atomic_load(&m->start));
    return false;
  }
  atomic_store(&m->start, me.start);
  return true;
}

void psg_fail(struct psg_group *g, int self, const struct psg_failure *f) {
  /* A tiny lock-free "first writer wins": 1 = being written, 2 = readable. */
  uint32_t expected = 0;
  if (atomic_compare_exchange_strong(&g->failed, &expected, 1)) {
    g->failed_by = self;
    g->failure = *f;
    atomic_store_explicit(&g->failed, 2, memory_order_release);
  }
  /* After the record, so a waiter that sees `left` also sees that a failure exists; from
   * now on this member's exit is no death. */
  atomic_store(&g->m[self].left, 1);
}

struct psg_failure psg_recorded(struct psg_group *g, int *by) {
  struct psg_failure none = {PSG_OK, -1, 0};
  if (atomic_load_explicit(&g->failed, memory_order_acquire) != 2) return none;
  if (by) *by = g->failed_by;
  return g->failure;
}

struct psg_failure psg_check_alive(struct psg_group *g, int self, uint64_t below) {
  for (int i = 0; i < g->n; i++) {
    if (i == self || atomic_load(&g->m[i].seq) >= below || atomic_load(&g->m[i].left)) continue;
    int32_t pid = atomic_load(&g->m[i].pid);
    /* `left` again after the look: it may have left (then exited) while we looked */
    if (pid != 0 && !psc_proc_alive(pid, atomic_load(&g->m[i].start)) &&
        !atomic_load(&g->m[i].left))
      return (struct psg_failure){PSG_DEAD, i, pid};
  }
  return (struct psg_failure){PSG_OK, -1, 0};
}

bool psg_leave(struct psg_group *g, int self) {
  /* Flag, then look, both sequentially consistent (Dekker): members that died never leave,
   * so they count as gone. */
  atomic_store(&g->m[self].left, 1);
  for (int i = 0; i < g->n; i++) {
    int32_t pid = atomic_load(&g->m[i].pid);
    if (i != self && pid && !atomic_load(&g->m[i].left) &&
        psc_proc_alive(pid, atomic_load(&g->m[i].start)))
      return false;
  }
  return true;
}

/* The first member (other than self) that has not reached `seq`, or -1. */
static int first_lagging(struct psg_group *g, int self, uint64_t seq) {
  for (int i = 0; i < g->n; i++)
    if (i != self && atomic_load_explicit(&g->m[i].seq, memory_order_acquire) < seq) return i;
  return -1;
}

enum psg_result psg_barrier(struct psg_group *g, int self, double timeout_s,
                            struct psg_failure *f) {
  uint64_t seq = atomic_fetch_add_explicit(&g->m[self].seq, 1, memory_order_acq_rel) + 1;
  double start = psg_now(), next_check = start + PSG_LIVENESS_PERIOD_S;
  unsigned round = 0;
  int lag;
  while ((lag = first_lagging(g, self, seq)) >= 0) {
    struct psg_failure seen = psg_recorded(g, NULL);
    if (seen.kind != PSG_OK) {
      *f = seen; /* the original cause, as the member that saw it first described it */
      return f->kind;
    }
    double now = psg_now();
    if (now >= next_check) {
      next_check = now + PSG_LIVENESS_PERIOD_S;
      struct psg_failure dead = psg_check_alive(g, self, seq);
      if (dead.kind != PSG_OK) {
        *f = dead;
        psg_fail(g, self, f);
        return f->kind;
      }
      if (atomic_load(&g->m[lag].left) && atomic_load(&g->failed) == 0) {
        /* it left and will never come (one that gave up has already recorded why) */
        *f = (struct psg_failure){PSG_LEFT, lag, atomic_load(&g->m[lag].pid)};
        psg_fail(g, self, f);
        return f->kind;
      }
      if (now - start >= timeout_s) {
        *f = (struct psg_failure){PSG_TIMEOUT, lag, atomic_load(&g->m[lag].pid)};
        psg_fail(g, self, f);
        return f->kind;
      }
    }
    psg_backoff(&round);
  }
  return PSG_OK;
}
