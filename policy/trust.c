/* Whether a detected period is the training iteration: the rule policy.h gives, applied
 * to the period's boundaries as they come. */
#include "policy/policy.h"

static bool same_live(uint64_t was, uint64_t now)
{
  return (now > was ? now - was : was - now) < PSP_TRUST_SLACK;
}

bool psp_trust_steady(uint64_t live_was, uint64_t allocs_was, uint64_t live_now, uint64_t allocs_now)
{
  return allocs_now > allocs_was && same_live(live_was, live_now);
}

void psp_trust_reset(psp_trust *t) { *t = (psp_trust){0}; }

void psp_trust_passed(psp_trust *t, uint64_t live, uint64_t allocs)
{
  t->seen = true;
  t->live = live;
  t->allocs = allocs;
}

bool psp_trust_boundary(psp_trust *t, uint64_t live, uint64_t allocs)
{
  if (t->trusted)
    return true;
  bool quiet = t->seen && same_live(t->live, live) && allocs == t->allocs;
  t->quiet = quiet ? t->quiet + 1 : 0;
  if ((t->seen && psp_trust_steady(t->live, t->allocs, live, allocs)) || t->quiet >= PSP_TRUST_POOLED)
    t->trusted = true;
  psp_trust_passed(t, live, allocs);
  return t->trusted;
}
