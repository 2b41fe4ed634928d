/* cuInit and the configuration it reads, the version, error strings and the devices. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cu_errors.h"
#include "fakecuda_internal.h"

struct fc_config fc_cfg;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CUresult init_result = CUDA_ERROR_NOT_INITIALIZED;
static atomic_bool initialized;

/* "123", "64K", "512M", "1G", "2T" (binary multiples, optional trailing "B"/"iB"). */
static bool parse_size(const char *s, size_t *out) {
  char *end;
  errno = 0;
  if (!isdigit((unsigned char)*s)) return false;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return false;
  int shift = 0;
  switch (toupper((unsigned char)*end)) {
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    default: break;
  }
  if (shift && (*end == 'i' || *end == 'I')) end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end || (shift && v > (~0ull >> shift))) return false;
  *out = (size_t)(v << shift);
  return true;
}

static bool env_size(const char *name, size_t dflt, size_t *out) {
  const char *s = getenv(name);
  *out = dflt;
  if (!s || !*s) return true;
  if (parse_size(s, out)) return true;
  fprintf(stderr, "fakecuda: %s=%s: expected bytes with optional K/M/G/T suffix\n", name, s);
  return false;
}

static bool env_uint(const char *name, unsigned dflt, unsigned max, unsigned *out) {
  const char *s = getenv(name);
  size_t v;
  *out = dflt;
  if (!s || !*s) return true;
  if (isdigit((unsigned char)*s) && parse_size(s, &v) && !strpbrk(s, "KkMmGgTtBb") && v <= max) {
    *out = (unsigned)v;
    return true;
  }
  fprintf(stderr, "fakecuda: %s=%s: expected an integer from 0 to %u\n", name, s, max);
  return false;
}

static void init_once_fn(void) {
  size_t dev_mem, host_mem;
  unsigned count, copy_us, event_us, kernel_us, remap_us;
  bool ok = env_size("FAKECUDA_DEVICE_MEM", (size_t)1 << 30, &dev_mem);
  ok &= env_size("FAKECUDA_HOST_MEM", (size_t)4 << 30, &host_mem);
  ok &= env_uint("FAKECUDA_DEVICE_COUNT", 1, FC_MAX_DEVICES, &count);
  ok &= env_uint("FAKECUDA_COPY_DELAY_US", 0, 60000000, &copy_us);
  ok &= env_uint("FAKECUDA_EVENT_DELAY_US", 0, 60000000, &event_us);
  ok &= env_uint("FAKECUDA_KERNEL_DELAY_US", 0, 60000000, &kernel_us);
  ok &= env_uint("FAKECUDA_REMAP_DELAY_US", 0, 60000000, &remap_us);
  if (!ok) {
    init_result = CUDA_ERROR_INVALID_VALUE;
    return;
  }
  fc_cfg.device_mem = dev_mem;
  fc_cfg.host_mem = host_mem;
  fc_cfg.device_count = (int)count;
  atomic_store(&fc_cfg.copy_delay_us, copy_us);
  atomic_store(&fc_cfg.event_delay_us, event_us);
  atomic_store(&fc_cfg.kernel_delay_us, kernel_us);
  atomic_store(&fc_cfg.remap_delay_us, remap_us);
  if (count == 0) {
    init_result = CUDA_ERROR_NO_DEVICE;
    return;
  }
  fc_contexts_init((int)count);
  init_result = CUDA_SUCCESS;
  atomic_store(&initialized, true);
}

static CUresult do_init(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  pthread_once(&init_once, init_once_fn);
  return init_result;
}

CUresult fc_check_init(void) {
  return atomic_load(&initialized) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult fc_check_device(CUdevice dev) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  return dev >= 0 && dev < fc_cfg.device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

void fc_sleep_us(unsigned us) {
  struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000};
  while (us && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

FC_EXPORT void fakecuda_set_delays(unsigned copy_us, unsigned event_us, unsigned kernel_us) {
  atomic_store(&fc_cfg.copy_delay_us, copy_us);
  atomic_store(&fc_cfg.event_delay_us, event_us);
  atomic_store(&fc_cfg.kernel_delay_us, kernel_us);
}

FC_EXPORT CUresult cuInit(unsigned int Flags) { FC_TRACED(cuInit, do_init(Flags), Flags); }

static CUresult driver_version(int *v) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = FC_DRIVER_VERSION;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuDriverGetVersion(int *driverVersion) {
  FC_TRACED(cuDriverGetVersion, driver_version(driverVersion), driverVersion);
}

/* Unknown codes: CUDA_ERROR_INVALID_VALUE and *pStr = NULL, as the real driver does. */
static CUresult error_text(CUresult error, const char **pStr, bool name) {
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof fc_cu_errors / sizeof fc_cu_errors[0]; i++) {
    if (fc_cu_errors[i].code == (int)error) {
      *pStr = name ? fc_cu_errors[i].name : fc_cu_errors[i].text;
      return CUDA_SUCCESS;
    }
  }
  *pStr = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}
FC_EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr) {
  FC_TRACED(cuGetErrorString, error_text(error, pStr, false), error, pStr);
}
FC_EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr) {
  FC_TRACED(cuGetErrorName, error_text(error, pStr, true), error, pStr);
}

/* ---- devices ---- */
static CUresult device_get(CUdevice *device, int ordinal) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= fc_cfg.device_count) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  FC_TRACED(cuDeviceGet, device_get(device, ordinal), device, ordinal);
}

static CUresult device_count(int *count) {
  CUresult r = fc_check_init();
  if (r != CUDA_SUCCESS) return r;
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = fc_cfg.device_count;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuDeviceGetCount(int *count) { FC_TRACED(cuDeviceGetCount, device_count(count), count); }

/* The attributes psshim and the frameworks ask for, with an H200's answers where one
 * exists; any other attribute is CUDA_ERROR_INVALID_VALUE rather than a made-up value. */
static bool attribute_value(CUdevice_attribute a, CUdevice dev, int *v) {
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: *v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: *v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *v = 2; return true;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *v = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *v = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *v = 64; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *v = 2147483647; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *v = 65535; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *v = 65535; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *v = 49152; return true;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; return true;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = 50331648; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *v = dev + 1; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: *v = 0; return true;
    default: return false;
  }
}

static CUresult device_attribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  CUresult r = fc_check_device(dev);
  if (r != CUDA_SUCCESS) return r;
  if (!pi || !attribute_value(attrib, dev, pi)) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  FC_TRACED(cuDeviceGetAttribute, device_attribute(pi, attrib, dev), pi, attrib, dev);
}

static CUresult device_name(char *name, int len, CUdevice dev) {
  CUresult r = fc_check_device(dev);
  if (r != CUDA_SUCCESS) return r;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  snprintf(name, (size_t)len, "fakecuda H200 (host memory) #%d", dev);
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  FC_TRACED(cuDeviceGetName, device_name(name, len, dev), name, len, dev);
}

static CUresult total_mem(size_t *bytes, CUdevice dev) {
  CUresult r = fc_check_device(dev);
  if (r != CUDA_SUCCESS) return r;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  *bytes = fc_cfg.device_mem;
  return CUDA_SUCCESS;
}
FC_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  FC_TRACED(cuDeviceTotalMem_v2, total_mem(bytes, dev), bytes, dev);
}
