/* policy/ — decisions only: which chunk holds a GPU frame, what to prefetch, what to evict.
 *
 * Works on an abstract model (chunk ids, byte sizes, "moments" = one kernel launch or
 * transfer each), with no CUDA, no I/O and no global state, so the allocator uses it online
 * and the report tool replays a recorded trace through it offline. Functions that allocate
 * return -1 with errno set when they fail; nothing here logs.
 *
 * Moments are absolute: moment t of iteration k is k * period + t (keep them below 2^63). */
#ifndef PSSHIM_POLICY_H
#define PSSHIM_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PSP_NEVER UINT64_MAX

/* ---- schedule: one training iteration as the tracer saw it during warm-up ---- */

typedef struct psp_use {
  uint32_t chunk;
  bool written;
  bool fresh;  /* set by sealing: the chunk held nothing live before (psp_schedule_empty) */
} psp_use;

typedef struct psp_schedule psp_schedule;

psp_schedule *psp_schedule_new(void);
void psp_schedule_free(psp_schedule *s);
/* Declares a chunk (ids need not be dense) or changes its size; bytes > 0. */
int psp_schedule_chunk(psp_schedule *s, uint32_t chunk, uint64_t bytes);
/* Opens the next moment. nonmodel_bytes: GPU bytes in use then that psshim does not page. */
int psp_schedule_moment(psp_schedule *s, uint64_t nonmodel_bytes);
/* The open moment touches a declared chunk; a repeated touch merges (written is or-ed). */
int psp_schedule_touch(psp_schedule *s, uint32_t chunk, bool written);
/* The chunk holds nothing live after moment `after` until moment `before` of the iteration
 * (before <= after: across the iteration's end), e.g. activations freed and allocated
 * again. Then its next use is fresh: it needs a frame but nothing copied in, and what it
 * held before need not be copied out. No use may fall strictly between (sealing fails
 * with EINVAL, and the schedule stays unsealed). */
int psp_schedule_empty(psp_schedule *s, uint32_t chunk, uint32_t after, uint32_t before);
/* Ends building and indexes uses by chunk. Next-use and margin queries need a sealed
 * schedule; a sealed one takes no more moments or touches. */
int psp_schedule_seal(psp_schedule *s);

uint32_t psp_schedule_period(const psp_schedule *s);  /* moments per iteration */
uint32_t psp_schedule_chunks(const psp_schedule *s);  /* one past the highest chunk id */
uint64_t psp_schedule_chunk_bytes(const psp_schedule *s, uint32_t chunk);  /* 0: unknown */
/* The chunks touched at moment m (taken modulo the period). */
size_t psp_schedule_uses(const psp_schedule *s, uint64_t m, const psp_use **uses);
uint64_t psp_schedule_nonmodel(const psp_schedule *s, uint64_t m);
/* Moments per iteration that touch the chunk; *written (may be NULL): one of them writes. */
uint32_t psp_schedule_use_count(const psp_schedule *s, uint32_t chunk, bool *written);
/* The next moment strictly after m that touches the chunk, wrapping into the following
 * iterations, or PSP_NEVER. O(log uses). */
uint64_t psp_next_use(const psp_schedule *s, uint32_t chunk, uint64_t m);
/* PatrickStar's margin: the most non-model bytes in use at any moment of [m, m + window).
 * Constant time (at most 128 moments scanned). */
uint64_t psp_schedule_margin(const psp_schedule *s, uint64_t m, uint32_t window);

/* ---- period detection over the stream of launch signatures ---- */

typedef struct psp_period psp_period;

/* Finds periods of up to max_period launches that repeat `repeats` (>= 2) times, allowing
 * `noise` (e.g. 0.02; 0: none) of launches inserted, missing or changed. NULL if out of
 * memory, max_period is 0 or repeats < 2. Memory, all taken here: 12 bytes times
 * (repeats + 1) * max_period rounded up to a power of two, plus 64 * max_period. */
psp_period *psp_period_new(uint32_t max_period, uint32_t repeats, double noise);
void psp_period_free(psp_period *d);
void psp_period_feed(psp_period *d, uint64_t signature);  /* O(1) */
/* True when the recent stream is periodic: *period launches per iteration, and
 * *phase_start = index (counting fed signatures from 0) of the launch that began the latest
 * complete iteration. Iteration boundaries stay where they were first seen as long as this
 * is asked at least once per (repeats + 1) * max_period launches. */
bool psp_period_get(psp_period *d, uint32_t *period, uint64_t *phase_start);

/* ---- trust: whether a detected period is the training iteration ---- */

/* A period is only a candidate iteration until two of its boundaries in a row find the
 * same bytes allocated, give or take PSP_TRUST_SLACK, with allocations between them (an
 * iteration allocates its activations): a layer's launches repeat as a step's do, but each
 * layer leaves its activations behind (megabytes), while a step may keep a few bytes (a
 * loss tensor a loop logs). Where a layer's period stood, plans and sharing rounds ran at
 * every layer, and the pager's first steps were slower than static placement's.
 *
 * A program whose allocator pools its memory (CuPy's, XLA's, torch's own caching
 * allocator) allocates nothing psshim sees once warm, so its iterations allocate nothing:
 * a period is trusted too once PSP_TRUST_POOLED boundaries in a row found the same live
 * bytes and no allocation since the one before. A part of a step that repeats without
 * allocating (a loop over layers that keeps nothing) seldom lasts that long, and the
 * step's next part, no longer periodic, drops it. */
#define PSP_TRUST_SLACK (1u << 20) /* live bytes steady boundaries differ by: less than this */
#define PSP_TRUST_POOLED 4
/* One period's trust, fed its boundaries as they come. Zeroed = reset. */
typedef struct psp_trust {
  bool trusted;   /* read freely; only the functions below write it */
  bool seen;      /* a boundary since the reset: live and allocs are the last one's */
  uint32_t quiet; /* boundaries in a row: live bytes unchanged, nothing allocated */
  uint64_t live, allocs;
} psp_trust;
/* A new period, or none: untrusted, no boundary seen. */
void psp_trust_reset(psp_trust *t);
/* A boundary of the period: live bytes then and allocations made so far (a count that
 * only grows). Returns whether the period is trusted after it; a trusted period's
 * boundaries change nothing. */
bool psp_trust_boundary(psp_trust *t, uint64_t live, uint64_t allocs);
/* A boundary the period passed before it was adopted, taken as its last without judging
 * it: the next boundary can trust the period without waiting for two more. */
void psp_trust_passed(psp_trust *t, uint64_t live, uint64_t allocs);
/* The rule for two boundaries in a row: allocations between them, live bytes within the
 * slack. */
bool psp_trust_steady(uint64_t live_was, uint64_t allocs_was, uint64_t live_now, uint64_t allocs_now);

/* ---- eviction ---- */

typedef struct psp_cand {
  uint32_t chunk;
  uint64_t bytes;
  uint64_t last_use;  /* latest moment that touched it (LRU) */
  bool dirty;         /* written since paged in: evicting it costs a copy */
  uint64_t next_use;  /* psp_sort_farthest: its rank (a next use, or an age) */
} psp_cand;

/* Both return an index into cands, or -1 when every candidate is in use at `now`.
 * Ties go to a clean chunk (no copy), then the larger, then the lower id. */
/* OPT/Belady: the chunk used farthest in the future; chunks the schedule uses at `now` are
 * pinned. Chunks the schedule never uses go first. */
ptrdiff_t psp_victim_opt(const psp_schedule *s, uint64_t now, const psp_cand *cands, size_t n);
/* LRU, for when there is no schedule: the least recently used; last_use == now is pinned. */
ptrdiff_t psp_victim_lru(uint64_t now, const psp_cand *cands, size_t n);

/* Puts the first k candidates in eviction order (the largest psp_cand.next_use first: the
 * one needed farthest ahead, or unused longest, as the caller ranks them; ties as for the
 * victims above) at the front, sorted; the rest follow in no order. k >= n sorts all.
 * O(n + k log k). */
void psp_sort_farthest(psp_cand *cands, size_t n, size_t k);

/* ---- offline replay ---- */

typedef enum psp_policy {
  PSP_POLICY_OPT,     /* demand paging, evicting by psp_victim_opt */
  PSP_POLICY_LRU,     /* demand paging, evicting by psp_victim_lru */
  PSP_POLICY_STATIC,  /* first touch takes a GPU frame while any is left; nothing moves */
} psp_policy;

typedef struct psp_sim {
  uint64_t page_ins, bytes_in;
  uint64_t page_outs, bytes_out;  /* evictions of chunks written since paged in */
  uint64_t drops;                 /* evictions of clean chunks: no copy */
  uint64_t in_place_moments;      /* moments that touched a chunk left in host memory */
  uint64_t bytes_in_place;        /* those chunks' bytes, each moment's counted: at most what
                                     the kernels read across PCIe */
} psp_sim;

/* Replays `iterations` iterations of a sealed schedule from a cold start (every chunk in
 * host memory) under `budget` GPU bytes, of which each moment's non-model bytes are taken
 * first (STATIC keeps the iteration's peak non-model bytes aside instead). */
int psp_simulate(const psp_schedule *s, uint64_t budget, psp_policy policy,
                 uint32_t iterations, psp_sim *out);

/* ---- plan: when to move what, for an iteration that repeats ---- */

/* Pinned copies over a PCIe 5 x16 link, as measured (shared/DESIGN.md), bytes/s: each
 * direction alone, both at once; and a kernel reading pinned host memory in place. The
 * rates the plan is made with where nothing measured them in the run. */
#define PSP_PCIE_H2D 55.4e9
#define PSP_PCIE_D2H 55.3e9
#define PSP_PCIE_BOTH 96.4e9
#define PSP_PCIE_IN_PLACE 51e9

typedef struct psp_costs {
  double h2d, d2h;  /* copy rates, bytes/s, each direction alone */
  double both;      /* bytes/s of the two directions together while both copy */
  double in_place;  /* bytes/s a kernel reads from host memory across PCIe */
  const uint64_t *moment_ns;  /* each moment's duration (period entries); NULL: default_ns */
  uint64_t default_ns;
  /* Moments a chunk stays busy after a use (the host runs that far ahead of the GPU): one
   * used at moment u is neither evicted nor fetched before moment u + lag. 0 or 1: at once
   * after the use; a whole period or more: never while each iteration uses it. */
  uint32_t lag;
} psp_costs;

typedef enum psp_dir { PSP_TO_GPU, PSP_TO_HOST } psp_dir;

typedef struct psp_move {
  uint32_t at;     /* issued before moment `at` of the iteration runs */
  uint32_t chunk;
  psp_dir dir;
  uint32_t need;   /* PSP_TO_GPU: the moment that uses it; < at: the next iteration's */
  uint64_t bytes;  /* copied: 0 when nothing live needs it (clean, or fresh) */
} psp_move;

typedef struct psp_plan {
  psp_move *moves;      /* by `at`; at one moment evictions first, fetches by `need` */
  size_t n_moves;
  uint32_t *start;      /* chunks on the GPU as the iteration begins: also where it ends */
  size_t n_start;
  uint64_t bytes_in, bytes_out;  /* copied per iteration */
  uint32_t in_place;    /* moments that read a chunk left in host memory */
  uint64_t bytes_in_place;  /* the bytes of those chunks, each moment's counted */
  uint64_t work_ns;     /* the moments' own durations (in-place reads included) */
  uint64_t step_ns;     /* predicted iteration: the moments plus their waits */
  uint32_t waits;       /* moments that waited for a fetch still copying */
  uint64_t wait_ns;
} psp_plan;

/* A steady plan for a sealed schedule of one iteration under `budget` GPU bytes (each
 * moment's non-model bytes taken first): OPT demand paging over an iteration that ends
 * where it began, each eviction issued c->lag moments after the chunk's last use (right
 * after it at lag 0 or 1), victims only among chunks that quiet by then (a chunk no frame
 * can be freed for is read in place; growing non-model bytes that nothing quiet can make
 * room for are left unmet), each fetch as early as free frames and the lag allow; write-back only of chunks written since they came in, and
 * nothing copied for fresh uses. With equal chunk sizes it has copied in as few chunks as
 * any cyclic placement in every case tests/unit/test_plan.c compared exhaustively.
 * step_ns replays three iterations: moments in order, each waiting for the fetches it
 * needs; one copy engine per direction, each in issue order, sharing `both` while both
 * copy. A fetch does not wait for the write-back of the frame it takes (frames are
 * counted free at the eviction's issue). EINVAL: a rate not above 0. */
int psp_plan_make(const psp_schedule *s, uint64_t budget, const psp_costs *c, psp_plan *out);
void psp_plan_free(psp_plan *p);

#endif
