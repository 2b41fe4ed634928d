#!/usr/bin/env python3
"""Check that gpt_train.py runs have bitwise-identical per-step losses.

    python bench/compare_losses.py native.json psshim.json [more.json ...]

The first file is the reference. Losses are compared as float.hex() strings of the
float32 loss, so "identical" means every bit. Prints one row per step ('=' where a run
matches the reference) and exits 0 when all runs match, 1 on any mismatch (different
bits, different number of steps, a run with no steps or one that ran out of memory),
2 when a file cannot be read.
"""

from __future__ import annotations

import argparse
import os
import sys

import benchlib


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN.json",
                   help="gpt_train.py --json outputs; the first is the reference")
    return p.parse_args(argv)


def load_runs(paths):
    runs = []
    for path in paths:
        data = benchlib.load_json(path)
        if not isinstance(data, dict) or "loss_hex" not in data:
            print(f"compare_losses: {path}: not a gpt_train.py --json result", file=sys.stderr)
            return None
        runs.append(data)
    return runs


def loss_table(names, runs) -> str:
    ref = runs[0]["loss_hex"]
    rows = []
    for step in range(max(len(r["loss_hex"]) for r in runs)):
        row = [str(step)]
        for i, run in enumerate(runs):
            hexes = run["loss_hex"]
            if step >= len(hexes):
                row.append("(missing)")
            elif i > 0 and step < len(ref) and hexes[step] == ref[step]:
                row.append("=")
            else:
                row.append(f"{hexes[step]} ({run['loss'][step]:.6f})")
        rows.append(row)
    return benchlib.format_table(["step"] + names, rows)


def verdicts(names, runs) -> list:
    """One line per non-reference run; empty list when all are identical."""
    problems = []
    for name, run in zip(names[1:], runs[1:]):
        cmp = benchlib.compare_loss_hex(runs[0]["loss_hex"], run["loss_hex"])
        if run.get("oom"):
            problems.append(f"{name}: ran out of memory after {len(run['loss_hex'])} step(s)")
        elif cmp.first_mismatch is not None:
            problems.append(f"{name}: first differs from {names[0]} at step {cmp.first_mismatch}")
        elif not cmp.same_length or cmp.compared == 0:
            problems.append(f"{name}: {len(run['loss_hex'])} step(s) vs "
                            f"{len(runs[0]['loss_hex'])} in {names[0]}")
    if runs[0].get("oom"):
        problems.append(f"{names[0]} (reference): ran out of memory")
    return problems


def main(argv=None) -> int:
    a = parse_args(argv)
    runs = load_runs(a.runs)
    if runs is None:
        return 2
    names = [os.path.basename(p) for p in a.runs]
    if len(set(names)) < len(names):
        names = list(a.runs)
    print(loss_table(names, runs))
    problems = verdicts(names, runs)
    for line in problems:
        print("MISMATCH " + line)
    if not problems:
        print(f"IDENTICAL: {len(runs)} runs, {len(runs[0]['loss_hex'])} steps, every loss bit equal")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
