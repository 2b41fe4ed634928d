// A plain CUDA C program on the runtime API (built with -cudart shared, so psshim's runtime
// doors see it): gradient descent on a least-squares fit, with cudaMalloc for the model and
// cudaMallocAsync/cudaFreeAsync for each step's temporaries. Prints COMPAT {json} last.
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)

__global__ void residual(const float *a, const float *w, const float *b, float *r, int n, int d) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0;
  for (int j = 0; j < d; j++) s += a[(size_t)i * d + j] * w[j];
  r[i] = s - b[i];
}
__global__ void gradient(const float *a, const float *r, float *g, int n, int d) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float s = 0;
  for (int i = 0; i < n; i++) s += a[(size_t)i * d + j] * r[i];
  g[j] = s / n;
}
__global__ void update(float *w, const float *g, float lr, int d) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < d) w[j] -= lr * g[j];
}

int main() {
  const int n = 16384, d = 1024, iters = 40;
  std::vector<float> ha((size_t)n * d), hb(n);
  unsigned s = 1;
  for (auto &x : ha) x = (s = s * 1664525u + 1013904223u) / 4294967296.0f - 0.5f;
  for (auto &x : hb) x = (s = s * 1664525u + 1013904223u) / 4294967296.0f;
  float *a, *b, *w;
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  CK(cudaMalloc(&a, ha.size() * 4));
  CK(cudaMalloc(&b, n * 4));
  CK(cudaMalloc(&w, d * 4));
  CK(cudaMemcpy(a, ha.data(), ha.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b, hb.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(w, 0, d * 4));
  std::vector<double> losses, times;
  for (int it = 0; it < iters; it++) {
    auto t0 = std::chrono::steady_clock::now();
    float *r, *g;
    CK(cudaMallocAsync(&r, n * 4, st));
    CK(cudaMallocAsync(&g, d * 4, st));
    residual<<<(n + 255) / 256, 256, 0, st>>>(a, w, b, r, n, d);
    gradient<<<(d + 255) / 256, 256, 0, st>>>(a, r, g, n, d);
    update<<<(d + 255) / 256, 256, 0, st>>>(w, g, 0.5f, d);
    std::vector<float> hr(n);
    CK(cudaMemcpyAsync(hr.data(), r, n * 4, cudaMemcpyDeviceToHost, st));
    CK(cudaFreeAsync(r, st));
    CK(cudaFreeAsync(g, st));
    CK(cudaStreamSynchronize(st));
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    double l = 0;
    for (float x : hr) l += (double)x * x;
    losses.push_back(l / n);
  }
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(w));
  printf("COMPAT {\"losses\": [");
  for (int i = 0; i < iters; i++) printf("%s\"%.17g\"", i ? ", " : "", losses[i]);
  double ms = times[iters / 2];
  printf("], \"step_ms\": %.3f, \"peak_reserved\": %zu}\n", ms, ((size_t)n * d + 2 * n + 2 * d) * 4);
  return 0;
}
