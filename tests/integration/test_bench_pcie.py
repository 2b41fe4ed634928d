#!/usr/bin/env python3
"""bench/benchlib.py's PCIe byte counts: the window arithmetic on made-up samples, and a
counter that cannot read NVML (as on a machine without the NVIDIA driver) saying so."""
import os
import sys

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

counter = benchlib.PcieCounter(index=0).start()
counter.stop()
if counter.error:
    assert counter.window(0.0, 1e9) is None, "a counter that failed gave bytes"
print(f"pcie window ok; NVML here: {counter.error or 'read'}")
