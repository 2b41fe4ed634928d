#!/usr/bin/env bash
# The multi-GPU GPT run, in one device call on a kind with N >= 2 GPUs
# (after tests/gpu/pack.sh here; device run: bash tests/gpu/ddp_run.sh, carrying .gpu,
# NCCL_NVLS_ENABLE=0: NVLink multicast off). torchrun --nproc_per_node=N of bench/gpt_train.py
# --ddp (the 2.68B GPT, deterministic, 20 steps):
# 1. natively; 2. under psshim (auto) at a per-rank GPU budget of DDP_BUDGET (default 20G:
#    model data, 16 bytes a parameter, is 43 GB, over 2x the budget); 3. FSDP2 with
#    CPUOffloadPolicy on the same N GPUs and budget. Then rank 0's losses of 2 against 1,
#    each rank's host frames and what sharing saved (PSSHIM_STATS), and the step times.
# The device tool brings back at most 8 files, fewer than a run writes: give OUT outside
# its $OUT and archive it there (OUT=/tmp/r bash ...; tar -czf $OUT/r.tgz -C /tmp r).
set -uo pipefail
cd "$(dirname "$0")/../.."
G=$PWD/.gpu
OUT=${OUT:-/tmp/psshim-ddp-out}
N=${DDP_GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
BUDGET=${DDP_BUDGET:-20G}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$G${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# DDP_TRAIN replaces gpt_train's arguments (a smoke test on the CPU: --preset tiny --device cpu)
read -r -a args <<<"${DDP_TRAIN:---preset gpt2.7b --steps 20 --warmup 5 --deterministic}"
train=("${DDP_PYTHON:-python3}" bench/gpt_train.py "${args[@]}")
# torchrun sets OMP_NUM_THREADS=1 when unset: FSDP2 runs AdamW on the CPU, so each rank gets
# its share of the cores, as the single-GPU FSDP2 run has all of them.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(($(nproc) / N))}
run() { # name, then torchrun's command; DDP_ONLY (e.g. psshim,fsdp) picks runs
  local name=$1
  shift
  [[ ",${DDP_ONLY:-native,psshim,fsdp}," == *",$name,"* ]] || return 0
  timeout "${DDP_TIMEOUT:-240}" torchrun --nproc_per_node="$N" --no-python "$@" >"$OUT/$name.log" 2>&1
  echo "$name: rc $? ($(tail -1 "$OUT/$name.log"))"
  grep -m3 "^psshim:" "$OUT/$name.log"
}
run native tests/gpu/rank_env.sh "${train[@]}" --ddp --json "$OUT/native.json"
RANK_ENV_LIB=$G/libpsshim.so RANK_ENV_STATS=$OUT/psshim PSSHIM_POLICY=auto PSSHIM_GPU_BUDGET=$BUDGET \
  run psshim tests/gpu/rank_env.sh "${train[@]}" --ddp --json "$OUT/psshim.json"
run fsdp tests/gpu/rank_env.sh "${train[@]}" --fsdp-offload --memory-budget "$BUDGET" --json "$OUT/fsdp.json"
echo "== DDP on $N GPUs, per-rank budget $BUDGET =="
python3 - "$OUT" "$N" <<'PY'
import json, os, sys
out, n = sys.argv[1], int(sys.argv[2])
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except (OSError, ValueError):
        return None
runs = {k: load(f"{k}.json") for k in ("native", "psshim", "fsdp")}
for k, r in runs.items():  # a run cut by its timeout keeps the steps it made (gpt_train writes each)
    if not r:
        print(f"{k:7s} no result")
        continue
    done = "finished" if r.get("finished", True) else f"cut after {len(r['step_times_s'])} steps"
    print(f"{k:7s} median step {r['median_step_s']} s ({done}); steps: "
          + " ".join(f"{t:.2f}" for t in r["step_times_s"]))
nat, ps = runs["native"], runs["psshim"]
if nat and ps:
    n = min(len(nat["loss_hex"]), len(ps["loss_hex"]))
    same = nat["loss_hex"][:n] == ps["loss_hex"][:n]
    print(f"rank 0 losses, psshim vs native: {'identical' if same else 'DIFFER'} over {n} steps")
for r in range(n):
    s = load(f"psshim.rank{r}.json")
    if s:
        print(f"rank {r}: peak host frames {s['peak_host_bytes'] / 2**30:.2f} GiB, shared chunks at most "
              f"saved {s['peak_shard_saved_bytes'] / 2**30:.2f} GiB, moved in {s['bytes_h2d'] / 2**30:.2f} GiB")
PY
true
