#!/usr/bin/env bash
# Run by torchrun --no-python for each rank: preloads psshim into this rank alone (not into
# torchrun) and gives it its own PSSHIM_STATS file, then runs the rest of the command line.
#   torchrun --nproc_per_node=N --no-python tests/gpu/rank_env.sh python3 bench/gpt_train.py ...
# RANK_ENV_LIB: libpsshim.so to preload (unset: none); RANK_ENV_STATS: a path prefix, the
# file is PREFIX.rank<RANK>.json.
set -euo pipefail
if [ -n "${RANK_ENV_LIB:-}" ]; then
  export LD_PRELOAD=$RANK_ENV_LIB
  [ -n "${RANK_ENV_STATS:-}" ] && export PSSHIM_STATS=$RANK_ENV_STATS.rank${RANK:-0}.json
fi
exec "$@"
