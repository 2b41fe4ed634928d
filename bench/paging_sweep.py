#!/usr/bin/env python3
"""Paging benchmark: step time of one GPT workload at GPU budgets below its native peak.

First a native run without a budget measures the peak (torch.cuda.max_memory_allocated:
weights, gradients, optimizer state, activations) and the step time. Then, for each
ratio R, budget = peak / R and each method runs bench/gpt_train.py as a subprocess with a
timeout:

  psshim-auto    LD_PRELOAD=<--psshim-lib> PSSHIM_GPU_BUDGET=<budget> PSSHIM_POLICY=auto
                 PSSHIM_STATS=<file>.json (bytes_h2d, bytes_d2h, steps are read from it)
  psshim-static  the same with PSSHIM_POLICY=static
  fsdp-offload   FSDP2 fully_shard + CPUOffloadPolicy(pin_memory=True), world size 1,
                 torch memory fraction = budget (gpt_train.py --fsdp-offload --memory-budget)
  deepspeed-offload  DeepSpeed ZeRO-Offload (ZeRO-2, optimizer on the host, DeepSpeedCPUAdam),
                 memory fraction = budget (gpt_train.py --deepspeed-offload --memory-budget),
                 with PYTHONPATH=bench/deepspeed/site (bench/deepspeed/install.sh's target)
  native-budget  plain torch with memory fraction = budget; only run where budget >= the
                 native peak (below it, it cannot fit and is recorded as skipped)

Per run it records the median step time (warm-up excluded), TFLOPS, bytes copied per step
each way and the achieved copy bandwidth (bytes per step / step time), the lower bound
max(native step, H2D bytes / 55.4e9, D2H bytes / 55.3e9, both / 96.4e9) from the copy
rates measured on the H200 (policy/policy.h's PSP_PCIE_*), the bytes that crossed PCIe each way per step as
NVML's counters saw them (gpt_train.py's "pcie": copies and kernels' in-place reads of host
memory alike, which psshim's copy counters miss) and the same bound from those bytes
("PCIe bound") and native step plus their time on the link ("PCIe serial": the step if
no byte crossed while compute ran, as with reads in place by a serial optimizer step),
the serial bound of psshim's runs (serial_bound: the native step less its optimizer
step, plus the least bytes the optimizer step must bring onto the GPU at 55.4 GB/s),
bitwise loss match against the native run
(--deterministic), and OOM / timeout / error. It writes one JSON (--out, rewritten after
every run so a killed sweep keeps what it measured), a PNG plot, and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import benchlib

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_SCRIPT = os.path.join(HERE, "gpt_train.py")
METHODS = ("psshim-auto", "psshim-static", "fsdp-offload", "deepspeed-offload", "native-budget", "psshim-auto-base")
DEFAULT_METHODS = list(METHODS)
SIZE_FLAGS = ("layers", "hidden", "heads", "seq", "batch", "vocab")
FSDP_BYTES_NOTE = ("estimate, no counters: fp32 parameters copied host->device in forward and "
                   "again in backward (4+4 B/param), fp32 gradients device->host (4 B/param)")
DEEPSPEED_BYTES_NOTE = ("estimate, no counters: gradients cast to fp32 on the GPU and copied "
                        "device->host (4 B/param), bf16 parameters host->device after the host "
                        "step (2 B/param) (DeepSpeed 0.19.8 stage_1_and_2.py, bf16)")
DEEPSPEED_SITE = os.path.join(HERE, "deepspeed", "site")  # bench/deepspeed/install.sh's target


# ----------------------------------------------------------------------------- options


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1]
        + "\nArguments after '--' are passed to gpt_train.py unchanged.\n\nExample:\n"
        "  python bench/paging_sweep.py --psshim-lib build/libpsshim.so --out $OUT/sweep.json\n"
        "  python bench/paging_sweep.py --dry-run --peak 40.7G",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--psshim-lib", metavar="PATH",
                   help="libpsshim.so to preload (required by the psshim-* methods)")
    p.add_argument("--psshim-lib-base", metavar="PATH",
                   help="an earlier build's libpsshim.so for the psshim-auto-base method: "
                        "before and after side by side in one call")
    p.add_argument("--preset", choices=sorted(benchlib.PRESETS), default="gpt2.7b",
                   help="gpt_train.py preset (default: gpt2.7b)")
    for name in SIZE_FLAGS:
        p.add_argument(f"--{name}", type=int, help=f"override the preset's --{name}")
    p.add_argument("--steps", type=int, default=12, help="steps per run (default: 12)")
    p.add_argument("--warmup", type=int, default=7,
                   help="steps excluded from the median (default: 7: psshim auto finds the "
                        "iteration's period in its first 4-6 steps and pages by it after)")
    p.add_argument("--ratios", type=parse_floats, default=[1.0, 1.25, 1.5, 2.0, 3.0, 4.0],
                   help="peak/budget ratios, comma separated (default: 1,1.25,1.5,2,3,4)")
    p.add_argument("--methods", type=parse_methods, default=DEFAULT_METHODS,
                   help=f"comma separated subset of {','.join(METHODS)} (default: all)")
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds per run before it is killed (default: 300)")
    p.add_argument("--max-total-s", type=float, default=540,
                   help="stop starting runs after this many seconds of the whole sweep, so it "
                        "fits one 600 s device command; 0 = no limit (default: 540)")
    p.add_argument("--peak", type=benchlib.parse_size,
                   help="use this peak (bytes, e.g. 40.7G) for the budgets instead of the "
                        "native run's; needed by --dry-run for concrete numbers")
    p.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True,
                   help="pass --deterministic to the native and psshim runs so their losses "
                        "can match bitwise (FSDP and DeepSpeed never: their numerics differ) "
                        "(default: on)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "paging_sweep.json"),
                   help="result JSON (default: bench/results/paging_sweep.json); per-run "
                        "logs and JSON go to <out without .json>_runs/")
    p.add_argument("--plot", help="PNG path (default: --out with .png)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter for gpt_train.py (default: this one)")
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    p.add_argument("--merge", nargs="+", metavar="JSON[:RATIOS][#METHODS][@BUILD]",
                   help="run nothing: join the runs of these sweep JSONs (one preset and peak; "
                        "each run keeps its own call's native reference) into --out, its plot "
                        "and tables, when one device call cannot hold every ratio; only the runs "
                        "of RATIOS and of METHODS (comma separated; default --methods) are kept, "
                        "and BUILD names the build of psshim runs that do not name one")
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    a = p.parse_args(argv[:cut])
    a.extra = argv[cut + 1:]
    a.plot = a.plot or os.path.splitext(a.out)[0] + ".png"
    a.runs_dir = os.path.splitext(a.out)[0] + "_runs"
    if any(m.startswith("psshim") for m in a.methods) and not a.dry_run and not a.merge:
        if not a.psshim_lib or not os.path.isfile(a.psshim_lib):
            p.error("--psshim-lib must name an existing libpsshim.so for the psshim methods")
    if "psshim-auto-base" in a.methods and not a.dry_run and not a.merge and not (
            a.psshim_lib_base and os.path.isfile(a.psshim_lib_base)):
        p.error("--psshim-lib-base must name an existing libpsshim.so for psshim-auto-base")
    for name in ("psshim_lib", "psshim_lib_base"):
        if getattr(a, name):
            setattr(a, name, os.path.abspath(getattr(a, name)))
    return a


def parse_floats(text: str) -> list:
    values = [float(x) for x in text.split(",") if x.strip()]
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("expected positive numbers, e.g. 1,1.5,2")
    return values


def parse_methods(text: str) -> list:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise argparse.ArgumentTypeError(f"unknown method(s) {unknown}; choose from {METHODS}")
    return methods


# ----------------------------------------------------------------------------- planning


@dataclass
class Run:
    name: str
    method: str                 # "native" for the baseline
    ratio: float | None
    budget: int | None          # None: no budget (baseline) or not known yet (dry run)
    argv: list
    env: dict = field(default_factory=dict)   # added to the inherited environment
    json_path: str = ""
    log_path: str = ""
    stats_path: str | None = None
    skip_reason: str | None = None
    build: str | None = None    # the psshim library's build (tests/gpu/pack.sh's LIB.commit)

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)


def build_of(lib: str | None) -> str | None:
    """The build tests/gpu/pack.sh wrote beside a library (LIB.commit), or None."""
    try:
        with open(f"{lib}.commit") as f:
            return f.read().strip() or None
    except (OSError, TypeError):
        return None


def train_argv(a: argparse.Namespace, json_path: str, *flags: str) -> list:
    argv = [a.python, TRAIN_SCRIPT, "--preset", a.preset, "--steps", str(a.steps),
            "--warmup", str(a.warmup), "--json", json_path]
    for name in SIZE_FLAGS:
        if getattr(a, name) is not None:
            argv += [f"--{name}", str(getattr(a, name))]
    return argv + list(flags) + a.extra


def make_run(a, method: str, ratio: float | None, budget: int | None,
             native_peak: int | None) -> Run:
    name = "native" if method == "native" else f"{method}_r{ratio:g}"
    base = os.path.join(a.runs_dir, name)
    run = Run(name=name, method=method, ratio=ratio, budget=budget, argv=[],
              json_path=base + ".json", log_path=base + ".log")
    det = ["--deterministic"] if a.deterministic else []
    if method == "native":
        run.argv = train_argv(a, run.json_path, *det)
        return run
    budget_text = str(budget) if budget is not None else f"<peak/{ratio:g}>"
    if method.startswith("psshim"):
        run.stats_path = base + ".psshim.json"
        # The library's folder is searched for what it links (tests/gpu/pack.sh puts
        # libunwind beside it: the GPU machine may lack it).
        libs = os.environ.get("LD_LIBRARY_PATH")
        lib = a.psshim_lib_base if method == "psshim-auto-base" else a.psshim_lib
        run.build = build_of(lib)
        run.env = {"LD_PRELOAD": lib or "<libpsshim.so>",
                   "PSSHIM_GPU_BUDGET": budget_text,
                   "PSSHIM_POLICY": method.split("-")[1],
                   "PSSHIM_STATS": run.stats_path}
        if lib:
            run.env["LD_LIBRARY_PATH"] = os.path.dirname(os.path.abspath(lib)) + (
                os.pathsep + libs if libs else "")
        run.argv = train_argv(a, run.json_path, *det)
    elif method == "fsdp-offload":
        run.argv = train_argv(a, run.json_path, "--fsdp-offload", "--memory-budget", budget_text)
    elif method == "deepspeed-offload":
        path = os.environ.get("PYTHONPATH")
        run.env = {"PYTHONPATH": DEEPSPEED_SITE + (os.pathsep + path if path else "")}
        run.argv = train_argv(a, run.json_path, "--deepspeed-offload", "--memory-budget", budget_text)
    else:  # native-budget
        run.argv = train_argv(a, run.json_path, "--memory-budget", budget_text, *det)
        fits = budget >= native_peak if None not in (budget, native_peak) else ratio <= 1.0
        if not fits:
            run.skip_reason = "budget below the native peak: cannot fit"
    return run


def plan(a, peak: int | None) -> list:
    return [make_run(a, method, r, int(peak / r) if peak else None, peak)
            for r in a.ratios for method in a.methods]


# ----------------------------------------------------------------------------- running


def execute(run: Run, timeout: float) -> dict:
    """Run one gpt_train.py subprocess (own process group) and return the raw outcome."""
    start = time.time()
    proc = benchlib.spawn(run.argv, dict(os.environ, **run.env), run.log_path, run.shell())
    timed_out = False
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        rc = stop_process_group(proc)
    return {"returncode": rc, "timed_out": timed_out, "wall_s": time.time() - start,
            "started": start}


def stop_process_group(proc: subprocess.Popen) -> int:
    """SIGTERM the run's own process group, SIGKILL it if still there after 15 s."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def fresh_json(path: str | None, since: float):
    """The JSON at path if it was written by this run (not left from an earlier sweep)."""
    try:
        if path is None or os.path.getmtime(path) < since - 1:
            return None
    except OSError:
        return None
    return benchlib.load_json(path)


def log_tail(path: str, lines: int = 4) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).rstrip()
    except OSError:
        return ""


def status_of(outcome: dict, result) -> str:
    if outcome["timed_out"]:
        return "timeout"
    if (result or {}).get("oom") or outcome["returncode"] == benchlib.EXIT_OOM:
        return "oom"
    if outcome["returncode"] != 0 or not result:
        return "error"
    return "ok"


# ----------------------------------------------------------------------------- metrics


def copy_bytes(run: Run, result: dict, stats, params: int | None) -> dict:
    """Bytes copied per step each way: psshim's counters, or the FSDP or DeepSpeed estimate."""
    steps = len(result.get("loss_hex", [])) if result else 0
    if run.method.startswith("psshim"):
        if not isinstance(stats, dict) or "bytes_h2d" not in stats:
            return {"bytes_basis": "no psshim stats file" if stats is None else
                    "psshim stats without bytes_h2d/bytes_d2h"}
        n = stats.get("steps") or steps
        basis = "psshim stats / psshim 'steps'" if stats.get("steps") else \
            "psshim stats / training steps (includes start-up and warm-up)"
        if not n:
            return {"bytes_basis": "no steps"}
        return {"bytes_h2d_per_step": stats.get("bytes_h2d", 0) / n,
                "bytes_d2h_per_step": stats.get("bytes_d2h", 0) / n, "bytes_basis": basis}
    if run.method == "fsdp-offload" and params:
        return {"bytes_h2d_per_step": 8.0 * params, "bytes_d2h_per_step": 4.0 * params,
                "bytes_basis": FSDP_BYTES_NOTE}
    if run.method == "deepspeed-offload" and params:
        return {"bytes_h2d_per_step": 2.0 * params, "bytes_d2h_per_step": 4.0 * params,
                "bytes_basis": DEEPSPEED_BYTES_NOTE}
    return {"bytes_h2d_per_step": 0.0, "bytes_d2h_per_step": 0.0, "bytes_basis": "no paging"}


def link_s(h2d: float, d2h: float) -> float:
    """Seconds these bytes take on the link at the copy rates measured on the H200."""
    return max(h2d / benchlib.H2D_BYTES_PER_S, d2h / benchlib.D2H_BYTES_PER_S,
               (h2d + d2h) / benchlib.DUPLEX_BYTES_PER_S)


def lower_bound(native_step: float | None, h2d: float | None, d2h: float | None):
    if native_step is None or h2d is None or d2h is None:
        return None
    return max(native_step, link_s(h2d, d2h))


def serial_bound(native: dict | None, budget: int | None) -> dict:
    """The least a placement that keeps the optimizer step on the GPU (psshim's) can take a
    step, as psshim-report's LEAST TRAFFIC argues: the step reads all of the parameters,
    gradients and state (native's optimizer_data_bytes); what the budget cannot hold when
    it begins crosses PCIe while it runs, at the copy rate at best; and on one stream it
    begins after the rest of the step, which runs no faster than natively. {} without the
    native run's numbers."""
    data, opt_s = (native or {}).get("optimizer_data_bytes"), (native or {}).get("median_optimizer_s")
    step = (native or {}).get("median_step_s")
    if not data or opt_s is None or step is None or budget is None:
        return {}
    least = max(0, data - budget)
    return {"least_h2d_per_step": least,
            "serial_bound_s": step - opt_s + least / benchlib.H2D_BYTES_PER_S}


def record(run: Run, outcome: dict, native: dict | None) -> dict:
    """Everything the sweep JSON keeps about one run."""
    result = fresh_json(run.json_path, outcome["started"]) if outcome else None
    stats = fresh_json(run.stats_path, outcome["started"]) if outcome else None
    rec = {"name": run.name, "method": run.method, "ratio": run.ratio,
           "budget_bytes": run.budget, "command": run.shell(), "log": run.log_path,
           "json": run.json_path}
    if run.build:
        rec["build"] = run.build
    if outcome is None:
        rec["status"] = "skipped"
        rec["reason"] = run.skip_reason
        return rec
    rec.update(status=status_of(outcome, result), returncode=outcome["returncode"],
               wall_s=round(outcome["wall_s"], 2))
    if rec["status"] != "ok":
        rec["error"] = (result or {}).get("error") or log_tail(run.log_path)
    if not result:
        return rec
    mem = result.get("memory") or {}
    step = result.get("median_step_s")
    rec.update(steps_run=len(result.get("loss_hex", [])), median_step_s=step,
               tflops=result.get("tflops"), param_count=result.get("param_count"),
               peak_allocated_bytes=mem.get("peak_allocated_bytes"),
               peak_reserved_bytes=mem.get("peak_reserved_bytes"),
               peak_device_used_bytes=mem.get("peak_device_used_bytes"),
               device_name=result.get("device_name"), torch_version=result.get("torch_version"),
               median_optimizer_s=result.get("median_optimizer_s"),
               optimizer_data_bytes=result.get("optimizer_data_bytes"))
    if stats is not None:
        rec["psshim_stats"] = stats
    pcie = result.get("pcie") or {}
    if pcie.get("h2d_bytes_per_step") is not None:
        rec.update(pcie_h2d_per_step=pcie["h2d_bytes_per_step"], pcie_d2h_per_step=pcie["d2h_bytes_per_step"])
        native_step = (native or {}).get("median_step_s", step)
        rec["pcie_bound_s"] = lower_bound(native_step, rec["pcie_h2d_per_step"], rec["pcie_d2h_per_step"])
        # The step if no byte on the link overlapped compute, as reads in place by a
        # serial optimizer step cannot.
        rec["pcie_serial_s"] = native_step + link_s(rec["pcie_h2d_per_step"], rec["pcie_d2h_per_step"])
    elif pcie.get("error"):
        rec["pcie_error"] = pcie["error"]
    if run.method == "native" or not rec["steps_run"]:
        return rec
    rec.update(copy_bytes(run, result, stats, (native or {}).get("param_count")))
    h2d, d2h = rec.get("bytes_h2d_per_step"), rec.get("bytes_d2h_per_step")
    if step and h2d is not None:
        rec["h2d_gbps"], rec["d2h_gbps"] = h2d / step / 1e9, d2h / step / 1e9
    rec["bound_s"] = lower_bound((native or {}).get("median_step_s"), h2d, d2h)
    if run.method.startswith("psshim"):
        rec.update(serial_bound(native, run.budget))
    if native and native.get("loss_hex") and result.get("loss_hex"):
        cmp = benchlib.compare_loss_hex(native["loss_hex"], result["loss_hex"])
        rec["loss_match"], rec["first_loss_mismatch"] = cmp.identical, cmp.first_mismatch
    return rec


# ----------------------------------------------------------------------------- output


def native_summary(native_rec: dict, native_result) -> dict:
    out = dict(native_rec)
    if native_result:
        out["loss_hex"] = native_result.get("loss_hex")
        out["config"] = native_result.get("config")
        out["flops_formula"] = native_result.get("flops_formula")
    return out


def progress(i: int, total: int, rec: dict) -> None:
    budget = rec.get("budget_bytes")
    what = rec["name"] + (f" (budget {benchlib.gib(budget)} GiB)" if budget else "")
    if rec["status"] == "ok":
        detail = (f"{rec['median_step_s']:.3f} s/step, "
                  f"{benchlib.fmt(rec.get('tflops'), '.1f')} TFLOPS")
    else:
        lines = (rec.get("reason") or rec.get("error") or "").strip().splitlines()
        detail = lines[-1] if lines else ""
    wall = f" in {rec['wall_s']:.0f} s" if "wall_s" in rec else ""
    print(f"[{i}/{total}] {what}: {rec['status']}{wall}  {detail}", flush=True)


def table(sweep: dict) -> str:
    rows = []
    for r in [sweep["native"]] + sweep["runs"]:
        loss = {True: "identical", False: f"differs@{r.get('first_loss_mismatch')}"}.get(
            r.get("loss_match"), "-")
        if r["method"] == "native":
            loss = "reference"
        bound = r.get("bound_s")
        approx = "~" if str(r.get("bytes_basis", "")).startswith("estimate") else ""
        gb = lambda key: approx + benchlib.fmt(r[key] / 1e9, ".2f") if key in r else "-"
        rows.append([
            benchlib.fmt(r.get("ratio"), "g"), benchlib.gib(r.get("budget_bytes")), r["method"],
            r["status"], benchlib.fmt(r.get("median_step_s")), benchlib.fmt(r.get("tflops"), ".1f"),
            gb("bytes_h2d_per_step"), gb("bytes_d2h_per_step"),
            benchlib.fmt(r.get("h2d_gbps"), ".1f"), benchlib.fmt(r.get("d2h_gbps"), ".1f"),
            benchlib.fmt(bound),
            benchlib.fmt(bound / r["median_step_s"] if bound and r.get("median_step_s") else None,
                         ".0%"),
            f"{r['pcie_h2d_per_step'] / 1e9:.2f}/{r['pcie_d2h_per_step'] / 1e9:.2f}" if "pcie_h2d_per_step" in r else "-",
            benchlib.fmt(r.get("pcie_bound_s")), benchlib.fmt(r.get("pcie_serial_s")),
            loss])
    return benchlib.format_table(
        ["ratio", "budget GiB", "method", "status", "step s", "TFLOPS", "H2D GB/step",
         "D2H GB/step", "H2D GB/s", "D2H GB/s", "bound s", "bound/step", "PCIe GB in/out",
         "PCIe bound s", "PCIe serial s", "losses"], rows)


def serial_table(sweep: dict) -> str | None:
    """psshim's runs against serial_bound; None if none has it."""
    rows = [[benchlib.fmt(r.get("ratio"), "g"), r["method"], benchlib.fmt(r.get("median_step_s")),
             benchlib.fmt(r["least_h2d_per_step"] / 1e9, ".2f"), benchlib.fmt(r["serial_bound_s"]),
             benchlib.fmt(r["median_step_s"] / r["serial_bound_s"] if r.get("median_step_s") else None, ".0%")]
            for r in sweep["runs"] if "serial_bound_s" in r]
    if not rows:
        return None
    return benchlib.format_table(["ratio", "method", "step s", "least GB in", "serial bound s", "step/bound"], rows)


def pager_table(sweep: dict) -> str | None:
    """What psshim's pager did in each psshim run (its PSSHIM_STATS JSON); None if no run
    left statistics."""
    rows = []
    for r in sweep["runs"]:
        s = r.get("psshim_stats")
        if not isinstance(s, dict):
            continue
        touches = (s.get("touches_gpu") or 0) + (s.get("touches_host") or 0)
        steps = r.get("steps_run") or 0

        def ms_per_step(key):
            return benchlib.fmt(s[key] / 1e6 / steps if steps and key in s else None, ".0f")
        rows.append([
            benchlib.fmt(r.get("ratio"), "g"), r["method"], str(s.get("migrations_to_gpu", "-")),
            str(s.get("migrations_to_host", "-")), str(s.get("copy_waits", "-")),
            benchlib.fmt(100.0 * s["touches_host"] / touches if touches else None, ".1f"),
            str(s.get("period", "-")), str(s.get("plan_builds", "-")), str(s.get("owner_fetches", "-")),
            str(s.get("owner_demand_fetches", "-")), str(s.get("owner_missed", "-")),
            ms_per_step("move_ns"), ms_per_step("remap_ns"), ms_per_step("owner_wait_ns"),
            ms_per_step("gate_wait_ns"), str(s.get("late_waits", "-")), ms_per_step("launch_ns")])
    if not rows:
        return None
    return benchlib.format_table(
        ["ratio", "method", "moves in", "moves out", "copy waits", "host touch %", "period",
         "plans", "owner fetches", "asked", "missed", "move ms/step", "remap ms/step", "owner wait ms/step",
         "gate wait ms/step", "late waits", "launch ms/step"], rows)


def steady_table(sweep: dict) -> str | None:
    """Each psshim run's steady iteration as its PSSHIM_STATS gives it (medians over the
    trusted iterations after the first, measured between psshim's own iteration
    boundaries): the launching threads' time in the pager, and apart from it the allocating
    threads' time making room by age (room ms; builds before it: -); None if no run has one."""
    rows = []
    for r in sweep["runs"]:
        s = r.get("psshim_stats")
        if not isinstance(s, dict) or not s.get("steady_iterations"):
            continue
        rows.append([
            benchlib.fmt(r.get("ratio"), "g"), r["method"], str(s["steady_iterations"]),
            benchlib.fmt(s["steady_wall_ns"] / 1e9, ".3f"), benchlib.fmt(s["steady_launch_ns"] / 1e6, ".1f"),
            benchlib.fmt(s["steady_pager_pct"], ".1f"),
            benchlib.fmt(s["steady_room_ns"] / 1e6, ".1f") if "steady_room_ns" in s else "-",
            benchlib.fmt(s["steady_remap_ns"] / 1e6, ".1f"),
            benchlib.fmt(s["steady_bytes_h2d"] / 1e9, ".2f"), benchlib.fmt(s["steady_bytes_d2h"] / 1e9, ".2f"),
            benchlib.fmt(r["least_h2d_per_step"] / 1e9, ".2f") if "least_h2d_per_step" in r else "-",
            str(s["steady_late_waits"])])
    if not rows:
        return None
    return benchlib.format_table(
        ["ratio", "method", "iterations", "iteration s", "pager ms", "pager %", "room ms", "remap ms", "moved in GB",
         "moved out GB", "least in GB", "late waits"], rows)


def plot(sweep: dict, path: str) -> str | None:
    """Step time vs ratio per method, with each method's lower bound (and for psshim's, native
    step plus the link time of the bytes NVML saw cross, and its serial bound); None when done."""
    plt = benchlib.pyplot()
    if plt is None:
        return benchlib.NO_PLOT
    fig, ax = plt.subplots(figsize=(9, 5.5))
    native_step = sweep["native"].get("median_step_s")
    if native_step:
        ax.axhline(native_step, color="black", ls="--", lw=1, label="native, no budget")
    for method in sweep["methods"]:
        runs = [r for r in sweep["runs"] if r["method"] == method]
        ok = [r for r in runs if r["status"] == "ok"]
        line, = ax.plot([r["ratio"] for r in ok], [r["median_step_s"] for r in ok], "o-",
                        label=method)
        bounded = [r for r in ok if r.get("bound_s") and
                   (r.get("bytes_h2d_per_step") or r.get("bytes_d2h_per_step"))]
        if bounded:
            ax.plot([r["ratio"] for r in bounded], [r["bound_s"] for r in bounded], ":",
                    color=line.get_color(), label=f"{method} lower bound")
        serial = [r for r in ok if r.get("pcie_serial_s")]
        if method.startswith("psshim") and serial:  # its in-place traffic does not overlap compute
            ax.plot([r["ratio"] for r in serial], [r["pcie_serial_s"] for r in serial], "-.", lw=1,
                    color=line.get_color(), label=f"{method}: native + its PCIe bytes' link time")
        least = [r for r in ok if r.get("serial_bound_s")]
        if least:
            ax.plot([r["ratio"] for r in least], [r["serial_bound_s"] for r in least], "--", lw=1,
                    color=line.get_color(), label=f"{method}: serial bound (optimizer step's least bytes)")
        for r in runs:
            if r["status"] not in ("ok", "skipped"):
                ax.annotate(r["status"].upper(), (r["ratio"], 0.02), color=line.get_color(),
                            xycoords=("data", "axes fraction"), ha="center", fontsize=7,
                            rotation=90)
    ratios = sweep["ratios"]
    budgets = {r["ratio"]: r.get("budget_bytes") for r in sweep["runs"]}
    ax.set_xticks(ratios)
    ax.set_xticklabels([f"{x:g}\n{benchlib.gib(budgets.get(x), 1)} GiB" for x in ratios])
    ax.set_xlabel("native peak / GPU budget  (budget below)")
    ax.set_ylabel("median step time (s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    cfg = sweep["native"].get("config") or {}
    ax.set_title(f"{sweep['preset']}: L={cfg.get('layers')} h={cfg.get('hidden')} "
                 f"s={cfg.get('seq')} B={cfg.get('batch')}; "
                 f"native peak {benchlib.gib(sweep.get('peak_bytes'))} GiB", fontsize=10)
    benchlib.save_figure(fig, ax, path)
    return None


# ----------------------------------------------------------------------------- main


def dry_run(a) -> int:
    native = make_run(a, "native", None, None, None)
    print(f"# runs go to {a.runs_dir}/; budget = peak / ratio"
          + ("" if a.peak else " (peak measured by the native run; give --peak for numbers)"))
    print(native.shell())
    for run in plan(a, a.peak):
        print(f"# skipped: {run.skip_reason}\n# " if run.skip_reason else "", end="")
        print(run.shell())
    return 0


def report(a, sweep: dict) -> int:
    """Plots the sweep, writes its JSON and prints its tables."""
    note = plot(sweep, a.plot)
    sweep["plot"] = None if note else a.plot
    benchlib.write_json(a.out, sweep)
    print(f"\nwrote {a.out}" + (f" and {a.plot}" if not note else f" ({note})"))
    print(f"native peak {benchlib.gib(sweep['peak_bytes'])} GiB ({sweep['peak_source']}); "
          f"bound = {sweep['bound']}; ~ = estimated bytes\n")
    print(table(sweep))
    serial = serial_table(sweep)
    if serial:
        print("\npsshim against its serial bound: the native step less its optimizer step, plus "
              "the least bytes the optimizer step must bring in (all it reads, less the budget) "
              f"at {benchlib.H2D_BYTES_PER_S / 1e9:g} GB/s (see serial_bound)")
        print(serial)
    pager = pager_table(sweep)
    if pager:
        print("\npsshim's pager (PSSHIM_STATS): moves, launches that waited for a copy, chunk "
              "touches served from host frames, the adopted period (launches), plans made, the "
              "owner's fetches, those launches asked for, and those it missed; host time per step "
              "(over all steps) moving (copies queued and remaps), remapping alone, the owner's "
              "waits for launches and the GPU, the launching threads' waits for their moments, "
              "launches that waited for a remap, and the launching threads' whole time in the pager")
        print(pager)
    steady = steady_table(sweep)
    if steady:
        print("\npsshim's steady iteration (PSSHIM_STATS: medians over the trusted iterations after "
              "the first): its wall time, the launching threads' time in the pager and its share, the allocating threads' time making room by age (not in the "
              "pager's), the driver's remap time, the bytes moved each way, beside the "
              "least bytes in (serial bound), and launches that waited for a remap")
        print(steady)
    return 0


def merge_part(item: str, methods: list) -> dict:
    """One --merge item, PATH[:RATIOS][#METHODS][@BUILD]: the sweep JSON at PATH with only the
    runs of RATIOS (comma separated; default all) and of METHODS (default `methods`), so that
    one part can give a ratio's peer and another the build of psshim the sweep is of; BUILD
    names the build of its psshim runs that do not name one (parts run before runs recorded it)."""
    path, _, build = item.partition("@")
    path, _, only = path.partition("#")
    if only:
        methods = [m for m in parse_methods(only) if m in methods]
    path, _, ratios = path.rpartition(":") if ":" in path else (path, "", "")
    keep = set(parse_floats(ratios)) if ratios else None
    part = json.load(open(path))
    part["runs"] = [run for run in part["runs"] if run["method"] in methods
                    and (keep is None or run["ratio"] in keep)]
    for run in part["runs"]:
        if build and run["method"].startswith("psshim") and not run.get("build"):
            run["build"] = build
    return part


def merge(a) -> int:
    try:
        parts = [merge_part(item, a.methods) for item in a.merge]
    except (OSError, ValueError, KeyError, argparse.ArgumentTypeError) as e:
        print(f"paging_sweep: --merge: {e}", file=sys.stderr)
        return 1
    keys = {(part["preset"], part.get("peak_bytes")) for part in parts}
    if len(keys) != 1:
        print(f"paging_sweep: --merge needs sweeps of one preset and peak, got {sorted(keys, key=str)}",
              file=sys.stderr)
        return 1
    sweep = dict(parts[0], argv=sys.argv[1:], merged_from=[part["argv"] for part in parts],
                 wall_s=sum(part.get("wall_s", 0) for part in parts))
    sweep["runs"] = sorted((run for part in parts for run in part["runs"]),
                           key=lambda run: (run["ratio"], METHODS.index(run["method"])))
    sweep["ratios"] = sorted({run["ratio"] for run in sweep["runs"]})
    sweep["methods"] = [m for m in METHODS if any(run["method"] == m for run in sweep["runs"])]
    return report(a, sweep)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.dry_run:
        return dry_run(a)
    if a.merge:
        return merge(a)
    t0 = time.time()
    sweep = {"script": "paging_sweep.py", "argv": sys.argv[1:], "preset": a.preset,
             "ratios": a.ratios, "methods": a.methods, "steps": a.steps, "warmup": a.warmup,
             "deterministic": a.deterministic,
             "psshim_lib": a.psshim_lib, "psshim_lib_base": a.psshim_lib_base, "copy_rates_bytes_per_s": {
                 "h2d": benchlib.H2D_BYTES_PER_S, "d2h": benchlib.D2H_BYTES_PER_S,
                 "both": benchlib.DUPLEX_BYTES_PER_S},
             "bound": "max(native median step, h2d/h2d_rate, d2h/d2h_rate, (h2d+d2h)/both_rate)",
             "native": {}, "runs": []}

    native_run = make_run(a, "native", None, None, None)
    outcome = execute(native_run, a.timeout)
    native_result = fresh_json(native_run.json_path, outcome["started"])
    sweep["native"] = native_summary(record(native_run, outcome, None), native_result)
    progress(0, len(a.ratios) * len(a.methods), sweep["native"])
    peak = a.peak or sweep["native"].get("peak_allocated_bytes")
    sweep["peak_bytes"], sweep["peak_source"] = peak, "--peak" if a.peak else "native run"
    benchlib.write_json(a.out, sweep)
    if not peak:
        print(f"paging_sweep: the native run gave no peak ({sweep['native']['status']}); "
              f"give --peak. Log: {native_run.log_path}", file=sys.stderr)
        return 1

    runs = plan(a, peak)
    for i, run in enumerate(runs, 1):
        remaining = a.max_total_s - (time.time() - t0) if a.max_total_s else a.timeout
        if run.skip_reason is None and remaining < 30:
            run.skip_reason = f"sweep time limit (--max-total-s {a.max_total_s:g}) reached"
        outcome = None if run.skip_reason else execute(run, min(a.timeout, remaining))
        rec = record(run, outcome, sweep["native"])
        sweep["runs"].append(rec)
        progress(i, len(runs), rec)
        benchlib.write_json(a.out, sweep)

    sweep["wall_s"] = round(time.time() - t0, 1)
    return report(a, sweep)


if __name__ == "__main__":
    sys.exit(main())
