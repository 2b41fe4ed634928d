#!/usr/bin/env python3
"""What psshim costs when nothing needs to move, side by side in one call: the GPT script
natively (torch's caching allocator, and torch's cudaMallocAsync backend that psshim selects),
then under psshim with a budget at native's peak reserved memory (psshim's default of
backend:cudaMallocAsync, and PSSHIM_TORCH_ALLOC=keep), then with observation on
(PSSHIM_TRACE, and PSSHIM_POLICY=auto with nothing to page). Runs are interleaved, ROUNDS
rounds; each run's median step time, then the median over rounds. Writes JSON, prints a
table last.

Example: python3 bench/overhead_runs.py --lib .gpu/libpsshim.so --out overhead.json -- --preset demo
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_once(cmd: list[str], env: dict, timeout: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        p = subprocess.run(cmd + ["--json", path], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, timeout=timeout)
        res = json.load(open(path)) if os.path.getsize(path) else {}
        res["exit"] = p.returncode
        if p.returncode:
            res["stderr_tail"] = p.stderr[-2000:]
        return res
    finally:
        os.unlink(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True, help="path of libpsshim.so")
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", help="PSSHIM_GPU_BUDGET for the psshim runs (default: native's peak reserved bytes); "
                                     "a roomy one keeps paging out of an observation-cost measurement")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--configs", default="native,native-async,psshim,psshim-keep,psshim-trace,psshim-observe",
                    help="which configurations, comma separated")
    ap.add_argument("train_args", nargs=argparse.REMAINDER, help="arguments after -- go to gpt_train.py")
    a = ap.parse_args()
    train = [sys.executable, os.path.join(HERE, "gpt_train.py")] + [x for x in a.train_args if x != "--"]
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF")}
    probe = run_once(train, base, a.timeout)
    peak = (probe.get("memory") or {}).get("peak_reserved_bytes")
    if probe.get("exit") or not peak:
        print("native probe run failed:", probe.get("stderr_tail", probe.get("exit")), file=sys.stderr)
        return 1
    budget = a.budget or str(peak)
    pre = dict(base, LD_PRELOAD=os.path.abspath(a.lib), PSSHIM_GPU_BUDGET=budget)
    trace = os.path.join(tempfile.gettempdir(), "overhead.trace")
    envs = {
        "native": base,
        "native-async": dict(base, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync"),
        "psshim": pre,
        "psshim-keep": dict(pre, PSSHIM_TORCH_ALLOC="keep"),
        "psshim-trace": dict(pre, PSSHIM_TRACE=trace),
        "psshim-observe": dict(pre, PSSHIM_POLICY="auto"),
    }
    names = a.configs.split(",")
    medians = {n: [] for n in names}
    failures = {}
    for _ in range(a.rounds):
        for n in names:
            r = run_once(train, envs[n], a.timeout)
            if r.get("exit") or not r.get("median_step_s"):
                failures[n] = r.get("stderr_tail", r.get("exit"))
                continue
            medians[n].append(r["median_step_s"])
    summary = {"command": " ".join(sys.argv), "psshim_gpu_budget": budget, "native_peak_reserved_bytes": peak,
               "rounds": a.rounds,
               "medians_per_round_s": medians, "failures": failures,
               "median_s": {n: statistics.median(v) for n, v in medians.items() if v}}
    with open(a.out, "w") as f:
        json.dump(summary, f, indent=1)
    ref = summary["median_s"].get("native")
    print(f"step time, median over {a.rounds} rounds of per-run medians; PSSHIM_GPU_BUDGET={budget} "
          f"(native peak reserved {peak / 2**30:.2f} GiB)")
    for n in names:
        m = summary["median_s"].get(n)
        print(f"  {n:<16} {m * 1e3:9.2f} ms  {m / ref:6.3f}x native" if m and ref else f"  {n:<16} failed: {failures.get(n)}")
    return 0 if not failures else 2


if __name__ == "__main__":
    sys.exit(main())
