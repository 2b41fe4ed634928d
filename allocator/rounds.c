/* Where the node's ranks meet: at the first allocation or free after an iteration
 * boundary, on the thread that makes it, never inside the launch callback that found the
 * boundary. A meeting synchronizes the device, checksums chunks on the CPU, exchanges over
 * a socket and all-gathers through NCCL, which may take seconds and waits for the other
 * ranks: inside the driver's callback that would all happen under whatever the driver
 * holds around it. At an allocation the program is in its own code, holding nothing of
 * the driver's, at the same point of its program on every rank (a thread of psshim's own
 * would meet wherever each rank happened to be: which chunks are equal then is timing).
 *
 * Boundaries are taken in order, one meeting each (the first also compares what the ranks
 * allocated), so every rank counts every boundary alike: a meeting is collective. None is
 * held while a stream captures (its device synchronization would break the capture): the
 * boundaries wait for the next allocation after it. */
#include "allocator/sharing.h"
#include "comm/comm.h"

static _Atomic uint64_t pending, latest_period; /* boundaries met and not yet taken */
static ps_mutex meeting = PS_MUTEX_INITIALIZER(PS_RANK_MEETING, "the node meeting lock"); /* one thread takes them */
static bool compared; /* under meeting: the allocations were compared */

void psa_shard_boundary(uint64_t period)
{
  if (psc_nranks() < 2 || ps_in_forked_child())
    return;
  atomic_store(&latest_period, period);
  atomic_fetch_add(&pending, 1);
}

void psa_meet_ranks(void)
{
  if (!atomic_load_explicit(&pending, memory_order_relaxed) || ps_in_own_calls() || psa_capture_underway())
    return;
  /* Another thread meeting now takes these boundaries too. */
  if (ps_mutex_trylock(&meeting))
    return;
  ps_own_work(true); /* its copies and syncs are not the program's moments */
  for (; atomic_load(&pending); atomic_fetch_sub(&pending, 1)) {
    if (!compared) {
      compared = true;
      psa_compare_allocs();
    }
    psa_shard_round(atomic_load(&latest_period));
  }
  ps_own_work(false);
  ps_mutex_unlock(&meeting);
}
