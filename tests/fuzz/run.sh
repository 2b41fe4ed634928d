#!/usr/bin/env bash
# One bounded, reproducible fuzz run: FUZZER CORPUS_DIR [SECONDS]. New inputs go to a
# scratch folder (the committed corpus is only read); a crash leaves its input there and
# the run fails, printing the input's path. FUZZ_SECONDS overrides the time.
set -euo pipefail
fuzzer=$1 corpus=$2 seconds=${3:-${FUZZ_SECONDS:-20}}
work=$(mktemp -d "${TMPDIR:-/tmp}/psshim-fuzz.XXXXXX")
trap 'rm -rf "$work/new"' EXIT
mkdir -p "$work/new"
if ! "$fuzzer" -seed=1 -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$work/" \
  "$work/new" "$corpus" 2>"$work/log"; then
  grep -m1 -A12 -E 'ERROR: |runtime error|==[0-9]+== ' "$work/log" || tail -20 "$work/log"
  grep -E '^SUMMARY|^MS:' "$work/log" || true
  echo "fuzz: $(basename "$fuzzer") found a failing input: $(ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* 2>/dev/null | head -1)"
  exit 1
fi
grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units)' "$work/log" | tail -2
rm -rf "$work"
