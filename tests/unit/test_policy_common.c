/* Helpers shared by the policy tests; each test file declares what it uses. */
#include <stdint.h>

#include "policy/policy.h"

/* splitmix64: small, seedable, good enough to draw test cases */
uint64_t tp_rand(uint64_t *state)
{
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint32_t tp_below(uint64_t *state, uint32_t n) { return (uint32_t)(tp_rand(state) % n); }

/* Two chunks, A (id 0, a bytes) written at moment 0 and B (id 1, b bytes) read at moment 1,
 * sealed; NULL if any step fails. */
psp_schedule *tp_write_then_read(uint64_t a, uint64_t b)
{
  psp_schedule *s = psp_schedule_new();
  if (s && !psp_schedule_chunk(s, 0, a) && !psp_schedule_chunk(s, 1, b) && !psp_schedule_moment(s, 0) &&
      !psp_schedule_touch(s, 0, true) && !psp_schedule_moment(s, 0) && !psp_schedule_touch(s, 1, false) &&
      !psp_schedule_seal(s))
    return s;
  psp_schedule_free(s);
  return NULL;
}
