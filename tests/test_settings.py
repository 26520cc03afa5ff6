"""Settings that refuse nonsense: one grammar for sizes and durations on both sides
(``kcache_schemas.units``), every ``KCACHE_*`` value parsed strictly, a value that does not parse
refused at ``kcache.install()`` with the variable named, and under autoload one warning with
kcache off, never a more permissive mode than asked for (issue #27)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from kcache import _autoload, config
from kcache.cli.commands import _age, _size, hit_rate_bar
from kcache.config import ClientConfig, settings_or_off
from kcache.exceptions import ConfigError
from kcache.store.counters import load_stats
from kcache_schemas.units import parse_bytes, parse_duration
from kcache_server.retention_rules import RetentionConfig
from kcache_server.server import serve
from kcache_server.settings import Settings

from kcache_testkit.nodes import Node
from kcache_testkit.pace import HANG_S

pytest_plugins = ["live"]

KERNEL_JOB = Path(__file__).with_name("triton_kernel_job.py")
GIB, GB = 1 << 30, 10**9

# ---- one grammar, both sides -----------------------------------------------------------------------

BYTES = [
    ("4096", 4096), ("0", 0), ("10GiB", 10 * GIB), ("10GB", 10 * GB), ("10G", 10 * GIB), ("10gb", 10 * GB),
    ("10 GiB", 10 * GIB), ("10Gi", 10 * GIB), ("512MiB", 512 << 20), ("500MB", 500 * 10**6), ("500M", 500 << 20),
    ("1.5k", 1536), ("1.5kB", 1500), ("64KiB", 64 << 10), ("2TB", 2 * 10**12), ("1T", 1 << 40), ("7B", 7),
]
NOT_BYTES = ["-1", "-10GB", "lots", "10X", "1.5", "1e9", "10 G B", "GB", "nan", "inf"]


@pytest.mark.parametrize(("text", "expected"), BYTES)
def test_one_byte_grammar_on_every_side(text: str, expected: int) -> None:
    """The client's local tier, the service's settings and retention rules, and ``kcache gc
    --max-bytes`` read a size alike (``10G`` was 10 GiB in the client and 10 GB in the service)."""
    assert parse_bytes(text) == expected
    assert config.parse_bytes(text) == expected
    assert Settings(max_pack_bytes=text).max_pack_bytes == expected
    assert RetentionConfig.model_validate({"default": {"hard_limit": text}}).default.hard_limit == expected
    assert _size(text) == expected


@pytest.mark.parametrize("text", NOT_BYTES)
def test_a_size_that_does_not_parse_is_refused_everywhere_with_the_grammar(text: str) -> None:
    with pytest.raises(ValueError, match=r"10GiB \(powers of 1024\); 10G = 10GiB|whole number|negative"):
        parse_bytes(text)
    with pytest.raises(ValueError, match=r"not a size|whole number|negative"):
        Settings(max_pack_bytes=text)
    with pytest.raises(ValueError, match=r"KCACHE_RETENTION: default\.hard_limit"):
        Settings(retention=json.dumps({"default": {"hard_limit": text}}))


DURATIONS = [("90s", 90.0), ("30m", 1800.0), ("12h", 43200.0), ("7d", 7 * 86400.0), ("2w", 14 * 86400.0),
             ("1h30m", 5400.0), ("500ms", 0.5), ("0", 0.0)]


@pytest.mark.parametrize(("text", "seconds"), DURATIONS)
def test_one_duration_grammar_on_every_side(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert RetentionConfig.model_validate({"default": {"min_age": text}}).default.min_age == seconds
    assert Settings(body_timeout_s=text).body_timeout_s == seconds
    assert _age(text) == seconds


def test_a_bare_number_is_seconds_where_the_name_says_so_and_refused_by_gc_flags() -> None:
    assert parse_duration("90") == 90.0 and Settings(body_timeout_s="90").body_timeout_s == 90.0
    with pytest.raises(ValueError, match="'7' has no unit: write 7s, 7m, 7h or 7d"):
        parse_duration("7", bare_seconds=False)
    for bad in ("-1h", "soon", "7x", "inf", "1h-30m"):
        with pytest.raises(ValueError, match=r"not a duration|must not be negative"):
            parse_duration(bad)


@pytest.mark.parametrize(("text", "percent"), [("80%", 80.0), ("80", 80.0), ("0.8", 80.0), ("100", 100.0),
                                                ("0.5%", 0.5), ("1", 1.0), ("0", 0.0)])
def test_fail_under_reads_percent_and_fractions(text: str, percent: float) -> None:
    assert hit_rate_bar(text) == pytest.approx(percent)


# ---- client settings -------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["readonly", "read-only", "READ_ONLY", "ro", " ro "])
def test_read_only_spellings_are_read_only(monkeypatch: pytest.MonkeyPatch, spelling: str) -> None:
    monkeypatch.setenv("KCACHE_MODE", spelling)
    cfg = ClientConfig.from_env(url="http://127.0.0.1:9")
    assert cfg.mode == "readonly" and cfg.enabled and not cfg.can_write


@pytest.mark.parametrize(("var", "value", "says"), [
    ("KCACHE_MODE", "read-onyl", "not a mode: use readwrite (or read-write, rw), readonly (or read-only, ro), or off"),
    ("KCACHE_MODE", "write", "not a mode"),
    ("KCACHE_MODE", "bogus", "not a mode"),
    ("KCACHE_LOCAL_MAX_BYTES", "10 gigs", "not a size; use bytes (1048576), or a number with a unit"),
    ("KCACHE_LOCAL_MAX_BYTES", "-1G", "a size must not be negative"),
    ("KCACHE_CHECK_TARGET", "flase", "not a switch: use 1 or 0"),
    ("KCACHE_TRITON_MANAGER", "nope", "not a switch"),
    ("KCACHE_REPORT", "2", "not a switch"),
    ("KCACHE_COORDESC_REUSE", "maybe", "not a switch"),
    ("KCACHE_CONNECT_TIMEOUT_S", "fast", "not a duration"),
    ("KCACHE_CONNECT_TIMEOUT_S", "0", "must be above 0s"),
    ("KCACHE_RETRIES", "one", "not a whole number"),
    ("KCACHE_UPLOAD_QUEUE", "0", "must be at least 1"),
    ("KCACHE_REQUIRE_HIT", "fial", "use warn, fail, or off"),
    ("KCACHE_LAYERS", "fx_graph", "unknown layer 'fx_graph'"),
    ("KCACHE_NAMESPACE", "Team/A", "a namespace must be 1-63 chars of [a-z0-9._-]"),
    ("KCACHE_URL", "not-a-url", "not a service URL: use http(s)://host[:port]"),
    ("KCACHE_URL", "http://kcache:8765/v1", "ends in /v1, the API's prefix: give the service's root (http://kcache:8765)"),
    ("KCACHE_GPU_ARCH", "H100", "not a GPU arch: use sm_90 (or 90) for NVIDIA, gfx90a for AMD"),
    ("KCACHE_CANARY", "5", "a fraction is from 0 to 1 (0 % to 100 %); write 5% for 5 percent"),
])
def test_install_refuses_a_setting_that_does_not_parse_naming_it(monkeypatch: pytest.MonkeyPatch, var: str, value: str, says: str) -> None:
    """Before: each of these fell back to its default silently (KCACHE_MODE=read-onyl uploaded)."""
    import kcache

    monkeypatch.setenv("KCACHE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        kcache.install()
    assert f"{var}={value!r}: {says}" in str(info.value)
    assert isinstance(info.value, ValueError)
    from kcache.current import get_runtime

    assert get_runtime() is None  # nothing was switched on


def test_a_gpu_arch_that_does_not_parse_is_never_the_local_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """``KCACHE_GPU_ARCH=H100`` was taken as the arch: every kernel (built for ``90``) mismatched."""
    for given, arch in (("sm_90", "sm_90"), (" 90 ", "90"), ("GFX90A", "gfx90a"), ("H100", None), ("", None)):
        monkeypatch.setenv("KCACHE_GPU_ARCH", given)
        assert config.gpu_arch_override() == arch


def test_install_arguments_parse_like_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KCACHE_MODE", raising=False)
    assert ClientConfig.from_env(mode="read-only", local_max_bytes="2GB").local_max_bytes == 2 * GB
    with pytest.raises(ConfigError, match="mode='read-onyl': not a mode"):
        ClientConfig.from_env(mode="read-onyl")
    with pytest.raises(TypeError, match="unknown options: mdoe"):
        ClientConfig.from_env(mdoe="readonly")


def test_typed_install_arguments_are_held_to_the_same_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, a number or bool given to install() skipped the parser: ``upload_queue=0`` and
    ``local_max_bytes=-5`` were taken as they came."""
    cfg = ClientConfig.from_env(url="http://127.0.0.1:9", connect_timeout_s=0.25, read_timeout_s=30, retries=0, check_target=False,
                                local_max_bytes=1e9, canary=1e-05)
    assert (cfg.connect_timeout_s, cfg.read_timeout_s, cfg.retries, cfg.check_target, cfg.local_max_bytes, cfg.canary) == (0.25, 30.0, 0, False, 10**9, 1e-05)
    for given, says in ((dict(upload_queue=0), "upload_queue=0: must be at least 1"),
                        (dict(local_max_bytes=-5), "local_max_bytes=-5: a size must not be negative"),
                        (dict(connect_timeout_s=float("nan")), "connect_timeout_s=nan: not a duration"),
                        (dict(canary=5), "canary=5: a fraction is from 0 to 1"),
                        (dict(retries=True), "retries=True: not a whole number")):
        with pytest.raises(ConfigError) as info:
            ClientConfig.from_env(**given)
        assert says in str(info.value)


def test_every_problem_is_named_at_once_and_empty_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCACHE_MODE", "ro-")
    monkeypatch.setenv("KCACHE_LOCAL_MAX_BYTES", "lots")
    with pytest.raises(ConfigError) as info:
        ClientConfig.from_env()
    assert "KCACHE_MODE='ro-'" in str(info.value) and "KCACHE_LOCAL_MAX_BYTES='lots'" in str(info.value)
    monkeypatch.setenv("KCACHE_MODE", "")
    monkeypatch.setenv("KCACHE_LOCAL_MAX_BYTES", " ")
    assert ClientConfig.from_env().mode == "readwrite"


def test_where_kcache_activates_by_itself_a_bad_setting_is_one_warning_and_off(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("KCACHE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("KCACHE_MODE", "read-onyl-for-this-test")  # a message of its own: warn_once is per process
    with caplog.at_level("WARNING", logger="kcache"):
        assert settings_or_off() is None
        assert settings_or_off() is None
    warnings = [r.getMessage() for r in caplog.records if "invalid settings" in r.getMessage()]
    assert len(warnings) == 1 and "KCACHE_MODE='read-onyl-for-this-test'" in warnings[0] and "kcache is off" in warnings[0]


def test_the_autoload_module_spells_modes_and_switches_as_config_does() -> None:
    """kcache._autoload may import nothing: its copies of the spellings must stay equal."""
    assert set(_autoload.MODES_ON) | {_autoload.MODE_OFF} == set(config.MODES)
    assert {m for m in _autoload.MODES_ON} == {k for k, v in config.MODES.items() if v != "off"}
    assert (set(_autoload.SWITCH_ON), set(_autoload.SWITCH_OFF)) == (set(config._TRUE), set(config._FALSE))


@pytest.mark.torch
def test_layers_kcache_layers_names_are_the_layers_kcache_serves() -> None:
    pytest.importorskip("torch")
    from kcache.layers import vllm_compile_cache as vllm_cache
    from kcache.layers.dynamo import packages as dynamo_cache
    from kcache.layers.inductor import remote_caches as remote_cache
    from kcache.layers.jit import layer as jit_layer

    assert set(config.SELECTABLE_LAYERS) == {*remote_cache.LAYERS, dynamo_cache.LAYER, jit_layer.LAYER, vllm_cache.LAYER}


# ---- service settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "says"), [
    ({"KCACHE_TOKENS": '[{"name":'}, "KCACHE_TOKENS: not JSON: Expecting value"),
    ({"KCACHE_TOKENS": '{"token": "x"}'}, "KCACHE_TOKENS: a JSON list of grants is expected"),
    ({"KCACHE_TOKENS": '[{"token": "short", "scopes": ["read"]}]'}, "KCACHE_TOKENS: [0].token: tokens must be at least 16 characters"),
    ({"KCACHE_MAX_PACK_BYTES": "lots"}, "KCACHE_MAX_PACK_BYTES='lots': not a size; use bytes"),
    ({"KCACHE_BODY_TIMEOUT_S": "soon"}, "KCACHE_BODY_TIMEOUT_S='soon': not a duration"),
    ({"KCACHE_PORT": "http"}, "KCACHE_PORT='http': Input should be a valid integer"),
])
def test_serve_refuses_a_bad_setting_naming_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str], says: str) -> None:
    monkeypatch.setenv("KCACHE_DATA_DIR", str(tmp_path))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as info:
        serve({})
    assert str(info.value).startswith("kcache: invalid settings: ") and says in str(info.value), info.value
    assert "short" not in str(info.value)  # a token is never echoed


# Every size and duration of the service, found from its settings model: a new ``*_bytes`` or ``*_s``
# setting that is a plain int or float (``64MiB`` refused, ``10G`` read differently) fails here.
SERVICE_SIZES = sorted(n for n, f in Settings.model_fields.items() if any(getattr(m, "func", None) is parse_bytes for m in f.metadata))
SERVICE_DURATIONS = sorted(n for n in Settings.model_fields if n.endswith("_s"))


def test_every_service_size_setting_is_in_the_one_grammar() -> None:
    assert sorted(n for n in Settings.model_fields if n.endswith("_bytes")) == SERVICE_SIZES
    assert {"max_pack_bytes", "max_unpacked_bytes", "max_entry_bytes", "memory_budget_bytes"} <= set(SERVICE_SIZES)


@pytest.mark.parametrize("name", SERVICE_SIZES)
def test_each_service_size_reads_binary_and_decimal_units_and_refuses_nonsense_by_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str) -> None:
    var = f"KCACHE_{name.upper()}"
    monkeypatch.setenv("KCACHE_DATA_DIR", str(tmp_path))
    for text, expected in (("10GiB", 10 * GIB), ("10GB", 10 * GB), ("10G", 10 * GIB), ("1048576", 1 << 20)):
        monkeypatch.setenv(var, text)
        assert getattr(Settings(), name) == expected, text
    monkeypatch.setenv(var, "10 gigs")
    with pytest.raises(SystemExit) as info:
        serve({})
    assert f"{var}='10 gigs': not a size; use bytes" in str(info.value), info.value


@pytest.mark.parametrize("name", SERVICE_DURATIONS)
def test_each_service_duration_takes_units_and_refuses_nonsense_by_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str) -> None:
    var = f"KCACHE_{name.upper()}"
    monkeypatch.setenv("KCACHE_DATA_DIR", str(tmp_path))
    for text in ("5m", "300"):
        monkeypatch.setenv(var, text)
        assert getattr(Settings(), name) == 300, text
    monkeypatch.setenv(var, "soon")
    with pytest.raises(SystemExit) as info:
        serve({})
    assert f"{var}='soon': not a duration" in str(info.value), info.value


@pytest.mark.parametrize(("var", "value", "says"), [
    # Before: read as a string and handed to logging at start-up (a traceback from dictConfig).
    ("KCACHE_LOG_LEVEL", "verbose", "KCACHE_LOG_LEVEL='verbose': Input should be 'trace', 'debug', 'info', 'warning', 'error' or 'critical'"),
    ("KCACHE_WORKERS", "0", "KCACHE_WORKERS='0': Input should be greater than or equal to 1"),
    ("KCACHE_PORT", "70000", "KCACHE_PORT='70000': Input should be less than or equal to 65535"),
    ("KCACHE_PRESIGN_EXPIRES_S", "1.5", "KCACHE_PRESIGN_EXPIRES_S='1.5': a whole number of seconds is needed"),
    # S3 refuses a presigned URL that lives longer than a week, at the node's GET: refused at start.
    ("KCACHE_PRESIGN_EXPIRES_S", "7d", "KCACHE_PRESIGN_EXPIRES_S (604800) + KCACHE_PRESIGN_REUSE_S (60) is longer than a presigned URL may live"),
])
def test_serve_refuses_other_nonsense_naming_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, var: str, value: str, says: str) -> None:
    monkeypatch.setenv("KCACHE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(var, value)
    with pytest.raises(SystemExit) as info:
        serve({})
    assert says in str(info.value), info.value


def test_the_metrics_usage_cache_is_a_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``KCACHE_METRICS_USAGE_TTL_S=often`` was read by the metrics module and fell back to 10 s."""
    from kcache_server.app import create_app

    monkeypatch.setenv("KCACHE_METRICS_USAGE_TTL_S", "1m")
    assert create_app(Settings(data_dir=tmp_path)).state.metrics.storage.ttl_s == 60.0
    monkeypatch.setenv("KCACHE_LOG_LEVEL", "WARNING")
    assert Settings(data_dir=tmp_path).log_level == "warning"


def test_service_sizes_and_durations_take_units(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KCACHE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("KCACHE_MAX_PACK_BYTES", "32MiB")
    monkeypatch.setenv("KCACHE_MEMORY_BUDGET_BYTES", "1GB")
    monkeypatch.setenv("KCACHE_BACKEND_TIMEOUT_S", "1500ms")
    s = Settings()
    assert (s.max_pack_bytes, s.memory_budget_bytes, s.backend_timeout_s) == (32 << 20, GB, 1.5)


# ---- real interpreters, a real service ------------------------------------------------------------


def _stored(url: str) -> int:
    return int(httpx.get(f"{url}/v1/default/stats/usage", timeout=HANG_S).json()["total"]["entries"])


def _job(node: Node, url: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A Triton user (tests/triton_kernel_job.py) activated by the .pth, in its own HOME."""
    return subprocess.run(
        [sys.executable, str(KERNEL_JOB)], capture_output=True, text=True, cwd=node.root, timeout=HANG_S, stdin=subprocess.DEVNULL,
        env=node.env(KCACHE_URL=url, KCACHE_WORKLOAD="settings", KERNEL_NUM_WARPS="4", KCACHE_STATS_FILE=str(node.root / "stats.json"), **env),
    )


@pytest.mark.slow
@pytest.mark.torch
def test_under_autoload_read_only_never_uploads_and_a_bad_mode_is_one_warning_and_off(live_service, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``KCACHE_MODE=read-only`` (an accepted spelling) reads and never uploads; ``read-onyl``
    (no mode) is one warning and kcache off; before, both meant readwrite and uploaded the kernel,
    its key parts and the workload. The readwrite run last shows the job does upload."""
    pytest.importorskip("triton")
    url = live_service.url
    for name, mode in (("read-only", "read-only"), ("typo", "read-onyl")):
        proc = _job(Node(tmp_path / name), url, KCACHE_MODE=mode)
        assert proc.returncode == 0 and '"cubin": true' in proc.stdout, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("kcache:")]  # not paths that name kcache
        if mode == "read-only":
            assert warnings == [], proc.stderr[-3000:]
        else:
            assert len(warnings) == 1, proc.stderr[-3000:]
            assert "KCACHE_MODE='read-onyl': not a mode" in warnings[0] and "kcache is off in this process" in warnings[0]
        assert _stored(url) == 0, f"KCACHE_MODE={mode} uploaded"
        stats = tmp_path / name / "stats.json"
        if mode == "read-only":  # kcache was on: it looked the kernel up, and put nothing
            doc = load_stats(stats)
            assert doc.layers["kernel"].lookups >= 1 and doc.totals().puts == 0, doc.layers
        else:
            assert not stats.exists()  # off: no stats either
    proc = _job(Node(tmp_path / "rw"), url, KCACHE_MODE="read-write")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _stored(url) > 0


@pytest.mark.torch
def test_a_job_that_only_builds_extensions_hears_of_a_bad_mode_once(tmp_path: Path) -> None:
    """Before, only Inductor's and Triton's imports said why kcache was off: a job that only
    builds extensions with ``KCACHE_MODE=bogus`` ran without kcache and without a word."""
    node = Node(tmp_path)
    proc = subprocess.run([sys.executable, "-c", "import torch.utils.cpp_extension; print('RESULT ok')"], capture_output=True, text=True,
                          cwd=node.root, timeout=HANG_S, stdin=subprocess.DEVNULL, env=node.env(KCACHE_URL="http://127.0.0.1:9", KCACHE_MODE="bogus"))
    assert proc.returncode == 0 and "RESULT ok" in proc.stdout, proc.stderr[-3000:]
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("kcache:")]
    assert len(warnings) == 1 and "KCACHE_MODE='bogus': not a mode" in warnings[0] and "kcache is off" in warnings[0], proc.stderr[-3000:]


# A user's job as a user writes it: kcache comes from the environment alone (the .pth).
COMPILE_JOB = "import torch; f = torch.compile(lambda x: (x.sin() + 1).sum()); print('RESULT', float(f(torch.ones(8))))"



def _compile(node: Node, url: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", COMPILE_JOB], capture_output=True, text=True, cwd=node.root, timeout=HANG_S,
                          stdin=subprocess.DEVNULL, env=node.env(KCACHE_URL=url, **env))


@pytest.mark.slow
@pytest.mark.torch
def test_an_inductor_job_under_autoload_never_uploads_when_read_only_or_refused(live_service, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``python -c 'import torch; torch.compile(...)'`` with ``KCACHE_URL``: ``KCACHE_MODE=read-only``
    looks up and uploads nothing (before #27 it meant readwrite); a size that does not parse is
    exactly one ``kcache:`` line naming the variable, the job exits 0, and nothing is uploaded
    (it also printed "automatic activation failed" and a traceback, from the extension-JIT hook).
    A bad mode under autoload: the Triton job above. The readwrite run last shows that this job
    does upload."""
    url = live_service.url
    cases = [("read-only", {"KCACHE_MODE": "read-only"}, None),
             ("size", {"KCACHE_LOCAL_MAX_BYTES": "10 gigs"}, "KCACHE_LOCAL_MAX_BYTES='10 gigs': not a size")]
    for name, settings, refused in cases:
        node = Node(tmp_path / name)
        # A loaded test machine answers late: a lookup that timed out would be a warning of its own.
        proc = _compile(node, url, KCACHE_WORKLOAD="settings", KCACHE_STATS_FILE=str(node.root / "stats.json"), KCACHE_READ_TIMEOUT_S="30s", **settings)
        assert proc.returncode == 0 and "RESULT 14.7" in proc.stdout, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("kcache:")]
        if refused is None:
            assert not [w for w in warnings if "settings" in w], proc.stderr[-3000:]  # read-only is a mode
            doc = load_stats(node.root / "stats.json")  # kcache was on: it looked the graph up, put nothing
            assert doc.layers["fx-graph"].lookups >= 1 and doc.totals().puts == 0, doc.layers
        else:
            assert len(warnings) == 1 and refused in warnings[0] and "kcache is off in this process" in warnings[0], proc.stderr[-3000:]
            assert not (node.root / "stats.json").exists()  # off: no stats either
        assert _stored(url) == 0, f"{settings} uploaded"
    proc = _compile(Node(tmp_path / "rw"), url, KCACHE_MODE="readwrite", KCACHE_READ_TIMEOUT_S="30s", KCACHE_FLUSH_TIMEOUT_S="2m")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _stored(url) > 0
