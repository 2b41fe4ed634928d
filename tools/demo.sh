#!/usr/bin/env bash
# The bundled demo: installs what is missing, builds psshim, and runs a training job
# through the psshim launcher with a GPU budget below the job's peak, then prints what
# psshim did.
#   On a machine with a GPU and PyTorch: bench/gpt_train.py --preset demo (135M params,
#   ~8 GiB peak) under PSSHIM_GPU_BUDGET=${DEMO_BUDGET:-4G}.
#   Without one: the same path on the test driver (tests/fakecuda): a miniature training
#   loop with a 96 MiB peak under a 24 MiB GPU budget.
set -euo pipefail
cd "$(dirname "$0")/.."
.ci/install-deps
[ -f build/build.ninja ] || meson setup build -Dtoolkit="${CUDA_HOME:-/usr/local/cuda}" >/dev/null
ninja -C build >/dev/null
run() { echo "demo: $*"; "$@"; }
if nvidia-smi -L >/dev/null 2>&1 && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "demo: GPT training under psshim, GPU budget ${DEMO_BUDGET:-4G}"
  run build/tools/psshim --budget "${DEMO_BUDGET:-4G}" --stats 1 -- python3 bench/gpt_train.py --preset demo
else
  echo "demo: no GPU here, so the demo runs on the test driver (tests/fakecuda), not a real device:"
  echo "demo: a miniature training loop (96 MiB peak) under a 24 MiB GPU budget"
  export LD_LIBRARY_PATH=$PWD/build/tests/fakecuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}  # the test driver's libcuda
  run build/tools/psshim --budget 24M --host-budget 256M --chunk-size 2M --stats 1 -- build/tests/integration/train_sim 6 8 4
fi
