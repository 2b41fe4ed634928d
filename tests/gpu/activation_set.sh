#!/usr/bin/env bash
# The activation set (bench/activation_set.py): ResNet-50 and the demo GPT without
# activation checkpointing, each natively and under psshim at half its native peak, beside
# psshim-report's LEAST TRAFFIC at that budget. Here, first:
#   tests/gpu/pack.sh && git describe --always --dirty > .gpu/commit
# then one device call carrying .gpu (timeout_s 600): bash tests/gpu/activation_set.sh
# In $OUT: activation_set.json (bench/results/activation_set.json when committed),
# activation_set.log, and the runs' logs, JSON, psshim statistics, traces and reports in
# activation_set_runs.tar.gz; the table printed last. ACTIVATION_SET_ARGS adds options
# (--workloads gpt-demo, --steps 20, --timeout 300, ...).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit
G=$PWD/.gpu
OUT=${OUT:-/tmp/psshim-activation-set}
W=/tmp/activation-set
rm -rf "$W" && mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=$G${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
log=$OUT/activation_set.log
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
} >"$log" 2>&1
# shellcheck disable=SC2086  # ACTIVATION_SET_ARGS is words
python3 bench/activation_set.py --psshim-lib "$G/libpsshim.so" --out "$W/activation_set.json" \
  ${ACTIVATION_SET_ARGS:-} >>"$log" 2>&1
echo "activation_set.sh: exit $?" >>"$log"
cp "$W/activation_set.json" "$OUT/" 2>/dev/null
tar czf "$OUT/activation_set_runs.tar.gz" -C "$W" activation_set_runs 2>/dev/null
tail -n 12 "$log"
true
