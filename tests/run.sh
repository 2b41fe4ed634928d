#!/usr/bin/env bash
# Every test: a normal build (gcc) and a sanitizer build (clang, ASan+UBSan), each
# running `meson test` (cmocka unit tests, fake-driver integration tests).
set -euo pipefail
cd "$(dirname "$0")/.."
.ci/install-deps
toolkit=${CUDA_HOME:-/usr/local/cuda}
jobs=$(nproc)
run() { # name, then meson setup options
  local dir=$1; shift
  [ -f "$dir/build.ninja" ] || meson setup "$dir" -Dtoolkit="$toolkit" "$@" >/dev/null
  ninja -C "$dir" >/dev/null
  meson test -C "$dir" --num-processes "$jobs" --print-errorlogs
}
run build
CC=clang run build-sanitize -Db_sanitize=address,undefined -Db_lundef=false
