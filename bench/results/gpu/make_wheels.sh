#!/usr/bin/env bash
# Fill .whl/ (git-ignored) for the GPU machine, which reaches no package registry: kcache's own
# wheel and every dependency as a wheel for CPython 3.12 on manylinux x86_64 (the device image's
# Python). The device call carries it (`carry: [".whl"]`) and run_issue26.sh / device_default_env.sh
# install from it with `pip install --no-index --find-links .whl`; pip takes what the image
# already has and installs only the rest. Run from the repo root, here (not on the device):
#   bash bench/results/gpu/make_wheels.sh
set -euo pipefail
dest=${1:-.whl}
rm -rf "$dest"
mkdir -p "$dest"
python3 -m pip wheel -q --no-deps -w "$dest" .
python3 -m pip download -q -d "$dest" --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_34_x86_64 "$dest"/kcache*.whl
ls -1 "$dest"
du -sh "$dest"
