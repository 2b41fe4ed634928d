/* Live allocations by address: open addressing with linear probing. Keys are 512-byte
 * aligned, so the address shifted right is a good enough hash after mixing. */
#include "allocator/space.h"

#include <stdlib.h>

#define EMPTY 0
#define TOMBSTONE 1

static uint64_t slot_of(CUdeviceptr p, uint64_t cap)
{
  uint64_t h = (p >> 9) * 0x9E3779B97F4A7C15ull;
  return (h >> 17) & (cap - 1);
}

static bool rehash(struct device *d, uint64_t cap)
{
  struct alloc_entry *old = d->space.map, *fresh = calloc(cap, sizeof *fresh);
  if (!fresh)
    return false;
  uint64_t old_cap = d->space.map_cap;
  d->space.map = fresh;
  d->space.map_cap = cap;
  d->space.map_used = 0;
  for (uint64_t i = 0; i < old_cap; i++)
    if (old[i].ptr > TOMBSTONE) {
      uint64_t j = slot_of(old[i].ptr, cap);
      while (fresh[j].ptr != EMPTY)
        j = (j + 1) & (cap - 1);
      fresh[j] = old[i];
      d->space.map_used++;
    }
  free(old);
  return true;
}

bool psa_map_put(struct device *d, CUdeviceptr p, uint64_t size, struct span *s)
{
  if ((d->space.map_used + 1) * 4 > d->space.map_cap * 3) {
    /* Rehashing also drops tombstones: grow only for live entries (counted by stats). */
    uint64_t live = d->stats.allocs - d->stats.frees, cap = d->space.map_cap ? d->space.map_cap : 1024;
    while ((live + 1) * 2 > cap)
      cap *= 2;
    if (!rehash(d, cap))
      return false;
  }
  uint64_t j = slot_of(p, d->space.map_cap);
  while (d->space.map[j].ptr > TOMBSTONE)
    j = (j + 1) & (d->space.map_cap - 1);
  if (d->space.map[j].ptr == EMPTY)
    d->space.map_used++;
  d->space.map[j] = (struct alloc_entry){.ptr = p, .size = size, .span = s};
  return true;
}

struct alloc_entry *psa_map_find(struct device *d, CUdeviceptr p)
{
  if (!d->space.map_cap)
    return NULL;
  for (uint64_t j = slot_of(p, d->space.map_cap);; j = (j + 1) & (d->space.map_cap - 1)) {
    if (d->space.map[j].ptr == p)
      return &d->space.map[j];
    if (d->space.map[j].ptr == EMPTY)
      return NULL;
  }
}

void psa_map_remove(struct alloc_entry *e)
{
  e->ptr = TOMBSTONE;
  e->span = NULL;
}
