"""Shared helpers for the bench/ scripts: presets, sizes, FLOP count, JSON, tables.

This module must not import torch: paging_sweep.py and compare_losses.py use it on
machines (or in --dry-run) where torch is not needed.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

GIB = 1 << 30

# Exit status of gpt_train.py when the run ran out of memory (any other failure: 1).
EXIT_OOM = 3

# Copy bandwidths measured on the target H200 (PCIe Gen5 x16), policy/policy.h's PSP_PCIE_*:
# pinned host->device 55.4 GB/s, device->host 55.3 GB/s, both at once 96.4 GB/s total.
H2D_BYTES_PER_S = 55.4e9
D2H_BYTES_PER_S = 55.3e9
DUPLEX_BYTES_PER_S = 96.4e9

# Model presets of gpt_train.py. Keys are gpt_train.py option names (dest form).
PRESETS = {
    # ~135M parameters (GPT-2 small shape, untied 32k vocab): a quick GPU demo.
    "demo": dict(layers=12, hidden=768, heads=12, seq=1024, batch=8, vocab=32000,
                 steps=10, checkpoint=False),
    # 2.68B parameters: the paging benchmark's workload (bench/results/README.md: native
    # 0.384 s/step, 41.23 GiB peak allocated on the H200).
    "gpt2.7b": dict(layers=32, hidden=2560, heads=20, seq=1024, batch=8, vocab=32000,
                    steps=10, checkpoint=True),
    # A few seconds on a CPU: for smoke tests of the scripts themselves.
    "tiny": dict(layers=2, hidden=64, heads=4, seq=32, batch=2, vocab=512,
                 steps=4, checkpoint=False),
}

FLOPS_FORMULA = (
    "F = k*B*s*L*h^2*(1 + s/(6h)) + 6*B*s*h*V per step, k = 72 without and 96 with "
    "activation recomputation (checkpointing repeats each block's forward; the LM head is "
    "not recomputed). This equals Megatron-LM's 72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h)) "
    "and, with recomputation, 96*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h)) "
    "(Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters "
    "Using Megatron-LM', SC'21, arXiv:2104.04473, Sec. 5.1 and Appendix; the 12 vs 16 "
    "is discussed in NVIDIA/Megatron-LM issue #995). Counts matmul FLOPs only, a 4h MLP, "
    "full (not causal-halved) attention scores; TFLOPS = F / step time / 1e12."
)


def megatron_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int,
                   recompute: bool) -> float:
    """Model FLOPs of one training step; see FLOPS_FORMULA."""
    k = 96 if recompute else 72
    blocks = k * batch * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden))
    head = 6 * batch * seq * hidden * vocab
    return float(blocks + head)


_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes from '123', '24G', '1.5GiB', '512M' (binary multiples, like psshim's env)."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (expected e.g. 24G, 512M, 123456)")
    number, unit = float(m.group(1)), m.group(2).lower()
    return int(number * (1024 ** "bkmgt".index(unit or "b")))


def gib(nbytes: float | None, digits: int = 2) -> str:
    return "-" if nbytes is None else f"{nbytes / GIB:.{digits}f}"


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(value, spec: str = ".3f") -> str:
    """Format a number for a table; '-' for None/NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def format_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def write_json(path: str, obj) -> None:
    """Write JSON atomically (a reader never sees half a file)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def spawn(argv: Sequence[str], env: dict, log_path: str, header: str) -> subprocess.Popen:
    """argv started in its own session (so its whole process group can be stopped), stdout
    and stderr to log_path after a '# header' line."""
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "w") as log:
        log.write(f"# {header}\n")
        log.flush()
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


NO_PLOT = "matplotlib is not installed: no plot"


def pyplot():
    """matplotlib.pyplot drawing without a display, or None where matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(fig, ax, path: str) -> None:
    """The legend, then the figure as a PNG at path (its folder made), then closed."""
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    pyplot().close(fig)


def load_json(path: str):
    """The parsed file, or None when it is missing, empty or not JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


@dataclass
class LossComparison:
    """Bitwise comparison of two runs' per-step losses (float.hex strings)."""
    compared: int              # steps present in both
    first_mismatch: int | None  # index of the first differing step
    same_length: bool

    @property
    def identical(self) -> bool:
        return self.first_mismatch is None and self.same_length and self.compared > 0


def compare_loss_hex(ref: Sequence[str], other: Sequence[str]) -> LossComparison:
    n = min(len(ref), len(other))
    first = next((i for i in range(n) if ref[i] != other[i]), None)
    return LossComparison(compared=n, first_mismatch=first, same_length=len(ref) == len(other))


def psshim_stats():
    """psshim's statistics now (its psshim_stats_json), or None when it is not preloaded."""
    try:
        fn = ctypes.CDLL(None).psshim_stats_json
    except AttributeError:
        return None
    fn.restype, fn.argtypes = ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t]
    buf = ctypes.create_string_buffer(8192)
    n = fn(buf, len(buf))
    return json.loads(buf.value) if 0 < n < len(buf) else None


class PcieCounter:
    """Bytes over one GPU's PCIe link each way, from NVML's throughput counters. Each read
    averages the link's bytes over the last 20 ms, so a thread reads them back to back and
    the bytes over a window are the mean rate of its samples times its length. They count
    every byte on the link: copies, and kernels reading or writing host memory in place
    (psshim's host frames), which no copy counter sees. When NVML or the counter is not
    there, `error` says why and windows give None."""

    TX, RX = 0, 1  # nvmlPcieUtilCounter_t: bytes the device sends (to host) / receives
    READ_S = 0.02  # what one read of the counter averages over
    LIBRARY = "libnvidia-ml.so.1"

    def __init__(self, uuid: str | None = None, index: int | None = 0):
        """The device by UUID, else (or if NVML does not know that UUID) by NVML index."""
        self.samples: list[tuple[float, int, float]] = []  # (read's end, counter, bytes/s)
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = None
        try:
            self._nvml = ctypes.CDLL(self.LIBRARY)
            self._open(uuid, index)
        except OSError as e:
            self.error = f"no NVML ({e})"
        except AttributeError as e:  # an NVML without one of the calls
            self.error = f"NVML lacks a call ({e})"

    def _open(self, uuid: str | None, index: int | None) -> None:
        self._handle = ctypes.c_void_p()
        if (rc := self._nvml.nvmlInit_v2()) != 0:
            self.error = f"NVML error {rc} in nvmlInit"
            return
        rc = -1
        if uuid:
            rc = self._nvml.nvmlDeviceGetHandleByUUID(("GPU-" + uuid.removeprefix("GPU-")).encode(),
                                                      ctypes.byref(self._handle))
        if rc != 0 and index is not None:
            rc = self._nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self._handle))
        if rc != 0:
            self.error = f"NVML error {rc} finding the device (UUID {uuid}, index {index})"
        else:
            self._read(self.TX)

    def _read(self, counter: int) -> float | None:
        """Bytes/s (NVML's KB/s, read as 1000 B/s); None, with `error` set, on failure."""
        kbps = ctypes.c_uint()
        rc = self._nvml.nvmlDeviceGetPcieThroughput(self._handle, counter, ctypes.byref(kbps))
        if rc != 0:
            self.error = f"NVML error {rc} reading the PCIe counter"
            return None
        return kbps.value * 1000.0

    def _run(self) -> None:
        counter = self.TX
        while not self._stop.is_set():
            start = time.perf_counter()
            rate = self._read(counter)
            if rate is None:
                return
            self.samples.append((time.perf_counter(), counter, rate))
            counter = self.RX if counter == self.TX else self.TX
            # Reading more often than a read covers would only take the GIL from training.
            self._stop.wait(max(0.0, self.READ_S - (time.perf_counter() - start)))

    def start(self) -> "PcieCounter":
        if self.error is None:
            self._thread = threading.Thread(target=self._run, name="pcie-counter", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def window(self, t0: float, t1: float) -> dict | None:
        """Bytes each way between perf_counter() times t0 and t1 (None: no counter, or a
        direction with no sample in the window)."""
        return pcie_window(self.samples, t0, t1) if self.error is None else None


def pcie_window(samples, t0: float, t1: float) -> dict | None:
    """PcieCounter.window over given samples: per direction, the mean rate of the samples
    whose READ_S lies in [t0, t1], times t1 - t0."""
    rates = {PcieCounter.TX: [], PcieCounter.RX: []}
    for end, counter, rate in samples:
        if t0 <= end - PcieCounter.READ_S and end <= t1:
            rates[counter].append(rate)
    if not rates[PcieCounter.TX] or not rates[PcieCounter.RX]:
        return None
    span = t1 - t0
    return {"h2d_bytes": statistics.fmean(rates[PcieCounter.RX]) * span,
            "d2h_bytes": statistics.fmean(rates[PcieCounter.TX]) * span,
            "samples": len(rates[PcieCounter.TX]) + len(rates[PcieCounter.RX])}
