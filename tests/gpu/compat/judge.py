"""Judges one compatibility row from its runs' COMPAT lines; appends it to ROWS (JSON lines).

Usage: judge.py ROWS NAME BUDGET STATS PSSHIM_RC PSSHIM_OUT NATIVE_OUT...

Losses: bitwise equal to native when the first two native runs agree bitwise ("bitwise");
otherwise each step within the spread (min..max) of the native runs ("spread").
COMPAT_SETTINGS: the settings the run under psshim had beyond the budget, kept in the row."""
import json
import os
import sys


def compat(path):
    try:
        lines = [l for l in open(path, errors="replace") if l.startswith("COMPAT ")]
        return json.loads(lines[-1][7:]) if lines else None
    except OSError:
        return None


rows, name, budget, stats_path, rc, psshim_out = sys.argv[1:7]
natives = [c for c in map(compat, sys.argv[7:]) if c]
mine = compat(psshim_out)
row = {"program": name, "exit": int(rc), "budget_bytes": int(budget), "rule": None, "losses_ok": False,
       "native_step_ms": natives[0]["step_ms"] if natives else None,
       "psshim_step_ms": mine["step_ms"] if mine else None, "peak_host_frames": None, "note": ""}
try:
    s = json.load(open(stats_path))
    row["peak_host_frames"] = s.get("peak_host_frames")
    row["allocs"] = s.get("allocs")
except (OSError, ValueError):
    row["note"] = "no psshim statistics"
if len(natives) < 2:
    row["note"] = "native runs failed"
elif not mine:
    row["note"] = "no result under psshim"
else:
    a, b = natives[0]["losses"], natives[1]["losses"]
    got = mine["losses"]
    if a == b:
        row["rule"] = "bitwise"
        row["losses_ok"] = got == a
    else:
        row["rule"] = f"spread of {len(natives)} native runs"
        steps = [[float(n["losses"][i]) for n in natives if i < len(n["losses"])] for i in range(len(a))]
        row["losses_ok"] = len(got) == len(a) and all(min(v) <= float(x) <= max(v) for v, x in zip(steps, got))
    if not row["losses_ok"]:
        bad = next((i for i, (x, y) in enumerate(zip(got, a)) if x != y), min(len(got), len(a)))
        row["note"] = f"losses differ from step {bad}"
    for k in ("cuda_events", "child_exit", "final_scale"):
        if k in mine:
            row[k] = mine[k]
settings = os.environ.get("COMPAT_SETTINGS", "")
if settings:
    row["psshim_settings"] = settings
    row["note"] = (row["note"] + "; " if row["note"] else "") + "with " + settings
with open(rows, "a") as f:
    f.write(json.dumps(row) + "\n")
