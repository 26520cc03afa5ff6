#!/usr/bin/env bash
# The version matrix: the tests marked `torch` (they drive torch or Triton; tests/test_architecture.py
# checks every such module carries the marker) and not `one_torch` (a test inside such a module whose
# check does not depend on torch's version), on the oldest and newest supported torch (the full
# suite runs on the default torch, pyproject's dev extra). Called by scripts/test.sh:
#
#   scripts/torch_matrix.sh build          make or refresh every version's virtualenv (downloads)
#   scripts/torch_matrix.sh run [ARGS]     run the marked tests in each; ARGS go to pytest, and an
#                                          `-m EXPR` among them narrows the marker: ... and (EXPR)
#
# Each torch gets its own virtualenv, cached outside the checkout (CI clones afresh every run) in
# ${KCACHE_MATRIX_CACHE:-~/.cache/kcache/torch-matrix}, rebuilt when its torch is not the one asked
# for. Registry torch builds are CUDA builds with several GB of CUDA packages; they run on the CPU.
# The versions build side by side (the time is the registry's download). KCACHE_TORCH_MATRIX picks
# the versions (space-separated; empty skips the matrix).
set -euo pipefail
cd "$(dirname "$0")/.."

versions="${KCACHE_TORCH_MATRIX-2.9.1 2.15.0}"
cache="${KCACHE_MATRIX_CACHE:-$HOME/.cache/kcache/torch-matrix}"
python="${PYTHON:-python3}"
# What the tests import beside torch and this checkout (pyproject's dev extra, less its torch).
test_deps=("boto3>=1.34" "redis>=5.0" "pytest>=8" "pytest-timeout>=2.3" "pytest-xdist>=3.5")

build_one() {
  local version="$1" venv="$cache/torch-$1" t0
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
  # (`kcache` is this checkout's old distribution name, now `kcache-server`: dropped first.)
  "$venv/bin/python" -m pip uninstall -q -y kcache >/dev/null 2>&1 || true
  "$venv/bin/python" -m pip install -q -e . "${test_deps[@]}"
  echo "torch matrix: $("$venv/bin/python" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' 2>/dev/null) ready in $(( $(date +%s) - t0 ))s"
}

build() {
  local pids=() version failed=0
  for version in $versions; do
    build_one "$version" > >(sed "s/^/[$version] /") 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  return "$failed"
}

run() {
  # `-m EXPR` from the caller narrows the marker instead of replacing it.
  local marker="torch and not one_torch" args=()
  while [ $# -gt 0 ]; do
    case "$1" in
      -m) marker="$marker and ($2)"; shift 2 ;;
      -m*) marker="$marker and (${1#-m})"; shift ;;
      *) args+=("$1"); shift ;;
    esac
  done
  local version venv rc
  for version in $versions; do
    venv="$cache/torch-$version"
    echo "torch matrix: torch $version, -m '$marker'"
    # Host safety with fewer runs: the race scenarios a cold and a warm run, the others their cold
    # run (the full budget, 20 for each race and a cold and a warm run for the others, runs on the
    # default torch).
    rc=0
    KCACHE_HOST_SAFETY_RUNS="${KCACHE_MATRIX_HOST_SAFETY_RUNS:-2}" KCACHE_HOST_SAFETY_PATH_RUNS=1 \
      "$venv/bin/python" -m pytest -p no:cacheprovider --durations=15 -m "$marker" ${args[@]+"${args[@]}"} || rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 5 ] || return "$rc"  # 5: nothing selected by the caller's -m
  done
}

case "${1:-}" in
  build) build ;;
  run) shift; run "$@" ;;
  *) build && run "$@" ;;
esac
