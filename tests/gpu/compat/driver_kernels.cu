// Kernels for driver_api.c, compiled to PTX on the device and loaded with cuModuleLoadData.
extern "C" __global__ void scale_add(float *y, const float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * y[i] + x[i];
}
// The sum of squares in a fixed order (no atomics), so that two runs agree bitwise and the
// compatibility matrix can hold psshim's run to the bitwise rule: each block's partial sum,
// then one block adds the partials.
__device__ void block_sum(double *part) {
  for (int s = 128; s; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
}
extern "C" __global__ void square_sum(const float *y, double *partials, int n) {
  __shared__ double part[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  part[threadIdx.x] = i < n ? (double)y[i] * y[i] : 0;
  __syncthreads();
  block_sum(part);
  if (!threadIdx.x) partials[blockIdx.x] = part[0];
}
extern "C" __global__ void sum_partials(const double *partials, double *out, int count) {
  __shared__ double part[256];
  double own = 0;
  for (int k = threadIdx.x; k < count; k += 256) own += partials[k];
  part[threadIdx.x] = own;
  __syncthreads();
  block_sum(part);
  if (!threadIdx.x) *out = part[0];
}
