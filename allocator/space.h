/* The allocator's lowest floor, the chunk space: devices, frames, chunks, spans, the
 * allocation map, graph capture and the marks on chunks. Private to allocator/.
 *
 * allocator/ is built in floors, each calling only down: the chunk space (this header);
 * one move (move.h: copies, remaps); paging (paging.h: the launches'
 * bracketing, the plan and its owner thread); sharing (sharing.h: among the node's ranks, and with other
 * processes); on top the entry points (allocator_internal.h: alloc.c, stats.c). Where a
 * lower floor needs what a higher one does, it calls a hook the higher floor registers
 * (psa_space_hooks here, and one struct per floor above); a NULL hook has nothing to do.
 * tests/layers/check_layers.py checks the floors. */
#ifndef PSSHIM_ALLOCATOR_SPACE_H
#define PSSHIM_ALLOCATOR_SPACE_H

#include "allocator/allocator.h"
#include "core/core.h"
#include "tracer/tracer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define PSA_NO_FRAME UINT32_MAX
#define PSA_MAX_MIGRATIONS 128  /* moves whose copies are in flight at once per device */
#define PSA_USER_MARKS 4        /* streams whose use of a chunk is tracked at once */

/* Asserts, in debug and test builds, that the calling thread holds d->lock (core.h). */
#define PSA_HELD(d) ps_mutex_assert_held(&(d)->lock)

/* Invariants checked in debug and test builds (ps_check_failed on a breach), d->lock held:
 * a span's free ranges (spans.c: sorted, disjoint, none empty, none mergeable with the
 * next, inside the span, with its live bytes never more than the span); the frames
 * (frames.c: no frame under two chunks nor both mapped and free, every frame made either
 * held or free, the held ones within the budgets); the marks (marks.c: none kept after it
 * was let go, none let go while kept, at most one per stream on a chunk (the per-thread
 * stream aside: each thread's is its own), every chunk listed
 * as copying with its copy's mark). */
#ifdef PS_CHECKS
struct span;
struct device;
void psa_span_check(const struct device *d, const struct span *s);
void psa_frames_check(struct device *d);
void psa_marks_check(struct device *d);
#else
#define psa_span_check(d, s) ((void)0)
#define psa_frames_check(d) ((void)0)
#define psa_marks_check(d) ((void)0)
#endif

/* Physical memory of one chunk's size, with a fixed second mapping (staging) through
 * which migration copies into it while the chunk's own addresses still point elsewhere. */
struct frame {
  CUmemGenericAllocationHandle handle;
  CUdeviceptr staging;
  enum psa_where where;
  uint32_t next_free; /* free-list link */
};

/* A free range inside a span. pending: freed on `stream` and not yet known to be passed
 * by it, so only work on that same stream may reuse it. */
struct range {
  uint64_t off, len;
  bool pending;
  CUstream stream; /* its key (psa_stream_key): the per-thread default stream named per thread */
  CUevent event;
  uint64_t graph; /* held for a captured graph (capture.c): its capture, or PSA_AFTER_CAPTURE */
};

struct span {
  uint64_t first_chunk, nchunks;
  uint64_t live_bytes;
  uint32_t live_allocs;
  struct range *ranges; /* sorted by off, never adjacent-and-mergeable */
  uint32_t nranges, cap;
  enum psa_where where; /* GPU only when every chunk has a GPU frame */
  bool building;        /* frames still being taken (the lock may drop): not listed yet */
  bool exported;        /* a CUDA IPC handle of an allocation in it was made (ipc.c): another
                           process may map its frames, so its chunks never move again */
  uint64_t last_alloc;  /* the device's moment clock at its latest allocation */
  struct span *prev, *next; /* in its device's list for `where` */
  uint32_t in_flight; /* observed launches naming it between their enter and exit (launches.c) */
};

/* A point in one stream's work, shared (counted) by everything waiting to know it has
 * passed: a launch's chunks, a move's chunk and old frame (marks.c). */
struct psa_mark {
  CUevent event;
  CUstream stream;
  uint32_t refs;
  bool done;                /* the event was seen complete */
  struct psa_mark *next_free;
};

/* A chunk's move, one state at a time (move.c makes the transitions, psa_copy_done the last):
 * SETTLED -> REMAPPING: a move began; its addresses change with d->lock dropped, and a
 *   launch that reaches the chunk waits for the remap;
 * REMAPPING -> COPYING: remapped, its live bytes queued on a copy stream behind `copy`; a
 *   launch that touches it makes its stream wait for the copy;
 * REMAPPING -> SETTLED: nothing moved (the driver refused): it is back on its frame;
 * COPYING -> SETTLED: the copy seen done. */
enum psa_move_state { PSA_SETTLED = 0, PSA_REMAPPING, PSA_COPYING };

/* A chunk's state: where it is, its move, and what the launches that touched it tell (used
 * when, by which streams; whether one is in flight is its span's). */
struct chunk {
  uint32_t frame; /* PSA_NO_FRAME when unmapped */
  enum psa_move_state move;
  struct span *span;
  struct psa_mark *copy; /* COPYING: the mark behind the copy */
  /* The launches that touched it (launches.c): those that name an allocation it holds part of
   * by the allocation's start, or any pointer into its span that is not an allocation's
   * start (nothing tells how far a kernel reads from such a pointer). */
  uint32_t nusers;
  struct psa_mark *users[PSA_USER_MARKS]; /* after the launches that touched it, by stream */
  uint64_t last_use; /* the latest launch that touched it (+1; 0: none) */
};

struct alloc_entry {
  CUdeviceptr ptr; /* 0 empty, 1 tombstone */
  uint64_t size;
  struct span *span;
  uint64_t graph; /* the capture it was made in (capture.c), 0 outside any */
};

/* One device's allocator state. Lock order (core.h's ranks, checked in debug builds):
 * space.c's setup_lock, then a device's lock (comm/'s node accounting, psc_host_reserve,
 * and the trace are called under it); two devices' locks are held at once only by the fork
 * handler, in rising ordinal (launches.c and alloc.c visit devices one at a time). Each group below
 * says what guards it. One lock guards every mutable group: an allocation, a move and a
 * plan each read and write the chunks, their spans, frames, marks and statistics in one
 * step, so finer locks would be taken together on every path, and the drops below would
 * then have to release several in order.
 *
 * Functions that drop d->lock say so in their contract ("Drops d->lock") and check on entry
 * that the caller holds it (PSA_HELD, in debug and test builds); a caller re-checks what it
 * read before the call. The drops: making a frame (frames.c: the
 * driver's cuMemCreate, up to ~20 ms for a host frame, runs without the lock), waiting
 * for a frame another thread is making, waiting for a gather (shard.c), a move's remap
 * (move.c: the chunk is REMAPPING meanwhile) and waiting for one to finish.
 *
 * The floors above keep their own state (struct psa_moves, struct psa_pager, struct
 * psa_shard), which this floor holds only as pointers to types it does not know. */
struct device {
  ps_mutex lock;
  /* Set up once under setup_lock before `ready` is published (release); read without a
   * lock after. Only the pointers are fixed: what chunks[] points to is d->lock's. */
  bool ready, failed;
  bool refused; /* the configuration asks what the device cannot honour: allocations fail */
  int ordinal;
  CUdevice dev;
  CUcontext ctx;
  uint64_t chunk_size;
  CUdeviceptr base, staging_base;
  uint64_t nchunks, max_frames;
  bool host_numa; /* HOST_NUMA frames work; else plain HOST */
  bool exportable; /* frames are made exportable as file descriptors (CUDA IPC, ipc.c) */
  struct chunk *chunks; /* entries: d->lock */
  /* The chunk space and the allocations in it (space.c, spans.c, alloc_map.c): d->lock. */
  struct {
    struct span *spans[3]; /* by where: GPU and HOST lists */
    struct span *last_span; /* the span that took the latest allocation (spans.c: only it grows) */
    uint64_t chunk_hint;
    uint64_t chunks_high; /* one past the highest chunk ever reserved: scans stop there */
    struct alloc_entry *map;
    uint64_t map_cap, map_used; /* used counts tombstones too */
    uint64_t reserved_high, used_high; /* since the last psa_usage_reset_high */
    uint64_t alloc_digest; /* the allocations' sizes, as a sum of mixed sizes (space.c) */
    uint64_t clock; /* the latest moment that touched a chunk (+1): paging keeps it, spans note it (last_alloc) */
  } space;
  /* Spare events, for pending ranges and marks (spans.c): d->lock. */
  struct {
    CUevent *pool;
    uint32_t n, cap;
  } events;
  /* Frames (frames.c): d->lock. A frame being made holds its claimed slot (in_making)
   * while the lock is dropped; made_one (a condition on d->lock) says it is done. */
  struct {
    struct frame *frames; /* the array is fixed at set-up; its entries are d->lock's */
    uint32_t made;        /* slots ever claimed */
    uint32_t free_gpu, free_host; /* free-frame lists */
    uint32_t dead;                /* slots of destroyed frames, reused first */
    uint64_t gpu_limit, host_limit, gpu_held, host_held;
    bool node_budget_said;
    uint32_t in_making[3]; /* by where */
    pthread_cond_t made_one;
  } fr;
  /* The host frame pool's thread (frames.c): d->lock; wake is a condition on it. `thread`
   * is written once before the thread runs. */
  struct {
    pthread_t thread;
    pthread_cond_t wake;
    bool running;
    uint32_t target;
  } pool;
  /* Marks (marks.c): d->lock. */
  struct {
    struct psa_mark *free;
    uint64_t copying[PSA_MAX_MIGRATIONS]; /* chunks whose move's copy is in flight */
    uint32_t ncopying;
    /* The latest launch that read a chunk in a host frame in place (launches.c): a remap made
     * before it passes runs beside in-place reads, which make it many times dearer. */
    struct psa_mark *inplace;
  } marks;
  struct psa_moves *moves; /* one move's state (move.h): d->lock; made at set-up (psa_space_hooks.setup) */
  struct psa_pager *pager; /* paging's (paging.h): likewise */
  struct psa_shard *shard; /* sharing among the node's ranks (shard.c), NULL until used: d->lock */
  struct psa_stats stats;  /* d->lock; psa_stats_get copies them under it */
};

extern struct device psa_devices[PSA_MAX_DEVICES];
/* [lo, hi) of each ready device's reservation, read without the lock by psa_owns. */
extern _Atomic uint64_t psa_space_lo[PSA_MAX_DEVICES], psa_space_hi[PSA_MAX_DEVICES];

/* space.c */
struct device *psa_device_get(int ordinal); /* sets the device up on first use; NULL on failure */
void psa_digest_alloc(struct device *d, uint64_t size);
bool psa_chunks_reserve(struct device *d, uint64_t n, uint64_t *first);
/* Whether chunks [first, first + n) exist and are unreserved. */
bool psa_chunks_free(const struct device *d, uint64_t first, uint64_t n);
/* Notes that chunks below end may be reserved (scans stop at d->chunks_high). */
void psa_chunks_note_high(struct device *d, uint64_t end);
void psa_chunks_unreserve(struct device *d, uint64_t first, uint64_t n);
CUresult psa_map(struct device *d, CUdeviceptr va, CUmemGenericAllocationHandle h);

/* frames.c */
CUresult psa_frames_init(struct device *d);
/* How a frame of `where` is made: pinned, on the device or on the host (NUMA node 0), and
 * exportable as a file descriptor where the device allows it (d->exportable). */
CUmemAllocationProp psa_frame_prop(const struct device *d, enum psa_where where);
/* A free frame of `where`, made if under the limit; PSA_NO_FRAME when none can be had.
 * Drops d->lock while it makes one, or waits for one another thread makes (struct device). */
uint32_t psa_frame_take(struct device *d, enum psa_where where);
void psa_frame_give(struct device *d, uint32_t f);
/* Releases a frame's memory for good (a shared chunk no longer needs its own); its slot is
 * reused by the next frame made. */
void psa_frame_destroy(struct device *d, uint32_t f);
/* The frame index of every chunk shared among the node's ranks (shard.c): a host "frame"
 * of pieces, one slot past every real frame; never given back nor moved. */
static inline uint32_t psa_shared_frame(const struct device *d) { return (uint32_t)d->max_frames + 1; }

/* spans.c */
/* A span of nchunks at chunk `at`, which must be unreserved, or anywhere (PSA_ANYWHERE,
 * taking back idle spans where none is free). Drops d->lock (struct device): the span is
 * `building`, unlisted, meanwhile. */
#define PSA_ANYWHERE UINT64_MAX
struct span *psa_span_new(struct device *d, uint64_t nchunks, uint64_t at);
void psa_span_delete(struct device *d, struct span *s);
/* The smallest free range of s that `stream` may use for size bytes (best fit keeps big
 * ranges whole for big tensors), or -1; then carving size bytes from its start. */
int64_t psa_span_best(struct device *d, struct span *s, uint64_t size, CUstream stream);
uint64_t psa_span_take(struct device *d, struct span *s, uint32_t i, uint64_t size);
/* Takes the free bytes [off, off + size) of s, where one range that `stream` may use holds
 * them all; false where none does (or its table cannot grow). */
bool psa_span_take_at(struct device *d, struct span *s, uint64_t off, uint64_t size, CUstream stream);
/* Places size bytes in the free tail of the span that took the latest allocation, growing
 * it into the unreserved chunks after it, when that takes fewer new chunks than a span of
 * their own; NULL if it cannot. Drops d->lock (struct device). */
struct span *psa_span_extend(struct device *d, uint64_t size, CUstream stream, uint64_t *off);
/* graph: the bytes stay held for a captured graph (see capture.c), 0 when they do not. */
void psa_span_release(struct device *d, struct span *s, uint64_t off, uint64_t size, CUstream stream,
                      CUevent ev, uint64_t graph);
bool psa_span_idle(struct device *d, struct span *s);
/* A host frame for a page-out: an idle span's first, then a free or new one. The pager's
 * page-outs of the iteration's own allocations leave spans idle in host frames once freed,
 * while the next allocations go to GPU frames: with new frames first, host frames grew
 * every step (to the node's budget on the test driver). Drops d->lock (struct device). */
uint32_t psa_host_frame(struct device *d);
void psa_span_relist(struct device *d, struct span *s);
/* A CHUNK record (enum pst_chunk_event) when tracing. */
void psa_trace_chunk(struct device *d, uint64_t chunk, uint32_t event);
CUevent psa_event_get(struct device *d);
void psa_event_put(struct device *d, CUevent e);

/* The next live (allocated) bytes of chunk at or after span offset *at: [*at, *end);
 * false when there are none before the chunk's end. */
bool psa_live_next(struct device *d, uint64_t chunk, uint64_t *at, uint64_t *end);

/* marks.c (called with d->lock held) */
/* A mark recorded now on stream s, or NULL. */
struct psa_mark *psa_mark_new(struct device *d, CUstream s);
void psa_mark_put(struct device *d, struct psa_mark *m);
/* Whether the work before the mark has completed (sync: wait for it). */
bool psa_mark_passed(struct device *d, struct psa_mark *m, bool sync);
/* Waits for the work before mark m with d->lock dropped; the reference it takes keeps m. */
CUresult psa_mark_wait_unlocked(struct device *d, struct psa_mark *m);
/* Drops the chunk's marks that have passed; true when none is left (sync: wait for all). */
bool psa_users_passed(struct device *d, struct chunk *c, bool sync);
/* Keeps launch mark m on the chunk (see marks.c). */
void psa_add_user(struct device *d, struct chunk *c, struct psa_mark *m);
/* A deleted span's chunks forget their marks and last use (see marks.c). */
void psa_span_forget_users(struct device *d, struct span *s);
/* True once the chunk's last move's copy has completed (sync: wait for it). */
bool psa_copy_done(struct device *d, uint64_t chunk, bool sync);

/* space.c: what the ranks of the node compare and share (rounds.c, shard.c use them) */
extern _Atomic bool psa_allocs_agree; /* the allocation check passed: chunk ids match across ranks */
/* What the devices allocated so far, in one number, compared among the ranks at their
 * first meeting: sets psa_allocs_agree. */
void psa_compare_allocs(void);
/* ram, or the memory limit of the cgroup that proc_cgroup (/proc/self/cgroup's format)
 * names under cgroup_root (v2's memory.max, v1's memory/.../memory.limit_in_bytes) where
 * that is lower (space.c: the host budget's base). */
uint64_t psa_ram_limit(uint64_t ram, const char *proc_cgroup, const char *cgroup_root);

/* capture.c: graph capture */
#define PSA_CAPTURE_UNKNOWN (UINT64_MAX - 1) /* capturing, id not known: nothing reuses its bytes */
#define PSA_AFTER_CAPTURE UINT64_MAX         /* a free that waits for the device once no capture is underway */
bool psa_capture_underway(void); /* a capture begun through the doors has not ended */
/* The capture that work queued on `stream` joins: its id, 0 when none. */
uint64_t psa_stream_capture(CUstream stream);
/* The calling thread's capture mode made RELAXED while `capture`, put back by psa_unrelax:
 * declare `struct psa_relaxed r PSA_RELAXED_SCOPE = psa_relax(...)` and it is put back at
 * the end of the scope, whatever the return. */
struct psa_relaxed {
  CUstreamCaptureMode mode;
  bool on;
};
struct psa_relaxed psa_relax(bool capture);
void psa_unrelax(struct psa_relaxed *r);
#define PSA_RELAXED_SCOPE __attribute__((cleanup(psa_unrelax), unused))
/* The capture of the allocation the calling thread places now (0: none), for the rule below. */
void psa_placing_capture(uint64_t capture);
/* Whether an allocation on `stream` may take free range r now. */
bool psa_range_usable(const struct range *r, CUstream stream);
/* What tells one stream from another in a free range: the handle, but the per-thread default
 * stream's handle names a different stream on every thread, so it is made the thread's own. */
CUstream psa_stream_key(CUstream stream);

/* alloc_map.c */
bool psa_map_put(struct device *d, CUdeviceptr p, uint64_t size, struct span *s);
struct alloc_entry *psa_map_find(struct device *d, CUdeviceptr p);
void psa_map_remove(struct alloc_entry *e);

/* What this floor asks of the floors above, registered before the first device is set up
 * (alloc.c); a NULL hook has nothing to do. */
struct psa_space_hooks {
  /* Sets up the floors' state on a device being set up (under setup_lock, before it is
   * ready); false fails the set-up. */
  bool (*setup)(struct device *d);
  /* A GPU frame for a chunk being placed when none is free or can be taken back, made by
   * paging out (paging's room by age), or PSA_NO_FRAME. Drops d->lock. */
  uint32_t (*gpu_room)(struct device *d);
  /* A chunk on the shared frame (psa_shared_frame) is unmapped, its span deleted: sharing
   * lets its pieces go. Drops d->lock while a gather reads the chunk. */
  void (*shared_drop)(struct device *d, uint64_t chunk);
};
extern struct psa_space_hooks psa_space_hooks;

/* Whether the chunk is mapped onto a frame of kind w. */
static inline bool psa_chunk_on(const struct device *d, const struct chunk *c, enum psa_where w)
{
  return c->frame != PSA_NO_FRAME && d->fr.frames[c->frame].where == w;
}

/* A GPU frame can be had without taking one back: one is free, or the budget allows another. */
static inline bool psa_gpu_frame_available(const struct device *d)
{
  return d->fr.free_gpu != PSA_NO_FRAME || d->stats.gpu_frames_made < d->fr.gpu_limit;
}

/* GPU frames neither held by a chunk nor yet to be made: those free, being made, or allowed. */
static inline uint64_t psa_gpu_frames_free(const struct device *d)
{
  return d->fr.gpu_limit > d->fr.gpu_held ? d->fr.gpu_limit - d->fr.gpu_held : 0;
}

static inline uint64_t psa_round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }
/* The alignment of a range of chunks: the driver takes only a power of two, and a chunk
 * size is any multiple of the granularity (6M on a node of 3 ranks), so the largest power
 * of two that divides it. Nothing needs more: chunks are found by subtraction, not masks. */
static inline uint64_t psa_va_align(uint64_t chunk_size) { return chunk_size & (~chunk_size + 1); }

static inline uint64_t psa_now_ns(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

#endif
