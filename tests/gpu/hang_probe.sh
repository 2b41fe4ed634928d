#!/usr/bin/env bash
# Diagnoses a stalled auto-paging run on the GPU: runs gpt2.7b under PSSHIM_POLICY=auto at
# a budget of 27.5 GiB (1.5x below its peak) with the given PSSHIM_RUNAHEAD values, and
# when a run stalls, dumps every thread's stack (gdb if present, else the kernel's view).
# Usage (device, carrying .gpu): bash tests/gpu/hang_probe.sh 256 60000
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/psshim-probe}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.gpu PYTHONUNBUFFERED=1
which gdb eu-stack py-spy 2>/dev/null
for ra in "$@"; do
  log=$OUT/probe_ra$ra.log
  env LD_PRELOAD=$PWD/.gpu/libpsshim.so PSSHIM_POLICY=auto PSSHIM_RUNAHEAD=$ra PSSHIM_GPU_BUDGET=29513000000 \
    PSSHIM_STATS=$OUT/probe_ra$ra.json python3 bench/gpt_train.py --preset gpt2.7b --steps 11 --warmup 6 \
    --deterministic >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 90); do sleep 1; kill -0 $pid 2>/dev/null || break; done
  if kill -0 $pid 2>/dev/null; then
    echo "runahead $ra: stalled; stacks:" | tee -a "$log"
    if command -v gdb >/dev/null; then
      gdb -p $pid -batch -ex "thread apply all bt 14" >>"$log" 2>&1
    else
      for t in /proc/$pid/task/*; do echo "-- $t $(cat $t/comm) $(cat $t/wchan)"; cat $t/stack 2>/dev/null | head -6; done >>"$log"
    fi
    kill -9 $pid
  fi
  wait $pid 2>/dev/null
  echo "runahead $ra: $(grep -c '^step' "$log") steps: $(grep '^step' "$log" | awk '{printf "%s ", $6}')"
  [ -f $OUT/probe_ra$ra.json ] && cat $OUT/probe_ra$ra.json
done
