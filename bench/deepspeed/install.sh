#!/usr/bin/env bash
# Install DeepSpeed on the GPU machine from bench/deepspeed/wheels/ (fetch_wheels.sh),
# with no package index, next to the preinstalled torch and without touching it.
#
#   bench/deepspeed/install.sh [TARGET]     TARGET defaults to bench/deepspeed/site
#   BUILD_CPU_ADAM=1 bench/deepspeed/install.sh    also JIT-build the cpu_adam op now
#   PYTHON=/path/to/python3 ...                    the interpreter that has torch
#
# Then run with PYTHONPATH=TARGET (paging_sweep.py sets it for its deepspeed-offload runs
# when TARGET is the default); gpt_train.py puts TARGET/bin (ninja) on PATH itself.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
wheels="$here/wheels"
target="${1:-$here/site}"
py="${PYTHON:-python3}"

# The carried binary wheels are cp312 / x86_64: refuse any other interpreter up front.
"$py" - <<'PYEOF'
import platform, sys
if sys.version_info[:2] != (3, 12) or platform.machine() != "x86_64":
    sys.exit(f"install.sh: the wheels are for CPython 3.12 on x86_64; this is "
             f"{platform.python_implementation()} {platform.python_version()} on {platform.machine()}")
try:
    import torch
except ImportError as exc:
    sys.exit(f"install.sh: {sys.executable} has no torch ({exc}); set PYTHON to the one that has")
print(f"install.sh: python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})")
PYEOF

ds_wheel=$(find "$wheels" -maxdepth 1 -name "deepspeed-*-py3-none-any.whl" 2>/dev/null | sort | tail -1 || true)
if [ -z "$ds_wheel" ]; then
    echo "install.sh: no DeepSpeed wheel in $wheels: run fetch_wheels.sh where PyPI is reachable" >&2
    exit 1
fi
version=$(basename "$ds_wheel" | cut -d- -f2)
mkdir -p "$target"
target="$(cd "$target" && pwd)"

# Ask pip which carried wheels this interpreter lacks. The dry run resolves against what is
# installed, TARGET included (torch and anything that already satisfies DeepSpeed's
# requirements stay; a second run installs nothing, so a built cpu_adam stays current) and
# changes nothing; PIP_BREAK_SYSTEM_PACKAGES only quiets PEP 668 on a system Python.
report=$(mktemp)
trap 'rm -f "$report"' EXIT
PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}" PIP_BREAK_SYSTEM_PACKAGES=1 \
    "$py" -m pip install --quiet --dry-run --no-index --find-links "$wheels" \
    --report "$report" "deepspeed==$version"
mapfile -t files < <("$py" - "$report" <<'PYEOF'
import json, sys
from urllib.parse import unquote, urlparse
for item in json.load(open(sys.argv[1]))["install"]:
    print(unquote(urlparse(item["download_info"]["url"]).path))
PYEOF
)

# Install just those into TARGET; --no-deps (pip resolved them above) so nothing outside
# TARGET is installed, upgraded or removed. --upgrade replaces an earlier install there.
if [ ${#files[@]} -gt 0 ]; then
    printf 'install.sh: installing into %s:\n' "$target"
    printf '  %s\n' "${files[@]##*/}"
    "$py" -m pip install --quiet --no-index --no-deps --upgrade --target "$target" "${files[@]}"
else
    echo "install.sh: DeepSpeed $version and its requirements are already installed ($target or $py)"
fi

export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$target/bin:$PATH"
# From / so that the repository's bench/deepspeed/ folder cannot pass for the package.
(cd / && "$py" -c "import deepspeed; print(deepspeed.__version__)")

# cpu_adam (DeepSpeedCPUAdam) is built by torch.utils.cpp_extension at first use: it needs
# ninja, a C++ compiler with OpenMP, and Python.h. Report them; without them run
# gpt_train.py with --no-deepspeed-cpu-adam (torch's AdamW on the CPU instead).
echo "install.sh: for the JIT build of cpu_adam:"
echo "  ninja: $(command -v ninja || echo MISSING) $(ninja --version 2>/dev/null || true)"
echo "  c++:   $(command -v "${CXX:-c++}" || echo MISSING)"
echo "  Python.h: $("$py" -c 'import os, sysconfig; p = os.path.join(sysconfig.get_paths()["include"], "Python.h"); print(p if os.path.exists(p) else "MISSING (" + p + ")")')"
if [ "${BUILD_CPU_ADAM:-0}" = 1 ]; then
    # Builds into torch's extension cache (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions),
    # where the training run finds it.
    (cd / && "$py" -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load(verbose=True)")
fi
echo "install.sh: use it with: export PYTHONPATH=$target\${PYTHONPATH:+:\$PYTHONPATH} PATH=$target/bin:\$PATH"
