/* Helpers shared by the policy tests; each test file declares what it uses. */
#include <stdint.h>

/* splitmix64: small, seedable, good enough to draw test cases */
uint64_t tp_rand(uint64_t *state)
{
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint32_t tp_below(uint64_t *state, uint32_t n) { return (uint32_t)(tp_rand(state) % n); }
