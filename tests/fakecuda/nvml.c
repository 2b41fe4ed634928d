/* libnvidia-ml.so.1 stand-in: the few NVML calls bench/benchlib.py's PcieCounter makes. One
 * device, UUID "GPU-fake-0", index 0, whose PCIe counters read FAKENVML_TX_KBPS and
 * FAKENVML_RX_KBPS (default 1000000 and 2000000), each read taking 20 ms as NVML's do. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

enum { NVML_SUCCESS = 0, NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_NOT_FOUND = 6 };
static int the_device;

static unsigned kbps_from(const char *name, unsigned fallback) {
  const char *v = getenv(name);
  return v && *v ? (unsigned)strtoul(v, NULL, 10) : fallback;
}

EXPORT int nvmlInit_v2(void) { return NVML_SUCCESS; }

EXPORT int nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
  if (!uuid || !device || strcmp(uuid, "GPU-fake-0") != 0) return NVML_ERROR_NOT_FOUND;
  *device = &the_device;
  return NVML_SUCCESS;
}

EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **device) {
  if (index != 0 || !device) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &the_device;
  return NVML_SUCCESS;
}

EXPORT int nvmlDeviceGetPcieThroughput(void *device, int counter, unsigned *value) {
  if (device != &the_device || (counter != 0 && counter != 1) || !value) return NVML_ERROR_INVALID_ARGUMENT;
  struct timespec ms20 = {.tv_nsec = 20000000};
  nanosleep(&ms20, NULL);
  *value = counter == 0 ? kbps_from("FAKENVML_TX_KBPS", 1000000) : kbps_from("FAKENVML_RX_KBPS", 2000000);
  return NVML_SUCCESS;
}
