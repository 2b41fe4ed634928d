/* Legacy CUDA IPC of memory psshim serves, as torch.multiprocessing uses it: the parent
 * allocates a buffer (not at a chunk's start), fills it, makes a handle with
 * cudaIpcGetMemHandle and starts a child (this program, posix_spawn: it inherits
 * LD_PRELOAD) that opens the handle with cudaIpcOpenMemHandle, checks the values, writes
 * others and closes it; meanwhile the parent runs a training loop over more memory than
 * its GPU budget, so that the pager moves chunks (PSSHIM_POLICY=auto), and must find the
 * child's writes in its buffer, and the child the parent's later ones. Also: a handle of
 * memory psshim does not own (device 1's pool, FAKECUDA_DEVICE_COUNT=2) passes through to
 * the driver both ways; handles with psshim's mark that name nothing (another token,
 * another base) fail with cudaErrorInvalidValue, not a crash; a child with PSSHIM_DISABLE=1
 * fails likewise; the driver's doors (dlsym'd cuIpcOpenMemHandle_v2, cuIpcCloseMemHandle)
 * open the handle too; closing a handle waits for the work queued on its range. Each check
 * prints its name; any failure exits non-zero.
 * Usage: ipc_sim [steps]  (the child: ipc_sim child HANDLE PLAIN_HANDLE COLD_HANDLE) */
#define SIM_NAME "ipc_sim"
#include "tests/integration/check.h"
#include "tests/integration/sim.h"

#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define LAYERS 6
#define LAYER_BYTES (2u << 20)
#define SHARED_BYTES (5u << 20) /* three 2 MiB chunks, from offset 1 KiB of the first */
#define COLD_BYTES (1u << 20)   /* allocated past the GPU budget: on a host frame */

/* The values each side writes into the shared buffer, by phase. */
static uint32_t pattern(char phase, uint64_t i) { return (uint32_t)(i * 2654435761u) ^ (uint32_t)phase << 24; }

static void fill(uint32_t *host, char phase, uint64_t bytes)
{
  for (uint64_t i = 0; i < bytes / 4; i++)
    host[i] = pattern(phase, i);
}

static uint64_t mismatches(const uint32_t *host, char phase, uint64_t bytes)
{
  uint64_t bad = 0;
  for (uint64_t i = 0; i < bytes / 4; i++)
    bad += host[i] != pattern(phase, i);
  return bad;
}

static void to_hex(const void *p, size_t n, char *out)
{
  for (size_t i = 0; i < n; i++)
    sprintf(out + 2 * i, "%02x", ((const unsigned char *)p)[i]);
}

static bool from_hex(const char *s, void *p, size_t n)
{
  if (strlen(s) != 2 * n)
    return false;
  for (size_t i = 0; i < n; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1)
      return false;
    ((unsigned char *)p)[i] = (unsigned char)v;
  }
  return true;
}

/* stall(): holds its stream 300 ms, so what is queued behind it is still queued. */
static void stall_fn(void **args, void *user)
{
  (void)args, (void)user;
  usleep(300000);
}

static CUfunction stall_kernel(void)
{
  static CUfunction f;
  if (!f)
    f = fakecuda_register_kernel("stall", stall_fn, NULL, 0, NULL);
  return f;
}

/* ---- the child: commands on stdin, one answer line each on stdout ---- */

static void say(const char *line)
{
  printf("%s\n", line);
  fflush(stdout);
}

static int child(const char *hex, const char *plain_hex, const char *cold_hex)
{
  cudaIpcMemHandle_t h, plain, cold;
  if (!from_hex(hex, &h, sizeof h) || !from_hex(plain_hex, &plain, sizeof plain) ||
      !from_hex(cold_hex, &cold, sizeof cold)) {
    fprintf(stderr, "ipc_sim child: bad handle argument\n");
    return 2;
  }
  uint32_t *host = malloc(SHARED_BYTES);
  void *p = NULL;
  bool ok = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess && p;
  if (ok) {
    check(cudaMemcpy(host, p, SHARED_BYTES, cudaMemcpyDeviceToHost), "cudaMemcpy");
    ok = mismatches(host, 'A', SHARED_BYTES) == 0;
  }
  say(ok ? "opened" : "open failed");
  char cmd[64];
  while (ok && fgets(cmd, sizeof cmd, stdin)) {
    if (strcmp(cmd, "write\n") == 0) {
      fill(host, 'B', SHARED_BYTES);
      check(cudaMemcpy(p, host, SHARED_BYTES, cudaMemcpyHostToDevice), "cudaMemcpy");
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      say("written");
    } else if (strcmp(cmd, "check\n") == 0) {
      check(cudaMemcpy(host, p, SHARED_BYTES, cudaMemcpyDeviceToHost), "cudaMemcpy");
      say(mismatches(host, 'C', SHARED_BYTES) == 0 ? "C seen" : "C not seen");
    } else if (strcmp(cmd, "driver\n") == 0) {
      /* The driver's doors, reached as a program that never links libcuda reaches them. */
      void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
      CUresult (*open_v2)(CUdeviceptr *, CUipcMemHandle, unsigned) =
          (CUresult(*)(CUdeviceptr *, CUipcMemHandle, unsigned))dlsym(cuda, "cuIpcOpenMemHandle_v2");
      CUresult (*close_h)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))dlsym(cuda, "cuIpcCloseMemHandle");
      CUipcMemHandle dh;
      memcpy(&dh, &h, sizeof dh);
      CUdeviceptr q = 0;
      uint32_t first = 0;
      bool seen = open_v2 && close_h && open_v2(&q, dh, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS &&
                  cudaMemcpy(&first, (void *)q, 4, cudaMemcpyDeviceToHost) == cudaSuccess &&
                  first == pattern('C', 0) && close_h(q) == CUDA_SUCCESS;
      say(seen ? "driver doors ok" : "driver doors failed");
    } else if (strcmp(cmd, "queued\n") == 0) {
      /* A copy out of the range queued behind a slow kernel when the handle is closed: the
       * close waits for it (cuMemUnmap does not wait, and the strict driver aborts on an
       * unmap under queued work), so at its return the copy has read the parent's values. */
      void *q = NULL;
      cudaStream_t qs;
      uint32_t got[1024] = {0};
      bool ok = cudaIpcOpenMemHandle(&q, h, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess &&
                cudaStreamCreateWithFlags(&qs, cudaStreamNonBlocking) == cudaSuccess;
      if (ok) {
        launch(stall_kernel(), NULL, qs);
        ok = cudaMemcpyAsync(got, q, sizeof got, cudaMemcpyDeviceToHost, qs) == cudaSuccess &&
             cudaIpcCloseMemHandle(q) == cudaSuccess;
        ok = ok && mismatches(got, 'C', sizeof got) == 0; /* read before the close returned */
        ok = cudaStreamSynchronize(qs) == cudaSuccess && ok;
      }
      say(ok ? "queued ok" : "queued failed");
    } else if (strcmp(cmd, "strangers\n") == 0) {
      /* psshim's mark, but another token (no such service), or a base it never exported. */
      cudaIpcMemHandle_t bad = h;
      bad.reserved[16] ^= 1; /* the token's first byte (allocator/ipc.c's struct handle) */
      void *q = NULL;
      bool refused = cudaIpcOpenMemHandle(&q, bad, cudaIpcMemLazyEnablePeerAccess) == cudaErrorInvalidValue && !q;
      bad = h;
      bad.reserved[25] ^= 2; /* base + 512: the base's second byte */
      refused = refused && cudaIpcOpenMemHandle(&q, bad, cudaIpcMemLazyEnablePeerAccess) == cudaErrorInvalidValue && !q;
      /* Not psshim's: the driver answers (the test driver cannot map another process's
       * plain memory, and says so with its own error). */
      bool passed = cudaIpcOpenMemHandle(&q, plain, cudaIpcMemLazyEnablePeerAccess) == cudaErrorNotSupported;
      say(refused && passed ? "strangers refused" : "strangers not refused");
    } else if (strcmp(cmd, "host\n") == 0) {
      /* Memory on a host frame of the parent's: opened, read, written, closed. */
      void *q = NULL;
      bool seen = cudaIpcOpenMemHandle(&q, cold, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess &&
                  cudaMemcpy(host, q, COLD_BYTES, cudaMemcpyDeviceToHost) == cudaSuccess &&
                  mismatches(host, 'H', COLD_BYTES) == 0;
      fill(host, 'I', COLD_BYTES);
      seen = seen && cudaMemcpy(q, host, COLD_BYTES, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaIpcCloseMemHandle(q) == cudaSuccess;
      say(seen ? "host ok" : "host failed");
    } else if (strcmp(cmd, "close\n") == 0) {
      bool closed = cudaIpcCloseMemHandle(p) == cudaSuccess;
      /* Closed once: psshim no longer knows the pointer, so the driver's call answers. */
      closed = closed && cudaIpcCloseMemHandle(p) == cudaErrorInvalidValue;
      say(closed ? "closed" : "close failed");
      break;
    }
  }
  free(host);
  return ok ? 0 : 1;
}

/* ---- the parent ---- */

struct kid {
  pid_t pid;
  FILE *to, *from;
};

/* Starts this program as a child with pipes on its stdin and stdout; extra_env, if not NULL,
 * is added to the environment. */
static bool spawn(struct kid *k, char *const handles[3], const char *extra_env)
{
  int in[2], out[2];
  if (pipe(in) || pipe(out))
    return false;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, in[1]);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  size_t n = 0;
  while (environ[n])
    n++;
  char **env = calloc(n + 3, sizeof *env);
  memcpy(env, environ, n * sizeof *env);
  env[n] = "IPC_SIM_CHILD=1";
  env[n + 1] = (char *)extra_env;
  char *argv[] = {"ipc_sim", "child", handles[0], handles[1], handles[2], NULL};
  fflush(stdout);
  int e = posix_spawn(&k->pid, "/proc/self/exe", &fa, NULL, argv, env);
  posix_spawn_file_actions_destroy(&fa);
  free(env);
  close(in[0]);
  close(out[1]);
  k->to = fdopen(in[1], "w");
  k->from = fdopen(out[0], "r");
  return e == 0 && k->to && k->from;
}

/* Sends a command (NULL: none) and reads the child's answer line. */
static bool ask(struct kid *k, const char *cmd, const char *want)
{
  char line[128] = "";
  if (cmd) {
    fprintf(k->to, "%s\n", cmd);
    fflush(k->to);
  }
  if (!fgets(line, sizeof line, k->from))
    return false;
  line[strcspn(line, "\n")] = '\0';
  if (strcmp(line, want) != 0)
    fprintf(stderr, "ipc_sim: the child answered \"%s\", not \"%s\"\n", line, want);
  return strcmp(line, want) == 0;
}

static int reap(struct kid *k)
{
  int status = 0;
  fclose(k->to);
  fclose(k->from);
  waitpid(k->pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static CUfunction forward_kernel, update_kernel;

/* param[i] += act[i] & 0xff */
static void update_fn(void **args, void *user)
{
  (void)user;
  uint32_t *param = *(uint32_t **)args[0];
  const uint32_t *act = *(uint32_t **)args[1];
  uint64_t n = *(uint64_t *)args[2];
  for (uint64_t i = 0; i < n; i++)
    param[i] += act[i] & 0xffu;
}

/* Training steps over the layers, as train_sim's (activations allocated and freed every
 * step, so psshim finds the iteration and its pager moves chunks); the host keeps the
 * expected parameters. */
static void train(uint32_t **param, uint32_t *expect, int from, int to, cudaStream_t s)
{
  uint64_t n = LAYER_BYTES / 4;
  for (int step = from; step < to; step++) {
    uint32_t *act[LAYERS];
    uint64_t st = (uint64_t)step;
    for (int l = 0; l < LAYERS; l++) {
      check(cudaMallocAsync((void **)&act[l], LAYER_BYTES, s), "cudaMallocAsync");
      void *fp[] = {&param[l], &act[l], &n, &st};
      launch(forward_kernel, fp, s);
    }
    for (int l = LAYERS - 1; l >= 0; l--) {
      void *up[] = {&param[l], &act[l], &n};
      launch(update_kernel, up, s);
      check(cudaFreeAsync(act[l], s), "cudaFreeAsync");
      for (uint64_t i = 0; i < n; i++) {
        uint32_t *e = &expect[(uint64_t)l * n + i];
        *e += (*e * 3u + (uint32_t)step) & 0xffu;
      }
    }
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }
}

static uint64_t stat_of(const char *name)
{
  size_t (*stats_json)(char *, size_t) = (size_t (*)(char *, size_t))dlsym(RTLD_DEFAULT, "psshim_stats_json");
  char text[8192], key[64];
  if (!stats_json || !stats_json(text, sizeof text))
    return 0;
  snprintf(key, sizeof key, "\"%s\": ", name);
  const char *at = strstr(text, key);
  return at ? strtoull(at + strlen(key), NULL, 10) : 0;
}

int main(int argc, char **argv)
{
  if (argc == 5 && strcmp(argv[1], "child") == 0)
    return child(argv[2], argv[3], argv[4]);
  if (getenv("IPC_SIM_CHILD")) { /* a child never starts children */
    fprintf(stderr, "ipc_sim: a child was started without its arguments\n");
    return 2;
  }
  int steps = argc > 1 ? atoi(argv[1]) : 40;
  signal(SIGPIPE, SIG_IGN); /* a child that ended early fails its check, not the parent */
  int (*owns)(const void *) = (int (*)(const void *))dlsym(RTLD_DEFAULT, "psshim_owns");
  CHECK("psshim is preloaded", owns != NULL);
  if (!owns)
    return 1;
  size_t upd_sizes[] = {8, 8, 8};
  forward_kernel = sim_forward_kernel();
  update_kernel = fakecuda_register_kernel("update", update_fn, NULL, 3, upd_sizes);
  cudaStream_t s;
  check(cudaStreamCreate(&s), "cudaStreamCreate");

  /* The shared buffer first, so that it starts on GPU frames; after 1 KiB of another
   * allocation, so that it does not start at a chunk's start. */
  void *pad = NULL, *shared = NULL;
  check(cudaMalloc(&pad, 1024), "cudaMalloc");
  check(cudaMalloc(&shared, SHARED_BYTES), "cudaMalloc");
  CHECK("the shared buffer is psshim's", owns(shared) && owns(pad));
  uint32_t *host = malloc(SHARED_BYTES), *expect = malloc((size_t)LAYERS * LAYER_BYTES);
  fill(host, 'A', SHARED_BYTES);
  check(cudaMemcpy(shared, host, SHARED_BYTES, cudaMemcpyHostToDevice), "cudaMemcpy");
  uint32_t *param[LAYERS];
  for (int l = 0; l < LAYERS; l++) {
    check(cudaMalloc((void **)&param[l], LAYER_BYTES), "cudaMalloc");
    for (uint64_t i = 0; i < LAYER_BYTES / 4; i++)
      expect[(uint64_t)l * LAYER_BYTES / 4 + i] = (uint32_t)(l * 7919 + (int)i);
    check(cudaMemcpy(param[l], expect + (uint64_t)l * LAYER_BYTES / 4, LAYER_BYTES, cudaMemcpyHostToDevice),
          "cudaMemcpy");
  }

  /* Past the GPU budget (8M: the buffer's three chunks and one layer's), so on a host frame. */
  void *cold = NULL;
  uint64_t gpu_frames = stat_of("gpu_frames"), host_frames = stat_of("host_frames");
  check(cudaMalloc(&cold, COLD_BYTES), "cudaMalloc");
  CHECK("a buffer past the GPU budget takes a host frame",
        stat_of("gpu_frames") == gpu_frames && stat_of("host_frames") == host_frames + 1);
  fill(host, 'H', COLD_BYTES);
  check(cudaMemcpy(cold, host, COLD_BYTES, cudaMemcpyHostToDevice), "cudaMemcpy");
  cudaIpcMemHandle_t h, plain_h, cold_h;
  CHECK("cudaIpcGetMemHandle of psshim's memory on a host frame", cudaIpcGetMemHandle(&cold_h, cold) == cudaSuccess);
  CHECK("cudaIpcGetMemHandle of psshim's memory", cudaIpcGetMemHandle(&h, shared) == cudaSuccess);
  CHECK("... not of a pointer inside it", cudaIpcGetMemHandle(&plain_h, (char *)shared + 512) == cudaErrorInvalidValue);
  /* Memory psshim does not serve: device 1's pool, not the current one. */
  cudaMemPool_t pool1;
  void *plain = NULL;
  check(cudaDeviceGetMemPool(&pool1, 1), "cudaDeviceGetMemPool");
  check(cudaMallocFromPoolAsync(&plain, 4096, pool1, s), "cudaMallocFromPoolAsync");
  memset(&plain_h, 0, sizeof plain_h);
  CHECK("a handle of memory psshim does not serve comes from the driver",
        !owns(plain) && cudaIpcGetMemHandle(&plain_h, plain) == cudaSuccess &&
            memcmp(plain_h.reserved, "fakecuda-ipc", 12) == 0);
  char hex[3][2 * sizeof h + 1], *handles[3] = {hex[0], hex[1], hex[2]};
  to_hex(&h, sizeof h, hex[0]);
  to_hex(&plain_h, sizeof plain_h, hex[1]);
  to_hex(&cold_h, sizeof cold_h, hex[2]);

  struct kid k;
  CHECK("the child starts", spawn(&k, handles, NULL));
  CHECK("the child opened the handle and saw the parent's values", ask(&k, NULL, "opened"));
  train(param, expect, 0, steps / 2, s);
  uint64_t moved_before = stat_of("migrations_to_host") + stat_of("migrations_to_gpu");
  CHECK("the child wrote while the parent paged", ask(&k, "write", "written"));
  train(param, expect, steps / 2, steps, s);
  check(cudaMemcpy(host, shared, SHARED_BYTES, cudaMemcpyDeviceToHost), "cudaMemcpy");
  CHECK("the parent sees the child's writes", mismatches(host, 'B', SHARED_BYTES) == 0);
  fill(host, 'C', SHARED_BYTES);
  check(cudaMemcpy(shared, host, SHARED_BYTES, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  CHECK("the child sees the parent's later writes", ask(&k, "check", "C seen"));
  CHECK("the driver's doors open and close it too", ask(&k, "driver", "driver doors ok"));
  CHECK("closing a handle waits for work queued on its range", ask(&k, "queued", "queued ok"));
  CHECK("handles that name nothing are refused, others pass through", ask(&k, "strangers", "strangers refused"));
  CHECK("the child opens, reads and writes memory on a host frame", ask(&k, "host", "host ok"));
  check(cudaMemcpy(host, cold, COLD_BYTES, cudaMemcpyDeviceToHost), "cudaMemcpy");
  CHECK("... and the parent sees its writes there", mismatches(host, 'I', COLD_BYTES) == 0);
  CHECK("the child closes it", ask(&k, "close", "closed"));
  CHECK("the child exits 0", reap(&k) == 0);

  struct kid off;
  CHECK("a child with PSSHIM_DISABLE=1 starts", spawn(&off, handles, "PSSHIM_DISABLE=1"));
  CHECK("... and cannot open psshim's handle", ask(&off, NULL, "open failed") && reap(&off) == 1);

  uint64_t bad = 0, n = LAYER_BYTES / 4;
  for (int l = 0; l < LAYERS; l++) {
    check(cudaMemcpy(host, param[l], LAYER_BYTES, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (uint64_t i = 0; i < n; i++)
      bad += host[i] != expect[(uint64_t)l * n + i];
  }
  uint64_t moved = stat_of("migrations_to_host") + stat_of("migrations_to_gpu");
  printf("ipc_sim: %d steps, chunk moves %llu before the child wrote, %llu in all\n", steps,
         (unsigned long long)moved_before, (unsigned long long)moved);
  CHECK("the training values are intact", bad == 0);
  CHECK("the pager moved chunks meanwhile", moved_before > 0 && moved > moved_before);
  check(cudaFree(shared), "cudaFree");
  free(host), free(expect);
  return failures ? 1 : 0;
}
