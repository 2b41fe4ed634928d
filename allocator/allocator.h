/* allocator/ — the chunk space.
 *
 * One virtual-address reservation per device, cut into chunks of PSSHIM_CHUNK_SIZE.
 * A chunk holding live data is always mapped to exactly one frame (physical memory made
 * with cuMemCreate): a GPU frame, or a pinned, device-accessible host frame. Tensors are
 * sub-allocated inside spans (one chunk, or several consecutive chunks for a tensor larger
 * than a chunk); frees are stream-ordered. Placement is decided here only as "GPU frames
 * first, host frames beyond the budget" (static); moving chunks is psa_chunk_migrate. */
#ifndef PSSHIM_ALLOCATOR_H
#define PSSHIM_ALLOCATOR_H

#include "core/core.h"

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PSA_MAX_DEVICES 16
#define PSA_ALIGN 512
/* The stream of a synchronous allocation (cudaMalloc, cuMemAlloc): usable by every stream
 * at once, so it may only take bytes that no stream still has pending. */
#define PSA_SYNC_STREAM ((CUstream)(uintptr_t)-1) /* cudaMalloc promises 256; 512 keeps every offset cache-line aligned */

enum psa_where { PSA_UNMAPPED = 0, PSA_GPU, PSA_HOST };

/* True when p lies in any device's chunk space: lock-free, the quick path of every door. */
bool psa_owns(CUdeviceptr p);

/* Allocates on device `ordinal` (its chunk space is set up on first use; the caller has
 * made a context of that device current). CUDA_ERROR_OUT_OF_MEMORY when both budgets are
 * exhausted (one log line says so). size 0 gives *p = 0 and success, like cudaMalloc. */
CUresult psa_alloc(int ordinal, size_t size, CUstream stream, CUdeviceptr *p);
/* Frees an allocation psa_alloc made. Stream-ordered: reusable at once by later work on
 * `stream`, by other streams once `stream` has passed this point. sync=true (cudaFree,
 * cuMemFree) waits for the device first, as those calls do. CUDA_ERROR_INVALID_VALUE for a
 * pointer that is not the start of a live allocation. */
CUresult psa_free(CUdeviceptr p, CUstream stream, bool sync);
/* The memory psshim offers on `ordinal`: total = GPU budget + host budget; free = total
 * minus the bytes of live allocations. */
void psa_mem_info(int ordinal, size_t *free_bytes, size_t *total_bytes);

/* Chunk index of p on its device (and the device), or -1 when psshim does not own p. */
int64_t psa_chunk_of(CUdeviceptr p, int *ordinal);
/* Where chunk `chunk` of device `ordinal` lives now. */
enum psa_where psa_chunk_where(int ordinal, uint64_t chunk);

/* Moves a chunk's data to a frame of the other kind and remaps its addresses there, now.
 * Waits for the device first, so work psshim did not observe is finished too; the caller
 * guarantees no new kernel touches the chunk meanwhile. Only live ranges are copied. */
CUresult psa_chunk_migrate(int ordinal, uint64_t chunk, enum psa_where to);

/* Legacy CUDA IPC of psshim's memory (ipc.c): CUDA's own handles do not cover VMM memory.
 * A handle of the allocation that starts at p (one line and INVALID_VALUE when p starts
 * none); from then on its span's chunks never move, so that another process may map them. */
CUresult psa_ipc_export(CUdeviceptr p, CUipcMemHandle *out);
/* Whether a handle is one psa_ipc_export made (else it is CUDA's own: pass it through). */
bool psa_ipc_handle_ours(const CUipcMemHandle *h);
/* Maps the memory a handle of psshim's names, readable and writable by device `ordinal`,
 * at *p; INVALID_VALUE after one line when the exporting process has ended, refuses it
 * (freed since) or is not who answers, or the memory cannot be mapped here. */
CUresult psa_ipc_open(int ordinal, const CUipcMemHandle *h, CUdeviceptr *p);
/* Unmaps what psa_ipc_open mapped at p, after the device's queued work; NOT_SUPPORTED for
 * any other pointer (not psshim's: pass it through). */
CUresult psa_ipc_close(CUdeviceptr p);

/* The first device set up calls ready(h, user) once, before any thread may allocate on
 * it, with the trace header that describes it: observation that starts there sees every
 * launch that can touch a chunk. Set once, before the first allocation. */
struct pst_trace_header;
void psa_on_first_device(void (*ready)(const struct pst_trace_header *h, void *user), void *user);

/* A stream began (or ended) capturing a CUDA graph: the shim's capture doors say so, on
 * success, so that no call of psshim's breaks a capture (allocator/capture.c). */
void psa_capture_begun(void);
void psa_capture_ended(void);

/* The pager's view of an observed launch or transfer: brackets the spans it touches
 * (enter/exit) so no migration races it, and with PSSHIM_POLICY=auto or plan decides what
 * to move. period: the training iteration's length in moments once known and trusted, else
 * 0 (then nothing is planned); position: the moment's place in the iteration (0 at its
 * boundary, below period; an exit's is its enter's); moment: its place among every moment
 * observed (consecutive moments, consecutive positions). */
void psa_on_moment(const struct ps_moment *m, bool enter, uint64_t period, uint64_t position, uint64_t moment);
/* An iteration boundary of `period` moments has passed (every rank of the node meets it
 * at the same launch when they run the same program). Under torchrun the node's ranks
 * meet for it at the next allocation or free (allocator/rounds.c): at the first they
 * compare what they allocated until then (a difference is said on every rank in one
 * line); with PSSHIM_POLICY=auto, host chunks equal on every rank at two boundaries in a
 * row become shared, each rank holding 1/N of them (allocator/shard.c). Returns at once. */
void psa_shard_boundary(uint64_t period);

/* Memory in use on `ordinal` as a memory pool would count it: reserved = bytes of the frames
 * its chunks hold, used = bytes of live allocations; highs since the last reset. False
 * when psshim does not serve the device. */
struct psa_usage {
  uint64_t reserved, reserved_high, used, used_high;
};
bool psa_usage_get(int ordinal, struct psa_usage *u);
void psa_usage_reset_high(int ordinal, bool reserved, bool used);

/* Every statistic, in the order PSSHIM_STATS writes them: its name, and how devices
 * combine (SUM, or SAME: a setting every device shares). All are uint64_t counts, bytes or
 * nanoseconds.
 * - frames in use by chunks; chunks mapped now, and when live bytes peaked (the fill);
 * - copy_waits: launches that found a move's copy running and waited for it on their stream;
 * - touches: observed chunk touches served from each kind of frame (auto; one in a host frame
 *   is read in place); remaps made while a launch that read a host frame in place may still
 *   run (each many times dearer);
 * - host time of the moves (move.c): moving (remapping, queueing copies), remapping alone;
 *   waiting for the frame pool to make a frame, making frames (allocating threads too);
 * - event_queries: cuEventQuery calls made to learn what has run;
 * - late waits: launches that reached a chunk while a move remapped it, and how long they
 *   waited; launch_ns: the launching threads' whole time in the pager (bracketing chunks,
 *   late waits, waits for their moments); of it, waiting for a device's lock while another
 *   thread held it; a move's wait for the lock after each remap (remap_ns is the driver's
 *   time alone) and for copies in flight to drain before a remap; idle spans taken back for
 *   their frames, their chunks (unmapped), and the time taking them back took, finding them
 *   included; chunks paged out to give an allocation a GPU frame (room by age, room.c), and
 *   the allocating threads' time making that room (page-outs, waits for their copies);
 * - sharding: the rounds held (device synchronized, chunks checksummed and compared) and
 *   the time spent in them, chunks made shared and private again, and shared again after
 *   that (only where their span was made anew since), shared chunks paged in
 *   at a touch (pieces kept) and mapped back onto their pieces unchanged, shared chunks
 *   gathered onto GPU frames at rounds (own piece copied in, the rest all-gathered), the
 *   bytes that gave the GPU frames and the time they took (the communicator's making
 *   apart), shared now, this rank's pieces of them (host bytes), and the host bytes it does
 *   not hold thanks to them (now, and at most);
 * - the plan (allocator/plan_exec.c): plans made and the time making them took;
 *   the bytes the plan copies in and out per iteration and leaves to be read in place (a
 *   moment whose chunks cannot all be on the GPU) (predicted, latest plan); iterations
 *   its owner followed, and the bytes the owner's moves copied in and out over them;
 * - the plan's owner (allocator/owner.c): devices with one; its fetches and evictions made,
 *   fetches it could not make (no frame, or a chunk it could not quiet: read in place),
 *   fetches found done, victims it chose where the plan's were gone (an allocation took
 *   the frame the plan freed), fetches a launch asked for (it named chunks in host frames
 *   the plan left there); its waits for launches and the GPU; the launching threads' waits
 *   for their moments, and the waits that gave up; allocations placed where the recorded
 *   iteration placed them (plan_exec.c), and those the recorded iteration made that could
 *   not be (their bytes taken, or another size asked). */
#define PSA_STATS_FIELDS(X)                                                                   \
  X(allocs, SUM) X(frees, SUM) X(failed_allocs, SUM) X(live_bytes, SUM) X(peak_live_bytes, SUM) \
  X(chunk_size, SAME) X(gpu_budget, SUM) X(host_budget, SUM)                                  \
  X(gpu_frames, SUM) X(peak_gpu_frames, SUM) X(host_frames, SUM) X(peak_host_frames, SUM)     \
  X(gpu_frames_made, SUM) X(host_frames_made, SUM) X(mapped_chunk_bytes, SUM)                 \
  X(mapped_at_peak, SUM)                                                                      \
  X(migrations_to_gpu, SUM) X(migrations_to_host, SUM) X(bytes_h2d, SUM) X(bytes_d2h, SUM)    \
  X(copy_waits, SUM) X(touches_gpu, SUM) X(touches_host, SUM) X(remaps_beside_inplace, SUM)    \
  X(move_ns, SUM) X(remap_ns, SUM) X(frame_wait_ns, SUM) X(frame_make_ns, SUM)                \
  X(event_queries, SUM)                                                                       \
  X(late_waits, SUM) X(late_wait_ns, SUM) X(launch_ns, SUM) X(lock_wait_ns, SUM)             \
  X(relock_ns, SUM) X(copy_settle_ns, SUM) X(reclaims, SUM) X(reclaim_chunks, SUM)          \
  X(reclaim_ns, SUM) X(room_page_outs, SUM) X(room_ns, SUM) X(room_wait_ns, SUM)             \
  X(share_rounds, SUM) X(share_round_ns, SUM) X(shares, SUM) X(unshares, SUM) X(reshares, SUM)  \
  X(shared_pageins, SUM) X(shared_clean_leaves, SUM) X(shared_gathers, SUM)                   \
  X(gathered_bytes, SUM) X(gather_ns, SUM) X(comm_init_ns, SUM) X(shared_chunks, SUM)         \
  X(shared_host_bytes, SUM) X(shard_saved_bytes, SUM) X(peak_shard_saved_bytes, SUM)         \
  X(plan_builds, SUM) X(plan_build_ns, SUM) X(plan_bytes_in, SUM) X(plan_bytes_out, SUM)      \
  X(plan_bytes_in_place, SUM)                                                                 \
  X(plan_laps, SUM) X(plan_moved_in, SUM) X(plan_moved_out, SUM)                            \
  X(owners, SUM) X(owner_fetches, SUM) X(owner_evictions, SUM) X(owner_missed, SUM)           \
  X(owner_moot, SUM) X(owner_unplanned_victims, SUM) X(owner_demand_fetches, SUM)               \
  X(owner_wait_ns, SUM) X(gate_wait_ns, SUM)                                                  \
  X(gate_timeouts, SUM) X(recalled_allocs, SUM) X(recall_misses, SUM)

struct psa_stats {
#define PSA_STATS_FIELD(name, how) uint64_t name;
  PSA_STATS_FIELDS(PSA_STATS_FIELD)
#undef PSA_STATS_FIELD
};
/* Sums over devices. */
void psa_stats_get(struct psa_stats *s);
/* Bytes live and allocations made so far, over devices, without their locks: cheap enough
 * for every launch (observation keeps them per launch to judge a period at once). */
void psa_live_now(uint64_t *live_bytes, uint64_t *allocs);
/* Whether this process set up any device: a launcher that never used the GPU (timeout,
 * torchrun) has no statistics to give. */
bool psa_any_device(void);
/* Whether paging stopped for good (work psshim cannot observe ran). */
bool psa_paging_stopped(void);
/* What observation found, for the statistics: moments observed, iteration boundaries
 * passed, the period adopted (0: none yet) and the launch at which it was. */
struct psa_progress {
  uint64_t launches, iterations, period, adopted_at;
};
/* Called at every trusted iteration boundary (first: the one that trusted the period,
 * which starts the count anew): the change of the statistics below over the iteration
 * that just ended is kept, with its wall time, for PSSHIM_STATS' steady iteration (the
 * median of each over the iterations of the period trusted last, after its first, whose
 * moves bring the placement into shape). Fills *now with the statistics it took. */
#define PSA_STEADY_FIELDS(X)                                                                  \
  X(launch_ns) X(remap_ns) X(bytes_h2d) X(bytes_d2h) X(migrations_to_gpu)                     \
  X(migrations_to_host) X(late_waits) X(late_wait_ns) X(touches_host)                         \
  X(move_ns) X(frame_make_ns) X(reclaims) X(reclaim_ns) X(room_ns)                            \
  X(room_wait_ns) X(touches_gpu) X(owner_fetches) X(owner_missed) X(owner_demand_fetches)         \
  X(owner_wait_ns) X(gate_wait_ns) X(remaps_beside_inplace) X(recall_misses)
void psa_stats_boundary(bool first, struct psa_stats *now);
/* PSSHIM_STATS output: text (json=false) or one JSON object. */
void psa_stats_write(FILE *f, bool json, const struct psa_progress *p);

/* Fork: the child of a process that used CUDA cannot use it (CUDA's rule); its doors
 * pass through from then on (core's forked-child flag). Registered by the shim's
 * constructor. */
void psa_atfork_prepare(void);
void psa_atfork_parent(void);
void psa_atfork_child(void);

#endif
