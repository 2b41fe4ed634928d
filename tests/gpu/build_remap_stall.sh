#!/usr/bin/env bash
# Builds bench/remap_stall.c on the GPU machine into $1: the driver API and CUPTI, which
# toolkits keep in lib64 or under extras/CUPTI (found at run time through the rpath).
set -euo pipefail
out=$(realpath -m "$1")
cd "$(dirname "$0")/../.."
cuda=${CUDA_HOME:-/usr/local/cuda}
cc -O2 -I"$cuda/include" -I"$cuda/extras/CUPTI/include" bench/remap_stall.c -L"$cuda/lib64" \
  -L"$cuda/extras/CUPTI/lib64" -Wl,-rpath,"$cuda/lib64:$cuda/extras/CUPTI/lib64" -lcuda -lcupti -o "$out"
