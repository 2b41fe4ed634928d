/* The one table of CUDA driver entry points. Filled from libcuda.so.1 with the real
 * dlsym (psshim overrides dlsym for the process, so it must not look itself up), by
 * exact versioned export names, once. The test driver stands in by being the
 * libcuda.so.1 the loader finds (or PSSHIM_LIBCUDA). */
#include "core/core.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct ps_driver ps_driver;

static void *(*glibc_dlsym)(void *, const char *);

PS_NO_SANITIZE static void find_glibc_dlsym(void)
{
  /* dlsym moved into libc at 2.34; older ones have the 2.2.5 version. */
  glibc_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (!glibc_dlsym)
    glibc_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}

PS_NO_SANITIZE static void *no_dlsym(void *handle, const char *name)
{
  (void)handle;
  (void)name;
  return NULL;
}

PS_NO_SANITIZE void *(*ps_glibc_dlsym(void))(void *, const char *)
{
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, find_glibc_dlsym);
  return glibc_dlsym ? glibc_dlsym : no_dlsym;
}

void *ps_real_dlsym(void *handle, const char *name) { return ps_glibc_dlsym()(handle, name); }

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static bool loaded;
static void *driver_lib;

static void load(void)
{
  /* Read here, not from ps_options: the doors may load the driver before the options are
   * parsed (a lookup during the loader's start-up). */
  const char *path = getenv("PSSHIM_LIBCUDA");
  if (!path || !*path)
    path = "libcuda.so.1";
  void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    ps_error("cannot load the CUDA driver %s (%s): psshim passes every call through (PSSHIM_LIBCUDA names another)",
             path, dlerror());
    return;
  }
#define PS_DRIVER_LOAD(name, ret, args)                                                   \
  ps_driver.name = (ret(*) args)ps_real_dlsym(lib, #name);                                \
  if (!ps_driver.name) {                                                                   \
    ps_error("the CUDA driver lacks %s (driver too old?): psshim passes every call through", #name); \
    return;                                                                                \
  }
  PS_DRIVER_FUNCS(PS_DRIVER_LOAD)
#undef PS_DRIVER_LOAD
#define PS_DRIVER_LOAD_OPTIONAL(name, ret, args) ps_driver.name = (ret(*) args)ps_real_dlsym(lib, #name);
  PS_DRIVER_OPTIONAL_FUNCS(PS_DRIVER_LOAD_OPTIONAL)
#undef PS_DRIVER_LOAD_OPTIONAL
  driver_lib = lib;
  loaded = true;
}

bool ps_driver_load(void)
{
  pthread_once(&load_once, load);
  return loaded;
}

void *ps_driver_symbol(const char *name)
{
  return ps_driver_load() ? ps_real_dlsym(driver_lib, name) : NULL;
}

const char *ps_cu_error_name(CUresult r)
{
  const char *name = NULL;
  if (loaded && ps_driver.cuGetErrorName(r, &name) == CUDA_SUCCESS && name)
    return name;
  return "CUDA_ERROR_UNKNOWN";
}

CUresult ps_cu_checked(CUresult r, const char *what, const char *file, int line)
{
  if (r != CUDA_SUCCESS)
    ps_log(r == CUDA_ERROR_OUT_OF_MEMORY ? PS_LOG_INFO : PS_LOG_ERROR, "%s failed: %s (%s:%d)", what,
           ps_cu_error_name(r), file, line);
  return r;
}

static PS_THREAD_LOCAL bool own_calls;
static PS_THREAD_LOCAL bool own_work;
static _Atomic int own_calls_anywhere;

void ps_own_calls(bool on)
{
  own_calls = on;
  atomic_fetch_add(&own_calls_anywhere, on ? 1 : -1);
}

void ps_own_work(bool on) { own_work = on; }

bool ps_in_own_calls(void) { return own_calls || own_work; }

bool ps_own_calls_anywhere(void) { return atomic_load_explicit(&own_calls_anywhere, memory_order_relaxed) > 0; }

static _Atomic bool forked_child;

void ps_mark_forked_child(void) { atomic_store(&forked_child, true); }

bool ps_in_forked_child(void) { return atomic_load_explicit(&forked_child, memory_order_relaxed); }
