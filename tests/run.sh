#!/usr/bin/env bash
# Every test: a normal build (gcc) and a sanitizer build (clang, ASan+UBSan), each with
# the debug checks on, running `meson test` (cmocka unit tests, fake-driver integration
# tests; in the sanitizer build also the fuzzers, 20 seconds each, tests/fuzz/README.md);
# a release build, to see that it carries none of the debug checks; the allocator's
# tests under ThreadSanitizer; then the unit tests of the allocator, options, policy,
# tracer and report again under valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
.ci/install-deps
toolkit=${CUDA_HOME:-/usr/local/cuda}
jobs=$(nproc)
build() { # a build folder: quiet, but a failure shows what failed
  ninja -C "$1" >"$1/ninja.log" 2>&1 || { tail -40 "$1/ninja.log" >&2; echo "tests/run.sh: building $1 failed" >&2; exit 1; }
}
run() { # name, then meson setup options
  local dir=$1; shift
  [ -f "$dir/build.ninja" ] || meson setup "$dir" -Dtoolkit="$toolkit" "$@" >/dev/null
  build "$dir"
  meson test -C "$dir" --num-processes "$jobs" --print-errorlogs
}
run build
# The debug checks (core.h's ranked locks, the allocator's invariants) are in the test
# builds and in no release build: the release library's symbol table has none of them.
checks='ps_lock_check_|ps_check_failed|psa_span_check|psa_frames_check'
[ -f build-release/build.ninja ] || meson setup build-release -Dtoolkit="$toolkit" --buildtype=release >/dev/null
build build-release
grep -qE "$checks" <<<"$(nm build/libpsshim.so)" || { echo "tests/run.sh: the test build has no debug checks" >&2; exit 1; }
if grep -E "$checks" <<<"$(nm build-release/libpsshim.so)" >&2; then
  echo "tests/run.sh: the release build carries debug checks (above)" >&2
  exit 1
fi
# UBSan only prints unless told to stop: undefined behaviour fails the test that ran it.
CC=clang UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
  run build-sanitize -Db_sanitize=address,undefined -Db_lundef=false
# The allocator's threads (workers, copy completion, the pager under several launching
# threads) under ThreadSanitizer; the other tests preload psshim into programs, which a
# TSan-built library cannot be.
[ -f build-tsan/build.ninja ] || CC=clang meson setup build-tsan -Dtoolkit="$toolkit" -Db_sanitize=thread -Db_lundef=false >/dev/null
build build-tsan
TSAN_OPTIONS=halt_on_error=1 meson test -C build-tsan --no-rebuild --print-errorlogs allocator
# Not the tests that kill or time processes on purpose (valgrind is 50x slower), nor the
# ones that run whole programs under LD_PRELOAD (those run sanitized above), nor the ten
# training loops (the ten random ones and the GPT-like one: valgrind runs one thread at a
# time, minutes each; one random loop still runs, in the unseen-copy test).
TEST_SKIP='*training_loop*' meson test -C build --no-rebuild --print-errorlogs --num-processes "$jobs" \
  --wrapper "valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite --suppressions=$PWD/tests/valgrind.supp" \
  options policy 'policy sim' 'policy period' trace_roundtrip trace_damage report observe 'driver table' allocator
