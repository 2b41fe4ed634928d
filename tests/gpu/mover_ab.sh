#!/usr/bin/env bash
# One device call: this build against an earlier one, side by side on the 2.68B GPT (after
# `PACK_BASE=<commit> tests/gpu/pack.sh` here; device: bash tests/gpu/mover_ab.sh, carrying
# .gpu).
# One native run, then psshim auto (.gpu/libpsshim.so) and the earlier build
# (.gpu/libpsshim-base.so) at MOVER_AB_RATIOS (default 1.25,3), in MOVER_AB_METHODS' order
# (default psshim-auto,psshim-auto-base). Results in $OUT:
# mover_ab.json and .png, mover_ab.log, and the runs' psshim statistics in
# mover_ab_runs.tar.gz; the table printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
G=$PWD/.gpu
OUT=${OUT:-/tmp/psshim-mover-ab}
W=/tmp/mover-ab
rm -rf "$W" && mkdir -p "$OUT" "$W" # a second call in one device run must not pack the first one's runs
export LD_LIBRARY_PATH=$G${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
python3 bench/paging_sweep.py --psshim-lib "$G/libpsshim.so" --psshim-lib-base "$G/libpsshim-base.so" \
  --preset gpt2.7b --ratios "${MOVER_AB_RATIOS:-1.25,3}" --methods "${MOVER_AB_METHODS:-psshim-auto,psshim-auto-base}" \
  --steps "${MOVER_AB_STEPS:-10}" --warmup "${MOVER_AB_WARMUP:-7}" --timeout "${MOVER_AB_TIMEOUT:-170}" \
  --max-total-s "${MOVER_AB_MAX_S:-520}" --out "$W/mover_ab.json" >"$OUT/mover_ab.log" 2>&1
cp "$W/mover_ab.json" "$W/mover_ab.png" "$OUT/" 2>/dev/null
tar czf "$OUT/mover_ab_runs.tar.gz" -C "$W" mover_ab_runs 2>/dev/null
sed -n "/^ratio  budget/,\$p" "$OUT/mover_ab.log" | grep -v "^\s*$"
python3 - "$W/mover_ab_runs" <<'PY'
import glob, json, os, sys
keys = ("move_ns", "remap_ns", "migrations_to_gpu", "migrations_to_host", "bytes_h2d", "bytes_d2h",
        "touches_host", "period", "plan_builds", "owner_fetches", "owner_missed", "owner_demand_fetches", "gate_wait_ns",
        "gate_timeouts", "owner_wait_ns", "plan_bytes_in", "plan_laps", "plan_moved_in", "late_waits", "late_wait_ns",
        "launch_ns", "lock_wait_ns", "relock_ns", "steady_iterations", "steady_wall_ns", "steady_pager_pct",
        "steady_launch_ns", "steady_remap_ns", "steady_bytes_h2d", "steady_bytes_d2h", "steady_late_waits",
        "steady_move_ns", "steady_frame_make_ns", "steady_touches_host", "steady_touches_gpu", "steady_gate_wait_ns",
        "steady_owner_wait_ns", "steady_owner_demand_fetches", "reclaims", "reclaim_chunks", "reclaim_ns",
        "steady_reclaims", "steady_reclaim_ns", "gpu_budget", "room_page_outs", "room_ns", "steady_room_ns",
        "room_wait_ns", "steady_room_wait_ns")
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.psshim.json"))):
    s = json.load(open(f))
    print(os.path.basename(f), " ".join(f"{k}={s.get(k, '-')}" for k in keys))
PY
true
