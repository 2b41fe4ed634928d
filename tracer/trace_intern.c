/* The tracer's interning table (see trace_intern.h). */
#include "tracer/trace_intern.h"

#include <string.h>
#include <sys/mman.h>

void *pst_map(size_t n) {
  /* NORESERVE: the reservations are generous and only touched pages cost memory. */
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

void pst_unmap(void *p, size_t n) {
  if (p) munmap(p, n);
}

/* FNV-1a, then a final mix so the low bits (the slot index) depend on every byte. */
static uint64_t hash_bytes(const void *key, size_t len) {
  const uint8_t *p = key;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

enum { INITIAL_SLOTS = 4096 };

bool pst_itab_init(struct pst_itab *t, size_t arena_cap, uint32_t max_entries) {
  memset(t, 0, sizeof *t);
  t->arena = pst_map(arena_cap);
  t->entries = pst_map((size_t)max_entries * sizeof *t->entries);
  t->slots = pst_map(INITIAL_SLOTS * sizeof *t->slots);
  if (!t->arena || !t->entries || !t->slots) {
    pst_unmap(t->arena, arena_cap);
    pst_unmap(t->entries, (size_t)max_entries * sizeof *t->entries);
    pst_unmap(t->slots, INITIAL_SLOTS * sizeof *t->slots);
    memset(t, 0, sizeof *t);
    return false;
  }
  t->arena_cap = arena_cap;
  t->max_entries = max_entries;
  t->nslots = INITIAL_SLOTS;
  return true;
}

void pst_itab_destroy(struct pst_itab *t) {
  pst_unmap(t->arena, t->arena_cap);
  pst_unmap(t->entries, (size_t)t->max_entries * sizeof *t->entries);
  pst_unmap(t->slots, (size_t)t->nslots * sizeof *t->slots);
  memset(t, 0, sizeof *t);
}

static void place(uint32_t *slots, uint32_t nslots, uint64_t hash, uint32_t id) {
  uint32_t i = (uint32_t)hash & (nslots - 1);
  while (slots[i]) i = (i + 1) & (nslots - 1);
  slots[i] = id;
}

/* Doubles the slot array; false (table left as it was) if no memory. */
static bool grow_slots(struct pst_itab *t) {
  uint32_t n = t->nslots * 2;
  uint32_t *s = pst_map((size_t)n * sizeof *s);
  if (!s) return false;
  for (uint32_t id = 1; id <= t->count; id++) place(s, n, t->entries[id - 1].hash, id);
  pst_unmap(t->slots, (size_t)t->nslots * sizeof *t->slots);
  t->slots = s;
  t->nslots = n;
  return true;
}

uint32_t pst_itab_add(struct pst_itab *t, const void *key, size_t len, bool *added) {
  const uint64_t h = hash_bytes(key, len);
  *added = false;
  for (uint32_t i = (uint32_t)h & (t->nslots - 1);; i = (i + 1) & (t->nslots - 1)) {
    uint32_t id = t->slots[i];
    if (!id) break;
    const struct pst_itab_entry *e = &t->entries[id - 1];
    if (e->hash == h && e->len == len && memcmp(t->arena + e->off, key, len) == 0) return id;
  }
  if (t->count == t->max_entries || len > t->arena_cap - t->arena_used) return 0;
  if ((t->count + 1) * 2 > t->nslots && !grow_slots(t)) return 0;
  const uint32_t id = t->count + 1;
  memcpy(t->arena + t->arena_used, key, len);
  t->entries[id - 1] = (struct pst_itab_entry){ .hash = h, .off = t->arena_used, .len = (uint32_t)len };
  t->arena_used += len;
  t->count = id;
  place(t->slots, t->nslots, h, id);
  *added = true;
  return id;
}

const void *pst_itab_key(const struct pst_itab *t, uint32_t id, size_t *len) {
  const struct pst_itab_entry *e = &t->entries[id - 1];
  *len = e->len;
  return t->arena + e->off;
}
