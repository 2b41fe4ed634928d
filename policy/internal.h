/* Shared between policy/ files only. */
#ifndef PSSHIM_POLICY_INTERNAL_H
#define PSSHIM_POLICY_INTERNAL_H

#include "policy/policy.h"

/* The first moment at or after m that touches the chunk, or PSP_NEVER. */
uint64_t psp_use_from(const psp_schedule *s, uint32_t chunk, uint64_t m);
/* The same, and *fresh (may be NULL): that use follows an empty range (psp_schedule_empty). */
uint64_t psp_use_fresh_from(const psp_schedule *s, uint32_t chunk, uint64_t m, bool *fresh);

/* Eviction order: true if a goes before b. rank is the policy's key, larger = evict first
 * (OPT: next use; LRU: age); ties go to clean, then larger, then lower id. */
bool psp_evicts_before(const psp_cand *a, uint64_t rank_a, const psp_cand *b, uint64_t rank_b);

#endif
