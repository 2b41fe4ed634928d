/* Private to tracer/: an append-only table that gives each distinct byte string a small
 * id (1, 2, ...). The writer uses one for text and one for call stacks. All memory is
 * mmap'd (never malloc: the table lives inside the traced process) and reserved up front,
 * so entries never move and a key read by id stays valid until pst_itab_destroy. The
 * caller serializes calls. */
#ifndef PSSHIM_TRACE_INTERN_H
#define PSSHIM_TRACE_INTERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pst_itab {
  uint8_t *arena;               /* the keys, back to back */
  size_t arena_used, arena_cap;
  struct pst_itab_entry { uint64_t hash; uint64_t off; uint32_t len; } *entries; /* by id - 1 */
  uint32_t count, max_entries;
  uint32_t *slots;              /* open addressing: id, 0 = empty */
  uint32_t nslots;              /* power of two, kept at least twice count */
};

bool pst_itab_init(struct pst_itab *t, size_t arena_cap, uint32_t max_entries);
void pst_itab_destroy(struct pst_itab *t);
/* Id of key; added (and *added set) when new. 0 when the table is full. */
uint32_t pst_itab_add(struct pst_itab *t, const void *key, size_t len, bool *added);
/* Key of id (1..count). */
const void *pst_itab_key(const struct pst_itab *t, uint32_t id, size_t *len);
/* Anonymous private mapping of n bytes, NULL on failure; the tracer's only allocator. */
void *pst_map(size_t n);
void pst_unmap(void *p, size_t n);

#endif
