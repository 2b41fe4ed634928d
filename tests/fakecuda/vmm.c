/* The virtual memory management API on host memory:
 *   reservation  = anonymous mmap(PROT_NONE), aligned as asked, plus one more of the same
 *                  size per device: that device's view (see below);
 *   frame        = memfd of the frame's size, charged to its device or to the host budget;
 *   cuMemMap     = mmap(MAP_FIXED|MAP_SHARED) of the memfd at the address and at the same
 *                  offset in every device's view, all still PROT_NONE (as on CUDA, a
 *                  mapping is inaccessible until cuMemSetAccess);
 *   cuMemSetAccess = mprotect of each named location's view: a device's descriptor opens
 *                  that device's view, a host descriptor (host frames only) the address
 *                  itself, which is what host code dereferences;
 *   cuMemUnmap   = back to anonymous PROT_NONE, so a touch of an unmapped chunk faults.
 * Work on a stream of device d (kernels, copies, memsets) reaches reserved addresses
 * through device d's view (fc_device_view: kernel parameters are translated when the
 * kernel runs). So the host faults on a device frame, and a device faults where its own
 * descriptor gave it no access, whatever other locations were given, as on CUDA.
 * Remapping (unmap or map) a range that queued work will touch aborts the process with
 * a line naming the work (fc_check_unqueued): CUDA would let that work run against
 * whatever is mapped there when it runs.
 * Data lives in the memfd, so it survives unmap and remap at another address, and a
 * frame can be mapped at two addresses at once (psshim's staging mapping).
 * A frame is freed (and uncharged) when its handle is released and its last mapping
 * is gone, as on CUDA. A frame created with requestedHandleTypes POSIX_FILE_DESCRIPTOR
 * exports as a dup of its memfd; importing an fd makes a frame over that memfd, so two
 * processes map the same pages (charged to the exporter only). Everything here is under fc_mem_mu. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fakecuda_internal.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

struct fc_frame {
  int fd;
  size_t size;
  int dev; /* FC_HOST for HOST / HOST_NUMA frames */
  CUmemAllocationProp prop;
  int handle_refs; /* cuMemCreate + cuMemRetainAllocationHandle - cuMemRelease */
  int refs;        /* handle_refs > 0 counts one, plus one per mapping */
  bool imported;   /* from another process's fd: its memory is charged there */
};
struct fc_piece { /* one cuMemMap */
  CUdeviceptr va;
  size_t size;
  struct fc_frame *frame;
  unsigned long long access[FC_MAX_DEVICES]; /* CU_MEM_ACCESS_FLAGS_* per device */
  unsigned long long host_access;            /* the host's, host frames only */
  struct fc_piece *next;
};
struct fc_reservation {
  CUdeviceptr base;
  size_t size;
  char *view[FC_MAX_DEVICES]; /* each device's view of [base, base+size) */
  struct fc_piece *pieces;
  struct fc_reservation *next;
};
static struct fc_reservation *reservations;
static struct fc_handles frames = FC_HANDLES_INIT; /* frames whose handle is not released */

#define G FC_GRANULARITY

static void frame_unref(struct fc_frame *f) {
  if (--f->refs > 0) return;
  close(f->fd);
  if (!f->imported) fc_uncharge(f->dev, f->size);
  free(f);
}

static struct fc_reservation *find_reservation(CUdeviceptr p, size_t n) {
  for (struct fc_reservation *r = reservations; r; r = r->next)
    if (p >= r->base && p - r->base < r->size && n <= r->size - (p - r->base)) return r;
  return NULL;
}

void *fc_device_view(int dev, CUdeviceptr p) {
  pthread_mutex_lock(&fc_mem_mu);
  struct fc_reservation *r = find_reservation(p, 1);
  void *v = r ? r->view[dev] + (p - r->base) : (void *)(uintptr_t)p;
  pthread_mutex_unlock(&fc_mem_mu);
  return v;
}

/* Maps [va, va+size) of reservation r, and the same range of every view, to the memfd at
 * offset (fd >= 0) or back to anonymous memory (fd < 0), inaccessible. */
static bool map_all(struct fc_reservation *r, CUdeviceptr va, size_t size, int fd, off_t offset) {
  int flags = fd >= 0 ? MAP_SHARED | MAP_FIXED : MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED;
  bool ok = mmap((void *)(uintptr_t)va, size, PROT_NONE, flags, fd, offset) != MAP_FAILED;
  for (int d = 0; d < fc_cfg.device_count; d++)
    ok = mmap(r->view[d] + (va - r->base), size, PROT_NONE, flags, fd, offset) != MAP_FAILED && ok;
  return ok;
}

/* A range that could not be put back to the reservation's inaccessible state would stay
 * readable: a fake that lies is worse than none, so it stops, saying why (mmap fails here
 * mostly when the process has run out of mappings: vm.max_map_count, each chunk mapped at
 * its address and at one view per device). */
static _Noreturn void unrestorable(CUdeviceptr va, size_t size) {
  int e = errno;
  fprintf(stderr, "fakecuda: cannot return [0x%llx, +%zu) to its reservation: %s (vm.max_map_count too low?)\n",
          (unsigned long long)va, size, strerror(e));
  abort();
}

static int prot_of(unsigned long long flags) {
  return flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
         : flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                     : PROT_NONE;
}

bool fc_vmm_reserved(CUdeviceptr p, size_t n) {
  pthread_mutex_lock(&fc_mem_mu);
  bool ok = find_reservation(p, n) != NULL;
  pthread_mutex_unlock(&fc_mem_mu);
  return ok;
}

bool fc_vmm_lookup(CUdeviceptr p, struct fc_ptr_info *info) {
  bool found = false;
  pthread_mutex_lock(&fc_mem_mu);
  struct fc_reservation *r = find_reservation(p, 1);
  if (r) {
    found = true;
    *info = (struct fc_ptr_info){r->base, r->size, FC_HOST, false};
    for (struct fc_piece *m = r->pieces; m; m = m->next)
      if (p >= m->va && p - m->va < m->size) *info = (struct fc_ptr_info){m->va, m->size, m->frame->dev, true};
  }
  pthread_mutex_unlock(&fc_mem_mu);
  return found;
}

/* Where a frame may live: a device, or the host (HOST, HOST_NUMA node 0, HOST_NUMA_CURRENT). */
static CUresult location_dev(const CUmemLocation *loc, int *dev) {
  switch (loc->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (loc->id < 0 || loc->id >= fc_cfg.device_count) return CUDA_ERROR_INVALID_DEVICE;
      *dev = loc->id;
      return CUDA_SUCCESS;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      if (loc->id != 0) return CUDA_ERROR_INVALID_VALUE; /* one NUMA node */
      /* fall through */
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      *dev = FC_HOST;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

/* ---- address reservations ---- */
static CUresult address_reserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                unsigned long long flags) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!ptr || size == 0 || size % G || flags || (alignment & (alignment - 1))) return CUDA_ERROR_INVALID_VALUE;
  if (alignment < G) alignment = G;
  struct fc_reservation *res = malloc(sizeof *res);
  if (!res) return CUDA_ERROR_OUT_OF_MEMORY;
  const int prot = PROT_NONE, mflags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  char *base = MAP_FAILED;
  if (addr && addr % alignment == 0) { /* a hint: honoured when that range is free */
    base = mmap((void *)(uintptr_t)addr, size, prot, mflags | MAP_FIXED_NOREPLACE, -1, 0);
    if (base != MAP_FAILED && base != (char *)(uintptr_t)addr) {
      munmap(base, size);
      base = MAP_FAILED;
    }
  }
  if (base == MAP_FAILED) {
    char *raw = mmap(NULL, size + alignment, prot, mflags, -1, 0);
    if (raw == MAP_FAILED) {
      free(res);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    base = (char *)(((uintptr_t)raw + alignment - 1) & ~(uintptr_t)(alignment - 1));
    if (base > raw) munmap(raw, (size_t)(base - raw));
    size_t tail = (size_t)(raw + size + alignment - (base + size));
    if (tail) munmap(base + size, tail);
  }
  res->base = (CUdeviceptr)(uintptr_t)base;
  res->size = size;
  res->pieces = NULL;
  for (int d = 0; d < fc_cfg.device_count; d++) {
    res->view[d] = mmap(NULL, size, prot, mflags, -1, 0);
    if (res->view[d] == MAP_FAILED) {
      while (d-- > 0) munmap(res->view[d], size);
      munmap(base, size);
      free(res);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  pthread_mutex_lock(&fc_mem_mu);
  res->next = reservations;
  reservations = res;
  pthread_mutex_unlock(&fc_mem_mu);
  *ptr = res->base;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                       unsigned long long flags) {
  FC_TRACED(cuMemAddressReserve, address_reserve(ptr, size, alignment, addr, flags), ptr, size, alignment, addr,
            flags);
}

/* The whole reservation, with nothing mapped in it any more. */
static CUresult address_free(CUdeviceptr ptr, size_t size) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  r = CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fc_mem_mu);
  for (struct fc_reservation **pp = &reservations; *pp; pp = &(*pp)->next) {
    struct fc_reservation *res = *pp;
    if (res->base == ptr && res->size == size && !res->pieces) {
      *pp = res->next;
      munmap((void *)(uintptr_t)res->base, res->size);
      for (int d = 0; d < fc_cfg.device_count; d++) munmap(res->view[d], res->size);
      free(res);
      r = CUDA_SUCCESS;
      break;
    }
  }
  pthread_mutex_unlock(&fc_mem_mu);
  return r;
}
FC_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  FC_TRACED(cuMemAddressFree, address_free(ptr, size), ptr, size);
}

/* ---- frames ---- */
static CUresult mem_create(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                           unsigned long long flags) {
  int dev;
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!handle || !prop || flags || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || size == 0 || size % G)
    return CUDA_ERROR_INVALID_VALUE;
  r = location_dev(&prop->location, &dev);
  if (r != CUDA_SUCCESS) return r;
  if (prop->requestedHandleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  if (prop->allocFlags.compressionType || prop->allocFlags.usage) return CUDA_ERROR_NOT_SUPPORTED;
  if (!fc_charge(dev, size)) return CUDA_ERROR_OUT_OF_MEMORY;
  struct fc_frame *f = calloc(1, sizeof *f);
  int fd = memfd_create("fakecuda-frame", MFD_CLOEXEC);
  if (!f || fd < 0 || ftruncate(fd, (off_t)size) != 0 || !fc_handles_add(&frames, f)) {
    if (fd >= 0) close(fd);
    free(f);
    fc_uncharge(dev, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  f->fd = fd;
  f->size = size;
  f->dev = dev;
  f->prop = *prop;
  f->handle_refs = 1;
  f->refs = 1;
  *handle = (CUmemGenericAllocationHandle)(uintptr_t)f;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags) {
  FC_TRACED(cuMemCreate, mem_create(handle, size, prop, flags), handle, size, prop, flags);
}

static struct fc_frame *frame_of(CUmemGenericAllocationHandle h) {
  struct fc_frame *f = (struct fc_frame *)(uintptr_t)h;
  return fc_handles_has(&frames, f) ? f : NULL;
}

static CUresult mem_release(CUmemGenericAllocationHandle h) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&fc_mem_mu);
  struct fc_frame *f = frame_of(h);
  if (!f) {
    r = CUDA_ERROR_INVALID_VALUE;
  } else if (--f->handle_refs == 0) {
    fc_handles_remove(&frames, f);
    frame_unref(f); /* memory goes when the last mapping does */
  }
  pthread_mutex_unlock(&fc_mem_mu);
  return r;
}
FC_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  FC_TRACED(cuMemRelease, mem_release(handle), handle);
}

static CUresult mem_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                        unsigned long long flags) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (flags || size == 0 || ptr % G || size % G || offset % G) return CUDA_ERROR_INVALID_VALUE;
  fc_sleep_us(atomic_load(&fc_cfg.remap_delay_us)); /* work queued meanwhile is caught just below */
  fc_check_unqueued(ptr, size, "cuMemMap");
  struct fc_piece *m = calloc(1, sizeof *m);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&fc_mem_mu);
  struct fc_frame *f = frame_of(h);
  struct fc_reservation *res = find_reservation(ptr, size);
  if (!f || !res || offset > f->size || size > f->size - offset) r = CUDA_ERROR_INVALID_VALUE;
  for (struct fc_piece *p = res && !r ? res->pieces : NULL; p; p = p->next)
    if (ptr < p->va + p->size && p->va < ptr + size) r = CUDA_ERROR_INVALID_VALUE; /* already mapped */
  if (r == CUDA_SUCCESS && !map_all(res, ptr, size, f->fd, (off_t)offset)) {
    if (!map_all(res, ptr, size, -1, 0)) unrestorable(ptr, size);
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r == CUDA_SUCCESS) {
    *m = (struct fc_piece){.va = ptr, .size = size, .frame = f, .next = res->pieces};
    res->pieces = m;
    f->refs++;
  }
  pthread_mutex_unlock(&fc_mem_mu);
  if (r != CUDA_SUCCESS) free(m);
  return r;
}
FC_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                            unsigned long long flags) {
  FC_TRACED(cuMemMap, mem_map(ptr, size, offset, handle, flags), ptr, size, offset, handle, flags);
}

/* Unmaps every mapping inside [ptr, ptr+size); a mapping only partly inside is an
 * error (CUDA unmaps whole mappings). Does not wait for running kernels, like CUDA. */
static CUresult mem_unmap(CUdeviceptr ptr, size_t size) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (size == 0 || ptr % G || size % G) return CUDA_ERROR_INVALID_VALUE;
  fc_check_unqueued(ptr, size, "cuMemUnmap");
  pthread_mutex_lock(&fc_mem_mu);
  struct fc_reservation *res = find_reservation(ptr, size);
  int inside = 0;
  for (struct fc_piece *p = res ? res->pieces : NULL; p; p = p->next) {
    if (!(ptr < p->va + p->size && p->va < ptr + size)) continue;
    if (p->va < ptr || p->va + p->size > ptr + size) r = CUDA_ERROR_INVALID_VALUE;
    inside++;
  }
  if (!res || inside == 0) r = CUDA_ERROR_INVALID_VALUE;
  for (struct fc_piece **pp = r == CUDA_SUCCESS ? &res->pieces : NULL; pp && *pp;) {
    struct fc_piece *p = *pp;
    if (p->va >= ptr && p->va + p->size <= ptr + size) {
      if (!map_all(res, p->va, p->size, -1, 0))
        unrestorable(p->va, p->size);
      *pp = p->next;
      frame_unref(p->frame);
      free(p);
    } else {
      pp = &p->next;
    }
  }
  pthread_mutex_unlock(&fc_mem_mu);
  return r;
}
FC_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) { FC_TRACED(cuMemUnmap, mem_unmap(ptr, size), ptr, size); }

/* Each descriptor sets its own location's access and leaves the others' alone. A host
 * descriptor is for host frames only: the host cannot reach a device frame. The range must
 * be entirely mapped. */
static CUresult set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
  int dev;
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!desc || count == 0 || size == 0 || ptr % G || size % G) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; i++) {
    r = location_dev(&desc[i].location, &dev);
    if (r != CUDA_SUCCESS) return r;
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return CUDA_ERROR_INVALID_VALUE;
  }
  pthread_mutex_lock(&fc_mem_mu);
  struct fc_reservation *res = find_reservation(ptr, size);
  size_t covered = 0;
  bool device_frame = false;
  for (struct fc_piece *p = res ? res->pieces : NULL; p; p = p->next) {
    CUdeviceptr lo = p->va > ptr ? p->va : ptr, hi = p->va + p->size < ptr + size ? p->va + p->size : ptr + size;
    if (lo < hi) {
      covered += hi - lo;
      device_frame |= p->frame->dev != FC_HOST;
    }
  }
  for (size_t i = 0; i < count && res && covered == size; i++)
    if (location_dev(&desc[i].location, &dev) == CUDA_SUCCESS && dev == FC_HOST && device_frame) covered = 0;
  if (!res || covered != size) r = CUDA_ERROR_INVALID_VALUE;
  for (struct fc_piece *p = r == CUDA_SUCCESS ? res->pieces : NULL; p; p = p->next) {
    if (!(p->va < ptr + size && ptr < p->va + p->size)) continue;
    for (size_t i = 0; i < count; i++) {
      location_dev(&desc[i].location, &dev);
      if (dev == FC_HOST) p->host_access = desc[i].flags;
      else p->access[dev] = desc[i].flags;
    }
    bool ok = mprotect((void *)(uintptr_t)p->va, p->size, prot_of(p->host_access)) == 0;
    for (int d = 0; d < fc_cfg.device_count; d++)
      ok = mprotect(res->view[d] + (p->va - res->base), p->size, prot_of(p->access[d])) == 0 && ok;
    if (!ok) r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_unlock(&fc_mem_mu);
  return r;
}
FC_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
  FC_TRACED(cuMemSetAccess, set_access(ptr, size, desc, count), ptr, size, desc, count);
}

static CUresult get_access(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr) {
  int dev;
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!flags || !location) return CUDA_ERROR_INVALID_VALUE;
  r = location_dev(location, &dev);
  if (r != CUDA_SUCCESS) return r;
  r = CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fc_mem_mu);
  struct fc_reservation *res = find_reservation(ptr, 1);
  for (struct fc_piece *p = res ? res->pieces : NULL; p; p = p->next) {
    if (ptr >= p->va && ptr - p->va < p->size) {
      *flags = dev == FC_HOST ? p->host_access : p->access[dev];
      r = CUDA_SUCCESS;
    }
  }
  pthread_mutex_unlock(&fc_mem_mu);
  return r;
}
FC_EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr) {
  FC_TRACED(cuMemGetAccess, get_access(flags, location, ptr), flags, location, ptr);
}

static CUresult granularity(size_t *g, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option) {
  int dev;
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!g || !prop || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
    return CUDA_ERROR_INVALID_VALUE;
  r = location_dev(&prop->location, &dev);
  if (r != CUDA_SUCCESS) return r;
  *g = G;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity_out, const CUmemAllocationProp *prop,
                                                 CUmemAllocationGranularity_flags option) {
  FC_TRACED(cuMemGetAllocationGranularity, granularity(granularity_out, prop, option), granularity_out, prop,
            option);
}

/* A new handle reference to the frame mapped at addr; cuMemRelease drops it. */
static CUresult retain_handle(CUmemGenericAllocationHandle *handle, void *addr) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr;
  r = CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fc_mem_mu);
  struct fc_reservation *res = find_reservation(p, 1);
  for (struct fc_piece *m = res ? res->pieces : NULL; m && r != CUDA_SUCCESS; m = m->next) {
    if (p >= m->va && p - m->va < m->size) {
      struct fc_frame *f = m->frame;
      if (f->handle_refs == 0) { /* released but still mapped: the handle comes back */
        if (!fc_handles_add(&frames, f)) break;
        f->refs++;
      }
      f->handle_refs++;
      *handle = (CUmemGenericAllocationHandle)(uintptr_t)f;
      r = CUDA_SUCCESS;
    }
  }
  pthread_mutex_unlock(&fc_mem_mu);
  return r;
}
FC_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
  FC_TRACED(cuMemRetainAllocationHandle, retain_handle(handle, addr), handle, addr);
}

static CUresult props_from_handle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!prop) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fc_mem_mu);
  struct fc_frame *f = frame_of(h);
  if (f)
    *prop = f->prop;
  else
    r = CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_unlock(&fc_mem_mu);
  return r;
}
FC_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                          CUmemGenericAllocationHandle handle) {
  FC_TRACED(cuMemGetAllocationPropertiesFromHandle, props_from_handle(prop, handle), prop, handle);
}

/* ---- sharing between processes (POSIX file descriptors only) ---- */
static CUresult export_handle(void *shareable, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                              unsigned long long flags) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!shareable || flags) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  pthread_mutex_lock(&fc_mem_mu);
  struct fc_frame *f = frame_of(h);
  if (!f || !(f->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
    r = CUDA_ERROR_INVALID_VALUE; /* as CUDA: only an allocation created exportable */
  } else {
    int fd = fcntl(f->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) r = CUDA_ERROR_OUT_OF_MEMORY;
    else *(int *)shareable = fd;
  }
  pthread_mutex_unlock(&fc_mem_mu);
  return r;
}
FC_EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                                CUmemAllocationHandleType handleType, unsigned long long flags) {
  FC_TRACED(cuMemExportToShareableHandle, export_handle(shareableHandle, handle, handleType, flags), shareableHandle,
            handle, handleType, flags);
}

/* The caller keeps its fd (CUDA's rule): the frame holds a dup of it. */
static CUresult import_handle(CUmemGenericAllocationHandle *handle, void *os_handle, CUmemAllocationHandleType type) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  int given = (int)(intptr_t)os_handle;
  struct stat st;
  if (given < 0 || fstat(given, &st) != 0 || st.st_size <= 0 || (size_t)st.st_size % G) return CUDA_ERROR_INVALID_VALUE;
  struct fc_frame *f = calloc(1, sizeof *f);
  int fd = fcntl(given, F_DUPFD_CLOEXEC, 0);
  pthread_mutex_lock(&fc_mem_mu);
  if (!f || fd < 0 || !fc_handles_add(&frames, f)) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    *f = (struct fc_frame){.fd = fd, .size = (size_t)st.st_size, .dev = FC_HOST, .handle_refs = 1, .refs = 1,
                           .imported = true,
                           .prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_HOST},
                                    .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR}};
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)f;
  }
  pthread_mutex_unlock(&fc_mem_mu);
  if (r != CUDA_SUCCESS) {
    if (fd >= 0) close(fd);
    free(f);
  }
  return r;
}
FC_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                                  CUmemAllocationHandleType shHandleType) {
  FC_TRACED(cuMemImportFromShareableHandle, import_handle(handle, osHandle, shHandleType), handle, osHandle,
            shHandleType);
}
