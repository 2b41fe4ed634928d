#!/usr/bin/env bash
# Where the activation set's step goes: ResNet-50 and the demo GPT without checkpointing
# (bench/activation_set.py's workloads and budgets), natively and under each library in
# PROFILE_LIBS (comma-separated NAMEs of .gpu/libpsshim-NAME.so; an empty NAME is
# .gpu/libpsshim.so), 20 steps, then one more under torch.profiler (--profile): the GPU's
# busy share, kernel and copy time beside the step and the launching thread's steady pager
# time (PSSHIM_STATS). Here, first:
# tests/gpu/pack.sh (PACK_BASE=<commit> for libpsshim-base.so); then one device call carrying .gpu:
#   PROFILE_LIBS=",base" bash tests/gpu/activation_profile.sh
# In $OUT: each run's JSON, log and statistics; the table printed last.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit
G=$PWD/.gpu
OUT=${OUT:-/tmp/psshim-activation-profile}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$G${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
# The budgets are half the native peaks that bench/results/activation_set.json records.
declare -A budget=([resnet50]=1606418432 [gpt-demo]=4175429632)
declare -A script=([resnet50]="bench/resnet_train.py" [gpt-demo]="bench/gpt_train.py --preset demo --no-checkpoint")
run_args="--steps 20 --warmup 10 --deterministic --profile"
for w in resnet50 gpt-demo; do
  # shellcheck disable=SC2086 # script and run_args hold words
  timeout 120 python3 ${script[$w]} $run_args --json "$OUT/${w}_native.json" >"$OUT/${w}_native.log" 2>&1
  IFS=, read -ra libs <<<"${PROFILE_LIBS:-}"
  for lib in "${libs[@]:-}"; do
    name=${w}_psshim${lib:+_$lib}
    # shellcheck disable=SC2086
    LD_PRELOAD=$G/libpsshim${lib:+-$lib}.so PSSHIM_GPU_BUDGET=${budget[$w]} PSSHIM_STATS=$OUT/$name.stats.json \
      timeout 180 python3 ${script[$w]} $run_args --json "$OUT/$name.json" >"$OUT/$name.log" 2>&1
  done
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
print(f"{'run':34s} {'median s':>8s} {'losses':>8s} {'prof. s':>7s} {'GPU busy':>8s} {'kernels ms':>10s} "
      f"{'copies ms':>9s} {'pager ms/it':>11s}")
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    if path.endswith(".stats.json"):
        continue
    name = os.path.basename(path)[:-5]
    r = json.load(open(path))
    ref = json.load(open(os.path.join(out, name.split("_")[0] + "_native.json")))["loss_hex"]
    same = "same" if r["loss_hex"] == ref[:len(r["loss_hex"])] else "DIFFER"
    p = r.get("profile") or {"error": "none"}
    stats = os.path.join(out, name + ".stats.json")
    s = json.load(open(stats)) if os.path.exists(stats) else {}
    pager = s.get("steady_launch_ns", 0) / 1e6  # already per steady iteration
    if "error" in p:
        print(f"{name:34s} {r.get('median_step_s') or 0:8.4f} {same:>8s} profile: {p['error'][:60]}")
        continue
    k = p["gpu_us_by_kind"]
    print(f"{name:34s} {r.get('median_step_s') or 0:8.4f} {same:>8s} {p['wall_s']:7.3f} {p['gpu_busy_share']:8.0%} "
          f"{k['kernel'] / 1e3:10.1f} {k['memcpy'] / 1e3:9.1f} {pager:11.1f}")
PY
