#!/usr/bin/env python3
"""The house's layering, checked from the sources: which folder may include which
header, and that nothing below shim/ calls the doors (the CUDA symbols psshim exports).

    shim/                          the doors and the wiring, on top
    allocator/                     in floors (FLOORS): chunk space, one move, paging, sharing
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

# allocator/'s floors, lowest first: each floor's internal header and files. A file may
# include its own floor's header and those below, a header only those below, and no file
# names a function that a higher floor's files define: what a lower floor needs of a higher
# one is a hook the higher one registers. allocator.h, the folder's public face, is open to
# every floor.
FLOORS = [
    ("space", "space.h", ["space.c", "frames.c", "spans.c", "alloc_map.c", "capture.c", "marks.c"]),
    ("move", "move.h", ["move.c"]),
    ("paging", "paging.h", ["launches.c", "room.c", "plan_exec.c", "owner.c"]),
    ("sharing", "sharing.h", ["shard.c", "rounds.c", "ipc.c"]),
    ("top", "allocator_internal.h", ["alloc.c", "stats.c"]),
]
FLOOR_PUBLIC = "allocator.h"
# A function defined with external linkage: its name, at the start of a line, then its
# parameters and a body.
DEFINITION = re.compile(r"^(?!static\b)[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*\{", re.M)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def check_floors(root, breaches):
    folder = root / "allocator"
    floor_of, header_floor, defined = {}, {}, {}
    for n, (name, header, files) in enumerate(FLOORS):
        header_floor["allocator/" + header] = n
        floor_of[header] = n
        for f in files:
            floor_of[f] = n
    for path in sorted(folder.glob("*.[ch]")):
        if path.name != FLOOR_PUBLIC and path.name not in floor_of:
            breaches.append(f"allocator/{path.name}: in no floor (add it to FLOORS)")
        elif path.suffix == ".c":
            for m in DEFINITION.finditer(strip_comments(path.read_text())):
                defined[m.group(1)] = floor_of[path.name]
    for path in sorted(folder.glob("*.[ch]")):
        if path.name not in floor_of:
            continue
        mine, rel = floor_of[path.name], f"allocator/{path.name}"
        top = mine - 1 if path.suffix == ".h" else mine
        text = path.read_text()
        for n, line in enumerate(text.splitlines(), 1):
            m = INCLUDE.search(line)
            if m and header_floor.get(m.group(1), -1) > top:
                breaches.append(f"{rel}:{n}: includes {m.group(1)}, above its floor ({FLOORS[mine][0]})")
        for n, line in enumerate(strip_comments(text).splitlines(), 1):
            for m in re.finditer(r"\b[A-Za-z_]\w*\b", line):
                if defined.get(m.group(0), -1) > mine:
                    breaches.append(f"{rel}:{n}: names {m.group(0)}, of a floor above its own ({FLOORS[mine][0]})")


def main(root):
    root = pathlib.Path(root)
    breaches = []
    check_floors(root, breaches)
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
