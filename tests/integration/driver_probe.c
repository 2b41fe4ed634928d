/* Loads psshim's driver table from whatever libcuda.so.1 the loader finds (the fake in
 * CI, the real driver on a GPU machine) and uses it: version, device, memory, VMM
 * granularity. Exit 0 only when every entry point resolved and the calls worked. */
#include "core/core.h"

#include <stdio.h>

int main(void)
{
  ps_log_level = PS_LOG_WARN;
  if (!ps_driver_load()) {
    printf("driver table: FAILED to load\n");
    return 1;
  }
  size_t entries = sizeof(struct ps_driver) / sizeof(void (*)(void));
  int version = 0, count = 0;
  CUdevice dev;
  size_t total = 0, gran = 0;
  char name[128] = "?";
  CUresult (*get_name)(char *, int, CUdevice) = (CUresult(*)(char *, int, CUdevice))ps_driver_symbol("cuDeviceGetName");
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
  if (PS_CU(ps_driver.cuInit(0)) || PS_CU(ps_driver.cuDriverGetVersion(&version)) ||
      PS_CU(ps_driver.cuDeviceGetCount(&count)) || PS_CU(ps_driver.cuDeviceGet(&dev, 0)) ||
      PS_CU(ps_driver.cuDeviceTotalMem_v2(&total, dev)) ||
      PS_CU(ps_driver.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) ||
      (get_name && PS_CU(get_name(name, sizeof name, dev)))) {
    printf("driver table: %zu entry points resolved, but a call failed\n", entries);
    return 1;
  }
  printf("driver table: %zu entry points resolved; driver %d, %d device(s), device 0 \"%s\", %zu MiB, "
         "VMM granularity %zu KiB\n", entries, version, count, name, total >> 20, gran >> 10);
  return 0;
}
