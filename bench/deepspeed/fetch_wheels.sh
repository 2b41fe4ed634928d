#!/usr/bin/env bash
# Fetch DeepSpeed and the Python packages it needs beyond torch, as wheels for the GPU
# machine (CPython 3.12, x86_64 Linux, glibc >= 2.28, no package index), into
# bench/deepspeed/wheels/ (ignored by git; name it in the device run's `carry`).
# Run where PyPI is reachable. Idempotent: files already there are kept.
# Then, on the GPU machine: bench/deepspeed/install.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="$here/wheels"
pip=("${PYTHON:-python3}" -m pip)

# Pinned so that every fetch carries the same set. DeepSpeed's requirements
# (requirements/requirements.txt of 0.19.8) less torch, plus pydantic's own.
# typing-extensions comes with torch, but pydantic 2.14 needs >= 4.16 and torch only
# >= 4.10: it is carried as a fallback; install.sh installs it only where the
# machine's copy is older.
DEEPSPEED=0.19.8
deps=(
    einops==0.8.2 hjson==3.1.0 msgpack==1.2.4 ninja==1.13.2 numpy==2.4.6
    packaging==26.4 psutil==7.2.2 py-cpuinfo==9.0.0 tqdm==4.70.1
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
    typing-inspection==0.4.5 typing-extensions==4.16.0
)

mkdir -p "$dest"

# DeepSpeed is published as an sdist only: build it into a py3-none-any wheel here.
# pip's build isolation keeps torch out of the build, as on a plain `pip install
# deepspeed`, so no op is precompiled (DS_BUILD_OPS=0): ops such as cpu_adam are
# JIT-built by torch.utils.cpp_extension at first use on the GPU machine.
if [ ! -f "$dest/deepspeed-$DEEPSPEED-py3-none-any.whl" ]; then
    DS_BUILD_OPS=0 "${pip[@]}" wheel --quiet --no-deps --no-binary deepspeed \
        -w "$dest" "deepspeed==$DEEPSPEED"
fi

# Binary wheels for the GPU machine's interpreter, not this one's; --no-deps because the
# list above is already complete. manylinux_2_28 too: numpy 2.4 ships no older tag
# (Ubuntu 24.04 has glibc 2.39).
"${pip[@]}" download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 -d "$dest" "${deps[@]}"

expected=$(( ${#deps[@]} + 1 ))
found=$(find "$dest" -maxdepth 1 -name '*.whl' | wc -l)
if [ "$found" -ne "$expected" ]; then
    echo "fetch_wheels.sh: warning: $found wheels in $dest, expected $expected (left from another fetch?)" >&2
fi
(cd "$dest" && du -h --apparent-size -- *.whl && du -ch --apparent-size -- *.whl | tail -1)
