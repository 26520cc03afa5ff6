#!/usr/bin/env bash
# The whole test suite, on a fresh machine too: creates .venv, installs kcache with its test
# dependencies (torch CPU build, triton, SeaweedFS's `weed`, Playwright + Debian chromium for the
# dashboard test), makes sure Redis answers on 127.0.0.1:6379, then runs ruff, mypy and pytest,
# then the torch-touching tests on the oldest and newest supported torch (scripts/torch_matrix.sh).
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m "not slow"` for a quick loop).
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e '.[dev]'

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
python -m pytest "$@"
# The same torch-touching tests on the oldest and newest supported torch (README, "Supported
# versions"); KCACHE_TORCH_MATRIX="" skips it.
bash scripts/torch_matrix.sh "$@"
