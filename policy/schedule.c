/* The schedule: moments with their chunk uses and non-model bytes, built incrementally,
 * then sealed into per-chunk sorted use lists (next use = binary search) and a sparse
 * table of block maxima of the non-model bytes (margin = range maximum in constant time). */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>

#include "policy/internal.h"

#define NONE SIZE_MAX
/* Margin queries scan at most two partial blocks and look up whole blocks in a sparse
 * table, which stays small (levels x moments / BLOCK) even for 10^5-moment iterations. */
#define BLOCK 64u

struct psp_schedule {
  /* chunks, by id */
  uint64_t *bytes;  /* 0: not declared */
  size_t *open_use; /* while building: index in use[] of the chunk's touch in the open
                       moment, if >= moment_off[n_moments - 1]; else stale or NONE */
  uint32_t n_chunks;
  size_t cap_chunks;

  /* moments: moment t's uses are use[moment_off[t] .. moment_off[t + 1]) */
  psp_use *use;
  size_t n_use, cap_use;
  size_t *moment_off;  /* n_moments + 1 entries */
  uint64_t *nonmodel;
  uint32_t n_moments;
  size_t cap_moments;

  /* after sealing: chunk c is used at moments at[at_off[c] .. at_off[c + 1]), ascending */
  bool sealed;
  size_t *at_off;
  uint32_t *at;
  bool *fresh;    /* parallel to at: the use follows an empty range */
  bool *written;  /* by chunk: some use writes it */

  /* psp_schedule_empty's ranges, checked and turned into fresh uses by sealing */
  struct empty { uint32_t chunk, after, before; } *empty;
  size_t n_empty, cap_empty;
  /* sparse[l * n_blocks + b]: the most non-model bytes over blocks [b, b + 2^l) */
  uint64_t *sparse;
  uint32_t n_blocks;
};

/* realloc for n elements of size elem, failing cleanly on overflow. */
static void *resize(void *p, size_t n, size_t elem)
{
  if (n > SIZE_MAX / elem) { errno = ENOMEM; return NULL; }
  return realloc(p, n * elem);
}

/* The capacity to grow to (doubling) so that need elements fit. */
static size_t next_cap(size_t cap, size_t need)
{
  size_t n = cap ? cap : 16;
  while (n < need) n *= 2;
  return n;
}

psp_schedule *psp_schedule_new(void)
{
  psp_schedule *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->moment_off = malloc(sizeof *s->moment_off);
  if (!s->moment_off) { free(s); return NULL; }
  s->moment_off[0] = 0;
  return s;
}

void psp_schedule_free(psp_schedule *s)
{
  if (!s) return;
  free(s->bytes);
  free(s->open_use);
  free(s->use);
  free(s->moment_off);
  free(s->nonmodel);
  free(s->at_off);
  free(s->at);
  free(s->fresh);
  free(s->written);
  free(s->empty);
  free(s->sparse);
  free(s);
}

int psp_schedule_chunk(psp_schedule *s, uint32_t chunk, uint64_t bytes)
{
  if (s->sealed || bytes == 0 || chunk == UINT32_MAX) { errno = EINVAL; return -1; }
  if (chunk >= s->n_chunks) {
    if ((size_t)chunk + 1 > s->cap_chunks) {
      size_t cap = next_cap(s->cap_chunks, (size_t)chunk + 1);
      uint64_t *bytes_ = resize(s->bytes, cap, sizeof *bytes_);
      if (!bytes_) return -1;
      s->bytes = bytes_;
      size_t *open = resize(s->open_use, cap, sizeof *open);
      if (!open) return -1;
      s->open_use = open;
      s->cap_chunks = cap;
    }
    for (uint32_t c = s->n_chunks; c <= chunk; c++) {
      s->bytes[c] = 0;
      s->open_use[c] = NONE;
    }
    s->n_chunks = chunk + 1;
  }
  s->bytes[chunk] = bytes;
  return 0;
}

int psp_schedule_moment(psp_schedule *s, uint64_t nonmodel_bytes)
{
  if (s->sealed) { errno = EINVAL; return -1; }
  if (s->n_moments == UINT32_MAX) { errno = EOVERFLOW; return -1; }
  if ((size_t)s->n_moments + 1 > s->cap_moments) {
    size_t cap = next_cap(s->cap_moments, (size_t)s->n_moments + 1);
    uint64_t *nm = resize(s->nonmodel, cap, sizeof *nm);
    if (!nm) return -1;
    s->nonmodel = nm;
    size_t *off = resize(s->moment_off, cap + 1, sizeof *off);  /* one entry more */
    if (!off) return -1;
    s->moment_off = off;
    s->cap_moments = cap;
  }
  s->nonmodel[s->n_moments] = nonmodel_bytes;
  s->n_moments++;
  s->moment_off[s->n_moments] = s->n_use;
  return 0;
}

int psp_schedule_touch(psp_schedule *s, uint32_t chunk, bool written)
{
  if (s->sealed || s->n_moments == 0 || chunk >= s->n_chunks || !s->bytes[chunk]) {
    errno = EINVAL;
    return -1;
  }
  size_t prev = s->open_use[chunk];
  if (prev != NONE && prev >= s->moment_off[s->n_moments - 1]) {
    s->use[prev].written |= written;
    return 0;
  }
  if (s->n_use == s->cap_use) {
    size_t cap = next_cap(s->cap_use, s->n_use + 1);
    psp_use *use = resize(s->use, cap, sizeof *use);
    if (!use) return -1;
    s->use = use;
    s->cap_use = cap;
  }
  s->open_use[chunk] = s->n_use;
  s->use[s->n_use++] = (psp_use){.chunk = chunk, .written = written};
  s->moment_off[s->n_moments] = s->n_use;
  return 0;
}

int psp_schedule_empty(psp_schedule *s, uint32_t chunk, uint32_t after, uint32_t before)
{
  if (s->sealed || chunk >= s->n_chunks || !s->bytes[chunk]) { errno = EINVAL; return -1; }
  if (s->n_empty == s->cap_empty) {
    size_t cap = next_cap(s->cap_empty, s->n_empty + 1);
    struct empty *e = resize(s->empty, cap, sizeof *e);
    if (!e) return -1;
    s->empty = e;
    s->cap_empty = cap;
  }
  s->empty[s->n_empty++] = (struct empty){chunk, after, before};
  return 0;
}

/* Index in at[] of the chunk's first use at or after moment t of the iteration, or
 * off[chunk + 1] when it has none there. */
static size_t first_at(const size_t *off, const uint32_t *at, uint32_t chunk, uint32_t t)
{
  size_t lo = off[chunk], hi = off[chunk + 1];
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (at[mid] < t) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Marks the use after each empty range fresh, in at[] order (fresh) and in moment order
 * (use_of: at[] index -> use[] index). False: a range is out of the iteration or has a
 * use inside it. */
static bool mark_fresh(psp_schedule *s, const size_t *off, const uint32_t *at, const size_t *use_of, bool *fresh)
{
  uint32_t period = s->n_moments;
  for (size_t i = 0; i < s->n_empty; i++) {
    const struct empty *e = &s->empty[i];
    if (e->after >= period || e->before >= period) return false;
    if (off[e->chunk] == off[e->chunk + 1]) continue;  /* never used: nothing to mark */
    size_t k = first_at(off, at, e->chunk, e->after + 1);
    uint64_t next = k < off[e->chunk + 1] ? at[k] : (uint64_t)period + at[off[e->chunk]];
    if (k == off[e->chunk + 1]) k = off[e->chunk];  /* wraps into the next iteration */
    uint64_t end = e->before > e->after ? e->before : (uint64_t)e->before + period;
    if (next < end) return false;  /* a use while it holds nothing live */
    fresh[k] = true;
    s->use[use_of[k]].fresh = true;
  }
  return true;
}

static uint32_t log2_floor(uint32_t x)
{
  uint32_t l = 0;
  while (x >>= 1) l++;
  return l;
}

int psp_schedule_seal(psp_schedule *s)
{
  if (s->sealed) { errno = EINVAL; return -1; }
  size_t *off = calloc((size_t)s->n_chunks + 1, sizeof *off);
  size_t n_use = s->n_use ? s->n_use : 1;
  uint32_t *at = malloc(n_use * sizeof *at);
  bool *fresh = calloc(n_use, sizeof *fresh);
  size_t *use_of = malloc(n_use * sizeof *use_of);
  bool *written = calloc(s->n_chunks ? s->n_chunks : 1, sizeof *written);
  s->n_blocks = (s->n_moments + BLOCK - 1) / BLOCK;
  uint32_t levels = s->n_blocks ? log2_floor(s->n_blocks) + 1 : 0;
  uint64_t *sparse = malloc(((size_t)levels * s->n_blocks + 1) * sizeof *sparse);
  if (!off || !at || !fresh || !use_of || !written || !sparse) {
    free(off);
    free(at);
    free(fresh);
    free(use_of);
    free(written);
    free(sparse);
    return -1;
  }

  /* counting sort of uses by chunk; walking moments in order keeps each list ascending */
  for (size_t u = 0; u < s->n_use; u++) off[s->use[u].chunk + 1]++;
  for (uint32_t c = 0; c < s->n_chunks; c++) off[c + 1] += off[c];
  size_t *fill = s->open_use;  /* no longer needed for building: reuse as fill cursors */
  for (uint32_t c = 0; c < s->n_chunks; c++) fill[c] = off[c];
  for (uint32_t t = 0; t < s->n_moments; t++)
    for (size_t u = s->moment_off[t]; u < s->moment_off[t + 1]; u++) {
      use_of[fill[s->use[u].chunk]] = u;
      at[fill[s->use[u].chunk]++] = t;
      written[s->use[u].chunk] |= s->use[u].written;
    }
  bool ranges_ok = mark_fresh(s, off, at, use_of, fresh);
  free(use_of);
  if (!ranges_ok) {  /* stays unsealed: restore the open moment's touch index */
    for (size_t u = 0; u < s->n_use; u++) s->use[u].fresh = false;
    for (uint32_t c = 0; c < s->n_chunks; c++) fill[c] = NONE;
    for (size_t u = s->n_moments ? s->moment_off[s->n_moments - 1] : 0; u < s->n_use; u++)
      fill[s->use[u].chunk] = u;
    free(off);
    free(at);
    free(fresh);
    free(written);
    free(sparse);
    errno = EINVAL;
    return -1;
  }
  free(s->open_use);
  s->open_use = NULL;

  for (uint32_t b = 0; b < s->n_blocks; b++) {
    uint64_t m = 0;
    for (uint32_t t = b * BLOCK; t < s->n_moments && t < (b + 1) * BLOCK; t++)
      if (s->nonmodel[t] > m) m = s->nonmodel[t];
    sparse[b] = m;
  }
  for (uint32_t l = 1; l < levels; l++)
    for (uint32_t b = 0; b + (1u << l) <= s->n_blocks; b++) {
      uint64_t x = sparse[(size_t)(l - 1) * s->n_blocks + b];
      uint64_t y = sparse[(size_t)(l - 1) * s->n_blocks + b + (1u << (l - 1))];
      sparse[(size_t)l * s->n_blocks + b] = x > y ? x : y;
    }

  s->at_off = off;
  s->at = at;
  s->fresh = fresh;
  s->written = written;
  s->sparse = sparse;
  s->sealed = true;
  return 0;
}

uint32_t psp_schedule_period(const psp_schedule *s) { return s->n_moments; }

uint32_t psp_schedule_chunks(const psp_schedule *s) { return s->n_chunks; }

uint64_t psp_schedule_chunk_bytes(const psp_schedule *s, uint32_t chunk)
{
  return chunk < s->n_chunks ? s->bytes[chunk] : 0;
}

size_t psp_schedule_uses(const psp_schedule *s, uint64_t m, const psp_use **uses)
{
  *uses = NULL;
  if (s->n_moments == 0) return 0;
  uint64_t t = m % s->n_moments;
  size_t n = s->moment_off[t + 1] - s->moment_off[t];
  if (n) *uses = s->use + s->moment_off[t];
  return n;
}

uint64_t psp_schedule_nonmodel(const psp_schedule *s, uint64_t m)
{
  return s->n_moments ? s->nonmodel[m % s->n_moments] : 0;
}

uint32_t psp_schedule_use_count(const psp_schedule *s, uint32_t chunk, bool *written)
{
  assert(s->sealed);
  bool known = chunk < s->n_chunks;
  if (written) *written = known && s->written[chunk];
  return known ? (uint32_t)(s->at_off[chunk + 1] - s->at_off[chunk]) : 0;
}

uint64_t psp_use_fresh_from(const psp_schedule *s, uint32_t chunk, uint64_t m, bool *fresh)
{
  assert(s->sealed);
  if (fresh) *fresh = false;
  if (chunk >= s->n_chunks || m == PSP_NEVER) return PSP_NEVER;
  size_t first = s->at_off[chunk], end = s->at_off[chunk + 1];
  if (first == end) return PSP_NEVER;
  uint64_t period = s->n_moments, base = m - m % period;
  size_t k = first_at(s->at_off, s->at, chunk, (uint32_t)(m % period));
  if (k == end) {  /* wraps into the next iteration */
    k = first;
    base += period;
  }
  if (fresh) *fresh = s->fresh[k];
  return base + s->at[k];
}

uint64_t psp_use_from(const psp_schedule *s, uint32_t chunk, uint64_t m)
{
  return psp_use_fresh_from(s, chunk, m, NULL);
}

uint64_t psp_next_use(const psp_schedule *s, uint32_t chunk, uint64_t m)
{
  return m == PSP_NEVER ? PSP_NEVER : psp_use_from(s, chunk, m + 1);
}

/* The most non-model bytes over moments [a, b] of one iteration, a <= b < period. */
static uint64_t range_max(const psp_schedule *s, uint32_t a, uint32_t b)
{
  uint64_t m = 0;
  uint32_t ba = a / BLOCK, bb = b / BLOCK;
  if (bb - ba < 2) {  /* at most two blocks: scan */
    for (uint32_t t = a; t <= b; t++)
      if (s->nonmodel[t] > m) m = s->nonmodel[t];
    return m;
  }
  for (uint32_t t = a; t < (ba + 1) * BLOCK; t++)
    if (s->nonmodel[t] > m) m = s->nonmodel[t];
  for (uint32_t t = bb * BLOCK; t <= b; t++)
    if (s->nonmodel[t] > m) m = s->nonmodel[t];
  /* whole blocks ba+1 .. bb-1: two overlapping power-of-two spans */
  uint32_t first = ba + 1, count = bb - 1 - ba, l = log2_floor(count);
  uint64_t x = s->sparse[(size_t)l * s->n_blocks + first];
  uint64_t y = s->sparse[(size_t)l * s->n_blocks + bb - (1u << l)];
  if (x > m) m = x;
  if (y > m) m = y;
  return m;
}

uint64_t psp_schedule_margin(const psp_schedule *s, uint64_t m, uint32_t window)
{
  assert(s->sealed);
  uint32_t period = s->n_moments;
  if (period == 0 || window == 0) return 0;
  if (window >= period) return range_max(s, 0, period - 1);
  uint32_t t = (uint32_t)(m % period);
  if (t + window <= period) return range_max(s, t, t + window - 1);
  uint64_t x = range_max(s, t, period - 1), y = range_max(s, 0, t + window - period - 1);
  return x > y ? x : y;
}
