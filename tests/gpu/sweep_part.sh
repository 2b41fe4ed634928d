#!/usr/bin/env bash
# One device call's part of the paging sweep on the 2.68B GPT; bench/results/
# paging_sweep_gpt2.7b.json is merged from such parts (python3 bench/paging_sweep.py --merge).
# Here first: tests/gpu/pack.sh (PACK_BASE=<commit> for the psshim-auto-base method); then on
# the device, carrying .gpu:
#   SWEEP_RATIOS=1,1.25,1.5 SWEEP_NAME=part1 bash tests/gpu/sweep_part.sh
# SWEEP_METHODS (default psshim-auto,fsdp-offload), SWEEP_TIMEOUT (seconds per run, default
# 200), SWEEP_MAX_S (no run starts after this many seconds, default 540), SWEEP_STEPS and
# SWEEP_WARMUP (default 12 and 7: the median of the last 5; at 3x and over, psshim auto's
# steps are still settling at step 12, so 20 and 15 there). Every part uses the
# native peak of bench/results/README.md, so that budgets agree across parts. In $OUT:
# $SWEEP_NAME.json, .png and .log, and the runs' JSON, logs and psshim statistics in
# ${SWEEP_NAME}_runs.tar.gz; the tables printed last.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit
G=$PWD/.gpu
OUT=${OUT:-/tmp/psshim-sweep-part}
NAME=${SWEEP_NAME:-sweep_part}
W=/tmp/sweep-part
rm -rf "$W" && mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=$G${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
base=()
[ -f "$G/libpsshim-base.so" ] && base=(--psshim-lib-base "$G/libpsshim-base.so")
python3 bench/paging_sweep.py --psshim-lib "$G/libpsshim.so" "${base[@]}" --preset gpt2.7b --peak 44274838528 \
  --ratios "${SWEEP_RATIOS:?SWEEP_RATIOS: the ratios of this part}" \
  --methods "${SWEEP_METHODS:-psshim-auto,fsdp-offload}" --steps "${SWEEP_STEPS:-12}" --warmup "${SWEEP_WARMUP:-7}" --timeout "${SWEEP_TIMEOUT:-200}" \
  --max-total-s "${SWEEP_MAX_S:-540}" --out "$W/$NAME.json" >"$OUT/$NAME.log" 2>&1
echo "paging_sweep: exit $? (build $(cat "$G/commit" 2>/dev/null || echo unknown))" >>"$OUT/$NAME.log"
cp "$W/$NAME.json" "$W/$NAME.png" "$OUT/" 2>/dev/null
tar czf "$OUT/${NAME}_runs.tar.gz" -C "$W" "${NAME}_runs" 2>/dev/null
sed -n '/^ratio  budget/,$p' "$OUT/$NAME.log"
true
