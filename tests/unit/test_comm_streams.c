/* comm/ on tests/fakecuda/'s streams (worker threads, copies delayed): a page-in's own-shard
 * copy enqueued before the all-gather on the same stream is complete when the gather reads
 * it, and psc_stream_wait polls the real stream. Linked with the fake libcuda.so.1. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "core/core.h"
#include "rank_procs.h"
#include "tests/fakecuda/fakecuda.h"

static unsigned char pattern(size_t i) { return (unsigned char)(i * 7 + 3); }

static int page_in(int rank, void *arg) {
  (void)arg;
  /* CUDA starts in each rank's own process, after the fork. */
  CUdevice dev;
  CUcontext ctx;
  CUstream stream;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx) || cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING))
    return 20;
  struct psc_config cfg = {32 << 20, 0, 0, "auto"};
  if (psc_node_join(&cfg, 0) != PSC_GROUP) return 21;
  if (!psc_comm_init(cuStreamQuery)) return 22;
  size_t bytes = 4 << 20;
  CUdeviceptr chunk;
  unsigned char *host = malloc(bytes);
  if (cuMemAlloc(&chunk, bytes) || cuMemsetD8(chunk, 0, bytes)) return 23;
  for (size_t i = 0; i < bytes; i++) host[i] = pattern(i);
  struct psc_shard s = psc_shard_of(bytes, psc_nranks(), rank);
  /* the copy sleeps on the stream's thread: the gather must wait for it */
  fakecuda_set_delays(200000, 0, 0);
  if (cuMemcpyHtoDAsync(chunk + s.offset, host + s.offset, s.len, stream)) return 24;
  if (!psc_allgather_inplace(chunk, bytes, stream)) return 25;
  if (!psc_stream_wait(stream)) return 26;
  memset(host, 0, bytes);
  if (cuMemcpyDtoH(host, chunk, bytes)) return 27;
  for (size_t i = 0; i < bytes; i++)
    if (host[i] != pattern(i)) return 28;
  psc_node_leave();
  return 0;
}

static void gather_after_own_shard_copy(void **state) {
  (void)state;
  struct rank_result res[4];
  run_ranks(4, page_in, NULL, 60, res);
  for (int r = 0; r < 4; r++) {
    assert_int_equal(res[r].code, 0);
    assert_string_equal(res[r].err, "");
  }
}

int main(void) {
  ps_options_parse(NULL, 0); /* comm's timeout and NCCL path come from the options table */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(gather_after_own_shard_copy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
