#!/usr/bin/env bash
# The GPU checks, in one device call:
#   tests/gpu/pack.sh                      # here: build and pack .gpu/
#   device run: bash tests/gpu/run.sh      # carry .gpu; results land in $OUT
# Prints a short table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
G=$PWD/.gpu
OUT=${OUT:-/tmp/psshim-gpu-out}  # what comes back (at most 8 files): the results below
W=/tmp/psshim-gpu                # everything else
mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=$G${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
results=()
record() { results+=("$(printf '%-46s %s' "$1" "$2")"); }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

if "$G/driver_probe"; then record "driver table vs the real libcuda" ok; else record "driver table vs the real libcuda" FAILED; fi

LD_PRELOAD=$G/libpsshim.so PSSHIM_STATS=$W/smoke_stats.json python3 -c "
import torch
x = torch.randn(1 << 20, device='cuda'); y = (x * 2).sum().item()
print('torch under psshim: sum', y, 'alloc conf', __import__('os').environ.get('PYTORCH_CUDA_ALLOC_CONF'))"
if python3 -c "import json,sys; s=json.load(open('$W/smoke_stats.json')); print('psshim stats:', s); sys.exit(0 if s['allocs'] > 0 else 1)"; then
  record "libpsshim.so loads into torch, serves allocs" ok
else
  record "libpsshim.so loads into torch, serves allocs" FAILED
fi

# torch's memory counters under backend:cudaMallocAsync come from the current pool's
# attributes, which psshim answers for its chunks: they must equal psshim's live bytes.
LD_PRELOAD=$G/libpsshim.so python3 -c "
import ctypes, json, sys, torch
lib = ctypes.CDLL(None)
lib.psshim_stats_json.restype, lib.psshim_stats_json.argtypes = ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t]
buf = ctypes.create_string_buffer(1 << 16)
def live():
    lib.psshim_stats_json(buf, len(buf))
    return json.loads(buf.value)['live_bytes']
xs = [torch.empty(n, dtype=torch.uint8, device='cuda') for n in (1 << 20, 3 << 20, 5 << 22)]
torch.cuda.synchronize()
a, la = torch.cuda.memory_allocated(), live()
del xs[2]
torch.cuda.synchronize()
b, lb, high = torch.cuda.memory_allocated(), live(), torch.cuda.max_memory_allocated()
print(f'torch memory_allocated {a} then {b}, psshim live bytes {la} then {lb}, max_memory_allocated {high}')
sys.exit(0 if a == la and b == lb and b < a <= high else 1)"
record "torch memory_allocated = psshim live bytes" "$([ $? = 0 ] && echo ok || echo FAILED)"

if [ "${GPU_BUDGET_RUNS:-1}" = 1 ]; then
  python3 bench/budget_runs.py --lib "$G/libpsshim.so" --out "$OUT/budget_runs.json" --logs /tmp/runs \
    --steps 20 -- --preset demo
  record "GPT losses identical at 100/50/25% budget" "$([ $? = 0 ] && echo ok || echo FAILED)"
fi

if [ "${GPU_TRACE:-1}" = 1 ]; then
  # A traced run of a small GPT, the report in every form, and the tracing overhead: the
  # same run under psshim with and without PSSHIM_TRACE, alternated, medians of medians.
  small=(--layers 6 --hidden 512 --heads 8 --seq 512 --batch 8 --steps 30 --warmup 5 --vocab 8192)
  LD_PRELOAD=$G/libpsshim.so PSSHIM_TRACE=$OUT/gpt_small.trace python3 bench/gpt_train.py "${small[@]}" \
    --json "$W/trace_run.json" >"$W/trace_run.log" 2>&1
  "$G/psshim-report" "$OUT/gpt_small.trace" --perfetto "$OUT/gpt_small.perfetto.json" \
    --html "$OUT/gpt_small.html" --chunk-size >"$OUT/gpt_small.report.txt" 2>&1
  record "trace written and reported (exit $?)" "$(ls -la "$OUT/gpt_small.trace" | awk '{print $5}') bytes"
  head -60 "$OUT/gpt_small.report.txt"
  for i in 1 2 3; do
    for mode in plain traced; do
      extra=(); [ $mode = traced ] && extra=(env PSSHIM_TRACE=/tmp/overhead_$i.trace)
      "${extra[@]}" env LD_PRELOAD=$G/libpsshim.so python3 bench/gpt_train.py "${small[@]}" \
        --json "$W/overhead_${mode}_$i.json" >/dev/null 2>&1
    done
  done
  python3 - "$W" <<'PY' | tee "$OUT/trace_overhead.txt"
import json, statistics, sys
out = sys.argv[1]
med = {m: [json.load(open(f"{out}/overhead_{m}_{i}.json"))["median_step_s"] for i in (1, 2, 3)] for m in ("plain", "traced")}
p, t = statistics.median(med["plain"]), statistics.median(med["traced"])
print(f"tracing overhead: step {p*1e3:.2f} ms untraced vs {t*1e3:.2f} ms traced (medians of 3 runs x 25 steps): {100*(t/p-1):+.1f}%")
PY
fi

if [ "${GPU_ALLOC_LATENCY:-1}" = 1 ]; then
  cc -O2 -I/usr/local/cuda/include bench/alloc_latency.c -L/usr/local/cuda/lib64 -lcudart -o /tmp/alloc_latency &&
    /tmp/alloc_latency 20000 >"$W/alloc_native.jsonl" &&
    LD_PRELOAD=$G/libpsshim.so /tmp/alloc_latency 20000 >"$W/alloc_psshim.jsonl"
  paste -d' ' "$W/alloc_native.jsonl" "$W/alloc_psshim.jsonl" | python3 -c "
import json, sys
for line in sys.stdin:
    a, b = line.strip().split('} {')
    n, p = json.loads(a + '}'), json.loads('{' + b)
    print(f\"alloc+free pair {n['size']:>9} B: driver pool {n['median_ns']:>7.0f} ns, psshim {p['median_ns']:>7.0f} ns (median of {n['pairs']})\")
" | tee "$OUT/alloc_latency.txt"
fi

{
echo
echo "== psshim GPU checks =="
printf '%s\n' "${results[@]}"
[ -f "$OUT/alloc_latency.txt" ] && cat "$OUT/alloc_latency.txt"
[ -f "$OUT/trace_overhead.txt" ] && cat "$OUT/trace_overhead.txt"
[ -f "$OUT/budget_runs.json" ] && python3 bench/budget_runs.py --table "$OUT/budget_runs.json"
} | tee "$OUT/gpu_checks.txt"
true
