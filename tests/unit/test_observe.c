/* Launch observation through the (fake) CUPTI: the pointers into psshim's chunk space
 * that each launch's parameters hold, plain, inside structs passed by value, at offsets
 * that are not multiples of 8, and in the `extra` buffer form, give exactly the right
 * chunk sets; copies report their ends; the trace records every copy kind, memset and
 * launch as it was called, field by field; a second CUPTI subscriber is refused. */
#include "allocator/allocator.h"
#include "core/core.h"
#include "tests/fakecuda/fakecuda.h"
#include "tracer/observe.h"
#include "tracer/tracer.h"
#include "test_trace_util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <cupti.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1024ull * 1024)

struct seen {
  char name[32];
  uint64_t ptrs[16];
  uint32_t n;
  int kind;
  uint64_t stream;
  bool opaque;
};
static struct seen seen[32];
static int nseen, exits;

static void record(const struct ps_moment *l, bool enter, void *user)
{
  (void)user;
  if (!enter) {
    exits++;
    return;
  }
  if (nseen == 32)
    return;
  struct seen *s = &seen[nseen++];
  snprintf(s->name, sizeof s->name, "%s", l->name ? l->name : "?");
  s->n = l->nptrs < 16 ? l->nptrs : 16;
  memcpy(s->ptrs, l->ptrs, s->n * sizeof(uint64_t));
  s->kind = l->kind;
  s->stream = l->stream;
  s->opaque = l->opaque;
}

static void nop(void **args, void *user)
{
  (void)args;
  (void)user;
}

static CUdeviceptr a, b, c, big;

static bool claims(uint64_t v) { return psa_owns((CUdeviceptr)v); }

static int setup(void **state)
{
  (void)state;
  setenv("PSSHIM_CHUNK_SIZE", "2M", 1);
  setenv("PSSHIM_GPU_BUDGET", "64M", 1);
  setenv("PSSHIM_HOST_BUDGET", "64M", 1);
  setenv("PSSHIM_POLICY", "static", 1); /* these tests subscribe to launches themselves */
  char err[256];
  if (!ps_options_parse(err, sizeof err) || !ps_driver_load())
    return -1;
  CUdevice dev;
  CUcontext ctx;
  if (ps_driver.cuInit(0) || ps_driver.cuDeviceGet(&dev, 0) || ps_driver.cuDevicePrimaryCtxRetain(&ctx, dev) ||
      ps_driver.cuCtxSetCurrent(ctx))
    return -1;
  /* Three 1.5 MiB tensors land in three different 2 MiB chunks; big spans two chunks. */
  if (psa_alloc(0, 1536 * 1024, PSA_SYNC_STREAM, &a) || psa_alloc(0, 1536 * 1024, PSA_SYNC_STREAM, &b) ||
      psa_alloc(0, 1536 * 1024, PSA_SYNC_STREAM, &c) || psa_alloc(0, 3 * MiB, PSA_SYNC_STREAM, &big))
    return -1;
  struct pst_observer o = {.moment = record, .claims = claims};
  return pst_observe_start(&o) ? 0 : -1;
}

static const struct seen *find(const char *name)
{
  for (int i = 0; i < nseen; i++)
    if (strcmp(seen[i].name, name) == 0)
      return &seen[i];
  fail_msg("no launch named %s was observed", name);
  return NULL;
}

static void expect_ptrs(const char *name, const uint64_t *want, uint32_t n)
{
  const struct seen *s = find(name);
  if (s->n != n)
    fail_msg("%s: %u pointers seen, %u expected", name, s->n, n);
  for (uint32_t i = 0; i < n; i++)
    assert_int_equal(s->ptrs[i], want[i]);
}

static void test_pointer_positions(void **state)
{
  (void)state;
  /* plain: (ptr, int, ptr) */
  size_t plain_sizes[] = {8, 4, 8};
  CUfunction plain = fakecuda_register_kernel("plain", nop, NULL, 3, plain_sizes);
  int k = 5;
  CUdeviceptr a_mid = a + 4096; /* a view into the middle of a tensor */
  void *plain_args[] = {&c, &k, &a_mid};
  assert_int_equal(cuLaunchKernel(plain, 1, 1, 1, 1, 1, 1, 0, 0, plain_args, NULL), CUDA_SUCCESS);

  /* a struct by value: {int n; uint64 p; int m; uint64 q; uint64 host} */
  struct by_value { int n; CUdeviceptr p; int m; CUdeviceptr q; uint64_t host; } sv;
  memset(&sv, 0, sizeof sv); /* defined padding: the scan reads every byte of a parameter */
  sv = (struct by_value){1, b, 2, big + MiB, (uint64_t)(uintptr_t)&k};
  size_t struct_sizes[] = {4, sizeof sv};
  CUfunction in_struct = fakecuda_register_kernel("in_struct", nop, NULL, 2, struct_sizes);
  void *struct_args[] = {&k, &sv};
  assert_int_equal(cuLaunchKernel(in_struct, 1, 1, 1, 1, 1, 1, 0, 0, struct_args, NULL), CUDA_SUCCESS);

  /* packed: a 12-byte {uint64 p; int x} at offset 4 puts the pointer at byte 4 */
  unsigned char packed[12];
  memcpy(packed, &a, 8);
  memset(packed + 8, 0x7f, 4);
  size_t odd_sizes[] = {4, 12}, odd_offsets[] = {0, 4};
  CUfunction odd = fakecuda_register_kernel_layout("odd_offset", nop, NULL, 2, odd_sizes, odd_offsets);
  void *odd_args[] = {&k, packed};
  assert_int_equal(cuLaunchKernel(odd, 1, 1, 1, 1, 1, 1, 0, 0, odd_args, NULL), CUDA_SUCCESS);

  /* a pointer at byte 4 inside its parameter: a packed {uint32 tag; uint64 p} of 12 bytes,
   * laid out at offset 8 after an int, so the pointer sits at byte 12 of the buffer */
  unsigned char tagged[12];
  memset(tagged, 0x11, 4);
  memcpy(tagged + 4, &b, 8);
  size_t tagged_sizes[] = {4, 12};
  CUfunction inner = fakecuda_register_kernel("inner_offset", nop, NULL, 2, tagged_sizes);
  void *inner_args[] = {&k, tagged};
  assert_int_equal(cuLaunchKernel(inner, 1, 1, 1, 1, 1, 1, 0, 0, inner_args, NULL), CUDA_SUCCESS);
  size_t at = 0;
  assert_int_equal(cuFuncGetParamInfo(inner, 1, &at, NULL), CUDA_SUCCESS);
  assert_int_equal(at, 8);

  /* the extra form: one buffer holding (ptr, ptr, ptr) with a duplicate */
  uint64_t buf[3] = {c, a, c};
  size_t buf_size = sizeof buf;
  void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &buf_size, CU_LAUNCH_PARAM_END};
  size_t three[] = {8, 8, 8};
  CUfunction by_extra = fakecuda_register_kernel("by_extra", nop, NULL, 3, three);
  assert_int_equal(cuLaunchKernel(by_extra, 1, 1, 1, 1, 1, 1, 0, 0, NULL, extra), CUDA_SUCCESS);

  /* a copy into psshim's space from host memory */
  static char host[4096];
  assert_int_equal(cuMemcpyHtoDAsync(b, host, sizeof host, 0), CUDA_SUCCESS);
  ps_driver.cuCtxSynchronize();

  uint64_t want_plain[] = {a_mid < c ? a_mid : c, a_mid < c ? c : a_mid};
  expect_ptrs("plain", want_plain, 2);
  uint64_t want_struct[] = {b, big + MiB};
  expect_ptrs("in_struct", want_struct, 2);
  uint64_t want_odd[] = {a};
  expect_ptrs("odd_offset", want_odd, 1);
  uint64_t want_inner[] = {b};
  expect_ptrs("inner_offset", want_inner, 1);
  uint64_t want_extra[] = {a < c ? a : c, a < c ? c : a};
  expect_ptrs("by_extra", want_extra, 2);
  const struct seen *copy = find("cuMemcpyHtoDAsync_v2");
  assert_int_equal(copy->kind, PS_MOMENT_COPY);
  assert_int_equal(copy->n, 1);
  assert_int_equal(copy->ptrs[0], b);
  assert_int_equal(exits, nseen); /* every enter has its exit */

  /* the chunk sets those pointers name */
  int ordinal;
  assert_int_not_equal(psa_chunk_of(a, &ordinal), psa_chunk_of(b, &ordinal));
  assert_int_equal(psa_chunk_of(a_mid, &ordinal), psa_chunk_of(a, &ordinal));
  assert_int_equal(psa_chunk_of(big + MiB, &ordinal), psa_chunk_of(big, &ordinal));
  assert_int_equal(psa_chunk_of(big + 2 * MiB + 4096, &ordinal), psa_chunk_of(big, &ordinal) + 1);
}

/* cuda.h names it only when per-thread default streams are compiled in. */
CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                     unsigned bz, unsigned shared, CUstream s, void **params, void **extra);

/* Copies and memsets of every shape report the allocations they touch; one psshim cannot
 * parse (an array copy) is marked opaque, so the pager stops instead of guessing; a
 * per-thread entry point given no stream names the per-thread default stream. */
static void test_transfers(void **state)
{
  (void)state;
  nseen = 0;
  static char host[2048];
  CUDA_MEMCPY2D rows = {.srcMemoryType = CU_MEMORYTYPE_HOST, .srcHost = host, .srcPitch = 64,
                        .dstMemoryType = CU_MEMORYTYPE_DEVICE, .dstDevice = c, .dstPitch = 256,
                        .WidthInBytes = 64, .Height = 16};
  assert_int_equal(cuMemcpy2DAsync_v2(&rows, 0), CUDA_SUCCESS);
  assert_int_equal(cuMemsetD16_v2(a + 128, 0x1234, 100), CUDA_SUCCESS);
  assert_int_equal(cuMemcpyAtoD_v2(b, NULL, 0, 16), CUDA_ERROR_NOT_SUPPORTED);
  size_t one[] = {8};
  CUfunction k = fakecuda_register_kernel("on_own_stream", nop, NULL, 1, one);
  void *args[] = {&a};
  assert_int_equal(cuLaunchKernel_ptsz(k, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS);
  ps_driver.cuCtxSynchronize();

  const struct seen *rows_seen = find("cuMemcpy2DAsync_v2");
  assert_int_equal(rows_seen->kind, PS_MOMENT_COPY);
  assert_int_equal(rows_seen->n, 1);
  assert_int_equal(rows_seen->ptrs[0], c);
  const struct seen *set16 = find("cuMemsetD16_v2");
  assert_int_equal(set16->kind, PS_MOMENT_MEMSET);
  assert_int_equal(set16->n, 1);
  assert_int_equal(set16->ptrs[0], a + 128);
  assert_false(set16->opaque);
  assert_true(find("cuMemcpyAtoD_v2")->opaque);
  assert_int_equal(find("on_own_stream")->stream, (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD);
  assert_int_equal(find("cuMemsetD16_v2")->stream, 0); /* the legacy stream, as called */
}

/* ---- what the trace records of each transfer and launch, field by field ---- */

struct want_copy {
  const char *what;
  uint32_t kind;
  uint64_t bytes, src, dst, stream;
};

static void expect_copy(const struct pst_record *r, const struct want_copy *w)
{
  if (r->type != PST_REC_COPY)
    fail_msg("%s: a %s record where its COPY should be", w->what, pst_record_type_name(r->type));
  if (r->copy.kind != w->kind)
    fail_msg("%s: recorded %s, was %s", w->what, pst_copy_kind_name(r->copy.kind), pst_copy_kind_name(w->kind));
  if (r->copy.bytes != w->bytes || r->copy.src != w->src || r->copy.dst != w->dst || r->copy.stream != w->stream)
    fail_msg("%s: bytes %llu src %#llx dst %#llx stream %#llx recorded; %llu %#llx %#llx %#llx it was", w->what,
             (unsigned long long)r->copy.bytes, (unsigned long long)r->copy.src, (unsigned long long)r->copy.dst,
             (unsigned long long)r->copy.stream, (unsigned long long)w->bytes, (unsigned long long)w->src,
             (unsigned long long)w->dst, (unsigned long long)w->stream);
}

/* Every copy kind, explicit (each direction, with and without a stream) and by unified
 * address (cuMemcpy and cuMemcpyAsync, each direction, the kind judged by which side is
 * psshim's), each memset width, and a launch, traced in order: each record as the call
 * was made. A memset's source is its value, not an address: recorded as 0. */
static void test_trace_records_each_transfer(void **state)
{
  (void)state;
  const char *path = test_trace_path("observe");
  struct pst_trace_header h = {.pid = (uint32_t)getpid(), .chunk_size = 2 * MiB};
  assert_true(pst_trace_open(path, &h));
  static uint8_t host[8192];
  const uint64_t H = (uint64_t)(uintptr_t)host, A = a, B = b;
  CUstream s;
  assert_int_equal(ps_driver.cuStreamCreate(&s, 0), CUDA_SUCCESS);
  const uint64_t S = (uint64_t)(uintptr_t)s;
  assert_int_equal(cuMemcpyHtoD_v2(a, host, 4096), CUDA_SUCCESS);
  assert_int_equal(cuMemcpyDtoH_v2(host, a, 4000), CUDA_SUCCESS);
  assert_int_equal(cuMemcpyDtoD_v2(b, a, 3000), CUDA_SUCCESS);
  assert_int_equal(cuMemcpyHtoDAsync_v2(b, host, 1024, s), CUDA_SUCCESS);
  assert_int_equal(cuMemcpyDtoHAsync_v2(host, b, 1000, s), CUDA_SUCCESS);
  assert_int_equal(cuMemcpyDtoDAsync_v2(a, b, 900, s), CUDA_SUCCESS);
  assert_int_equal(cuMemcpy(a, H, 2048), CUDA_SUCCESS);
  assert_int_equal(cuMemcpy(H, b, 2000), CUDA_SUCCESS);
  assert_int_equal(cuMemcpy(b, a, 1900), CUDA_SUCCESS);
  assert_int_equal(cuMemcpyAsync(b, H, 512, s), CUDA_SUCCESS);
  assert_int_equal(cuMemcpyAsync(H, a, 500, s), CUDA_SUCCESS);
  assert_int_equal(cuMemcpyAsync(a, b, 400, s), CUDA_SUCCESS);
  assert_int_equal(cuMemsetD8_v2(a, 1, 100), CUDA_SUCCESS);
  assert_int_equal(cuMemsetD16_v2(a, 2, 100), CUDA_SUCCESS);
  assert_int_equal(cuMemsetD32_v2(b, 3, 100), CUDA_SUCCESS);
  assert_int_equal(cuMemsetD8Async(b, 4, 64, s), CUDA_SUCCESS);
  assert_int_equal(cuMemsetD32Async(a, 5, 16, s), CUDA_SUCCESS);
  size_t two[] = {8, 8};
  CUfunction k = fakecuda_register_kernel("traced_kernel", nop, NULL, 2, two);
  void *args[] = {&b, &a};
  assert_int_equal(cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, args, NULL), CUDA_SUCCESS);
  ps_driver.cuCtxSynchronize();
  pst_trace_close();
  ps_driver.cuStreamDestroy_v2(s);

  const struct want_copy want[] = {
      {"cuMemcpyHtoD", PST_COPY_H2D, 4096, H, A, 0},     {"cuMemcpyDtoH", PST_COPY_D2H, 4000, A, H, 0},
      {"cuMemcpyDtoD", PST_COPY_D2D, 3000, A, B, 0},     {"cuMemcpyHtoDAsync", PST_COPY_H2D, 1024, H, B, S},
      {"cuMemcpyDtoHAsync", PST_COPY_D2H, 1000, B, H, S}, {"cuMemcpyDtoDAsync", PST_COPY_D2D, 900, B, A, S},
      {"cuMemcpy to psshim", PST_COPY_H2D, 2048, H, A, 0}, {"cuMemcpy from psshim", PST_COPY_D2H, 2000, B, H, 0},
      {"cuMemcpy within psshim", PST_COPY_D2D, 1900, A, B, 0},
      {"cuMemcpyAsync to psshim", PST_COPY_H2D, 512, H, B, S},
      {"cuMemcpyAsync from psshim", PST_COPY_D2H, 500, A, H, S},
      {"cuMemcpyAsync within psshim", PST_COPY_D2D, 400, B, A, S},
      {"cuMemsetD8", PST_COPY_MEMSET, 100, 0, A, 0},     {"cuMemsetD16", PST_COPY_MEMSET, 200, 0, A, 0},
      {"cuMemsetD32", PST_COPY_MEMSET, 400, 0, B, 0},    {"cuMemsetD8Async", PST_COPY_MEMSET, 64, 0, B, S},
      {"cuMemsetD32Async", PST_COPY_MEMSET, 64, 0, A, S},
  };
  const size_t nwant = sizeof want / sizeof want[0];
  struct trace_read t;
  assert_true(test_trace_read(path, &t));
  assert_string_equal(t.error, ""); /* whole, and closed cleanly */
  assert_true(t.stats.clean_end);
  size_t i = 0;
  while (i < t.n && t.recs[i].type != PST_REC_COPY && t.recs[i].type != PST_REC_LAUNCH)
    i++;
  assert_true(i + nwant < t.n);
  for (size_t w = 0; w < nwant; w++)
    expect_copy(&t.recs[i + w], &want[w]);
  const struct pst_record *l = &t.recs[i + nwant];
  assert_int_equal(l->type, PST_REC_LAUNCH);
  assert_int_equal(l->launch.stream, S);
  assert_string_equal(test_trace_string(&t, l->launch.function), "traced_kernel");
  assert_int_equal(l->launch.n, 2);
  assert_int_equal(l->launch.ptrs[0], A < B ? A : B);
  assert_int_equal(l->launch.ptrs[1], A < B ? B : A);
  assert_int_equal(l->flags, 0);
  for (size_t w = 1; w <= nwant; w++) /* in the order of the calls */
    assert_true(t.recs[i + w].ts_ns >= t.recs[i + w - 1].ts_ns);
  test_trace_read_free(&t);
}

/* CUPTI allows one subscriber: while psshim holds it, another is refused. */
static void test_second_subscriber_refused(void **state)
{
  (void)state;
  CUpti_SubscriberHandle other;
  assert_int_equal(cuptiSubscribe(&other, NULL, NULL), CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pointer_positions),
      cmocka_unit_test(test_transfers),
      cmocka_unit_test(test_second_subscriber_refused),
      cmocka_unit_test(test_trace_records_each_transfer),
  };
  return cmocka_run_group_tests_name("observe", tests, setup, test_trace_remove_all);
}
