#!/usr/bin/env bash
# The performance runs, in one device call (after tests/gpu/pack.sh here):
#   device run: bash tests/gpu/perf.sh      # carry .gpu; results land in $OUT
# 1. what psshim costs with nothing to move (demo GPT), 2. what observation costs (small
# GPT, many small kernels), 3. paging at budgets below the peak (demo GPT): psshim auto and
# static, FSDP2 CPU offload. Prints a short table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
G=$PWD/.gpu
OUT=${OUT:-/tmp/psshim-perf-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$G${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
small=(--layers 6 --hidden 512 --heads 8 --seq 512 --batch 8 --steps 30 --warmup 5 --vocab 8192)
python3 bench/overhead_runs.py --lib "$G/libpsshim.so" --out "$OUT/overhead_demo.json" \
  --configs native,native-async,psshim,psshim-keep -- --preset demo --steps 15 --warmup 5 | tee "$OUT/overhead_demo.txt"
python3 bench/overhead_runs.py --lib "$G/libpsshim.so" --out "$OUT/overhead_small.json" \
  --configs native,psshim,psshim-trace,psshim-observe -- "${small[@]}" | tee "$OUT/overhead_small.txt"
if [ "${PERF_SWEEP:-1}" = 1 ]; then
  python3 bench/paging_sweep.py --psshim-lib "$G/libpsshim.so" --preset demo --ratios "${SWEEP_RATIOS:-1.25,2,4}" \
    --methods "${SWEEP_METHODS:-psshim-auto,psshim-static,fsdp-offload}" --steps 8 --timeout 120 \
    --max-total-s "${SWEEP_MAX_S:-240}" --out "$OUT/paging_sweep_demo.json" 2>&1 | tail -25 | tee "$OUT/paging_sweep_demo.txt"
fi
echo "== psshim performance runs =="
cat "$OUT"/overhead_demo.txt "$OUT"/overhead_small.txt
[ -f "$OUT/paging_sweep_demo.txt" ] && tail -14 "$OUT/paging_sweep_demo.txt"
true
