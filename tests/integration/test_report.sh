#!/usr/bin/env bash
# psshim-report end to end on a synthetic trace: the DATA MOVE numbers the generator
# wrote, valid Perfetto JSON, an HTML page with SVG, chunk-size advice, exit codes.
# usage: test_report.sh SYNTH_PROGRAM PSSHIM_REPORT
set -u
synth=$1 report=$2
dir=$(mktemp -d "${TMPDIR:-/tmp}/psshim-report-test.XXXXXX")
trap 'rm -rf "$dir"' EXIT
failures=0 checks=0
check() { # check NAME COMMAND...: one line per check, a count at the end
  checks=$((checks + 1))
  if "${@:2}"; then echo "ok   $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}

"$synth" "$dir/run.trace" > "$dir/expect" || { echo "FAIL synthetic trace not written"; exit 1; }
"$report" "$dir/run.trace" --perfetto "$dir/run.json" --html "$dir/run.html" --chunk-size > "$dir/out.txt" 2> "$dir/err.txt"
rc=$?
check "report exits 0" test "$rc" -eq 0
check "nothing on stderr" test ! -s "$dir/err.txt"

# Every transfer kind the generator wrote appears in DATA MOVE with its MB and count.
while IFS='|' read -r label mb times; do
  label=${label#expect }
  check "DATA MOVE: $label $mb MB $times times" \
    awk -v l="  $label" -v mb="$mb" -v n="$times" \
      'index($0, l) == 1 { rest = substr($0, length(l) + 1); split(rest, f, " ");
                           if (f[1] == mb && f[2] == n) found = 1 } END { exit !found }' "$dir/out.txt"
done < <(grep '^expect ' "$dir/expect")
# site_line PEAK LINE: the site whose peak live bytes are PEAK has exactly LINE (its first
# line of that kind: "where: ..." or "in place: ...").
site_line() {
  awk -v p="  peak live $1," -v w="      $2" 'index($0, p) && /^  #[0-9]+  / { site = 1; next }
    site && index(w, substr($0, 1, index($0, ":"))) == 1 { found = $0 == w; site = 0 } END { exit !found }' "$dir/out.txt"
}
# At the last peak of live bytes (a step's start), where paging had left the parameters.
where=$(sed -n 's/^where //p' "$dir/expect")
check "where: the parameters' site at the peak ($where)" site_line "1.3 GiB" "where: $where"
inplace=$(sed -n 's/^in-place //p' "$dir/expect")
check "in place: the state read in its host frame ($inplace)" site_line "16 MiB" "in place: $inplace"
check "in place: the parameters, always paged in first, never" site_line "1.3 GiB" "in place: 0 launches, 0 B"
check "where: the peak named" grep -Eq "^  where: each site's bytes at the last peak of all live bytes \(1\.3 GiB at [0-9.]+ s\)$" "$dir/out.txt"
# 8 MB in 0.2 ms, six times: 40000 MB/s.
check "DATA MOVE: app copy h2d rate" grep -Eq '^  app copy h2d +48\.000 +6 +1\.200 +40000\.0$' "$dir/out.txt"
check "phases: 2 warm-up and 3 steady iterations of 120 launches" \
  bash -c "grep -Eq '^  warm-up +2 ' '$dir/out.txt' && grep -Eq '^  steady +3 ( +[0-9.]+){4} +120 ' '$dir/out.txt'"
# The steady row's MB per iteration in, out and in place: the means of the synthetic run's
# steady laps (given in GB to 10 MB).
steady_bytes() {
  awk 'FNR == NR && $1 == "lap" {n++; i += $6; p += $7; o += $8; next}
       FNR != NR && $1 == "steady" {d = 0; split(i * 1000 / n " " o * 1000 / n " " p * 1000 / n, want)
         for (k = 1; k <= 3; k++) { x = $(7 + k) - want[k]; if (x > 5 || x < -5) d = 1 }; found = 1}
       END {exit !(found && !d)}' "$dir/expect" "$dir/out.txt"
}
check "phases: steady MB in, out and in place per iteration" steady_bytes
# The pager's columns: the launching threads' ms, the moves' (half of it here) and late
# waits per steady iteration, from the marks' totals.
steady_pager() {
  awk 'FNR == NR && $1 == "lap" {n++; ms += $9; late += $10; next}
       FNR != NR && $1 == "steady" {found = 1; ok = ($11 == sprintf("%.2f", ms / n) && $12 == sprintf("%.2f", ms / n / 2) &&
         $13 == sprintf("%.1f", late / n))}
       END {exit !(found && ok)}' "$dir/expect" "$dir/out.txt"
}
check "phases: the pager's host time and late waits per steady iteration" steady_pager
check "phases: the early short period named as warm-up" \
  grep -Eq '^  warm-up marks also came from periods .*: 7 launches$' "$dir/out.txt"
check "phases: the evaluation loop after training counted apart" \
  bash -c "grep -Eq '^  later +2 ' '$dir/out.txt' && grep -Eq '^  later marks came from .*: 4 launches$' '$dir/out.txt'"
check "chunk-size replays the steady period's last iteration" \
  grep -q 'replaying iteration 4 (the last complete one of the steady period)' "$dir/out.txt"
# LEAST TRAFFIC: the run's budget in the report itself, the others with --least.
least_line() { # least_line FILE MB: the one budget's bound is MB
  [ "$(grep -c '^    GPU budget ' "$1")" = 1 ] && grep -Eq "^    GPU budget .* $2 MB\$" "$1"
}
while read -r _ mib mb; do
  file=$dir/out.txt
  if [ "$mib" != "$(sed -n 's/^least-run //p' "$dir/expect")" ]; then
    file=$dir/least$mib.txt
    "$report" "$dir/run.trace" --least="${mib}M" > "$file"
  fi
  check "least traffic at $mib MiB: $mb MB" least_line "$file" "$mb"
done < <(grep '^least ' "$dir/expect")
paged=$(sed -n 's/^least-paged //p' "$dir/expect")
check "least traffic: what the run paged in then ($paged MB)" grep -q "^  this run paged in $paged MB then;" "$dir/out.txt"
check "least traffic: the window" grep -q '^  iteration 4 (the last complete one of the steady period): 120 launches read 1426\.1 MB' "$dir/out.txt"
"$report" "$dir/run.trace" --least=lots > /dev/null 2>&1
check "bad --least exits 1" test $? -eq 1
# At the default lag (0, as auto's owner plans: chunks movable once their use has run) the
# plan reads nothing in place; at a lag of 256 launches, beyond the 120-launch iteration,
# nothing in it can move.
check "plan: no read in place at the default lag" grep -Eq '^  plan .* [1-9][0-9]* moves; 0 moments read 0\.0 MB in place$' "$dir/out.txt"
check "plan: the default lag named" grep -q "a chunk movable 0 moments after a use, as auto's owner plans;" "$dir/out.txt"
"$report" "$dir/run.trace" --lag 256 > "$dir/lag256.txt"
check "plan --lag 256: nothing moves" grep -Eq '^  plan .* 0 moves; [1-9][0-9]* moments read' "$dir/lag256.txt"
check "plan --lag 256: the lag named" grep -q 'a chunk movable 256 moments after a use (--lag);' "$dir/lag256.txt"
"$report" "$dir/run.trace" --lag=-3 > /dev/null 2>&1
check "bad --lag exits 1" test $? -eq 1
check "allocation site symbolized" grep -q 'synth_alloc_params+0x' "$dir/out.txt"
check "chunk table" grep -Eq '^ +23 +64\.0 ' "$dir/out.txt"
check "chunk-size ranking" grep -Eq '^  least across PCIe: PSSHIM_CHUNK_SIZE=[0-9]+[KMG]? ' "$dir/out.txt"
check "perfetto JSON is valid" python3 -m json.tool "$dir/run.json" /dev/null
check "perfetto has slices and counters" \
  bash -c "grep -q '\"ph\":\"X\"' '$dir/run.json' && grep -q '\"ph\":\"C\"' '$dir/run.json'"
check "html has inline svg" grep -q '<svg' "$dir/run.html"
check "html has no external resources" bash -c "! grep -Eqi '<script|src=|href=' '$dir/run.html'"
# The page's steady iterations: one table row each, as the generator counted them.
check "html: one row per steady iteration" test "$(grep -c '^<tr><td>[0-9]*</td><td>[0-9.]*</td>' "$dir/run.html")" = 3
while read -r _ it at secs launches in inplace out pager late; do
  check "html: iteration $it row" grep -qx "<tr><td>$it</td><td>$at</td><td>$secs</td><td>$launches</td><td>$in</td><td>$inplace</td><td>$out</td><td>$pager.00</td><td>$late</td></tr>" "$dir/run.html"
done < <(grep '^lap ' "$dir/expect")
least_gb=$(awk -v mib="$(sed -n 's/^least-run //p' "$dir/expect")" '$1 == "least" && $2 == mib { printf "%.1f", $3 / 1000 }' "$dir/expect")
check "html: the least-traffic line ($least_gb GB)" \
  bash -c "grep -q \"class='least'/>\" '$dir/run.html' && grep -q 'dashed: LEAST TRAFFIC, $least_gb GB at the 1.1 GiB budget' '$dir/run.html'"
# Budgets: the GPU's near the data is a line; the host's, 10x its data, is named instead.
check "html: the GPU budget drawn" grep -q "class='budget'/><text [^>]*>budget 1.1 GiB</text>" "$dir/run.html"
check "html: the host budget off the scale" grep -q '>budget 8 GiB: off the scale, far above</text>' "$dir/run.html"
# Iteration marks are short ticks above a chart, not lines across it.
check "html: iteration marks are ticks" \
  awk "/class='iter'/ { n++ } END { exit !n }" "$dir/run.html"
check "html: no mark crosses a chart" bash -c "! grep -o \"<line [^>]*class='iter'/>\" '$dir/run.html' |
  awk -F\"'\" '{ if (\$8 - \$6 > 6.01) bad = 1 } END { exit !bad }'"
# Sites start past the allocator's frame, demangled and without parameters.
check "html: a site from its first frame outside the allocators" \
  grep -q "<td class='chain'><code>synth_alloc_params</code>" "$dir/run.html"
check "html: a mangled site demangled" grep -q "<td class='chain'><code>synth::Adam::init_state</code>" "$dir/run.html"
check "html: no mangled name left" bash -c "! grep -q '_ZN' '$dir/run.html'"
check "text: the allocator's frame skipped" grep -q '^      (1 frame of the allocators above)$' "$dir/out.txt"
check "text: a mangled site demangled" grep -q '^      synth::Adam::init_state()+0x' "$dir/out.txt"

# PAGE-OUTS: the steady phase's page-outs all come back before a launch names them, or stay.
read -r outs back still < <(sed -n 's/^pageouts //p' "$dir/expect")
section() { sed -n '/^PAGE-OUTS/,/^$/p' "$1"; }
check "page-outs: $outs, named 0 times while out" \
  grep -q "^  $outs chunks paged out in 3 iterations (.*); launches named them 0 times while in host frames$" <(section "$dir/out.txt")
check "page-outs: $back back untouched" \
  grep -Eq "^  back on the GPU before any launch named them +$back " <(section "$dir/out.txt")
if [ "$still" -gt 0 ]; then
  check "page-outs: $still still out" grep -Eq "^  still out at the end +$still " <(section "$dir/out.txt")
else
  check "page-outs: none still out" bash -c "! grep -q '^  still out' <(sed -n '/^PAGE-OUTS/,/^\$/p' '$dir/out.txt')"
fi
# Every ending, one chunk each, on a trace made for it.
"$synth" "$dir/fates.trace" fates > "$dir/fates.expect" && "$report" "$dir/fates.trace" > "$dir/fates.txt" 2>&1
check "fates: trace written and reported" test $? -eq 0
read -r nouts ntouch < <(sed -n 's/^fates //p' "$dir/fates.expect")
check "fates: $nouts page-outs, named $ntouch times while out" \
  grep -q "^  $nouts chunks paged out in 2 iterations (.*); launches named them $ntouch times while in host frames$" \
  <(section "$dir/fates.txt")
while IFS='|' read -r name count; do
  name=${name#fate }
  check "fates: $name $count" grep -q "^  $(printf '%-48s %8s' "$name" "$count")  " <(section "$dir/fates.txt")
done < <(grep '^fate ' "$dir/fates.expect")
check "fates: nothing else" test "$(section "$dir/fates.txt" | grep -c '%$')" -eq "$(grep -c '^fate ' "$dir/fates.expect")"
# MOVES: the steady moves' host time, split by in-place launches just before them.
moves() { sed -n '/^MOVES/,/^$/p' "$1"; }
while IFS='|' read -r direction inplace n median p90 mean; do
  direction=${direction#moves }
  check "moves: $direction, in place $inplace: $n, $median/$p90/$mean us" \
    grep -q "^  $(printf '%-9s  %-8s  %8s  %9s  %9s  %9s' "$direction" "$inplace" "$n" "$median" "$p90" "$mean")$" \
    <(moves "$dir/fates.txt")
done < <(grep '^moves ' "$dir/fates.expect")
check "moves: nothing else" test "$(moves "$dir/fates.txt" | grep -cE '^  (in|out) \(')" -eq "$(grep -c '^moves ' "$dir/fates.expect")"

# WHAT TO CHANGE opens the summary after RUN and the HTML page: the bound, what bounded the
# iteration, and the settings to try (64 MiB chunks replay worse than 4 MiB ones here; the
# synthetic device has memory free).
check "what to change: the section after RUN" \
  awk '/^[A-Z][A-Z ]+$/ { n++; if (n == 1) run = $0 == "RUN"; if (n == 2) what = $0 == "WHAT TO CHANGE" } END { exit !(run && what) }' \
  "$dir/out.txt"
what() { sed -n '/^WHAT TO CHANGE/,/^$/p' "$dir/out.txt"; }
check "what to change: the bound" grep -Eq '^  A steady iteration took [0-9.]+ ms\. The least any placement must bring onto the GPU in one, at this budget, is [0-9.]+ MiB: [0-9.]+ ms at 55 GB/s\. The run took [0-9.]+x that\.$' <(what)
check "what to change: what bounded it" grep -q '^  What bounded it: ' <(what)
check "what to change: a chunk size, counting in-place reads" grep -Eq '^  Try --chunk-size 4 MiB \(PSSHIM_CHUNK_SIZE\): .* \([0-9.]+ [GM]iB copied, [0-9.]+ .?B read in place\) where 64 MiB chunks move ' <(what)
check "what to change: a budget" grep -Eq '^  Try --budget [0-9.]+ GiB \(PSSHIM_GPU_BUDGET; ' <(what)
check "what to change: the HTML opens with it" \
  bash -c "grep -o '<h2>[^<]*</h2>' '$dir/run.html' | head -n 1 | grep -qx '<h2>What to change</h2>'"

# One sample's time far ahead (2^63 - 1 ns) in an otherwise valid trace: every output
# made, nothing drawn outside its chart.
"$synth" "$dir/far.trace" far > /dev/null
"$report" "$dir/far.trace" --perfetto "$dir/far.json" --html "$dir/far.html" --chunk-size > /dev/null 2> "$dir/far.err"
rc=$?
check "a sample far ahead: exit 0 (got $rc)" test "$rc" -eq 0
# The GPU-memory chart stacks its classes as they were at one moment: chunks and non-model
# memory that always sum to the budget draw nothing above it.
"$synth" "$dir/stack.trace" stack && "$report" "$dir/stack.trace" --html "$dir/stack.html" > /dev/null
check "stack: exit 0" test $? -eq 0
stack_under_budget() {
  python3 - "$dir/stack.html" <<'PY'
import re, sys
svg = open(sys.argv[1]).read().split("<h2>GPU memory over the run</h2>", 1)[1].split("</svg>", 1)[0]
budget = float(re.search(r"<line[^>]*y1='([0-9.]+)'[^>]*class='budget'", svg).group(1))
top = min(min(float(v) for v in re.findall(r"V([0-9.]+)", d)) for d in re.findall(r"<path fill='[^']*' d='([^']*)'", svg))
print(f"  GPU memory chart: the budget's line at y {budget}, the stack's top at y {top}")
sys.exit(top < budget - 0.05)
PY
}
check "stack: no use drawn above the budget that was never in use" stack_under_budget

# A torn trace: what was readable is reported, exit 2, the problem on stderr.
size=$(stat -c %s "$dir/run.trace")
head -c $((size - 100)) "$dir/run.trace" > "$dir/torn.trace"
"$report" "$dir/torn.trace" > "$dir/torn.txt" 2> "$dir/torn.err"
rc=$?
check "torn trace exits 2" test "$rc" -eq 2
check "torn trace still reported" grep -q '^DATA MOVE' "$dir/torn.txt"
check "torn trace says where" grep -q 'truncated at byte' "$dir/torn.err"

printf 'not a trace at all\n' > "$dir/junk"
"$report" "$dir/junk" > /dev/null 2> "$dir/junk.err"
rc=$?
check "foreign file exits 2" test "$rc" -eq 2
check "foreign file named" grep -q 'not a psshim trace' "$dir/junk.err"
mkdir "$dir/a-folder"
"$report" "$dir/a-folder" > /dev/null 2> "$dir/folder.err"
rc=$?
check "a directory exits 2" test "$rc" -eq 2
check "a directory named as one" grep -qx "psshim-report: $dir/a-folder: is a directory, not a trace file" "$dir/folder.err"
"$report" > /dev/null 2>&1
check "no FILE exits 1" test $? -eq 1
# An unknown option: one line naming the program as the user knows it, not its build path.
"$report" "$dir/run.trace" --bogus > /dev/null 2> "$dir/bogus.err"
rc=$?
check "unknown option exits 1" test "$rc" -eq 1
check "unknown option in one line, without the path" \
  grep -qx 'psshim-report: --bogus: unknown option (psshim-report --help lists them)' "$dir/bogus.err"
check "unknown option: nothing more" test "$(wc -l < "$dir/bogus.err")" -eq 1
"$report" "$dir/run.trace" --chunk-size=3M,4M > /dev/null 2> "$dir/3m.err"
rc=$?
check "a chunk size the library refuses exits 1" test "$rc" -eq 1
check "a chunk size the library refuses, said" grep -q 'takes multiples of 2M, as PSSHIM_CHUNK_SIZE does' "$dir/3m.err"
# Chunk-size advice at a budget below some candidates: those are left out, never advised.
advice() { sed -n '/^CHUNK SIZE ADVICE/,/^$/p' "$1"; }
"$report" "$dir/run.trace" --chunk-size --budget 24M > "$dir/small.txt" 2>&1
check "advice at 24 MiB: 32M, 64M and 128M left out" \
  grep -qx '  not replayed, larger than the GPU budget: 32M, 64M, 128M' <(advice "$dir/small.txt")
check "advice at 24 MiB: a size that fits" grep -Eq '^  least across PCIe: PSSHIM_CHUNK_SIZE=(4|8|16)M ' <(advice "$dir/small.txt")
check "advice at 24 MiB: no row larger than the budget" bash -c "! grep -Eq '^ +(32|64|128) MiB ' <(sed -n '/^CHUNK SIZE ADVICE/,\$p' '$dir/small.txt')"
"$report" "$dir/run.trace" --chunk-size=64M --budget 24M > "$dir/none.txt" 2>&1
check "advice with no size within the budget: none advised" \
  bash -c "grep -q '^  no chunk size left to replay: give sizes up to 24 MiB' '$dir/none.txt' && ! grep -q 'least across' '$dir/none.txt'"
"$report" "$dir/run.trace" --chunk-size=12Q > /dev/null 2>&1
check "bad size exits 1" test $? -eq 1
"$report" --help | grep -q '^usage: psshim-report FILE'
check "--help" test $? -eq 0
"$report" --version | grep -q 'trace format version 1'
check "--version" test $? -eq 0

echo "$((checks - failures)) passed, $failures failed"
exit $((failures > 0))
