#!/usr/bin/env python3
"""bench/benchlib.py's PCIe byte counts: the window arithmetic on made-up samples, then the
counter's thread reading tests/fakecuda's NVML (on LD_LIBRARY_PATH: 1 GB/s out, 2 GB/s in),
finding the device by UUID or index, and saying why when it cannot."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import benchlib  # noqa: E402

TX, RX = benchlib.PcieCounter.TX, benchlib.PcieCounter.RX
# (read's end, counter, bytes/s): each read covers the 20 ms before its end.
samples = [(1.010, TX, 9e9),   # began before the window: left out
           (1.030, TX, 1e9), (1.050, RX, 4e9), (1.070, TX, 3e9), (1.090, RX, 6e9),
           (1.110, TX, 9e9)]   # ended after the window: left out
w = benchlib.pcie_window(samples, 1.0, 1.1)
assert w is not None, "no window"
assert abs(w["d2h_bytes"] - 2e9 * 0.1) < 1, w  # mean of 1e9 and 3e9 over 0.1 s
assert abs(w["h2d_bytes"] - 5e9 * 0.1) < 1, w
assert w["samples"] == 4, w
assert benchlib.pcie_window(samples[:2], 1.0, 1.1) is None, "a direction without samples gave bytes"

for uuid, index in (("fake-0", None), ("GPU-fake-0", None), ("no-such-gpu", 0)):
    counter = benchlib.PcieCounter(uuid, index).start()
    assert counter.error is None, f"{uuid}, {index}: {counter.error}"
    t0 = time.perf_counter()
    time.sleep(0.4)
    t1 = time.perf_counter()
    counter.stop()
    w = counter.window(t0, t1)
    assert w and w["samples"] >= 8, (uuid, w, len(counter.samples))
    assert abs(w["h2d_bytes"] / (2e9 * (t1 - t0)) - 1) < 1e-6, w
    assert abs(w["d2h_bytes"] / (1e9 * (t1 - t0)) - 1) < 1e-6, w

missing = benchlib.PcieCounter("no-such-gpu", None)
assert missing.error and "finding the device" in missing.error, missing.error
assert missing.start().window(0.0, 1e9) is None, "a counter with no device gave bytes"
missing.stop()

benchlib.PcieCounter.LIBRARY = "libnvidia-ml-absent.so.1"
absent = benchlib.PcieCounter()
assert absent.error and absent.error.startswith("no NVML"), absent.error
print("pcie counter ok")
