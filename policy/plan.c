/* The plan: which chunk is on the GPU at each moment of an iteration that repeats, and
 * when to issue the copies that put it there.
 *
 * Three steps. Which moves: OPT demand paging over one iteration that ends with the
 * chunks it began with (a closing step after the last moment fetches the start placement
 * back and evicts the rest), so the plan repeats as it is. With equal chunk sizes OPT is
 * optimal for a given start; the start is the placement OPT itself reaches after a few
 * iterations from a cold start (tests/unit/test_plan.c finds no cyclic placement that
 * copies fewer chunks in). When: each eviction right after the chunk's last use before
 * it, each fetch as early as the frames left free over the moments up to its use allow,
 * the fetch needed first choosing first. How long: a replay of the moments against the
 * two copy engines. With a lag (the host running ahead of the GPU), a chunk stays busy
 * that many moments after each use: OPT picks victims among the chunks that have quieted,
 * a busy chunk is not fetched (read in place), and each move waits for its chunk to quiet. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "policy/internal.h"

enum { WARM = 3, REPLAYS = 3, DIRT_ROUNDS = 4 }; /* iterations: to warm OPT up, to replay, to agree on dirt */

/* A move where demand paging made it, before it is moved earlier. */
typedef struct dmove {
  uint32_t chunk;
  bool fetch;
  uint32_t t;        /* the moment it was made before; period: the closing step */
  uint32_t need;     /* fetch: the moment that uses it */
  uint32_t after;    /* eviction: 1 + the moment of the chunk's last use before it, 0: none */
  uint64_t bytes;
  int64_t pos;       /* where it is issued: moment of this iteration, < 0 the previous one's */
  int64_t lb;        /* fetch: the earliest pos, its chunk's eviction before it */
  int64_t quiet;     /* with a lag: the earliest pos, the lag after the chunk's latest use */
} dmove;

/* A chunk on the GPU used at moment `at`: not movable before at + lag. */
typedef struct busy {
  uint32_t chunk;
  int64_t at;
} busy;

/* ---- demand paging with OPT ---- */

typedef struct pager {
  const psp_schedule *s;
  uint64_t budget;
  uint32_t period, n;
  bool cyclic;        /* next uses wrap forever; else the iteration closes on keep[] */
  bool *keep;         /* closing: the start placement, wanted back at the end */
  bool *on, *dirty;
  const uint64_t *bytes;
  uint64_t *key;      /* on the GPU: its next use that needs its data (larger leaves first) */
  uint32_t *heap;     /* the chunks on the GPU, the one to evict first on top */
  size_t *slot, n_heap;
  uint64_t used;
  uint32_t *last;     /* 1 + the moment of the chunk's last use in this pass, 0: none */
  /* the lag (when above 1): chunks used within it are off the heap, in `recent` by use */
  uint32_t lag;
  int64_t *used_at;   /* the moment of the chunk's latest use, on the GPU or not */
  const int64_t *final_use;  /* the moment of its last use in the iteration, -1: none */
  bool *busy_now;     /* on the GPU and used within the lag: in `recent`, not on the heap */
  busy *recent;
  size_t head, n_recent, cap_recent;
  uint64_t movable;   /* bytes on the heap */
  /* what a closing pass records */
  dmove *mv;
  size_t n_mv, cap_mv;
  uint64_t *occ;      /* by moment: frame bytes held while it runs */
  uint64_t *in_place; /* by moment: bytes it reads in host memory */
  uint64_t bytes_in, bytes_out;
  uint32_t in_place_moments;
  bool oom;
} pager;

static bool evicts_first(const pager *p, uint32_t a, uint32_t b)
{
  psp_cand x = {.chunk = a, .bytes = p->bytes[a], .dirty = p->dirty[a]};
  psp_cand y = {.chunk = b, .bytes = p->bytes[b], .dirty = p->dirty[b]};
  return psp_evicts_before(&x, p->key[a], &y, p->key[b]);
}

static void heap_put(pager *p, size_t i, uint32_t c)
{
  p->heap[i] = c;
  p->slot[c] = i;
}

/* Restores the heap order around slot i after its chunk's key or dirt changed. */
static void sift(pager *p, size_t i)
{
  uint32_t c = p->heap[i];
  while (i > 0 && evicts_first(p, c, p->heap[(i - 1) / 2])) {
    heap_put(p, i, p->heap[(i - 1) / 2]);
    i = (i - 1) / 2;
  }
  for (;;) {
    size_t l = 2 * i + 1, best = i;
    uint32_t top = c;
    if (l < p->n_heap && evicts_first(p, p->heap[l], top)) best = l, top = p->heap[l];
    if (l + 1 < p->n_heap && evicts_first(p, p->heap[l + 1], top)) best = l + 1;
    if (best == i) break;
    heap_put(p, i, p->heap[best]);
    i = best;
  }
  heap_put(p, i, c);
}

static void rekey(pager *p, uint32_t c, uint64_t key)
{
  p->key[c] = key;
  if (!p->busy_now[c]) sift(p, p->slot[c]);
}

static void heap_insert(pager *p, uint32_t c)
{
  heap_put(p, p->n_heap++, c);
  sift(p, p->n_heap - 1);
  p->movable += p->bytes[c];
}

static void heap_remove(pager *p, uint32_t c)
{
  size_t i = p->slot[c], last = --p->n_heap;
  if (i != last) {
    heap_put(p, i, p->heap[last]);
    sift(p, i);
  }
  p->movable -= p->bytes[c];
}

/* The array a of n elements with room for one more (grown), or NULL (p->oom set). */
static void *room_for(pager *p, void *a, size_t *cap, size_t n, size_t elem)
{
  if (n < *cap) return a;
  size_t c = *cap ? 2 * *cap : 64;
  void *r = realloc(a, c * elem);
  if (!r) {
    p->oom = true;
    return NULL;
  }
  *cap = c;
  return r;
}

/* A GPU chunk used at `now` leaves the heap until the lag has passed. */
static void hold(pager *p, uint32_t c, int64_t now)
{
  busy *r = room_for(p, p->recent, &p->cap_recent, p->n_recent, sizeof *r);
  if (!r) return;
  p->recent = r;
  if (!p->busy_now[c]) heap_remove(p, c);
  p->busy_now[c] = true;
  p->recent[p->n_recent++] = (busy){c, now};
}

/* With a lag, a closing pass cannot move a chunk used within the lag before the iteration's
 * end by its close: one of the start placement stays on the GPU throughout, another is
 * never fetched. */
static bool sticky(const pager *p, uint32_t c)
{
  return !p->cyclic && p->lag > 1 && p->final_use[c] >= 0 && p->final_use[c] + p->lag > p->period;
}

/* Chunks whose latest use lies the lag back go back on the heap. */
static void release(pager *p, int64_t now)
{
  for (; p->head < p->n_recent && p->recent[p->head].at + p->lag <= now; p->head++) {
    uint32_t c = p->recent[p->head].chunk;
    if (p->on[c] && p->busy_now[c] && p->used_at[c] == p->recent[p->head].at && !sticky(p, c)) {
      p->busy_now[c] = false;
      heap_insert(p, c);
    }
  }
  if (p->head > 64 && 2 * p->head > p->n_recent) {  /* keep the queue from growing */
    memmove(p->recent, p->recent + p->head, (p->n_recent - p->head) * sizeof *p->recent);
    p->n_recent -= p->head;
    p->head = 0;
  }
}

/* The earliest moment c may move at, its latest use the lag back (at once below a lag of 2). */
static int64_t quiet_from(const pager *p, uint32_t c)
{
  return p->lag > 1 ? p->used_at[c] + p->lag : INT64_MIN;
}

static void record(pager *p, dmove m)
{
  dmove *mv = p->cyclic ? NULL : room_for(p, p->mv, &p->cap_mv, p->n_mv, sizeof *mv);
  if (!mv) return;
  p->mv = mv;
  p->mv[p->n_mv++] = m;
}

/* The key of c from moment `from` on: its next use, unless that use is fresh (then
 * nothing needs keeping). */
static uint64_t key_from(const pager *p, uint32_t c, uint64_t from)
{
  bool fresh;
  uint64_t u = psp_use_fresh_from(p->s, c, from, &fresh);
  if (u == PSP_NEVER || fresh) return PSP_NEVER;
  if (p->cyclic || u < p->period) return u;
  return p->keep[c] ? p->period : PSP_NEVER;  /* needed at the close, or not this iteration */
}

static void evict(pager *p, uint32_t c, uint64_t t)
{
  if (!p->busy_now[c]) heap_remove(p, c);  /* busy: only at the close */
  p->busy_now[c] = false;
  p->on[c] = false;
  p->used -= p->bytes[c];
  bool fresh;  /* written data leaves with a copy unless it dies before it is read again */
  uint64_t next = psp_use_fresh_from(p->s, c, t, &fresh);
  uint64_t copy = p->dirty[c] && next != PSP_NEVER && !fresh ? p->bytes[c] : 0;
  p->dirty[c] = false;
  p->bytes_out += copy;
  record(p, (dmove){.chunk = c, .t = (uint32_t)t, .after = p->last[c], .bytes = copy, .quiet = quiet_from(p, c)});
}

static void fetch(pager *p, uint32_t c, uint64_t t, uint32_t need, bool fresh, bool written)
{
  p->on[c] = true;
  p->dirty[c] = written;
  p->used += p->bytes[c];
  p->key[c] = t;
  heap_insert(p, c);
  uint64_t copy = fresh ? 0 : p->bytes[c];
  p->bytes_in += copy;
  record(p, (dmove){.chunk = c, .fetch = true, .t = (uint32_t)t, .need = need, .bytes = copy,
                    .quiet = quiet_from(p, c)});
}

/* Moment t (absolute in cyclic passes): its chunks onto the GPU where they fit beside
 * each other and the non-model bytes, evicting by OPT; the rest is read in place. */
static void run_moment(pager *p, uint64_t t)
{
  const psp_use *u;
  size_t n = psp_schedule_uses(p->s, t, &u);
  uint64_t nonmodel = psp_schedule_nonmodel(p->s, t);
  uint64_t room = p->budget > nonmodel ? p->budget - nonmodel : 0, pinned = 0;
  uint32_t m = (uint32_t)(t % p->period);
  int64_t now = (int64_t)t;
  if (p->lag > 1) release(p, now);
  for (size_t i = 0; i < n; i++)
    if (p->on[u[i].chunk] && p->lag > 1)
      hold(p, u[i].chunk, now);
    else if (p->on[u[i].chunk])
      rekey(p, u[i].chunk, t);  /* the smallest key: evicted last */
  /* the non-model bytes grew: what this moment uses leaves too if nothing else is left
   * (with a lag, only what has quieted) */
  while (p->used > room && p->n_heap) evict(p, p->heap[0], t);
  for (size_t i = 0; i < n; i++)
    if (p->on[u[i].chunk]) pinned += p->bytes[u[i].chunk];
  bool host = false;
  for (size_t i = 0; i < n; i++) {
    uint32_t c = u[i].chunk;
    if (p->on[c]) {
      p->dirty[c] |= u[i].written;
      if (!p->busy_now[c]) sift(p, p->slot[c]);
      continue;
    }
    /* cannot fit beside what this moment holds and what has not quieted, or itself busy */
    if (pinned + p->bytes[c] > room || p->used - p->movable + p->bytes[c] > room || quiet_from(p, c) > now ||
        sticky(p, c)) {
      host = true;
      if (!p->cyclic) p->in_place[m] += p->bytes[c];
      continue;
    }
    while (p->used + p->bytes[c] > room) evict(p, p->heap[0], t);
    fetch(p, c, t, m, u[i].fresh, u[i].written);
    if (p->lag > 1) hold(p, c, now);
    pinned += p->bytes[c];
  }
  if (!p->cyclic) p->occ[m] = p->used;
  p->in_place_moments += host;
  for (size_t i = 0; i < n; i++) {
    p->used_at[u[i].chunk] = now;
    if (p->on[u[i].chunk]) {
      rekey(p, u[i].chunk, key_from(p, u[i].chunk, t + 1));
      p->last[u[i].chunk] = m + 1;
    }
  }
}

static int earlier_use(const void *a, const void *b)
{
  const busy *x = a, *y = b;
  return (x->at > y->at) - (x->at < y->at);
}

/* Starts a pass from placement on[] with dirt dirty[] (NULL: all in host memory). A
 * closing pass's chunks were last used where the iteration before it used them last: those
 * used within the lag before its start are busy. */
static void start_pass(pager *p, bool cyclic, const bool *on, const bool *dirty)
{
  p->cyclic = cyclic;
  p->n_heap = 0;
  p->used = p->movable = 0;
  p->n_mv = 0;
  p->head = p->n_recent = 0;
  p->bytes_in = p->bytes_out = 0;
  p->in_place_moments = 0;
  memset(p->last, 0, p->n * sizeof *p->last);
  memset(p->in_place, 0, p->period * sizeof *p->in_place);
  for (uint32_t c = 0; c < p->n; c++) {
    p->used_at[c] = cyclic || p->final_use[c] < 0 ? INT64_MIN / 2 : p->final_use[c] - p->period;
    p->on[c] = on && on[c];
    p->dirty[c] = p->on[c] && dirty[c];
    p->busy_now[c] = p->on[c] && (quiet_from(p, c) > 0 || sticky(p, c));
    if (!p->on[c]) continue;
    p->used += p->bytes[c];
    p->key[c] = key_from(p, c, 0);
    if (p->busy_now[c] && p->n_recent < p->cap_recent)
      p->recent[p->n_recent++] = (busy){c, p->used_at[c]};
    else if (p->busy_now[c])
      p->oom = true;  /* the queue is sized for every chunk before a closing pass */
    else
      heap_insert(p, c);
  }
  if (p->n_recent) qsort(p->recent, p->n_recent, sizeof *p->recent, earlier_use);
}

/* One iteration from placement keep[] that ends on it again. */
static void closing_pass(pager *p, const bool *dirty)
{
  start_pass(p, false, p->keep, dirty);
  for (uint64_t t = 0; t < p->period; t++) run_moment(p, t);
  for (uint32_t c = 0; c < p->n; c++)
    if (p->on[c] && !p->keep[c]) evict(p, c, p->period);
  for (uint32_t c = 0; c < p->n; c++)
    if (p->keep[c] && !p->on[c])
      fetch(p, c, p->period, (uint32_t)psp_use_from(p->s, c, 0), false, false);
}

/* A chunk of the start placement evicted before any use, then fetched back at the close,
 * need not be in the start placement at all: both moves go (the frame it held only frees
 * earlier). Otherwise, moved early, the eviction could come before the fetch it follows.
 * One kept on at the close instead leaves with the dirt the iteration ended with (the
 * start's came from the warm-up, which may differ). */
static bool settle_start(pager *p)
{
  size_t *first = malloc((p->n ? p->n : 1) * sizeof *first);
  if (!first) return false;
  for (uint32_t c = 0; c < p->n; c++) first[c] = SIZE_MAX;
  for (size_t i = 0; i < p->n_mv; i++)
    if (first[p->mv[i].chunk] == SIZE_MAX) first[p->mv[i].chunk] = i;
  for (size_t i = 0; i < p->n_mv; i++) {
    dmove *m = &p->mv[i], *f = &p->mv[first[m->chunk]];
    if (m->fetch && m->t == p->period && !f->fetch && !f->after) {
      p->bytes_in -= m->bytes;
      p->bytes_out -= f->bytes;
      p->keep[m->chunk] = false;
      f->chunk = m->chunk = UINT32_MAX;  /* dropped below */
    } else if (f == m && !m->fetch && !m->after) {
      bool fresh;
      uint64_t next = psp_use_fresh_from(p->s, m->chunk, m->t, &fresh);
      uint64_t copy = p->on[m->chunk] && p->dirty[m->chunk] && next != PSP_NEVER && !fresh ? p->bytes[m->chunk] : 0;
      p->bytes_out += copy - m->bytes;
      m->bytes = copy;
    }
  }
  size_t kept = 0;
  for (size_t i = 0; i < p->n_mv; i++)
    if (p->mv[i].chunk != UINT32_MAX) p->mv[kept++] = p->mv[i];
  p->n_mv = kept;
  free(first);
  return true;
}

/* ---- moving moves earlier: frames left free by moment, a segment tree on the circle ---- */

typedef struct tree {
  int64_t *min, *add;  /* min over a node's span, its own add included */
  uint32_t n;
} tree;

static void tree_build(tree *t, size_t node, uint32_t lo, uint32_t hi, const int64_t *v)
{
  t->add[node] = 0;
  if (hi - lo == 1) {
    t->min[node] = v[lo];
    return;
  }
  uint32_t mid = lo + (hi - lo) / 2;
  tree_build(t, 2 * node, lo, mid, v);
  tree_build(t, 2 * node + 1, mid, hi, v);
  t->min[node] = t->min[2 * node] < t->min[2 * node + 1] ? t->min[2 * node] : t->min[2 * node + 1];
}

static void tree_add(tree *t, size_t node, uint32_t lo, uint32_t hi, uint32_t a, uint32_t b, int64_t v)
{
  if (b <= lo || hi <= a) return;
  if (a <= lo && hi <= b) {
    t->add[node] += v;
    t->min[node] += v;
    return;
  }
  uint32_t mid = lo + (hi - lo) / 2;
  tree_add(t, 2 * node, lo, mid, a, b, v);
  tree_add(t, 2 * node + 1, mid, hi, a, b, v);
  int64_t m = t->min[2 * node] < t->min[2 * node + 1] ? t->min[2 * node] : t->min[2 * node + 1];
  t->min[node] = m + t->add[node];
}

/* The last moment in [a, b) with less than x free, or -1. acc: the ancestors' adds. */
static int64_t tree_last_below(const tree *t, size_t node, uint32_t lo, uint32_t hi, uint32_t a, uint32_t b,
                               int64_t x, int64_t acc)
{
  if (b <= lo || hi <= a || t->min[node] + acc >= x) return -1;
  if (hi - lo == 1) return lo;
  uint32_t mid = lo + (hi - lo) / 2;
  acc += t->add[node];
  int64_t r = tree_last_below(t, 2 * node + 1, mid, hi, a, b, x, acc);
  return r >= 0 ? r : tree_last_below(t, 2 * node, lo, mid, a, b, x, acc);
}

/* Adds v over moments [a, b) with a < b <= a + period, a in (-period, period]. */
static void circle_add(tree *t, int64_t a, int64_t b, int64_t v)
{
  int64_t n = t->n;
  if (a < 0) {
    tree_add(t, 1, 0, t->n, (uint32_t)(a + n), t->n, v);
    a = 0;
  }
  if (b > n) {
    tree_add(t, 1, 0, t->n, 0, (uint32_t)(b - n), v);
    b = n;
  }
  if (a < b) tree_add(t, 1, 0, t->n, (uint32_t)a, (uint32_t)b, v);
}

/* The earliest moment in [lb, d) from which x bytes stay free until d (d if none). */
static int64_t earliest_room(const tree *t, int64_t lb, int64_t d, int64_t x)
{
  if (lb >= d) return d;
  int64_t n = t->n, r = -1;
  if (d > 0) r = tree_last_below(t, 1, 0, t->n, (uint32_t)(lb > 0 ? lb : 0), (uint32_t)d, x, 0);
  if (r >= 0) return r + 1;
  if (lb >= 0) return lb;
  r = tree_last_below(t, 1, 0, t->n, (uint32_t)(lb + n), t->n, x, 0);
  return r >= 0 ? r + 1 - n : lb;
}

/* A fetch to place, in the order of the uses. */
typedef struct by_use {
  uint32_t need, chunk;
  size_t i;
} by_use;

static int need_first(const void *a, const void *b)
{
  const by_use *x = a, *y = b;
  if (x->need != y->need) return x->need < y->need ? -1 : 1;
  return x->chunk < y->chunk ? -1 : x->chunk > y->chunk;
}

/* Places every eviction right after its chunk's last use and every copying fetch as
 * early as the frames left free allow, the fetch needed first choosing first. False: out
 * of memory. */
static bool place_moves(pager *p, int64_t *free_bytes)
{
  int64_t P = p->period;
  by_use *order = malloc((p->n_mv ? p->n_mv : 1) * sizeof *order);
  int64_t *last_evict = malloc((p->n ? p->n : 1) * sizeof *last_evict);
  tree t = {.min = malloc(4 * (size_t)P * sizeof *t.min), .add = malloc(4 * (size_t)P * sizeof *t.add),
            .n = (uint32_t)P};
  bool ok = order && last_evict && t.min && t.add;
  if (!ok) goto out;
  for (uint32_t m = 0; m < P; m++) {
    uint64_t nonmodel = psp_schedule_nonmodel(p->s, m);
    free_bytes[m] = (int64_t)(p->budget > nonmodel ? p->budget - nonmodel : 0) - (int64_t)p->occ[m];
  }
  tree_build(&t, 1, 0, t.n, free_bytes);

  /* in demand order: evictions placed, and each fetch's bound noted, the chunk's
   * eviction before it (for its first fetch, or one at the close, its last eviction) */
  for (uint32_t c = 0; c < p->n; c++) last_evict[c] = INT64_MIN;
  for (size_t i = 0; i < p->n_mv; i++) {
    dmove *m = &p->mv[i];
    if (m->fetch) {
      m->pos = m->t == P ? 0 : m->t;  /* a fetch at the close serves from this iteration's start */
      m->lb = m->t == P ? INT64_MIN : last_evict[m->chunk];
      continue;
    }
    /* no use before it in this iteration: right after its last use in the previous one;
     * with a lag, the lag after its latest use (at the close possibly past the end, its
     * frame then held into the next iteration's first moments) */
    m->pos = p->lag > 1 ? m->quiet : m->after ? m->after : (int64_t)p->last[m->chunk] - P;
    if (m->pos <= m->t)
      circle_add(&t, m->pos, m->t, (int64_t)p->bytes[m->chunk]);
    else
      circle_add(&t, m->t, m->pos, -(int64_t)p->bytes[m->chunk]);
    last_evict[m->chunk] = m->pos;
  }

  size_t n_fetch = 0;
  for (size_t i = 0; i < p->n_mv; i++) {
    dmove *m = &p->mv[i];
    if (!m->fetch) continue;
    if (m->lb == INT64_MIN)
      m->lb = last_evict[m->chunk] != INT64_MIN ? last_evict[m->chunk] - P : m->pos - P + 1;
    if (p->lag > 1) {  /* below a lag of 2 quiet is INT64_MIN: nothing to bound, nor to shift */
      int64_t quiet = m->t == P ? m->quiet - P : m->quiet;  /* a fetch at the close: counted from the next start */
      if (quiet > m->lb) m->lb = quiet < m->pos ? quiet : m->pos;
    }
    if (m->lb < m->pos - P + 1) m->lb = m->pos - P + 1;  /* within the period before its use */
    if (m->bytes) order[n_fetch++] = (by_use){m->need, m->chunk, i};  /* fresh: a frame at its use suffices */
  }
  qsort(order, n_fetch, sizeof *order, need_first);
  for (size_t k = 0; k < n_fetch; k++) {  /* the one needed first takes the free frames first */
    dmove *m = &p->mv[order[k].i];
    int64_t d = m->pos;
    m->pos = earliest_room(&t, m->lb, d, (int64_t)p->bytes[m->chunk]);
    circle_add(&t, m->pos, d, -(int64_t)p->bytes[m->chunk]);
  }
out:
  free(order);
  free(last_evict);
  free(t.min);
  free(t.add);
  return ok;
}

/* ---- the plan as moves, and where it starts ---- */

static int by_issue(const void *a, const void *b)
{
  const psp_move *x = a, *y = b;
  if (x->at != y->at) return x->at < y->at ? -1 : 1;
  if (x->dir != y->dir) return x->dir == PSP_TO_HOST ? -1 : 1;  /* frees frames first */
  uint32_t lead_x = x->need >= x->at ? x->need - x->at : x->need + UINT32_MAX / 2;
  uint32_t lead_y = y->need >= y->at ? y->need - y->at : y->need + UINT32_MAX / 2;
  if (lead_x != lead_y) return lead_x < lead_y ? -1 : 1;  /* the one needed soonest */
  return x->chunk < y->chunk ? -1 : x->chunk > y->chunk;
}

static bool emit(const pager *p, psp_plan *out)
{
  int64_t P = p->period;
  out->moves = malloc((p->n_mv ? p->n_mv : 1) * sizeof *out->moves);
  out->start = malloc((p->n ? p->n : 1) * sizeof *out->start);
  uint8_t *last = calloc(p->n ? p->n : 1, 1);  /* 0: no move, else 1 + the chunk's last direction */
  if (!out->moves || !out->start || !last) {
    free(last);
    return false;
  }
  for (size_t i = 0; i < p->n_mv; i++) {
    const dmove *m = &p->mv[i];
    out->moves[out->n_moves++] = (psp_move){.at = (uint32_t)(((m->pos % P) + P) % P), .chunk = m->chunk,
                                            .dir = m->fetch ? PSP_TO_GPU : PSP_TO_HOST,
                                            .need = m->fetch ? m->need : 0, .bytes = m->bytes};
  }
  qsort(out->moves, out->n_moves, sizeof *out->moves, by_issue);
  for (size_t i = 0; i < out->n_moves; i++) last[out->moves[i].chunk] = (uint8_t)(1 + out->moves[i].dir);
  /* on the GPU at the start: its last move is a fetch, or it never moves and stays */
  for (uint32_t c = 0; c < p->n; c++)
    if (last[c] ? last[c] == 1 + PSP_TO_GPU : p->keep[c]) out->start[out->n_start++] = c;
  free(last);
  out->bytes_in = p->bytes_in;
  out->bytes_out = p->bytes_out;
  out->in_place = p->in_place_moments;
  return true;
}

/* ---- the replay: moments in order, a copy engine per direction ---- */

typedef struct engine {
  size_t *q, head, n, cap;  /* moves queued, in issue order */
  double left;              /* bytes of the head still to copy */
} engine;

typedef struct replay {
  const psp_plan *pl;
  double now;            /* ns */
  engine e[2];           /* PSP_TO_GPU, PSP_TO_HOST */
  double alone[2], shared[2];  /* bytes per ns, with the other engine idle / busy */
  double *done;          /* by move: when its latest copy ended, < 0 while it copies */
} replay;

static void push(replay *r, size_t i)
{
  engine *e = &r->e[r->pl->moves[i].dir];
  if (!e->n) e->left = (double)r->pl->moves[i].bytes;
  e->q[(e->head + e->n++) % e->cap] = i;
  r->done[i] = -1;
}

/* Runs both engines until `until`, or until move `watch` has copied (SIZE_MAX: none). */
static void flow(replay *r, double until, size_t watch)
{
  while (r->now < until) {
    bool busy[2] = {r->e[0].n > 0, r->e[1].n > 0};
    if (!busy[0] && !busy[1]) {
      r->now = until;
      return;
    }
    double rate[2], dt = INFINITY;
    int first = 0;
    for (int k = 0; k < 2; k++) {
      rate[k] = busy[1 - k] ? r->shared[k] : r->alone[k];
      if (busy[k] && r->e[k].left / rate[k] < dt) dt = r->e[k].left / rate[k], first = k;
    }
    if (r->now + dt >= until) dt = until - r->now;
    for (int k = 0; k < 2; k++)
      if (busy[k]) r->e[k].left -= rate[k] * dt;
    r->now += dt;
    if (r->now >= until && r->e[first].left > 0) return;
    engine *e = &r->e[first];  /* its head has copied */
    size_t i = e->q[e->head];
    e->head = (e->head + 1) % e->cap;
    if (--e->n) e->left = (double)r->pl->moves[e->q[e->head]].bytes;
    r->done[i] = r->now;
    if (i == watch) return;
  }
}

static uint64_t ns(double x) { return (uint64_t)(x + 0.5); }

static bool predict(const psp_schedule *s, const psp_costs *c, const uint64_t *in_place, psp_plan *pl)
{
  uint32_t P = psp_schedule_period(s);
  size_t cap = REPLAYS * pl->n_moves + 1;
  replay r = {.pl = pl, .done = calloc(pl->n_moves + 1, sizeof *r.done)};
  size_t *need_off = calloc((size_t)P + 1, sizeof *need_off), *need = malloc((pl->n_moves + 1) * sizeof *need);
  double *dur = malloc((size_t)P * sizeof *dur);
  for (int k = 0; k < 2; k++) {
    r.e[k] = (engine){.q = malloc(cap * sizeof *r.e[k].q), .cap = cap};
    r.alone[k] = (k ? c->d2h : c->h2d) * 1e-9;
    r.shared[k] = c->both * 1e-9 * r.alone[k] / (c->h2d * 1e-9 + c->d2h * 1e-9);
  }
  bool ok = r.done && need_off && need && dur && r.e[0].q && r.e[1].q;
  if (ok) {
    /* the copying fetches each moment waits for, by moment */
    for (size_t i = 0; i < pl->n_moves; i++)
      if (pl->moves[i].dir == PSP_TO_GPU && pl->moves[i].bytes) need_off[pl->moves[i].need + 1]++;
    for (uint32_t t = 0; t < P; t++) need_off[t + 1] += need_off[t];
    for (size_t i = 0, *fill = need_off; i < pl->n_moves; i++)
      if (pl->moves[i].dir == PSP_TO_GPU && pl->moves[i].bytes) need[fill[pl->moves[i].need]++] = i;
    for (uint32_t t = P; t > 0; t--) need_off[t] = need_off[t - 1];  /* undo the fill */
    need_off[0] = 0;
    for (uint32_t t = 0; t < P; t++) {
      double own = (double)(c->moment_ns ? c->moment_ns[t] : c->default_ns), read = (double)in_place[t] / c->in_place * 1e9;
      dur[t] = own > read ? own : read;  /* reading host memory in place takes at least its bytes' time */
      pl->work_ns += ns(dur[t]);
      pl->bytes_in_place += in_place[t];
    }
    for (int lap = 0; lap < REPLAYS; lap++) {
      double start = r.now;
      size_t next = 0;
      for (uint32_t t = 0; t < P; t++) {
        for (; next < pl->n_moves && pl->moves[next].at == t; next++)
          if (pl->moves[next].bytes) push(&r, next);
        double waited = 0;
        for (size_t k = need_off[t]; k < need_off[t + 1]; k++) {
          size_t f = need[k];
          if (lap == 0 && pl->moves[f].at > t) continue;  /* issued before the replay: in place already */
          if (r.done[f] >= 0) continue;
          double from = r.now;
          flow(&r, INFINITY, f);
          waited += r.now - from;
        }
        flow(&r, r.now + dur[t], SIZE_MAX);
        if (lap == REPLAYS - 1 && waited > 0) {
          pl->waits++;
          pl->wait_ns += ns(waited);
        }
      }
      pl->step_ns = ns(r.now - start);
    }
  }
  free(r.done);
  free(need_off);
  free(need);
  free(dur);
  free(r.e[0].q);
  free(r.e[1].q);
  return ok;
}

/* ---- the whole ---- */

void psp_plan_free(psp_plan *p)
{
  free(p->moves);
  free(p->start);
  memset(p, 0, sizeof *p);
}

int psp_plan_make(const psp_schedule *s, uint64_t budget, const psp_costs *c, psp_plan *out)
{
  memset(out, 0, sizeof *out);
  if (!(c->h2d > 0 && c->d2h > 0 && c->both > 0 && c->in_place > 0)) {
    errno = EINVAL;
    return -1;
  }
  uint32_t n = psp_schedule_chunks(s), P = psp_schedule_period(s);
  if (!P) return 0;
  size_t nn = n ? n : 1;
  uint64_t *bytes = malloc(nn * sizeof *bytes);
  bool *start = calloc(2 * nn, sizeof *start); /* placement, then dirt */
  int64_t *free_bytes = malloc((size_t)P * sizeof *free_bytes);
  pager p = {.s = s, .budget = budget, .period = P, .n = n, .bytes = bytes,
             .keep = calloc(nn, sizeof *p.keep), .on = calloc(nn, sizeof *p.on), .dirty = calloc(nn, sizeof *p.dirty),
             .key = malloc(nn * sizeof *p.key), .heap = malloc(nn * sizeof *p.heap), .slot = malloc(nn * sizeof *p.slot),
             .last = malloc(nn * sizeof *p.last), .occ = calloc(P, sizeof *p.occ), .in_place = calloc(P, sizeof *p.in_place),
             .lag = c->lag < P ? c->lag : P, .used_at = malloc(nn * sizeof *p.used_at),
             .busy_now = calloc(nn, sizeof *p.busy_now), .recent = malloc(nn * sizeof *p.recent), .cap_recent = nn};
  int64_t *final_use = malloc(nn * sizeof *final_use);
  bool ok = bytes && start && free_bytes && p.keep && p.on && p.dirty && p.key && p.heap && p.slot &&
            p.last && p.occ && p.in_place && p.used_at && p.busy_now && p.recent && final_use;
  if (ok) {
    for (uint32_t k = 0; k < n; k++) bytes[k] = psp_schedule_chunk_bytes(s, k), final_use[k] = -1;
    for (uint32_t t = 0; t < P; t++) {
      const psp_use *u;
      for (size_t i = 0, nu = psp_schedule_uses(s, t, &u); i < nu; i++) final_use[u[i].chunk] = t;
    }
    p.final_use = final_use;
    /* the start: the placement (and dirt) OPT reaches after WARM iterations from a cold start */
    start_pass(&p, true, NULL, NULL);
    for (uint64_t t = 0; t < (uint64_t)WARM * P; t++) run_moment(&p, t);
    memcpy(start, p.on, n * sizeof *p.on);
    memcpy(start + nn, p.dirty, n * sizeof *p.dirty);
    bool *on = start, *dirty = start + nn;
    for (uint32_t x = 0; x < n; x++) {  /* nothing to bring back where the data dies first */
      bool fresh;
      p.keep[x] = on[x] && psp_use_fresh_from(s, x, 0, &fresh) != PSP_NEVER && !fresh;
    }
    /* the start's dirt is the end's: with a lag the warm-up's may differ, so the pass is
     * made again from the dirt it ended with, until they agree (a few times at most) */
    for (int round = 0; round < DIRT_ROUNDS; round++) {
      closing_pass(&p, dirty);
      if (!memcmp(dirty, p.dirty, n * sizeof *dirty)) break;
      memcpy(dirty, p.dirty, n * sizeof *dirty);
    }
    ok = !p.oom && settle_start(&p) && place_moves(&p, free_bytes) && emit(&p, out) && predict(s, c, p.in_place, out);
  }
  free(bytes);
  free(start);
  free(free_bytes);
  free(p.keep);
  free(p.on);
  free(p.dirty);
  free(p.key);
  free(p.heap);
  free(p.slot);
  free(p.last);
  free(p.used_at);
  free(p.busy_now);
  free(p.recent);
  free(final_use);
  free(p.occ);
  free(p.in_place);
  free(p.mv);
  if (!ok) {
    psp_plan_free(out);
    errno = ENOMEM;
    return -1;
  }
  return 0;
}
