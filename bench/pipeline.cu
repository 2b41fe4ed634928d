// The paging mechanism alone: a layer pipeline written as an ordinary CUDA application,
// for psshim to take over (LD_PRELOAD or the psshim launcher). L layers of S MiB weights,
// each its own cudaMalloc; one step is forward over layers 0..L-1 (a kernel reading its
// layer PASSES times) then backward over L-1..0 (a kernel reading and writing it), with
// ITERS multiply-add rounds per 16-byte element and pass (bench/pipeline.h: the shape,
// shared with tests/integration/pipeline_sim.c). STEPS steps, the first WARMUP not in the
// median. Then the weights are copied back with cudaMemcpy and hashed.
//
// Settings from the environment or as KEY=VALUE arguments: L (48), S_MB (256), PASSES (4),
// ITERS (0), STEPS (8), WARMUP (3). Prints one JSON line on stdout:
//   {"step_s_median", "steps": [every step's seconds], "weights_checksum": "<16 hex>",
//    "bytes_per_step_each_way": L*S, "psshim": whether libpsshim.so is loaded, ...}
// Deterministic: the checksum depends on the settings alone, not on the card's timing.
// Build (the runtime shared, so that a preloaded cudaMalloc is the one called):
//   nvcc -O2 -arch=sm_90 -cudart shared -o pipeline bench/pipeline.cu
#include "pipeline.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <vector>

static void check(cudaError_t e, const char *what, int line)
{
  if (e != cudaSuccess) {
    fprintf(stderr, "pipeline: %s failed: %s (line %d)\n", what, cudaGetErrorString(e), line);
    exit(1);
  }
}
#define CK(call) check((call), #call, __LINE__)
// A launch's own errors (bad configuration) at once; faults inside it at the next sync.
#define CK_LAUNCH() check(cudaGetLastError(), "kernel launch", __LINE__)

// Where forward's sums would go: a module variable, not an allocation, so psshim neither
// serves it nor counts it among the chunks a launch touches.
__device__ uint32_t forward_sink;

__global__ void init_kernel(uint4 *w, uint64_t n, uint32_t layer)
{
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    w[i] = make_uint4(pipe_init_word(layer, 4 * i), pipe_init_word(layer, 4 * i + 1), pipe_init_word(layer, 4 * i + 2),
                      pipe_init_word(layer, 4 * i + 3));
}

__global__ void forward_kernel(const uint4 *w, uint64_t n, int passes, int iters)
{
  uint32_t sum = 0;
  for (int p = 0; p < passes; p++) // the salt keeps each pass's work its own
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
      uint4 v = w[i];
      sum += pipe_work(v.x, v.y, v.z, v.w, (uint32_t)p, iters);
    }
  if (sum == PIPE_SINK_MAGIC)
    forward_sink = sum;
}

__global__ void backward_kernel(uint4 *w, uint64_t n, int iters)
{
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    uint4 v = w[i];
    pipe_update(&v.x, &v.y, &v.z, &v.w, iters);
    w[i] = v;
  }
}

int main(int argc, char **argv)
{
  pipe_config c = {48, 256, 4, 0, 8, 3};
  char err[256];
  if (!pipe_config_read(&c, argc, argv, err, sizeof err)) {
    fprintf(stderr, "pipeline: %s\n", err);
    return 2;
  }
  const uint64_t bytes = pipe_layer_bytes(&c), n = pipe_layer_elems(&c);
  double t_setup = pipe_now_s();
  int dev = 0, sms = 0;
  CK(cudaSetDevice(dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const unsigned blocks = (unsigned)sms * 8, threads = 256; // grid-stride: the values do not depend on it
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  std::vector<uint4 *> w((size_t)c.layers);
  for (long l = 0; l < c.layers; l++) {
    CK(cudaMalloc((void **)&w[(size_t)l], bytes));
    init_kernel<<<blocks, threads, 0, s>>>(w[(size_t)l], n, (uint32_t)l);
    CK_LAUNCH();
  }
  CK(cudaStreamSynchronize(s));
  t_setup = pipe_now_s() - t_setup;

  std::vector<double> steps;
  for (long step = 0; step < c.steps; step++) {
    double t0 = pipe_now_s();
    for (long j = 0; j < 2 * c.layers; j++) {
      uint4 *layer = w[(size_t)pipe_layer_at(j, c.layers)];
      if (pipe_writes_at(j, c.layers))
        backward_kernel<<<blocks, threads, 0, s>>>(layer, n, (int)c.iters);
      else
        forward_kernel<<<blocks, threads, 0, s>>>(layer, n, (int)c.passes, (int)c.iters);
      CK_LAUNCH();
    }
    CK(cudaStreamSynchronize(s));
    steps.push_back(pipe_now_s() - t0);
  }
  double t_hash = pipe_now_s();
  std::vector<unsigned char> host(bytes);
  pipe_hash h;
  pipe_hash_init(&h);
  for (long l = 0; l < c.layers; l++) {
    CK(cudaMemcpy(host.data(), w[(size_t)l], bytes, cudaMemcpyDeviceToHost));
    pipe_hash_add(&h, host.data(), bytes);
  }
  t_hash = pipe_now_s() - t_hash;
  for (long l = 0; l < c.layers; l++)
    CK(cudaFree(w[(size_t)l]));
  CK(cudaStreamDestroy(s));
  // Whether psshim served the allocations: its exported query is there only when it is loaded.
  bool psshim = dlsym(RTLD_DEFAULT, "psshim_owns") != NULL;

  char extra[96];
  snprintf(extra, sizeof extra, "\"setup_s\": %.3f, \"hash_s\": %.3f", t_setup, t_hash);
  pipe_print_result(&c, steps.data(), pipe_hash_end(&h), psshim, extra);
  return fflush(stdout) == 0 ? 0 : 1;
}
