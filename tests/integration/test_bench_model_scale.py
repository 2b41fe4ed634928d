#!/usr/bin/env python3
"""bench/model_scale.py without a GPU: the ladder against gpt_train.py's parameter count, the
dry run, then whole calls against a stand-in trainer (written here, taking gpt_train.py's
options) whose largest rung per method and way of failing the test chooses: the search finds
that rung, classifies each failure, feeds psshim's reported budgets back into the estimates,
runs --refs, stops at --max-total-s, continues from --prior, and --merge joins calls into one
result and table. Everything it writes goes to a temporary folder."""
import json
import os
import re
import subprocess
import sys
import tempfile

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
sys.path.insert(0, BENCH)
import model_scale  # noqa: E402

SCRIPT = os.path.join(BENCH, "model_scale.py")
GIB = 1 << 30

# A trainer that trains while --hidden <= FAKE_LIMITS[method] and else fails as
# FAKE_FAILS[method] says, writing gpt_train.py's JSON after every step.
FAKE = r'''
import argparse, json, os, signal, sys, time
p = argparse.ArgumentParser()
for name in ("layers", "hidden", "heads", "seq", "batch", "vocab", "steps", "warmup"):
    p.add_argument("--" + name, type=int)
p.add_argument("--json")
a, rest = p.parse_known_args()
method = ("fsdp-offload" if "--fsdp-offload" in rest else "deepspeed-offload" if "--deepspeed-offload" in rest
          else "psshim" if os.environ.get("LD_PRELOAD") else "native")
table = lambda var: dict(x.split(":") for x in os.environ.get(var, "").split(",") if x)
limit, fail = int(table("FAKE_LIMITS").get(method, 0)), table("FAKE_FAILS").get(method, "gpu")
res = {"loss": [], "step_times_s": [], "steps": [], "oom": False, "error": None, "finished": False,
       "param_count": None, "seen_env": sorted(k for k in os.environ if k.startswith("PSSHIM_"))}
def write():
    json.dump(res, open(a.json, "w"))
if "PSSHIM_STATS" in os.environ:
    json.dump({"gpu_budget": int(138.4 * 2**30), "host_budget": int(os.environ.get("FAKE_HOST_BUDGET", 64 << 30)),
               "peak_host_bytes": 5 << 30}, open(os.environ["PSSHIM_STATS"], "w"))
ok = a.hidden <= limit
if os.environ.get("FAKE_BUDGET_LINE"):  # as when torch retries an allocation psshim could not serve
    print("psshim: out of memory on device 0: 2097152 bytes asked; GPU budget (1 MiB) and host budget (1 MiB) "
          "are both in use (PSSHIM_GPU_BUDGET, PSSHIM_HOST_BUDGET)", file=sys.stderr)
for step in range(a.steps):
    if not ok and step == 1:
        if fail == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fail == "hang":
            time.sleep(600)
        if fail == "alloc":
            hog = bytearray(b"\x01") * (int(os.environ["FAKE_ALLOC_MB"]) << 20)
            time.sleep(600)
        if fail == "error":
            raise RuntimeError("an error that is not about memory")
        if fail in ("gpu", "host", "budgets"):
            if fail == "budgets":
                print("psshim: out of memory on device 0: 2097152 bytes asked; GPU budget (141721 MiB) and host "
                      "budget (65536 MiB) are both in use (PSSHIM_GPU_BUDGET, PSSHIM_HOST_BUDGET)", file=sys.stderr)
            res.update(oom=True, error="RuntimeError: DefaultCPUAllocator: can't allocate memory" if fail == "host"
                       else "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
            write()
            sys.exit(3)
    loss = float("nan") if (not ok and fail == "nan" and step == 3) else 10.0 - step
    res["loss"].append(loss); res["step_times_s"].append(0.01); res["steps"].append({"step": step})
    write()
    time.sleep(0.05)
n = a.layers * (12 * a.hidden ** 2 + 13 * a.hidden) + 2 * a.vocab * a.hidden + a.seq * a.hidden + 2 * a.hidden
res.update(finished=True, median_step_s=0.01 * a.hidden / 1000, tflops=a.hidden / 10, param_count=n)
write()
'''


def call(tmp, name, *args, env=None, rc=0):
    """model_scale.py's call with the stand-in trainer; its result JSON and output."""
    out = os.path.join(tmp, name + ".json")
    fake = os.path.join(tmp, "fake_train.py")
    cmd = [sys.executable, SCRIPT, "--train-script", fake, "--gpu-mem", "143771M", "--host-mem", "128G",
           "--poll-s", "0.05", "--out", out, *args]
    p = subprocess.run(cmd, env=dict(os.environ, **(env or {})), capture_output=True, text=True, timeout=300)
    assert p.returncode == rc, f"{cmd}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return (json.load(open(out)) if rc == 0 and "--dry-run" not in args else None), p.stdout


def rows(result, label):
    return [r for r in result["probes"] if r["label"] == label]


# The ladder: its first rung is gpt2.7b, whose count gpt_train.py reported on the H200
# (bench/results/paging_sweep_gpt2.7b_*.json: 2684113920); demo's shape gives demo's 134994432.
ladder = model_scale.ladder(32000, 1024)
assert (ladder[0].name, ladder[0].params) == ("L32h2560", 2684113920), ladder[0]
assert model_scale.param_count(12, 768, 32000, 1024) == 134994432
assert ladder[-1].name == "L64h8192", ladder[-1]
for lo, hi in zip(ladder, ladder[1:]):
    assert 1.04 < hi.params / lo.params < 1.2 and hi.layers >= lo.layers and hi.hidden >= lo.hidden, (lo, hi)
    assert hi.hidden % 128 == 0 and hi.heads * 128 == hi.hidden and 32 <= hi.layers <= 64, hi
assert [r.name for r in model_scale.select(ladder, "6B-8B,L64h8192")] == \
    ["L38h3584", "L38h3712", "L41h3712", "L41h3840", "L64h8192"]

# The search on made-up outcomes: from every start, it ends at the largest that trains.
for n in (1, 2, 7, 39):
    for truth in range(-1, n):
        for start in range(n):
            known, probes = {}, 0
            while (i := model_scale.next_index(n, known, start)) is not None:
                assert i not in known, (n, truth, start, i)
                known[i], probes = i <= truth, probes + 1
                assert probes <= n, (n, truth, start)
            assert max((i for i, ok in known.items() if ok), default=-1) == truth, (n, truth, start, known)
            assert truth == n - 1 or known.get(truth + 1) is False, (n, truth, start, known)
            if 0 < start < n - 1 and truth in (start - 1, start):  # a start one off costs two probes
                assert probes == 2, (n, truth, start, known)

with tempfile.TemporaryDirectory() as tmp:
    with open(os.path.join(tmp, "fake_train.py"), "w") as f:
        f.write(FAKE)
    lib = os.path.join(tmp, "libpsshim.so")  # the stand-in trainer never loads it
    open(lib, "w").close()

    # Dry run: the ladder and estimates, a first command per method, nothing run.
    _, text = call(tmp, "dry", "--dry-run", "--psshim-lib", lib)
    assert "L32h2560" in text and "2.68" in text and "L64h8192" in text, text
    row = next(line for line in text.splitlines() if line.startswith("L44h4224"))  # 144.5 GiB of model data
    cells = re.split(r"\s{2,}", row.strip())  # rung L h heads params model act, then the methods
    assert cells[7].endswith(" no") and cells[10].split()[-1][0].isdigit(), cells  # native cannot, psshim can
    starts = [line for line in text.splitlines() if line.startswith("# ") and ": start " in line]
    assert len(starts) == 4 and "L42h3968" in starts[0], starts
    assert "--fsdp-offload" in text and "LD_PRELOAD=" in text and "PSSHIM_GPU_BUDGET" not in text, text
    assert not os.path.exists(os.path.join(tmp, "dry.json")), "a dry run wrote a result"

    # One call: native trains to h3456 (then CUDA OOM), FSDP to h3200 (then host OOM),
    # psshim to h4608 with a reported host budget that rules out the rung above.
    env = {"FAKE_LIMITS": "native:3456,fsdp-offload:3200,psshim:4608", "FAKE_FAILS": "native:gpu,fsdp-offload:host",
           "FAKE_HOST_BUDGET": str(20 * GIB), "PSSHIM_GPU_BUDGET": "1G"}
    a, text = call(tmp, "a", "--methods", "native,fsdp-offload,deepspeed-offload,psshim", "--psshim-lib", lib,
                   env=env)
    s = a["summary"]
    assert s["native"]["largest"] == "L38h3456" and s["native"]["next"]["rung"] == "L38h3584", s["native"]
    assert s["native"]["next"]["status"] == "oom-gpu", s["native"]
    assert rows(a, "native")[0]["rung"] == "L42h3968", "native's search did not start at its estimate's top"
    assert len([r for r in rows(a, "native") if r["status"] != "skipped"]) <= 7, rows(a, "native")
    assert s["fsdp-offload"]["largest"] == "L35h3200" and s["fsdp-offload"]["next"]["status"] == "oom-host", s
    assert s["psshim"]["largest"] == "L46h4608", s["psshim"]
    above = next(r for r in rows(a, "psshim") if r["rung"] == "L47h4736")
    assert above["status"] == "skipped" and "reported by psshim" in above["reason"], above
    assert [r["status"] for r in rows(a, "deepspeed-offload")] == ["skipped"], rows(a, "deepspeed-offload")
    # --refs: each at native's and FSDP's largest where it fits; FSDP not above its own.
    assert s["native"]["at"]["fsdp-offload"]["status"] == "ok", s["native"]
    assert s["psshim"]["at"]["native"]["status"] == "ok" and s["psshim"]["at"]["fsdp-offload"]["status"] == "ok"
    assert s["fsdp-offload"]["at"]["native"]["status"] == "oom-host", s["fsdp-offload"]  # its search's probe
    assert len({r["rung"] for r in rows(a, "fsdp-offload")}) == len(rows(a, "fsdp-offload")), rows(a, "fsdp-offload")
    for r in a["probes"]:
        assert r["command"] and r["commit"], r
        if r["status"] == "ok":
            assert r["first_step_s"] is not None and r["param_count"] == r["params"], r
    p = rows(a, "psshim")[0]
    seen = json.load(open(p["json"]))["seen_env"]
    assert "PSSHIM_GPU_BUDGET" in p["env_removed"] and seen == ["PSSHIM_STATS"], (p["env_removed"], seen)
    assert "psshim: largest 2.12x native's; at native's largest (L38h3456) 345.6 TFLOPS against 345.6 TFLOPS" in a["comparisons"][2], a["comparisons"]
    last = text.rstrip().splitlines()
    assert last[-6].startswith("method") and last[-2].split()[:2] == ["deepspeed-offload", "not"], last[-6:]
    assert open(os.path.join(tmp, "a.txt")).read().rstrip().endswith(text.rstrip().splitlines()[-1])

    # --refs-first, from a call that found native's and FSDP's largest: those two first.
    n, _ = call(tmp, "n", "--methods", "native,fsdp-offload", env=env)
    r, _ = call(tmp, "r", "--methods", "psshim", "--psshim-lib", lib, "--refs-first", "--prior",
                os.path.join(tmp, "n.json"), env=dict(env, FAKE_HOST_BUDGET=str(64 * GIB)))
    assert [x["rung"] for x in r["probes"][:2]] == ["L38h3456", "L35h3200"], r["probes"]
    assert r["summary"]["psshim"]["largest"] == "L46h4608", r["summary"]

    # Each way of failing, one probe each (--only).
    def fails(mode, *args, **extra):
        env = {"FAKE_LIMITS": "", "FAKE_FAILS": f"native:{mode},psshim:{mode}", **extra}
        r, _ = call(tmp, "f_" + mode, "--only", "native:L32h2560", *args, env=env)
        return r["probes"][0]
    assert fails("gpu")["status"] == "oom-gpu"
    assert fails("host")["status"] == "oom-host"
    b = fails("budgets", "--only", "psshim:L32h2560", "--psshim-lib", lib)
    assert b["status"] == "oom-budgets" and "both in use" in b["reason"], b
    assert fails("kill")["status"] == "killed"
    w = fails("gpu", FAKE_LIMITS="native:9999", FAKE_BUDGET_LINE="1")
    assert w["status"] == "ok" and "both in use" in w["reason"], w
    assert fails("nan")["status"] == "nonfinite"
    assert fails("error")["status"] == "error"
    t = fails("hang", "--timeout", "2")
    assert t["status"] == "timeout" and t["wall_s"] < 30, t
    used = model_scale.meminfo()["MemTotal"] - model_scale.meminfo()["MemAvailable"]
    g = fails("alloc", "--host-mem", str(used + (256 << 20)), "--host-guard", "0", "--host-reserve", "0", "--timeout", "60",
              FAKE_ALLOC_MB="1536")
    assert g["status"] == "oom-host" and "host memory in use" in g["reason"] and g["wall_s"] < 30, g

    # An error is no size limit: the search stops there.
    e, _ = call(tmp, "e", "--methods", "native", "--refs", "", env={"FAKE_LIMITS": "", "FAKE_FAILS": "native:error"})
    assert [r["status"] for r in e["probes"]] == ["error"], e["probes"]

    # The time limit: no probe starts, what there is is written, exit 0.
    z, text = call(tmp, "z", "--methods", "native", "--max-total-s", "1", env=env)
    assert z["probes"] == [] and "max-total-s" in z["stopped"], z

    # --prior: a second call knows what the first found and probes nothing again; a call
    # limited by --sizes continues from it.
    c, _ = call(tmp, "c", "--methods", "native", "--prior", os.path.join(tmp, "a.json"), env=env)
    assert c["probes"] == [], c["probes"]
    d1, _ = call(tmp, "d1", "--methods", "native", "--sizes", "0-5B", "--refs", "", env=env)
    assert d1["summary"]["native"]["largest"] == "L35h3328", d1["summary"]
    d2, _ = call(tmp, "d2", "--methods", "native", "--refs", "", "--prior", os.path.join(tmp, "d1.json"), env=env)
    assert "L35h3328" not in [r["rung"] for r in d2["probes"]] and d2["summary"]["native"]["largest"] == "L38h3456"

    # --merge: calls joined (a file twice counts once), the summary over all of them.
    m, text = call(tmp, "m", "--merge", os.path.join(tmp, "d1.json"), os.path.join(tmp, "d2.json"),
                   os.path.join(tmp, "d2.json"))
    assert len(m["probes"]) == len(d1["probes"]) + len(d2["probes"]), len(m["probes"])
    assert m["summary"]["native"]["largest"] == "L38h3456" and m["summary"]["native"]["next"]["rung"] == "L38h3584"
    assert text.rstrip().splitlines()[-1].split()[:2] == ["native", "L38h3456"], text
    other = json.load(open(os.path.join(tmp, "d1.json")))
    other["settings"]["seq"] = 2048
    json.dump(other, open(os.path.join(tmp, "other.json"), "w"))
    call(tmp, "bad", "--merge", os.path.join(tmp, "d2.json"), os.path.join(tmp, "other.json"), rc=1)
print("model scale ok")
