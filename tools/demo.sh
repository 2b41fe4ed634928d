#!/usr/bin/env bash
# The bundled demo: installs what is missing, builds psshim, and runs a training job
# under it with a GPU budget below the job's peak, then prints what psshim did.
#   On a machine with a GPU and PyTorch: bench/gpt_train.py --preset demo (135M params,
#   ~8 GiB peak) under PSSHIM_GPU_BUDGET=${DEMO_BUDGET:-4G}.
#   Without one: the same path on the test driver (tests/fakecuda): a miniature training
#   loop with a 96 MiB peak under a 24 MiB GPU budget.
set -euo pipefail
cd "$(dirname "$0")/.."
.ci/install-deps
[ -f build/build.ninja ] || meson setup build -Dtoolkit="${CUDA_HOME:-/usr/local/cuda}" >/dev/null
ninja -C build >/dev/null
if nvidia-smi -L >/dev/null 2>&1 && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "demo: GPT training under psshim, GPU budget ${DEMO_BUDGET:-4G}"
  LD_PRELOAD=$PWD/build/libpsshim.so PSSHIM_GPU_BUDGET=${DEMO_BUDGET:-4G} PSSHIM_STATS=1 \
    python3 bench/gpt_train.py --preset demo
else
  echo "demo: no GPU here, so the demo runs on the test driver (tests/fakecuda), not a real device:"
  echo "demo: a miniature training loop (96 MiB peak) under a 24 MiB GPU budget"
  LD_LIBRARY_PATH=$PWD/build/tests/fakecuda LD_PRELOAD=$PWD/build/libpsshim.so \
    PSSHIM_CHUNK_SIZE=2M PSSHIM_GPU_BUDGET=24M PSSHIM_HOST_BUDGET=256M PSSHIM_STATS=1 \
    build/tests/integration/train_sim 6 8 4
fi
