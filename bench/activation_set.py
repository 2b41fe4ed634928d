#!/usr/bin/env python3
"""Activation set: activation-heavy workloads natively and under psshim at half their native
peak, side by side, against psshim-report's LEAST TRAFFIC.

Workloads (each with --steps steps, --warmup of them left out of the median, --deterministic):
  resnet50  bench/resnet_train.py: torchvision ResNet-50, batch 64, bf16 autocast,
            channels_last, SGD with momentum 0.9, synthetic data
  gpt-demo  bench/gpt_train.py --preset demo --no-checkpoint (activations kept, not recomputed)

Per workload: the native run first; its peak (torch.cuda.max_memory_allocated) halved and
rounded down to psshim's 2 MiB chunk granularity is the budget. Then the same command with
LD_PRELOAD=<--psshim-lib>, PSSHIM_GPU_BUDGET=<budget>, PSSHIM_STATS and PSSHIM_TRACE, then
`psshim-report TRACE --least=<budget>`, whose LEAST TRAFFIC is the fewest bytes any placement
must bring onto the GPU in a steady iteration at that budget. The target is
1.5 x max(native step, least bytes in / 55.4 GB/s), and losses bitwise equal to native's,
step by step. Every subprocess runs under a timeout; a failure is recorded with its status
and the tail of its output. Writes one JSON (--out; the runs' logs, JSON, statistics and
traces in <out>_runs/) and prints a table last.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

import benchlib
import paging_sweep

HERE = os.path.dirname(os.path.abspath(__file__))
CHUNK = 2 << 20  # psshim's chunk granularity: every chunk size is a multiple of it
TARGET_FACTOR = 1.5
WORKLOADS = ("resnet50", "gpt-demo")
STATS_KEYS = ("bytes_h2d", "bytes_d2h", "touches_host", "late_waits", "launch_ns")
BUILD_ID_NOTE = bytes.fromhex("04000000" "14000000" "03000000") + b"GNU\0"  # ELF NT_GNU_BUILD_ID, 20 bytes


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--psshim-lib", required=True, help="libpsshim.so to preload")
    p.add_argument("--report", help="psshim-report (default: beside --psshim-lib)")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma separated, in this order (default: {','.join(WORKLOADS)})")
    p.add_argument("--steps", type=int, default=30, help="steps per run (default: 30)")
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the median (default: 10)")
    p.add_argument("--timeout", type=float, default=200, help="seconds a training run may take (default: 200)")
    p.add_argument("--report-timeout", type=float, default=120,
                   help="seconds psshim-report may take (default: 120)")
    p.add_argument("--max-total-s", type=float, default=540,
                   help="start nothing after this many seconds, so the call fits one 600 s device "
                        "command; 0: no limit (default: 540)")
    p.add_argument("--out", default="activation_set.json", help="result JSON (default: activation_set.json)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the trainers (default: this one)")
    p.add_argument("--resnet-script", default=os.path.join(HERE, "resnet_train.py"))
    p.add_argument("--gpt-script", default=os.path.join(HERE, "gpt_train.py"))
    a = p.parse_args(argv)
    a.workloads = [w.strip() for w in a.workloads.split(",") if w.strip()]
    if not a.workloads or any(w not in WORKLOADS for w in a.workloads):
        p.error(f"--workloads: choose from {', '.join(WORKLOADS)}")
    a.psshim_lib = os.path.abspath(a.psshim_lib)
    if not os.path.isfile(a.psshim_lib):
        p.error(f"--psshim-lib {a.psshim_lib}: no such file")
    a.report = os.path.abspath(a.report or os.path.join(os.path.dirname(a.psshim_lib), "psshim-report"))
    a.out = os.path.abspath(a.out)
    a.runs_dir = os.path.splitext(a.out)[0] + "_runs"
    return a


def trainer_argv(a, workload: str, json_path: str) -> list:
    common = ["--steps", str(a.steps), "--warmup", str(a.warmup), "--deterministic", "--json", json_path]
    if workload == "resnet50":
        return [a.python, a.resnet_script, *common]
    return [a.python, a.gpt_script, "--preset", "demo", "--no-checkpoint", *common]


def half_budget(peak: int) -> int:
    """Half the peak, rounded down to whole chunks (at least one)."""
    return max(CHUNK, peak // 2 // CHUNK * CHUNK)


def target_s(native_step: float, least_bytes: float | None) -> float:
    """The target: 1.5 x max(native step, least bytes in at the H2D copy rate)."""
    return TARGET_FACTOR * max(native_step, (least_bytes or 0) / benchlib.H2D_BYTES_PER_S)


def build_info(lib: str) -> dict:
    """The library's GNU build id, and the commit: a `commit` file beside it (tests/gpu/'s
    wrappers ask for one), else this checkout's git."""
    info = {"psshim_lib": lib, "build_id": None, "commit": None}
    try:
        with open(lib, "rb") as f:
            data = f.read()
        at = data.find(BUILD_ID_NOTE)
        info["build_id"] = data[at + 16:at + 36].hex() if at >= 0 else None
    except OSError:
        pass
    try:
        with open(os.path.join(os.path.dirname(lib), "commit")) as f:
            info["commit"], info["commit_source"] = f.read().strip(), "commit file beside the library"
    except OSError:
        try:
            info["commit"] = subprocess.run(["git", "-C", HERE, "describe", "--always", "--dirty"], capture_output=True,
                                            text=True, timeout=30, check=True).stdout.strip()
            info["commit_source"] = "git describe of this checkout"
        except (OSError, subprocess.SubprocessError):
            info["commit_source"] = "none: no commit file beside the library and no git"
    return info


class Runner:
    """Runs subprocesses under the call's time limit and records each outcome."""

    def __init__(self, a):
        self.a, self.t0 = a, time.time()

    def run(self, run: paging_sweep.Run, timeout: float) -> tuple[dict, dict | None]:
        """(record, the run's fresh JSON or None)."""
        rec = {"command": run.shell(), "log": run.log_path}
        left = self.a.max_total_s - (time.time() - self.t0) if self.a.max_total_s else timeout
        if run.skip_reason or left < 10:
            rec.update(status="skipped", reason=run.skip_reason or f"--max-total-s {self.a.max_total_s:g} reached")
            return rec, None
        outcome = paging_sweep.execute(run, min(timeout, left))
        result = paging_sweep.fresh_json(run.json_path, outcome["started"]) if run.json_path else None
        rec.update(status=paging_sweep.status_of(outcome, result if run.json_path else {"ran": True}),
                   returncode=outcome["returncode"], wall_s=round(outcome["wall_s"], 2))
        if rec["status"] != "ok":
            rec["error"] = "\n".join(filter(None, [(result or {}).get("error"), paging_sweep.log_tail(run.log_path, 8)]))
        print(f"activation_set: {run.name}: {rec['status']} in {rec['wall_s']:.0f} s", flush=True)
        return rec, result


def train_record(rec: dict, result: dict | None) -> dict:
    if result:
        rec.update(median_step_s=result.get("median_step_s"), steps_run=len(result.get("loss_hex", [])),
                   peak_allocated_bytes=(result.get("memory") or {}).get("peak_allocated_bytes"),
                   device_name=result.get("device_name"), torch_version=result.get("torch_version"))
    return rec


LEAST_WINDOW = re.compile(r"^\s+(.*): \d+ launches read [0-9.]+ MB of data they did not write first$", re.M)
LEAST_LINE = re.compile(r"^\s+GPU budget\s+(.+?)\s+([0-9.]+) MB$", re.M)
PAGED_IN = re.compile(r"this run paged in ([0-9.]+) MB")
NOTHING = re.compile(r"^\s+nothing to bound: (.*)$", re.M)


def parse_least(text: str) -> dict:
    """psshim-report's LEAST TRAFFIC section: the window, the bound at the one budget asked
    for (bytes), what the run paged in then. The bound is per iteration only when the window
    is one (the report falls back to the whole run when it finds no steady period)."""
    section = text[text.find("\nLEAST TRAFFIC"):] if "\nLEAST TRAFFIC" in text else ""
    out = {"least_window": None, "least_h2d_bytes": None}
    if not section:
        out["least_error"] = "no LEAST TRAFFIC section in psshim-report's output"
        return out
    if (m := NOTHING.search(section)):
        out["least_error"] = m.group(1)
        return out
    window, lines = LEAST_WINDOW.search(section), LEAST_LINE.findall(section)
    if not window or len(lines) != 1:
        out["least_error"] = "LEAST TRAFFIC section not understood"
        return out
    out["least_window"] = window.group(1)
    out["least_bytes_in_window"] = float(lines[0][1]) * 1e6
    if window.group(1).startswith("iteration"):
        out["least_h2d_bytes"] = out["least_bytes_in_window"]
    else:
        out["least_error"] = f"the bound covers {window.group(1)}, not one iteration: no per-step figure"
    if (m := PAGED_IN.search(section)):
        out["paged_in_bytes"] = float(m.group(1)) * 1e6
    return out


def measure(a, runner: Runner, workload: str) -> dict:
    base = os.path.join(a.runs_dir, workload)
    out = {"workload": workload}
    native_run = paging_sweep.Run(name=f"{workload} native", method="native", ratio=None, budget=None, argv=[],
                                  json_path=base + "_native.json", log_path=base + "_native.log")
    native_run.argv = trainer_argv(a, workload, native_run.json_path)
    rec, native = runner.run(native_run, a.timeout)
    out["native"] = train_record(rec, native)
    peak = out["native"].get("peak_allocated_bytes")
    budget = half_budget(peak) if peak else None
    out["budget_bytes"] = budget

    ps = paging_sweep.Run(name=f"{workload} psshim", method="psshim", ratio=None, budget=budget, argv=[],
                          json_path=base + "_psshim.json", log_path=base + "_psshim.log",
                          stats_path=base + "_psshim.stats.json")
    trace = base + "_psshim.trace"
    if os.path.exists(trace):  # an earlier call's: the report must read this run's or none
        os.remove(trace)
    ps.argv = trainer_argv(a, workload, ps.json_path)
    libs = os.environ.get("LD_LIBRARY_PATH")
    ps.env = {"LD_PRELOAD": a.psshim_lib, "LD_LIBRARY_PATH": os.path.dirname(a.psshim_lib) + (":" + libs if libs else ""),
              "PSSHIM_GPU_BUDGET": str(budget), "PSSHIM_STATS": ps.stats_path, "PSSHIM_TRACE": trace}
    ps.skip_reason = None if budget else f"the native run gave no peak ({out['native']['status']})"
    rec, result = runner.run(ps, a.timeout)
    out["psshim"] = train_record(rec, result)
    stats = paging_sweep.fresh_json(ps.stats_path, runner.t0) if rec["status"] != "skipped" else None
    out["psshim"]["stats"] = {k: stats.get(k) for k in STATS_KEYS} if isinstance(stats, dict) else None
    out["psshim"]["trace"] = trace

    report = paging_sweep.Run(name=f"{workload} psshim-report", method="report", ratio=None, budget=budget,
                              argv=[a.report, trace, f"--least={budget}"], log_path=base + "_report.txt")
    if not os.path.isfile(trace) or rec["status"] == "skipped":
        report.skip_reason = "no trace: the psshim run " + ("was skipped" if rec["status"] == "skipped" else "wrote none")
    rec, _ = runner.run(report, a.report_timeout)
    if rec["status"] != "skipped":
        with open(report.log_path, errors="replace") as f:
            rec.update(parse_least(f.read()))
    out["report"] = rec

    native_s, psshim_s, least = out["native"].get("median_step_s"), out["psshim"].get("median_step_s"), rec.get("least_h2d_bytes")
    if native_s and psshim_s:
        out["ratio"] = psshim_s / native_s
    if native and result and native.get("loss_hex") and result.get("loss_hex"):
        cmp = benchlib.compare_loss_hex(native["loss_hex"], result["loss_hex"])
        out["losses"] = {"identical": cmp.identical, "compared": cmp.compared, "first_mismatch": cmp.first_mismatch,
                         "same_length": cmp.same_length}
    if native_s:
        out["target_s"] = target_s(native_s, least)
        out["target_basis"] = "1.5 x max(native step, least bytes in / 55.4 GB/s)" if least is not None else \
            "1.5 x native step: no per-iteration LEAST TRAFFIC"
    if "target_s" in out and psshim_s:
        out["step_within_target"] = psshim_s <= out["target_s"]
        out["target_met"] = out["step_within_target"] and bool(out.get("losses", {}).get("identical"))
    return out


def table(result: dict) -> str:
    rows = []
    for w in result["workloads"]:
        n, p, r, s = w["native"], w["psshim"], w["report"], w["psshim"].get("stats") or {}
        gb = lambda v: benchlib.fmt(v / 1e9 if v is not None else None, ".2f")
        losses = w.get("losses")
        rows.append([w["workload"], n["status"] if n["status"] != "ok" else benchlib.fmt(n.get("median_step_s"), ".4f"),
                     benchlib.gib(w.get("budget_bytes")),
                     p["status"] if p["status"] != "ok" else benchlib.fmt(p.get("median_step_s"), ".4f"),
                     benchlib.fmt(w.get("ratio"), ".2f"),
                     "-" if not losses else "identical" if losses["identical"] else f"differ@{losses['first_mismatch']}",
                     gb(r.get("least_h2d_bytes")) if r["status"] == "ok" else r["status"],
                     benchlib.fmt(w.get("target_s"), ".4f"),
                     {True: "yes", False: "no"}.get(w.get("target_met"), "-"),
                     gb(s.get("bytes_h2d")), gb(s.get("bytes_d2h")), benchlib.fmt(s.get("late_waits"), "d")])
    return benchlib.format_table(["workload", "native s", "budget GiB", "psshim s", "x native", "losses",
                                  "least GB in", "target s", "met", "H2D GB", "D2H GB", "late waits"], rows)


def main(argv=None) -> int:
    a = parse_args(argv)
    runner = Runner(a)
    result = {"script": "activation_set.py", "argv": sys.argv[1:] if argv is None else list(argv),
              "steps": a.steps, "warmup": a.warmup, "report": a.report, "build": build_info(a.psshim_lib),
              "h2d_bytes_per_s": benchlib.H2D_BYTES_PER_S,
              "target": "psshim step <= 1.5 x max(native step, LEAST TRAFFIC bytes in / 55.4 GB/s), "
                        "losses bitwise equal to native's", "psshim_stats": "totals over the whole run",
              "workloads": []}
    for workload in a.workloads:
        result["workloads"].append(measure(a, runner, workload))
        benchlib.write_json(a.out, result)
    result["wall_s"] = round(time.time() - runner.t0, 1)
    benchlib.write_json(a.out, result)
    build = result["build"]
    print(f"\nwrote {a.out}; build {build['commit'] or '?'} (build id {build['build_id'] or '?'}); "
          f"psshim stats are totals over the run\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
