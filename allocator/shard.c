/* Sharded chunks: a host chunk holding the same bytes on every rank of the node (parameters,
 * optimizer state, frozen tables that DDP keeps replicated) is kept once per node, in N
 * pieces of chunk/N bytes: rank r makes piece r, exports it as a file descriptor, the
 * descriptors travel over comm/'s socket star, and every rank maps all N pieces in order
 * at the chunk's address. The chunk thus stays mapped on every rank (a kernel psshim did
 * not foresee still finds its data) while the node holds it once.
 *
 * Which chunks: at iteration boundaries (rounds.c meets them) the ranks checksum
 * their candidate chunks (host frames of spans no younger than an iteration) and compare; a
 * chunk equal on every rank, and unchanged, at two rounds in a row becomes shared. One a
 * rank sees change between two rounds (written every step: parameters, optimizer state)
 * is not checksummed again while its span holds the same allocations. The ranks evaluate
 * every chunk id in the same round and learn the same answer, so they share the same
 * chunks in the same order; what is rank-local (placement, pressure, a launch in flight)
 * only makes a chunk a non-candidate, which every rank then sees as "not equal".
 *
 * Writes: a shared chunk is never written in place. Every observed launch, copy or memset
 * that touches one first makes it this rank's own (psa_unshare: a copy into a frame of its
 * own and a remap, as a move), and the pager never moves a shared chunk; work psshim
 * cannot see stops sharing and unshares every chunk first. Unsharing is local: the other
 * ranks keep their mappings of the pieces, which stay alive while any rank maps them.
 *
 * Page-in, gathered: at a round, the shared chunks every rank used in the last iteration
 * come onto GPU frames (free, or made free by paging out what lay unused longest), as many
 * as every rank has one for: each rank copies its own piece in and the ranks all-gather
 * the rest over psshim's NCCL communicator, N x the bandwidth of one rank copying the
 * whole chunk. A gather is collective, so what is gathered is agreed over the star (every
 * rank says what it wants and what it took a frame for; the gather is what all said), never
 * decided from one rank's memory alone. NCCL runs without the device's lock; a chunk being
 * gathered is not remapped meanwhile (a touch or a free waits for the gather).
 *
 * Page-in, rank-local: a shared chunk touched between rounds goes onto a GPU frame when one
 * can be had. Either way this rank keeps its pieces, and when the chunk leaves the GPU (the
 * pager's eviction, or idle for an iteration at a round) with the bytes it was shared with,
 * it is mapped back onto the pieces, with no copy and no host frame: read-only data (frozen
 * weights) stays at 1/N of the host memory. Otherwise the pieces are let go and it is this
 * rank's own.
 *
 * Not built: the collective write-back that data a step writes (parameters, optimizer
 * state) would need; checksums on the GPU. Only the first device of a rank shares. */
#include "allocator/sharing.h"
#include "comm/comm.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Which allocations a chunk held when it was touched after being shared (psshim cannot
 * tell a read from a write): a training step touches every parameter and optimizer chunk,
 * so each would be shared at every round it sat idle and made private at the next step (in
 * DDP, a share and an unshare of every such chunk at nearly every step, each unshare a copy
 * and a remap). Such a chunk, or one seen to change between two rounds, is not offered again
 * while its span holds the same allocations. */
struct rewritten {
  const struct span *span;
  uint64_t last_alloc;
  bool was_shared; /* let go after it was shared */
};

struct psa_shard {
  int rank, n;
  uint64_t len;                         /* bytes of a piece */
  CUstream stream;                      /* the copies of checksums, fills and unshares */
  unsigned char *scratch;               /* pinned, a chunk's size: checksums */
  CUdeviceptr fill_va;                  /* where this rank's new piece is filled */
  uint64_t *sums;                       /* per chunk, this boundary */
  bool *agree;                          /* per chunk: equal on every rank now */
  uint64_t *agreed_before;              /* per chunk: the checksum all ranks had last time, or 0 */
  struct rewritten *rewritten;          /* per chunk: made private again, while its span lasts */
  uint64_t *shared_sum;                 /* per chunk: its agreed checksum when it was shared */
  bool *paged_in;                       /* per chunk: on a GPU frame of its own, pieces kept */
  uint64_t *seen_sum;                   /* per chunk: this rank's checksum of it at the last round */
  uint32_t *gather_frame;               /* per chunk: the GPU frame taken for its gather */
  bool *refused;                        /* per chunk: could not be made private, left unmapped */
  bool comm_ready, comm_failed;         /* psshim's NCCL communicator, made at the first gather */
  bool gathering;                       /* NCCL is filling the gather frames (lock dropped) */
  pthread_cond_t gathered;              /* ... and has finished */
  CUmemGenericAllocationHandle *pieces; /* n per chunk while it is shared */
};

static _Atomic bool stopped; /* the star failed, or unseen work: nothing is shared again */

static void stop_sharing(void)
{
  atomic_store(&stopped, true);
  psc_star_close(); /* the peers' next exchange fails at once instead of waiting */
}

static CUdeviceptr chunk_va(const struct device *d, uint64_t chunk) { return d->base + chunk * d->chunk_size; }

static CUmemAllocationProp piece_prop(const struct device *d)
{
  CUmemAllocationProp prop = psa_frame_prop(d, PSA_HOST);
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; /* pieces travel as fds whatever the frames */
  return prop;
}

/* The device's sharing state, made at its first boundary; NULL (said once) when the chunk
 * size does not split into pieces of the host granularity or memory is short. Every rank
 * decides alike: chunk size and rank count agree, and the granularity is the driver's. */
static struct psa_shard *state(struct device *d)
{
  if (d->shard)
    return d->shard;
  struct psa_shard *st = calloc(1, sizeof *st);
  CUmemAllocationProp prop = piece_prop(d);
  size_t gran = 0;
  int n = psc_nranks();
  if (!st || PS_CU(ps_driver.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)))
    goto fail;
  if (!gran || d->chunk_size % (gran * (uint64_t)n)) {
    ps_log(PS_LOG_WARN, "PSSHIM_CHUNK_SIZE=%llu does not split into %d pieces of a multiple of %zu bytes: chunks "
           "are not shared among the node's ranks", (unsigned long long)d->chunk_size, n, gran);
    goto fail;
  }
  st->rank = psc_rank();
  st->n = n;
  st->len = psc_shard_of(d->chunk_size, n, st->rank).len;
  st->sums = calloc(d->nchunks, sizeof *st->sums);
  st->agree = calloc(d->nchunks, sizeof *st->agree);
  st->agreed_before = calloc(d->nchunks, sizeof *st->agreed_before);
  st->rewritten = calloc(d->nchunks, sizeof *st->rewritten);
  st->shared_sum = calloc(d->nchunks, sizeof *st->shared_sum);
  st->paged_in = calloc(d->nchunks, sizeof *st->paged_in);
  st->seen_sum = calloc(d->nchunks, sizeof *st->seen_sum);
  st->gather_frame = calloc(d->nchunks, sizeof *st->gather_frame);
  st->pieces = calloc(d->nchunks * (uint64_t)n, sizeof *st->pieces);
  st->refused = calloc(d->nchunks, sizeof *st->refused);
  if (!st->sums || !st->agree || !st->agreed_before || !st->rewritten || !st->shared_sum || !st->paged_in ||
      !st->seen_sum || !st->gather_frame || !st->pieces || !st->refused)
    goto fail;
  memset(st->gather_frame, 0xff, d->nchunks * sizeof *st->gather_frame); /* PSA_NO_FRAME */
  pthread_cond_init(&st->gathered, NULL);
  if (PS_CU(ps_driver.cuStreamCreate(&st->stream, CU_STREAM_NON_BLOCKING)))
    goto fail;
  /* Checksums are computed on the CPU from a pinned copy: host frames are not readable by
   * the CPU through their device mapping, and a checksum kernel would need a module. */
  if (PS_CU(ps_driver.cuMemAllocHost_v2((void **)&st->scratch, d->chunk_size)))
    goto fail_stream;
  if (PS_CU(ps_driver.cuMemAddressReserve(&st->fill_va, st->len, 0, 0, 0)))
    goto fail_scratch;
  d->shard = st;
  return st;
fail_scratch:
  PS_CU(ps_driver.cuMemFreeHost(st->scratch));
fail_stream:
  PS_CU(ps_driver.cuStreamDestroy_v2(st->stream));
fail:
  if (st) {
    free(st->sums), free(st->agree), free(st->agreed_before), free(st->rewritten), free(st->shared_sum);
    free(st->paged_in), free(st->seen_sum), free(st->gather_frame), free(st->pieces), free(st->refused);
    free(st);
  }
  return NULL;
}

/* Nothing in flight on it: no launch between its enter and exit, no move's remap or copy. */
static bool quiet(const struct chunk *c) { return !c->span->in_flight && c->move == PSA_SETTLED; }

/* Untouched for an iteration, and quiet. */
static bool idle(const struct device *d, const struct chunk *c, uint64_t period)
{
  return d->space.clock - c->last_use >= period && quiet(c);
}

/* A chunk this rank may offer: in a host frame of its own, in a span allocated into no
 * later than an iteration ago (the iteration's short-lived tensors change), not written
 * after being shared nor seen to change between rounds while its span holds the same
 * allocations, with nothing in flight on it. The device is synchronized, so no enqueued
 * work touches it. */
static bool candidate(struct device *d, uint64_t chunk, uint64_t period)
{
  const struct chunk *c = &d->chunks[chunk];
  const struct rewritten *w = &d->shard->rewritten[chunk];
  return c->frame != PSA_NO_FRAME && c->frame != psa_shared_frame(d) && d->fr.frames[c->frame].where == PSA_HOST &&
         c->span && !c->span->building && !c->span->exported && c->span->live_allocs &&
         d->space.clock - c->span->last_alloc >= period &&
         quiet(c) && !(w->span == c->span && w->last_alloc == c->span->last_alloc);
}

/* Not offered again while its span holds the same allocations. */
static void mark_rewritten(struct device *d, uint64_t chunk)
{
  struct rewritten *w = &d->shard->rewritten[chunk];
  *w = (struct rewritten){d->chunks[chunk].span, d->chunks[chunk].span->last_alloc, w->was_shared};
}

static uint64_t mix(uint64_t h, uint64_t v)
{
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h * 0xBF58476D1CE4E5B9ull;
}

static uint64_t rotl(uint64_t x, int r) { return x << r | x >> (64 - r); }

/* One page (at most PSA_SUM_PAGE bytes) into h. Four independent lanes: one chain of
 * multiplies hashed too slowly for a DDP rank's first round over tens of GiB of host frames
 * (seconds). Each step is a bijection of its lane and of its word: a difference in one word
 * is never lost within the lane. The word is multiplied before it is added and the lane
 * rotated: with the word only xored in, a difference in bit 63 stays bit 63 alone, and two
 * words differing there (the signs of two doubles 32 bytes apart) cancel. */
static uint64_t sum_page(uint64_t h, const unsigned char *p, uint64_t n)
{
  uint64_t i = 0, w, lane[4] = {1, 2, 3, 4};
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; k++) {
      memcpy(&w, p + i + 8 * k, 8);
      lane[k] = rotl(lane[k] + w * 0xC2B2AE3D27D4EB4Full, 31) * 0x9E3779B185EBCA87ull;
    }
  for (int k = 0; k < 4; k++)
    h = mix(h, lane[k]);
  for (; i < n; i++)
    h = mix(h, p[i]);
  return h;
}

uint64_t psa_shard_sum(uint64_t h, const unsigned char *p, uint64_t n)
{
  for (uint64_t at = 0; at < n; at += PSA_SUM_PAGE)
    h = sum_page(h, p + at, n - at < PSA_SUM_PAGE ? n - at : PSA_SUM_PAGE);
  return h;
}

/* Of the chunk's live bytes only (freed bytes differ among ranks and do not matter), with
 * their offsets; never 0, which means "not a candidate". */
static uint64_t checksum(struct device *d, struct psa_shard *st, uint64_t chunk)
{
  uint64_t lo = (chunk - d->chunks[chunk].span->first_chunk) * d->chunk_size, at = lo, end;
  for (; psa_live_next(d, chunk, &at, &end); at = end)
    if (PS_CU(ps_driver.cuMemcpyDtoHAsync_v2(st->scratch + (at - lo), chunk_va(d, chunk) + (at - lo), end - at,
                                              st->stream)))
      return 0;
  if (PS_CU(ps_driver.cuStreamSynchronize(st->stream)))
    return 0;
  uint64_t h = 0;
  for (at = lo; psa_live_next(d, chunk, &at, &end); at = end)
    h = psa_shard_sum(mix(h, at - lo), st->scratch + (at - lo), end - at);
  return h ? h : 1;
}

static void count_shared(struct device *d, int delta)
{
  struct psa_stats *s = &d->stats;
  uint64_t len = d->shard->len, saved = d->chunk_size - len;
  s->shared_chunks += (uint64_t)(int64_t)delta;
  s->shared_host_bytes += (uint64_t)(int64_t)delta * len;
  s->shard_saved_bytes += (uint64_t)(int64_t)delta * saved;
  if (s->shard_saved_bytes > s->peak_shard_saved_bytes)
    s->peak_shard_saved_bytes = s->shard_saved_bytes;
}

static void unmap_pieces(struct device *d, uint64_t chunk, int upto)
{
  for (int r = 0; r < upto; r++)
    PS_CU(ps_driver.cuMemUnmap(chunk_va(d, chunk) + (uint64_t)r * d->shard->len, d->shard->len));
}

static void release_pieces(struct device *d, uint64_t chunk)
{
  CUmemGenericAllocationHandle *h = &d->shard->pieces[chunk * (uint64_t)d->shard->n];
  for (int r = 0; r < d->shard->n; r++)
    if (h[r]) {
      PS_CU(ps_driver.cuMemRelease(h[r]));
      h[r] = 0;
    }
}

/* Maps the chunk's pieces in order at its unmapped address; all or none. */
static bool place_pieces(struct device *d, uint64_t chunk)
{
  struct psa_shard *st = d->shard;
  CUdeviceptr va = chunk_va(d, chunk);
  const CUmemGenericAllocationHandle *h = &st->pieces[chunk * (uint64_t)st->n];
  int r = 0;
  while (r < st->n && !PS_CU(ps_driver.cuMemMap(va + (uint64_t)r * st->len, st->len, 0, h[r], 0)))
    r++;
  CUmemAccessDesc access = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = d->ordinal},
                            .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  if (r == st->n && !PS_CU(ps_driver.cuMemSetAccess(va, d->chunk_size, &access, 1)))
    return true;
  unmap_pieces(d, chunk, r);
  return false;
}

/* Maps the chunk's pieces in order at its address, in place of its own frame. */
static bool map_pieces(struct device *d, uint64_t chunk)
{
  CUdeviceptr va = chunk_va(d, chunk);
  if (PS_CU(ps_driver.cuMemUnmap(va, d->chunk_size)))
    return false;
  if (place_pieces(d, chunk))
    return true;
  if (psa_map(d, va, d->fr.frames[d->chunks[chunk].frame].handle)) /* back onto the frame that holds the data */
    ps_error("chunk %llu of device %d could not be remapped: its data is unreachable", (unsigned long long)chunk,
             d->ordinal);
  return false;
}

/* This rank's piece of the chunk, filled from its own frame and exported; -1 when it cannot
 * take part (the others then keep the chunk whole too). */
static int make_piece(struct device *d, uint64_t chunk, CUmemGenericAllocationHandle *piece)
{
  struct psa_shard *st = d->shard;
  CUmemAllocationProp prop = piece_prop(d);
  CUmemAccessDesc access = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = d->ordinal},
                            .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  int fd = -1;
  *piece = 0;
  if (!psc_host_reserve(st->len))
    return -1;
  if (PS_CU(ps_driver.cuMemCreate(piece, st->len, &prop, 0))) {
    psc_host_release(st->len);
    *piece = 0;
    return -1;
  }
  if (!PS_CU(ps_driver.cuMemMap(st->fill_va, st->len, 0, *piece, 0))) {
    uint64_t off = psc_shard_of(d->chunk_size, st->n, st->rank).offset;
    bool filled = !PS_CU(ps_driver.cuMemSetAccess(st->fill_va, st->len, &access, 1)) &&
                  !PS_CU(ps_driver.cuMemcpyAsync(st->fill_va, chunk_va(d, chunk) + off, st->len, st->stream)) &&
                  !PS_CU(ps_driver.cuStreamSynchronize(st->stream));
    PS_CU(ps_driver.cuMemUnmap(st->fill_va, st->len));
    if (filled)
      PS_CU(ps_driver.cuMemExportToShareableHandle(&fd, *piece, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  }
  if (fd < 0) {
    PS_CU(ps_driver.cuMemRelease(*piece));
    psc_host_release(st->len);
    *piece = 0;
  }
  return fd;
}

/* Collective: every rank calls it for the same chunk. After the exchange each rank goes on
 * alone; one that cannot map the pieces keeps its own frame, which holds the same bytes. */
static void share(struct device *d, uint64_t chunk)
{
  struct psa_shard *st = d->shard;
  CUmemGenericAllocationHandle *h = &st->pieces[chunk * (uint64_t)st->n], mine;
  int fd = make_piece(d, chunk, &mine), fds[PSC_MAX_RANKS];
  bool exchanged = psc_share_fds(fd, fds), whole = exchanged;
  if (fd >= 0)
    close(fd);
  for (int r = 0; r < st->n; r++) {
    if (r == st->rank)
      h[r] = mine;
    else if (whole && fds[r] >= 0 &&
             !PS_CU(ps_driver.cuMemImportFromShareableHandle(&h[r], (void *)(intptr_t)fds[r],
                                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)))
      continue;
    whole = whole && fds[r] >= 0 && h[r];
  }
  for (int r = 0; r < st->n; r++)
    if (fds[r] >= 0)
      close(fds[r]);
  uint32_t own = d->chunks[chunk].frame;
  if (whole && map_pieces(d, chunk)) {
    d->chunks[chunk].frame = psa_shared_frame(d);
    st->shared_sum[chunk] = st->sums[chunk];
    psa_frame_destroy(d, own);
    d->stats.shares++;
    d->stats.reshares += d->shard->rewritten[chunk].was_shared; /* its span made anew since */
    count_shared(d, +1);
    return;
  }
  release_pieces(d, chunk);
  if (mine)
    psc_host_release(st->len);
  if (!exchanged)
    stop_sharing();
}

/* A shared chunk that cannot be made this rank's own (no memory for it at all, or the
 * driver refuses): rather than let this rank's write reach the other ranks' data, its
 * addresses are left unmapped (its pieces kept until it is freed), so the work that
 * touches it fails on this rank with the driver's error; nothing is shared any more. */
static void refuse_writes(struct device *d, uint64_t chunk, bool mapped)
{
  ps_error("chunk %llu of device %d is shared with the node's other ranks and cannot be made this rank's own: "
           "its addresses are left unmapped, so work that touches it fails here instead of changing their data",
           (unsigned long long)chunk, d->ordinal);
  if (mapped)
    unmap_pieces(d, chunk, d->shard->n);
  d->shard->refused[chunk] = true;
  stop_sharing();
}

/* Maps the chunk's own frame f, which holds its bytes, in place of its pieces; false when
 * the driver refuses: the chunk is back on its pieces, or (*unmapped) on nothing, which the
 * caller says (refuse_writes). */
static bool onto_frame(struct device *d, uint64_t chunk, uint32_t f, bool *unmapped)
{
  unmap_pieces(d, chunk, d->shard->n);
  if (psa_map(d, chunk_va(d, chunk), d->fr.frames[f].handle) == CUDA_SUCCESS) {
    d->chunks[chunk].frame = f;
    psa_span_relist(d, d->chunks[chunk].span);
    return true;
  }
  *unmapped = !place_pieces(d, chunk);
  return false;
}

/* Collective, at a round (device synchronized): the shared chunks every rank used in the
 * last iteration are gathered onto GPU frames (see the top of this file). A failure leaves
 * every chunk on its pieces, mapped: nothing is lost; a failed communicator ends gathers. */
static void gather_used(struct device *d, uint64_t period)
{
  struct psa_shard *st = d->shard;
  uint64_t wanted = 0, gathers = 0;
  for (uint64_t i = 0; i < d->nchunks; i++) {
    const struct chunk *c = &d->chunks[i];
    st->sums[i] = !st->comm_failed && c->frame == psa_shared_frame(d) && c->last_use &&
                  c->last_use + period > d->space.clock;
    wanted += st->sums[i];
  }
  if (!psc_agree_checksums(st->sums, d->nchunks, st->agree)) {
    stop_sharing();
    return;
  }
  for (uint64_t i = 0; i < d->nchunks; i++)
    if (st->agree[i] && d->chunks[i].span) { /* taking a frame may drop the lock: the span may go */
      st->gather_frame[i] = psa_frame_by_age(d);
      if (st->gather_frame[i] == PSA_NO_FRAME)
        break; /* no frame: none for the others either */
    }
  /* Taking a frame may drop the lock: a chunk touched meanwhile is this rank's own now. */
  for (uint64_t i = 0; i < d->nchunks; i++) {
    uint32_t f = st->gather_frame[i];
    st->sums[i] = f != PSA_NO_FRAME && d->chunks[i].frame == psa_shared_frame(d);
    if (f != PSA_NO_FRAME && !st->sums[i]) {
      psa_frame_give(d, f);
      st->gather_frame[i] = PSA_NO_FRAME;
    }
  }
  bool agreed = psc_agree_checksums(st->sums, d->nchunks, st->agree);
  for (uint64_t i = 0; i < d->nchunks; i++)
    if (st->gather_frame[i] != PSA_NO_FRAME && (!agreed || !st->agree[i])) {
      psa_frame_give(d, st->gather_frame[i]);
      st->gather_frame[i] = PSA_NO_FRAME;
    } else {
      gathers += st->gather_frame[i] != PSA_NO_FRAME;
    }
  if (!agreed)
    stop_sharing();
  ps_log(PS_LOG_DEBUG, "gathers: %llu shared chunks used in the last iteration, %llu gathered now",
         (unsigned long long)wanted, (unsigned long long)gathers);
  if (!gathers)
    return;
  /* NCCL is waited for without the lock: its own threads call CUDA, and psshim's hooks on
   * them take the lock. The frames taken stay this rank's meanwhile; a touch or a free of
   * a chunk being gathered waits for the gather (wait_gather), so each is still on its
   * pieces when the gather ends. */
  st->gathering = true;
  ps_mutex_unlock(&d->lock);
  ps_own_calls(true); /* NCCL's allocations are not psshim's to serve */
  /* Every rank reaches this with the same chunks: the communicator is made by all at once.
   * NCCL connects the ranks at a communicator's first collective (NCCL_RUNTIME_CONNECT
   * defaults to 1), so one all-gather into the first frame (overwritten below) belongs to
   * the making. The making is timed apart: it happens once, and takes long enough to hide
   * the gathers' rate. */
  uint64_t start = psa_now_ns();
  bool gathered = st->comm_ready, copied = true;
  if (!gathered && (gathered = st->comm_ready = psc_comm_init(ps_driver.cuStreamQuery))) {
    uint64_t first = 0;
    while (st->gather_frame[first] == PSA_NO_FRAME)
      first++;
    gathered = psc_allgather_inplace(d->fr.frames[st->gather_frame[first]].staging, d->chunk_size, st->stream) &&
               psc_stream_wait(st->stream);
  }
  uint64_t comm_made = psa_now_ns();
  struct psc_shard mine = psc_shard_of(d->chunk_size, st->n, st->rank);
  /* A rank whose copy failed still takes part in every all-gather, or the others would wait
   * for it; it just keeps none of them. */
  for (uint64_t i = 0; i < d->nchunks && gathered; i++) {
    if (st->gather_frame[i] == PSA_NO_FRAME)
      continue;
    CUdeviceptr to = d->fr.frames[st->gather_frame[i]].staging;
    copied = copied && !PS_CU(ps_driver.cuMemcpyAsync(to + mine.offset, chunk_va(d, i) + mine.offset, mine.len,
                                                       st->stream));
    gathered = psc_allgather_inplace(to, d->chunk_size, st->stream);
  }
  gathered = gathered && psc_stream_wait(st->stream);
  ps_own_calls(false);
  ps_mutex_lock(&d->lock);
  st->gathering = false;
  pthread_cond_broadcast(&st->gathered);
  st->comm_failed = !gathered;
  for (uint64_t i = 0; i < d->nchunks; i++) {
    uint32_t f = st->gather_frame[i];
    if (f == PSA_NO_FRAME)
      continue;
    st->gather_frame[i] = PSA_NO_FRAME;
    if (!copied || !gathered) {
      psa_frame_give(d, f);
      continue;
    }
    bool unmapped = false;
    if (!onto_frame(d, i, f, &unmapped)) {
      psa_frame_give(d, f);
      if (unmapped)
        refuse_writes(d, i, false);
      continue;
    }
    st->paged_in[i] = true;
    d->stats.shared_gathers++;
    d->stats.gathered_bytes += d->chunk_size;
  }
  d->stats.comm_init_ns += comm_made - start;
  d->stats.gather_ns += psa_now_ns() - comm_made;
}

/* The first ready device: a rank drives one GPU under torchrun, and every rank must pick
 * the same chunk space. */
static struct device *first_device(void)
{
  for (int i = 0; i < PSA_MAX_DEVICES; i++)
    if (psa_devices[i].ready)
      return &psa_devices[i];
  return NULL;
}

/* A round synchronizes the device and checksums every candidate on the CPU. One that
 * found no chunk equal on every rank doubles the boundaries to the next, up to
 * MAX_ROUND_GAP (a training loop touches nearly everything every step); one that found
 * some brings rounds back to every boundary. What decides is agreed (the same on every
 * rank), so the ranks skip the same boundaries: a round is collective. Only the rounds'
 * thread (rounds.c) reads and writes these. */
#define MAX_ROUND_GAP 16
static uint32_t round_gap = 1, boundaries_since_round;

/* Paged-in shared chunks left alone for an iteration leave the GPU, as idle host chunks
 * are shared: unchanged, back onto the node's copy with no copy (a GPU frame freed); else
 * they stay where they are, this rank's own. Rank-local: every rank's pieces stay. The
 * device is synchronized. */
static void leave_idle(struct device *d, uint64_t period)
{
  for (uint64_t i = 0; i < d->nchunks && !atomic_load(&stopped); i++) {
    struct chunk *c = &d->chunks[i];
    if (!d->shard->paged_in[i] || !idle(d, c, period) || c->span->exported)
      continue;
    uint32_t own = c->frame;
    if (psa_shard_leave(d, i))
      psa_frame_give(d, own);
  }
}

/* Checksums every candidate (after the device has run what was enqueued) and agrees the
 * sums with the other ranks into st->agree; false when the ranks could not agree. */
static bool offer(struct device *d, struct psa_shard *st, uint64_t period, uint64_t *offered)
{
  /* Nothing enqueued may touch a chunk while it is checksummed and shared, and no new
   * launch can bracket one while this thread holds the lock. */
  bool synced = !PS_CU(ps_driver.cuCtxSynchronize());
  psa_moves_poll(d);
  for (uint64_t i = 0; i < d->nchunks; i++) {
    uint64_t sum = synced && candidate(d, i, period) ? checksum(d, st, i) : 0;
    if (sum && st->seen_sum[i] && sum != st->seen_sum[i]) { /* written since the last round */
      mark_rewritten(d, i);
      sum = 0;
    }
    st->sums[i] = st->seen_sum[i] = sum;
    *offered += sum != 0;
  }
  return psc_agree_checksums(st->sums, d->nchunks, st->agree);
}

void psa_shard_round(uint64_t period)
{
  struct device *d = first_device();
  if (!d || !period || !atomic_load(&psa_allocs_agree) || ps_options.policy != PS_POLICY_AUTO ||
      atomic_load(&stopped))
    return;
  ps_mutex_lock(&d->lock);
  if (++boundaries_since_round < round_gap) {
    ps_mutex_unlock(&d->lock);
    return;
  }
  boundaries_since_round = 0;
  d->stats.share_rounds++;
  uint64_t start = psa_now_ns();
  struct psa_shard *st = state(d);
  uint64_t offered = 0, equal = 0, shares = d->stats.shares;
  if (!st || !offer(d, st, period, &offered)) {
    stop_sharing();
    ps_mutex_unlock(&d->lock);
    return;
  }
  /* Equal on every rank, and unchanged since the last boundary: every rank holds the same
   * agreed sums, so every rank shares the same chunks in the same order. */
  for (uint64_t i = 0; i < d->nchunks && !atomic_load(&stopped); i++) {
    if (st->agree[i] && st->agreed_before[i] == st->sums[i])
      share(d, i);
    st->agreed_before[i] = st->agree[i] && d->chunks[i].frame != psa_shared_frame(d) ? st->sums[i] : 0;
    equal += st->agree[i];
  }
  leave_idle(d, period);
  gather_used(d, period);
  d->stats.share_round_ns += psa_now_ns() - start;
  if (equal)
    round_gap = 1;
  else if (round_gap < MAX_ROUND_GAP)
    round_gap *= 2;
  ps_log(PS_LOG_DEBUG, "sharding: %llu chunks offered, %llu equal on every rank, %llu shared now (%llu in all)",
         (unsigned long long)offered, (unsigned long long)equal, (unsigned long long)(d->stats.shares - shares),
         (unsigned long long)d->stats.shared_chunks);
  ps_mutex_unlock(&d->lock);
}

/* A chunk whose gather reads it now is not remapped until the gather is over: drops d->lock
 * while it waits. */
static void wait_gather(struct device *d, uint64_t chunk)
{
  PSA_HELD(d);
  if (d->shard->gathering && d->shard->gather_frame[chunk] != PSA_NO_FRAME)
    ps_log(PS_LOG_DEBUG, "chunk %llu waits for its gather", (unsigned long long)chunk);
  while (d->shard->gathering && d->shard->gather_frame[chunk] != PSA_NO_FRAME)
    ps_cond_wait(&d->shard->gathered, &d->lock);
}

/* This rank no longer holds the chunk's pieces (the others may still map them). */
static void forget_pieces(struct device *d, uint64_t chunk)
{
  release_pieces(d, chunk);
  psc_host_release(d->shard->len);
  d->shard->paged_in[chunk] = false;
  count_shared(d, -1);
}

/* The chunk was touched after sharing and its own frame holds its data now. */
static void let_go(struct device *d, uint64_t chunk)
{
  forget_pieces(d, chunk);
  mark_rewritten(d, chunk);
  d->shard->rewritten[chunk].was_shared = true;
  d->stats.unshares++;
}

void psa_shard_drop(struct device *d, uint64_t chunk)
{
  PSA_HELD(d);
  wait_gather(d, chunk);
  if (d->chunks[chunk].frame == psa_shared_frame(d) && !d->shard->refused[chunk])
    unmap_pieces(d, chunk, d->shard->n);
  d->shard->refused[chunk] = false;
  forget_pieces(d, chunk);
}

bool psa_shard_paged_in(const struct device *d, uint64_t chunk) { return d->shard && d->shard->paged_in[chunk]; }

/* A frame for a chunk that must become private: host first (it was a host chunk), else the
 * GPU, else one more host frame than the budget allows, since the alternative is a write
 * that reaches the other ranks' data. */
static uint32_t private_frame(struct device *d) /* drops d->lock */
{
  PSA_HELD(d);
  uint32_t f = psa_frame_take(d, PSA_HOST);
  if (f == PSA_NO_FRAME)
    f = psa_frame_take(d, PSA_GPU);
  if (f == PSA_NO_FRAME) {
    d->fr.host_limit++;
    f = psa_frame_take(d, PSA_HOST);
    if (f != PSA_NO_FRAME)
      ps_log(PS_LOG_WARN, "a shared chunk became private beyond the host budget (now %llu frames)",
             (unsigned long long)d->fr.host_limit);
  }
  return f;
}

/* Onto a GPU frame when one can be had: paged in, its pieces kept, so that leaving the GPU
 * unchanged costs no copy and no host frame (psa_shard_leave); else onto a host frame of its
 * own, the pieces let go. */
void psa_unshare(struct device *d, uint64_t chunk)
{
  PSA_HELD(d);
  struct psa_shard *st = d->shard;
  wait_gather(d, chunk);
  if (d->chunks[chunk].frame != psa_shared_frame(d) || st->refused[chunk]) /* gathered meanwhile, or said */
    return;
  uint32_t f = atomic_load(&stopped) ? PSA_NO_FRAME : psa_frame_take(d, PSA_GPU);
  bool keep = f != PSA_NO_FRAME;
  if (!keep)
    f = private_frame(d);
  if (d->chunks[chunk].frame != psa_shared_frame(d)) { /* taking a frame may drop the lock */
    if (f != PSA_NO_FRAME)
      psa_frame_give(d, f);
    return;
  }
  CUdeviceptr va = chunk_va(d, chunk);
  bool unmapped = false;
  if (f == PSA_NO_FRAME || PS_CU(ps_driver.cuMemcpyAsync(d->fr.frames[f].staging, va, d->chunk_size, st->stream)) ||
      PS_CU(ps_driver.cuStreamSynchronize(st->stream)) || !onto_frame(d, chunk, f, &unmapped)) {
    if (f != PSA_NO_FRAME)
      psa_frame_give(d, f);
    refuse_writes(d, chunk, !unmapped);
    return;
  }
  if (keep) {
    st->paged_in[chunk] = true;
    d->stats.shared_pageins++;
  } else {
    let_go(d, chunk);
  }
}

bool psa_shard_leave(struct device *d, uint64_t chunk)
{
  struct psa_shard *st = d->shard;
  if (!st || !st->paged_in[chunk])
    return false;
  /* psshim cannot tell a read from a write: the bytes tell. Equal to the node's copy (a
   * chunk only read, as frozen weights are), the pieces are mapped back. */
  if (!atomic_load(&stopped) && checksum(d, st, chunk) == st->shared_sum[chunk] && map_pieces(d, chunk)) {
    d->chunks[chunk].frame = psa_shared_frame(d);
    st->paged_in[chunk] = false;
    psa_span_relist(d, d->chunks[chunk].span);
    d->stats.shared_clean_leaves++;
    return true;
  }
  let_go(d, chunk);
  return false;
}

void psa_shard_stop(void)
{
  if (atomic_exchange(&stopped, true))
    return;
  struct device *d = first_device();
  if (!d) {
    psc_star_close();
    return;
  }
  ps_mutex_lock(&d->lock); /* the star is used under it */
  psc_star_close();
  for (uint64_t i = 0; d->shard && i < d->nchunks; i++)
    if (d->chunks[i].frame == psa_shared_frame(d))
      psa_unshare(d, i);
    else if (d->shard->paged_in[i])
      let_go(d, i);
  ps_mutex_unlock(&d->lock);
}

void psa_sharing_wire(void)
{
  psa_space_hooks.shared_drop = psa_shard_drop;
  psa_move_hooks.shared_leave = psa_shard_leave;
  psa_paging_hooks.unshare = psa_unshare;
  psa_paging_hooks.stop_sharing = psa_shard_stop;
}
