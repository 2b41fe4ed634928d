#!/usr/bin/env bash
# The sharded-paging figure, in one device call on a kind with N >= 2
# GPUs (after tests/gpu/pack.sh here; device run: bash tests/gpu/shard_run.sh, carrying
# .gpu). bench/shard_read.py (SHARD_TENSORS x SHARD_MIB MiB of replicated tensors, default
# 48 x 256 = 12 GiB, read every step) under psshim auto at SHARD_BUDGET per rank (default
# 8G): 1. alone on one GPU, no torchrun (single-GPU paging); 2. torchrun on N GPUs (chunks
# shared by the node's ranks, gathered onto GPU frames at iteration boundaries). Prints
# each run's median step, whether every rank read the same sums as the run alone, host
# frames, what sharing saved, the gathered page-in's bytes and rate per rank (the
# communicator's making apart), and the rate of the single-GPU page-in's copy (16 MiB from
# pinned host memory, measured by each run).
# SHARD_RUNS=shared skips the run alone.
# The device tool brings back at most 8 files, fewer than a run writes: give OUT outside
# its $OUT and archive it there (OUT=/tmp/r bash ...; tar -czf $OUT/r.tgz -C /tmp r).
set -uo pipefail
cd "$(dirname "$0")/../.."
G=$PWD/.gpu
OUT=${OUT:-/tmp/psshim-shard-out}
N=${SHARD_GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$G${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PSSHIM_POLICY=auto \
  PSSHIM_GPU_BUDGET=${SHARD_BUDGET:-8G}
args=(bench/shard_read.py --tensors "${SHARD_TENSORS:-48}" --mib "${SHARD_MIB:-256}" --steps "${SHARD_STEPS:-40}")
if [[ " ${SHARD_RUNS:-alone shared} " == *" alone "* ]]; then
  LD_PRELOAD=$G/libpsshim.so PSSHIM_STATS=$OUT/alone.psshim.json timeout "${SHARD_TIMEOUT:-200}" \
    python3 "${args[@]}" --json "$OUT/alone.json" >"$OUT/alone.log" 2>&1
  echo "alone: rc $?"
fi
RANK_ENV_LIB=$G/libpsshim.so RANK_ENV_STATS=$OUT/shared.psshim timeout "${SHARD_TIMEOUT:-200}" \
  torchrun --nproc_per_node="$N" --no-python tests/gpu/rank_env.sh python3 "${args[@]}" --json "$OUT/shared.json" \
  >"$OUT/shared.log" 2>&1
echo "shared ($N ranks): rc $?"
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
runs = [("alone", os.path.join(out, "alone.json"))] + [
    (f"rank {json.load(open(p))['rank']}", p) for p in sorted(glob.glob(os.path.join(out, "shared.rank*.json")))]
base = json.load(open(runs[0][1]))["sums"] if os.path.exists(runs[0][1]) else None
print(f"{'run':8s} {'median s':>8s} {'sums':>5s} {'host GiB':>8s} {'saved GiB':>9s} {'shares':>6s} {'gathers':>7s} "
      f"{'gathered GiB':>12s} {'gather GB/s':>11s} {'comm init s':>11s} {'rounds s':>8s} {'h2d GiB':>7s} "
      f"{'16MiB copy GB/s':>15s}")
for name, path in runs:
    if not os.path.exists(path):
        print(f"{name:8s} no result")
        continue
    r = json.load(open(path))
    s = r["psshim"] or {}
    g = lambda k: s.get(k, 0)
    rate = g("gathered_bytes") / g("gather_ns") if g("gather_ns") else 0
    same = "-" if base is None else "same" if r["sums"] == base else "DIFF"
    print(f"{name:8s} {r['median_last_half_s']:8.3f} {same:>5s} {g('peak_host_bytes') / 2**30:8.2f} "
          f"{g('peak_shard_saved_bytes') / 2**30:9.2f} {g('shares'):6d} {g('shared_gathers'):7d} "
          f"{g('gathered_bytes') / 2**30:12.2f} {rate:11.1f} {g('comm_init_ns') / 1e9:11.2f} {g('share_round_ns') / 1e9:8.2f} "
          f"{g('bytes_h2d') / 2**30:7.2f} {r.get('h2d_16mib_gbps', 0):15.1f}")
PY
