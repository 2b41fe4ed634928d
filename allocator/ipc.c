/* Legacy CUDA IPC (cudaIpcGetMemHandle / cudaIpcOpenMemHandle) of memory psshim serves.
 * CUDA's own handles do not cover VMM memory, so psshim makes its own, in the same 64
 * bytes: a magic, the exporter's pid and random token (comm/ipc.c's service), the device,
 * the allocation's base and size.
 *
 * Export: from the handle on, the chunks of the allocation's span never move (the pager,
 * its plans and sharing pass them over: span->exported), and each stays on the frame it
 * holds now, GPU or host, since every frame is made exportable (frames.c): no copy, and no
 * wait but for a move already underway. A shared chunk is made this process's own first.
 * The pin lasts as long as the span: psshim cannot know when the last importer is done.
 *
 * Open: the exporter's service sends the frames' file descriptors and the layout (chunk
 * size, the allocation's offset in its first chunk); they are imported and mapped in order
 * into a reservation of their own, outside the chunk space (nothing of this process's
 * paging touches them), readable and writable by the calling thread's device. Close
 * unmaps and frees that range. The frames live while either process maps them. */
#include "allocator/sharing.h"
#include "comm/comm.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAGIC 0x4350496d68737370ull /* "psshmIPC" */

/* The 64 bytes of a CUipcMemHandle, as psshim fills them. */
struct handle {
  uint64_t magic;
  int32_t pid;
  int32_t ordinal;
  uint64_t token;
  uint64_t base, size;
  unsigned char unused[24];
};
_Static_assert(sizeof(struct handle) == CU_IPC_HANDLE_SIZE && CU_IPC_HANDLE_SIZE == PSC_IPC_QUESTION,
               "psshim's handle is the handle's 64 bytes, sent as the question");

/* The exporter's answer, beside one descriptor per chunk. */
struct layout {
  uint64_t chunk_size, offset, nchunks;
};
_Static_assert(sizeof(struct layout) <= PSC_IPC_ANSWER, "the layout fits the answer");

/* Mappings of other processes' memory opened here. */
struct import {
  CUdeviceptr ptr, va;
  uint64_t len, chunk_size;
  struct import *next;
};
static ps_mutex imports_lock = PS_MUTEX_INITIALIZER(PS_RANK_IMPORTS, "the IPC imports lock");
static struct import *imports;

/* The chunks under [base, base + size): [*first, *first + *n). */
static void chunks_under(const struct device *d, CUdeviceptr base, uint64_t size, uint64_t *first, uint64_t *n)
{
  *first = (base - d->base) / d->chunk_size;
  *n = (base + size - 1 - d->base) / d->chunk_size + 1 - *first;
}

/* Pins the allocation at p (span->exported) and waits until each of its chunks is on a
 * frame of its own with no move underway; NULL, said once, when one cannot be (a shared
 * chunk that could not be made private). Drops d->lock while it waits, so the allocation
 * is looked up again after each wait. */
static struct alloc_entry *pin(struct device *d, CUdeviceptr p)
{
  PSA_HELD(d);
  uint64_t unshared = UINT64_MAX;
  for (;;) {
    struct alloc_entry *e = psa_map_find(d, p);
    if (!e)
      return NULL;
    e->span->exported = true; /* no move starts from now on */
    uint64_t first, n, i;
    chunks_under(d, p, e->size, &first, &n);
    for (i = first; i < first + n; i++) {
      struct chunk *c = &d->chunks[i];
      if (c->move == PSA_REMAPPING) {
        ps_cond_wait(&d->moves->moved, &d->lock);
        break;
      }
      if (c->frame == psa_shared_frame(d) && unshared != i) {
        unshared = i;
        psa_unshare(d, i);
        break;
      }
      if (c->frame == PSA_NO_FRAME || c->frame == psa_shared_frame(d)) {
        ps_error("cudaIpcGetMemHandle: chunk %llu of the allocation at 0x%llx has no frame of its own: no handle",
                 (unsigned long long)i, (unsigned long long)p);
        return NULL;
      }
      psa_copy_done(d, i, true); /* the frame it is on holds its data */
    }
    if (i == first + n)
      return e;
  }
}

/* comm/'s service asks: the descriptors of the frames under an allocation this process
 * exported. */
static int answer(const unsigned char question[PSC_IPC_QUESTION], unsigned char reply[PSC_IPC_ANSWER], int **fds)
{
  struct handle h;
  memcpy(&h, question, sizeof h);
  if (h.magic != MAGIC || h.pid != getpid() || h.ordinal < 0 || h.ordinal >= PSA_MAX_DEVICES ||
      !psa_devices[h.ordinal].ready)
    return -1;
  struct device *d = &psa_devices[h.ordinal];
  if (PS_CU(ps_driver.cuCtxSetCurrent(d->ctx)))
    return -1;
  ps_mutex_lock(&d->lock);
  struct alloc_entry *e = psa_map_find(d, h.base);
  uint64_t first = 0, n = 0, i = 0;
  int *out = NULL;
  if (e && e->size == h.size && e->span->exported) {
    chunks_under(d, h.base, h.size, &first, &n);
    out = malloc(sizeof *out * n);
    for (; out && i < n; i++) {
      const struct chunk *c = &d->chunks[first + i];
      /* Pinned: each is on a frame of its own (pin) and stays there. */
      if (PS_CU(ps_driver.cuMemExportToShareableHandle(&out[i], d->fr.frames[c->frame].handle,
                                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)))
        break;
    }
  }
  ps_mutex_unlock(&d->lock);
  if (!out || i < n) {
    while (out && i > 0)
      close(out[--i]);
    free(out);
    return -1;
  }
  struct layout l = {.chunk_size = d->chunk_size, .offset = h.base - (d->base + first * d->chunk_size), .nchunks = n};
  memcpy(reply, &l, sizeof l);
  *fds = out;
  return (int)n;
}

CUresult psa_ipc_export(CUdeviceptr p, CUipcMemHandle *out)
{
  int ordinal;
  if (!out || psa_chunk_of(p, &ordinal) < 0)
    return CUDA_ERROR_INVALID_VALUE;
  struct device *d = &psa_devices[ordinal];
  if (!d->exportable) {
    ps_error("cudaIpcGetMemHandle: device %d cannot export memory as file descriptors, so psshim's memory cannot "
             "be shared with another process", ordinal);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  uint64_t token = psc_ipc_serve(answer); /* says why when it cannot */
  if (!token)
    return CUDA_ERROR_OUT_OF_MEMORY;
  ps_mutex_lock(&d->lock);
  if (!psa_map_find(d, p)) {
    ps_mutex_unlock(&d->lock);
    ps_error("cudaIpcGetMemHandle: 0x%llx is not the start of an allocation psshim serves", (unsigned long long)p);
    return CUDA_ERROR_INVALID_VALUE;
  }
  struct alloc_entry *e = pin(d, p);
  uint64_t size = e ? e->size : 0;
  ps_mutex_unlock(&d->lock);
  if (!e)
    return CUDA_ERROR_INVALID_VALUE;
  struct handle h = {.magic = MAGIC, .pid = getpid(), .ordinal = ordinal, .token = token, .base = p, .size = size};
  memset(out, 0, sizeof *out);
  memcpy(out, &h, sizeof h);
  return CUDA_SUCCESS;
}

bool psa_ipc_handle_ours(const CUipcMemHandle *handle)
{
  uint64_t magic;
  memcpy(&magic, handle->reserved, sizeof magic);
  return magic == MAGIC;
}

/* Unmaps the first n chunks at va, one by one (each a mapping of its own). */
static void unmap_chunks(CUdeviceptr va, uint64_t n, uint64_t chunk_size)
{
  for (uint64_t i = 0; i < n; i++)
    PS_CU(ps_driver.cuMemUnmap(va + i * chunk_size, chunk_size));
}

/* Imports and maps the frames in order at va, readable and writable by the device; closes
 * every fd. False (nothing left mapped) on a driver failure. */
static bool map_frames(CUdeviceptr va, const struct layout *l, int *fds, int ordinal)
{
  uint64_t mapped = 0;
  for (; mapped < l->nchunks; mapped++) {
    CUmemGenericAllocationHandle h;
    CUresult r = ps_driver.cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fds[mapped],
                                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fds[mapped]);
    fds[mapped] = -1;
    if (PS_CU(r))
      break;
    /* The mapping holds the memory: the handle is not needed after it. */
    r = ps_driver.cuMemMap(va + mapped * l->chunk_size, l->chunk_size, 0, h, 0);
    PS_CU(ps_driver.cuMemRelease(h));
    if (PS_CU(r))
      break;
  }
  for (uint64_t i = mapped; i < l->nchunks; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  CUmemAccessDesc access = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = ordinal},
                            .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  if (mapped == l->nchunks && !PS_CU(ps_driver.cuMemSetAccess(va, l->nchunks * l->chunk_size, &access, 1)))
    return true;
  unmap_chunks(va, mapped, l->chunk_size);
  return false;
}

CUresult psa_ipc_open(int ordinal, const CUipcMemHandle *handle, CUdeviceptr *p)
{
  struct handle h;
  memcpy(&h, handle, sizeof h);
  if (!p)
    return CUDA_ERROR_INVALID_VALUE;
  unsigned char reply[PSC_IPC_ANSWER];
  int *fds = NULL;
  int n = psc_ipc_ask(h.pid, h.token, (const unsigned char *)handle, reply, &fds); /* says why when it fails */
  if (n < 0)
    return CUDA_ERROR_INVALID_VALUE;
  struct layout l;
  memcpy(&l, reply, sizeof l);
  CUdeviceptr va = 0;
  struct import *im = malloc(sizeof *im);
  bool fits = l.chunk_size && l.offset < l.chunk_size && l.nchunks == (uint64_t)n && n > 0 &&
              (l.offset + h.size + l.chunk_size - 1) / l.chunk_size == l.nchunks;
  bool ok = im && fits && !PS_CU(ps_driver.cuMemAddressReserve(&va, l.nchunks * l.chunk_size, psa_va_align(l.chunk_size), 0, 0));
  if (ok && !map_frames(va, &l, fds, ordinal)) {
    PS_CU(ps_driver.cuMemAddressFree(va, l.nchunks * l.chunk_size));
    ok = false;
  } else if (!ok) {
    for (int i = 0; i < n; i++)
      close(fds[i]);
  }
  free(fds);
  if (!ok) {
    free(im);
    ps_error("a CUDA IPC handle of process %d (%llu bytes) could not be mapped here%s", (int)h.pid,
             (unsigned long long)h.size, fits ? "" : ": the answer does not fit the handle");
    return CUDA_ERROR_INVALID_VALUE;
  }
  *im = (struct import){.ptr = va + l.offset, .va = va, .len = l.nchunks * l.chunk_size, .chunk_size = l.chunk_size};
  ps_mutex_lock(&imports_lock);
  im->next = imports;
  imports = im;
  ps_mutex_unlock(&imports_lock);
  *p = im->ptr;
  return CUDA_SUCCESS;
}

CUresult psa_ipc_close(CUdeviceptr p)
{
  struct import *im = NULL;
  if (ps_in_forked_child()) /* CUDA's rule: nothing here is usable (and the lock may be held) */
    return CUDA_ERROR_NOT_SUPPORTED;
  ps_mutex_lock(&imports_lock);
  for (struct import **at = &imports; *at; at = &(*at)->next)
    if ((*at)->ptr == p) {
      im = *at;
      *at = im->next;
      break;
    }
  ps_mutex_unlock(&imports_lock);
  if (!im)
    return CUDA_ERROR_NOT_SUPPORTED;
  /* cuMemUnmap does not wait for kernels: work still queued on the range finishes first. */
  PS_CU(ps_driver.cuCtxSynchronize());
  unmap_chunks(im->va, im->len / im->chunk_size, im->chunk_size);
  PS_CU(ps_driver.cuMemAddressFree(im->va, im->len));
  free(im);
  return CUDA_SUCCESS;
}
