#!/usr/bin/env bash
# One device call (after tests/gpu/pack.sh here; device run: bash tests/gpu/sweep_auto.sh,
# carrying .gpu): bench/remap_stall.c, then the paging sweep on the 2.68B GPT: auto and
# static at 1.25x and 1.5x, auto at 2x and 3x (the same native peak). Results in $OUT:
# remap_stall_$RUN.txt, sweep_$RUN{,_hi}.{json,png}, sweep_$RUN.log; the tables printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
G=$PWD/.gpu
OUT=${OUT:-/tmp/psshim-sweep-out}
RUN=${SWEEP_RUN:-auto}
W=/tmp/sweep-work
mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=$G${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
tests/gpu/build_remap_stall.sh "$W/remap_stall" &&
  "$W/remap_stall" >"$OUT/remap_stall_$RUN.txt"
sweep() { # name, then paging_sweep arguments
  local name=$1
  shift
  python3 bench/paging_sweep.py --psshim-lib "$G/libpsshim.so" --preset gpt2.7b --out "$W/$name.json" "$@" \
    >>"$OUT/sweep_$RUN.log" 2>&1
  cp "$W/$name.json" "$W/$name.png" "$OUT/" 2>/dev/null
}
sweep "sweep_$RUN" --ratios 1.25,1.5 --methods psshim-auto,psshim-static --timeout 120 --max-total-s 200
peak=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['peak_bytes'] or '')" "$W/sweep_$RUN.json")
[ -n "$peak" ] && sweep "sweep_${RUN}_hi" --ratios 2,3 --methods psshim-auto --peak "$peak" --timeout 200 \
  --max-total-s "${SWEEP_HI_MAX_S:-330}"
echo "== remap_stall =="
cat "$OUT/remap_stall_$RUN.txt"
echo "== sweeps =="
sed -n "/^ratio  budget/,\$p" "$OUT/sweep_$RUN.log" | grep -v "^\s*$"
true
