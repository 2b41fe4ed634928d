"""CuPy with its own memory pool and a raw CUDA kernel: a short loop of a few launches per
iteration (a saxpy-like update of several arrays and a reduction), no torch."""
import json
import statistics
import time

import cupy as cp

update = cp.RawKernel(r'''
extern "C" __global__ void update(float *w, const float *g, float *m, float lr, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    m[i] = 0.9f * m[i] + g[i];
    w[i] -= lr * m[i];
  }
}''', "update")
n = 64 << 20  # floats per array: 256 MiB each
rng = cp.random.RandomState(1)
w = [rng.standard_normal(n, dtype=cp.float32) for _ in range(3)]
m = [cp.zeros(n, dtype=cp.float32) for _ in range(3)]
losses, times = [], []
for _ in range(20):
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for wi, mi in zip(w, m):
        g = wi * 0.01 + 0.001  # a fresh temporary per step, as a gradient would be
        update((1024,), (256,), (wi, g, mi, cp.float32(0.1), cp.uint64(n)))
    loss = sum(float(cp.sum(wi * wi)) for wi in w)
    cp.cuda.Device().synchronize()
    times.append(time.perf_counter() - t0)
    losses.append(loss)
warm = times[len(times) // 4:]
print("COMPAT " + json.dumps({"losses": [repr(x) for x in losses], "times": times,
                              "step_ms": 1e3 * statistics.median(warm),
                              "peak_reserved": cp.get_default_memory_pool().total_bytes()}), flush=True)
