#!/usr/bin/env python3
"""The allocator's GPU acceptance runs, side by side in one call: the GPT script natively,
then under psshim (static placement) with PSSHIM_GPU_BUDGET at fractions of the native run's
peak memory. Checks per-step losses bitwise against native (deterministic mode), compares
median step times, records psshim's stats (spill to host frames), writes one JSON and prints
a table last.

Example (on the H200):
  python3 bench/budget_runs.py --lib build/libpsshim.so --out bench/results/budget_runs.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd: list[str], env: dict, timeout: int, log_path: str) -> dict:
    """Runs one gpt_train.py and returns its JSON (plus how it ended)."""
    json_path = log_path.replace(".log", ".json")
    t0 = time.time()
    with open(log_path, "w") as log:
        try:
            p = subprocess.run(cmd + ["--json", json_path], env=env, stdout=log, stderr=subprocess.STDOUT,
                               timeout=timeout)
            status = p.returncode
        except subprocess.TimeoutExpired:
            status = "timeout"
    res = {}
    if os.path.exists(json_path):
        with open(json_path) as f:
            res = json.load(f)
    res["exit"] = status
    res["wall_s"] = time.time() - t0
    return res


def print_table(summary: dict) -> None:
    rows = summary["runs"]
    nat = rows[0]["median_step_s"]
    basis = summary["basis"]
    peak = summary[f"native_peak_{basis}_bytes"]
    print(f"budgets: fractions of native's peak {basis} memory, {peak / 2**30:.2f} GiB")
    print(f"{'run':<14}{'budget GiB':>11}{'exit':>6}{'median s':>10}{'vs native':>10}{'losses':>8}"
          f"{'live/budget':>12}{'GPU GiB':>9}{'host GiB':>9}")
    for r in rows:
        st = r.get("psshim_stats") or {}
        med = r.get("median_step_s")
        ratio = f"{med / nat:.3f}" if med and nat else "-"
        bud = f"{r['budget_bytes'] / 2**30:.2f}" if r["budget_bytes"] else "-"
        over = f"{r['memory_over_budget']:.2f}x" if r["memory_over_budget"] else "-"
        gpu = f"{st['peak_gpu_bytes'] / 2**30:.2f}" if st else "-"
        host = f"{st['peak_host_bytes'] / 2**30:.2f}" if st else "-"
        print(f"{r['name']:<14}{bud:>11}{str(r['exit']):>6}{(f'{med:.4f}' if med else '-'):>10}{ratio:>10}"
              f"{('same' if r['losses_bitwise_equal_native'] else 'DIFF'):>8}{over:>12}{gpu:>9}{host:>9}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", help="path of libpsshim.so")
    ap.add_argument("--out", help="JSON output path")
    ap.add_argument("--table", metavar="JSON", help="only print the table of an earlier run's JSON")
    ap.add_argument("--fractions", default="1.0,0.5,0.25", help="budgets as fractions of the native peak")
    ap.add_argument("--basis", choices=["reserved", "allocated"], default="reserved",
                    help="the native peak the fractions apply to: torch's peak reserved memory (what native "
                         "takes from the GPU; default) or its peak allocated bytes (live tensors only)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--logs", default="/tmp/budget_runs", help="folder for per-run logs and JSON")
    ap.add_argument("train_args", nargs=argparse.REMAINDER, help="arguments after -- go to gpt_train.py")
    a = ap.parse_args()
    if a.table:
        with open(a.table) as f:
            print_table(json.load(f))
        return 0
    if not a.lib or not a.out:
        ap.error("--lib and --out are required for a run")
    os.makedirs(a.logs, exist_ok=True)
    extra = [x for x in a.train_args if x != "--"]
    base = [sys.executable, os.path.join(HERE, "gpt_train.py"), "--deterministic", "--steps", str(a.steps)] + extra
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)

    native = run(base, env, a.timeout, f"{a.logs}/native.log")
    peak = native.get("memory", {}).get(f"peak_{a.basis}_bytes")
    if native["exit"] != 0 or not peak:
        print(f"native run failed ({native['exit']}); see {a.logs}/native.log", file=sys.stderr)
        return 1
    runs = [{"name": "native", "budget_bytes": None, **native}]
    for frac in [float(x) for x in a.fractions.split(",")]:
        budget = int(peak * frac)
        stats_path = f"{a.logs}/stats_{frac}.json"
        penv = dict(env, LD_PRELOAD=os.path.abspath(a.lib), PSSHIM_GPU_BUDGET=str(budget),
                    PSSHIM_POLICY="static", PSSHIM_STATS=stats_path)
        res = run(base, penv, a.timeout, f"{a.logs}/psshim_{frac}.log")
        res["psshim_stats"] = json.load(open(stats_path)) if os.path.exists(stats_path) else None
        runs.append({"name": f"psshim {frac:.0%}", "budget_bytes": budget, "fraction": frac, **res})

    ref = native["loss_hex"]
    rows = []
    for r in runs:
        same = r.get("loss_hex") == ref and len(ref) == a.steps
        r["losses_bitwise_equal_native"] = same
        st = r.get("psshim_stats") or {}
        model_bytes = st.get("peak_live_bytes")
        r["memory_over_budget"] = (model_bytes / r["budget_bytes"]) if model_bytes and r["budget_bytes"] else None
        rows.append(r)
    summary = {"command": " ".join(sys.argv), "basis": a.basis, f"native_peak_{a.basis}_bytes": peak,
               "runs": [{k: v for k, v in r.items() if k not in ("steps", "env")} for r in rows]}
    with open(a.out, "w") as f:
        json.dump(summary, f, indent=1)
    print_table(summary)
    return 0 if all(r["losses_bitwise_equal_native"] and r["exit"] == 0 for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
