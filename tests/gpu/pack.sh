#!/usr/bin/env bash
# Builds psshim here (release) and packs what the GPU machine needs into .gpu/, which the
# device call carries: libpsshim.so, psshim-report, the driver probe, and libunwind (the
# GPU machine has no package registry and may lack it).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -f build-gpu/build.ninja ] || meson setup build-gpu --buildtype=release -Dtoolkit="${CUDA_HOME:-/usr/local/cuda}" >/dev/null
ninja -C build-gpu >/dev/null
rm -rf .gpu && mkdir -p .gpu
cp build-gpu/libpsshim.so build-gpu/tools/psshim-report build-gpu/tests/integration/driver_probe .gpu/
for lib in $(ldd build-gpu/libpsshim.so build-gpu/tools/psshim-report | awk '/libunwind|libjemalloc/ {print $3}' | sort -u); do
  cp -L "$lib" .gpu/
done
ls -la .gpu
