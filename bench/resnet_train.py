#!/usr/bin/env python3
"""Train torchvision's ResNet-50 on one fixed synthetic batch and report per-step loss, time
and memory in gpt_train.py's JSON shape (loss_hex, step_times_s, median_step_s, memory, and
under psshim each step's "psshim").

Batch 64 of 224x224 images and labels drawn from a generator seeded with --seed, weights
initialized from torch's seeded generator (resnet50(weights=None): nothing is downloaded),
bf16 autocast, channels_last, SGD with momentum 0.9. Nothing psshim-specific: run it
unchanged under LD_PRELOAD=libpsshim.so. Exit status: 0 ok, 3 out of memory, 1 any other
failure (with --json, the file says which).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

import torch
import torch.nn.functional as F

import benchlib
import gpt_train  # the same counters, determinism and OOM test as the GPT runs


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--batch", type=int, default=64, help="images per step (default: 64)")
    p.add_argument("--image-size", type=int, default=224, help="image height and width (default: 224)")
    p.add_argument("--steps", type=int, default=30, help="training steps (default: 30)")
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the median (default: 10)")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default: 0.01)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and data (default: 0)")
    p.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=False,
                   help="deterministic algorithms where torch has them (default: off)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    p.add_argument("--profile", action="store_true",
                   help="after the timed steps, run one more under torch.profiler and record in the JSON "
                        "(\"profile\") the GPU time by kind, the GPU's busy share and the top kernels")
    a = p.parse_args(argv)
    if a.steps < 1:
        p.error("--steps must be at least 1")
    return a


def train(a: argparse.Namespace, res: dict) -> None:
    """Build, train, and fill `res` step by step (a run cut short keeps its steps)."""
    import torchvision  # here, so that a machine without it gives a recorded error

    res["torchvision_version"] = torchvision.__version__
    device = torch.device(a.device)
    res["device_name"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    torch.manual_seed(a.seed)
    gpt_train.reset_peaks(device)
    model = torchvision.models.resnet50(weights=None).to(device, memory_format=torch.channels_last)
    res["param_count"] = gpt_train.count_params(model)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    gen = torch.Generator(device=device).manual_seed(a.seed + 1)
    images = torch.randn(a.batch, 3, a.image_size, a.image_size, generator=gen, device=device) \
                  .contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (a.batch,), generator=gen, device=device)
    gpt_train.synchronize(device)
    init_mem = gpt_train.memory_now(device)
    print(f"resnet_train: ResNet-50 {res['param_count'] / 1e6:.1f}M params on {res['device_name']}, "
          f"torch {torch.__version__}, torchvision {torchvision.__version__}", flush=True)

    def train_step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for step in range(a.steps):
        gpt_train.reset_peaks(device)
        gpt_train.synchronize(device)
        before = benchlib.psshim_stats()
        t0 = time.perf_counter()
        loss = train_step()
        gpt_train.synchronize(device)
        dt = time.perf_counter() - t0
        value = loss.float().item()
        rec = {"step": step, "loss_hex": float.hex(value), "loss": value, "time_s": dt,
               **gpt_train.memory_now(device), "psshim": gpt_train.psshim_step(before, benchlib.psshim_stats())}
        res["steps"].append(rec)
        res["loss_hex"].append(rec["loss_hex"])
        res["loss"].append(value)
        res["step_times_s"].append(dt)
        warm = min(a.warmup, len(res["step_times_s"]) - 1)
        res.update(warmup_steps=warm, median_step_s=benchlib.median(res["step_times_s"][warm:]),
                   memory=gpt_train.summarize_memory(init_mem, res["steps"]))
        print(f"step {step:4d}  loss {rec['loss_hex']} ({value:.6f})  time {dt:.4f} s  peak alloc "
              f"{benchlib.gib(rec.get('max_allocated_bytes'))} GiB", flush=True)
        if a.json:
            benchlib.write_json(a.json, res)
    if a.profile:
        res["profile"] = gpt_train.profile_step(train_step, device)
        print("resnet_train: " + gpt_train.profile_line(res["profile"]), flush=True)


def main(argv=None) -> int:
    a = parse_args(argv)
    gpt_train.configure_determinism(a.deterministic)
    if a.deterministic:
        # ResNet's pooling backward has no deterministic CUDA kernel: torch would refuse the
        # run; warned instead, and the bitwise loss comparison says whether it repeated.
        torch.use_deterministic_algorithms(True, warn_only=True)
    res = {"script": "resnet_train.py", "argv": sys.argv[1:], "config": vars(a), "mode": "native",
           "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
           "steps": [], "loss_hex": [], "loss": [], "step_times_s": [],
           "oom": False, "error": None, "finished": False}
    try:
        train(a, res)
    except Exception as exc:  # noqa: BLE001 - recorded in the JSON and the exit status
        res.update(oom=gpt_train.is_oom(exc), error=f"{type(exc).__name__}: {exc}"[:4000])
        if a.json:
            benchlib.write_json(a.json, res)
        traceback.print_exc()
        return benchlib.EXIT_OOM if res["oom"] else 1
    res["finished"] = True
    if a.json:
        benchlib.write_json(a.json, res)
    print(f"resnet_train: median step {res['median_step_s']:.4f} s (after {res['warmup_steps']} warm-up), "
          f"peak allocated {benchlib.gib(res['memory']['peak_allocated_bytes'])} GiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
