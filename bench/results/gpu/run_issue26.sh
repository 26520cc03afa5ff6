#!/usr/bin/env bash
# Issue 26's GPU table in one device call (bench/results/gpu/README.md, "Issue 26").
# Run from the repo root on the GPU machine with $OUT set; kcache's wheel and the wheels the image
# lacks in .whl/ (bench/results/gpu/make_wheels.sh fills it here; carry ".whl"):
#
#   bash bench/results/gpu/run_issue26.sh TAG WORKLOADS [BUDGET_S] [more bench/gpu_e2e.py arguments]
#
# BUDGET_S (default 540) is the whole call: setup, the bench and the packing of the results.
# The bench stops starting runs that would not end in time and still prints the table of what
# ran. Defaults, overridable by the arguments after BUDGET_S (the last --scenarios/--repeats win)
# or by the environment:
#   SCENARIOS=cold,populate,local-warm,copied-warm,kcache-warm   (PRECOMPILE=1 adds
#             populate-precompile,kcache-warm-precompile,copied-warm-precompile)
#   REPEATS=2 (medians of 3 interleaved runs of the warm scenarios)
# kcache is installed into the machine's own Python environment (pip, like a user), so its
# kcache_autoload.pth runs at every interpreter start; the nodes get only what
# gpu_e2e.py --default-env gives them (KCACHE_URL, KCACHE_WORKLOAD, their own HOME and TMPDIR).
# What comes back (<= 8 files, all directly under $OUT): run_TAG.log (setup + progress with
# timestamps + table), gpu_e2e_TAG.json, gpu_e2e_TAG.md (the table), gpu_e2e_TAG.png,
# stderr_TAG.log (node stderr digest), nodes_TAG.tgz (every node's stderr, service logs, profiles).
set -uo pipefail
tag=${1:?usage: run_issue26.sh TAG WORKLOADS [BUDGET_S] [gpu_e2e.py arguments]}
workloads=${2:?workloads, e.g. bert,llama-train}
budget=${3:-540}
shift $(( $# >= 3 ? 3 : 2 ))
: "${OUT:?set OUT}"
export PYTHONUNBUFFERED=1
work=${KCACHE_BENCH_WORK:-/tmp/kcache-gpu-e2e}
wheels=${WHEELS:-.whl}
device=${KCACHE_BENCH_DEVICE:-cuda}
scenarios=${SCENARIOS:-cold,populate,local-warm,copied-warm,kcache-warm}
if [ "${PRECOMPILE:-0}" = 1 ]; then
    scenarios="$scenarios,populate-precompile,kcache-warm-precompile,copied-warm-precompile"
fi
log="$OUT/run_$tag.log"
t0=$(date +%s)
ts() { echo "$(date +%T) +$(( $(date +%s) - t0 ))s $*"; }

{
    ts "setup: tag $tag, workloads $workloads, budget ${budget}s, scenarios $scenarios, repeats ${REPEATS:-2}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    python3 -c 'import sys; print(sys.executable, sys.prefix, sys.version.split()[0])'
    if compgen -G "$wheels/kcache*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --find-links "$wheels" --no-cache-dir "$wheels"/kcache*.whl || exit 1
    elif python3 -c 'import kcache, kcache_server' 2>/dev/null; then
        ts "no $wheels/kcache*.whl: using the kcache already installed"
    else
        echo "no $wheels/kcache*.whl and no kcache installed: run bench/results/gpu/make_wheels.sh and carry .whl"
        exit 1
    fi
    python3 -m pip list 2>/dev/null | grep -i -E '^(kcache|pydantic|fastapi|uvicorn|httpx|zstandard|timm|torchvision|transformers|torch|triton|matplotlib) '
    site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    ls -l "$site/kcache_autoload.pth" 2>/dev/null || echo "kcache_autoload.pth not in $site (editable or other install?)"
    KCACHE_URL=http://127.0.0.1:9 python3 -c "import sys; print('autoload active at start:', 'kcache' in sys.modules)"
    env | grep -E '^(KCACHE_|TRITON_|TORCHINDUCTOR_|XDG_CACHE_HOME|HOME=|TMPDIR=)' || true
    ts "setup done"
} 2>&1 | tee "$log" || exit 1

# The bench's own budget: what is left of BUDGET_S, less ~25 s to merge and pack the results.
# A safety net kills it 40 s later (SIGTERM: it still writes the table of what ran).
# GPUS=N (a machine with N GPUs): the workloads are dealt round-robin to N bench processes, one
# per GPU (CUDA_VISIBLE_DEVICES) and, where taskset exists, nproc/N cores each (16 on the 4- and
# 8-GPU H100 hosts: the one-GPU machine's count); each workload stays on one GPU, its scenarios
# interleaved as in the one-GPU case. The results are merged into one table.
post=25
left=$(( budget - ($(date +%s) - t0) - post ))
gpus=${GPUS:-1}
IFS=, read -r -a names <<<"$workloads"
cores=$(nproc)
per=$(( cores / gpus ))
rm -rf "$work"
mkdir -p "$work"
pids=()
for (( g = 0; g < gpus; g++ )); do
    group=()
    for (( i = g; i < ${#names[@]}; i += gpus )); do group+=("${names[$i]}"); done
    [ ${#group[@]} -eq 0 ] && continue
    list=$(IFS=,; echo "${group[*]}")
    pin=()
    if [ "$gpus" -gt 1 ] && command -v taskset >/dev/null; then pin=(taskset -c "$(( g * per ))-$(( g * per + per - 1 ))"); fi
    [ "$gpus" -gt 1 ] && cuda=(env CUDA_VISIBLE_DEVICES="$g") || cuda=()
    ts "group g$g: $list ${pin[*]} ${cuda[*]}" >>"$log"
    ( timeout -k 10 $(( left + 40 )) "${cuda[@]}" "${pin[@]}" python3 bench/gpu_e2e.py --default-env --device "$device" \
        --out "$work/g$g" --tag "_${tag}_g$g" --work-dir "$work/g$g" --workloads "$list" --budget-s "$left" \
        --scenarios "$scenarios" --repeats "${REPEATS:-2}" "$@" 2>&1 | sed -u "s/^/[g$g] /" >>"$log" ) &
    pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
ts "bench processes done (rc $rc); merging" >>"$log"
python3 bench/gpu_e2e.py --out "$OUT" --tag "_$tag" --merge "$work"/g*/gpu_e2e_"${tag}"_g*.json >>"$log" 2>&1 || rc=$?

{
    echo "== node stderr: files with a Traceback or a 'kcache:' line (tracebacks, kcache lines)"
    (cd "$work" && find . -name stderr.txt | sort | while read -r f; do
        tb=$(grep -c Traceback "$f") kc=$(grep -c 'kcache:' "$f")
        [ "$tb$kc" != 00 ] && echo "$f tracebacks=$tb kcache=$kc"
    done)
    echo "== distinct 'kcache:' lines"
    (cd "$work" && find . -name stderr.txt -print0 | xargs -0 -r grep -h 'kcache:' | sort | uniq -c | sort -rn | head -40)
    echo "== Traceback contexts (first 5 files)"
    (cd "$work" && find . -name stderr.txt -print0 | xargs -0 -r grep -l Traceback | head -5 | while read -r f; do
        echo "--- $f"; grep -A30 Traceback "$f" | head -60; done)
    echo "== quarantined kernel dirs, the dir that replaced each and the producer's (populate) dir of that key"
    (cd "$work" && find . -type d -name 'quarantine.*' 2>/dev/null | sort | head -4 | while read -r q; do
        key=$(basename "$q" | cut -d. -f2) node=${q%%/tmp/*}
        for d in "$q" "$(dirname "$q")/$key" "$(dirname "$node")/node-populate/tmp/torchinductor_root/triton/0/$key"; do
            echo "--- $d"; ls -l "$d" 2>&1 | head -20
            mkdir -p "quarantine-debug/$d" && cp "$d"/*.json "quarantine-debug/$d/" 2>/dev/null
        done
    done)
    echo "== what the nodes wrote under their HOME and TMPDIR"
    du -sh "$work"/g*/*/node-*/home/.[a-z]* "$work"/g*/*/node-*/tmp/* 2>/dev/null | head -80
} >"$OUT/stderr_$tag.log" 2>&1
(cd "$work" && find . \( -name stderr.txt -o -name stdout.txt -o -name 'service-*.log' -o -path './g*/profiles/*' \
    -o -path './g*/gpu_e2e_*' -o -path './quarantine-debug/*' \) -print0 | tar czf "$OUT/nodes_$tag.tgz" --null -T -)
ts "packed: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$log"
# Last in the output (a command's output tail is what comes back first): the last results, the table.
grep -E '^(\[g[0-9]+\] )?[0-9]{2}:[0-9]{2}:[0-9]{2} .*(: first call|FAILED|skipped \(|interrupted|bench processes done)' "$log" | tail -n 25 | cut -c1-220
cat "$OUT/gpu_e2e_$tag.md" 2>/dev/null || echo "no table: see $log"
exit $rc
