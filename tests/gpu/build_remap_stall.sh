#!/usr/bin/env bash
# Builds a bench/ driver-API program on the GPU machine: $1 the output, $2 the source
# (default bench/remap_stall.c); the driver API and CUPTI, which toolkits keep in lib64 or
# under extras/CUPTI (found at run time through the rpath).
set -euo pipefail
out=$(realpath -m "$1")
cd "$(dirname "$0")/../.."
cuda=${CUDA_HOME:-/usr/local/cuda}
cc -O2 -pthread -I"$cuda/include" -I"$cuda/extras/CUPTI/include" "${2:-bench/remap_stall.c}" -L"$cuda/lib64" \
  -L"$cuda/extras/CUPTI/lib64" -Wl,-rpath,"$cuda/lib64:$cuda/extras/CUPTI/lib64" -lcuda -lcupti -o "$out"
