#!/usr/bin/env python3
"""The house's layering, checked from the sources: which folder may include which
header, and that nothing below shim/ calls the doors (the CUDA symbols psshim exports).

    shim/                          the doors and the wiring, on top
    allocator/                     chunk space, frames, pager, sharing
    tracer/  comm/  policy/        observation and the trace file; node ranks and NCCL; decisions
    core/                          the ground: includes nothing of psshim's
    tools/                         psshim-report: the trace file and the policy, no CUDA

Run with the repository root as its argument; prints one line per breach and exits 1."""
import pathlib
import re
import sys

# The headers a folder may include from other folders: each folder's public face only.
ALLOWED = {
    "core": set(),
    "policy": set(),
    "tracer": {"core/core.h"},
    "comm": {"core/core.h"},
    "allocator": {"core/core.h", "policy/policy.h", "tracer/tracer.h", "comm/comm.h"},
    "shim": {"core/core.h", "policy/policy.h", "tracer/tracer.h", "tracer/observe.h", "comm/comm.h",
             "allocator/allocator.h"},
    "tools": {"policy/policy.h", "tracer/tracer.h"},
}
NO_CUDA = {"policy", "tools"}
CUDA_HEADERS = re.compile(r"#\s*include\s*<(cuda\w*\.h|cupti\w*\.h|nccl\.h|nvml\.h)>")
INCLUDE = re.compile(r'#\s*include\s*"([\w/]+\.h)"')
# A call of a CUDA API entry point by its own name: below shim/ every driver call goes
# through ps_driver (core's table), never through psshim's exported doors.
DOOR_CALL = re.compile(r"(?<![\w.>])(cu[A-Z]\w*|cuda[A-Z]\w*|nccl[A-Z]\w*|psshim_\w+)\s*\(")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def main(root):
    root = pathlib.Path(root)
    breaches = []
    for folder, allowed in ALLOWED.items():
        for path in sorted((root / folder).glob("*.[ch]")):
            text = path.read_text()
            rel = path.relative_to(root)
            for n, line in enumerate(text.splitlines(), 1):
                m = INCLUDE.search(line)
                if m:
                    inc = m.group(1)
                    if inc.split("/")[0] != folder and inc not in allowed:
                        breaches.append(f"{rel}:{n}: includes {inc}, which {folder}/ may not")
                if folder in NO_CUDA and CUDA_HEADERS.search(line):
                    breaches.append(f"{rel}:{n}: {folder}/ includes a CUDA header")
            if folder == "shim":
                continue
            code = strip_comments(text)
            for n, line in enumerate(code.splitlines(), 1):
                for m in DOOR_CALL.finditer(line):
                    name = m.group(1)
                    # A declaration or definition of the folder's own helpers is not a call.
                    if re.match(r"\s*(static\s+)?[\w\s\*]+\b" + re.escape(name) + r"\s*\(", line) and \
                       not re.search(r"[=(,]\s*" + re.escape(name) + r"\s*\(", line):
                        continue
                    breaches.append(f"{rel}:{n}: calls {name} by name (below shim/, call ps_driver.{name})")
    for b in breaches:
        print("layers:", b)
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
