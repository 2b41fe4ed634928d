/* A training loop in miniature, written as a framework writes it against the CUDA
 * runtime: parameters and optimizer state allocated once with cudaMalloc, activations
 * with cudaMallocAsync/cudaFreeAsync every step on a stream, "kernels" that read and
 * write them (parameters three times a step: forward, its recomputation, the update;
 * optimizer state once). Every value is checked at the end of every step. Run under
 * LD_PRELOAD=libpsshim.so with a GPU budget below its peak, it must finish with the same
 * checksums as without psshim. Prints one summary line; exits non-zero on a mismatch.
 * TRAIN_SIM_KEEP=1 keeps each step's first activation to the end (a loop whose memory
 * grows every step, as a forward pass's layers keep theirs). TRAIN_SIM_POOL=1 allocates the
 * activations once and reuses them every step, as a pooling allocator (CuPy's, XLA's) does:
 * the steps allocate nothing. TRAIN_SIM_UNMANAGED_MIB=N makes N MiB of device memory with the
 * driver's own cuMemCreate before anything else, which psshim does not serve (as XLA's
 * allocator may make its pool). TRAIN_SIM_STATS=FILE writes psshim_stats_json's answer there
 * after the last free. TRAIN_SIM_FAIL_COPIES=1 has the test
 * driver refuse every asynchronous copy during odd steps (the loop makes none itself: the
 * pager's moves fail), so the values must survive moves that fail halfway.
 * Usage: train_sim [steps] [layers] [MiB per layer] */
#define SIM_NAME "train_sim"
#include "tests/integration/sim.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static CUfunction forward_kernel, update_kernel;

/* param[i] += act[i] & 0xff ; state[i] ^= param[i] */
static void update_fn(void **args, void *user)
{
  (void)user;
  uint32_t *param = *(uint32_t **)args[0], *state = *(uint32_t **)args[1];
  const uint32_t *act = *(uint32_t **)args[2];
  uint64_t n = *(uint64_t *)args[3];
  for (uint64_t i = 0; i < n; i++) {
    param[i] += act[i] & 0xffu;
    state[i] ^= param[i];
  }
}

/* Reads every parameter and state back and compares it with the host's arithmetic; returns
 * the mismatches, and adds the values to *sum. */
static uint64_t check_values(uint32_t **param, uint32_t **state, int layers, uint64_t n, const uint32_t *expect_p,
                             const uint32_t *expect_s, uint32_t *host, uint64_t *sum)
{
  uint64_t bad = 0;
  for (int l = 0; l < layers; l++) {
    check(cudaMemcpy(host, param[l], n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (uint64_t i = 0; i < n; i++)
      bad += host[i] != expect_p[(uint64_t)l * n + i], *sum += host[i];
    check(cudaMemcpy(host, state[l], n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (uint64_t i = 0; i < n; i++)
      bad += host[i] != expect_s[(uint64_t)l * n + i], *sum += host[i];
  }
  return bad;
}

int main(int argc, char **argv)
{
  int steps = argc > 1 ? atoi(argv[1]) : 6, layers = argc > 2 ? atoi(argv[2]) : 8;
  uint64_t layer_bytes = (argc > 3 ? strtoull(argv[3], NULL, 10) : 3) << 20, n = layer_bytes / 4;
  size_t upd_sizes[] = {8, 8, 8, 8};
  forward_kernel = sim_forward_kernel();
  update_kernel = fakecuda_register_kernel("update", update_fn, NULL, 4, upd_sizes);
  cudaStream_t s;
  check(cudaStreamCreate(&s), "cudaStreamCreate");
  /* Before the first allocation psshim serves, as XLA's pool is made when its client is. */
  size_t unmanaged = getenv("TRAIN_SIM_UNMANAGED_MIB") ? strtoull(getenv("TRAIN_SIM_UNMANAGED_MIB"), NULL, 10) << 20 : 0;
  CUmemGenericAllocationHandle own = 0;
  CUmemAllocationProp own_prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                  .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
  if (unmanaged && cuMemCreate(&own, unmanaged, &own_prop, 0) != CUDA_SUCCESS) {
    fprintf(stderr, "train_sim: cuMemCreate of %zu MiB failed\n", unmanaged >> 20);
    return 1;
  }
  uint32_t **param = calloc((size_t)layers, sizeof *param), **state = calloc((size_t)layers, sizeof *state);
  uint32_t *host = malloc(layer_bytes), *expect_p = malloc(layer_bytes * (size_t)layers),
           *expect_s = malloc(layer_bytes * (size_t)layers);
  for (int l = 0; l < layers; l++) {
    check(cudaMalloc((void **)&param[l], layer_bytes), "cudaMalloc");
    check(cudaMalloc((void **)&state[l], layer_bytes), "cudaMalloc");
    for (uint64_t i = 0; i < n; i++)
      host[i] = (uint32_t)(l * 7919 + (int)i);
    check(cudaMemcpy(param[l], host, layer_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemset(state[l], 0, layer_bytes), "cudaMemset");
    for (uint64_t i = 0; i < n; i++) {
      expect_p[(uint64_t)l * n + i] = host[i];
      expect_s[(uint64_t)l * n + i] = 0;
    }
  }
  bool keep = getenv("TRAIN_SIM_KEEP") && atoi(getenv("TRAIN_SIM_KEEP"));
  bool fail_copies = getenv("TRAIN_SIM_FAIL_COPIES") && atoi(getenv("TRAIN_SIM_FAIL_COPIES"));
  bool pool = getenv("TRAIN_SIM_POOL") && atoi(getenv("TRAIN_SIM_POOL"));
  uint64_t bad = 0, sum = 0;
  uint32_t **kept = calloc((size_t)steps, sizeof *kept), **act = calloc((size_t)layers, sizeof *act);
  for (int l = 0; pool && l < layers; l++)
    check(cudaMalloc((void **)&act[l], layer_bytes), "cudaMalloc");
  for (int step = 0; step < steps; step++) {
    fakecuda_fail_async_copies(fail_copies && step % 2);
    for (int l = 0; l < layers; l++) {
      if (!pool)
        check(cudaMallocAsync((void **)&act[l], layer_bytes, s), "cudaMallocAsync");
      uint64_t st = (uint64_t)step;
      void *fp[] = {&param[l], &act[l], &n, &st};
      launch(forward_kernel, fp, s);
    }
    for (int l = layers - 1; l >= 0; l--) {
      uint64_t st = (uint64_t)step;
      void *fp[] = {&param[l], &act[l], &n, &st}, *up[] = {&param[l], &state[l], &act[l], &n};
      launch(forward_kernel, fp, s); /* recomputed, as under activation checkpointing */
      launch(update_kernel, up, s);
      if (keep && l == 0)
        kept[step] = act[l];
      else if (!pool)
        check(cudaFreeAsync(act[l], s), "cudaFreeAsync");
      for (uint64_t i = 0; i < n; i++) { /* the same arithmetic on the host */
        uint32_t *p = &expect_p[(uint64_t)l * n + i];
        *p += (*p * 3u + (uint32_t)step) & 0xffu;
        expect_s[(uint64_t)l * n + i] ^= *p;
      }
    }
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    fakecuda_fail_async_copies(false);
    uint64_t step_sum = 0; /* the last step's sum is the checksum printed */
    bad += check_values(param, state, layers, n, expect_p, expect_s, host, &step_sum);
    sum = step_sum;
  }
  for (int step = 0; step < steps; step++)
    if (kept[step])
      check(cudaFree(kept[step]), "cudaFree");
  free(kept);
  for (int l = 0; pool && l < layers; l++)
    check(cudaFree(act[l]), "cudaFree");
  free(act);
  if (own && cuMemRelease(own) != CUDA_SUCCESS) {
    fprintf(stderr, "train_sim: cuMemRelease failed\n");
    return 1;
  }
  for (int l = 0; l < layers; l++) {
    check(cudaFree(param[l]), "cudaFree");
    check(cudaFree(state[l]), "cudaFree");
  }
  int (*owns)(const void *) = (int (*)(const void *))dlsym(RTLD_DEFAULT, "psshim_owns");
  size_t (*stats_json)(char *, size_t) = (size_t (*)(char *, size_t))dlsym(RTLD_DEFAULT, "psshim_stats_json");
  if (stats_json && getenv("TRAIN_SIM_STATS")) { /* psshim's figures as the program sees them */
    FILE *out = fopen(getenv("TRAIN_SIM_STATS"), "w");
    char text[4096];
    size_t n = stats_json(text, sizeof text);
    if (!out || n == 0 || n >= sizeof text || fputs(text, out) < 0 || fclose(out) != 0) {
      fprintf(stderr, "train_sim: psshim_stats_json gave %zu bytes, or the file could not be written\n", n);
      return 1;
    }
  }
  printf("train_sim: %d steps, %d layers x %llu MiB: checksum %llx, mismatches %llu, psshim %s\n", steps, layers,
         (unsigned long long)(layer_bytes >> 20), (unsigned long long)sum, (unsigned long long)bad,
         owns ? "loaded" : "absent");
  fflush(stdout); /* before psshim's statistics at exit, on stderr, also when stdout is a pipe */
  free(host), free(expect_p), free(expect_s), free(param), free(state);
  return bad ? 1 : 0;
}
