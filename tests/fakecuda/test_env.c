/* FAKECUDA_* parsing at cuInit. Every case runs in a fresh child: the variables are
 * read once per process, and this parent never calls cuInit. */
#include <string.h>

#include "test_common.h"

struct env_case {
  const char *var, *value;
  CUresult init; /* what cuInit must return */
  size_t device_mem;
  int devices;
};

/* Child: exits 0 when everything matched, else the number of the failed check. */
static void check_case(void *arg) {
  const struct env_case *c = arg;
  size_t bytes = 0;
  int n = 0;
  setenv(c->var, c->value, 1);
  if (cuInit(0) != c->init) _exit(10);
  if (c->init != CUDA_SUCCESS) {
    if (cuDeviceGetCount(&n) != CUDA_ERROR_NOT_INITIALIZED) _exit(11);
    return;
  }
  if (cuDeviceTotalMem_v2(&bytes, 0) != CUDA_SUCCESS || bytes != c->device_mem) _exit(12);
  if (cuDeviceGetCount(&n) != CUDA_SUCCESS || n != c->devices) _exit(13);
}

static void test_env_parsing(void **state) {
  (void)state;
  static const struct env_case cases[] = {
      {"FAKECUDA_DEVICE_MEM", "3G", CUDA_SUCCESS, (size_t)3 << 30, 1},
      {"FAKECUDA_DEVICE_MEM", "512M", CUDA_SUCCESS, (size_t)512 << 20, 1},
      {"FAKECUDA_DEVICE_MEM", "64KiB", CUDA_SUCCESS, (size_t)64 << 10, 1},
      {"FAKECUDA_DEVICE_MEM", "123456", CUDA_SUCCESS, 123456, 1},
      {"FAKECUDA_DEVICE_MEM", "12Q", CUDA_ERROR_INVALID_VALUE, 0, 0},
      {"FAKECUDA_DEVICE_MEM", "-1G", CUDA_ERROR_INVALID_VALUE, 0, 0},
      {"FAKECUDA_DEVICE_COUNT", "4", CUDA_SUCCESS, (size_t)1 << 30, 4},
      {"FAKECUDA_DEVICE_COUNT", "0", CUDA_ERROR_NO_DEVICE, 0, 0},
      {"FAKECUDA_DEVICE_COUNT", "99", CUDA_ERROR_INVALID_VALUE, 0, 0},
      {"FAKECUDA_KERNEL_DELAY_US", "1M", CUDA_ERROR_INVALID_VALUE, 0, 0},
      {"FAKECUDA_COPY_DELAY_US", "250", CUDA_SUCCESS, (size_t)1 << 30, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int status = run_in_child(check_case, (void *)&cases[i]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      fail_msg("%s=%s: child status %d", cases[i].var, cases[i].value, status);
  }
}

int main(void) {
  unsetenv("FAKECUDA_DEVICE_MEM");
  unsetenv("FAKECUDA_DEVICE_COUNT");
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_env_parsing)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
