#!/usr/bin/env bash
# Builds a bench/ driver-API microbenchmark on the GPU machine: $1 the output, $2 the source
# (default bench/remap_stall.c; a .cu file is built with nvcc); the driver API and CUPTI,
# which toolkits keep in lib64 or under extras/CUPTI (found at run time through the rpath).
set -euo pipefail
out=$(realpath -m "$1")
src=${2:-bench/remap_stall.c}
cd "$(dirname "$0")/../.."
cuda=${CUDA_HOME:-/usr/local/cuda}
case $src in
*.cu) compiler=("$cuda/bin/nvcc" -O2) ;;
*) compiler=(cc -O2 -pthread) ;;
esac
"${compiler[@]}" -I"$cuda/include" -I"$cuda/extras/CUPTI/include" "$src" -L"$cuda/lib64" \
  -L"$cuda/extras/CUPTI/lib64" -Xlinker -rpath -Xlinker "$cuda/lib64:$cuda/extras/CUPTI/lib64" -lcuda -lcupti -o "$out"
