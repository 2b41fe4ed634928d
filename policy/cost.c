/* Page in, or let kernels read the chunk in place from its host frame (zero-copy)?
 *
 * Compared per iteration, as seconds of transfer, with bandwidths the caller measured:
 *   in place:  uses * bytes / zero_copy
 *              Every use streams the chunk over PCIe. Writes flow the other way on a
 *              full-duplex link, so a written chunk costs no more.
 *   page in:   bytes / h2d  +  (written ? bytes / d2h : 0)  +  uses * bytes / hbm
 *              One copy in, one copy back if written (a clean chunk is dropped), then every
 *              use at HBM speed.
 * So a chunk a streaming kernel reads and writes once per iteration (optimizer state) stays
 * in place: one pass over PCIe instead of two copies. A chunk used many times is paged in:
 * the copy is paid once and each use is ~80x faster. Read-only and used once, the two are
 * within a few percent (on the H200: copy 55 GB/s vs zero-copy read 51 GB/s, so page in).
 * A chunk no moment uses stays in place. */
#include "policy/policy.h"

psp_place psp_choose_place(const psp_cost *cost, uint64_t bytes, uint32_t uses, bool written)
{
  double b = (double)bytes;
  double in_place = uses * b / cost->zero_copy;
  double paged = b / cost->h2d + (written ? b / cost->d2h : 0.0) + uses * b / cost->hbm;
  return in_place < paged ? PSP_IN_PLACE : PSP_PAGE_IN;
}
