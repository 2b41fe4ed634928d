#include "comm/nccl_table.h"

#include <dlfcn.h>
#include <stdlib.h>

#include "comm/node.h"
#include "core/core.h"

struct psc_nccl psc_nccl;

bool psc_nccl_load(void) {
  static bool loaded;
  if (loaded) return true;
  const char *path = ps_options.nccl_path; /* default libnccl.so.2, in core's options table */
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    psc_errorf("cannot load NCCL (%s) for psshim's own communicator: %s; set PSSHIM_NCCL to "
               "libnccl.so.2's path", path, dlerror());
    return false;
  }
  struct psc_nccl t;
#define PSC_NCCL_LOAD(name, ret, args)                                                      \
  *(void **)&t.name = ps_real_dlsym(h, #name);                                                      \
  if (!t.name) {                                                                            \
    psc_errorf("%s lacks " #name ": psshim needs NCCL 2.14 or later", path);                 \
    dlclose(h);                                                                             \
    return false;                                                                           \
  }
  PSC_NCCL_FUNCS(PSC_NCCL_LOAD)
#undef PSC_NCCL_LOAD
  psc_nccl = t;
  loaded = true;
  return true;
}
