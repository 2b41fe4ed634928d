#!/usr/bin/env bash
# The program set (bench/program_set.py) on the GPU machine, in parts that fit one call:
#   tests/gpu/pack.sh                                          # here: build and pack .gpu/
#   device run (carry .gpu): bash tests/gpu/program_set.sh [NAME,...]
# Writes $OUT/program_set.json (merge the parts' rows into bench/results/program_set.json)
# and $OUT/program_set_runs.tar.gz (every run's output and statistics; traces under 4 MiB
# compressed). A table is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/psshim-program-set-out}
mkdir -p "$OUT"
RUNS=$(mktemp -d /tmp/program_set.XXXXXX)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCHINDUCTOR_CACHE_DIR=$RUNS/inductor TRITON_CACHE_DIR=$RUNS/triton
export LD_LIBRARY_PATH=$PWD/.gpu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
python3 bench/program_set.py --lib .gpu/libpsshim.so --report .gpu/psshim-report ${1:+--only "$1"} \
  --out "$OUT/program_set.json" --runs "$RUNS" --commit "$(cat .gpu/commit)"
rc=$?
for t in "$RUNS"/*.trace; do
  [ -f "$t" ] && gzip -1 "$t" && [ "$(stat -c %s "$t.gz")" -gt $((4 << 20)) ] && rm -f "$t.gz"
done
tar -C "$RUNS" -czf "$OUT/program_set_runs.tar.gz" --exclude=inductor --exclude=triton .
exit $rc
