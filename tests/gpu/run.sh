#!/usr/bin/env bash
# The GPU checks, in one device call (see tests/gpu/README.md):
#   tests/gpu/pack.sh                      # here: build and pack .gpu/
#   device run: bash tests/gpu/run.sh      # carry .gpu; results land in $OUT
# Prints a short table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
G=$PWD/.gpu
OUT=${OUT:-/tmp/psshim-gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$G${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
results=()
record() { results+=("$(printf '%-46s %s' "$1" "$2")"); }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

if "$G/driver_probe"; then record "driver table vs the real libcuda" ok; else record "driver table vs the real libcuda" FAILED; fi

LD_PRELOAD=$G/libpsshim.so PSSHIM_STATS=$OUT/smoke_stats.json python3 -c "
import torch
x = torch.randn(1 << 20, device='cuda'); y = (x * 2).sum().item()
print('torch under psshim: sum', y, 'alloc conf', __import__('os').environ.get('PYTORCH_CUDA_ALLOC_CONF'))"
if python3 -c "import json,sys; s=json.load(open('$OUT/smoke_stats.json')); print('psshim stats:', s); sys.exit(0 if s['allocs'] > 0 else 1)"; then
  record "libpsshim.so loads into torch, serves allocs" ok
else
  record "libpsshim.so loads into torch, serves allocs" FAILED
fi

if [ "${GPU_BUDGET_RUNS:-1}" = 1 ]; then
  python3 bench/budget_runs.py --lib "$G/libpsshim.so" --out "$OUT/budget_runs.json" --logs "$OUT/runs" \
    --steps 20 -- --preset demo
  record "GPT losses identical at 100/50/25% budget" "$([ $? = 0 ] && echo ok || echo FAILED)"
fi

if [ "${GPU_ALLOC_LATENCY:-1}" = 1 ]; then
  cc -O2 -I/usr/local/cuda/include bench/alloc_latency.c -L/usr/local/cuda/lib64 -lcudart -o /tmp/alloc_latency &&
    /tmp/alloc_latency 20000 >"$OUT/alloc_native.jsonl" &&
    LD_PRELOAD=$G/libpsshim.so /tmp/alloc_latency 20000 >"$OUT/alloc_psshim.jsonl"
  paste -d' ' "$OUT/alloc_native.jsonl" "$OUT/alloc_psshim.jsonl" | python3 -c "
import json, sys
for line in sys.stdin:
    a, b = line.strip().split('} {')
    n, p = json.loads(a + '}'), json.loads('{' + b)
    print(f\"alloc+free pair {n['size']:>9} B: driver pool {n['median_ns']:>7.0f} ns, psshim {p['median_ns']:>7.0f} ns (median of {n['pairs']})\")
" | tee "$OUT/alloc_latency.txt"
fi

echo
echo "== psshim GPU checks =="
printf '%s\n' "${results[@]}"
[ -f "$OUT/alloc_latency.txt" ] && cat "$OUT/alloc_latency.txt"
true
