#!/usr/bin/env bash
# Issue 33's 2-GPU table in one device call (bench/results/gpu/README.md, "Issue 33").
# Run from the repo root on a machine with 2 GPUs (nvidia-h100-x2) with $OUT set; kcache's wheel
# and the wheels the image lacks in .whl/ (bench/results/gpu/make_wheels.sh fills it here; carry ".whl"):
#
#   bash bench/results/gpu/run_issue33.sh TAG [BUDGET_S] [more bench/gpu_multirank.py arguments]
#
# BUDGET_S (default 510) is the whole call: setup, the bench and the packing of the results. The
# bench starts no node run that would not end in time and still prints the table of what ran.
# Defaults (the arguments after BUDGET_S override them; the last one wins): --device cuda
# (KCACHE_BENCH_DEVICE=cpu: gloo on the CPU), the transformers Llama of kcache_testkit/models.py,
# --repeats 2 (local-warm and kcache-warm: medians of 3, interleaved), --cold-repeats 2 (more
# cold nodes at the end, where the budget leaves room).
# kcache is installed into the machine's own Python environment (pip, like a user), so its
# kcache_autoload.pth runs at every interpreter start (torchrun's agent included); the nodes get
# KCACHE_URL and KCACHE_WORKLOAD only, their own HOME and TMPDIR.
# What comes back (5 files directly under $OUT): run_TAG.log (setup + progress + table),
# gpu_multirank_TAG.json, gpu_multirank_TAG.md (the tables), stderr_TAG.log (digest of the ranks'
# output), nodes_TAG.tgz (every node's rank logs and reports, the service's log).
set -uo pipefail
tag=${1:?usage: run_issue33.sh TAG [BUDGET_S] [gpu_multirank.py arguments]}
budget=${2:-510}
shift $(( $# >= 2 ? 2 : 1 ))
: "${OUT:?set OUT}"
export PYTHONUNBUFFERED=1
# NVLink multicast stays off (the device machines' rule; the image sets these, the nodes inherit them).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1} \
    NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
work=${KCACHE_BENCH_WORK:-/tmp/kcache-multirank}
wheels=${WHEELS:-.whl}
device=${KCACHE_BENCH_DEVICE:-cuda}
py=${PYTHON:-python3}
log="$OUT/run_$tag.log"
t0=$(date +%s)
ts() { echo "$(date +%T) +$(( $(date +%s) - t0 ))s $*"; }

{
    ts "setup: tag $tag, budget ${budget}s, device $device, arguments: $*"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    nproc
    $py -c 'import sys; print(sys.executable, sys.prefix, sys.version.split()[0])'
    if compgen -G "$wheels/kcache*.whl" >/dev/null; then
        $py -m pip install -q --no-index --find-links "$wheels" --no-cache-dir "$wheels"/kcache*.whl || exit 1
    elif $py -c 'import kcache, kcache_server' 2>/dev/null; then
        ts "no $wheels/kcache*.whl: using the kcache already installed"
    else
        echo "no $wheels/kcache*.whl and no kcache installed: run bench/results/gpu/make_wheels.sh and carry .whl"
        exit 1
    fi
    $py -m pip list 2>/dev/null | grep -i -E '^(kcache|pydantic|fastapi|uvicorn|httpx|zstandard|transformers|torch|triton) '
    site=$($py -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    ls -l "$site/kcache_autoload.pth" 2>/dev/null || echo "kcache_autoload.pth not in $site (editable or other install?)"
    KCACHE_URL=http://127.0.0.1:9 $py -c "import sys; print('autoload active at start:', 'kcache' in sys.modules)"
    if [ "$device" = cuda ]; then
        $py -c 'import torch, sys; n = torch.cuda.device_count(); print("cuda devices:", n); sys.exit(0 if n >= 2 else 3)' \
            || { echo "this proof needs 2 GPUs on one host (nvidia-h100-x2)"; exit 1; }
    fi
    env | grep -E '^(KCACHE_|TRITON_|TORCHINDUCTOR_|XDG_CACHE_HOME|HOME=|TMPDIR=|OMP_NUM_THREADS|CUDA_VISIBLE|NCCL_|TORCH_SYMM|NVSHMEM_)' || true
    ts "setup done"
} 2>&1 | tee "$log" || exit 1

# The bench's own budget: what is left of BUDGET_S, less ~20 s to pack the results. A safety net
# kills it 40 s later (SIGTERM: it still writes the table of what ran).
post=20
left=$(( budget - ($(date +%s) - t0) - post ))
rm -rf "$work"
timeout -k 10 $(( left + 40 )) $py -m bench.gpu_multirank --device "$device" --out "$OUT" --tag "_$tag" --work-dir "$work" \
    --budget-s "$left" --repeats "${REPEATS:-2}" --cold-repeats "${COLD_REPEATS:-2}" "$@" 2>&1 | tee -a "$log" >/dev/null
rc=${PIPESTATUS[0]}
ts "bench done (rc $rc)" >>"$log"

{
    echo "== rank logs with a Traceback or a 'kcache:' line (tracebacks, kcache lines)"
    (cd "$work" && find . -name '*.log' -path '*/out-*' | sort | while read -r f; do
        tb=$(grep -c Traceback "$f") kc=$(grep -c 'kcache:' "$f")
        [ "$tb$kc" != 00 ] && echo "$f tracebacks=$tb kcache=$kc"
    done)
    echo "== distinct 'kcache:' lines"
    (cd "$work" && find . -name '*.log' -path '*/out-*' -print0 | xargs -0 -r grep -h 'kcache:' | sort | uniq -c | sort -rn | head -40)
    echo "== Traceback contexts (first 5 files)"
    (cd "$work" && find . -name '*.log' -path '*/out-*' -print0 | xargs -0 -r grep -l Traceback | head -5 | while read -r f; do
        echo "--- $f"; grep -B2 -A30 Traceback "$f" | head -60; done)
    echo "== service: error lines"
    grep -h -v -E '"logger": "(uvicorn.access|kcache_server.downloads)"' "$work"/service/*.stderr 2>/dev/null | tail -40
    echo "== what the nodes wrote under their HOME and TMPDIR"
    du -sh "$work"/*/home/.[a-z]* "$work"/*/home/.cache/* "$work"/*/tmp/* 2>/dev/null | head -60
} >"$OUT/stderr_$tag.log" 2>&1
(cd "$work" && find . \( -path '*/out-*' -o -path './service/*.stderr' \) -type f -print0 | tar czf "$OUT/nodes_$tag.tgz" --null -T -)
ts "packed: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$log"
# Last in the output (a command's output tail is what comes back first): progress, then the tables.
grep -E '^[0-9]{2}:[0-9]{2}:[0-9]{2} \+ *[0-9]+s .*(/r[0-9]+: |interrupted|planned)' "$log" | tail -n 30 | cut -c1-260
cat "$OUT/gpu_multirank_$tag.md" 2>/dev/null || echo "no table: see $log"
exit "$rc"
