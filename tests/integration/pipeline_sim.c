/* bench/pipeline.cu on the test driver: the same layer pipeline (bench/pipeline.h: its
 * settings, launch order and element arithmetic), its kernels host functions, small enough
 * for a test. L layers of S MiB weights, each its own cudaMalloc; a step is forward over
 * layers 0..L-1 (reading each PASSES times) then backward over L-1..0 (reading and writing
 * it). After every step each layer is read back and compared with a host model of the same
 * arithmetic (those copies are launches psshim sees too: its iteration is 3L long here,
 * 2L on the GPU). At the end it prints bench/pipeline.cu's JSON line (so that
 * bench/pipeline.py runs it as well), then one line (checksum, mismatches, whether psshim is
 * loaded) and, under psshim, what psshim_stats_json says it did: moves each way and chunk
 * touches served in place, from which the GPU runs' counts can be predicted.
 * Settings as bench/pipeline.cu's (environment or KEY=VALUE arguments); defaults here
 * L=16 S_MB=4 PASSES=4 ITERS=2 STEPS=30. PIPELINE_SIM_MAX_STEADY_INPLACE: see main's end.
 * PIPELINE_SIM_NEED_PSSHIM=1: fail when psshim is
 * not loaded. Exit 1 on a mismatch. */
#define SIM_NAME "pipeline_sim"
#include "tests/integration/sim.h"

#include "bench/pipeline.h"

#include <dlfcn.h>

static volatile uint32_t forward_sink; /* as the .cu's: the forward sums are not dead code */

/* Kernel parameters, every one 8 bytes: (weights, elements, layer) */
static void init_fn(void **args, void *user)
{
  (void)user;
  uint32_t *w = *(uint32_t **)args[0];
  uint64_t n = *(uint64_t *)args[1], layer = *(uint64_t *)args[2];
  for (uint64_t i = 0; i < 4 * n; i++)
    w[i] = pipe_init_word((uint32_t)layer, i);
}

/* (weights, elements, passes, iters) */
static void forward_fn(void **args, void *user)
{
  (void)user;
  const uint32_t *w = *(uint32_t **)args[0];
  uint64_t n = *(uint64_t *)args[1], passes = *(uint64_t *)args[2], iters = *(uint64_t *)args[3];
  uint32_t sum = 0;
  for (uint64_t p = 0; p < passes; p++)
    for (uint64_t i = 0; i < n; i++)
      sum += pipe_work(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3], (uint32_t)p, (int)iters);
  if (sum == PIPE_SINK_MAGIC)
    forward_sink = sum;
}

/* (weights, elements, iters): also the host model's step for one layer */
static void backward_layer(uint32_t *w, uint64_t n, int iters)
{
  for (uint64_t i = 0; i < n; i++)
    pipe_update(&w[4 * i], &w[4 * i + 1], &w[4 * i + 2], &w[4 * i + 3], iters);
}

static void backward_fn(void **args, void *user)
{
  (void)user;
  backward_layer(*(uint32_t **)args[0], *(uint64_t *)args[1], (int)*(uint64_t *)args[2]);
}

/* A number after "key": in psshim_stats_json's text; 0 when absent. */
static unsigned long long stat_of(const char *json, const char *key)
{
  char pattern[96];
  snprintf(pattern, sizeof pattern, "\"%s\": ", key);
  const char *at = strstr(json, pattern);
  return at ? strtoull(at + strlen(pattern), NULL, 10) : 0;
}

int main(int argc, char **argv)
{
  struct pipe_config c = {16, 4, 4, 2, 30, 0};
  char err[256];
  if (!pipe_config_read(&c, argc, argv, err, sizeof err)) {
    fprintf(stderr, "pipeline_sim: %s\n", err);
    return 2;
  }
  static const size_t sizes3[] = {8, 8, 8}, sizes4[] = {8, 8, 8, 8};
  CUfunction init_k = fakecuda_register_kernel("pipeline_init", init_fn, NULL, 3, sizes3),
             forward_k = fakecuda_register_kernel("pipeline_forward", forward_fn, NULL, 4, sizes4),
             backward_k = fakecuda_register_kernel("pipeline_backward", backward_fn, NULL, 3, sizes3);
  if (!init_k || !forward_k || !backward_k) {
    fprintf(stderr, "pipeline_sim: registering the kernels failed\n");
    return 2;
  }
  const uint64_t bytes = pipe_layer_bytes(&c), words = bytes / 4;
  uint64_t n = pipe_layer_elems(&c), passes = (uint64_t)c.passes, iters = (uint64_t)c.iters;
  cudaStream_t s;
  check(cudaStreamCreate(&s), "cudaStreamCreate");
  uint32_t **w = calloc((size_t)c.layers, sizeof *w);
  uint32_t *model = malloc(bytes * (size_t)c.layers), *host = malloc(bytes);
  if (!w || !model || !host) {
    fprintf(stderr, "pipeline_sim: out of host memory\n");
    return 2;
  }
  for (long l = 0; l < c.layers; l++) {
    check(cudaMalloc((void **)&w[l], bytes), "cudaMalloc");
    uint64_t layer = (uint64_t)l;
    void *p[] = {&w[l], &n, &layer};
    launch(init_k, p, s);
    for (uint64_t i = 0; i < words; i++)
      model[(uint64_t)l * words + i] = pipe_init_word((uint32_t)l, i);
  }
  uint64_t bad = 0;
  double *steps = calloc((size_t)c.steps, sizeof *steps);
  if (!steps) {
    fprintf(stderr, "pipeline_sim: out of host memory\n");
    return 2;
  }
  struct pipe_hash h; /* of the weights read back after the last step, as bench/pipeline.cu's */
  pipe_hash_init(&h);
  for (long step = 0; step < c.steps; step++) {
    double t0 = pipe_now_s();
    for (long j = 0; j < 2 * c.layers; j++) {
      long l = pipe_layer_at(j, c.layers);
      if (pipe_writes_at(j, c.layers)) {
        void *p[] = {&w[l], &n, &iters};
        launch(backward_k, p, s);
      } else {
        void *p[] = {&w[l], &n, &passes, &iters};
        launch(forward_k, p, s);
      }
    }
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    steps[step] = pipe_now_s() - t0;
    for (long j = 0; j < 2 * c.layers; j++) /* the host model, launch by launch */
      if (pipe_writes_at(j, c.layers))
        backward_layer(&model[(uint64_t)pipe_layer_at(j, c.layers) * words], n, (int)iters);
    for (long l = 0; l < c.layers; l++) {
      check(cudaMemcpy(host, w[l], bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
      const uint32_t *want = &model[(uint64_t)l * words];
      for (uint64_t i = 0; i < words; i++)
        bad += host[i] != want[i];
      if (step == c.steps - 1)
        pipe_hash_add(&h, host, bytes);
    }
  }
  for (long l = 0; l < c.layers; l++)
    check(cudaFree(w[l]), "cudaFree");
  check(cudaStreamDestroy(s), "cudaStreamDestroy");

  bool loaded = dlsym(RTLD_DEFAULT, "psshim_owns") != NULL;
  char extra[64];
  snprintf(extra, sizeof extra, "\"mismatches\": %llu", (unsigned long long)bad);
  pipe_print_result(&c, steps, pipe_hash_end(&h), loaded, extra); /* the line bench/pipeline.py reads */
  printf("pipeline_sim: %ld steps, %ld layers x %ld MiB, %ld passes, %ld iters: checksum %016llx, mismatches %llu, "
         "psshim %s\n", c.steps, c.layers, c.layer_mib, c.passes, c.iters, (unsigned long long)pipe_hash_end(&h),
         (unsigned long long)bad, loaded ? "loaded" : "absent");
  size_t (*stats_json)(char *, size_t) = (size_t (*)(char *, size_t))dlsym(RTLD_DEFAULT, "psshim_stats_json");
  char text[8192];
  size_t len = stats_json ? stats_json(text, sizeof text) : 0;
  if (len > 0 && len < sizeof text) {
    unsigned long long place = stat_of(text, "touches_host"), all = place + stat_of(text, "touches_gpu");
    char touches[96] = "not observed (static observes no launch)";
    if (all)
      snprintf(touches, sizeof touches, "%llu of %llu (%.1f%%)", place, all, 100.0 * (double)place / (double)all);
    printf("pipeline_sim: psshim moved %llu chunks to the GPU (%llu MiB), %llu to the host (%llu MiB); chunk "
           "touches in place %s; period %llu, trusted at launch %llu of %llu; copy waits %llu, late waits %llu\n",
           stat_of(text, "migrations_to_gpu"), stat_of(text, "bytes_h2d") >> 20, stat_of(text, "migrations_to_host"),
           stat_of(text, "bytes_d2h") >> 20, touches, stat_of(text, "period"), stat_of(text, "period_adopted_at"),
           stat_of(text, "launches"), stat_of(text, "copy_waits"), stat_of(text, "late_waits"));
  }
  /* PIPELINE_SIM_MAX_STEADY_INPLACE=N: fail when the steady iterations touched more than N
   * chunks in place, launches asked the owner for more than N, or more than N remaps ran
   * beside in-place reads (a plan the owner follows brings every chunk in before its
   * launch, unasked, and nothing is read in place while it remaps). */
  const char *most = getenv("PIPELINE_SIM_MAX_STEADY_INPLACE");
  bool have = len > 0 && len < sizeof text;
  unsigned long long steady_place = have ? stat_of(text, "steady_touches_host") : 0;
  unsigned long long steady_asked = have ? stat_of(text, "steady_owner_demand_fetches") : 0;
  unsigned long long steady_beside = have ? stat_of(text, "steady_remaps_beside_inplace") : 0;
  unsigned long long allowed = most ? strtoull(most, NULL, 10) : 0;
  bool too_many = most && (!have || steady_place > allowed || steady_asked > allowed || steady_beside > allowed ||
                           !stat_of(text, "steady_touches_gpu"));
  if (most)
    printf("pipeline_sim: steady iterations touched %llu chunks in place, asked for %llu, remapped %llu times beside "
           "in-place reads (at most %s allowed)\n", steady_place, steady_asked, steady_beside, most);
  fflush(stdout); /* before psshim's own statistics at exit, on stderr */
  free(w), free(model), free(host), free(steps);
  const char *need = getenv("PIPELINE_SIM_NEED_PSSHIM");
  if (need && atoi(need) && !loaded) {
    fprintf(stderr, "pipeline_sim: psshim is not loaded\n");
    return 1;
  }
  return bad || too_many ? 1 : 0;
}
