#!/usr/bin/env bash
# The model-scale benchmark (bench/model_scale.py): the largest GPT each method trains 10 steps
# on the lent H200 and its host, in device calls of at most 600 s each. Here, first:
#   tests/gpu/pack.sh && git describe --always --dirty > .gpu/commit
# then device calls carrying .gpu, in this order (timeout_s: the part's limit plus 60):
#   A  native, then FSDP2 CPU offload from L38h3712 (6.53B)      MODEL_SCALE_PART=A bash tests/gpu/model_scale.sh
#      (limit 340 s)
#   B  psshim at its defaults: first at A's largest rungs, then  MODEL_SCALE_PART=B bash tests/gpu/model_scale.sh
#      its search (limit 380 s); before it, copy A's returned model_scale_A.json into .gpu/
#   C  optional: DeepSpeed ZeRO-Offload from L38h3584 (6.09B)    MODEL_SCALE_PART=C bash tests/gpu/model_scale.sh
#      (limit 300 s, its install included): bench/deepspeed/fetch_wheels.sh here, carry
#      bench/deepspeed/wheels too, and copy A's and B's JSON into .gpu/
# Every .gpu/model_scale_<P>.json of another part is --prior to this one (its outcomes and the
# --refs sizes), and is merged with this part's into model_scale.{json,txt,png}: the result. A
# part cut short by its limit goes on in a second call of the same part with its own JSON
# copied into .gpu/ as model_scale_<P>0.json. In $OUT: model_scale_<P>.{json,txt,png,log},
# the probes' logs, JSON and psshim statistics in model_scale_<P>_runs.tar.gz; the tables last.
# MODEL_SCALE_MAX_S and MODEL_SCALE_TIMEOUT change the part's limit and a probe's timeout;
# MODEL_SCALE_ARGS adds options (--psshim-env PSSHIM_HOST_BUDGET=90G, --sizes 10B-14B, ...).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit
G=$PWD/.gpu
OUT=${OUT:-/tmp/psshim-model-scale}
W=/tmp/model-scale
P=${MODEL_SCALE_PART:?MODEL_SCALE_PART must be A, B or C}
mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=$G${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
[ -f "$G/commit" ] && MODEL_SCALE_COMMIT=$(cat "$G/commit") && export MODEL_SCALE_COMMIT
mapfile -t prior < <(ls "$G"/model_scale_[A-C]*.json 2>/dev/null)
log=$OUT/model_scale_$P.log
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  grep -E "^(MemTotal|MemAvailable)" /proc/meminfo; echo "memlock: $(ulimit -l)"; } >"$log" 2>&1
case $P in
  A) args=(--methods "native,fsdp-offload" --start fsdp-offload=L38h3712) max=340 timeout=200 ;;
  B) args=(--methods psshim --psshim-lib "$G/libpsshim.so" --refs-first) max=380 timeout=300 ;;
  C) args=(--methods deepspeed-offload --start deepspeed-offload=L38h3584) max=300 timeout=200
     t0=$SECONDS
     if ls bench/deepspeed/wheels/deepspeed-*.whl >/dev/null 2>&1; then
       BUILD_CPU_ADAM=1 bash bench/deepspeed/install.sh >>"$log" 2>&1 || echo "model_scale.sh: DeepSpeed's install failed" >>"$log"
     fi
     max=$((max - (SECONDS - t0))) ;;
  *) echo "model_scale.sh: MODEL_SCALE_PART must be A, B or C, not $P" >&2; exit 2 ;;
esac
[ ${#prior[@]} -eq 0 ] || args+=(--prior "${prior[@]}")
# shellcheck disable=SC2086  # MODEL_SCALE_ARGS is words
python3 bench/model_scale.py "${args[@]}" \
  --timeout "${MODEL_SCALE_TIMEOUT:-$timeout}" --max-total-s "${MODEL_SCALE_MAX_S:-$max}" \
  --out "$W/model_scale_$P.json" ${MODEL_SCALE_ARGS:-} >>"$log" 2>&1
echo "model_scale.sh: part $P exit $?" >>"$log"
cp "$W/model_scale_$P".{json,txt,png} "$OUT/" 2>/dev/null
tar czf "$OUT/model_scale_${P}_runs.tar.gz" -C "$W" "model_scale_${P}_runs" 2>/dev/null
tail -n 12 "$log"
if [ ${#prior[@]} -gt 0 ] && [ -f "$W/model_scale_$P.json" ]; then
  python3 bench/model_scale.py --merge "${prior[@]}" "$W/model_scale_$P.json" --out "$OUT/model_scale.json" \
    >"$W/merge.log" 2>&1 && echo "== merged ${prior[*]##*/} model_scale_$P.json" && tail -n 12 "$W/merge.log"
fi
true
