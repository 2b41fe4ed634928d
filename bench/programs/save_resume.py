"""Trains, saves the model and optimizer state with torch.save mid-run, and resumes in a fresh
process (a child started the same way, so under psshim too) that loads them onto the GPU and
trains on: the losses of both halves are the run's."""
import json
import os
import subprocess
import sys
import tempfile

import torch

from common import Steps, report, seed, train

HALF = 10


def make():
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
                                torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


seed()
model, opt = make()
steps = Steps()
if len(sys.argv) == 3 and sys.argv[1] == "--resume":
    state = torch.load(sys.argv[2], map_location="cuda")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    torch.cuda.set_rng_state(state["rng"].cpu())
    train(model, opt, (256, 1024), HALF, steps)
    print("RESUMED " + json.dumps({"losses": [repr(x) for x in steps.losses], "times": steps.times,
                                   "peak_reserved": torch.cuda.max_memory_reserved()}), flush=True)
    raise SystemExit(0)
train(model, opt, (256, 1024), HALF, steps)
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "state.pt")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "rng": torch.cuda.get_rng_state()}, path)
    # Two processes writing one trace or statistics file would clobber it: the child's get
    # names of their own.
    env = {**os.environ, **{k: os.environ[k] + ".resumed" for k in ("PSSHIM_TRACE", "PSSHIM_STATS")
                            if os.environ.get(k) not in (None, "0", "1")}}  # 0 and 1 name no file
    child = subprocess.run([sys.executable, __file__, "--resume", path], capture_output=True, text=True, env=env)
sys.stderr.write(child.stderr)
lines = [l for l in child.stdout.splitlines() if l.startswith("RESUMED ")]
if child.returncode or not lines:
    raise SystemExit(f"the resumed process failed (exit {child.returncode})")
resumed = json.loads(lines[-1][8:])
steps.losses += [float(x) for x in resumed["losses"]]
steps.times += resumed["times"]
report(steps, peak_reserved=max(torch.cuda.max_memory_reserved(), resumed["peak_reserved"]))
