#!/usr/bin/env bash
# Replays a trace of the 2.68B GPT taken on the H200 (PSSHIM_TRACE; .gz or not) on the test
# driver, on this machine's CPUs, under PSSHIM_POLICY=auto at each budget ratio given, and
# prints the pager's steady iteration (PSSHIM_STATS) and psshim-report's PHASES and
# PAGE-OUTS for each: what the pager would do with that program, without a GPU.
#
#   bench/replay.sh [TRACE] [RATIO ...]
#
# TRACE defaults to the committed 3x run, bench/results/auto_3x_run54.trace.gz; RATIOs
# to 3 4. Sizes are divided by REPLAY_SCALE (4) so that the model fits this machine (at 4,
# ~10 GiB of the fake driver's memory at most, little of it touched), with REPLAY_CHUNK (2M) chunks:
# 8 MiB ones at full scale. Budget = REPLAY_PEAK (the native allocated peak, 44274838528)
# / ratio / scale. REPLAY_LIB: the library (default build/libpsshim.so); REPLAY_ENV: more
# settings for the replayed process (e.g. "PSSHIM_LOG=info").
# What it tells is counts (moves, touches of host frames, page-outs' fates), not time.
# Another program's trace at the budget it ran with (ResNet-50 of the activation set at half
# its 3.0 GiB peak): REPLAY_SCALE=1 REPLAY_CHUNK=4M REPLAY_PEAK=3212836864 bench/replay.sh TRACE 2
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
trace=${1:-$root/bench/results/auto_3x_run54.trace.gz}
shift || true
ratios=${*:-3 4}
lib=${REPLAY_LIB:-$root/build/libpsshim.so}
build=$(dirname "$lib")
scale=${REPLAY_SCALE:-4}
for f in "$lib" "$build/tests/integration/trace_replay" "$build/tools/psshim-report" "$build/tests/fakecuda/libcupti.so"; do
  [ -e "$f" ] || { echo "replay.sh: $f is missing: build first (meson setup build && ninja -C build)" >&2; exit 2; }
done
peak=${REPLAY_PEAK:-44274838528}
gib() { python3 -c "print(int($1 / 2**30) + 2)"; } # the fake driver's memory, with room
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ $trace == *.gz ]]; then
  gzip -dc "$trace" >"$work/in.trace"
  trace=$work/in.trace
fi
for ratio in $ratios; do
  budget=$(python3 -c "print(int($peak / $ratio / $scale))")
  echo "== ratio $ratio: budget $budget bytes at scale $scale"
  # shellcheck disable=SC2086 # REPLAY_ENV is a list of settings
  env LD_LIBRARY_PATH="$build/tests/fakecuda" FAKECUDA_DEVICE_MEM="$(gib "$budget")G" FAKECUDA_HOST_MEM="$(gib "$peak / $scale")G" \
    LD_PRELOAD="$lib" PSSHIM_CUPTI="$build/tests/fakecuda/libcupti.so" PSSHIM_POLICY=auto \
    PSSHIM_CHUNK_SIZE="${REPLAY_CHUNK:-2M}" PSSHIM_GPU_BUDGET="$budget" \
    PSSHIM_STATS="$work/stats.json" PSSHIM_TRACE="$work/out.trace" ${REPLAY_ENV:-} \
    "$build/tests/integration/trace_replay" --scale "$scale" "$trace"
  python3 - "$work/stats.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
keys = ("period", "steady_iterations", "steady_touches_host", "steady_migrations_to_gpu", "steady_migrations_to_host",
        "steady_reclaims", "room_page_outs", "room_ns", "steady_room_ns", "plan_builds", "owner_fetches",
        "owner_demand_fetches", "owner_missed", "late_waits", "gate_timeouts", "recalled_allocs", "recall_misses", "allocs")
print("  " + " ".join(f"{k}={s.get(k)}" for k in keys))
PY
  "$build/tools/psshim-report" "$work/out.trace" | sed -n '/^PHASES/,/^MOVES/p' | grep -v '^MOVES'
done
