#!/usr/bin/env python3
"""Train a GPT (decoder-only transformer) on fixed synthetic data and report per-step
loss, time, TFLOPS and memory.

Plain PyTorch with nothing psshim-specific, so it runs unchanged under
`LD_PRELOAD=libpsshim.so PSSHIM_GPU_BUDGET=24G python bench/gpt_train.py ...`.
Run with --help for the options.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import textwrap
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import benchlib

ENV_PREFIX = "GPT_TRAIN_"
# AdamW settings of every run (torch's defaults), also given to DeepSpeed's optimizer.
ADAMW = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
MEMORY_NOTE = (
    "max_allocated/max_reserved are torch's allocator counters. With the default caching "
    "allocator they count every tensor, also those psshim placed in host memory; with "
    "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (which psshim sets when the variable is "
    "unset) torch reads them from the CUDA default memory pool's attributes, so under psshim "
    "they show whatever psshim makes that pool report (possibly 0). device_used = total - "
    "free from torch.cuda.mem_get_info (cudaMemGetInfo, which psshim may answer for its "
    "budget); it includes the CUDA context and other processes. A counter that cannot be "
    "read is recorded as null."
)
PCIE_NOTE = (
    "bytes over the GPU's PCIe link each way per step (median of the steps after warm-up), "
    "from NVML's throughput counters read back to back on a thread (each read averages 20 ms, "
    "KB/s taken as 1000 B/s): copies and kernels' in-place reads and writes of host memory alike"
)

# ----------------------------------------------------------------------------- options


def wrap(text: str) -> str:
    return textwrap.fill(text, width=90)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join([
            wrap("Precedence of settings: command-line flag > environment variable "
                 f"{ENV_PREFIX}<OPTION> (e.g. {ENV_PREFIX}LAYERS=4, {ENV_PREFIX}DETERMINISTIC=1)"
                 " > --preset > built-in default."),
            "Presets:\n" + "\n".join(f"  {name}: {cfg}" for name, cfg in benchlib.PRESETS.items()),
            wrap("TFLOPS: " + benchlib.FLOPS_FORMULA),
            wrap("Memory: " + MEMORY_NOTE),
            wrap("Data: one fixed batch of random tokens drawn on the device from a generator "
                 "seeded with --seed (next-token targets); the loss falls as the model "
                 "memorizes it."),
            wrap(f"Exit status: 0 ok, {benchlib.EXIT_OOM} out of memory (with --json, the file "
                 "has \"oom\": true), 1 any other failure."),
        ]),
    )
    p.add_argument("--preset", choices=sorted(benchlib.PRESETS), default="demo",
                   help="model/run size preset (default: demo)")
    g = p.add_argument_group("model")
    g.add_argument("--layers", type=int, help="transformer blocks L")
    g.add_argument("--hidden", type=int, help="hidden size h")
    g.add_argument("--heads", type=int, help="attention heads (must divide --hidden)")
    g.add_argument("--seq", type=int, help="sequence length s")
    g.add_argument("--batch", type=int, help="micro-batch size B")
    g.add_argument("--vocab", type=int, help="vocabulary size V")
    g.add_argument("--tie-embeddings", action=argparse.BooleanOptionalAction, default=False,
                   help="share the token embedding with the LM head (default: untied)")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, help="training steps")
    g.add_argument("--warmup", type=int, default=2,
                   help="first steps excluded from the median step time (default: 2)")
    g.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate (default: 3e-4)")
    g.add_argument("--seed", type=int, default=0, help="seed of weights and data (default: 0)")
    g.add_argument("--checkpoint", action=argparse.BooleanOptionalAction, default=False,
                   help="activation checkpointing per block (use_reentrant=False)")
    g.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                   help="bf16: autocast to bfloat16 (weights and optimizer in fp32); "
                        "fp32: no autocast (default: bf16)")
    g.add_argument("--fused-adamw", action=argparse.BooleanOptionalAction, default=True,
                   help="torch.optim.AdamW(fused=True) on cuda (default: on)")
    g.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=False,
                   help="bitwise-reproducible run: CUBLAS_WORKSPACE_CONFIG=:4096:8 before CUDA "
                        "init, torch.use_deterministic_algorithms(True), cudnn.deterministic")
    g = p.add_argument_group("device and memory")
    g.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="device to train on (default: cuda)")
    mem = g.add_mutually_exclusive_group()
    mem.add_argument("--memory-fraction", type=float,
                     help="torch.cuda.set_per_process_memory_fraction(F): native run at a budget")
    mem.add_argument("--memory-budget", type=benchlib.parse_size,
                     help="same, given as bytes (24G, 512M, ...): fraction = budget / total")
    g.add_argument("--fsdp-offload", action="store_true",
                   help="FSDP2 (fully_shard per block and root) with CPUOffloadPolicy(pin_memory"
                        "=True), world size 1 in this process (under torchrun: its world); with "
                        "bf16 it uses MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) "
                        "instead of autocast, and the optimizer steps on the CPU")
    g.add_argument("--deepspeed-offload", action="store_true",
                   help="DeepSpeed ZeRO-Offload: ZeRO stage 2 with offload_optimizer {device: cpu, "
                        "pin_memory: true} and the same AdamW settings, world size 1 in this process "
                        "(under torchrun: its world); with bf16 DeepSpeed's bf16 mode (bf16 weights "
                        "and gradients on the GPU, fp32 master weights on the host) instead of "
                        "autocast. Needs an importable deepspeed: bench/deepspeed/install.sh, then "
                        "PYTHONPATH=bench/deepspeed/site")
    g.add_argument("--deepspeed-cpu-adam", action=argparse.BooleanOptionalAction, default=True,
                   help="with --deepspeed-offload: DeepSpeedCPUAdam, whose cpu_adam op torch builds at "
                        "first use (ninja, a C++ compiler, Python.h; minutes); --no-deepspeed-cpu-adam: "
                        "torch.optim.AdamW on the host instead (DeepSpeed's torch_adam) (default: on)")
    g.add_argument("--ddp", action="store_true",
                   help="DistributedDataParallel under torchrun (RANK, LOCAL_RANK, WORLD_SIZE, "
                        "MASTER_ADDR/PORT from its environment; nccl on cuda, gloo on cpu): each "
                        "rank trains on its own batch (seed + rank) on cuda:LOCAL_RANK; rank 0 "
                        "prints, and each rank writes --json, rank r > 0 to PATH.rank<r>")
    g = p.add_argument_group("output")
    g.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    g.add_argument("--pcie", action=argparse.BooleanOptionalAction, default=True,
                   help="record the bytes that cross the GPU's PCIe link each way per step, from NVML's "
                        "throughput counters read on a thread (--no-pcie: no thread, e.g. to see that it "
                        "costs the step nothing)")
    g.add_argument("--profile", action="store_true",
                   help="after the timed steps, run one more under torch.profiler and record in the JSON "
                        "where its GPU time went: kernels, copies and memsets, the share of the step the GPU "
                        "was busy, the top kernels")
    return p


def env_defaults(parser: argparse.ArgumentParser) -> dict:
    """Defaults taken from GPT_TRAIN_<OPTION> environment variables."""
    out = {}
    for action in parser._actions:
        name = ENV_PREFIX + action.dest.upper()
        raw = os.environ.get(name)
        if not action.option_strings or action.dest == "help" or raw is None:
            continue
        try:
            if action.type is not None:
                value = action.type(raw)
            elif action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
                value = raw.strip().lower() in ("1", "true", "yes", "on")
            else:
                value = raw
        except (TypeError, ValueError) as exc:
            parser.error(f"{name}={raw!r}: {exc}")
        if action.choices is not None and value not in action.choices:
            parser.error(f"{name}={raw!r}: choose from {', '.join(map(str, action.choices))}")
        out[action.dest] = value
    return out


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    env = env_defaults(parser)
    parser.set_defaults(**{k: v for k, v in env.items() if k == "preset"})
    preset = parser.parse_known_args(argv)[0].preset
    if preset not in benchlib.PRESETS:
        parser.error(f"unknown preset {preset!r} (choose from {', '.join(benchlib.PRESETS)})")
    parser.set_defaults(**benchlib.PRESETS[preset])
    parser.set_defaults(**env)
    args = parser.parse_args(argv)
    if args.hidden % args.heads:
        parser.error(f"--heads {args.heads} does not divide --hidden {args.hidden}")
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.fsdp_offload and args.tie_embeddings:
        parser.error("--fsdp-offload with --tie-embeddings is not supported")
    if sum((args.ddp, args.fsdp_offload, args.deepspeed_offload)) > 1:
        parser.error("--ddp, --fsdp-offload and --deepspeed-offload are different baselines: choose one")
    if args.ddp and "WORLD_SIZE" not in os.environ:
        parser.error("--ddp needs torchrun's environment (run it as torchrun --nproc_per_node=N "
                     "bench/gpt_train.py --ddp ...)")
    return args


# ----------------------------------------------------------------------------- model


class Block(nn.Module):
    """Pre-LayerNorm block: causal self-attention (SDPA) and a 4h GELU MLP."""

    def __init__(self, hidden: int, heads: int, checkpointing: bool):
        super().__init__()
        self.heads, self.checkpointing = heads, checkpointing
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.fc_out = nn.Linear(4 * hidden, hidden)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, h // self.heads) \
                                       .permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, h))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Checkpointing inside forward (not around the module call) keeps FSDP2's hooks on
        # the block firing once per forward; the recomputation runs inside backward.
        if self.checkpointing and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class GPT(nn.Module):
    def __init__(self, a: argparse.Namespace):
        super().__init__()
        self.tok_emb = nn.Embedding(a.vocab, a.hidden)
        self.pos_emb = nn.Embedding(a.seq, a.hidden)
        self.blocks = nn.ModuleList(Block(a.hidden, a.heads, a.checkpoint) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.hidden)
        self.head = nn.Linear(a.hidden, a.vocab, bias=False)
        if a.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


@torch.no_grad()
def init_params(model: nn.Module, layers: int, seed: int, device: torch.device) -> None:
    """GPT-2 style init drawn on `device` from one seeded generator, in module order.

    Values are copied into each parameter's local storage, which also serves FSDP2's
    sharded (DTensor) parameters that live in host memory: each rank takes its rows.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    seen = set()
    for mod_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            values = torch.empty(param.shape, device=device)
            if isinstance(module, nn.LayerNorm):
                values.fill_(1.0 if name == "weight" else 0.0)
            elif name == "bias":
                values.zero_()
            else:
                residual = mod_name.endswith(("proj", "fc_out"))
                values.normal_(0.0, 0.02 / (2 * layers) ** 0.5 if residual else 0.02,
                               generator=gen)
            if hasattr(param, "to_local"):  # FSDP2: this rank's rows (Shard(0), torch.chunk)
                mesh = param.device_mesh
                rows = torch.chunk(values, mesh.size(), dim=0)
                mine = mesh.get_local_rank()
                values = rows[mine] if mine < len(rows) else values[:0]
                param = param.to_local()
            param.copy_(values)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------- setup


def configure_determinism(enabled: bool) -> None:
    """Must run before the first CUDA call: cuBLAS reads the variable when it starts."""
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def ranks() -> tuple[int, int, int]:
    """(rank, local rank, world size) from torchrun's environment; (0, 0, 1) outside it."""
    return (int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0")),
            int(os.environ.get("WORLD_SIZE", "1")))


def init_distributed(device: torch.device) -> None:
    """The default process group: torchrun's rendezvous (env://) when it started us, else a
    world of one in this process."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    rank, _, world = ranks()
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def select_device(a: argparse.Namespace) -> torch.device:
    if a.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("gpt_train: CUDA is not available (use --device cpu)")
    local = ranks()[1]
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    fraction = a.memory_fraction
    if a.memory_budget is not None:
        fraction = a.memory_budget / torch.cuda.get_device_properties(device).total_memory
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(min(fraction, 1.0), device)
    return device


def build_native(a: argparse.Namespace, device: torch.device):
    with torch.device(device):
        model = GPT(a)
    init_params(model, a.layers, a.seed, device)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) \
        if a.dtype == "bf16" else contextlib.nullcontext
    if a.ddp:
        from torch.nn.parallel import DistributedDataParallel

        init_distributed(device)
        model = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    return model, autocast


def build_fsdp_offload(a: argparse.Namespace, device: torch.device):
    """FSDP2 at world size 1 with parameters, gradients and optimizer state on the host."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    init_distributed(device)
    with torch.device("meta"):
        model = GPT(a)
    kwargs = {"offload_policy": CPUOffloadPolicy(pin_memory=device.type == "cuda")}
    if a.dtype == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                   reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    model.to_empty(device="cpu")
    init_params(model, a.layers, a.seed, device)
    return model, contextlib.nullcontext


def import_deepspeed():
    """The deepspeed package, or exit with one line saying how to get it."""
    try:
        import deepspeed
    except Exception as exc:  # noqa: BLE001 - missing, or a dependency that does not import
        why = f"{type(exc).__name__}: {exc}"
    else:
        if getattr(deepspeed, "__file__", None):  # not just bench/deepspeed/ as a namespace package
            if shutil.which("ninja") is None:  # the cpu_adam build runs it; install.sh's is in bin/
                bin_dir = os.path.join(os.path.dirname(os.path.dirname(deepspeed.__file__)), "bin")
                os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
            return deepspeed
        why = "no module named 'deepspeed'"
    raise SystemExit(f"gpt_train: --deepspeed-offload needs DeepSpeed, which does not import ({why}); "
                     "install it with bench/deepspeed/install.sh and run with "
                     "PYTHONPATH=bench/deepspeed/site")


def deepspeed_config(a: argparse.Namespace, device: torch.device) -> dict:
    """ZeRO-Offload as published (ZeRO stage 2, optimizer state and step on the host, the
    tutorial's contiguous_gradients and overlap_comm), stepping with the native run's AdamW."""
    return {
        "train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": 1,
        "steps_per_print": 1 << 30, "bf16": {"enabled": a.dtype == "bf16"},
        "zero_optimization": {"stage": 2, "contiguous_gradients": True, "overlap_comm": True,
                              "offload_optimizer": {"device": "cpu",
                                                    "pin_memory": device.type == "cuda"}},
        "optimizer": {"type": "AdamW", "params": {"lr": a.lr, **ADAMW,
                                                  "torch_adam": not a.deepspeed_cpu_adam}},
    }


def build_deepspeed_offload(a: argparse.Namespace, device: torch.device):
    """DeepSpeed's engine, which also steps (train_step). The model is built and initialized
    in host memory (same values as native); DeepSpeed moves it to the GPU (in bf16 with
    --dtype bf16) and keeps fp32 master weights and AdamW state on the host."""
    deepspeed = import_deepspeed()
    init_distributed(device)
    os.environ.setdefault("LOCAL_RANK", str(ranks()[1]))  # the engine reads it
    model = GPT(a)
    init_params(model, a.layers, a.seed, device)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=deepspeed_config(a, device))
    return engine, contextlib.nullcontext


def make_batch(a: argparse.Namespace, device: torch.device):
    gen = torch.Generator(device=device).manual_seed(a.seed + 1 + ranks()[0])
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen, device=device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


# ----------------------------------------------------------------------------- measuring


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_now(device: torch.device) -> dict:
    """Peak counters since the last reset, and the device's used memory now."""
    if device.type != "cuda":
        return {}
    out = {}
    try:
        out["max_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        out["max_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    except RuntimeError as exc:  # a preloaded allocator may not answer the pool queries
        warn_once("torch memory counters", exc)
    try:
        free, total = torch.cuda.mem_get_info(device)
        out.update(device_used_bytes=total - free, device_total_bytes=total)
    except RuntimeError as exc:
        warn_once("cudaMemGetInfo", exc)
    return out


def reset_peaks(device: torch.device) -> None:
    if device.type == "cuda":
        try:
            torch.cuda.reset_peak_memory_stats(device)
        except RuntimeError as exc:
            warn_once("torch.cuda.reset_peak_memory_stats", exc)


_warned = set()


def warn_once(what: str, exc: Exception) -> None:
    if what not in _warned:
        _warned.add(what)
        print(f"gpt_train: warning: {what} failed, recorded as null: {exc}", file=sys.stderr)


def optimizer_data_bytes(opt) -> int:
    """Bytes of what the optimizer step reads on the GPU: the parameters, their gradients
    and the optimizer's state (psshim's LEAST TRAFFIC argument: what of it the budget cannot
    hold when the step begins must cross PCIe while it runs)."""
    def gpu_bytes(t) -> int:
        return t.numel() * t.element_size() if torch.is_tensor(t) and t.device.type == "cuda" else 0
    params = [p for g in opt.param_groups for p in g["params"]]
    return (sum(gpu_bytes(p) + gpu_bytes(p.grad) for p in params) +
            sum(gpu_bytes(v) for st in opt.state.values() for v in st.values()))


def train_step(model, opt, inputs, targets, autocast, timing: dict | None = None) -> torch.Tensor:
    """One step. timing (a dict, CUDA only): the optimizer step's CUDA events, "opt_start"
    and "opt_end", recorded around it, and "optimizer_data_bytes" while the gradients live."""
    with autocast():
        logits = model(inputs)
    loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))
    if opt is None:  # a DeepSpeed engine: its backward, and its step, which zeroes the gradients
        model.backward(loss)
        model.step()
        return loss.detach()
    loss.backward()
    if timing is not None:
        timing["opt_start"] = torch.cuda.Event(enable_timing=True)
        timing["opt_end"] = torch.cuda.Event(enable_timing=True)
        timing["opt_start"].record()
    opt.step()
    if timing is not None:
        timing["opt_end"].record()
        timing["optimizer_data_bytes"] = optimizer_data_bytes(opt)
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def profile_step(step, device) -> dict:
    """One more step (the call step()) under torch.profiler: GPU time by kind, busy share,
    top kernels. A profiler that cannot attach (CUPTI has one callback subscriber, and
    psshim may hold it) is recorded as an error, not raised."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    try:
        synchronize(device)
        t0 = time.perf_counter()
        with profile(activities=acts) as prof:
            step()
            synchronize(device)
        wall = time.perf_counter() - t0
        gpu = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    except Exception as e:  # noqa: BLE001 - any profiler failure is a result to report
        return {"error": repr(e)}
    kinds, by_name, spans = {"kernel": 0.0, "memcpy": 0.0, "memset": 0.0}, {}, []
    for e in gpu:
        us = e.time_range.elapsed_us()
        kind = "memcpy" if e.name.startswith("Memcpy") else "memset" if e.name.startswith("Memset") else "kernel"
        kinds[kind] += us
        by_name[e.name] = by_name.get(e.name, 0.0) + us
        spans.append((e.time_range.start, e.time_range.end))
    busy, end = 0.0, None  # the union of the GPU events' intervals: time anything ran
    for a, b in sorted(spans):
        if end is None or a > end:
            busy, end = busy + (b - a), b
        elif b > end:
            busy, end = busy + (b - end), b
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return {"wall_s": wall, "gpu_us_by_kind": kinds, "gpu_busy_us": busy, "gpu_busy_share": busy / 1e6 / wall,
            "top_gpu_us": top, "gpu_events": len(gpu)}


def profile_line(p: dict) -> str:
    """profile_step's result in one line."""
    if "error" in p:
        return f"profiled step: {p['error']}"
    return (f"profiled step {p['wall_s']:.3f} s, GPU busy {p['gpu_busy_share']:.0%}, "
            f"kernels {p['gpu_us_by_kind']['kernel'] / 1e3:.0f} ms, copies {p['gpu_us_by_kind']['memcpy'] / 1e3:.0f} ms")


def step_line(rec: dict) -> str:
    mem = ""
    if rec.keys() & {"max_allocated_bytes", "device_used_bytes"}:
        mem = (f"  peak alloc {benchlib.gib(rec.get('max_allocated_bytes'))} GiB"
               f"  dev used {benchlib.gib(rec.get('device_used_bytes'))} GiB")
    return (f"step {rec['step']:4d}  loss {rec['loss_hex']} ({rec['loss']:.6f})"
            f"  time {rec['time_s']:.4f} s  {rec['tflops']:9.3f} TFLOPS{mem}")


def summarize_memory(init: dict, steps: list) -> dict:
    snaps = [init] + steps
    peak = lambda key: max((s[key] for s in snaps if key in s), default=None)
    return {"peak_allocated_bytes": peak("max_allocated_bytes"),
            "peak_reserved_bytes": peak("max_reserved_bytes"),
            "peak_device_used_bytes": peak("device_used_bytes"),
            "device_total_bytes": init.get("device_total_bytes"), "note": MEMORY_NOTE}


def base_result(a: argparse.Namespace) -> dict:
    return {
        "script": "gpt_train.py", "argv": sys.argv[1:], "config": vars(a),
        "mode": "fsdp-offload" if a.fsdp_offload else "deepspeed-offload" if a.deepspeed_offload
        else "ddp" if a.ddp else "native",
        "rank": ranks()[0], "world_size": ranks()[2],
        "flops_formula": benchlib.FLOPS_FORMULA,
        "flops_per_step": benchlib.megatron_flops(a.batch, a.seq, a.layers, a.hidden, a.vocab,
                                                  recompute=a.checkpoint),
        "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
        "env": {k: v for k, v in os.environ.items()
                if k.startswith("PSSHIM_") or k in ("LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF",
                                                    "CUBLAS_WORKSPACE_CONFIG")},
        "steps": [], "loss_hex": [], "loss": [], "step_times_s": [],
        "oom": False, "error": None, "finished": False,
    }


PSSHIM_STEP_FIELDS = ("move_ns", "remap_ns", "frame_wait_ns", "frame_make_ns", "owner_wait_ns", "gate_wait_ns",
                      "owner_fetches", "owner_demand_fetches", "migrations_to_gpu", "migrations_to_host", "bytes_h2d",
                      "bytes_d2h", "touches_gpu", "touches_host", "share_rounds", "share_round_ns", "shares",
                      "unshares")
# Levels at the step's end: whether host frames creep up from step to step.
PSSHIM_STEP_LEVELS = ("gpu_frames", "host_frames", "live_bytes")


def psshim_step(before, after) -> dict | None:
    """What psshim did during one step: the growth of PSSHIM_STEP_FIELDS, with the period and
    PSSHIM_STEP_LEVELS at its end."""
    if not before or not after:
        return None
    return {"period": after.get("period"), **{k: after[k] - before[k] for k in PSSHIM_STEP_FIELDS if k in after},
            **{k: after[k] for k in PSSHIM_STEP_LEVELS if k in after}}


def pcie_counter(device: torch.device) -> benchlib.PcieCounter | None:
    """Bytes over the device's PCIe link, sampled from NVML (benchlib.PcieCounter)."""
    if device.type != "cuda":
        return None
    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
    # NVML numbers every GPU: under CUDA_VISIBLE_DEVICES torch's index is not NVML's.
    index = None if os.environ.get("CUDA_VISIBLE_DEVICES") else device.index or 0
    return benchlib.PcieCounter(uuid or None, index).start()


def finish_result(res: dict, a: argparse.Namespace, init_mem: dict) -> None:
    warm = min(a.warmup, max(len(res["step_times_s"]) - 1, 0))
    med = benchlib.median(res["step_times_s"][warm:])
    opt_s = [s["optimizer_s"] for s in res["steps"][warm:] if s.get("optimizer_s") is not None]
    res.update(warmup_steps=warm, median_step_s=med,
               median_optimizer_s=benchlib.median(opt_s) if opt_s else None,
               tflops=res["flops_per_step"] / med / 1e12 if med else None,
               memory=summarize_memory(init_mem, res["steps"]))
    pcie = [s["pcie"] for s in res["steps"][warm:] if s.get("pcie")]
    if pcie:  # the steps after warm-up, as median_step_s
        res["pcie"].update(h2d_bytes_per_step=benchlib.median([p["h2d_bytes"] for p in pcie]),
                           d2h_bytes_per_step=benchlib.median([p["d2h_bytes"] for p in pcie]), steps=len(pcie))


def train(a: argparse.Namespace, res: dict) -> dict:
    """Build, train, and fill `res` step by step (so an OOM keeps the partial record)."""
    device = select_device(a)
    res["device_name"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    torch.manual_seed(a.seed)
    reset_peaks(device)
    build = build_fsdp_offload if a.fsdp_offload else \
        build_deepspeed_offload if a.deepspeed_offload else build_native
    model, autocast = build(a, device)
    res["param_count"] = count_params(model)
    opt = None if a.deepspeed_offload else torch.optim.AdamW(
        model.parameters(), lr=a.lr, **ADAMW, fused=bool(a.fused_adamw and device.type == "cuda"))
    if a.deepspeed_offload:
        res["deepspeed"] = {"version": sys.modules["deepspeed"].__version__,
                            "optimizer": type(model.basic_optimizer).__name__,
                            "config": deepspeed_config(a, device)}
    inputs, targets = make_batch(a, device)
    synchronize(device)
    init_mem = memory_now(device)
    res["memory"] = summarize_memory(init_mem, [])
    pcie = pcie_counter(device) if a.pcie else None
    res["pcie"] = {"basis": PCIE_NOTE, "error": "--no-pcie" if not a.pcie else
                   "not a CUDA device" if pcie is None else pcie.error}
    say(f"gpt_train: {res['mode']} {res['param_count'] / 1e6:.1f}M params on "
        f"{res['device_name']}, torch {torch.__version__}, world size {res['world_size']}")
    for step in range(a.steps):
        reset_peaks(device)
        synchronize(device)
        before = benchlib.psshim_stats()
        timing = {} if device.type == "cuda" and opt is not None else None
        t0 = time.perf_counter()
        loss = train_step(model, opt, inputs, targets, autocast, timing)
        synchronize(device)
        dt = time.perf_counter() - t0
        value = loss.float().item()
        if timing:
            res["optimizer_data_bytes"] = timing["optimizer_data_bytes"]
        rec = {"step": step, "loss_hex": float.hex(value), "loss": value, "time_s": dt,
               "optimizer_s": timing["opt_start"].elapsed_time(timing["opt_end"]) / 1e3 if timing else None,
               "tflops": res["flops_per_step"] / dt / 1e12, **memory_now(device),
               "psshim": psshim_step(before, benchlib.psshim_stats()),
               "pcie": pcie.window(t0, t0 + dt) if pcie else None}
        res["steps"].append(rec)
        res["loss_hex"].append(rec["loss_hex"])
        res["loss"].append(value)
        res["step_times_s"].append(dt)
        finish_result(res, a, init_mem)
        say(step_line(rec))
        if a.json:  # after every step: a run killed by a timeout keeps the steps it made
            benchlib.write_json(json_path(a), res)
    if pcie:
        pcie.stop()
        res["pcie"]["error"] = pcie.error
    if a.profile:
        res["profile"] = profile_step(lambda: train_step(model, opt, inputs, targets, autocast), device)
        say("gpt_train: " + profile_line(res["profile"]))
    return res


def say(line: str) -> None:
    """A line on stdout from rank 0 only."""
    if ranks()[0] == 0:
        print(line, flush=True)


def json_path(a: argparse.Namespace) -> str | None:
    """--json for rank 0; PATH.rank<r> for rank r > 0."""
    rank = ranks()[0]
    return a.json if not a.json or rank == 0 else f"{a.json}.rank{rank}"


def shutdown_distributed() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_oom(exc: BaseException) -> bool:
    """torch.OutOfMemoryError, or an error whose text says memory ran out (a CUDA error
    from a library, or the host allocator: pinned or pageable host memory)."""
    oom_type = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    text = str(exc).lower()
    return isinstance(exc, (oom_type, MemoryError)) or any(m in text for m in OOM_MESSAGES)


def main(argv=None) -> int:
    a = parse_args(argv)
    configure_determinism(a.deterministic)
    res = base_result(a)
    try:
        train(a, res)
        shutdown_distributed()
    except Exception as exc:  # recorded in the JSON, then reported or re-raised
        res.update(oom=is_oom(exc), error=f"{type(exc).__name__}: {exc}"[:4000])
        if a.json:
            benchlib.write_json(json_path(a), res)
        if not res["oom"]:
            raise
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        print(f"gpt_train: OUT OF MEMORY after {len(res['steps'])} step(s): {first_line}",
              file=sys.stderr)
        return benchlib.EXIT_OOM
    res["finished"] = True
    if a.json:
        benchlib.write_json(json_path(a), res)
    say(f"gpt_train: median step {res['median_step_s']:.4f} s (after {res['warmup_steps']} "
        f"warm-up), {res['tflops']:.3f} TFLOPS, peak allocated "
        f"{benchlib.gib(res['memory']['peak_allocated_bytes'])} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
