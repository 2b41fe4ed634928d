// Kernels for driver_api.c, compiled to PTX on the device and loaded with cuModuleLoadData.
extern "C" __global__ void scale_add(float *y, const float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * y[i] + x[i];
}
extern "C" __global__ void square_sum(const float *y, double *out, int n) {
  __shared__ double part[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  part[threadIdx.x] = i < n ? (double)y[i] * y[i] : 0;
  __syncthreads();
  for (int s = 128; s; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (!threadIdx.x) atomicAdd(out, part[0]);
}
