#!/usr/bin/env bash
# What a bad setting or a run with nothing to page tells the user: each bad value stops the
# process before the program runs, exit 2, with one line naming the variable and why; a
# path is checked without leaving a file behind; the training loop's own line comes before
# psshim's statistics in a pipe; psshim-report on a run where nothing migrated says so.
# Usage: test_messages.sh LIBPSSHIM TRAIN_SIM PSSHIM_REPORT LAUNCHER (the fake driver and
# FAKE_CUPTI from the environment)
set -uo pipefail
lib=$1 prog=$2 report=$3 launcher=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
touch "$tmp/file"

# Each: the setting, then the line's start after "psshim: SETTING is not valid: ".
bad_cases=(
  "PSSHIM_TRACE=$tmp/none/x.trace|$tmp/none: no such directory; PSSHIM_TRACE accepts"
  "PSSHIM_STATS=$tmp/none/s.json|$tmp/none: no such directory; PSSHIM_STATS accepts"
  "PSSHIM_TRACE=$tmp|it is a directory;"
  "PSSHIM_STATS=$tmp/file/s.json|$tmp/file is not a directory;"
  "PSSHIM_GPU_BUDGET=0|zero is not allowed;"
  "PSSHIM_HOST_BUDGET=0%|zero is not allowed;"
  "PSSHIM_HOST_BUDGET=200%|a percentage is at most 100%;"
  "PSSHIM_GPU_BUDGET=150%|a percentage is at most 100%;"
  "PSSHIM_GPU_BUDGET=banana|PSSHIM_GPU_BUDGET accepts"
)
# Root may write anywhere, whatever the mode says.
if [ "$(id -u)" != 0 ]; then
  mkdir "$tmp/ro" && chmod 500 "$tmp/ro"
  bad_cases+=("PSSHIM_STATS=$tmp/ro/s.json|no file can be made in $tmp/ro (")
fi
for case in "${bad_cases[@]}"; do
  IFS='|' read -r setting why <<<"$case"
  env "$setting" LD_PRELOAD="$lib" "$prog" 1 1 1 >"$tmp/out" 2>"$tmp/err"
  status=$?
  echo "$setting -> exit $status: $(cat "$tmp/err")"
  [ $status = 2 ] || fail "$setting: exit $status, expected 2"
  [ "$(wc -l <"$tmp/err")" = 1 ] || fail "$setting: expected one line on stderr"
  [[ $(cat "$tmp/err") == "psshim: $setting is not valid: $why"* ]] || fail "$setting: expected the reason '$why'"
  [ ! -s "$tmp/out" ] || fail "$setting: the program ran"
done

# A PSSHIM_* name the library does not know is said at the default log level, with the
# name it may stand for, and the program runs on.
PSSHIM_BUDGET=24M PSSHIM_POLCY=static LD_PRELOAD="$lib" "$prog" 1 1 1 >"$tmp/out" 2>"$tmp/err" ||
  fail "unknown names: exit $?: $(cat "$tmp/err")"
cat "$tmp/err"
[ "$(wc -l <"$tmp/err")" = 2 ] || fail "unknown names: expected two lines"
grep -qx "psshim: PSSHIM_BUDGET is not a psshim setting, so it is ignored (did you mean PSSHIM_GPU_BUDGET?);.*" \
  "$tmp/err" || fail "PSSHIM_BUDGET not said"
grep -q "^psshim: PSSHIM_POLCY is not a psshim setting.*PSSHIM_POLICY?" "$tmp/err" || fail "PSSHIM_POLCY not said"
[ -s "$tmp/out" ] || fail "unknown names: the program did not run"

# A budget the device cannot hold, or one that holds no chunk, is said when the device is
# set up, naming the launcher's option and the sizes in bytes' units.
"$launcher" --budget 2T -- "$prog" 1 1 1 >"$tmp/out" 2>"$tmp/err"
cat "$tmp/err"
grep -qx "psshim: PSSHIM_GPU_BUDGET=2T (psshim --budget) is above this device's memory (1.0 GiB): set a smaller value; allocations on device 0 fail" \
  "$tmp/err" || fail "a budget above the device: not said so"
"$launcher" --budget 24M --chunk-size 32M -- "$prog" 1 1 1 >"$tmp/out" 2>"$tmp/err" || fail "budget below a chunk: exit $?"
cat "$tmp/err"
# and at exit, since a budget was set and kernels read host memory, why nothing was paged
[ "$(wc -l <"$tmp/err")" = 2 ] &&
  grep -q "^psshim: PSSHIM_GPU_BUDGET=24M (psshim --budget): 24.0 MiB on device 0 holds no chunk of 32.0 MiB (PSSHIM_CHUNK_SIZE=32M): every chunk lives in host frames" \
    "$tmp/err" || fail "a budget below a chunk: not said so"
grep -q "^psshim: nothing was paged: no training iteration was found in its [0-9]* launches (paging follows one); [0-9]* of [0-9]* chunk touches read host memory in place$" \
  "$tmp/err" || fail "nothing paged under a budget: not said why"

# CUPTI or the driver missing is said at the default log level: under auto nothing moves
# without launches observed; a static run, which observes nothing, says nothing.
PSSHIM_CUPTI=/nonexistent/libcupti.so "$launcher" --budget 24M -- "$prog" 1 1 1 >"$tmp/out" 2>"$tmp/err" ||
  fail "CUPTI missing: exit $?"
cat "$tmp/err"
[ "$(wc -l <"$tmp/err")" = 1 ] &&
  grep -q "^psshim: PSSHIM_CUPTI=/nonexistent/libcupti.so does not load (.*): kernel launches are not observed, so under PSSHIM_POLICY=auto nothing moves" \
    "$tmp/err" || fail "CUPTI missing under auto: not said so"
PSSHIM_CUPTI=/nonexistent/libcupti.so "$launcher" --policy static --budget 24M -- "$prog" 1 1 1 >"$tmp/out" 2>"$tmp/err" &&
  [ ! -s "$tmp/err" ] || fail "CUPTI missing under static: $(cat "$tmp/err")"
PSSHIM_LIBCUDA=/nonexistent/libcuda.so "$launcher" --budget 24M -- "$prog" 1 1 1 >"$tmp/out" 2>"$tmp/err"
cat "$tmp/err"
grep -q "^psshim: cannot load the CUDA driver /nonexistent/libcuda.so (.*): psshim passes every call through" "$tmp/err" ||
  fail "the driver missing: not said so"

# An option's value left out is not taken for a file named "--"; trace and statistics
# cannot share a file; a write that fails (a full disk) is said.
prog_abs=$(readlink -f "$prog") # the runs below start in $tmp
(cd "$tmp" && "$launcher" --stats -- "$prog_abs" 1 1 1) >"$tmp/out" 2>"$tmp/err"
status=$?
cat "$tmp/err"
[ $status = 2 ] && [ ! -e "$tmp/--" ] && [ ! -s "$tmp/out" ] &&
  grep -qx "psshim: --stats: needs a value, not the option-like '--' (psshim --help)" "$tmp/err" ||
  fail "--stats --: exit $status"
(cd "$tmp" && "$launcher" --trace run.bin --stats ./run.bin -- "$prog_abs" 1 1 1) >"$tmp/out" 2>"$tmp/err"
status=$?
cat "$tmp/err"
# (The launcher names its option; under the sanitizers the library's own line names the variable.)
[ $status = 2 ] && [ ! -s "$tmp/out" ] &&
  grep -Eq "^psshim: (--stats: |PSSHIM_STATS=)./run.bin is not valid: it names PSSHIM_TRACE's file too; PSSHIM_STATS accepts" \
    "$tmp/err" || fail "trace and statistics to one file: exit $status"
PSSHIM_CUPTI="$FAKE_CUPTI" "$launcher" --budget 24M --stats /dev/full -- "$prog" 1 1 1 >"$tmp/out" 2>"$tmp/err" ||
  fail "statistics to /dev/full: exit $?"
cat "$tmp/err"
grep -qx "psshim: PSSHIM_STATS=/dev/full: writing the statistics failed: No space left on device" "$tmp/err" ||
  fail "statistics to /dev/full: not said"
PSSHIM_CUPTI="$FAKE_CUPTI" "$launcher" --budget 24M --trace /dev/full -- "$prog" 1 1 1 >"$tmp/out" 2>"$tmp/err" ||
  fail "a trace to /dev/full: exit $?"
cat "$tmp/err"
grep -q "^psshim: trace write failed, tracing stops: /dev/full: No space left on device" "$tmp/err" ||
  fail "a trace to /dev/full: not said"

# The check makes no file: a process stopped by another bad value leaves none behind.
env PSSHIM_TRACE="$tmp/t.trace" PSSHIM_STATS="$tmp/s.json" PSSHIM_POLICY=fast LD_PRELOAD="$lib" "$prog" 1 1 1 \
  >/dev/null 2>&1
[ ! -e "$tmp/t.trace" ] && [ ! -e "$tmp/s.json" ] || fail "a stopped process left a trace or statistics file"
echo "a stopped process leaves no file: ok"

# The issue's own case, in a plain program (a sanitizer build's library loads only into
# programs built with the sanitizers).
if ! nm -D "$lib" | grep __asan_init >/dev/null; then
  for var in PSSHIM_TRACE PSSHIM_STATS; do
    env "$var=/nonexistent/x" LD_PRELOAD="$lib" /bin/true 2>"$tmp/err"
    status=$?
    [ $status != 0 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q "^psshim: $var=/nonexistent/x is not valid: " "$tmp/err" ||
      fail "$var=/nonexistent/x /bin/true: exit $status, $(cat "$tmp/err")"
  done
  echo "/bin/true with a trace or stats path in no directory: exit 2 and one line"
fi

# A good run traced in static placement, everything on the GPU: 48 chunks and no migration.
# The program's line comes first into the pipe, then psshim's statistics at exit.
out=$(PSSHIM_CUPTI="$FAKE_CUPTI" "$launcher" --policy static --budget 256M --host-budget 256M --chunk-size 2M \
  --trace "$tmp/run.trace" --stats 1 -- "$prog" 6 8 4 2>&1) || fail "traced run: $out"
echo "$out"
[[ $(head -n 1 <<<"$out") == "train_sim: "* ]] || fail "the program's line is not first in the pipe"
[ "$(grep -c '^psshim: ' <<<"$out")" -ge 4 ] || fail "no statistics on stderr"
"$report" "$tmp/run.trace" >"$tmp/report.txt" || fail "psshim-report on the run: exit $?"
sed -n '/^CHUNKS/,/^$/p' "$tmp/report.txt" | head -n 4
grep -q '^  48 chunks; .* 0 page-ins, 0 page-outs$' "$tmp/report.txt" || fail "expected 48 chunks and no migration"
grep -qx '  the first 40 (none migrated):' "$tmp/report.txt" || fail "the chunk table does not say none migrated"
! grep -q 'the most migrations' "$tmp/report.txt" || fail "the chunk table speaks of migrations none made"
# Chunk-size advice counts what kernels read in place: at 24 MiB, one 16M chunk fits the
# GPU and every launch reads the rest in place; that copies least, and is not advised.
"$report" "$tmp/run.trace" --chunk-size=2M,4M,8M,16M --budget 24M >"$tmp/advice.txt" || fail "advice: exit $?"
sed -n '/^CHUNK SIZE ADVICE/,$p' "$tmp/advice.txt"
grep -Eq '^ +16 MiB +6 +96 MiB( +[0-9.]+){4} +[1-9][0-9.]+$' "$tmp/advice.txt" || fail "advice: 16M's in-place bytes not shown"
grep -q '^  least across PCIe: PSSHIM_CHUNK_SIZE=4M ' "$tmp/advice.txt" || fail "advice: not 4M"

# The trace records the run's settings, and the report names them: the policy, the
# variables as given, and the chunk size and budgets in effect.
PSSHIM_CUPTI="$FAKE_CUPTI" "$launcher" --policy static --budget 24M --host-budget 256M --chunk-size 6M \
  --trace "$tmp/set.trace" -- "$prog" 2 8 4 >/dev/null 2>"$tmp/err" || fail "settings run: $(cat "$tmp/err")"
"$report" "$tmp/set.trace" --html "$tmp/set.html" >"$tmp/set.txt" || fail "settings report: exit $?"
sed -n '/^RUN/,/^$/p' "$tmp/set.txt"
grep -q '^  chunks      6 MiB each; GPU budget 24 MiB, host budget 252 MiB$' "$tmp/set.txt" &&
  grep -q '^  settings    policy static; given: .*PSSHIM_GPU_BUDGET=24M PSSHIM_HOST_BUDGET=256M PSSHIM_CHUNK_SIZE=6M PSSHIM_POLICY=static' \
    "$tmp/set.txt" || fail "the report does not name the run's settings"
grep -q "<p class='meta'>Settings: policy static; given: .*PSSHIM_CHUNK_SIZE=6M" "$tmp/set.html" ||
  fail "the HTML does not name the run's settings"

# A paging run on the test driver: its HTML page opens with what to change, and its GPU
# memory chart draws nothing above the budget (the test driver has no memory beside chunks).
PSSHIM_CUPTI="$FAKE_CUPTI" "$launcher" --budget 24M --host-budget 256M --chunk-size 2M --trace "$tmp/page.trace" \
  -- "$prog" 12 8 4 >/dev/null 2>"$tmp/err" || fail "paging run: $(cat "$tmp/err")"
"$report" "$tmp/page.trace" --html "$tmp/page.html" >"$tmp/page.txt" || fail "paging report: exit $?"
sed -n '/^WHAT TO CHANGE/,/^$/p' "$tmp/page.txt"
grep -q '^  Try --budget ' "$tmp/page.txt" || fail "paging run: no budget to try"
[ "$(grep -o '<h2>[^<]*</h2>' "$tmp/page.html" | head -n 1)" = "<h2>What to change</h2>" ] ||
  fail "paging run: the page does not open with what to change"
python3 - "$tmp/page.html" <<'PY' || fail "paging run: memory drawn above the budget"
import re, sys
svg = open(sys.argv[1]).read().split("<h2>GPU memory over the run</h2>", 1)[1].split("</svg>", 1)[0]
budget = float(re.search(r"<line[^>]*y1='([0-9.]+)'[^>]*class='budget'", svg).group(1))
top = min(min(float(v) for v in re.findall(r"V([0-9.]+)", d)) for d in re.findall(r"<path fill='[^']*' d='([^']*)'", svg))
sys.exit(top < budget - 0.05)
PY

# psshim-report's own outputs: a write that fails exits 3, with a line.
"$report" "$tmp/run.trace" >/dev/full 2>"$tmp/err"
status=$?
cat "$tmp/err"
[ $status = 3 ] && grep -q "^psshim-report: writing the report to standard output failed: No space left on device" \
  "$tmp/err" || fail "psshim-report >/dev/full: exit $status"
"$report" "$tmp/run.trace" --html /dev/full >/dev/null 2>"$tmp/err"
status=$?
[ $status = 3 ] && grep -qx "psshim-report: /dev/full: No space left on device" "$tmp/err" ||
  fail "psshim-report --html /dev/full: exit $status"
echo "PASS"
