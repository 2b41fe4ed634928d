#!/usr/bin/env python3
"""The program set: programs of many kinds, each natively and under psshim at half its
native peak, in one call, side by side.

Each program prints one `COMPAT {json}` line last (tests/gpu/compat/common.py's format:
losses as exact reprs, each step's seconds, torch's max_memory_reserved), or is the bundled
GPT (bench/gpt_train.py --json). Per program:
  1. two native runs (a third when their losses differ): the native step (median of the
     second half of the steps), the peak, and the loss rule (bitwise when the two agree,
     else each step within the native runs' spread; where psshim's differ bitwise, native
     once more under torch's cudaMallocAsync backend, which psshim selects, and bitwise
     against that);
  2. one run under psshim's defaults with PSSHIM_GPU_BUDGET = half that peak (64 MiB at
     least), PSSHIM_STATS and PSSHIM_TRACE: its step the same way, its statistics;
  3. `psshim-report --least=BUDGET` on its trace: the least bytes any placement must bring
     onto the GPU in a steady iteration; bound_step_s = max(native step, those bytes at
     55.4 GB/s) (no steady iteration in the trace: the whole run's bound over its steps).
The psshim step is taken from the traced run; predicted_step_s is the step psshim-report's
PLAN section predicts from the trace (policy/'s plan at the run's budget).

    python3 bench/program_set.py --lib .gpu/libpsshim.so --report .gpu/psshim-report \\
        [--only NAME,...] [--out bench/results/program_set.json] [--runs DIR]

--summarize RUNS makes the rows again from a --runs folder without running anything.
--out is read first and its rows of other programs kept, so that the set can be run in
parts (one call each); it is rewritten after every program. A table is printed last."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import benchlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COMPAT = os.path.join(ROOT, "tests", "gpu", "compat")
PROGS = os.path.join(HERE, "programs")
MIB = 1 << 20

# name, kind, script and arguments, seconds a run may take
PROGRAMS = [
    ("transformers_gpt2", "compat", [os.path.join(COMPAT, "transformers_train.py")], 180),
    ("resnet50_bf16", "compat", [os.path.join(PROGS, "resnet50.py")], 180),
    ("compiled_mlp", "compat", [os.path.join(COMPAT, "compile_default.py")], 240),
    ("fp16_gradscaler", "compat", [os.path.join(COMPAT, "amp_scaler.py")], 180),
    ("profiler_mlp", "compat", [os.path.join(COMPAT, "profiler_kernels.py")], 180),
    ("lora_adapters", "compat", [os.path.join(PROGS, "lora_adapters.py")], 180),
    ("lightning_fit", "compat", [os.path.join(PROGS, "lightning_fit.py")], 180),
    ("cupy_kernel", "compat", [os.path.join(PROGS, "cupy_kernel.py")], 180),
    ("kv_cache_decode", "compat", [os.path.join(COMPAT, "kv_cache.py")], 180),
    ("save_resume", "compat", [os.path.join(PROGS, "save_resume.py")], 240),
    ("jax_mlp", "compat", [os.path.join(PROGS, "jax_mlp.py")], 180),
    ("demo_gpt", "gpt_train", [os.path.join(HERE, "gpt_train.py"), "--preset", "demo", "--steps", "12", "--deterministic"], 240),
]


def steady(times):
    """The median of the second half of the steps (the first half holds warm-up and, under
    psshim, the steps before the period is trusted)."""
    half = times[len(times) // 2:] or times
    return statistics.median(half) if half else None


def run(name, kind, argv, seconds, env, log):
    """One run, its output in `log` (and log.json for gpt_train.py): its exit code."""
    cmd = [sys.executable] + argv + (["--json", log + ".json"] if kind == "gpt_train" else [])
    with open(log, "w") as f:
        try:
            return subprocess.run(cmd, cwd=COMPAT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=seconds).returncode
        except subprocess.TimeoutExpired:
            f.write(f"\nprogram_set: {name} ran past {seconds} s\n")
            return 124


def result(kind, log):
    """What a run left: a dict of losses, times, peak; None when it left none."""
    if kind == "gpt_train":
        try:
            res = json.load(open(log + ".json"))
            return {"losses": res["loss_hex"], "times": res["step_times_s"],
                    "peak": res["memory"]["peak_reserved_bytes"]}
        except (OSError, ValueError, KeyError, TypeError):
            return None
    try:
        lines = [l for l in open(log, errors="replace") if l.startswith("COMPAT ")]
    except OSError:
        return None
    if not lines:
        return None
    c = json.loads(lines[-1][7:])
    return {"losses": c["losses"], "times": c.get("times", []), "peak": c["peak_reserved"]}


def judge(natives, mine):
    """'identical', 'within_spread' or 'differ' (None: nothing to judge), and the rule."""
    if len(natives) < 2 or not mine:
        return None, None
    a, b = natives[0]["losses"], natives[1]["losses"]
    if a == b:
        return ("identical" if mine["losses"] == a else "differ"), "bitwise"
    got = mine["losses"]
    if len(got) != len(a):
        return "differ", "spread"
    val = lambda x: float.fromhex(x) if isinstance(x, str) and x.startswith(("0x", "-0x")) else float(x)
    ok = all(min(val(n["losses"][i]) for n in natives) <= val(x) <= max(val(n["losses"][i]) for n in natives)
             for i, x in enumerate(got))
    return ("within_spread" if ok else "differ"), f"spread of {len(natives)} native runs"


def report_figures(report, trace, budget):
    """From psshim-report on the trace: (least bytes onto the GPU at `budget`, whether over a
    steady iteration (else the whole run), the PLAN section's predicted step in seconds)."""
    try:
        out = subprocess.run([report, f"--least={budget}", trace], capture_output=True, text=True, timeout=300).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None, False, None
    sect = out.split("\nLEAST TRAFFIC", 1)
    m = re.search(r"GPU budget .*?([0-9.]+) MB$", sect[1], re.M) if len(sect) == 2 else None
    least = int(float(m.group(1)) * 1e6) if m else None
    per_iteration = len(sect) == 2 and "the whole run:" not in sect[1].split("\n", 2)[1]
    p = re.search(r"^  step\s+([0-9.]+) s predicted", out, re.M)
    return least, per_iteration, float(p.group(1)) if p else None


def measure(name, kind, argv, seconds, a, runs):
    """Runs the program natively and under psshim; what each run left stays in `runs`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PSSHIM_") and k != "LD_PRELOAD"}
    base.update(PYTHONUNBUFFERED="1", PYTHONPATH=COMPAT + os.pathsep + HERE)
    log = lambda what: os.path.join(runs, f"{name}.{what}.log")
    meta = {"exits": {}}
    natives = []
    for i in range(3):
        if i == 2 and (len(natives) < 2 or natives[0]["losses"] == natives[1]["losses"]):
            break
        meta["exits"][f"native{i}"] = rc = run(name, kind, argv, seconds, base, log(f"native{i}"))
        res = result(kind, log(f"native{i}"))
        if res and rc == 0:
            natives.append(res)
    if len(natives) >= 2:
        meta["budget"] = max(64 * MIB, max(n["peak"] for n in natives) // 2 // (2 * MIB) * (2 * MIB))
        env = dict(base, LD_PRELOAD=a.lib, PSSHIM_GPU_BUDGET=str(meta["budget"]),
                   PSSHIM_STATS=os.path.join(runs, f"{name}.stats.json"), PSSHIM_TRACE=os.path.join(runs, f"{name}.trace"))
        meta["exits"]["psshim"] = run(name, kind, argv, seconds, env, log("psshim"))
        mine = result(kind, log("psshim"))
        if mine and judge(natives, mine) == ("differ", "bitwise"):
            # Under psshim torch allocates through its cudaMallocAsync backend (psshim's
            # default PSSHIM_TORCH_ALLOC): native under the same backend tells psshim's doing
            # from torch's.
            meta["exits"]["native_async"] = run(name, kind, argv, seconds,
                                                dict(base, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync"),
                                                log("native_async"))
    with open(os.path.join(runs, f"{name}.meta.json"), "w") as f:
        json.dump(meta, f)


def summarize(name, kind, runs, report):
    """The program's row, from what its runs left in `runs`."""
    log = lambda what: os.path.join(runs, f"{name}.{what}.log")
    row = {"name": name, "native_step_s": None, "psshim_step_s": None, "bound_step_s": None, "losses": None,
           "budget_bytes": None, "predicted_step_s": None, "note": ""}
    try:
        meta = json.load(open(os.path.join(runs, f"{name}.meta.json")))
    except (OSError, ValueError):
        row["note"] = "not run"
        return row
    exits = meta["exits"]
    natives = [r for i in range(3) if exits.get(f"native{i}") == 0 and (r := result(kind, log(f"native{i}")))]
    if len(natives) < 2:
        row["note"] = "native runs failed"
        return row
    row["native_step_s"] = statistics.median([steady(n["times"]) for n in natives])
    row["budget_bytes"] = meta["budget"]
    row["psshim_exit"] = exits.get("psshim")
    mine = result(kind, log("psshim")) if row["psshim_exit"] == 0 else None
    if not mine:
        row["note"] = f"psshim run failed (exit {row['psshim_exit']})"
    else:
        row["psshim_step_s"] = steady(mine["times"])
        row["losses"], row["loss_rule"] = judge(natives, mine)
        same = result(kind, log("native_async")) if exits.get("native_async") == 0 else None
        if row["losses"] == "differ" and same and same["losses"] == mine["losses"]:
            row["losses"] = "identical"
            row["loss_rule"] = "bitwise, against native under torch's backend:cudaMallocAsync (psshim's torch setting)"
        if row["losses"] == "differ":
            row["differ_steps"] = [i for i, (x, y) in enumerate(zip(mine["losses"], natives[0]["losses"])) if x != y]
    try:
        s = json.load(open(os.path.join(runs, f"{name}.stats.json")))
        for k in ("peak_gpu_frames", "peak_host_frames", "touches_gpu", "touches_host", "migrations_to_gpu",
                  "migrations_to_host", "period", "steady_touches_host", "steady_pager_pct", "steady_bytes_h2d",
                  "steady_bytes_d2h", "steady_wall_ns"):
            if k in s:
                row[k] = s[k]
    except (OSError, ValueError):
        row["note"] += "; no psshim statistics"
    trace = os.path.join(runs, f"{name}.trace")
    least, per_iteration, predicted = report_figures(report, trace, meta["budget"]) if os.path.exists(trace) else (None, False, None)
    if least is not None and not per_iteration and mine:
        least //= len(mine["times"])  # no steady iteration: the whole run's bound, per step
    row["least_bytes_h2d"], row["least_over"] = least, "steady iteration" if per_iteration else "whole run / steps"
    row["bound_step_s"] = max(row["native_step_s"], (least or 0) / benchlib.H2D_BYTES_PER_S)
    row["predicted_step_s"] = predicted
    return row


def table(rows):
    f = lambda v, p=3: "-" if v is None else f"{v:.{p}f}"
    out = [f"{'program':18} {'budget MiB':>10} {'native s':>9} {'psshim s':>9} {'bound s':>8} {'x bound':>7} "
           f"{'host touch%':>11} {'losses':>13}"]
    for r in rows:
        ratio = r["psshim_step_s"] / r["bound_step_s"] if r.get("psshim_step_s") and r.get("bound_step_s") else None
        t = (r.get("touches_host") or 0) + (r.get("touches_gpu") or 0)
        host = 100.0 * r["touches_host"] / t if t else None
        out.append(f"{r['name']:18} {f((r['budget_bytes'] or 0) / MIB, 0):>10} {f(r['native_step_s'], 4):>9} "
                   f"{f(r['psshim_step_s'], 4):>9} {f(r['bound_step_s'], 4):>8} {f(ratio, 1):>7} {f(host, 1):>11} "
                   f"{str(r['losses']):>13}")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", help="libpsshim.so to preload")
    p.add_argument("--report", help="psshim-report to bound the traffic with")
    p.add_argument("--only", help="comma-separated program names (default: all)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "program_set.json"))
    p.add_argument("--runs", help="folder for every run's output, statistics and trace (default: a temporary one)")
    p.add_argument("--commit", default="", help="the build's commit, kept in the JSON")
    p.add_argument("--list", action="store_true", help="print the programs' names and exit")
    p.add_argument("--summarize", metavar="RUNS", help="run nothing: make the rows again from a --runs folder")
    a = p.parse_args()
    if a.list:
        print("\n".join(n for n, *_ in PROGRAMS))
        return 0
    if not a.report or not (a.lib or a.summarize):
        p.error("--report is needed, and --lib unless --summarize")
    names = [n for n, *_ in PROGRAMS]
    only = a.only.split(",") if a.only else names
    unknown = [n for n in only if n not in names]
    if unknown:
        p.error(f"no program named {', '.join(unknown)} (--list shows them)")
    a.lib, a.report = os.path.abspath(a.lib or ""), os.path.abspath(a.report)
    for path in (a.report,) if a.summarize else (a.lib, a.report):
        if not os.path.exists(path):
            p.error(f"{path} does not exist")
    runs = a.summarize or a.runs or tempfile.mkdtemp(prefix="program_set.")
    os.makedirs(runs, exist_ok=True)
    try:
        doc = json.load(open(a.out))
    except (OSError, ValueError):
        doc = {"programs": []}
    doc["commit"] = a.commit or doc.get("commit", "")
    for name, kind, argv, seconds in PROGRAMS:
        if name not in only:
            continue
        if not a.summarize:
            measure(name, kind, argv, seconds, a, runs)
        elif not os.path.exists(os.path.join(runs, f"{name}.meta.json")):
            continue
        row = summarize(name, kind, runs, a.report)
        row["commit"] = a.commit
        doc["programs"] = [r for r in doc["programs"] if r["name"] != name] + [row]
        doc["programs"].sort(key=lambda r: names.index(r["name"]) if r["name"] in names else len(names))
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"program_set: {name} done", flush=True)
    print(table(doc["programs"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
