#!/usr/bin/env bash
# The whole test suite, on a fresh machine too: creates .venv, installs kcache with its test
# dependencies (torch CPU build where the machine carries it, else the registry's; triton,
# SeaweedFS's `weed`, pytest-xdist, Playwright + Debian chromium for the dashboard test), makes
# sure Redis answers on 127.0.0.1:6379, then runs ruff, mypy and pytest (every core), then the
# tests marked `torch` on the oldest and newest supported torch (scripts/torch_matrix.sh) and, beside
# them, the tests marked `vllm` against the real vLLM engine (scripts/vllm_env.sh); their virtualenvs
# download in the background while the main suite runs.
#
#   bash scripts/test.sh            the whole suite: what CI runs
#   bash scripts/test.sh --quick    the quick loop: no `slow` tests, no torch matrix, no vLLM
#
# Other arguments go to pytest, in the main suite and the matrix (e.g. `-k emitter`, `-n 0`).
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --upgrade pip
# This checkout's distribution was `kcache` before it became `kcache-server` (PyPI's `kcache` is
# another project): drop an install under the old name first, so two never own the same files.
python -m pip uninstall -q -y kcache >/dev/null 2>&1 || true
python -m pip install -q -e '.[dev]'

if [ "${1:-}" = "--quick" ]; then
  shift
  set -- -m "not slow" "$@"
  export KCACHE_TORCH_MATRIX="" KCACHE_VLLM_VERSION=""
fi
# The matrix virtualenvs are several GB from the registry: build them while the main suite runs.
matrix_log="${TMPDIR:-/tmp}/kcache-torch-matrix-build.$$.log"
matrix_pid=""
if [ -n "${KCACHE_TORCH_MATRIX-2.9.1 2.15.0}" ]; then
  bash scripts/torch_matrix.sh build >"$matrix_log" 2>&1 &
  matrix_pid=$!
fi
vllm_log="${TMPDIR:-/tmp}/kcache-vllm-env-build.$$.log"
vllm_pid=""
if [ -n "${KCACHE_VLLM_VERSION-0.32.0}" ]; then
  bash scripts/vllm_env.sh build >"$vllm_log" 2>&1 &
  vllm_pid=$!
fi
vllm_run_pid=""
# Background jobs and their children (pytest under `vllm_env.sh run`) go when this script does.
trap 'for p in $matrix_pid $vllm_pid $vllm_run_pid; do pkill -P "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done' EXIT

# System packages: chromium for the dashboard's browser test, redis-server for the index tests.
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "scripts/test.sh: please install: ${need[*]}" >&2
  fi
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 50); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 0.1; done
fi

ruff check .
mypy
python -m pytest --durations=30 "$@"
# The real vLLM engine against a real kcache service (tests/test_vllm.py), beside the torch matrix:
# its engines keep about one core busy (measured: ~47 % idle on 2 cores alone), the matrix fills the
# rest. Its output follows the matrix's. KCACHE_VLLM_VERSION="" skips it.
vllm_run_log="${TMPDIR:-/tmp}/kcache-vllm-run.$$.log"
if [ -n "$vllm_pid" ]; then
  build_rc=0
  wait "$vllm_pid" || build_rc=$?
  vllm_pid=""
  grep -v "^WARNING: Location" "$vllm_log" || true
  rm -f "$vllm_log"
  [ "$build_rc" = 0 ] || { echo "scripts/test.sh: the vLLM environment did not build" >&2; exit "$build_rc"; }
  bash scripts/vllm_env.sh run "$@" >"$vllm_run_log" 2>&1 &
  vllm_run_pid=$!
fi
# The torch-marked tests on the oldest and newest supported torch (README, "Supported versions");
# KCACHE_TORCH_MATRIX="" skips it.
if [ -n "$matrix_pid" ]; then
  build_rc=0
  wait "$matrix_pid" || build_rc=$?
  matrix_pid=""
  cat "$matrix_log"
  rm -f "$matrix_log"
  [ "$build_rc" = 0 ] || { echo "scripts/test.sh: the torch matrix did not build" >&2; exit "$build_rc"; }
  matrix_rc=0
  bash scripts/torch_matrix.sh run "$@" || matrix_rc=$?
fi
if [ -n "$vllm_run_pid" ]; then
  vllm_rc=0
  wait "$vllm_run_pid" || vllm_rc=$?
  vllm_run_pid=""
  echo "vllm env: the tests marked vllm (run beside the torch matrix):"
  cat "$vllm_run_log"
  rm -f "$vllm_run_log"
  [ "$vllm_rc" = 0 ] || exit "$vllm_rc"
fi
exit "${matrix_rc:-0}"
