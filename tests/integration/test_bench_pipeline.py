#!/usr/bin/env python3
"""bench/pipeline.py without a GPU. Its arithmetic: the least traffic of the layer order at a
budget (OPT), the bound, the compute setting's calibration, the in-place share, the weights'
verdict. Then whole calls: on the test driver, with tests/integration/pipeline_sim (the same
pipeline, the same JSON line) as the program and the built psshim launcher (argv: PIPELINE_SIM
LAUNCHER; left out when not given); and against stand-ins written here, whose checksums,
hangs and missing psshim the test chooses. Everything it writes goes to a temporary folder."""
import json
import os
import subprocess
import sys
import tempfile

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
sys.path.insert(0, BENCH)
import pipeline  # noqa: E402

SCRIPT = os.path.join(BENCH, "pipeline.py")
MIB = 1 << 20


def check_arithmetic():
    # 48 layers, 12 on the GPU: each half-step hits the 12 the last left and fetches 36; every
    # layer written in backward is written back once (evicted in backward, or in forward).
    assert pipeline.least_traffic(48, 12) == (72, 48), pipeline.least_traffic(48, 12)
    assert pipeline.least_traffic(16, 4) == (24, 16)
    # More than half on the GPU: the middle layers (2..5) stay, written but never written back;
    # 7 and 6 leave in backward, 0 and 1 in forward, each after a write.
    assert pipeline.least_traffic(8, 6) == (4, 4), pipeline.least_traffic(8, 6)
    assert pipeline.least_traffic(8, 5) == (6, 6) and pipeline.least_traffic(8, 1) == (14, 8)
    assert pipeline.least_traffic(8, 8) == (0, 0) and pipeline.least_traffic(8, 20) == (0, 0)
    a = pipeline.parse_args(["--psshim", "/x/libpsshim.so"])
    assert (a.layers, a.layer_mib, a.steps, a.warmup, a.budget) == (48, 256, 8, 3, 3 << 30)
    assert a.preload and a.lib == "/x/libpsshim.so"
    b = pipeline.link_bound(a)
    # 18 GiB in at 55.4 GB/s binds: 12 GiB out at 55.3, and 30 GiB at 96.4 both ways, take less.
    assert b["resident_layers"] == 12 and b["h2d_bytes"] == 72 * 256 * MIB and b["d2h_bytes"] == 48 * 256 * MIB
    assert abs(b["link_s"] - 72 * 256 * MIB / 55.4e9) < 1e-9, b
    q = pipeline.parse_args(["--quick", "--psshim", "/x/bin/psshim", "--steps", "7"])
    assert (q.layers, q.layer_mib, q.steps, q.warmup, q.budget) == (16, 64, 7, 2, 256 * MIB)
    assert not q.preload and q.lib == "/x/libpsshim.so"
    # 0.04 s at ITERS 0, 0.54 at 256: 512 more ITERS a second; 0.77 s at 374.
    assert pipeline.calibrated_iters(0.04, 0.54, 256, 0.77) == 374
    assert pipeline.calibrated_iters(0.04, 0.54, 256, 0.01) == 1
    try:
        pipeline.calibrated_iters(0.04, 0.04, 256, 0.77)
        raise AssertionError("a flat calibration gave ITERS")
    except ValueError:
        pass
    assert pipeline.touch_pct({"touches_host": 1, "touches_gpu": 3}) == 25.0
    assert pipeline.touch_pct({"touches_host": 0, "touches_gpu": 0}) is None and pipeline.touch_pct(None) is None
    assert pipeline.weights_verdict(["a", "a", "a"]) == "identical"
    assert pipeline.weights_verdict(["a", "b", "a"]) == "differ"
    assert pipeline.weights_verdict(["a", None, "b"]) == "differ"
    assert pipeline.weights_verdict(["a", None, "a"]) is None
    recs = {m: {"status": "ok", "result": {"step_s_median": s, "weights_checksum": "c"}}
            for m, s in (("native", 0.1), ("static", 2.0), ("psshim", 0.5))}
    r = pipeline.row("pcie", 0, recs, {"link_s": 0.25})
    assert (r["bound_s"], r["psshim_over_bound"], r["static_over_bound"], r["weights"]) == (0.25, 2.0, 8.0, "identical")
    assert pipeline.row("compute", 9, recs, {"link_s": 0.05})["bound_s"] == 0.1  # native binds


def call(args, env=None, timeout=300):
    done = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))
    assert done.returncode == 0, f"pipeline.py {args}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def check_test_driver(sim, launcher, tmp):
    """The real launcher and psshim on pipeline_sim: weights identical in every run, and what
    the JSON says of psshim's statistics is what the files hold."""
    out = os.path.join(tmp, "fake", "pipeline.json")
    printed = call(["--binary", sim, "--psshim", launcher, "--layers", "8", "--layer-mib", "4", "--steps", "4",
                    "--warmup", "1", "--calibration-iters", "8", "--out", out], env={"PSSHIM_POLICY": "static"})
    print(printed)
    doc = json.load(open(out))
    assert doc["dropped_env"] == ["PSSHIM_POLICY"], doc["dropped_env"]
    assert [r["setting"] for r in doc["runs"]] == ["pcie", "compute"]
    assert doc["calibration"]["iters"] == 8 and doc["runs"][1]["iters"] >= 1
    assert doc["budget_bytes"] == 8 * MIB and doc["least_traffic"]["resident_layers"] == 2
    for r in doc["runs"]:
        assert r["weights"] == "identical", r
        for mode in pipeline.MODES:
            rec = r["modes"][mode]
            assert rec["status"] == "ok" and rec["result"]["psshim"] == (mode != "native"), rec
            assert os.path.getsize(rec["log"]) > 0
        static, auto = r["modes"]["static"], r["modes"]["psshim"]
        assert "--policy static" in static["command"] and "--policy" not in auto["command"], auto["command"]
        assert "--budget 8M" in auto["command"]
        stats = json.load(open(auto["stats_file"]))
        assert r["inplace_touch_pct"] == pipeline.touch_pct(stats) and stats["gpu_budget"] == 8 * MIB
        assert r["bound_s"] == max(r["native_s"], doc["least_traffic"]["link_s"])
    assert printed.rstrip().splitlines()[-1].startswith("compute"), "the table is not printed last"


# A program taking pipeline.cu's KEY=VALUE arguments; what it does under psshim (PSSHIM_GPU_BUDGET
# set by the launcher below) comes from FAKE_SPEC: {"static"|"psshim": "differ"|"hang"|"absent"}.
FAKE_PROGRAM = r'''#!/usr/bin/env python3
import json, os, sys, time
kv = dict(a.split("=", 1) for a in sys.argv[1:])
mode = "native" if "PSSHIM_GPU_BUDGET" not in os.environ else os.environ.get("PSSHIM_POLICY", "psshim")
what = json.loads(os.environ.get("FAKE_SPEC", "{}")).get(mode)
if what == "hang":
    time.sleep(600)
steps, iters = int(kv["STEPS"]), int(kv["ITERS"])
step = 0.01 + 0.001 * iters + (0.05 if mode != "native" else 0)
if os.environ.get("PSSHIM_STATS"):
    json.dump({"touches_host": 3, "touches_gpu": 1, "gpu_budget": 1}, open(os.environ["PSSHIM_STATS"], "w"))
print(json.dumps({"step_s_median": step, "steps": [step] * steps, "weights_checksum": "differ" if what == "differ"
                  else "c0ffee" + kv["ITERS"], "psshim": mode != "native" and what != "absent"}))
'''

# The launcher's options, as tools/psshim.in sets them.
FAKE_LAUNCHER = r'''#!/bin/sh
while [ "$1" != "--" ]; do
  case $1 in
  --budget) export PSSHIM_GPU_BUDGET=$2 ;;
  --policy) export PSSHIM_POLICY=$2 ;;
  --stats) export PSSHIM_STATS=$2 ;;
  esac
  shift 2
done
shift
exec "$@"
'''


def check_stand_ins(tmp):
    prog, launcher = os.path.join(tmp, "prog"), os.path.join(tmp, "inst", "bin", "psshim")
    os.makedirs(os.path.dirname(launcher))
    open(os.path.join(tmp, "inst", "libpsshim.so"), "w").close()
    for path, text in ((prog, FAKE_PROGRAM), (launcher, FAKE_LAUNCHER)):
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
    out = os.path.join(tmp, "stand", "pipeline.json")
    common = ["--binary", prog, "--psshim", launcher, "--quick", "--out", out]
    # Calibration: 0.010 s at ITERS 0, 0.074 at 64; the target 2.2 x the link time of 24 layers
    # of 64 MiB in (1.61 GB at 55.4 GB/s: 0.0291 s) is 0.0640 s: ITERS 54.
    call(common + ["--calibration-iters", "64", "--timeout", "5"], env={"FAKE_SPEC": json.dumps({"static": "hang"})})
    doc = json.load(open(out))
    pcie, compute = doc["runs"]
    assert compute["iters"] == 54, compute["iters"]
    assert pcie["modes"]["static"]["status"] == "timeout" and pcie["static_s"] is None
    assert pcie["weights"] is None and abs(pcie["psshim_s"] - 0.06) < 1e-9 and pcie["inplace_touch_pct"] == 75.0
    call(common + ["--iters-compute", "5"], env={"FAKE_SPEC": json.dumps({"psshim": "differ"})})
    doc = json.load(open(out))
    assert [r["weights"] for r in doc["runs"]] == ["differ", "differ"] and doc["runs"][1]["iters"] == 5
    assert "calibration" not in doc
    call(common + ["--settings", "compute", "--iters-compute", "5"],
         env={"FAKE_SPEC": json.dumps({"static": "absent"})})
    doc = json.load(open(out))
    (compute,) = doc["runs"]
    rec = compute["modes"]["static"]
    assert rec["status"] == "error" and rec["reason"] == "psshim was not loaded" and compute["static_s"] is None
    assert compute["weights"] is None and compute["psshim_s"] is not None


def main():
    check_arithmetic()
    with tempfile.TemporaryDirectory() as tmp:
        check_stand_ins(tmp)
        if len(sys.argv) == 3:
            check_test_driver(os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), tmp)
    print("bench/pipeline.py: ok")


if __name__ == "__main__":
    main()
