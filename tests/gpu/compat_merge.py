"""Merges compatibility matrices of several device calls (tests/gpu/compat.sh's compat.json)
into one: a program's row from a later file replaces an earlier one, and each row names the
build and the file it came from. The matrix takes longer than one device call.

Usage: compat_merge.py OUT_PREFIX FILE[=BUILD]...
  BUILD names the build where the file does not (files from before compat.sh recorded it).
Writes OUT_PREFIX.json and OUT_PREFIX.txt; exit 1 when a file cannot be read."""
import json
import os
import sys


def main(argv):
    if len(argv) < 3 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) > 1 and argv[1] in ("-h", "--help") else 1
    out, rows, meta = argv[1], {}, None
    for arg in argv[2:]:
        path, _, build = arg.partition("=")
        try:
            doc = json.load(open(path))
        except (OSError, ValueError) as e:
            print(f"compat_merge.py: {path}: {e}", file=sys.stderr)
            return 1
        meta = meta or doc
        for r in doc["rows"]:
            if r.get("exit") is None:
                continue  # skipped for time: not a result
            r["build"] = build or doc.get("build", "?")
            r["source"] = os.path.relpath(path, os.path.dirname(out) or ".")
            rows[r["program"]] = r
    doc = {"date": meta["date"], "gpu": meta["gpu"], "torch": meta["torch"], "rows": list(rows.values())}
    json.dump(doc, open(out + ".json", "w"), indent=1)
    fmt = "{:<24} {:>4} {:<26} {:>6} {:>9} {:>9} {:>7} {:>6} {:>8}  {}"
    lines = [f"psshim compatibility matrix, {doc['date']}, {doc['gpu']}, torch {doc['torch']}",
             fmt.format("program", "exit", "loss rule", "losses", "native ms", "psshim ms", "budget", "host", "build",
                        "note")]
    for r in doc["rows"]:
        lines.append(fmt.format(r["program"], r["exit"], r.get("rule") or "-",
                                "ok" if r.get("losses_ok") else "WRONG" if r.get("rule") else "-",
                                f"{r['native_step_ms']:.2f}" if r.get("native_step_ms") is not None else "-",
                                f"{r['psshim_step_ms']:.2f}" if r.get("psshim_step_ms") is not None else "-",
                                f"{r['budget_bytes'] >> 20}M" if r.get("budget_bytes") else "-",
                                "-" if r.get("peak_host_frames") is None else r["peak_host_frames"], r["build"],
                                r.get("note", "")))
    open(out + ".txt", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
