#!/usr/bin/env python3
"""The paging mechanism alone: bench/pipeline.cu natively, under psshim in place, and under
psshim's defaults, at a PCIe-bound and a compute-bound setting, weights compared.

pipeline.cu is a plain CUDA program (no torch): L layers of S MiB weights, forward reading
each layer PASSES times, backward reading and writing it, ITERS multiply-add rounds per
16-byte element and pass. Built here with nvcc when missing or older than its source.

Two settings:
  pcie     ITERS=0 (--iters-pcie): the kernels are short, PCIe bounds a paged step
  compute  ITERS so that a native step takes COMPUTE_OVER_LINK times the link time of the
           traffic below (the prototype's 0.76 s of kernels against 0.36 s of PCIe):
           calibrated from a native run at CALIBRATION_ITERS, or --iters-compute
At each: native (no psshim), psshim PSSHIM_POLICY=static (weights beyond the budget read in
place), and psshim's defaults, the latter two at --budget (default a quarter of the
weights) with PSSHIM_STATS kept. bound_s = max(native_s, link time of the fewest bytes any
placement moves per step at that budget each way: OPT's schedule of the layer order with
budget // S layers on the GPU, at benchlib's measured copy rates (paging_sweep.link_s));
weights "identical" when the three runs' checksums are equal; inplace_touch_pct: psshim's
chunk touches served from host frames, in percent of all (touches_host / (touches_host +
touches_gpu) in its statistics; static observes no launches and counts none).

Writes --out (default bench/results/pipeline.json) after every run; each run's output
(stdout and stderr) and psshim statistics go to <out>_runs/. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import benchlib
import paging_sweep

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SOURCES = [os.path.join(HERE, "pipeline.cu"), os.path.join(HERE, "pipeline.h")]
DEFAULT_BINARY = os.path.join(REPO, "build-pipeline", "pipeline")
SETTINGS = ("pcie", "compute")
MODES = ("native", "static", "psshim")
COMPUTE_OVER_LINK = 2.2
CALIBRATION_ITERS = 256
KEEP_ENV = ("PSSHIM_CUPTI", "PSSHIM_LIBCUDA", "PSSHIM_NCCL")
QUICK = dict(layers=16, layer_mib=64, steps=5, warmup=2)
STATS_KEYS = ("migrations_to_gpu", "migrations_to_host", "bytes_h2d", "bytes_d2h", "touches_gpu", "touches_host",
              "copy_waits", "late_waits", "period", "period_adopted_at", "launches", "steady_iterations",
              "steady_wall_ns", "steady_bytes_h2d", "steady_bytes_d2h", "steady_touches_host", "steady_touches_gpu",
              "plan_builds", "plan_laps", "owner_fetches", "owner_evictions", "owner_missed", "owner_wait_ns",
              "gate_wait_ns", "gate_timeouts", "steady_owner_wait_ns", "steady_gate_wait_ns", "remap_ns",
              "steady_remap_ns", "chunk_size", "remaps_beside_inplace", "steady_remaps_beside_inplace",
              "owner_demand_fetches", "steady_owner_demand_fetches", "owner_unplanned_victims")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--psshim", help="the psshim launcher (libpsshim.so beside it), or a libpsshim.so to preload "
                   "(default: build-gpu/tools/psshim, else .gpu/libpsshim.so)")
    p.add_argument("--binary", help="a built pipeline.cu, used as it is (default: build-pipeline/pipeline, "
                   "built when missing or older than its source)")
    toolkit_nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    p.add_argument("--nvcc", default=toolkit_nvcc if os.path.isfile(toolkit_nvcc) else shutil.which("nvcc") or "nvcc",
                   help="(default: $CUDA_HOME/bin/nvcc, else nvcc on PATH)")
    p.add_argument("--arch", default="sm_90", help="nvcc -arch (default: sm_90, the H100 and H200)")
    p.add_argument("--quick", action="store_true",
                   help=f"smaller: {', '.join(f'{k}={v}' for k, v in QUICK.items())} unless given")
    p.add_argument("--layers", type=int, help="L (default 48)")
    p.add_argument("--layer-mib", type=int, help="S in MiB (default 256: 12 GiB of weights)")
    p.add_argument("--passes", type=int, default=4, help="forward's reads of its layer (default 4)")
    p.add_argument("--steps", type=int, help="steps per run (default 8)")
    p.add_argument("--warmup", type=int, help="first steps left out of the median (default 3)")
    p.add_argument("--budget", help="psshim's GPU budget (default: a quarter of the weights)")
    p.add_argument("--iters-pcie", type=int, default=0, help="ITERS of the pcie setting (default 0)")
    p.add_argument("--iters-compute", type=int, help="ITERS of the compute setting (default: calibrated)")
    p.add_argument("--calibration-iters", type=int, default=CALIBRATION_ITERS,
                   help=f"ITERS of the calibration run (default {CALIBRATION_ITERS})")
    p.add_argument("--settings", default=",".join(SETTINGS), help="comma separated (default: pcie,compute)")
    p.add_argument("--modes", default=",".join(MODES[1:]),
                   help="psshim's runs beside native, comma separated, of static and psshim (its defaults) "
                        "(default: static,psshim)")
    p.add_argument("--chunk-size", help="PSSHIM_CHUNK_SIZE of every psshim run (default: psshim's)")
    p.add_argument("--timeout", type=float, default=150, help="seconds one run may take (default 150)")
    p.add_argument("--max-total-s", type=float, default=540,
                   help="start no run after this many seconds, so that the call fits one 600 s device command; "
                        "0: no limit (default 540)")
    p.add_argument("--commit", help="psshim's build, kept in the JSON (default: a commit file beside the library, "
                   "LIB.commit, .gpu/commit, else git describe)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "pipeline.json"))
    p.add_argument("--dry-run", action="store_true", help="print the runs' commands and stop")
    a = p.parse_args(argv)
    for name, full in dict(layers=48, layer_mib=256, steps=8, warmup=3).items():
        if getattr(a, name) is None:
            setattr(a, name, QUICK[name] if a.quick else full)
    a.settings = [s.strip() for s in a.settings.split(",") if s.strip()]
    if not a.settings or any(s not in SETTINGS for s in a.settings):
        p.error(f"--settings: choose from {', '.join(SETTINGS)}")
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not a.modes or any(m not in MODES[1:] for m in a.modes):
        p.error(f"--modes: choose from {', '.join(MODES[1:])}")
    if min(a.layers, a.layer_mib, a.passes, a.steps) < 1 or not 0 <= a.warmup < a.steps:
        p.error("--layers, --layer-mib, --passes, --steps must be positive and --warmup below --steps")
    a.weights = a.layers * a.layer_mib << 20
    a.budget = benchlib.parse_size(a.budget) if a.budget else a.weights // 4
    a.psshim = os.path.abspath(a.psshim or next(
        (c for c in (os.path.join(REPO, "build-gpu", "tools", "psshim"), os.path.join(REPO, ".gpu", "libpsshim.so"))
         if os.path.isfile(c)), os.path.join(REPO, "build-gpu", "tools", "psshim")))
    a.preload = a.psshim.endswith(".so")
    a.lib = a.psshim if a.preload else os.path.join(os.path.dirname(os.path.dirname(a.psshim)), "libpsshim.so")
    a.out = os.path.abspath(a.out)
    a.runs_dir = os.path.splitext(a.out)[0] + "_runs"
    return a


# ----------------------------------------------------------------------------- arithmetic


def least_traffic(layers: int, resident: int) -> tuple[int, int]:
    """Layers fetched and written back in a steady step by OPT (Belady: the fewest fetches)
    with `resident` layers of GPU frames, over pipeline.cu's order: forward 0..L-1 reading,
    backward L-1..0 writing; a written layer is written back when evicted. Simulates three
    steps and counts the last."""
    if resident >= layers:
        return 0, 0
    order = [(j if j < layers else 2 * layers - 1 - j, j >= layers) for j in range(2 * layers)] * 3
    on_gpu, dirty, fetched, written_back = set(), set(), 0, 0
    last_step = 4 * layers
    for g, (layer, writes) in enumerate(order):
        if layer not in on_gpu:
            if len(on_gpu) >= resident:
                def next_use(m):
                    return next((h for h in range(g + 1, len(order)) if order[h][0] == m), len(order))
                victim = max(sorted(on_gpu), key=next_use)
                on_gpu.discard(victim)
                if victim in dirty:
                    dirty.discard(victim)
                    written_back += g >= last_step
            on_gpu.add(layer)
            fetched += g >= last_step
        if writes:
            dirty.add(layer)
    return fetched, written_back


def link_bound(a) -> dict:
    """The fewest bytes each way per step at the budget, and their time on the link."""
    resident = a.budget // (a.layer_mib << 20)
    fetched, written = least_traffic(a.layers, resident)
    h2d, d2h = fetched * (a.layer_mib << 20), written * (a.layer_mib << 20)
    return {"resident_layers": resident, "h2d_bytes": h2d, "d2h_bytes": d2h, "link_s": paging_sweep.link_s(h2d, d2h)}


def calibrated_iters(t_zero: float, t_cal: float, cal_iters: int, target_s: float) -> int:
    """ITERS for a native step of target_s, the step linear in ITERS through (0, t_zero) and
    (cal_iters, t_cal)."""
    per_iter = (t_cal - t_zero) / cal_iters
    if per_iter <= 0:
        raise ValueError(f"a step at ITERS={cal_iters} ({t_cal:.4f} s) is no slower than at 0 ({t_zero:.4f} s)")
    return max(1, round((target_s - t_zero) / per_iter))


def touch_pct(stats) -> float | None:
    """psshim's chunk touches served from host frames, in percent of all: in its steady
    iterations where it counted them there, else over the run; None: none counted."""
    if not isinstance(stats, dict):
        return None
    prefix = "steady_" if stats.get("steady_touches_gpu") or stats.get("steady_touches_host") else ""
    place = stats.get(prefix + "touches_host") or 0
    total = place + (stats.get(prefix + "touches_gpu") or 0)
    return round(100.0 * place / total, 3) if total else None


def weights_verdict(checksums: list) -> str | None:
    """"differ" when two runs that finished gave different checksums, "identical" when all
    finished with one, None when some did not finish and those that did agree."""
    done = [c for c in checksums if c is not None]
    if len(set(done)) > 1:
        return "differ"
    return "identical" if done and len(done) == len(checksums) else None


# ----------------------------------------------------------------------------- running


def build(a) -> dict:
    """The binary, built with nvcc when missing or older than its source."""
    if a.binary:
        a.binary = os.path.abspath(a.binary)
        return {"binary": a.binary, "built": False}
    a.binary = DEFAULT_BINARY
    cmd = [a.nvcc, "-O2", f"-arch={a.arch}", "-cudart", "shared", "-o", a.binary, SOURCES[0], "-ldl"]
    fresh = os.path.isfile(a.binary) and all(os.path.getmtime(a.binary) >= os.path.getmtime(s) for s in SOURCES)
    info = {"binary": a.binary, "built": not fresh, "build_command": shlex.join(cmd)}
    if not fresh and not a.dry_run:
        os.makedirs(os.path.dirname(a.binary), exist_ok=True)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode:
            raise RuntimeError(f"nvcc failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return info


def make_run(a, setting: str, mode: str, iters, steps: int | None = None, warmup: int | None = None,
             name: str | None = None) -> paging_sweep.Run:
    name = name or f"{setting}_{mode}"
    base = os.path.join(a.runs_dir, name)
    program = [a.binary, f"L={a.layers}", f"S_MB={a.layer_mib}", f"PASSES={a.passes}", f"ITERS={iters}",
               f"STEPS={steps or a.steps}", f"WARMUP={a.warmup if warmup is None else warmup}"]
    run = paging_sweep.Run(name=name, method=mode, ratio=None, budget=None, argv=program, log_path=base + ".log")
    if mode == "native":
        return run
    run.budget, run.ratio, run.stats_path = a.budget, a.weights / a.budget, base + ".stats.json"
    budget = f"{a.budget >> 20}M" if a.budget % (1 << 20) == 0 else str(a.budget)
    policy = {"static": "static", "psshim": None}[mode]  # psshim: its defaults
    chunk = ["--chunk-size", a.chunk_size] if a.chunk_size else []
    if a.preload:
        run.env = {"LD_PRELOAD": a.lib, "PSSHIM_GPU_BUDGET": budget, "PSSHIM_STATS": run.stats_path}
        if policy:
            run.env["PSSHIM_POLICY"] = policy
        if a.chunk_size:
            run.env["PSSHIM_CHUNK_SIZE"] = a.chunk_size
    else:
        run.argv = [a.psshim, "--budget", budget, *(["--policy", policy] if policy else []), *chunk,
                    "--stats", run.stats_path, "--", *program]
    return run


def result_of(log_path: str):
    """The program's JSON line: the last line of its output that parses as an object."""
    try:
        with open(log_path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


class Runner:
    def __init__(self, a):
        self.a, self.t0 = a, time.time()

    def run(self, run: paging_sweep.Run) -> dict:
        """Runs it under the time left; its record (status, the program's result, psshim's stats)."""
        left = self.a.max_total_s - (time.time() - self.t0) if self.a.max_total_s else self.a.timeout
        rec = {"name": run.name, "command": run.shell(), "log": run.log_path, "stats_file": run.stats_path}
        if left < 20:
            return dict(rec, status="skipped", reason=f"--max-total-s {self.a.max_total_s:g} reached")
        outcome = paging_sweep.execute(run, min(self.a.timeout, left))
        result = result_of(run.log_path)
        status = "timeout" if outcome["timed_out"] else "ok" if outcome["returncode"] == 0 and result else "error"
        rec.update(status=status, returncode=outcome["returncode"], wall_s=round(outcome["wall_s"], 2),
                   result=result)
        if status != "ok":
            rec["tail"] = paging_sweep.log_tail(run.log_path, 6)
        if run.stats_path:
            stats = paging_sweep.fresh_json(run.stats_path, outcome["started"])
            rec["stats"] = {k: stats[k] for k in STATS_KEYS if k in stats} if isinstance(stats, dict) else None
            rec["inplace_touch_pct"] = touch_pct(stats)
            if result is not None and not result.get("psshim"):
                rec.update(status="error", reason="psshim was not loaded")
        step = (result or {}).get("step_s_median") if rec["status"] == "ok" else None
        print(f"  {run.name}: {rec['status']}" + (f", {step:.4f} s a step" if step is not None else "") +
              (f" ({rec.get('reason') or rec.get('tail', '')})" if rec["status"] != "ok" else ""), flush=True)
        return rec


def step_of(rec) -> float | None:
    return rec["result"]["step_s_median"] if rec and rec.get("status") == "ok" else None


def checksum_of(rec) -> str | None:
    return rec["result"]["weights_checksum"] if rec and rec.get("status") == "ok" else None


def row(setting: str, iters, recs: dict, bound: dict) -> dict:
    native, static, psshim = (step_of(recs.get(m)) for m in MODES)
    bound_s = max(native, bound["link_s"]) if native is not None else None
    return {"setting": setting, "iters": iters, "native_s": native, "static_s": static, "psshim_s": psshim,
            "bound_s": bound_s, "weights": weights_verdict([checksum_of(recs.get(m)) for m in MODES if m in recs]),
            "inplace_touch_pct": (recs.get("psshim") or {}).get("inplace_touch_pct"),
            "psshim_over_bound": round(psshim / bound_s, 3) if psshim and bound_s else None,
            "static_over_bound": round(static / bound_s, 3) if static and bound_s else None,
            "native_over_link": round(native / bound["link_s"], 3) if native and bound["link_s"] else None,
            "modes": recs}


def card() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name())"],
                             capture_output=True, text=True, timeout=120)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def commit(a) -> str | None:
    if a.commit:
        return a.commit
    for path in (os.path.join(os.path.dirname(a.lib), "commit"), a.lib + ".commit",
                 os.path.join(REPO, ".gpu", "commit")):
        try:
            with open(path) as f:
                if text := f.read().strip():
                    return text
        except OSError:
            pass
    try:
        return subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def fmt_row(r: dict) -> list:
    f = benchlib.fmt
    return [r["setting"], str(r["iters"]), f(r["native_s"], ".4f"), f(r["static_s"], ".4f"), f(r["psshim_s"], ".4f"),
            f(r["bound_s"], ".4f"), f(r["psshim_over_bound"], ".2f"), r["weights"] or "-",
            f(r["inplace_touch_pct"], ".1f")]


def main(argv=None) -> int:
    a = parse_args(argv)
    # Inherited PSSHIM_* settings would change what "psshim's defaults" means; those that
    # only say where a library is stay.
    dropped = sorted(k for k in os.environ if k.startswith("PSSHIM_") and k not in KEEP_ENV)
    for k in dropped:
        del os.environ[k]
    # What libpsshim.so links, where the GPU machine may lack it: tests/gpu/pack.sh puts
    # libunwind beside the library in .gpu/.
    found = [d for d in (os.path.dirname(a.lib), os.path.join(REPO, ".gpu")) if os.path.isdir(d)]
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(found + [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(
        os.pathsep) if d])
    bound = link_bound(a)
    doc = {"commit": commit(a), "card": None if a.dry_run else card(), "command": shlex.join(sys.argv),
           "psshim": a.psshim, "L": a.layers, "S_MB": a.layer_mib, "passes": a.passes, "steps": a.steps,
           "warmup": a.warmup, "budget_bytes": a.budget, "weights_bytes": a.weights,
           "bytes_per_step_each_way": a.weights, "least_traffic": bound,
           "copy_rates_bytes_per_s": {"h2d": benchlib.H2D_BYTES_PER_S, "d2h": benchlib.D2H_BYTES_PER_S,
                                      "both": benchlib.DUPLEX_BYTES_PER_S},
           "bound": "max(native_s, least_traffic's h2d/h2d_rate, d2h/d2h_rate, (h2d+d2h)/both_rate)",
           "dropped_env": dropped, "runs": []}
    try:
        doc["build"] = build(a)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        print(f"pipeline: {e}", file=sys.stderr)
        return 1
    if a.dry_run:
        print(doc["build"].get("build_command", f"(built: {a.binary})"))
        for setting in a.settings:
            iters = a.iters_pcie if setting == "pcie" else a.iters_compute or "<calibrated>"
            for mode in ("native", *a.modes):
                print(make_run(a, setting, mode, iters).shell())
        return 0
    if not a.preload and not os.path.isfile(a.lib):
        print(f"pipeline: {a.lib} (beside the launcher {a.psshim}) is missing: build psshim or give --psshim",
              file=sys.stderr)
        return 1
    os.makedirs(a.runs_dir, exist_ok=True)
    runner, recs = Runner(a), {s: {} for s in SETTINGS}
    print(f"pipeline: {a.layers} layers x {a.layer_mib} MiB, budget {a.budget >> 20} MiB ({bound['resident_layers']} "
          f"layers); at least {bound['h2d_bytes'] / 1e9:.2f} GB in, {bound['d2h_bytes'] / 1e9:.2f} GB out a step: "
          f"{bound['link_s']:.4f} s on the link", flush=True)
    iters = {"pcie": a.iters_pcie, "compute": a.iters_compute}

    def save():
        doc["runs"] = [row(s, iters[s], recs[s], bound) for s in a.settings]
        doc["wall_s"] = round(time.time() - runner.t0, 1)
        benchlib.write_json(a.out, doc)

    # Native first, both settings, so that every comparison has its baseline; the compute
    # setting's ITERS from the native steps at 0 and at --calibration-iters.
    if "compute" in a.settings and iters["compute"] is None:
        shared = "pcie" in a.settings and a.iters_pcie == 0  # the pcie setting's native run is the step at 0
        zero = runner.run(make_run(a, "pcie", "native", 0, name=None if shared else "zero"))
        if shared:
            recs["pcie"]["native"] = zero
        cal = runner.run(make_run(a, "compute", "native", a.calibration_iters, steps=3, warmup=1, name="calibration"))
        target = COMPUTE_OVER_LINK * bound["link_s"]
        doc["calibration"] = {"iters": a.calibration_iters, "step_s": step_of(cal), "zero_step_s": step_of(zero),
                              "target_s": target, "runs": [zero, cal]}
        try:
            if step_of(zero) is None or step_of(cal) is None:
                raise ValueError("a calibration run failed")
            iters["compute"] = calibrated_iters(step_of(zero), step_of(cal), a.calibration_iters, target)
        except ValueError as e:
            print(f"pipeline: calibrating ITERS for the compute setting: {e}", file=sys.stderr)
            save()
            return 1
        print(f"  compute setting: ITERS={iters['compute']}", flush=True)
    for setting in a.settings:
        if "native" not in recs[setting]:
            recs[setting]["native"] = runner.run(make_run(a, setting, "native", iters[setting]))
        save()
    for setting in a.settings:
        for mode in a.modes:
            recs[setting][mode] = runner.run(make_run(a, setting, mode, iters[setting]))
            save()
    save()
    print(f"\nwrote {a.out} (runs' output and statistics in {a.runs_dir}); card {doc['card'] or '?'}, build "
          f"{doc['commit'] or '?'}; bound = max(native, {bound['link_s']:.4f} s: the fewest bytes a step at the budget "
          f"moves each way at benchlib's copy rates)\n")
    print(benchlib.format_table(["setting", "ITERS", "native s", "static s", "psshim s", "bound s",
                                 "psshim/bound", "weights", "in place %"],
                                [fmt_row(r) for r in doc["runs"]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
