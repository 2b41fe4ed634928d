"""Sharded paging on one node: replicated tensors that every rank only reads, every step, as
frozen weights are read, larger than the GPU budget. They are read last-made first: the
ones that did not fit on the GPU (made last) are needed first, so at an iteration boundary
psshim gathers them onto GPU frames taken from the ones needed later (Belady). Run under torchrun with psshim
preloaded in each rank (tests/gpu/shard_run.sh): chunks equal on every rank are kept once
per node, in pieces, and gathered back onto GPU frames at iteration boundaries (own piece
copied in, the rest all-gathered over NVLink). Run alone (no torchrun) it is the
single-GPU baseline. Writes step times, a checksum of what was read and psshim's stats.

    torchrun --nproc_per_node=2 --no-python tests/gpu/rank_env.sh python3 bench/shard_read.py --json out.json
"""
import argparse
import json
import os
import time

import torch

import benchlib


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tensors", type=int, default=48, help="replicated tensors (default: 48)")
    p.add_argument("--mib", type=int, default=256, help="mean MiB per tensor (default: 256)")
    p.add_argument("--steps", type=int, default=40, help="steps (default: 40)")
    p.add_argument("--json", required=True, help="result file (rank R writes PATH with .rankR before .json)")
    a = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # Sizes from mib/4 to 7mib/4 (mean mib): tensors of one size would make the step's
    # launches repeat every tensor, and psshim would take a fraction of the step for the
    # iteration. The same bytes on every rank, made on the GPU from the tensor's index.
    mib = [a.mib // 4 + (3 * a.mib // 2) * i // max(a.tensors - 1, 1) for i in range(a.tensors)]
    weights = [torch.arange(m << 18, device="cuda", dtype=torch.float32).mul_(1.0 / (i + 1))
               for i, m in enumerate(mib)]
    torch.cuda.synchronize()
    times, sums = [], []
    for _ in range(a.steps):
        start = time.perf_counter()
        acc = torch.zeros((), device="cuda", dtype=torch.float64)
        for w in reversed(weights):
            acc += w.sum(dtype=torch.float64)
        sums.append(acc.item())  # synchronizes
        times.append(time.perf_counter() - start)
    tail = sorted(times[len(times) // 2:])
    # The single-GPU page-in's copy, for the gathered page-in's rate to be set beside: one
    # chunk's bytes (16 MiB) at a time from pinned host memory into a GPU tensor.
    host, dev = torch.empty(4 << 20, pin_memory=True), torch.empty(4 << 20, device="cuda")
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(64):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    h2d_gbps = 64 * (16 << 20) / (time.perf_counter() - start) / 1e9
    out = {"rank": rank, "world_size": int(os.environ.get("WORLD_SIZE", "1")), "tensors": a.tensors, "mib": a.mib,
           "step_times_s": times, "median_last_half_s": tail[len(tail) // 2], "sums": sums,
           "bytes_read_per_step": sum(mib) << 20, "h2d_16mib_gbps": h2d_gbps, "psshim": benchlib.psshim_stats()}
    path = a.json if "RANK" not in os.environ else a.json.replace(".json", f".rank{rank}.json")
    with open(path, "w") as f:
        json.dump(out, f)
    print(f"shard_read rank {rank}: median step {out['median_last_half_s']:.3f} s, sum {sums[-1]!r}")


if __name__ == "__main__":
    main()
