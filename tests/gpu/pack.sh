#!/usr/bin/env bash
# Builds psshim here (release) and packs what the GPU machine needs into .gpu/, which the
# device call carries: libpsshim.so, psshim-report, the driver probe, and libunwind (the
# GPU machine has no package registry and may lack it). Each library's build is written
# beside it (LIB.commit, read by bench/paging_sweep.py into each run), and .gpu/commit
# names the main one.
# PACK_BASE=COMMIT: also libpsshim-base.so, built from that commit, for before/after runs
# in one call (bench/paging_sweep.py --psshim-lib-base, method psshim-auto-base).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -f build-gpu/build.ninja ] || meson setup build-gpu --buildtype=release -Dtoolkit="${CUDA_HOME:-/usr/local/cuda}" >/dev/null
ninja -C build-gpu >/dev/null
rm -rf .gpu && mkdir -p .gpu
cp build-gpu/libpsshim.so build-gpu/tools/psshim-report build-gpu/tests/integration/driver_probe .gpu/
git describe --always --dirty | tee .gpu/commit >.gpu/libpsshim.so.commit
for lib in $(ldd build-gpu/libpsshim.so build-gpu/tools/psshim-report | awk '/libunwind|libjemalloc/ {print $3}' | sort -u); do
  cp -L "$lib" .gpu/
done
# A worktree at `rev`, its libpsshim.so copied to .gpu/$2.
build_at() { # rev, output name
  local wt=/tmp/psshim-build-$2
  git worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
  git worktree add --detach -q "$wt" "$1"
  meson setup "$wt/build" "$wt" --buildtype=release -Dtoolkit="${CUDA_HOME:-/usr/local/cuda}" >/dev/null
  ninja -C "$wt/build" libpsshim.so >/dev/null
  cp "$wt/build/libpsshim.so" ".gpu/$2"
  git -C "$wt" rev-parse --short HEAD >".gpu/$2.commit"
  git worktree remove --force "$wt"
}
[ -z "${PACK_BASE:-}" ] || build_at "$PACK_BASE" libpsshim-base.so
ls -la .gpu
# The device call carries the working tree's tracked and untracked files and .gpu, at most
# 64 MiB in all, and refuses more: say so here, where results can still be left out.
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 -r stat -c %s 2>/dev/null |
  awk '{s += $1} END {print s + 0}')
carried=$((tree + $(du -sb .gpu | cut -f1)))
echo "pack: the device call would carry $((carried >> 20)) MiB of the 64 MiB it takes"
[ "$carried" -lt $((60 << 20)) ] || echo "pack: warning: within 4 MiB of the device tool's 64 MiB: leave large results out" >&2
