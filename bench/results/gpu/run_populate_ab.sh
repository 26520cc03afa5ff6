#!/usr/bin/env bash
# Populate overhead before/after a change, on the GPU, in one device call (issue 26: populate <=
# 1.05x cold). Run from the repo root on the GPU machine with $OUT set, carrying ".whl" laid out as
#   .whl/deps/*.whl   kcache's dependencies (bench/results/gpu/make_wheels.sh's, less kcache)
#   .whl/base/*.whl   kcache before the change      .whl/new/*.whl   kcache after it
#
#   ROUNDS=3 WORKLOAD=mlp-autotune bash bench/results/gpu/run_populate_ab.sh TAG [BUDGET_S]
#
# Each kcache goes into a venv of its own over the machine's Python (--system-site-packages: the
# image's torch and Triton), so both are installed as a user installs them (the .pth activation
# included). Every round runs cold (kcache off), populate-base and populate-new, the order
# rotating, each a fresh bench/gpu_e2e.py --default-env node (own HOME/TMPDIR) and, for populate,
# an empty service of its own. What comes back: run_TAG.log and populate_ab_TAG.json (every run's
# first-call seconds, medians, pop/cold for both).
set -uo pipefail
tag=${1:?usage: run_populate_ab.sh TAG [BUDGET_S]}
budget=${2:-560}
: "${OUT:?set OUT}"
rounds=${ROUNDS:-3}
workload=${WORKLOAD:-mlp-autotune}
work=/tmp/kcache-populate-ab
log="$OUT/run_$tag.log"
t0=$(date +%s)
ts() { echo "$(date +%T) +$(( $(date +%s) - t0 ))s $*" | tee -a "$log"; }
rm -rf "$work" && mkdir -p "$work"
ts "setup: $workload, $rounds rounds, budget ${budget}s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$log" 2>&1
for v in base new; do
    python3 -m venv --system-site-packages "/tmp/venv-$v" >>"$log" 2>&1 || exit 1
    "/tmp/venv-$v/bin/python" -m pip install -q --no-index --find-links .whl/deps .whl/$v/kcache*.whl >>"$log" 2>&1 || exit 1
done
/tmp/venv-new/bin/python -c 'import torch, triton, kcache; print(torch.__version__, triton.__version__, kcache.__file__)' >>"$log" 2>&1
ts "setup done"
order=(cold populate-base populate-new)
for (( r = 0; r < rounds; r++ )); do
    for (( i = 0; i < 3; i++ )); do
        label=${order[$(( (i + r) % 3 ))]}
        left=$(( budget - ($(date +%s) - t0) - 15 ))
        if [ "$left" -lt 60 ]; then ts "budget: $label round $r not started"; continue; fi
        case $label in
            cold) py=/tmp/venv-base/bin/python scenario=cold ;;
            populate-base) py=/tmp/venv-base/bin/python scenario=populate ;;
            populate-new) py=/tmp/venv-new/bin/python scenario=populate ;;
        esac
        timeout -k 10 "$left" "$py" bench/gpu_e2e.py --default-env --device cuda --out "$work/$label-$r" --tag "_$label-$r" \
            --work-dir "$work/$label-$r" --workloads "$workload" --scenarios "$scenario" --budget-s "$left" >>"$log" 2>&1
        ts "$label round $r done (rc $?)"
    done
done
python3 - "$work" "$workload" "$OUT/populate_ab_$tag.json" <<'EOF' 2>&1 | tee -a "$log"
import glob, json, statistics, sys
work, workload, out = sys.argv[1:]
runs = {}
for path in sorted(glob.glob(f"{work}/*/gpu_e2e_*.json")):
    label = path.split("/")[-2].rsplit("-", 1)[0]
    rep = json.load(open(path))["workloads"][workload]["runs"]
    scenario = "cold" if label == "cold" else "populate"
    run = rep.get(scenario) or {}
    kc = (run.get("kcache") or {}).get("layers", {})
    runs.setdefault(label, []).append({"first_call_s": run.get("first_call_s"), "process_s": run.get("process_s"),
                                       "exit_flush_s": run.get("exit_flush_s"), "rc": run.get("rc"),
                                       "kcache_seconds": round(sum(v.get("seconds", 0) for v in kc.values()), 3),
                                       "put_errors": sum(v.get("put_errors", 0) for v in kc.values()),
                                       "puts": sum(v.get("puts", 0) for v in kc.values())})
med = {k: statistics.median([r["first_call_s"] for r in v if r["first_call_s"]]) for k, v in runs.items()}
ratios = {f"{k}/cold": round(m / med["cold"], 3) for k, m in med.items() if k != "cold" and "cold" in med}
json.dump({"workload": workload, "runs": runs, "medians": med, "ratios": ratios}, open(out, "w"), indent=1)
print(json.dumps({"medians": med, "ratios": ratios}))
EOF
