#!/usr/bin/env bash
# The version matrix: the tests that touch torch/Triton, on the oldest and newest supported torch
# (the full suite runs on the default torch, pyproject's dev extra). Called by scripts/test.sh.
#
# Each torch gets its own virtualenv, cached outside the checkout (CI clones afresh every run) in
# ${KCACHE_MATRIX_CACHE:-~/.cache/kcache/torch-matrix}, rebuilt when its torch is not the one asked
# for. Registry torch builds are CUDA builds with several GB of CUDA packages; they run on the CPU.
# KCACHE_TORCH_MATRIX picks the versions (space-separated; empty skips the matrix).
set -euo pipefail
cd "$(dirname "$0")/.."

versions="${KCACHE_TORCH_MATRIX-2.9.1 2.15.0}"
cache="${KCACHE_MATRIX_CACHE:-$HOME/.cache/kcache/torch-matrix}"
python="${PYTHON:-python3}"
# Every test module that hooks or drives torch/Triton; host safety with fewer runs per scenario
# (the full 20 run on the default torch).
tests=(
  tests/test_after_import.py tests/test_autoload.py tests/test_bundler_hooks.py
  tests/test_client_install.py tests/test_coordesc_reuse.py tests/test_dynamo_cache.py tests/test_failopen.py
  tests/test_fleet.py tests/test_fx_graph_entries.py tests/test_host_rules.py
  tests/test_host_safety.py tests/test_explain.py tests/test_verification.py
)

for version in $versions; do
  venv="$cache/torch-$version"
  t0=$(date +%s)
  if ! "$venv/bin/python" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$version')" >/dev/null 2>&1; then
    echo "torch matrix: building $venv (torch==$version from the registry)"
    rm -rf "$venv"
    mkdir -p "$cache"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    # Some machines cap torch with a pip constraint file (/etc/pip.conf: torch<=2.14.1, the
    # releases on their disk); the matrix asks for a registry release on purpose.
    PIP_CONSTRAINT=/dev/null "$venv/bin/python" -m pip install -q "torch==$version"
  fi
  # This checkout, editable (its kcache_autoload.pth too), and what the tests import.
  "$venv/bin/python" -m pip install -q -e . "boto3>=1.34" "redis>=5.0" "pytest>=8" "pytest-timeout>=2.3"
  echo "torch matrix: $("$venv/bin/python" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' 2>/dev/null) ready in $(( $(date +%s) - t0 ))s"
  KCACHE_HOST_SAFETY_RUNS="${KCACHE_MATRIX_HOST_SAFETY_RUNS:-2}" \
    "$venv/bin/python" -m pytest -p no:cacheprovider "${tests[@]}" "$@"
done
