#!/usr/bin/env python3
"""bench/activation_set.py without a GPU or torch: whole calls against a stand-in trainer and
a stand-in psshim-report (written here) whose peaks, step times, losses, LEAST TRAFFIC and
failures the test chooses. It checks the budget (half the native peak in whole 2 MiB chunks,
given to the psshim run and to the report), the step-by-step loss comparison, the target
1.5 x max(native step, least bytes / 55.4 GB/s), the stats kept, and that failures and
timeouts are recorded, not raised. Everything it writes goes to a temporary folder."""
import json
import os
import subprocess
import sys
import tempfile

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
sys.path.insert(0, BENCH)
import activation_set  # noqa: E402

SCRIPT = os.path.join(BENCH, "activation_set.py")
MIB = 1 << 20

# A trainer taking gpt_train.py's or resnet_train.py's options; what it does per workload
# (gpt-demo when --preset is given, else resnet50) and per mode (psshim when LD_PRELOAD is
# set) comes from FAKE_SPEC.
FAKE_TRAIN = r'''
import json, math, os, sys, time
argv = sys.argv[1:]
opt = lambda name: argv[argv.index(name) + 1]
workload = "gpt-demo" if "--preset" in argv else "resnet50"
psshim = bool(os.environ.get("LD_PRELOAD"))
spec = json.loads(os.environ["FAKE_SPEC"])[workload]
fail = spec.get("fail")
if fail == ("psshim" if psshim else "native"):
    print("Traceback (most recent call last):\nRuntimeError: boom in " + workload, file=sys.stderr)
    sys.exit(1)
if fail == "hang-" + ("psshim" if psshim else "native"):
    time.sleep(600)
steps, warm = int(opt("--steps")), int(opt("--warmup"))
step_s = spec["psshim_s" if psshim else "native_s"]
loss = [10.0 - 0.25 * i for i in range(steps)]
if psshim and spec.get("break") is not None:
    loss[spec["break"]] = math.nextafter(loss[spec["break"]], 0)
res = {"argv": argv, "loss_hex": [x.hex() for x in loss], "loss": loss, "step_times_s": [step_s] * steps,
       "median_step_s": step_s, "warmup_steps": warm, "finished": True, "error": None, "oom": False,
       "memory": {"peak_allocated_bytes": spec["peak"] if not psshim else 1}, "seen_env":
       {k: v for k, v in os.environ.items() if k.startswith("PSSHIM_")}}
json.dump(res, open(opt("--json"), "w"))
if psshim:
    json.dump(dict(spec["stats"], chunk_size=4 * 2**20), open(os.environ["PSSHIM_STATS"], "w"))
    if not spec.get("no_trace"):
        open(os.environ["PSSHIM_TRACE"], "w").write(workload)
'''

# psshim-report's LEAST TRAFFIC section as tools/report_least.c prints it, for the workload
# the stand-in trace names; FAKE_REPORT_ARGS collects the arguments it was given.
FAKE_REPORT = r'''
import json, os, sys
workload = open(sys.argv[1]).read()
spec = json.loads(os.environ["FAKE_SPEC"])[workload]
with open(os.environ["FAKE_REPORT_ARGS"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
if spec.get("report_fail"):
    print("psshim-report: " + sys.argv[1] + ": not a psshim trace", file=sys.stderr)
    sys.exit(2)
window = spec.get("window", "iteration 12 (the last complete one of the steady period)")
print("psshim-report: a run\n\nDATA MOVE\n  GPU budget of the run  1.0 GiB\n")
print("LEAST TRAFFIC (a lower bound for any placement; MB = 10^6 bytes)")
print(f"  {window}: 412 launches read 9000.0 MB of data they did not write first")
print("  at least onto the GPU, paged in or read in place, whatever the placement:")
print(f"    GPU budget    1.5 GiB  {spec['least_mb']:12.1f} MB")
print("  this run paged in 1400.0 MB then; its in-place reads are not recorded (see the sites' in place lines)")
print("\nPLAN (policy/'s plan for the steady iteration)\n  GPU budget 1.5 GiB  123.0 MB in")
'''

STATS = {"bytes_h2d": 7_000_000_000, "bytes_d2h": 3_000_000_000, "touches_host": 812, "late_waits": 4,
         "launch_ns": 123_456_789}
BASE = {
    # 3 GiB + 1 MiB: half is 1.5 GiB + 0.5 MiB, whole chunks 1.5 GiB. 3000 MB at 55.4 GB/s is
    # 54.15 ms > 33 ms native: the target is 81.2 ms, which 70 ms meets.
    "resnet50": {"peak": 3 * 1024 * MIB + MIB, "native_s": 0.033, "psshim_s": 0.070, "least_mb": 3000.0,
                 "stats": STATS},
    # 8 GiB + 6 MiB: half is 4 GiB + 3 MiB, whole chunks 4 GiB + 2 MiB. 1000 MB is 18 ms,
    # under the 100 ms native step: the target is 150 ms, which 300 ms misses.
    "gpt-demo": {"peak": 8 * 1024 * MIB + 6 * MIB, "native_s": 0.100, "psshim_s": 0.300, "least_mb": 1000.0,
                 "stats": STATS},
}


def spec(**changes):
    """BASE with per-workload changes, e.g. spec(resnet50={"fail": "native"})."""
    return {w: dict(BASE[w], **changes.get(w, {})) for w in BASE}


def call(tmp, name, fake_spec, *args):
    """activation_set.py against the stand-ins: its result JSON, its output, the report's arguments."""
    out = os.path.join(tmp, name + ".json")
    args_file = os.path.join(tmp, name + ".report-args")
    cmd = [sys.executable, SCRIPT, "--psshim-lib", os.path.join(tmp, "gpu", "libpsshim.so"),
           "--resnet-script", os.path.join(tmp, "fake_train.py"), "--gpt-script", os.path.join(tmp, "fake_train.py"),
           "--steps", "6", "--warmup", "2", "--out", out, *args]
    env = dict(os.environ, FAKE_SPEC=json.dumps(fake_spec), FAKE_REPORT_ARGS=args_file)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{cmd}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    calls = [json.loads(line) for line in open(args_file)] if os.path.exists(args_file) else []
    return {w["workload"]: w for w in json.load(open(out))["workloads"]}, p.stdout, calls


def seen_env(rec):
    return json.load(open(rec["command"].split("--json ")[1].split()[0]))["seen_env"]


# The budget: half the peak in whole chunks, never below one.
assert activation_set.half_budget(3 * 1024 * MIB + MIB) == 1536 * MIB
assert activation_set.half_budget(8 * 1024 * MIB + 6 * MIB) == 4098 * MIB
assert activation_set.half_budget(3 * MIB) == 2 * MIB
# The target formula on its own: the link time wins, then the native step.
assert abs(activation_set.target_s(0.033, 3e9) - 1.5 * 3e9 / 55.4e9) < 1e-12
assert activation_set.target_s(0.1, 1e9) == 1.5 * 0.1
assert activation_set.target_s(0.1, None) == 1.5 * 0.1

with tempfile.TemporaryDirectory() as tmp:
    os.makedirs(os.path.join(tmp, "gpu"))
    with open(os.path.join(tmp, "gpu", "libpsshim.so"), "wb") as f:  # never loaded: just its build-id note
        f.write(b"\0" * 64 + activation_set.BUILD_ID_NOTE + bytes(range(20)) + b"\0" * 64)
    with open(os.path.join(tmp, "gpu", "commit"), "w") as f:
        f.write("abc1234\n")
    with open(os.path.join(tmp, "fake_train.py"), "w") as f:
        f.write(FAKE_TRAIN)
    report = os.path.join(tmp, "gpu", "psshim-report")  # found beside the library by default
    with open(report, "w") as f:
        f.write(f"#!{sys.executable}\n" + FAKE_REPORT)
    os.chmod(report, 0o755)

    # A whole call: budgets, losses, least traffic, targets, stats, build, table.
    r, text, calls = call(tmp, "a", spec())
    res, gpt = r["resnet50"], r["gpt-demo"]
    assert res["budget_bytes"] == 1536 * MIB and gpt["budget_bytes"] == 4098 * MIB, (res["budget_bytes"], gpt["budget_bytes"])
    env = seen_env(res["psshim"])
    assert env["PSSHIM_GPU_BUDGET"] == str(1536 * MIB) and env["PSSHIM_STATS"] and env["PSSHIM_TRACE"], env
    assert "PSSHIM_GPU_BUDGET" not in seen_env(res["native"]), "the native run ran under a budget"
    assert [c[1] for c in calls] == [f"--least={1536 * MIB}", f"--least={4098 * MIB}"], calls
    assert "--preset demo --no-checkpoint" in gpt["native"]["command"] and "--deterministic" in gpt["psshim"]["command"]
    assert "--preset" not in res["native"]["command"] and "--steps 6 --warmup 2" in res["native"]["command"]
    assert res["losses"] == {"identical": True, "compared": 6, "first_mismatch": None, "same_length": True}, res
    assert gpt["losses"]["identical"], gpt["losses"]
    assert res["report"]["least_h2d_bytes"] == 3000e6 and res["report"]["paged_in_bytes"] == 1400e6, res["report"]
    assert res["report"]["least_window"].startswith("iteration 12"), res["report"]
    assert abs(res["target_s"] - 1.5 * 3e9 / 55.4e9) < 1e-9 and res["target_met"] is True, res
    assert abs(gpt["target_s"] - 0.15) < 1e-9 and gpt["target_met"] is False, gpt
    assert abs(res["ratio"] - 0.070 / 0.033) < 1e-9, res
    assert res["psshim"]["stats"] == STATS, res["psshim"]["stats"]
    result = json.load(open(os.path.join(tmp, "a.json")))
    assert result["build"]["commit"] == "abc1234" and result["build"]["build_id"] == bytes(range(20)).hex(), result["build"]
    last = text.rstrip().splitlines()
    assert last[-4].startswith("workload") and last[-2].split()[0] == "resnet50", last
    assert last[-2].split()[5:9] == ["identical", "3.00", "0.0812", "yes"], last[-2]
    assert last[-1].split()[8] == "no", last[-1]

    # One step's loss one ulp off under psshim: not identical, the step named, target not met.
    r, text, _ = call(tmp, "b", spec(resnet50={"break": 4}))
    assert r["resnet50"]["losses"]["identical"] is False and r["resnet50"]["losses"]["first_mismatch"] == 4
    assert r["resnet50"]["step_within_target"] is True and r["resnet50"]["target_met"] is False, r["resnet50"]
    assert r["gpt-demo"]["losses"]["identical"] is True
    assert "differ@4" in text.rstrip().splitlines()[-2], text

    # Failures are recorded: a native run that fails leaves no budget and skips its psshim
    # run and report; a psshim run that fails keeps its status and output's tail; a report
    # that fails, or that bounds the whole run and not an iteration, gives no least traffic.
    r, text, calls = call(tmp, "c", spec(resnet50={"fail": "native"}, **{"gpt-demo": {"fail": "psshim"}}))
    n = r["resnet50"]["native"]
    assert n["status"] == "error" and n["returncode"] == 1 and "boom in resnet50" in n["error"], n
    assert r["resnet50"]["budget_bytes"] is None and r["resnet50"]["psshim"]["status"] == "skipped", r["resnet50"]
    assert r["resnet50"]["report"]["status"] == "skipped" and "target_s" not in r["resnet50"]
    p = r["gpt-demo"]["psshim"]
    assert p["status"] == "error" and "boom in gpt-demo" in p["error"] and p["stats"] is None, p
    assert r["gpt-demo"]["report"]["status"] == "skipped" and calls == [], (r["gpt-demo"]["report"], calls)
    assert "target_met" not in r["gpt-demo"] and "losses" not in r["gpt-demo"], r["gpt-demo"]

    r, _, _ = call(tmp, "d", spec(resnet50={"report_fail": True}, **{"gpt-demo": {"window": "the whole run"}}))
    rep = r["resnet50"]["report"]
    assert rep["status"] == "error" and rep["returncode"] == 2 and "not a psshim trace" in rep["error"], rep
    assert rep["least_h2d_bytes"] is None and abs(r["resnet50"]["target_s"] - 1.5 * 0.033) < 1e-9, r["resnet50"]
    rep = r["gpt-demo"]["report"]
    assert rep["least_h2d_bytes"] is None and "not one iteration" in rep["least_error"], rep
    assert "no per-iteration" in r["gpt-demo"]["target_basis"], r["gpt-demo"]

    # A run past its timeout is stopped and recorded; the call goes on with the next workload.
    r, _, _ = call(tmp, "e", spec(resnet50={"fail": "hang-psshim"}), "--timeout", "3")
    assert r["resnet50"]["psshim"]["status"] == "timeout" and r["resnet50"]["psshim"]["wall_s"] < 30, r["resnet50"]
    assert r["gpt-demo"]["psshim"]["status"] == "ok", r["gpt-demo"]
print("activation set ok")
