#!/usr/bin/env bash
# The mutation check: each tests/mutations/*.mut is a small change that breaks psshim in a
# way the suite must notice. Each is applied in turn to one copy of the tree (the files git
# tracks, as they are in the working tree), built in one reused build folder, and the tests
# it names run; one line per mutation says which test caught it, or SURVIVED. Exits non-zero
# if any mutation survives, no longer applies (its anchor must occur exactly once in its
# file: code that moved fails loudly, never skips), or does not build.
#
# A .mut file: '#' lines say what the mutation does; 'file PATH' the file it changes; one
# 'test NAME' line per meson test to run, in order (the first that fails caught it); then
# the anchor text between '<<<' and '===' and its replacement between '===' and '>>>'.
# Usage: tests/mutations/run.sh [NAME.mut ...]   (default: all)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
toolkit=${CUDA_HOME:-/usr/local/cuda}
work=$(mktemp -d "${TMPDIR:-/tmp}/psshim-mutants.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=$work/src build=$work/build
mkdir -p "$src"
(cd "$root" && git ls-files -z | tar --null -T - -cf -) | tar -xf - -C "$src" || { echo "mutations: cannot copy the tree"; exit 1; }
meson setup "$build" "$src" -Dtoolkit="$toolkit" >"$work/setup.log" 2>&1 && ninja -C "$build" >"$work/build.log" 2>&1 ||
  { echo "mutations: the unmutated tree does not build"; tail -20 "$work/setup.log" "$work/build.log"; exit 1; }

# Applies (or, given 'revert', restores) the mutation in $1 to the copy; prints its file.
mutate() {
  python3 - "$1" "$src" "${2:-apply}" <<'PY'
import os, shutil, sys
mut, src, mode = sys.argv[1:4]
lines = open(mut).read().split("\n")
path = next(l.split(" ", 1)[1] for l in lines if l.startswith("file "))
target, saved = os.path.join(src, path), os.path.join(src, path) + ".unmutated"
if mode == "revert":
    shutil.move(saved, target)
    sys.exit(0)
a, b, c = lines.index("<<<"), lines.index("==="), lines.index(">>>")
anchor, repl = "\n".join(lines[a + 1:b]) + "\n", "\n".join(lines[b + 1:c]) + ("\n" if c > b + 1 else "")
text = open(target).read()
if text.count(anchor) != 1:
    sys.exit(f"its anchor occurs {text.count(anchor)} times in {path} (must be once): the code moved, remake it")
shutil.copy2(target, saved)
open(target, "w").write(text.replace(anchor, repl))
PY
}

muts=("$@")
[ ${#muts[@]} -gt 0 ] || muts=("$here"/*.mut)
failed=0
for m in "${muts[@]}"; do
  name=$(basename "$m" .mut)
  if ! why=$(mutate "$m" 2>&1); then
    printf '%-26s DOES NOT APPLY: %s\n' "$name" "$(tail -1 <<<"$why")"
    failed=1
    continue
  fi
  if ! ninja -C "$build" >"$work/$name.build.log" 2>&1; then
    printf '%-26s DOES NOT BUILD (see below)\n' "$name"
    grep -m5 error "$work/$name.build.log"
    failed=1
  else
    caught=
    while read -r t; do
      if ! meson test -C "$build" --no-rebuild --timeout-multiplier 0.5 "$t" >"$work/$name.test.log" 2>&1; then
        caught=$t
        break
      fi
    done < <(sed -n 's/^test //p' "$m")
    if [ -n "$caught" ]; then
      printf '%-26s caught by %s\n' "$name" "$caught"
    else
      printf '%-26s SURVIVED\n' "$name"
      failed=1
    fi
  fi
  mutate "$m" revert
done
ninja -C "$build" >/dev/null 2>&1 # back to the unmutated build, for a later look
exit $failed
