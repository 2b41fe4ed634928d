/* Inside the allocator: devices, frames, chunks, spans. Private to allocator/. */
#ifndef PSSHIM_ALLOCATOR_INTERNAL_H
#define PSSHIM_ALLOCATOR_INTERNAL_H

#include "allocator/allocator.h"
#include "policy/policy.h"
#include "core/core.h"
#include "tracer/tracer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define PSA_NO_FRAME UINT32_MAX
#define PSA_MAX_MIGRATIONS 128  /* moves whose copies are in flight at once per device */
/* Bytes one plan may start moving, and the bytes of copies in flight beyond which a plan
 * starts no move (a copy a launch would wait for, queued behind many others, stalls it).
 * In bytes, so smaller chunks move as fast; at least 8 chunks. */
#define PSA_PLAN_BYTES (512ull << 20)
/* The run-ahead bound is held at every psa_hold_stride()-th marked launch, a sixteenth of
 * the window (16 at the default 256): a query of the mark PSSHIM_RUNAHEAD launches back
 * costs 0.3-1.9 us on the H200 (bench/results/mark_cost_*). */
static inline uint32_t psa_hold_stride(uint32_t runahead) { return runahead >= 32 ? runahead / 16 : 1; }
/* The ring of those launches' marks: its length, so that it spans the window. */
static inline uint32_t psa_hold_slots(uint32_t runahead) { return runahead / psa_hold_stride(runahead); }
#define PSA_USER_MARKS 4        /* streams whose use of a chunk is tracked at once */
#define PSA_USES 32             /* recent uses remembered per chunk, to predict the next: a
                                   chunk used more often per iteration counts as always due */

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
  CUstream stream;
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
  uint64_t last_alloc;  /* the device's moment clock at its latest allocation (pager.c) */
  struct span *prev, *next; /* in its device's list for `where` */
  uint32_t in_flight; /* observed launches naming it between their enter and exit (pager.c) */
};

/* A point in one stream's work, shared (counted) by everything waiting to know it has
 * passed: a launch's chunks, a move's chunk and old frame (pager.c). */
struct psa_mark {
  CUevent event;
  CUstream stream;
  uint32_t refs;
  bool done;                /* the event was seen complete */
  struct psa_mark *next_free;
};

/* A frame that becomes free once the copy out of it has completed. */
struct deferred_frame {
  uint32_t frame;
  struct psa_mark *copy;
};

/* A chunk's state: where it is, its move, and what the launches that touched it tell (used
 * when, by which streams; whether one is in flight is its span's). */
struct chunk {
  uint32_t frame; /* PSA_NO_FRAME when unmapped */
  bool moving;    /* a move is remapping it with d->lock dropped: nothing else may touch it (pager.c) */
  struct span *span;
  struct psa_mark *copy; /* its last move's copy, until seen complete */
  /* The launches that touched it (pager.c): those that name an allocation it holds part of
   * by the allocation's start, or any pointer into its span that is not an allocation's
   * start (nothing tells how far a kernel reads from such a pointer). */
  uint32_t nusers, use_pos;
  struct psa_mark *users[PSA_USER_MARKS]; /* after the launches that touched it, by stream */
  uint64_t last_use;
  uint64_t next_use; /* predicted from uses (0: not yet), valid while later than the plan */
};

/* A chunk's latest uses (pager.c), kept apart from struct chunk so that a plan's pass over
 * every chunk reads small records: in one, the uses only of chunks whose prediction is due. */
struct chunk_uses {
  uint64_t at[PSA_USES]; /* the latest moments that touched it (+1; 0 = empty), a ring */
};

struct alloc_entry {
  CUdeviceptr ptr; /* 0 empty, 1 tombstone */
  uint64_t size;
  struct span *span;
  uint64_t graph; /* the capture it was made in (capture.c), 0 outside any */
};

/* One device's allocator state. Lock order: space.c's setup_lock, then a device's lock
 * (comm/'s node accounting, psc_host_reserve, is called under it); two devices' locks are
 * never held at once (pager.c and alloc.c visit devices one at a time). Each group below
 * says what guards it. One lock guards every mutable group: an allocation, a move and a
 * plan each read and write the chunks, their spans, frames, marks and statistics in one
 * step, so finer locks would be taken together on every path, and the drops below would
 * then have to release several in order.
 *
 * Functions that drop d->lock say so in their contract ("Drops d->lock"); a caller
 * re-checks what it read before the call. The drops: making a frame (frames.c: the
 * driver's cuMemCreate, up to ~20 ms for a host frame, runs without the lock), waiting
 * for a frame another thread is making, waiting for a gather (shard.c), a move's remap
 * (pager.c: the chunk is `moving` meanwhile) and waiting for one to finish. */
struct device {
  pthread_mutex_t lock;
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
  struct chunk_uses *uses; /* one per chunk: d->lock */
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
  /* Paging (pager.c, plan_exec.c): d->lock. */
  struct {
    CUstream copy_in, copy_out; /* made at the first move */
    uint64_t copying[PSA_MAX_MIGRATIONS]; /* chunks whose move's copy is in flight */
    uint32_t ncopying;
    struct deferred_frame deferred[PSA_MAX_MIGRATIONS];
    uint32_t ndeferred;
    struct psa_mark *free_marks;
    struct psa_mark **recent; /* marks of every psa_hold_stride()-th launch of the latest PSSHIM_RUNAHEAD, a ring */
    uint32_t recent_pos;
    uint64_t marked;          /* launches marked */
    struct psa_mark *runahead_stuck; /* a run-ahead wait gave up on it: no holding back until it passes */
    uint64_t clock;           /* the latest moment that touched a chunk (+1) */
    uint64_t margin;          /* most GPU frames spans allocated into within an iteration held */
    psp_phase_max young;      /* the frames they held, by phase of the iteration */
    uint64_t predicted_for;   /* the period the chunks' next_use were predicted with */
    uint64_t next_plan, plan_gap; /* plans back off while they move nothing */
    uint64_t move_ns_mean;    /* a move's time (remap, queue the copy) on the thread that makes it */
    uint64_t period;          /* the trusted period as of the latest turn (0: none) */
    psp_cand *cands; /* scratch for the plans, two per chunk */
    uint32_t nmoving;         /* chunks `moving` */
    pthread_cond_t moved;     /* on d->lock: a chunk stopped `moving` */
  } pager;
  /* The mover (pager.c, PSSHIM_MOVER): the thread that plans and makes the moves, woken
   * by launches. Its own mutex, never held with d->lock, so a launch that wakes it never
   * waits for a plan. */
  struct {
    pthread_mutex_t mutex;
    pthread_cond_t wake;
    pthread_t thread;
    _Atomic bool crowded;  /* a plan found the iteration's own allocations outgrowing the GPU */
    bool started, running; /* running: the thread takes the turns; else the launching threads do */
    bool due;             /* a launch asked for a plan since the last one began */
    uint64_t seq, period, position; /* the latest such launch's */
    uint64_t launch_ns;   /* the launching threads' time in the pager so far (stats.launch_ns) */
  } mover;
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
/* Drops d->lock (struct device): the span is `building`, unlisted, meanwhile. */
struct span *psa_span_new(struct device *d, uint64_t nchunks);
void psa_span_delete(struct device *d, struct span *s);
/* The smallest free range of s that `stream` may use for size bytes (best fit keeps big
 * ranges whole for big tensors), or -1; then carving size bytes from its start. */
int64_t psa_span_best(struct device *d, struct span *s, uint64_t size, CUstream stream);
uint64_t psa_span_take(struct device *d, struct span *s, uint32_t i, uint64_t size);
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

/* shard.c (called with d->lock held): chunks replicated on every rank of the node kept once,
 * in pieces, while no rank touches them */
extern _Atomic bool psa_allocs_agree; /* the allocation check passed: chunk ids match across ranks */
/* Makes a shared chunk this rank's own before anything may touch it (a move: copy, remap):
 * paged in onto a GPU frame with its pieces kept when one can be had, else onto a host
 * frame; when no memory at all can be had for it, its addresses are left unmapped (the
 * touching work fails on this rank, the other ranks' data stays theirs) and sharing ends.
 * Drops d->lock (struct device). */
void psa_unshare(struct device *d, uint64_t chunk);
/* Whether the chunk is a shared one paged in (on a GPU frame of its own, pieces kept). */
bool psa_shard_paged_in(const struct device *d, uint64_t chunk);
/* A paged-in shared chunk leaves the GPU (quiescent): true when its bytes are the node's
 * copy's and it is mapped onto the pieces again, with no copy (the caller gives its GPU
 * frame back); else false, the pieces let go, and the chunk moves as any other. */
bool psa_shard_leave(struct device *d, uint64_t chunk);
/* A shared chunk's span is deleted, or a paged-in one's emptied: its pieces are unmapped
 * (if mapped) and let go. Drops d->lock while a gather reads the chunk (struct device). */
void psa_shard_drop(struct device *d, uint64_t chunk);
/* Work psshim cannot see may touch any chunk: every shared chunk becomes private and no
 * chunk is shared again (called without locks). */
void psa_shard_stop(void);
/* rounds.c: the ranks meet for the boundaries met since the last meeting, in order, at an
 * allocation or a free (called without locks; waits for the other ranks,
 * PSSHIM_COMM_TIMEOUT_S at most). */
void psa_meet_ranks(void);
/* What the devices allocated so far, in one number, compared among the ranks at their
 * first meeting (space.c): sets psa_allocs_agree. */
void psa_compare_allocs(void);
/* ram, or the memory limit of the cgroup that proc_cgroup (/proc/self/cgroup's format)
 * names under cgroup_root (v2's memory.max, v1's memory/.../memory.limit_in_bytes) where
 * that is lower (space.c: the host budget's base). */
uint64_t psa_ram_limit(uint64_t ram, const char *proc_cgroup, const char *cgroup_root);
/* A sharing round at a meeting, when one is due (shard.c). */
void psa_shard_round(uint64_t period);

/* pager.c (called with d->lock held; psa_move, psa_frame_for and psa_swap_in drop it while
 * they take frames, and check again what they read before) */
/* Moves a chunk no launch is using onto a frame of `to` (see pager.c); NOT_READY when it
 * is busy or too many copies are in flight, OUT_OF_MEMORY without a frame. Drops d->lock. */
CUresult psa_move(struct device *d, uint64_t chunk, enum psa_where to);
/* A GPU frame taken for a chunk needed at moment `need`: one free or makeable beyond the
 * margin (what the coming part of the iteration's short-lived allocations will want), else
 * the frame of the model chunk on the GPU needed farthest after `need` (Belady), paged out
 * and waited for; PSA_NO_FRAME when none is needed later. Drops d->lock. */
uint32_t psa_frame_for(struct device *d, uint64_t period, uint64_t need);
/* Whether an allocation that finds no GPU frame free should have one made
 * (psa_frame_by_age) rather than be placed in host frames: before the period is trusted
 * where kernels find more than a tenth of their chunks in host frames, after it where the
 * coming part of the iteration is crowded. */
bool psa_room_by_age(const struct device *d);
/* A GPU frame made by paging out the live chunks on the GPU unused for longest, a batch at
 * a time, waiting for the copy out; PSA_NO_FRAME when none can move. Drops d->lock. */
uint32_t psa_frame_by_age(struct device *d);
/* Whether a move of the chunk may start now: mapped, its own, no launch in flight, every
 * launch that touched it passed, its last move's copy done, its span not being built. */
bool psa_movable(struct device *d, uint64_t chunk);
void psa_span_forget_users(struct device *d, struct span *s);
/* Swaps a host chunk in for a GPU victim, both quiescent: the victim moves to a new host
 * frame, and the chunk onto the victim's GPU frame once the victim's copy out of it is
 * done (ordered on the copy streams, no host wait). False when nothing moved, or the chunk
 * could not follow the victim out (then the victim's move stands). Drops d->lock. */
bool psa_swap_in(struct device *d, uint64_t chunk, uint64_t victim);
/* True once the chunk's last move's copy has completed (sync: wait for it). */
bool psa_copy_done(struct device *d, uint64_t chunk, bool sync);
/* Frees what completed copies held: marks, and frames moved away from. */
void psa_moves_poll(struct device *d);

/* plan_exec.c (called with d->lock held; PSSHIM_POLICY=plan): a launch at `position` of a
 * `period`-moment iteration touched the chunk (recorded for the plan); and, every few
 * launches, the plan's moves that are due issued: false while there is no plan to follow.
 * psa_plan_follow drops d->lock (its moves do). */
void psa_plan_note(struct device *d, uint64_t chunk, uint64_t period, uint64_t position);
bool psa_plan_follow(struct device *d, uint64_t period, uint64_t position);

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

/* alloc_map.c */
bool psa_map_put(struct device *d, CUdeviceptr p, uint64_t size, struct span *s);
struct alloc_entry *psa_map_find(struct device *d, CUdeviceptr p);
void psa_map_remove(struct alloc_entry *e);

/* A GPU frame can be had without taking one back: one is free, or the budget allows another. */
static inline bool psa_gpu_frame_available(const struct device *d)
{
  return d->fr.free_gpu != PSA_NO_FRAME || d->stats.gpu_frames_made < d->fr.gpu_limit;
}

static inline uint64_t psa_round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

static inline uint64_t psa_now_ns(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

#endif
