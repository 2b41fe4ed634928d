#!/usr/bin/env bash
# meson install and the psshim launcher: the install puts libpsshim.so, psshim-report and
# psshim on the prefix, loadable without LD_LIBRARY_PATH; the installed launcher and the
# build folder's run the test driver's training loop under the budget they are given; bad
# options and values stop it with one line.
# Usage: test_launcher.sh MESON BUILD_DIR BINDIR LIBDIR BUILT_LAUNCHER TRAIN_SIM
# (BINDIR and LIBDIR absolute, as installed; the fake driver comes from the environment.)
set -uo pipefail
meson=$1 build=$2 bindir=$3 libdir=$4 built=$5 prog=$6
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

"$meson" install -C "$build" --no-rebuild --destdir "$tmp/root" >"$tmp/install.log" 2>&1 ||
  fail "meson install: $(tail -n 5 "$tmp/install.log")"
bin=$tmp/root$bindir lib=$tmp/root$libdir
for f in "$bin/psshim" "$bin/psshim-report" "$lib/libpsshim.so"; do
  [ -f "$f" ] || fail "not installed: ${f#"$tmp/root"}"
done
[ -x "$bin/psshim" ] || fail "the installed launcher is not executable"
for f in "$bin/psshim-report" "$lib/libpsshim.so"; do
  deps=$(env -u LD_LIBRARY_PATH ldd "$f") || fail "ldd $f"
  ! grep "not found" <<<"$deps" || fail "${f#"$tmp/root"} needs LD_LIBRARY_PATH"
done
env -u LD_LIBRARY_PATH "$bin/psshim-report" --help >/dev/null || fail "the installed psshim-report does not run"
echo "installed: $(cd "$tmp/root" && find . -type f | sort | tr '\n' ' ')"

# The budget takes effect: 24 MiB of GPU frames for a 96 MiB peak leaves the rest in host frames.
for launcher in "$bin/psshim" "$built"; do
  out=$("$launcher" --budget 24M --host-budget=256M --chunk-size 2M --stats "$tmp/s.json" -- "$prog" 6 8 4) ||
    fail "$launcher: $out"
  echo "$launcher: $out"
  [[ $out == *"mismatches 0, psshim loaded" ]] || fail "$launcher: psshim not loaded, or wrong results"
  python3 - "$tmp/s.json" <<'PY' || fail "$launcher: the options did not take effect"
import json, sys
s = json.load(open(sys.argv[1]))
print(f"  gpu_budget {s['gpu_budget'] >> 20} MiB, host_budget {s['host_budget'] >> 20} MiB, "
      f"chunk_size {s['chunk_size'] >> 20} MiB, peak host {s['peak_host_bytes'] >> 20} MiB")
assert (s["gpu_budget"], s["host_budget"], s["chunk_size"]) == (24 << 20, 256 << 20, 2 << 20)
assert s["peak_host_bytes"] > 0 and s["peak_gpu_bytes"] <= s["gpu_budget"]
PY
  rm -f "$tmp/s.json"
done

# Every multiple of 2M is a chunk size psshim uses, asked for or its default on a node of 3,
# 5, 6 or 7 ranks (the ranks times 2M): the run keeps its budget and pages beyond it.
for case in "6M|" "10M|" "14M|" "|LOCAL_WORLD_SIZE=3" "|LOCAL_WORLD_SIZE=5"; do
  IFS='|' read -r size vars <<<"$case"
  env $vars "$built" --budget 24M --host-budget 256M ${size:+--chunk-size $size} --stats "$tmp/s.json" \
    -- "$prog" 2 8 4 >"$tmp/out" 2>"$tmp/err" || fail "chunk ${size:-$vars}: exit $?: $(cat "$tmp/err")"
  [ ! -s "$tmp/err" ] || fail "chunk ${size:-$vars}: said $(cat "$tmp/err")"
  python3 - "$tmp/s.json" "${size:-$vars}" <<'PY' || fail "chunk ${size:-$vars}: not the chunk size asked for"
import json, sys
s, case = json.load(open(sys.argv[1])), sys.argv[2]
want = {"6M": 6, "10M": 10, "14M": 14, "LOCAL_WORLD_SIZE=3": 6, "LOCAL_WORLD_SIZE=5": 10}[case] << 20
print(f"  chunk {case}: chunk_size {s['chunk_size'] >> 20} MiB, gpu_budget {s['gpu_budget'] >> 20} MiB, "
      f"peak gpu {s['peak_gpu_bytes'] >> 20} MiB, peak host {s['peak_host_bytes'] >> 20} MiB")
assert s["chunk_size"] == want and 0 < s["gpu_budget"] <= 24 << 20
assert 0 < s["peak_gpu_bytes"] <= s["gpu_budget"] and s["peak_host_bytes"] > 0
PY
  rm -f "$tmp/s.json"
done

# A sanitizer build's library loads only into programs built with the sanitizers: the
# checks that run plain programs (sh, true) under it run in the plain build.
sanitized=
nm -D "$lib/libpsshim.so" | grep __asan_init >/dev/null && sanitized=1

# LD_PRELOAD gains the installed library after what it held; a script runs by exec, named
# with or without its folder.
if [ -n "$sanitized" ]; then
  echo "a script's environment: skipped under the sanitizers"
else
  mkdir "$tmp/work"
  printf '#!/bin/sh\nprintf "%%s|%%s|%%s" "$PSSHIM_GPU_BUDGET" "$LD_PRELOAD" "$*"\n' >"$tmp/work/job.sh"
  chmod +x "$tmp/work/job.sh"
  want="12G|libm.so.6:$(readlink -f "$lib/libpsshim.so")|a b"
  for job in job.sh ./job.sh "$tmp/work/job.sh"; do
    got=$(cd "$tmp/work" && LD_PRELOAD=libm.so.6 "$bin/psshim" --budget=12G -- "$job" a b 2>/dev/null) ||
      fail "psshim -- $job: exit $?"
    [ "$got" = "$want" ] || fail "psshim -- $job: got '$got', expected '$want'"
  done
  echo "a script's environment: $want"
fi

"$bin/psshim" --help >"$tmp/help" || fail "--help: exit $?"
for option in --budget --host-budget --chunk-size --policy --trace --stats --log; do
  grep -q -- "^ *$option " "$tmp/help" || fail "--help does not list $option"
done

# Each: exit status, the start of the one line expected on stderr, variables set, the
# launcher's arguments. The launcher checks values by loading the library into true, so
# not in the sanitizer build.
bad_cases=(
  "2|psshim: --frobnicate: unknown option||--frobnicate -- $prog 1 1 1"
  "2|psshim: --budget: needs a value||--budget"
  "2|psshim: no program to run||--budget 24M --"
  "2|psshim: no program to run||--budget 24M"
  "127|psshim: no-such-program-here: not found||-- no-such-program-here"
  "126|psshim: $tmp/help: not an executable file||-- $tmp/help"
)
if [ -n "$sanitized" ]; then
  # There the library checks them as the program starts, and the launcher lets its line through.
  bad_cases+=("2|psshim: PSSHIM_GPU_BUDGET=lots is not valid||--budget lots -- $prog 1 1 1"
    "2|psshim: PSSHIM_TRACE=$tmp/none/x.trace is not valid: $tmp/none: no such directory||--trace $tmp/none/x.trace -- $prog 1 1 1")
else
  bad_cases+=(
    "2|psshim: --budget: lots is not valid: PSSHIM_GPU_BUDGET accepts||--budget lots -- $prog 1 1 1"
    "2|psshim: --chunk-size: 3M is not valid: PSSHIM_CHUNK_SIZE accepts||--budget 24M --chunk-size=3M -- $prog 1 1 1"
    "2|psshim: --policy: fast is not valid||--policy fast --log loud -- $prog 1 1 1"
    "2|psshim: PSSHIM_SAMPLE_MS=0 is not valid|PSSHIM_SAMPLE_MS=0|--budget 24M -- $prog 1 1 1"
    "2|psshim: --budget: 0 is not valid: zero is not allowed; PSSHIM_GPU_BUDGET accepts||--budget 0 -- $prog 1 1 1"
    "2|psshim: --host-budget: 150% is not valid: a percentage is at most 100%;||--host-budget 150% -- $prog 1 1 1"
    "2|psshim: --trace: $tmp/none/x.trace is not valid: $tmp/none: no such directory;||--trace $tmp/none/x.trace -- $prog 1 1 1"
    "2|psshim: --stats: $tmp is not valid: it is a directory;||--stats $tmp -- $prog 1 1 1"
  )
fi
for case in "${bad_cases[@]}"; do
  IFS='|' read -r status start vars args <<<"$case"
  env $vars "$bin/psshim" $args >"$tmp/out" 2>"$tmp/err"
  got=$?
  echo "$vars psshim $args -> exit $got: $(cat "$tmp/err")"
  [ "$got" = "$status" ] || fail "psshim $args: exit $got, expected $status"
  [ "$(wc -l <"$tmp/err")" = 1 ] || fail "psshim $args: expected one line on stderr"
  [[ $(cat "$tmp/err") == "$start"* ]] || fail "psshim $args: expected a line starting '$start'"
  [ ! -s "$tmp/out" ] || fail "psshim $args: the program ran"
done
