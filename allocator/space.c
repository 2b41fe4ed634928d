/* Per-device set-up: budgets, the address reservation, chunk slots, mapping. */
#include "allocator/space.h"
#include "comm/comm.h"
#include "tracer/tracer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct device psa_devices[PSA_MAX_DEVICES];
_Atomic uint64_t psa_space_lo[PSA_MAX_DEVICES], psa_space_hi[PSA_MAX_DEVICES];
/* The hull of every device's space: one comparison rejects almost every foreign value
 * (the tracer asks this of every word of every launch's parameters). */
static _Atomic uint64_t hull_lo = UINT64_MAX, hull_hi;
static _Atomic int devices_hi; /* one past the highest ordinal set up */
_Atomic bool psa_allocs_agree;
struct psa_space_hooks psa_space_hooks;
static ps_mutex setup_lock = PS_MUTEX_INITIALIZER(PS_RANK_SETUP, "the device set-up lock");

#define GiB (1024ull * 1024 * 1024)

/* A configuration the device cannot honour refuses the device, said once: running on with
 * a budget other than the one asked for would mislead, and psshim never ends the program
 * it lives in after start-up, so every allocation on the device fails instead. */
static bool config_refused(struct device *d, const char *msg, const char *var, uint64_t limit)
{
  char setting[160], size[32];
  ps_error("%s %s (%s): set a smaller value; allocations on device %d fail",
           ps_setting_text(var, setting, sizeof setting), msg, ps_size_text(limit, size, sizeof size), d->ordinal);
  d->refused = true;
  return false;
}

/* A cgroup's memory limit in bytes from one of its files ("max" or unreadable: none). */
static uint64_t cgroup_limit(const char *path)
{
  FILE *f = fopen(path, "r");
  unsigned long long v = 0;
  bool read = f && fscanf(f, "%llu", &v) == 1;
  if (f)
    fclose(f);
  return read ? (uint64_t)v : 0;
}

uint64_t psa_ram_limit(uint64_t ram, const char *proc_cgroup, const char *cgroup_root)
{
  char line[512], path[1200];
  FILE *f = fopen(proc_cgroup, "r");
  while (f && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    uint64_t limit = 0;
    const char *v1 = strstr(line, ":memory:");
    if (strncmp(line, "0::", 3) == 0) { /* cgroup v2 */
      snprintf(path, sizeof path, "%s%s/memory.max", cgroup_root, line + 3);
      limit = cgroup_limit(path);
    } else if (v1) { /* cgroup v1 */
      snprintf(path, sizeof path, "%s/memory%s/memory.limit_in_bytes", cgroup_root, v1 + 8);
      limit = cgroup_limit(path);
    }
    if (limit && (!ram || limit < ram))
      ram = limit;
  }
  if (f)
    fclose(f);
  return ram;
}

/* The memory this process may use: physical RAM, or its cgroup's limit where that is lower
 * (in a container 75% of the host's RAM can be more than the container may have). */
static uint64_t usable_ram(void)
{
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
  return psa_ram_limit(ram, "/proc/self/cgroup", "/sys/fs/cgroup");
}

/* A budget smaller than one chunk holds none: said, since the run goes on with that
 * memory unused. */
static void no_chunk_fits(const struct device *d, const char *var, uint64_t budget, const char *effect)
{
  if (budget >= d->chunk_size)
    return;
  char setting[160], chunk[64] = "the default", b[32], c[32];
  if (ps_options.chunk_size && getenv("PSSHIM_CHUNK_SIZE"))
    snprintf(chunk, sizeof chunk, "PSSHIM_CHUNK_SIZE=%s", getenv("PSSHIM_CHUNK_SIZE"));
  ps_error("%s: %s on device %d holds no chunk of %s (%s): %s; set a budget of at least %s or a smaller chunk",
           ps_setting_text(var, setting, sizeof setting), ps_size_text(budget, b, sizeof b), d->ordinal,
           ps_size_text(d->chunk_size, c, sizeof c), chunk, effect, c);
}

static bool budgets(struct device *d)
{
  size_t total = 0;
  if (PS_CU(ps_driver.cuDeviceTotalMem_v2(&total, d->dev)))
    return false;
  uint64_t chunk = d->chunk_size, gpu;
  if (ps_options.gpu_budget) {
    if (ps_options.gpu_budget > total)
      return config_refused(d, "is above this device's memory", "PSSHIM_GPU_BUDGET", total);
    gpu = ps_options.gpu_budget;
  } else if (ps_options.gpu_budget_frac > 0) {
    gpu = (uint64_t)((double)total * ps_options.gpu_budget_frac);
  } else {
    uint64_t reserve = ps_options.gpu_reserve ? ps_options.gpu_reserve : (total / 4 < 2 * GiB ? total / 4 : 2 * GiB);
    if (reserve >= total)
      return config_refused(d, "leaves nothing of the device's memory", "PSSHIM_GPU_RESERVE", total);
    gpu = total - reserve;
  }
  uint64_t ram = usable_ram(), host;
  if (ps_options.host_budget) {
    if (ram && ps_options.host_budget > ram)
      return config_refused(d, "is above the memory this process may use", "PSSHIM_HOST_BUDGET", ram);
    host = ps_options.host_budget;
  } else {
    /* 75% by default: the program keeps a quarter; FSDP2's and DeepSpeed's offloads pin
     * all of their host state with no cap at all. */
    host = (uint64_t)((double)ram * (ps_options.host_budget_frac > 0 ? ps_options.host_budget_frac : 0.75));
  }
  d->fr.gpu_limit = gpu / chunk;
  d->fr.host_limit = host / chunk;
  no_chunk_fits(d, "PSSHIM_GPU_BUDGET", gpu, "every chunk lives in host frames and is read in place");
  no_chunk_fits(d, "PSSHIM_HOST_BUDGET", host, "nothing goes beyond the GPU budget");
  d->stats.gpu_budget = d->fr.gpu_limit * chunk;
  d->stats.host_budget = d->fr.host_limit * chunk;
  d->stats.chunk_size = chunk;
  ps_log(PS_LOG_INFO, "device %d: GPU budget %llu MiB, host budget %llu MiB, chunk %llu MiB", d->ordinal,
         (unsigned long long)(d->stats.gpu_budget >> 20), (unsigned long long)(d->stats.host_budget >> 20),
         (unsigned long long)(chunk >> 20));
  return true;
}

/* Without PSSHIM_CHUNK_SIZE: 4M, or the node's rank count times the granularity where that
 * is larger (so that every rank holds a mappable piece of a shared chunk). A tensor larger
 * than a chunk leaves its last chunk's tail to smaller tensors: just over budget, 4M chunks
 * were fuller at the peak than 16M ones, so less was read in place from host frames and
 * steps were faster (2M: no better). Far over budget 16M chunks were faster until launch
 * state was kept per span, then no longer; with it per chunk, not measured. */
#define PSA_DEFAULT_CHUNK (4ull << 20)

static bool settle_chunk_size(struct device *d)
{
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = d->ordinal}};
  size_t gran = 0;
  if (PS_CU(ps_driver.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)))
    return false;
  if (gran && !ps_options.chunk_size)
    d->chunk_size = psc_shardable_chunk_size(PSA_DEFAULT_CHUNK, gran);
  if (gran == 0 || d->chunk_size % gran) {
    ps_error("PSSHIM_CHUNK_SIZE=%llu is not a multiple of device %d's granularity (%zu bytes): allocations on "
             "it fail", (unsigned long long)d->chunk_size, d->ordinal, gran);
    d->refused = true;
    return false;
  }
  return true;
}

/* A digest of the allocations that ignores their order: threads (a framework's autograd
 * thread) may interleave them differently on each rank. */
void psa_digest_alloc(struct device *d, uint64_t size)
{
  uint64_t x = size + 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  d->space.alloc_digest += x ^ (x >> 31);
}

void psa_compare_allocs(void)
{
  /* Devices count in the order of their ordinals, not by them: each rank has its own GPU
   * (rank 1 of a torchrun job allocates on device 1 what rank 0 does on device 0). */
  uint64_t digest = 0, used = 0;
  for (int i = 0; i < PSA_MAX_DEVICES; i++) {
    struct device *d = &psa_devices[i];
    if (!d->ready)
      continue;
    ps_mutex_lock(&d->lock);
    digest = digest * 31 + d->space.alloc_digest + used++;
    ps_mutex_unlock(&d->lock);
  }
  psa_allocs_agree = psc_check_alloc_hash(digest); /* says a difference itself, on every rank */
}

/* Under torchrun the ranks of a node meet once: every rank must run with the same
 * configuration (a mismatch is said in one line on every rank, which then runs on its
 * own), and together they pin at most PSSHIM_HOST_BUDGET (comm/'s node accounting). A
 * single process (WORLD_SIZE unset or 1) costs one getenv. */
static void join_node(struct device *d)
{
  static bool joined;
  if (joined)
    return;
  joined = true;
  struct psc_config cfg = {.chunk_size = d->chunk_size, .gpu_budget = d->stats.gpu_budget,
                           .host_budget = d->stats.host_budget};
  snprintf(cfg.policy, sizeof cfg.policy, "%s", ps_policy_name(ps_options.policy));
  if (psc_node_join(&cfg, 0) == PSC_BAD)
    ps_log(PS_LOG_WARN, "this rank runs without the node's other ranks (see the line above)");
}

static bool setup(struct device *d, int ordinal)
{
  d->ordinal = ordinal;
  d->chunk_size = ps_options.chunk_size;
  if (PS_CU(ps_driver.cuDeviceGet(&d->dev, ordinal)) || PS_CU(ps_driver.cuDevicePrimaryCtxRetain(&d->ctx, d->dev)))
    return false;
  if (!settle_chunk_size(d) || !budgets(d))
    return false;
  d->max_frames = d->fr.gpu_limit + d->fr.host_limit;
  /* Twice the frames' worth of addresses: spans of several chunks fragment the space. */
  d->nchunks = 2 * d->max_frames + 16;
  uint64_t bytes = d->nchunks * d->chunk_size;
  if (PS_CU(ps_driver.cuMemAddressReserve(&d->base, bytes, psa_va_align(d->chunk_size), 0, 0)))
    return false;
  if (PS_CU(ps_driver.cuMemAddressReserve(&d->staging_base, (d->max_frames + 1) * d->chunk_size,
                                         psa_va_align(d->chunk_size), 0, 0))) {
    PS_CU(ps_driver.cuMemAddressFree(d->base, bytes));
    return false;
  }
  d->chunks = calloc(d->nchunks, sizeof *d->chunks);
  d->fr.frames = calloc(d->max_frames + 2, sizeof *d->fr.frames); /* and psa_shared_frame */
  if (!d->chunks || !d->fr.frames || (psa_space_hooks.setup && !psa_space_hooks.setup(d))) {
    ps_error("out of host memory for chunk tables");
    return false;
  }
  for (uint64_t i = 0; i < d->nchunks; i++)
    d->chunks[i].frame = PSA_NO_FRAME;
  d->fr.frames[psa_shared_frame(d)].where = PSA_HOST;
  join_node(d); /* before any host frame is made, so every one is counted node-wide */
  if (PS_CU(psa_frames_init(d)))
    return false;
  atomic_store(&psa_space_lo[ordinal], d->base);
  atomic_store(&psa_space_hi[ordinal], d->base + bytes);
  for (int hi = atomic_load(&devices_hi); ordinal + 1 > hi && !atomic_compare_exchange_weak(&devices_hi, &hi, ordinal + 1);)
    ;
  for (uint64_t lo = atomic_load(&hull_lo); d->base < lo && !atomic_compare_exchange_weak(&hull_lo, &lo, d->base);)
    ;
  for (uint64_t hi = atomic_load(&hull_hi); d->base + bytes > hi && !atomic_compare_exchange_weak(&hull_hi, &hi, d->base + bytes);)
    ;
  return true;
}

static void (*first_device_ready)(const struct pst_trace_header *, void *);
static void *first_device_user;

void psa_on_first_device(void (*ready)(const struct pst_trace_header *h, void *user), void *user)
{
  first_device_ready = ready;
  first_device_user = user;
}

/* The first device set up tells whoever asked (the shim starts observation there). */
static void tell_first_device(struct device *d)
{
  static bool told;
  if (told || !first_device_ready)
    return;
  told = true;
  struct pst_trace_header h = {.chunk_size = d->chunk_size, .gpu_budget = d->stats.gpu_budget,
                               .host_budget = d->stats.host_budget, .space_base = d->base,
                               .space_size = d->nchunks * d->chunk_size};
  if (!ps_driver.cuDeviceGetName || ps_driver.cuDeviceGetName(h.device, sizeof h.device, d->dev) != CUDA_SUCCESS)
    snprintf(h.device, sizeof h.device, "device %d", d->ordinal);
  first_device_ready(&h, first_device_user);
}

struct device *psa_device_get(int ordinal)
{
  if (ordinal < 0 || ordinal >= PSA_MAX_DEVICES)
    return NULL;
  struct device *d = &psa_devices[ordinal];
  if (__atomic_load_n(&d->ready, __ATOMIC_ACQUIRE))
    return d;
  ps_mutex_lock(&setup_lock);
  if (!d->ready && !d->failed) {
    ps_mutex_init(&d->lock, PS_RANK_DEVICE + (unsigned)ordinal, "a device's lock (its rank: PS_RANK_DEVICE + ordinal)");
    if (setup(d, ordinal)) {
      /* Observation starts before any other thread may use the device: a launch that
       * slipped past it would be invisible to the pager. */
      tell_first_device(d);
      __atomic_store_n(&d->ready, true, __ATOMIC_RELEASE);
    } else {
      d->failed = true;
    }
  }
  ps_mutex_unlock(&setup_lock);
  return d->ready ? d : NULL;
}

bool psa_owns(CUdeviceptr p)
{
  if (p < atomic_load_explicit(&hull_lo, memory_order_relaxed) || p >= atomic_load_explicit(&hull_hi, memory_order_relaxed))
    return false;
  for (int i = 0, n = atomic_load_explicit(&devices_hi, memory_order_relaxed); i < n; i++) {
    uint64_t hi = atomic_load_explicit(&psa_space_hi[i], memory_order_relaxed);
    if (!hi)
      continue;
    if (p >= atomic_load_explicit(&psa_space_lo[i], memory_order_relaxed) && p < hi)
      return true;
  }
  return false;
}

int64_t psa_chunk_of(CUdeviceptr p, int *ordinal)
{
  for (int i = 0, n = atomic_load_explicit(&devices_hi, memory_order_relaxed); i < n; i++) {
    uint64_t lo = atomic_load_explicit(&psa_space_lo[i], memory_order_relaxed);
    uint64_t hi = atomic_load_explicit(&psa_space_hi[i], memory_order_relaxed);
    if (hi && p >= lo && p < hi) {
      if (ordinal)
        *ordinal = i;
      return (int64_t)((p - lo) / psa_devices[i].chunk_size);
    }
  }
  return -1;
}

/* First fit over chunk slots, starting at a hint so the common case is short. */
bool psa_chunks_reserve(struct device *d, uint64_t n, uint64_t *first)
{
  for (int pass = 0; pass < 2; pass++) {
    uint64_t start = pass ? 0 : d->space.chunk_hint, run = 0;
    for (uint64_t i = start; i < d->nchunks; i++) {
      run = d->chunks[i].span ? 0 : run + 1;
      if (run == n) {
        *first = i + 1 - n;
        d->space.chunk_hint = i + 1 < d->nchunks ? i + 1 : 0;
        psa_chunks_note_high(d, i + 1);
        return true;
      }
    }
  }
  return false;
}

bool psa_chunks_free(const struct device *d, uint64_t first, uint64_t n)
{
  if (first + n > d->nchunks)
    return false;
  for (uint64_t i = first; i < first + n; i++)
    if (d->chunks[i].span)
      return false;
  return true;
}

void psa_chunks_note_high(struct device *d, uint64_t end)
{
  if (end > d->space.chunks_high)
    d->space.chunks_high = end;
}

void psa_chunks_unreserve(struct device *d, uint64_t first, uint64_t n)
{
  for (uint64_t i = first; i < first + n; i++)
    d->chunks[i].span = NULL;
  if (first < d->space.chunk_hint)
    d->space.chunk_hint = first;
}

CUresult psa_map(struct device *d, CUdeviceptr va, CUmemGenericAllocationHandle h)
{
  CUresult r = PS_CU(ps_driver.cuMemMap(va, d->chunk_size, 0, h, 0));
  if (r)
    return r;
  CUmemAccessDesc access = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = d->ordinal},
                            .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  r = PS_CU(ps_driver.cuMemSetAccess(va, d->chunk_size, &access, 1));
  if (r)
    PS_CU(ps_driver.cuMemUnmap(va, d->chunk_size));
  return r;
}

enum psa_where psa_chunk_where(int ordinal, uint64_t chunk)
{
  if (ordinal < 0 || ordinal >= PSA_MAX_DEVICES || !psa_devices[ordinal].ready)
    return PSA_UNMAPPED;
  struct device *d = &psa_devices[ordinal];
  enum psa_where w = PSA_UNMAPPED;
  ps_mutex_lock(&d->lock);
  if (chunk < d->nchunks && d->chunks[chunk].frame != PSA_NO_FRAME)
    w = d->fr.frames[d->chunks[chunk].frame].where;
  ps_mutex_unlock(&d->lock);
  return w;
}
