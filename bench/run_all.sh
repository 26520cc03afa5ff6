#!/usr/bin/env bash
# Run every kcache benchmark at its default settings; results land in bench/results/*.json.
#   bench/run_all.sh            # N = 500 kernels
#   bench/run_all.sh --n 1000   # passed to each benchmark that takes --n
# Needs the repo venv (activated here if present), wrk and nginx (apt-get install -y wrk nginx).
# The corpus is compiled on first use (~0.25 s/kernel/core) and cached in bench/.corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
for tool in wrk nginx; do
  command -v "$tool" >/dev/null || [[ -x "/usr/sbin/$tool" ]] || {
    echo "run_all.sh: $tool is missing (apt-get install -y wrk nginx)" >&2; exit 2; }
done
for bench in compression emit service_throughput; do
  echo "=== python -m bench.$bench $* ==="
  python -m "bench.$bench" "$@"
  echo
done
echo "=== python -m bench.fx_entry_read ==="  # no corpus: takes no --n
python -m bench.fx_entry_read
echo
# Client overhead is another engineer's benchmark; run it when it is there.
if [[ -f bench/client_overhead.py ]]; then
  echo "=== python -m bench.client_overhead ==="
  python -m bench.client_overhead
fi
