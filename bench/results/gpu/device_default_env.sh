#!/usr/bin/env bash
# One device call of the default-environment proof (bench/results/gpu/README.md, "Default environment").
# Run from the repo root on the GPU machine, with the wheels in .whl (kcache's own wheel + what the
# image lacks) and $OUT set:
#   bash bench/results/gpu/device_default_env.sh TAG WORKLOADS [more bench/gpu_e2e.py arguments]
# kcache is installed into the machine's own Python environment, as a user would (pip install), so
# its kcache_autoload.pth is processed at every interpreter start; nothing else is set but what
# gpu_e2e.py --default-env gives each node (KCACHE_URL, KCACHE_WORKLOAD, its own HOME and TMPDIR).
set -uo pipefail
tag=$1 workloads=$2
shift 2
export PYTHONUNBUFFERED=1
work=/tmp/kcache-gpu-e2e
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import sys; print(sys.executable, sys.prefix, sys.version.split()[0])'
    python3 -m pip install -q --no-index --find-links .whl --no-cache-dir .whl/kcache*.whl || exit 1
    python3 -m pip list 2>/dev/null | grep -i -E '^(kcache|pydantic|pydantic.core|fastapi|starlette|uvicorn|httpx|anyio|zstandard|timm|transformers|torch|triton|typing.extensions) '
    site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    ls -l "$site/kcache_autoload.pth" || exit 1
    KCACHE_URL=http://127.0.0.1:9 python3 -c "import sys; print('autoload active at start:', 'kcache' in sys.modules)"
    python3 -c "import sys; print('without KCACHE_URL:', 'kcache._autoload' in sys.modules, 'torch' in sys.modules)"
    env | grep -E '^(KCACHE_|TRITON_|TORCHINDUCTOR_|XDG_CACHE_HOME|HOME=|TMPDIR=)' || true
} 2>&1 | tee "$OUT/setup_$tag.log" || exit 1
timeout "${KCACHE_BENCH_TIMEOUT:-545}" python3 bench/gpu_e2e.py --default-env --device "${KCACHE_BENCH_DEVICE:-cuda}" --out "$OUT" --tag "_$tag" --work-dir "$work" --workloads "$workloads" "$@" 2>&1 | tee "$OUT/run_$tag.log"
rc=$?
{
    echo "== node stderr: Traceback / 'kcache:' lines per file"
    (cd "$work" && find . -name stderr.txt | sort | while read -r f; do
        echo "$f tracebacks=$(grep -c Traceback "$f") kcache=$(grep -c 'kcache:' "$f")"
    done)
    echo "== distinct 'kcache:' lines"
    (cd "$work" && find . -name stderr.txt -print0 | xargs -0 grep -h 'kcache:' | sort | uniq -c | sort -rn | head -40)
    echo "== Traceback contexts"
    (cd "$work" && find . -name stderr.txt -print0 | xargs -0 grep -l Traceback | head -5 | while read -r f; do echo "--- $f"; grep -A30 Traceback "$f" | head -60; done)
    echo "== what the nodes wrote under their HOME and TMPDIR"
    du -sh "$work"/*/node-*/home/.[a-z]* "$work"/*/node-*/tmp/* 2>/dev/null | head -60
} 2>&1 | tee "$OUT/stderr_$tag.log"
(cd "$work" && find . \( -name stderr.txt -o -name 'service-*.log' \) -print0 | tar czf "$OUT/node_stderr_$tag.tgz" --null -T -)
exit $rc
