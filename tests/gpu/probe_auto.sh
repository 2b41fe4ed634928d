#!/usr/bin/env bash
# Where does psshim auto's time go on the 2.68B GPT? One device call (after tests/gpu/pack.sh
# here; device run: bash tests/gpu/probe_auto.sh, carrying .gpu; results land in $OUT):
# 1. bench/remap_stall.c: does a remap beside running work slow the GPU?
# 2. the paging sweep at 1.25x and 1.5x, auto and static, with the pager's per-step costs;
# 3. auto at 1.25x with PSSHIM_RUNAHEAD=$PROBE_RUNAHEAD (default 2048);
# 4. a PSSHIM_TRACE of auto at 1.25x ($PROBE_TRACE_STEPS steps, default 14, gzipped) to
#    replay with trace_replay here.
# PROBE_ONLY=remap runs 1 alone; PROBE_ONLY=trace runs 1 and 4 (the budget from PROBE_PEAK).
set -uo pipefail
cd "$(dirname "$0")/../.."
G=$PWD/.gpu
OUT=${OUT:-/tmp/psshim-probe-out}
RUN=${PROBE_RUN:-probe}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$G${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
tests/gpu/build_remap_stall.sh /tmp/remap_stall &&
  /tmp/remap_stall | tee "$OUT/remap_stall_$RUN.txt"
[ "${PROBE_ONLY:-}" = remap ] && exit 0
if [ -z "${PROBE_ONLY:-}" ]; then
python3 bench/paging_sweep.py --psshim-lib "$G/libpsshim.so" --preset gpt2.7b --ratios "${PROBE_RATIOS:-1.25,1.5}" \
  --methods psshim-auto,psshim-static --timeout 150 --max-total-s 330 --out "$OUT/sweep_$RUN.json" 2>&1 |
  tail -14 | tee "$OUT/sweep_$RUN.txt"
peak=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['peak_bytes'] or '')" "$OUT/sweep_$RUN.json")
fi
peak=${PROBE_PEAK:-$peak}
if [ -n "$peak" ]; then
  budget=$((peak * 4 / 5))
  [ -z "${PROBE_ONLY:-}" ] && PSSHIM_RUNAHEAD=${PROBE_RUNAHEAD:-2048} python3 bench/paging_sweep.py --psshim-lib "$G/libpsshim.so" --preset gpt2.7b \
    --ratios 1.25 --methods psshim-auto --peak "$peak" --timeout 150 --max-total-s 160 \
    --out "$OUT/sweep_${RUN}_runahead.json" --plot /tmp/runahead.png 2>&1 | tail -5 | tee "$OUT/sweep_${RUN}_runahead.txt"
  LD_PRELOAD=$G/libpsshim.so PSSHIM_GPU_BUDGET=$budget PSSHIM_POLICY=auto PSSHIM_TRACE=/tmp/auto.trace \
    timeout 200 python3 bench/gpt_train.py --preset gpt2.7b --steps ${PROBE_TRACE_STEPS:-14} --warmup 3 --deterministic >/tmp/traced.log 2>&1
  echo "traced run: rc $? budget $budget"; tail -3 /tmp/traced.log
  gzip -c /tmp/auto.trace >"$OUT/auto_125_$RUN.trace.gz" && ls -la "$OUT"
fi
echo "== probe =="
cat "$OUT/remap_stall_$RUN.txt" "$OUT/sweep_$RUN.txt" "$OUT/sweep_${RUN}_runahead.txt" 2>/dev/null
true
