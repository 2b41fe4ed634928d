"""What each compatibility program reports: one line, COMPAT {json}, last.

losses: one number per step (float, exact repr so runs compare bitwise); times: each
step's seconds; step_ms: the median step time after the first (warm-up) steps; peak_reserved: torch's
max_memory_reserved, the peak the budget is set from."""
import json
import statistics
import time

import torch


def seed(n=0):
    torch.manual_seed(n)
    torch.cuda.manual_seed_all(n)


class Steps:
    """Times steps with CUDA synchronization, collects their losses."""

    def __init__(self):
        self.losses, self.times = [], []

    def __enter__(self):
        torch.cuda.synchronize()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self.t0)

    def loss(self, value):
        self.losses.append(float(value))


def train(forward, opt, shape, n, steps):
    """n plain training steps, each timed by steps: the mean square of forward's output on a
    random batch of `shape` (from a generator seeded 1), backward, the optimizer's step."""
    g = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(n):
        x = torch.randn(*shape, device="cuda", generator=g)
        with steps:
            loss = forward(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        steps.loss(loss.item())


def train_lm(model, opt, vocab, shape, n, steps):
    """n steps of a language model (a transformers model returning .loss) on random tokens
    of `shape` (batch, sequence) from a generator seeded 1, labels the tokens themselves."""
    g = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(n):
        ids = torch.randint(0, vocab, shape, device="cuda", generator=g)
        with steps:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        steps.loss(loss.item())


def report(steps, **extra):
    warm = steps.times[len(steps.times) // 4:] or steps.times
    out = {"losses": [repr(x) for x in steps.losses], "times": steps.times,
           "step_ms": 1e3 * statistics.median(warm) if warm else 0.0,
           "peak_reserved": torch.cuda.max_memory_reserved()}
    out.update(extra)
    print("COMPAT " + json.dumps(out), flush=True)
