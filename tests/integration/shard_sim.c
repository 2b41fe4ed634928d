/* A random program for sharding, run as each rank of a node: buffers of random sizes
 * (from the seed, the same on every rank) of three kinds: replicated and never touched
 * again (the same bytes on every rank), replicated and updated by a kernel every step, and
 * rank-private (bytes that depend on RANK). Each step allocates an activation, fills it
 * and updates the hot buffers from it. Near the end a kernel writes a rank-dependent value
 * into one replicated buffer, so a rank whose chunk is shared must make it its own first.
 * DIVERGE=1 makes rank 1's first replicated buffer differ in one word from the start.
 * REWRITE=1 also writes the same value into that buffer on every rank halfway, so it is
 * equal on every rank again and untouched for the next half.
 * READERS=n adds n replicated buffers that a kernel reads (never writes) every third step
 * (READ_EVERY=k: every k-th) of the first half, as frozen weights are read, then leaves
 * alone; a quarter of the way in, each rank writes its own value into the first of them.
 * REFUSE=1: the driver refuses rank 1's async copies during its late write, so it cannot
 * make that chunk its own if it is shared (psshim then leaves it unmapped: the write faults).
 * DEVICE_PER_RANK=1 runs rank r on device r, as a torchrun job does (the driver needs
 * FAKECUDA_DEVICE_COUNT ranks).
 * SPOTS=n (n <= 40) adds n replicated buffers of a whole chunk each (one a few bytes short
 * leaves bytes of the chunk the program never writes, which hold whatever the host frame
 * held before and may differ between ranks: psshim then rightly shares no such chunk),
 * never touched; with SPOT_DIFFER=1 rank 1's buffer j
 * differs from rank 0's in the one byte at spot j: every offset modulo 32 once (each byte of
 * each 8-byte lane), spread over the buffer (even and odd 32-byte blocks), then its first and
 * last bytes, the last of its whole 32-byte blocks, and both sides of its middle. A chunk
 * shared though it differs gives one rank the other's byte there: a mismatch.
 * Every buffer is read back and compared with a host mirror at the end.
 * Prints: checksum, mismatches, and the host frame bytes the driver held after the steps.
 * Usage: shard_sim seed steps */
#define SIM_NAME "shard_sim"
#include "tests/integration/sim.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum kind { COLD, HOT, PRIVATE, READ, SPOT };
struct buffer {
  enum kind kind;
  uint64_t words;
  uint32_t *dev, *mirror;
};

static uint64_t rng;
static uint64_t next(void)
{
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}

static uint32_t word_of(uint64_t seed, int b, uint64_t i, int rank)
{
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + (uint64_t)b * 0xBF58476D1CE4E5B9ull + i * 0x94D049BB133111EBull +
               (uint64_t)rank;
  return (uint32_t)(x ^ (x >> 29));
}

/* act[i] = i * 7 + step */
static void fill_fn(void **args, void *user)
{
  (void)user;
  uint32_t *act = *(uint32_t **)args[0];
  uint64_t n = *(uint64_t *)args[1], step = *(uint64_t *)args[2];
  for (uint64_t i = 0; i < n; i++)
    act[i] = (uint32_t)(i * 7 + step);
}

/* buf[i] = buf[i] * 3 + act[i % act_n] */
static void update_fn(void **args, void *user)
{
  (void)user;
  uint32_t *buf = *(uint32_t **)args[0];
  const uint32_t *act = *(uint32_t **)args[1];
  uint64_t n = *(uint64_t *)args[2], act_n = *(uint64_t *)args[3];
  for (uint64_t i = 0; i < n; i++)
    buf[i] = buf[i] * 3u + act[i % act_n];
}

/* act[i] += buf[i % n]: reads buf only */
static void read_fn(void **args, void *user)
{
  (void)user;
  uint32_t *act = *(uint32_t **)args[0];
  const uint32_t *buf = *(uint32_t **)args[1];
  uint64_t act_n = *(uint64_t *)args[2], n = *(uint64_t *)args[3];
  for (uint64_t i = 0; i < act_n; i++)
    act[i] += buf[i % n];
}

/* buf[0] = value */
static void poke_fn(void **args, void *user)
{
  (void)user;
  **(uint32_t **)args[0] = *(uint32_t *)args[1];
}

/* The byte offset spot j names in a buffer of `bytes` (see SPOTS above). */
static uint64_t spot(int j, uint64_t bytes)
{
  uint64_t blocks = bytes / 32;
  if (j < 32)
    return (uint64_t)j + 32 * (((uint64_t)j * 4099 + 7) % blocks);
  const uint64_t edges[] = {0, bytes - 1, bytes - 2, blocks * 32 - 1, bytes / 2 - 1, bytes / 2, 1, 8};
  return edges[(j - 32) % 8];
}

int main(int argc, char **argv)
{
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
  int steps = argc > 2 ? atoi(argv[2]) : 100;
  int rank = getenv("RANK") ? atoi(getenv("RANK")) : 0;
  int diverge = getenv("DIVERGE") && atoi(getenv("DIVERGE")) && rank == 1;
  int rewrite = getenv("REWRITE") && atoi(getenv("REWRITE"));
  int readers = getenv("READERS") ? atoi(getenv("READERS")) : 0;
  int refuse = getenv("REFUSE") && atoi(getenv("REFUSE")) && rank == 1;
  int read_every = getenv("READ_EVERY") && atoi(getenv("READ_EVERY")) > 0 ? atoi(getenv("READ_EVERY")) : 3;
  rng = seed * 2654435761u + 1;
  if (getenv("DEVICE_PER_RANK") && atoi(getenv("DEVICE_PER_RANK")))
    check(cudaSetDevice(rank), "cudaSetDevice");
  size_t fill_sizes[] = {8, 8, 8}, update_sizes[] = {8, 8, 8, 8}, poke_sizes[] = {8, 4};
  CUfunction fill = fakecuda_register_kernel("fill", fill_fn, NULL, 3, fill_sizes);
  CUfunction update = fakecuda_register_kernel("update", update_fn, NULL, 4, update_sizes);
  CUfunction poke = fakecuda_register_kernel("poke", poke_fn, NULL, 2, poke_sizes);
  CUfunction reader = fakecuda_register_kernel("read", read_fn, NULL, 4, update_sizes);
  cudaStream_t s;
  check(cudaStreamCreate(&s), "cudaStreamCreate");

  int spots = getenv("SPOTS") ? atoi(getenv("SPOTS")) : 0;
  int spot_differ = getenv("SPOT_DIFFER") && atoi(getenv("SPOT_DIFFER")) && rank == 1;
  uint64_t chunk = getenv("PSSHIM_CHUNK_SIZE") ? strtoull(getenv("PSSHIM_CHUNK_SIZE"), NULL, 10) << 20 : 2u << 20;
  spots = spots < 0 ? 0 : spots > 40 ? 40 : spots;
  int nrandom = 10 + (int)(next() % 6), nbuf = nrandom + readers + spots, poked = -1;
  struct buffer *buf = calloc((size_t)nbuf, sizeof *buf);
  for (int b = 0; b < nbuf; b++) {
    uint64_t r = next() % 10;
    buf[b].kind = b >= nrandom + readers ? SPOT : b >= nrandom ? READ : r < 5 ? COLD : r < 7 ? HOT : PRIVATE;
    buf[b].words = (16 + next() % (6u << 18)) & ~(uint64_t)1023; /* 4 KiB to 6 MiB */
    if (buf[b].kind == SPOT)
      buf[b].words = chunk / 4;
    buf[b].mirror = malloc(buf[b].words * 4);
    for (uint64_t i = 0; i < buf[b].words; i++)
      buf[b].mirror[i] = word_of(seed, b, i, buf[b].kind == PRIVATE ? rank + 1 : 0);
    if (buf[b].kind == SPOT && spot_differ)
      ((unsigned char *)buf[b].mirror)[spot(b - nrandom - readers, buf[b].words * 4)] ^= 0x5a;
    if (buf[b].kind == COLD && poked < 0) {
      poked = b;
      buf[b].mirror[1] += (uint32_t)diverge;
    }
    check(cudaMalloc((void **)&buf[b].dev, buf[b].words * 4), "cudaMalloc");
    check(cudaMemcpy(buf[b].dev, buf[b].mirror, buf[b].words * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  uint64_t act_n = 1 << 18;
  for (int step = 0; step < steps; step++) {
    uint32_t *act;
    uint64_t st = (uint64_t)step;
    check(cudaMallocAsync((void **)&act, act_n * 4, s), "cudaMallocAsync");
    void *fp[] = {&act, &act_n, &st};
    launch(fill, fp, s);
    for (int b = 0; b < nbuf; b++) {
      if (buf[b].kind == READ && step % read_every == b % read_every && step < steps / 2) {
        void *rp[] = {&act, &buf[b].dev, &act_n, &buf[b].words};
        launch(reader, rp, s);
      }
      if (buf[b].kind != HOT)
        continue;
      void *up[] = {&buf[b].dev, &act, &buf[b].words, &act_n};
      launch(update, up, s);
      for (uint64_t i = 0; i < buf[b].words; i++)
        buf[b].mirror[i] = buf[b].mirror[i] * 3u + (uint32_t)((i % act_n) * 7 + st);
    }
    if (readers && step == steps / 4) {
      uint32_t value = 2000u + (uint32_t)rank;
      void *pp[] = {&buf[nrandom].dev, &value};
      launch(poke, pp, s);
      buf[nrandom].mirror[0] = value;
    }
    if ((step == steps - 3 || (rewrite && step == steps / 2)) && poked >= 0) {
      /* near the end each rank its own value; halfway (REWRITE) the same one */
      uint32_t value = step == steps - 3 ? 1000u + (uint32_t)rank : 7u;
      void *pp[] = {&buf[poked].dev, &value};
      if (refuse && step == steps - 3)
        fakecuda_fail_async_copies(true); /* the copy that would make a shared chunk its own */
      launch(poke, pp, s);
      fakecuda_fail_async_copies(false);
      buf[poked].mirror[0] = value;
    }
    check(cudaFreeAsync(act, s), "cudaFreeAsync");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }
  size_t host_bytes = fakecuda_used_bytes(-1);
  uint64_t bad = 0, sum = 0;
  for (int b = 0; b < nbuf; b++) {
    uint32_t *back = malloc(buf[b].words * 4);
    check(cudaMemcpy(back, buf[b].dev, buf[b].words * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (uint64_t i = 0; i < buf[b].words; i++) {
      bad += back[i] != buf[b].mirror[i];
      sum = sum * 31 + back[i];
    }
    free(back);
    check(cudaFree(buf[b].dev), "cudaFree");
    free(buf[b].mirror);
  }
  printf("shard_sim: seed %llu, %d buffers: checksum %llx, mismatches %llu, host frame bytes %zu\n",
         (unsigned long long)seed, nbuf, (unsigned long long)sum, (unsigned long long)bad, host_bytes);
  free(buf);
  return bad ? 1 : 0;
}
