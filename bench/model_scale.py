#!/usr/bin/env python3
"""Model scale: the largest GPT of the bundled family that trains 10 steps with finite losses
on one GPU and its host, for each method, with its step time and TFLOPS.

The family is bench/gpt_train.py's GPT at sequence 1024, batch 8, vocabulary 32000, bf16
autocast, fused AdamW and activation checkpointing, widened and deepened from the gpt2.7b
preset (L32 h2560) towards L64 h8192: a ladder of rungs (hidden a multiple of 128, heads of
128, layers within 3 of the line from 32 at 2560 to 64 at 8192, neither shrinking from one
rung to the next), each ~1.08x the parameters of the last. Methods:

  native             gpt_train.py on the GPU alone
  fsdp-offload       FSDP2 fully_shard + CPUOffloadPolicy(pin_memory=True), world size 1
  deepspeed-offload  DeepSpeed ZeRO-Offload (ZeRO-2, optimizer state and step on the host) with
                     PYTHONPATH=bench/deepspeed/site (bench/deepspeed/install.sh); skipped
                     when DeepSpeed is not installed there
  psshim             LD_PRELOAD=<--psshim-lib> at psshim's defaults: every PSSHIM_* variable is
                     removed from the probes' environment (--psshim-env adds some back, and
                     then names the method "psshim VAR=VALUE ...")

Before each probe it estimates the bytes the rung needs where each method keeps them: 16
bytes a parameter of mixed-precision AdamW model data (fp32 weights, gradients, two moments)
and the activations (the checkpointed fp32 residual stream and the logits, a lower bound;
plus one block's recomputed activations and gradients, the estimate). A rung whose lower
bound exceeds the method's capacity cannot fit: it is recorded as skipped, with why, and run
never. Capacities: GPU memory less 1 GiB of CUDA context; host memory (--host-mem) less
--host-reserve; psshim's budgets (its GPU budget: GPU memory less min(2 GiB, a quarter); its
host budget: 50% of host memory), replaced by the budgets its statistics report once a
psshim probe has run.

Per method the search starts at --start (default: the largest rung whose estimate fits),
grows while probes train (steps of 1, 1, 2, 4 rungs), steps down while they fail (the same),
then bisects between the largest that trained and the smallest that did not. Each probe is
gpt_train.py in its own process group under --timeout; outcomes: ok, oom-gpu, oom-host (an
allocation on the host failed, or host memory in use came within --host-guard of
--host-mem and the probe was stopped), oom-budgets (psshim's out-of-both-budgets line),
killed (SIGKILL not sent here: the host's OOM killer, most likely), timeout, nonfinite
(a loss not finite), error (which stops that method's search: not a size limit), cut (the
call's --max-total-s ran out during it), skipped. Then each method runs at the largest
rung of each --refs method where it fits (e.g. psshim at native's largest; with --refs-first
before its search, where its estimate says it likely fits).

Every probe records the build commit ($MODEL_SCALE_COMMIT, else `git rev-parse HEAD` of
this checkout with +dirty for uncommitted changes, else "unknown"), its exact command, the
time to its first step (the run's JSON first holding a step, to within --poll-s), the peak
host memory in use and RSS of its process group, and under psshim the budgets, frames and
frame-making time its statistics report. After --max-total-s it starts no probe, writes what
it has and exits 0; --prior feeds earlier calls' outcomes to the search and --merge joins
calls into one result: JSON (--out), a table (.txt), a plot (.png) and the short table last.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import resource
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import benchlib
import paging_sweep

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = ("native", "fsdp-offload", "deepspeed-offload", "psshim")
METHOD_FLAGS = {"native": [], "fsdp-offload": ["--fsdp-offload"],
                "deepspeed-offload": ["--deepspeed-offload"], "psshim": []}
COMMIT_ENV = "MODEL_SCALE_COMMIT"
CONTEXT_BYTES = benchlib.GIB  # CUDA context, cuBLAS workspace: outside any estimate
# Outcomes that say the rung does not train; "ok" says it does; the rest say nothing of size.
FAILS = ("oom-gpu", "oom-host", "oom-budgets", "killed", "timeout", "nonfinite")
PSSHIM_OOM = re.compile(r"psshim:.*out of memory.*budget.*", re.IGNORECASE)
HOST_OOM = re.compile(r"can't allocate memory|cannot allocate memory|\bMemoryError\b|pin_memory|HostAllocator",
                      re.IGNORECASE)  # \b: not torch's OutOfMemoryError
# The lent H200 and its host (tests/gpu/model_scale.sh): what --dry-run assumes where there is no GPU.
ASSUMED_GPU = ("NVIDIA H200 (assumed: no nvidia-smi here)", 143771 << 20)
ASSUMED_HOST = 128 * benchlib.GIB


# ----------------------------------------------------------------------------- the ladder


@dataclass(frozen=True)
class Rung:
    name: str
    layers: int
    hidden: int
    heads: int
    params: int


def param_count(layers: int, hidden: int, vocab: int, seq: int) -> int:
    """Parameters of gpt_train.py's GPT (untied head): per block 12h^2 + 13h (QKV, projection,
    two MLP matrices, their biases, two LayerNorms), token and position embeddings, final
    LayerNorm, LM head."""
    return layers * (12 * hidden ** 2 + 13 * hidden) + 2 * vocab * hidden + seq * hidden + 2 * hidden


def ladder(vocab: int, seq: int, step: float = 1.08) -> list:
    """The rungs from gpt2.7b's shape to L64 h8192 (see the module's help)."""
    line = lambda h: 32 + (h - 2560) * 32 / (8192 - 2560)
    shapes = [(L, h, param_count(L, h, vocab, seq)) for h in range(2560, 8193, 128)
              for L in range(32, 65) if abs(L - line(h)) <= 3]
    out = [(32, 2560, param_count(32, 2560, vocab, seq))]
    while True:
        L0, h0, p0 = out[-1]
        bigger = [s for s in shapes if s[0] >= L0 and s[1] >= h0 and s[2] > p0]
        if not bigger:
            break
        out.append(min(bigger, key=lambda s: (abs(math.log(s[2] / (p0 * step))), abs(s[0] - line(s[1])))))
    return [Rung(f"L{L}h{h}", L, h, h // 128, p) for L, h, p in out]


def parse_count(text: str) -> float:
    """Parameters from '6B', '6.5B', '800M', '6e9'."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([kmbt]?)\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a parameter count: {text!r} (e.g. 6B, 800M)")
    return float(m.group(1)) * 10 ** (3 * " kmbt".index(m.group(2).lower() or " "))


def select(rungs: list, spec: str | None) -> list:
    """The rungs a --sizes spec names: rung names and parameter ranges (6B-14B, 0-9B, 10B-)."""
    if not spec:
        return list(rungs)
    by_name, keep = {r.name.lower(): r for r in rungs}, set()
    for token in filter(None, (t.strip() for t in spec.split(","))):
        if token.lower() in by_name:
            keep.add(by_name[token.lower()].name)
        elif "-" in token:
            lo, hi = token.split("-", 1)
            lo, hi = parse_count(lo) if lo else 0, parse_count(hi) if hi else math.inf
            keep.update(r.name for r in rungs if lo <= r.params <= hi)
        else:
            raise SystemExit(f"model_scale: --sizes: {token!r} is neither a rung "
                             f"({rungs[0].name} ... {rungs[-1].name}) nor a range like 6B-14B")
    return [r for r in rungs if r.name in keep]


# ----------------------------------------------------------------------------- machine and estimates


def meminfo() -> dict:
    """/proc/meminfo in bytes ({} where there is none)."""
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        return int(text) if text.isdigit() and int(text) < 1 << 60 else None
    return None


def gpu_info() -> tuple | None:
    """(name, total bytes) of the first GPU from nvidia-smi, or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=30, check=True).stdout.splitlines()[0]
        name, mib = out.rsplit(",", 1)
        return name.strip(), int(float(mib)) << 20
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def machine_info(a) -> dict:
    """What the estimates assume and what was seen: GPU, host memory, limits."""
    gpu, mem = gpu_info(), meminfo()
    host = (a.host_mem, "--host-mem") if a.host_mem else (cgroup_limit(), "cgroup limit") if cgroup_limit() \
        else (mem.get("MemTotal"), "MemTotal")
    if a.gpu_mem:
        gpu = (gpu[0] if gpu else "GPU", a.gpu_mem)
    elif gpu is None:
        if not a.dry_run:
            raise SystemExit("model_scale: nvidia-smi does not answer: give --gpu-mem")
        gpu, host = ASSUMED_GPU, host if a.host_mem else (ASSUMED_HOST, "assumed: the lent H200's host")
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return {"gpu_name": gpu[0], "gpu_bytes": gpu[1], "host_bytes": host[0], "host_bytes_source": host[1],
            "mem_total_at_start": mem.get("MemTotal"),
            "cgroup_limit": cgroup_limit(), "cpus": os.cpu_count(),
            "memlock_rlimit": [None if v == resource.RLIM_INFINITY else v for v in memlock],
            "host_reserve": a.host_reserve, "host_guard": a.host_guard}


def psshim_budgets(machine: dict, env: dict, seen: dict | None) -> tuple:
    """psshim's (GPU, host) budgets and where they come from: those its statistics reported,
    else PSSHIM_GPU_BUDGET and PSSHIM_HOST_BUDGET from --psshim-env, else its defaults (README:
    the device's memory less min(2 GiB, a quarter); 50% of the host's)."""
    if seen and seen.get("gpu_budget") and seen.get("host_budget"):
        return seen["gpu_budget"], seen["host_budget"], "reported by psshim"
    g, host = machine["gpu_bytes"], machine["host_bytes"]
    size = lambda text, total: int(total * float(text[:-1]) / 100) if text.endswith("%") else benchlib.parse_size(text)
    gb = size(env["PSSHIM_GPU_BUDGET"], g) if "PSSHIM_GPU_BUDGET" in env else g - min(2 * benchlib.GIB, g // 4)
    given = [k for k in ("PSSHIM_GPU_BUDGET", "PSSHIM_HOST_BUDGET") if k in env]
    return gb, size(env.get("PSSHIM_HOST_BUDGET", "50%"), host), " and ".join(given) or "psshim's defaults"


def activations(r: Rung, a) -> tuple:
    """(lower bound, estimate) of activation bytes on the GPU with each block checkpointed:
    the blocks' inputs (the residual stream stays fp32 under autocast) and the logits (bf16,
    then fp32); the estimate adds one block's recomputed activations and their gradients
    (2 x 34 bytes x tokens x hidden, Korthikanti et al. 2022 without the attention scores
    flash attention never stores) and the logits' fp32 gradient."""
    tokens = a.batch * a.seq
    lower = 4 * r.layers * tokens * r.hidden + 6 * tokens * a.vocab
    return lower, lower + 68 * tokens * r.hidden + 4 * tokens * a.vocab


def estimate(method: str, r: Rung, a, machine: dict, env: dict, seen: dict | None = None) -> dict:
    """Bytes the rung needs on the GPU and the host under `method` (lower bound and
    estimate), the capacities, and the verdict: cannot fit (lower bound over), maybe
    (estimate over), likely."""
    model = 16 * r.params
    act_lo, act = activations(r, a)
    gpu_cap = machine["gpu_bytes"] - CONTEXT_BYTES
    host_cap = machine["host_bytes"] - machine["host_reserve"]
    basis = "16 B/param model data + activations"
    if method == "native":
        need = [(model + act_lo, 0), (model + act, 0)]
    elif method == "fsdp-offload":  # all model data pinned on the host; one block at a time on the GPU
        need = [(act_lo, model), (act + 2 * 2 * 12 * r.hidden ** 2, model)]
    elif method == "deepspeed-offload":  # bf16 weights and gradients on the GPU, the rest on the host
        need = [(4 * r.params + act_lo, model), (4 * r.params + act, model)]
    else:  # psshim: GPU frames up to the GPU budget, host frames beyond it
        gpu_budget, host_budget, basis_b = psshim_budgets(machine, env, seen)
        gpu_cap, host_cap = gpu_budget, min(host_budget, host_cap)
        need = [(min(t, gpu_budget), max(0, t - gpu_budget)) for t in (model + act_lo, model + act)]
        basis += f"; psshim budgets GPU {benchlib.gib(gpu_budget, 1)} GiB, host " \
                 f"{benchlib.gib(host_budget, 1)} GiB ({basis_b})"
    over = lambda g, h: g > gpu_cap or h > host_cap
    verdict = "cannot fit" if over(*need[0]) else "maybe" if over(*need[1]) else "likely"
    return {"gpu_bytes": need[1][0], "host_bytes": need[1][1], "gpu_bytes_lower": need[0][0],
            "host_bytes_lower": need[0][1], "gpu_capacity": gpu_cap, "host_capacity": host_cap,
            "verdict": verdict, "basis": basis}


def why_not(est: dict) -> str:
    where = "GPU" if est["gpu_bytes_lower"] > est["gpu_capacity"] else "host"
    return (f"cannot fit: needs at least {benchlib.gib(est[where.lower() + '_bytes_lower'], 1)} GiB "
            f"on the {where} ({est['basis']}), {benchlib.gib(est[where.lower() + '_capacity'], 1)} GiB there")


# ----------------------------------------------------------------------------- probes


def commit_info() -> dict:
    if os.environ.get(COMMIT_ENV):
        return {"commit": os.environ[COMMIT_ENV], "commit_source": f"${COMMIT_ENV}"}
    try:
        git = lambda *args: subprocess.run(["git", "-C", HERE, *args], capture_output=True, text=True,
                                           timeout=30, check=True).stdout.strip()
        dirty = "+dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
        return {"commit": git("rev-parse", "HEAD") + dirty, "commit_source": "git"}
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "commit_source": f"no git and no ${COMMIT_ENV}"}


def sha256(path: str | None) -> str | None:
    if not path or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def label_of(method: str, env: dict) -> str:
    return " ".join([method] + [f"{k}={v}" for k, v in env.items()]) if method == "psshim" else method


def make_run(a, method: str, r: Rung) -> paging_sweep.Run:
    """The probe's command: gpt_train.py at rung r under `method`, its files in the runs folder."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", label_of(method, a.psshim_env))
    base = os.path.join(a.runs_dir, f"{slug}_{r.name}")
    run = paging_sweep.Run(name=f"{label_of(method, a.psshim_env)} {r.name}", method=method, ratio=None,
                           budget=None, argv=[a.python, a.train_script, "--preset", "gpt2.7b"],
                           json_path=base + ".json", log_path=base + ".log")
    for flag, value in (("layers", r.layers), ("hidden", r.hidden), ("heads", r.heads), ("seq", a.seq),
                        ("batch", a.batch), ("vocab", a.vocab), ("steps", a.steps), ("warmup", a.warmup)):
        run.argv += [f"--{flag}", str(value)]
    run.argv += ["--checkpoint", "--json", run.json_path] + METHOD_FLAGS[method] + a.extra
    if method == "psshim":
        run.stats_path = base + ".psshim.json"
        lib = a.psshim_lib or "<libpsshim.so>"
        run.env = {"LD_PRELOAD": lib, "PSSHIM_STATS": run.stats_path, **a.psshim_env}
        if a.psshim_lib:  # the library's folder: pack.sh puts libunwind there
            run.env["LD_LIBRARY_PATH"] = os.pathsep.join(
                filter(None, [os.path.dirname(lib), os.environ.get("LD_LIBRARY_PATH")]))
    elif method == "deepspeed-offload":
        run.env = {"PYTHONPATH": os.pathsep.join(filter(None, [paging_sweep.DEEPSPEED_SITE,
                                                                os.environ.get("PYTHONPATH")]))}
    return run


def group_rss(pgid: int) -> int:
    """Resident bytes of every process in the group (from /proc/PID/stat)."""
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 21 and int(fields[2]) == pgid:
            total += int(fields[21]) * page
    return total


def execute(run: paging_sweep.Run, a, timeout: float, host_limit: int) -> dict:
    """Run the probe without the caller's PSSHIM_* variables, watching it every --poll-s:
    its first step, host memory in use and its RSS; stop it (process group) at the timeout
    or when host memory in use passes host_limit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PSSHIM_")}
    env.update(run.env)
    mem0 = meminfo()
    seen = {"mem_total_start": mem0.get("MemTotal"), "mem_total_end": None, "first_step_s": None,
            "host_used_start": mem0.get("MemTotal", 0) - mem0.get("MemAvailable", 0),
            "peak_host_used": 0, "peak_rss": 0, "stopped": None}
    start = time.time()
    proc = benchlib.spawn(run.argv, env, run.log_path, run.shell())
    while True:
        try:
            rc = proc.wait(timeout=a.poll_s)
            break
        except subprocess.TimeoutExpired:
            pass
        mem = meminfo()
        used = mem.get("MemTotal", 0) - mem.get("MemAvailable", 0)
        seen["peak_host_used"] = max(seen["peak_host_used"], used)
        seen["peak_rss"] = max(seen["peak_rss"], group_rss(proc.pid))
        if seen["first_step_s"] is None and (paging_sweep.fresh_json(run.json_path, start) or {}).get("steps"):
            seen["first_step_s"] = round(time.time() - start, 2)
        if used > host_limit:  # stopped at once: host memory is about to run out
            seen["stopped"] = f"host memory in use reached {benchlib.gib(used, 1)} GiB, past " \
                              f"{benchlib.gib(host_limit, 1)} GiB (--host-mem less --host-guard)"
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
            break
        if time.time() - start > timeout:
            seen["stopped"] = "timeout"
            rc = paging_sweep.stop_process_group(proc)
            break
    seen["mem_total_end"] = meminfo().get("MemTotal")
    return {"returncode": rc, "wall_s": round(time.time() - start, 2), "started": start, **seen}


def log_text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def last_lines(log: str, n: int = 3) -> str:
    return " | ".join(log.strip().splitlines()[-n:])


def classify(outcome: dict, result: dict | None, log: str, steps: int, cut: bool) -> tuple:
    """(status, reason) of a finished probe (see the module's help)."""
    result = result or {}
    error = result.get("error") or ""
    psshim_line = PSSHIM_OOM.search(log)
    stopped, rc = outcome.get("stopped"), outcome["returncode"]
    if stopped == "timeout":
        return ("cut", "the call's time limit (--max-total-s) cut it short") if cut else \
            ("timeout", f"no {steps} steps within the timeout ({len(result.get('loss', []))} made)")
    if stopped:
        return "oom-host", f"stopped: {stopped}"
    failed = result.get("oom") or rc != 0
    if psshim_line and failed:  # an allocation torch retried after freeing its cache may say it too
        return "oom-budgets", psshim_line.group(0).strip()
    if result.get("oom") or rc == benchlib.EXIT_OOM:
        host = HOST_OOM.search(error + log[-4000:])
        return ("oom-host" if host else "oom-gpu"), (error or last_lines(log))[:2000]
    if rc in (-9, 137):
        return "killed", "SIGKILL, not sent by model_scale: the host's OOM killer, most likely"
    losses = result.get("loss") or []
    if rc != 0 or not result.get("finished") or len(losses) < steps:
        return "error", (error or last_lines(log) or f"exit {rc}")[:2000]
    bad = [i for i, v in enumerate(losses) if not isinstance(v, (int, float)) or not math.isfinite(v)]
    if bad:
        return "nonfinite", f"loss not finite at step(s) {bad}"
    return "ok", psshim_line and f"trained, though it logged: {psshim_line.group(0).strip()}"


# ----------------------------------------------------------------------------- the search


def next_index(n: int, known: dict, start: int) -> int | None:
    """The next of n rungs (ascending) to probe, given known outcomes (index -> trained?), or
    None once the largest that trains is found (or none does): from `start`, grow while
    probes train and step down while they fail, by 1, 1, 2, 4 ... rungs, then bisect between
    the largest that trained and the smallest above it that did not."""
    lo = max((i for i, ok in known.items() if ok), default=-1)
    hi = min((i for i, ok in known.items() if not ok and i > lo), default=n)
    if hi - lo <= 1:
        return None
    if lo >= 0 and hi < n:
        return (lo + hi) // 2
    if hi == n:  # nothing above lo failed yet: grow
        return start if lo < start else min(n - 1, lo + max(1, lo - start))
    return start if start < hi else max(0, hi - max(1, start - hi))  # nothing trained yet: step down


class TimeUp(Exception):
    """--max-total-s leaves no time for another probe."""


class Probes:
    """One call: its probes (written to --out after each), the outcomes of --prior calls."""

    def __init__(self, a, machine: dict, rungs: list, prior_rows: list):
        self.a, self.machine, self.rungs, self.prior = a, machine, rungs, prior_rows
        self.by_name = {r.name: r for r in ladder(a.vocab, a.seq)}
        self.commit = commit_info()
        self.t0 = time.time()
        self.psshim_seen = None  # the budgets psshim's statistics reported
        self.result = {"script": "model_scale.py", "argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                       **self.commit, "settings": settings(a), "machine": machine,
                       "psshim_lib": a.psshim_lib, "psshim_lib_sha256": sha256(a.psshim_lib),
                       "psshim_env": a.psshim_env, "methods": [label_of(m, a.psshim_env) for m in a.methods],
                       "ladder": [asdict(r) for r in rungs], "prior": a.prior, "probes": [], "stopped": None}

    def rows(self, label: str) -> list:
        return [r for r in self.prior + self.result["probes"] if r["label"] == label]

    def known(self, label: str, rungs: list) -> dict:
        index = {r.name: i for i, r in enumerate(rungs)}
        out = {}
        for row in self.rows(label):
            if row["rung"] in index and (row["status"] in FAILS + ("ok",) or row.get("cannot_fit")):
                out[index[row["rung"]]] = row["status"] == "ok"
        return out

    def save(self) -> None:
        self.result["wall_s"] = round(time.time() - self.t0, 1)
        benchlib.write_json(self.a.out, self.result)

    def probe(self, method: str, r: Rung) -> dict:
        a = self.a
        run = make_run(a, method, r)
        label = label_of(method, a.psshim_env)
        est = estimate(method, r, a, self.machine, a.psshim_env, self.psshim_seen)
        row = {"label": label, "method": method, "rung": r.name, "layers": r.layers, "hidden": r.hidden,
               "heads": r.heads, "params": r.params, "estimate": est, "command": run.shell(),
               "env_removed": sorted(k for k in os.environ if k.startswith("PSSHIM_") and k not in run.env),
               "commit": self.commit["commit"], "log": run.log_path, "json": run.json_path}
        unavailable = method_unavailable(method)
        if est["verdict"] == "cannot fit" or unavailable:
            row.update(status="skipped", reason=unavailable or why_not(est), cannot_fit=not unavailable)
            return self.add(row)
        remaining = a.max_total_s - (time.time() - self.t0) if a.max_total_s else math.inf
        if remaining < a.min_probe_s:
            raise TimeUp(f"--max-total-s {a.max_total_s:g} reached before {label} at {r.name}")
        timeout = min(a.timeout, remaining - 10)
        print(f"model_scale: {label} at {r.name} ({r.params / 1e9:.2f}B): estimate GPU "
              f"{benchlib.gib(est['gpu_bytes'], 1)}/{benchlib.gib(est['gpu_capacity'], 1)} GiB, host "
              f"{benchlib.gib(est['host_bytes'], 1)}/{benchlib.gib(est['host_capacity'], 1)} GiB ({est['verdict']}); "
              f"timeout {timeout:.0f} s", flush=True)
        outcome = execute(run, a, timeout, self.machine["host_bytes"] - a.host_guard)
        result = paging_sweep.fresh_json(run.json_path, outcome["started"])
        stats = paging_sweep.fresh_json(run.stats_path, outcome["started"])
        status, reason = classify(outcome, result, log_text(run.log_path), a.steps, timeout < a.timeout)
        row.update(status=status, reason=reason, **{k: outcome[k] for k in (
            "returncode", "wall_s", "first_step_s", "mem_total_start", "mem_total_end", "host_used_start",
            "peak_host_used", "peak_rss")})
        if result:
            mem = result.get("memory") or {}
            row.update(steps_run=len(result.get("loss", [])), median_step_s=result.get("median_step_s"),
                       tflops=result.get("tflops"), param_count=result.get("param_count"),
                       peak_allocated_bytes=mem.get("peak_allocated_bytes"),
                       peak_device_used_bytes=mem.get("peak_device_used_bytes"),
                       step0_s=(result.get("step_times_s") or [None])[0],
                       device_name=result.get("device_name"), torch_version=result.get("torch_version"))
            if row["param_count"] not in (None, r.params):
                row["reason"] = f"gpt_train counted {row['param_count']} parameters, the ladder {r.params}"
        if isinstance(stats, dict):
            row["psshim_stats"] = stats
            self.psshim_seen = {k: stats.get(k) for k in ("gpu_budget", "host_budget")}
        return self.add(row)

    def add(self, row: dict) -> dict:
        self.result["probes"].append(row)
        self.save()
        detail = f"{benchlib.fmt(row.get('median_step_s'))} s/step, {benchlib.fmt(row.get('tflops'), '.1f')} " \
                 f"TFLOPS, first step at {benchlib.fmt(row.get('first_step_s'), '.1f')} s" \
            if row["status"] == "ok" else (row.get("reason") or "")[:300]
        wall = f" in {row['wall_s']:.0f} s" if "wall_s" in row else ""
        print(f"model_scale: {row['label']} at {row['rung']}: {row['status']}{wall}  {detail}", flush=True)
        return row

    def search(self, method: str) -> None:
        label, rungs = label_of(method, self.a.psshim_env), self.rungs
        start = self.start_index(method)
        while (i := next_index(len(rungs), self.known(label, rungs), start)) is not None:
            row = self.probe(method, rungs[i])
            if row["status"] == "cut":
                raise TimeUp(f"--max-total-s {self.a.max_total_s:g} reached during {label} at {row['rung']}")
            if row["status"] not in FAILS + ("ok",) and not row.get("cannot_fit"):
                print(f"model_scale: {label}: {row['status']} at {row['rung']} is no size limit: "
                      "its search stops here", flush=True)
                return

    def start_index(self, method: str) -> int:
        names = [r.name for r in self.rungs]
        if method in self.a.start:
            if self.a.start[method] not in names:
                raise SystemExit(f"model_scale: --start {method}={self.a.start[method]}: not a rung of --sizes")
            return names.index(self.a.start[method])
        verdicts = [estimate(method, r, self.a, self.machine, self.a.psshim_env, self.psshim_seen)["verdict"]
                    for r in self.rungs]
        for wanted in ("likely", "maybe"):
            if wanted in verdicts:
                return len(verdicts) - 1 - verdicts[::-1].index(wanted)
        return 0

    def largest(self, label: str) -> Rung | None:
        ok = [self.by_name[r["rung"]] for r in self.rows(label) if r["status"] == "ok" and r["rung"] in self.by_name]
        return max(ok, key=lambda r: r.params, default=None)

    def refs(self, method: str, first: bool = False) -> None:
        """The method at each --refs method's largest rung, where that is not above its own
        largest (first: before its search, where its estimate says it likely fits)."""
        label = label_of(method, self.a.psshim_env)
        for ref in self.a.refs:
            target, mine = self.largest(ref), self.largest(label)
            if ref == label or not target or target.name in {r["rung"] for r in self.rows(label)}:
                continue
            if (estimate(method, target, self.a, self.machine, self.a.psshim_env, self.psshim_seen)["verdict"]
                    == "likely" if first else mine and target.params <= mine.params):
                self.probe(method, target)


def method_unavailable(method: str) -> str | None:
    if method == "deepspeed-offload" and not os.path.isfile(
            os.path.join(paging_sweep.DEEPSPEED_SITE, "deepspeed", "__init__.py")):
        return (f"DeepSpeed is not installed in {paging_sweep.DEEPSPEED_SITE} (bench/deepspeed/install.sh, "
                "with the wheels of bench/deepspeed/fetch_wheels.sh)")
    return None


def settings(a) -> dict:
    return {"seq": a.seq, "batch": a.batch, "vocab": a.vocab, "steps": a.steps, "warmup": a.warmup,
            "checkpoint": True, "timeout": a.timeout, "max_total_s": a.max_total_s, "extra": a.extra}


SAME_WORKLOAD = ("seq", "batch", "vocab", "steps", "extra")


# ----------------------------------------------------------------------------- summary and output


def summarize(result: dict, refs: list) -> dict:
    """Per method: its largest rung that trained, that probe's numbers, the probe above it that
    failed, and its probes at each --refs method's largest."""
    rows = result["probes"]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    best = {}
    for label in labels:
        ok = [r for r in rows if r["label"] == label and r["status"] == "ok"]
        best[label] = max(ok, key=lambda r: r["params"], default=None)
    out = {}
    for label in labels:
        mine = [r for r in rows if r["label"] == label]
        top = best[label]
        size = top["params"] if top else 0
        above = sorted((r for r in mine if r["params"] > size and (r["status"] in FAILS or r.get("cannot_fit"))),
                       key=lambda r: r["params"])
        run = [r for r in mine if r["status"] != "skipped" or r.get("cannot_fit")]
        s = {"largest": top and top["rung"], "params": top and top["params"],
             "median_step_s": top and top.get("median_step_s"), "tflops": top and top.get("tflops"),
             "first_step_s": top and top.get("first_step_s"), "peak_host_used": top and top.get("peak_host_used"),
             "peak_host_frames_bytes": top and (top.get("psshim_stats") or {}).get("peak_host_bytes"),
             "next": above and {k: above[0].get(k) for k in ("rung", "params", "status", "reason")},
             "not_run": None if run else mine[0].get("reason"),
             "inconsistent": [r["rung"] for r in mine if r["status"] in FAILS and r["params"] <= size],
             "at": {}}
        for ref in refs:
            target = best.get(ref)
            there = [r for r in mine if target and r["rung"] == target["rung"] and r["status"] != "skipped"]
            if ref != label and target:
                there = there[-1] if there else {}
                s["at"][ref] = {"rung": target["rung"], "params": target["params"], "status": there.get("status"),
                                "median_step_s": there.get("median_step_s"), "tflops": there.get("tflops")}
        out[label] = s
    return out


def short_table(summary: dict, refs: list) -> str:
    ref = refs[0] if refs else None
    rows = []
    for label, s in summary.items():
        at = s["at"].get(ref) or {}
        nxt = s["next"] or {}
        rows.append([label, s["largest"] or ("not run" if s["not_run"] else "none"), benchlib.fmt(s["params"] and s["params"] / 1e9, ".2f"),
                     benchlib.fmt(s["median_step_s"]), benchlib.fmt(s["tflops"], ".1f"),
                     benchlib.fmt(s["first_step_s"], ".1f"),
                     f"{nxt['rung']} {nxt['status']}" if nxt else "-",
                     (benchlib.fmt(at.get("median_step_s")) if at.get("status") in ("ok", None) else at["status"])
                     if label != ref else benchlib.fmt(s["median_step_s"]),
                     benchlib.fmt(at.get("tflops"), ".1f") if label != ref else benchlib.fmt(s["tflops"], ".1f")])
    heads = ["method", "largest", "params B", "step s", "TFLOPS", "1st step s", "above it"]
    if ref:
        heads += [f"step s at {ref}'s largest", "TFLOPS there"]
    return benchlib.format_table(heads, [r[:len(heads)] for r in rows])


def comparisons(summary: dict, refs: list) -> list:
    """Lines: each method's largest against each reference's, and TFLOPS at the reference's largest."""
    lines = []
    for label, s in summary.items():
        for ref in refs:
            r, at = summary.get(ref), s["at"].get(ref)
            if ref == label or not r or not r["params"] or not s["params"]:
                continue
            got = f"{benchlib.fmt(at['tflops'], '.1f')} TFLOPS" if at and at["status"] in ("ok", None) else at and at["status"]
            there = f"; at {ref}'s largest ({r['largest']}) {got} against {benchlib.fmt(r['tflops'], '.1f')} TFLOPS" \
                if at else ""
            lines.append(f"{label}: largest {s['params'] / r['params']:.2f}x {ref}'s{there}")
        if s["inconsistent"]:
            lines.append(f"{label}: did not train at {', '.join(s['inconsistent'])}, at or below its largest")
    return lines


def probe_table(rows: list, labels: list) -> str:
    def host(r):
        frames = (r.get("psshim_stats") or {}).get("peak_host_bytes")
        return benchlib.gib(r.get("peak_host_used"), 1) + (f" ({benchlib.gib(frames, 1)})" if frames else "")
    return benchlib.format_table(
        ["method", "rung", "params B", "status", "wall s", "1st step s", "step s", "TFLOPS",
         "est GPU/cap GiB", "est host/cap GiB", "host used (frames) GiB", "reason"],
        [[r["label"], r["rung"], f"{r['params'] / 1e9:.2f}", r["status"], benchlib.fmt(r.get("wall_s"), ".0f"),
          benchlib.fmt(r.get("first_step_s"), ".1f"), benchlib.fmt(r.get("median_step_s")),
          benchlib.fmt(r.get("tflops"), ".1f"),
          f"{benchlib.gib(r['estimate']['gpu_bytes'], 0)}/{benchlib.gib(r['estimate']['gpu_capacity'], 0)}",
          f"{benchlib.gib(r['estimate']['host_bytes'], 0)}/{benchlib.gib(r['estimate']['host_capacity'], 0)}",
          host(r), (r.get("reason") or "")[:70]]
         for r in sorted(rows, key=lambda r: (labels.index(r["label"]) if r["label"] in labels else 99, r["params"]))])


def plot(result: dict, path: str) -> str | None:
    """TFLOPS against parameters, a line per method through the rungs that trained, an x at
    those that did not; None when written, else why not."""
    plt = benchlib.pyplot()
    if plt is None:
        return benchlib.NO_PLOT
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for label, s in result["summary"].items():
        rows = sorted((r for r in result["probes"] if r["label"] == label), key=lambda r: r["params"])
        if s["not_run"]:
            continue
        ok = [r for r in rows if r["status"] == "ok" and r.get("tflops")]
        line, = ax.plot([r["params"] / 1e9 for r in ok], [r["tflops"] for r in ok], "o-", label=label)
        bad = [r for r in rows if r["status"] in FAILS]
        ax.plot([r["params"] / 1e9 for r in bad], [0] * len(bad), "x", color=line.get_color(), ms=9)
        if s["params"]:
            ax.axvline(s["params"] / 1e9, color=line.get_color(), ls=":", lw=1)
    m, st = result["machine"], result["settings"]
    ax.set_xlabel("parameters (billions); x: did not train; dotted: largest that trained")
    ax.set_ylabel("TFLOPS (median step after warm-up)")
    ax.set_ylim(bottom=-10)
    ax.grid(alpha=0.3)
    ax.set_title(f"largest GPT that trains {st['steps']} steps: seq {st['seq']}, batch {st['batch']}, "
                 f"checkpointing; {m.get('gpu_name')}, host {benchlib.gib(m.get('host_bytes'), 0)} GiB", fontsize=9)
    benchlib.save_figure(fig, ax, path)
    return None


def report(a, result: dict) -> int:
    """Summary into the JSON; the table file, the plot; the short table printed last."""
    result["summary"] = summarize(result, a.refs)
    result["comparisons"] = comparisons(result["summary"], a.refs)
    note = plot(result, a.plot)
    result["plot"] = None if note else a.plot
    benchlib.write_json(a.out, result)
    short = short_table(result["summary"], a.refs)
    m = result["machine"]
    text = "\n".join([
        f"model_scale: {m.get('gpu_name')} ({benchlib.gib(m.get('gpu_bytes'), 1)} GiB), host "
        f"{benchlib.gib(m.get('host_bytes'), 1)} GiB ({m.get('host_bytes_source')}); commit(s) "
        f"{', '.join(sorted({r['commit'] for r in result['probes']})) or result.get('commit')}",
        f"settings: {json.dumps(result['settings'])}", "", probe_table(result["probes"], result["methods"]), "",
        *result["comparisons"], *([f"stopped: {result['stopped']}"] if result.get("stopped") else []), "", short])
    with open(os.path.splitext(a.out)[0] + ".txt", "w") as f:
        f.write(text + "\n")
    print(f"\nwrote {a.out}, {os.path.splitext(a.out)[0]}.txt" + (f", {a.plot}" if not note else f" ({note})"))
    print(text)
    return 0


def merge(a) -> int:
    parts = [json.load(open(p)) for p in a.merge]
    workloads = {json.dumps({k: p["settings"].get(k) for k in SAME_WORKLOAD}, sort_keys=True) for p in parts}
    if len(workloads) != 1:
        print(f"model_scale: --merge needs calls of one workload ({', '.join(SAME_WORKLOAD)}), got {sorted(workloads)}",
              file=sys.stderr)
        return 1
    result = dict(parts[0], argv=sys.argv[1:], merged_from=a.merge,
                  stopped="; ".join(p["stopped"] for p in parts if p.get("stopped")) or None,
                  wall_s=sum(p.get("wall_s") or 0 for p in parts),
                  methods=list(dict.fromkeys(m for p in parts for m in p["methods"])),
                  machines=[p["machine"] for p in parts], commits=sorted({p.get("commit") for p in parts}))
    seen, result["probes"] = set(), []
    for row in (row for p in parts for row in p["probes"]):
        key = (row["label"], row["rung"], row.get("mem_total_start"), row.get("wall_s"), row["command"])
        if key not in seen:
            seen.add(key)
            result["probes"].append(row)
    return report(a, result)


def dry_run(a, machine: dict, probes: Probes) -> int:
    rungs = probes.rungs
    print(f"# model_scale dry run: GPT ladder at seq {a.seq}, batch {a.batch}, vocab {a.vocab}, checkpointing, "
          f"{a.steps} steps (median after {a.warmup}); commit {probes.commit['commit']} "
          f"({probes.commit['commit_source']})")
    gb, hb = psshim_budgets(machine, a.psshim_env, None)[:2]
    print(f"# {machine['gpu_name']}: {benchlib.gib(machine['gpu_bytes'], 1)} GiB; host "
          f"{benchlib.gib(machine['host_bytes'], 1)} GiB ({machine['host_bytes_source']}), less "
          f"{benchlib.gib(a.host_reserve, 1)} GiB reserve; psshim budgets GPU {benchlib.gib(gb, 1)} GiB, "
          f"host {benchlib.gib(hb, 1)} GiB")
    print("# cells: GPU+host GiB each method needs (estimate; lower bound decides 'no'): likely / maybe / no\n")
    short = {"likely": "", "maybe": " maybe", "cannot fit": " no"}
    cells = lambda r: [f"{benchlib.gib(e['gpu_bytes'], 0)}+{benchlib.gib(e['host_bytes'], 0)}{short[e['verdict']]}"
                       for e in (estimate(m, r, a, machine, a.psshim_env) for m in a.methods)]
    print(benchlib.format_table(
        ["rung", "L", "h", "heads", "params B", "model GiB", "act GiB"] + [label_of(m, a.psshim_env) for m in a.methods],
        [[r.name, r.layers, r.hidden, r.heads, f"{r.params / 1e9:.2f}", benchlib.gib(16 * r.params, 1),
          "/".join(benchlib.gib(x, 1) for x in activations(r, a))] + cells(r) for r in rungs]))
    print("\n# first probe of each method (the search picks the next from its outcome):")
    for m in a.methods:
        r = rungs[probes.start_index(m)]
        why = method_unavailable(m)
        print(f"# {label_of(m, a.psshim_env)}: start {r.name} ({r.params / 1e9:.2f}B)" + (f"; skipped: {why}" if why else ""))
        print(make_run(a, m, r).shell())
    for m, name in a.only:
        print(f"# --only {m}:{name}\n{make_run(a, m, probes.by_name[name]).shell()}")
    return 0


# ----------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1]
                                + "\nArguments after '--' go to gpt_train.py unchanged.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma separated, in this order (default: {','.join(METHODS)})")
    p.add_argument("--sizes", help="rungs the search may use: names (L43h3968) and parameter ranges "
                                   "(6B-14B, 0-9B, 10B-), comma separated (default: the whole ladder)")
    p.add_argument("--only", default="", help="METHOD:RUNG,...: probe exactly these, no search, no --refs")
    p.add_argument("--start", action="append", default=[], metavar="METHOD=RUNG",
                   help="where a method's search begins (default: the largest rung its estimate fits)")
    p.add_argument("--refs", default="native,fsdp-offload",
                   help="after the searches, each method also runs at these methods' largest rungs, where "
                        "not above its own; '' for none (default: native,fsdp-offload)")
    p.add_argument("--refs-first", action="store_true",
                   help="run those before the searches, where the estimate says the method likely fits "
                        "(the --refs sizes must be known: from --prior or an earlier method of the call)")
    p.add_argument("--prior", nargs="*", default=[], metavar="JSON",
                   help="earlier calls' results: their outcomes guide the search and give the --refs sizes")
    p.add_argument("--psshim-lib", help="libpsshim.so to preload (required by the psshim method)")
    p.add_argument("--psshim-env", action="append", default=[], metavar="VAR=VALUE",
                   help="a PSSHIM_* setting for the psshim probes (default: none, psshim's defaults)")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--steps", type=int, default=10, help="steps a probe must train (default: 10)")
    p.add_argument("--warmup", type=int, default=6,
                   help="steps left out of the median step (default: 6: psshim's pager pages by the "
                        "iteration's period from its 5th or so)")
    p.add_argument("--timeout", type=float, default=300, help="seconds a probe may take (default: 300)")
    p.add_argument("--max-total-s", type=float, default=540,
                   help="start no probe after this many seconds of the call (0: no limit; default: 540)")
    p.add_argument("--min-probe-s", type=float, default=60,
                   help="start no probe with less than this left of --max-total-s (default: 60)")
    p.add_argument("--gpu-mem", type=benchlib.parse_size, help="GPU memory (default: nvidia-smi's)")
    p.add_argument("--host-mem", type=benchlib.parse_size,
                   help="host memory (default: the cgroup's limit, else MemTotal; on a machine whose "
                        "memory grows as used, give what it has)")
    p.add_argument("--host-reserve", type=benchlib.parse_size, default="8G",
                   help="host memory the estimates leave to the system and the process (default: 8G)")
    p.add_argument("--host-guard", type=benchlib.parse_size, default="2G",
                   help="stop a probe when host memory in use comes within this of --host-mem (default: 2G)")
    p.add_argument("--poll-s", type=float, default=0.5, help="how often a probe is watched (default: 0.5)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "model_scale.json"),
                   help="result JSON; the table beside it as .txt, probes' logs and JSON in <out>_runs/")
    p.add_argument("--plot", help="PNG path (default: --out with .png)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the trainer (default: this one)")
    p.add_argument("--train-script", default=paging_sweep.TRAIN_SCRIPT,
                   help="the trainer, taking gpt_train.py's options (default: bench/gpt_train.py)")
    p.add_argument("--dry-run", action="store_true", help="print the ladder, estimates and first commands")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="run nothing: join these calls' results into --out")
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    a = p.parse_args(argv[:cut])
    a.extra = argv[cut + 1:]
    a.methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    a.refs = [m.strip() for m in a.refs.split(",") if m.strip()]
    try:
        a.only = [tuple(x.split(":", 1)) for x in a.only.split(",") if x.strip()]
        a.start = dict(x.split("=", 1) for x in a.start)
        a.psshim_env = dict(x.split("=", 1) for x in a.psshim_env)
    except ValueError:
        p.error("--only takes METHOD:RUNG, --start METHOD=RUNG, --psshim-env VAR=VALUE")
    if a.only:
        a.methods = list(dict.fromkeys(m for m, _ in a.only))
    for m in a.methods + list(a.start):
        if m not in METHODS:
            p.error(f"unknown method {m!r}; choose from {', '.join(METHODS)}")
    if not all(k.startswith("PSSHIM_") for k in a.psshim_env):
        p.error("--psshim-env takes PSSHIM_* variables")
    if "psshim" in a.methods and not (a.dry_run or a.merge):
        if not a.psshim_lib or not os.path.isfile(a.psshim_lib):
            p.error("--psshim-lib must name an existing libpsshim.so for the psshim method")
    if a.psshim_lib:
        a.psshim_lib = os.path.abspath(a.psshim_lib)
    a.out = os.path.abspath(a.out)
    a.plot = a.plot or os.path.splitext(a.out)[0] + ".png"
    a.runs_dir = os.path.splitext(a.out)[0] + "_runs"
    return a


def load_prior(a) -> list:
    rows = []
    for path in a.prior:
        part = benchlib.load_json(path)
        if not part:
            raise SystemExit(f"model_scale: --prior {path}: not a result JSON")
        if any(part["settings"].get(k) != settings(a)[k] for k in SAME_WORKLOAD):
            raise SystemExit(f"model_scale: --prior {path}: another workload ({part['settings']})")
        rows += part["probes"]
    return rows


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.merge:
        return merge(a)
    machine = machine_info(a)
    probes = Probes(a, machine, select(ladder(a.vocab, a.seq), a.sizes), load_prior(a))
    unknown = [name for _, name in a.only if name not in probes.by_name]
    if unknown or not probes.rungs:
        raise SystemExit(f"model_scale: no such rung(s) {unknown}" if unknown else "model_scale: --sizes selects no rung")
    if a.dry_run:
        return dry_run(a, machine, probes)
    try:
        for method, name in a.only:
            probes.probe(method, probes.by_name[name])
        if not a.only:
            for method in a.methods if a.refs_first else []:
                probes.refs(method, first=True)
            for method in a.methods:
                probes.search(method)
            for method in a.methods:
                probes.refs(method)
    except TimeUp as stop:
        probes.result["stopped"] = str(stop)
        print(f"model_scale: {stop}: writing what there is", flush=True)
    probes.save()
    return report(a, probes.result)


if __name__ == "__main__":
    sys.exit(main())
