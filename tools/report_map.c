/* psshim-report's address map: open addressing, linear probing, backward-shift deletion. */
#include <stdlib.h>

#include "tools/report.h"

static size_t slot_of(uint64_t key, size_t cap) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdull;
  key ^= key >> 33;
  return (size_t)key & (cap - 1);
}

static bool grow(struct rp_map *m) {
  const size_t cap = m->cap ? m->cap * 2 : 1024;
  struct rp_map g = { calloc(cap, sizeof *g.keys), calloc(cap, sizeof *g.vals), cap, 0 };
  if (!g.keys || !g.vals) {
    rp_map_free(&g);
    return false;
  }
  for (size_t i = 0; i < m->cap; i++)
    if (m->keys[i]) rp_map_put(&g, m->keys[i], m->vals[i]);
  rp_map_free(m);
  *m = g;
  return true;
}

bool rp_map_put(struct rp_map *m, uint64_t key, uint64_t val) {
  if (!key) return true; /* a null pointer is no allocation: nothing to find later */
  if ((m->n + 1) * 2 > m->cap && !grow(m)) return false;
  size_t i = slot_of(key, m->cap);
  while (m->keys[i] && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
  if (!m->keys[i]) m->n++;
  m->keys[i] = key;
  m->vals[i] = val;
  return true;
}

static size_t find(const struct rp_map *m, uint64_t key) {
  if (!m->cap || !key) return SIZE_MAX;
  for (size_t i = slot_of(key, m->cap); m->keys[i]; i = (i + 1) & (m->cap - 1))
    if (m->keys[i] == key) return i;
  return SIZE_MAX;
}

bool rp_map_get(const struct rp_map *m, uint64_t key, uint64_t *val) {
  const size_t i = find(m, key);
  if (i == SIZE_MAX) return false;
  *val = m->vals[i];
  return true;
}

bool rp_map_del(struct rp_map *m, uint64_t key, uint64_t *val) {
  size_t i = find(m, key);
  if (i == SIZE_MAX) return false;
  if (val) *val = m->vals[i];
  /* Shift later members of the probe run back so lookups never stop at a hole early. */
  for (size_t j = (i + 1) & (m->cap - 1); m->keys[j]; j = (j + 1) & (m->cap - 1)) {
    const size_t home = slot_of(m->keys[j], m->cap);
    if (((j - home) & (m->cap - 1)) >= ((j - i) & (m->cap - 1))) {
      m->keys[i] = m->keys[j];
      m->vals[i] = m->vals[j];
      i = j;
    }
  }
  m->keys[i] = 0;
  m->n--;
  return true;
}

void rp_map_free(struct rp_map *m) {
  free(m->keys);
  free(m->vals);
  *m = (struct rp_map){ 0 };
}
