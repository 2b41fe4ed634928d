#!/usr/bin/env bash
# The compatibility matrix on the GPU: each program of tests/gpu/compat/ natively (two runs,
# a third when they differ) and under psshim with PSSHIM_GPU_BUDGET at half its native peak
# (torch.cuda.max_memory_reserved, or the C programs' own bytes), one row each:
# exit code, loss rule and verdict, step time native and under psshim, psshim's host frames
# at peak. Writes $OUT/compat.json and $OUT/compat.txt, and every run's output in
# $OUT/compat_runs.tar.gz (a failure's first lines are what tells why).
#   tests/gpu/pack.sh                                   # here: build and pack .gpu/
#   device run (carry .gpu): bash tests/gpu/compat.sh [path/to/libpsshim.so]
# Each run is under `timeout`; a failing row does not stop the others; rows not reached by
# COMPAT_SECONDS (default 450) are written as skipped. COMPAT_ONLY="name ..." runs only those
# rows (the others are left out of the table).
set -uo pipefail
cd "$(dirname "$0")/../.."
LIB=$(realpath "${1:-.gpu/libpsshim.so}")
[ -f "$LIB" ] || { echo "compat.sh: no $LIB (run tests/gpu/pack.sh first)"; exit 2; }
OUT=${OUT:-/tmp/psshim-compat-out}
C=$PWD/tests/gpu/compat
W=$(mktemp -d /tmp/psshim-compat.XXXXXX)
mkdir -p "$OUT"
DEADLINE=$((SECONDS + ${COMPAT_SECONDS:-450}))
CUDA=${CUDA_HOME:-/usr/local/cuda}
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$W/inductor TRITON_CACHE_DIR=$W/triton
export LD_LIBRARY_PATH=$(dirname "$LIB")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ROWS=$W/rows.jsonl
: >"$ROWS"

built=ok
"$CUDA/bin/nvcc" -O2 -cudart shared -o "$W/runtime_api" "$C/runtime_api.cu" 2>"$W/build.err" || built=failed
"$CUDA/bin/nvcc" -ptx -o "$W/driver_kernels.ptx" "$C/driver_kernels.cu" 2>>"$W/build.err" || built=failed
cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -I"$CUDA/include" -o "$W/driver_api" "$C/driver_api.c" \
  -L"$CUDA/lib64/stubs" -lcuda 2>>"$W/build.err" || built=failed
[ $built = ok ] || { echo "compat.sh: building the CUDA C programs failed:"; cat "$W/build.err"; }

# name|seconds per run|settings for the run under psshim ("-": none)|command (run in tests/gpu/compat).
# torch's cudaMallocAsync backend, psshim's default, lacks what CUDA graph trees
# (reduce-overhead) and CUDA IPC sharing need: those rows run with torch's own allocator.
programs=(
  "graph_capture|60|-|python3 graph_capture.py"
  "compile_reduce_overhead|150|PSSHIM_TORCH_ALLOC=keep|python3 compile_reduce_overhead.py"
  "compile_default|150|-|python3 compile_default.py"
  "transformers_train|90|-|python3 transformers_train.py"
  "amp_scaler|60|-|python3 amp_scaler.py"
  "dataloader_pin|90|-|python3 dataloader_pin.py"
  "mp_share|90|PSSHIM_TORCH_ALLOC=keep|python3 mp_share.py"
  "profiler_kernels|60|-|python3 profiler_kernels.py"
  "kv_cache|60|-|python3 kv_cache.py"
  "runtime_api|60|-|$W/runtime_api"
  "driver_api|60|-|$W/driver_api $W/driver_kernels.ptx"
)

peak_of() { # the largest peak_reserved among the COMPAT lines of the files given
  python3 - "$@" <<'PY'
import json, sys
best = 0
for p in sys.argv[1:]:
    try:
        for l in open(p, errors="replace"):
            if l.startswith("COMPAT "):
                best = max(best, int(json.loads(l[7:])["peak_reserved"]))
    except OSError:
        pass
print(best)
PY
}

differ() { # whether two runs' losses differ (or either has none)
  python3 - "$1" "$2" <<'PY'
import json, sys
def losses(p):
    l = [x for x in open(p, errors="replace") if x.startswith("COMPAT ")]
    return json.loads(l[-1][7:])["losses"] if l else None
a, b = losses(sys.argv[1]), losses(sys.argv[2])
sys.exit(0 if a is None or b is None or a != b else 1)
PY
}

skip_row() {
  printf '{"program": "%s", "exit": null, "rule": null, "losses_ok": false, "note": "%s"}\n' "$1" "$2" >>"$ROWS"
}

for entry in "${programs[@]}"; do
  IFS='|' read -r name secs settings cmd <<<"$entry"
  [ "$settings" != - ] || settings=
  [ -z "${COMPAT_ONLY:-}" ] || [[ " $COMPAT_ONLY " == *" $name "* ]] || continue
  if [ $SECONDS -ge $DEADLINE ]; then skip_row "$name" "skipped: out of time"; continue; fi
  echo "== $name"
  natives=()
  for k in 1 2 3; do
    [ $k = 3 ] && ! differ "${natives[0]}" "${natives[1]}" && break
    [ $k = 3 ] && [ $SECONDS -ge $DEADLINE ] && break
    (cd "$C" && timeout "$secs" $cmd) >"$W/$name.native$k.out" 2>"$W/$name.native$k.err"
    echo "   native run $k: exit $?"
    natives+=("$W/$name.native$k.out")
  done
  peak=$(peak_of "${natives[@]}")
  budget=$(( (peak / 2 + (2 << 20) - 1) / (2 << 20) * (2 << 20) ))
  [ "$budget" -ge $((64 << 20)) ] || budget=$((64 << 20))
  # shellcheck disable=SC2086  # settings and cmd are words
  (cd "$C" && env $settings LD_PRELOAD="$LIB" PSSHIM_GPU_BUDGET=$budget PSSHIM_STATS="$W/$name.stats.json" \
     timeout "$secs" $cmd) >"$W/$name.psshim.out" 2>"$W/$name.psshim.err"
  rc=$?
  echo "   under psshim at $((budget >> 20)) MiB (native peak $((peak >> 20)) MiB): exit $rc"
  [ $rc = 0 ] || tail -n 5 "$W/$name.psshim.err" | sed 's/^/   | /'
  COMPAT_SETTINGS="$settings" python3 "$C/judge.py" "$ROWS" "$name" "$budget" "$W/$name.stats.json" "$rc" \
    "$W/$name.psshim.out" "${natives[@]}" ||
    skip_row "$name" "judge failed"
done

tar czf "$OUT/compat_runs.tar.gz" -C "$W" --exclude inductor --exclude triton . 2>/dev/null
python3 - "$ROWS" "$OUT" "$LIB" <<'PY'
import json, os, subprocess, sys, time
rows = [json.loads(l) for l in open(sys.argv[1])]
out, lib = sys.argv[2], sys.argv[3]
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
except OSError:
    gpu = "?"
try:
    import torch
    tv = torch.__version__
except ImportError:
    tv = "?"
try:
    build = open(os.path.join(os.path.dirname(lib), "commit")).read().strip()
except OSError:
    build = "?"
doc = {"date": time.strftime("%Y-%m-%d"), "gpu": gpu, "torch": tv, "libpsshim": lib, "build": build, "rows": rows}
json.dump(doc, open(os.path.join(out, "compat.json"), "w"), indent=1)
fmt = "{:<24} {:>5} {:<26} {:>6} {:>10} {:>10} {:>9} {:>11}  {}"
lines = [f"psshim compatibility matrix, {doc['date']}, {gpu}, torch {tv}",
         fmt.format("program", "exit", "loss rule", "losses", "native ms", "psshim ms", "budget", "host frames", "note")]
def ms(v):
    return f"{v:.2f}" if isinstance(v, (int, float)) else "-"
for r in rows:
    lines.append(fmt.format(r["program"], "-" if r.get("exit") is None else r["exit"], r.get("rule") or "-",
                            "ok" if r.get("losses_ok") else "WRONG" if r.get("rule") else "-",
                            ms(r.get("native_step_ms")), ms(r.get("psshim_step_ms")),
                            f"{r['budget_bytes'] >> 20}M" if r.get("budget_bytes") else "-",
                            "-" if r.get("peak_host_frames") is None else r["peak_host_frames"], r.get("note", "")))
open(os.path.join(out, "compat.txt"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
