/* The layer pipeline's shape, shared by bench/pipeline.cu (the GPU benchmark) and
 * tests/integration/pipeline_sim.c (the same program on the test driver), so that the two
 * run the same launches on the same values: its settings, the order of a step's launches,
 * what each kernel computes on one element, the weights' first values and the checksum.
 *
 * L layers of weights of S MiB each. One step is 2L launches: forward over layers
 * 0..L-1 (a kernel reading its layer PASSES times), then backward over L-1..0 (a kernel
 * reading and writing it). An element is 16 bytes (four 32-bit words, one vector load);
 * the compute knob ITERS is the rounds of a multiply-add per element and pass. Integer
 * arithmetic, so a host model reproduces the device's values bit for bit.
 *
 * C11 and CUDA C++ alike: the element functions are __host__ __device__ under nvcc. */
#ifndef PSSHIM_BENCH_PIPELINE_H
#define PSSHIM_BENCH_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __CUDACC__
#define PIPE_FN __host__ __device__ static inline
#else
#define PIPE_FN static inline
#endif

/* ---- settings: environment, then KEY=VALUE arguments ---- */

struct pipe_config {
  long layers;    /* L */
  long layer_mib; /* S_MB */
  long passes;    /* PASSES: forward's reads of its layer */
  long iters;     /* ITERS: multiply-add rounds per element and pass */
  long steps;     /* STEPS, of which the first */
  long warmup;    /* WARMUP are not timed */
};

#define PIPE_NKEYS 6
static const char *const pipe_keys[PIPE_NKEYS] = {"L", "S_MB", "PASSES", "ITERS", "STEPS", "WARMUP"};

static inline long *pipe_field(struct pipe_config *c, int k)
{
  long *fields[PIPE_NKEYS] = {&c->layers, &c->layer_mib, &c->passes, &c->iters, &c->steps, &c->warmup};
  return fields[k];
}

/* One KEY's value from text; false (with err written) when it is not a whole number in range. */
static inline bool pipe_set(struct pipe_config *c, int k, const char *text, const char *from, char *err,
                            size_t errlen)
{
  char *end = NULL;
  long v = strtol(text, &end, 10);
  long least = (k == 3 || k == 5) ? 0 : 1; /* ITERS and WARMUP may be 0 */
  if (end == text || *end != '\0' || v < least || v > (1L << 30)) {
    snprintf(err, errlen, "%s%s=%s is not valid: a whole number from %ld to %ld", from, pipe_keys[k], text, least,
             1L << 30);
    return false;
  }
  *pipe_field(c, k) = v;
  return true;
}

/* Fills c (holding the defaults) from the environment, then from argv's KEY=VALUE words;
 * false, with err saying why, on an unknown word, a bad value, or WARMUP not below STEPS. */
static inline bool pipe_config_read(struct pipe_config *c, int argc, char **argv, char *err, size_t errlen)
{
  for (int k = 0; k < PIPE_NKEYS; k++) {
    const char *v = getenv(pipe_keys[k]);
    if (v && !pipe_set(c, k, v, "environment: ", err, errlen))
      return false;
  }
  for (int i = 1; i < argc; i++) {
    const char *eq = strchr(argv[i], '=');
    int k = 0;
    while (k < PIPE_NKEYS && !(eq && (size_t)(eq - argv[i]) == strlen(pipe_keys[k]) &&
                               strncmp(argv[i], pipe_keys[k], (size_t)(eq - argv[i])) == 0))
      k++;
    if (k == PIPE_NKEYS) {
      snprintf(err, errlen, "%s: not a setting (L=, S_MB=, PASSES=, ITERS=, STEPS=, WARMUP=)", argv[i]);
      return false;
    }
    if (!pipe_set(c, k, eq + 1, "", err, errlen))
      return false;
  }
  if (c->warmup >= c->steps) {
    snprintf(err, errlen, "WARMUP=%ld leaves no timed step of STEPS=%ld", c->warmup, c->steps);
    return false;
  }
  return true;
}

static inline uint64_t pipe_layer_bytes(const struct pipe_config *c) { return (uint64_t)c->layer_mib << 20; }
/* 16-byte elements of a layer. */
static inline uint64_t pipe_layer_elems(const struct pipe_config *c) { return pipe_layer_bytes(c) / 16; }

/* ---- a step's launches ---- */

/* Launch j (0 <= j < 2L) of a step: its layer, and whether it writes it (backward). */
static inline long pipe_layer_at(long j, long layers) { return j < layers ? j : 2 * layers - 1 - j; }
static inline bool pipe_writes_at(long j, long layers) { return j >= layers; }

/* ---- one element: four words ---- */

#define PIPE_BACKWARD_SALT 0x9e3779b9u /* forward's passes salt with their index */
#define PIPE_SINK_MAGIC 0x5eed5eedu    /* a forward sum stored only if it equals this: never
                                          skipped by the compiler, (almost) never stored */

/* Weight word `index` of layer `layer` at the start (splitmix64's finalizer). */
PIPE_FN uint32_t pipe_init_word(uint32_t layer, uint64_t index)
{
  uint64_t z = index + ((uint64_t)layer << 40) + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)(z ^ (z >> 31));
}

/* The compute: iters rounds of x += (x * x) | 5 (Klimov and Shamir's invertible map; no
 * compiler folds rounds of it into fewer, as it would an affine x * a + b). */
PIPE_FN uint32_t pipe_work(uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t salt, int iters)
{
  uint32_t x = (a ^ salt) + 3u * b + 5u * c + 7u * d;
  for (int k = 0; k < iters; k++)
    x += (x * x) | 5u;
  return x;
}

/* Backward's update of one element in place. */
PIPE_FN void pipe_update(uint32_t *a, uint32_t *b, uint32_t *c, uint32_t *d, int iters)
{
  uint32_t x = pipe_work(*a, *b, *c, *d, PIPE_BACKWARD_SALT, iters);
  *a += x;
  *b ^= x >> 7;
  *c += (x << 13) | (x >> 19);
  *d = *d * 5u + (x >> 16);
}

/* ---- the checksum: a 64-bit hash of the weights' bytes, layer after layer ---- */

/* Four multiply-xor lanes over 8-byte words (one lane would wait on each multiply). */
struct pipe_hash {
  uint64_t lane[4];
  uint64_t bytes;
};
#define PIPE_HASH_PRIME 0x100000001b3ull

static inline void pipe_hash_init(struct pipe_hash *h)
{
  for (int k = 0; k < 4; k++)
    h->lane[k] = 0xcbf29ce484222325ull + (uint64_t)k;
  h->bytes = 0;
}

/* Adds n bytes (a multiple of 32: a layer is whole MiB). */
static inline void pipe_hash_add(struct pipe_hash *h, const void *data, size_t n)
{
  const unsigned char *p = (const unsigned char *)data;
  for (size_t i = 0; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; k++) {
      uint64_t w;
      memcpy(&w, p + i + 8 * (size_t)k, 8);
      h->lane[k] = (h->lane[k] ^ w) * PIPE_HASH_PRIME;
    }
  h->bytes += n;
}

static inline uint64_t pipe_hash_end(const struct pipe_hash *h)
{
  uint64_t x = h->bytes;
  for (int k = 0; k < 4; k++)
    x = (x ^ h->lane[k]) * PIPE_HASH_PRIME, x ^= x >> 29;
  return x;
}

/* ---- the result: one JSON line on stdout ---- */

static inline double pipe_now_s(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static inline int pipe_cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* {"L", "S_MB", "passes", "iters", "warmup", "step_s_median" (of the steps after the
 * warmup), "steps" (every step's seconds), "weights_checksum", "bytes_per_step_each_way"
 * (L*S), "psshim" (whether it is loaded), then `extra` (more "key": value pairs, or "")}. */
static inline void pipe_print_result(const struct pipe_config *c, const double *steps, uint64_t checksum,
                                     bool psshim, const char *extra)
{
  size_t m = (size_t)(c->steps - c->warmup);
  double *timed = (double *)malloc(m * sizeof *timed), median = 0;
  if (timed) {
    memcpy(timed, steps + c->warmup, m * sizeof *timed);
    qsort(timed, m, sizeof *timed, pipe_cmp_double);
    median = m % 2 ? timed[m / 2] : (timed[m / 2 - 1] + timed[m / 2]) / 2;
    free(timed);
  }
  printf("{\"L\": %ld, \"S_MB\": %ld, \"passes\": %ld, \"iters\": %ld, \"warmup\": %ld, \"step_s_median\": %.6f, "
         "\"steps\": [",
         c->layers, c->layer_mib, c->passes, c->iters, c->warmup, median);
  for (long i = 0; i < c->steps; i++)
    printf("%s%.6f", i ? ", " : "", steps[i]);
  printf("], \"weights_checksum\": \"%016llx\", \"bytes_per_step_each_way\": %llu, \"psshim\": %s%s%s}\n",
         (unsigned long long)checksum, (unsigned long long)(pipe_layer_bytes(c) * (uint64_t)c->layers),
         psshim ? "true" : "false", *extra ? ", " : "", extra);
}

#endif
