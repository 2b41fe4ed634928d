#!/usr/bin/env bash
# One device call (after tests/gpu/pack.sh here; device run: bash tests/gpu/pager_study.sh,
# carrying .gpu): bench/remap_stall.c (its argument: STUDY_REMAP, default cupti), then the
# 2.68B GPT under psshim at the runs named in STUDY_RUNS, each
# POLICY:RATIO:RUNAHEAD[:VARIANT[:RATE[:CHUNK]]] (VARIANT: .gpu/libpsshim-VARIANT.so, see
# pack.sh; RATE: PSSHIM_INPLACE_RATE, e.g. 4G; CHUNK: PSSHIM_CHUNK_SIZE, e.g. 4M). Budget =
# STUDY_PEAK / RATIO; STUDY_PEAK defaults to the native peak (41.23 GiB) given to the sweep
# in bench/results/paging_sweep_gpt2.7b_run14.json. Prints, per run, whether its losses
# equal that sweep's native ones bitwise, the median of the last 5 of 12 steps, the bytes NVML saw
# cross PCIe each way per step (gpt_train's "pcie": in-place reads too), the pager's
# per-step costs from PSSHIM_STATS, every step's time, and each step's plan time, moves,
# trusted period, host frames at its end and share of chunk touches served from host
# frames (gpt_train's record of psshim_stats_json); results in $OUT.
# STUDY_TRAIN_ARGS adds gpt_train arguments (--profile: where one more step's GPU time went).
# STUDY_TRACE=1: each run also writes PSSHIM_TRACE, gzipped into $OUT as NAME.trace.gz.
set -uo pipefail
cd "$(dirname "$0")/../.."
G=$PWD/.gpu
OUT=${OUT:-/tmp/psshim-study-out}
RUN=${STUDY_RUN:-study}
PEAK=${STUDY_PEAK:-44274838528}
W=/tmp/study-work
mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=$G${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
if [ -z "${STUDY_NO_REMAP:-}" ]; then
  tests/gpu/build_remap_stall.sh "$W/remap_stall" &&
    timeout 120 "$W/remap_stall" "${STUDY_REMAP:-cupti}" \
      >"$OUT/remap_stall_$RUN.txt" 2>&1
fi
for spec in ${STUDY_RUNS:-auto:1.25:256 auto:1.25:2048 auto:2:256 auto:2:2048 static:2:256}; do
  IFS=: read -r policy ratio runahead variant rate chunk <<<"$spec"
  name=${policy}_${ratio}_${runahead}${variant:+_$variant}${rate:+_rate$rate}${chunk:+_chunk$chunk}
  lib=$G/libpsshim${variant:+-$variant}.so
  budget=$(python3 -c "print(int($PEAK / $ratio))")
  start=$(date +%s)
  LD_PRELOAD=$lib PSSHIM_GPU_BUDGET=$budget PSSHIM_POLICY=$policy PSSHIM_RUNAHEAD=$runahead \
    PSSHIM_STATS=$W/$name.psshim.json timeout "${STUDY_TIMEOUT:-150}" \
    env ${rate:+PSSHIM_INPLACE_RATE=$rate} ${STUDY_TRACE:+PSSHIM_TRACE=$W/$name.trace} ${chunk:+PSSHIM_CHUNK_SIZE=$chunk} python3 bench/gpt_train.py --preset gpt2.7b \
    --steps 12 --warmup 7 --deterministic --json "$W/$name.json" ${STUDY_TRAIN_ARGS:-} >"$W/$name.log" 2>&1
  echo "$name: rc $? in $(($(date +%s) - start)) s" >>"$OUT/study_$RUN.txt"
  [ -n "${STUDY_TRACE:-}" ] && [ -f "$W/$name.trace" ] && gzip -c "$W/$name.trace" >"$OUT/$name.trace.gz"
done
python3 - "$W" "$RUN" >>"$OUT/study_$RUN.txt" <<'PY'
import glob, json, os, sys
w, run = sys.argv[1], sys.argv[2]
summary = {}
native = json.load(open("bench/results/paging_sweep_gpt2.7b_run14.json"))["native"]["loss_hex"]
print(f"{'run':18s} {'=native':7s} {'median':>7s} {'plan ms':>8s} {'move ms':>8s} {'wait ms':>8s} {'in':>5s} {'out':>5s} "
      f"{'host GiB':>8s} {'fill %':>6s} {'PCIe GB in/out':>14s}  step times (s)")
for path in sorted(glob.glob(os.path.join(w, "*.psshim.json"))):
    name = os.path.basename(path)[:-len(".psshim.json")]
    try:
        s, r = json.load(open(path)), json.load(open(os.path.join(w, name + ".json")))
    except (OSError, ValueError):
        print(f"{name:18s} no result")
        continue
    n = max(len(r["step_times_s"]), 1)
    per = lambda k: s.get(k, 0) / n / 1e6
    same = "yes" if r["loss_hex"] == native[:len(r["loss_hex"])] else "NO"
    p = r.get("pcie") or {}  # bytes NVML saw cross PCIe, medians after warm-up (gpt_train)
    pcie = f"{p['h2d_bytes_per_step'] / 1e9:.1f}/{p['d2h_bytes_per_step'] / 1e9:.1f}" if "h2d_bytes_per_step" in p else "-"
    if not r.get("finished", True):  # cut by STUDY_TIMEOUT: the steps it made
        name += " (cut)"
    print(f"{name:18s} {same:7s} {r['median_step_s']:7.3f} {per('plan_ns'):8.1f} {per('move_ns'):8.1f} "
          f"{per('runahead_wait_ns'):8.1f} {s['migrations_to_gpu']:5d} {s['migrations_to_host']:5d} "
          f"{s['peak_host_bytes'] / 2**30:8.2f} {s['chunk_fill_pct']:6.1f} {pcie:>14s}  " + " ".join(f"{t:.2f}" for t in r["step_times_s"]))
    if p.get("error"):
        print(f"{'':18s} PCIe counter: {p['error']}")
    per_step = [x.get("psshim") or {} for x in r.get("steps", [])]
    if any(per_step):
        for k in ("plan", "move", "scan", "poll", "frame_wait", "frame_make"):
            print(f"{'':18s} {k} ms by step: " + " ".join(f"{x.get(k + '_ns', 0) / 1e6:.0f}" for x in per_step))
        print(f"{'':18s} moves in/out by step: " +
              " ".join(f"{x.get('migrations_to_gpu', 0)}/{x.get('migrations_to_host', 0)}" for x in per_step))
        print(f"{'':18s} period by step: " + " ".join(str(x.get("period", 0)) for x in per_step))
        print(f"{'':18s} host frames / host touch % by step: " + " ".join(
            f"{x.get('host_frames', '-')}/{100 * x['touches_host'] / max(x['touches_host'] + x['touches_gpu'], 1):.0f}"
            if "touches_gpu" in x else "-" for x in per_step))
    prof = r.get("profile")
    if prof:  # gpt_train --profile (STUDY_TRAIN_ARGS): one more step, under torch.profiler
        print(f"{'':18s} profiled step: " + (prof["error"] if "error" in prof else
              f"{prof['wall_s']:.3f} s, GPU busy {prof['gpu_busy_share']:.0%}, " +
              ", ".join(f"{k} {v / 1e3:.0f} ms" for k, v in prof["gpu_us_by_kind"].items()) +
              "; top: " + ", ".join(f"{n[:40]} {t / 1e3:.0f} ms" for n, t in prof["top_gpu_us"][:8])))
    summary[name] = {"median_step_s": r["median_step_s"], "step_times_s": r["step_times_s"],
                     "loss_hex": r["loss_hex"], "psshim_stats": s, "profile": prof}
json.dump(summary, open(os.path.join(os.environ.get("OUT", w), f"study_{run}.json"), "w"), indent=1)
PY
echo "== remap_stall =="
cat "$OUT/remap_stall_$RUN.txt" 2>/dev/null
echo "== study =="
cat "$OUT/study_$RUN.txt"
true
