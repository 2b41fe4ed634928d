#!/usr/bin/env python3
"""bench/paging_sweep.py's serial bound on made-up native numbers: the least bytes the
optimizer step must bring in, its time at the copy rate, the table that shows it."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import paging_sweep  # noqa: E402

native = {"median_step_s": 0.38, "median_optimizer_s": 0.02, "optimizer_data_bytes": 43e9}
b = paging_sweep.serial_bound(native, 29.5e9)
assert b["least_h2d_per_step"] == 13.5e9, b
assert abs(b["serial_bound_s"] - (0.36 + 13.5e9 / 55.4e9)) < 1e-12, b
fits = paging_sweep.serial_bound(native, 50e9)
assert fits == {"least_h2d_per_step": 0, "serial_bound_s": 0.38 - 0.02}, fits
for missing in ("median_step_s", "median_optimizer_s", "optimizer_data_bytes"):
    assert paging_sweep.serial_bound({k: v for k, v in native.items() if k != missing}, 29.5e9) == {}, missing
assert paging_sweep.serial_bound(native, None) == {}

run = {"ratio": 1.5, "method": "psshim-auto", "median_step_s": 0.764, **b}
text = paging_sweep.serial_table({"runs": [run, {"ratio": 1.5, "method": "fsdp-offload"}]})
row = [line for line in text.splitlines() if "psshim-auto" in line]
assert len(row) == 1 and row[0].split()[2:] == ["0.764", "13.50", "0.604", "127%"], text
assert paging_sweep.serial_table({"runs": [{"ratio": 1.5, "method": "fsdp-offload"}]}) is None

# The steady iteration's table reads a run's PSSHIM_STATS steady_* keys; a run without them
# (a peer, or psshim with no trusted period) has no row, and one of a build before
# steady_room_ns shows "-" for it.
stats = {"steady_iterations": 5, "steady_wall_ns": 1.6e9, "steady_launch_ns": 32e6, "steady_pager_pct": 2.0,
         "steady_room_ns": 7e6, "steady_remap_ns": 12e6, "steady_bytes_h2d": 30e9, "steady_bytes_d2h": 20e9,
         "steady_late_waits": 0}
older = {k: v for k, v in stats.items() if k != "steady_room_ns"}
text = paging_sweep.steady_table({"runs": [{**run, "psshim_stats": stats}, {"ratio": 1.5, "method": "fsdp-offload"},
                                           {"ratio": 2, "method": "psshim-auto", "psshim_stats": {"steady_iterations": 0}},
                                           {**run, "method": "psshim-auto-base", "psshim_stats": older}]})
rows = [line.split()[2:] for line in text.splitlines() if "psshim-auto" in line]
assert rows == [["5", "1.600", "32.0", "2.0", "7.0", "12.0", "30.00", "20.00", "13.50", "0"],
                ["5", "1.600", "32.0", "2.0", "-", "12.0", "30.00", "20.00", "13.50", "0"]], text
assert paging_sweep.steady_table({"runs": [{"ratio": 1.5, "method": "fsdp-offload"}]}) is None
print("serial bound and steady iteration ok")

# A run names the build tests/gpu/pack.sh wrote beside its library; no file, no build.
import tempfile  # noqa: E402
with tempfile.TemporaryDirectory() as d:
    lib = os.path.join(d, "libpsshim.so")
    with open(lib + ".commit", "w") as f:
        f.write("4a30fa6\n")
    assert paging_sweep.build_of(lib) == "4a30fa6"
    assert paging_sweep.build_of(os.path.join(d, "libpsshim-base.so")) is None
    assert paging_sweep.build_of(None) is None
print("build ok")

# --merge PATH:RATIOS#METHODS@BUILD keeps only those ratios' runs of those of --methods, and
# names the build of psshim runs that do not name one.
import json  # noqa: E402
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "part.json")
    runs = [{"ratio": 1.25, "method": "psshim-auto"}, {"ratio": 1.25, "method": "psshim-auto-base"},
            {"ratio": 1.25, "method": "fsdp-offload"}, {"ratio": 3.0, "method": "psshim-auto", "build": "old"}]
    with open(path, "w") as f:
        json.dump({"runs": runs}, f)
    part = paging_sweep.merge_part(path + ":1.25@abc", ["psshim-auto", "fsdp-offload"])
    assert part["runs"] == [{"ratio": 1.25, "method": "psshim-auto", "build": "abc"},
                            {"ratio": 1.25, "method": "fsdp-offload"}], part
    part = paging_sweep.merge_part(path + "@abc", ["psshim-auto"])
    assert [r.get("build") for r in part["runs"]] == ["abc", "old"], part
    # #METHODS narrows --methods for one part (a peer's runs from one call, psshim's from another).
    part = paging_sweep.merge_part(path + ":1.25#fsdp-offload", ["psshim-auto", "fsdp-offload"])
    assert part["runs"] == [{"ratio": 1.25, "method": "fsdp-offload"}], part
    part = paging_sweep.merge_part(path + "#fsdp-offload", ["psshim-auto"])
    assert part["runs"] == [], part
print("merge ok")
