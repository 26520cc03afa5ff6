"""``kcache doctor``: what this machine's kcache would do, and whether it can.

The effective settings with where each came from (an option, a ``KCACHE_*`` variable, the
default; a token's source, never the token), the layers a job would serve, the local tier and
this machine's stats, signing, the environment a job would be keyed by, then the service: whether
it answers, is ready, and takes this token on this namespace. Every finding that stops kcache
from working is listed at the end with what to do. Exit 0: nothing found; 1: a problem; 2: a
setting that does not parse (as every command).
"""

from __future__ import annotations

import importlib.util
import os
import site
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from kcache.config import ClientConfig, selected_layers
from kcache.version import __version__

DISTRIBUTIONS = ("kcache-server", "kcache-client")


@dataclass
class Checkup:
    rows: list[tuple[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def row(self, name: str, value: str) -> None:
        self.rows.append((name, value))

    def as_json(self) -> dict[str, Any]:
        return {"checks": dict(self.rows), "problems": self.problems, "notes": self.notes}

    def render(self) -> str:
        width = max(len(n) for n, _ in self.rows)
        lines = ["kcache doctor"] + [f"  {n:<{width}}  {v}" for n, v in self.rows]
        lines += [f"note: {n}" for n in self.notes]
        if self.problems:
            lines += [f"{len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}:"] + [f"  - {p}" for p in self.problems]
        else:
            lines.append("no problems found")
        return "\n".join(lines)


def _distribution() -> str:
    for dist in DISTRIBUTIONS:
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "not installed as a distribution (run from a source tree)"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _source(option: str | None, flag: str, var: str, default: str) -> str:
    if option:
        return flag
    if os.environ.get(var, "").strip():
        return var
    return default


def _autoload_pth() -> Path | None:
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    for d in dirs:
        candidate = Path(d) / "kcache_autoload.pth"
        if candidate.is_file():
            return candidate
    return None


def local_checks(c: Checkup, config: ClientConfig) -> None:
    from kcache_schemas.units import format_bytes

    from kcache.cli.local_tier import scan
    from kcache.reporting.report import machine_stats_path

    root = config.local_root()
    found = scan(root)
    files, size = len(found.files), found.size
    budget = format_bytes(config.local_max_bytes) if config.local_max_bytes else "unbounded"
    c.row("local tier", f"{root}  {files} files, {format_bytes(size)} of {budget} (KCACHE_LOCAL_DIR, KCACHE_LOCAL_MAX_BYTES; kcache local ls)")
    probe = root if root.exists() else next((p for p in root.parents if p.exists()), Path("/"))
    if not os.access(probe, os.W_OK):
        c.problems.append(f"the local tier {root} is not writable here: prefetch, warm and remote hits cannot be kept (set KCACHE_LOCAL_DIR)")
    stats = machine_stats_path(config)
    c.row("machine stats", f"{stats}" + ("" if stats.is_file() else " (none yet)") + "  (kcache stats)")


def settings_checks(c: Checkup, config: ClientConfig, url: str | None, token: str | None, namespace: str | None) -> None:
    c.row("url", f"{config.url or '-'}  ({_source(url, '--url', 'KCACHE_URL', 'not set')})")
    if not config.url:
        c.problems.append("no service URL: jobs do not activate kcache and commands have nothing to talk to (set KCACHE_URL=http(s)://host:port)")
    c.row("namespace", f"{config.namespace}  ({_source(namespace, '--namespace', 'KCACHE_NAMESPACE', 'the default')})")
    c.row("token", f"from {_source(token, '--token', 'KCACHE_TOKEN', '')}" if config.token else "none (an open server needs none)")
    c.row("mode", config.mode + ("" if config.mode != "off" else ": kcache does nothing in jobs (KCACHE_MODE)"))
    layers = selected_layers(config.layers)
    opt_in = " (bundled-autotune only where Inductor's switch is on, on a GPU)" if "bundled-autotune" in layers else ""
    c.row("layers", (", ".join(layers) + opt_in) if layers else "none (KCACHE_LAYERS=none)")
    c.row("triton manager", "on: TRITON_CACHE_MANAGER=kcache.triton_manager:KcacheCacheManager in jobs" if config.triton_manager else "off (KCACHE_TRITON_MANAGER=0)")
    pth = _autoload_pth()
    if not config.autoload:
        c.row("activation", "off: KCACHE_AUTOLOAD=0 (jobs need kcache.install())")
    elif pth is None:
        c.row("activation", "kcache_autoload.pth not found in this interpreter's site-packages: jobs need kcache.install()")
        c.notes.append("without kcache_autoload.pth, KCACHE_URL alone does not activate kcache in a job (pip install the distribution, not a copy of the sources)")
    else:
        c.row("activation", f"with KCACHE_URL set, at interpreter start ({pth})")
    if config.workload:
        c.row("workload", f"{config.workload} (KCACHE_WORKLOAD: recorded and prefetched)")
    if config.stats_file or config.run_id:
        c.row("stats", ", ".join(x for x in (f"file {config.stats_file}" if config.stats_file else "", f"run {config.run_id} (from {config.run_source or 'KCACHE_RUN_ID'})" if config.run_id else "") if x))


def signing_checks(c: Checkup, config: ClientConfig) -> None:
    parts = []
    if config.signing_private_key:
        parts.append("signs entries (KCACHE_SIGNING_PRIVATE_KEY)")
    if config.trusted_keys:
        parts.append("accepts only entries signed by KCACHE_TRUSTED_KEYS")
    if config.signing_key:
        parts.append("HMAC (KCACHE_SIGNING_KEY)")
    c.row("signing", "; ".join(parts) or "off: entries are neither signed nor checked")
    if (config.signing_private_key or config.trusted_keys) and importlib.util.find_spec("cryptography") is None:
        c.problems.append("Ed25519 signing is configured but cryptography is missing: every entry is refused, none uploaded (pip install cryptography)")


def environment_checks(c: Checkup) -> None:
    from kcache.config import gpu_arch_override

    c.row("environment", f"python {sys.version.split()[0]}, torch {_version('torch')}, triton {_version('triton')}"
          + (f", GPU {gpu_arch_override()} (KCACHE_GPU_ARCH)" if gpu_arch_override() else ""))


def service_checks(c: Checkup, config: ClientConfig) -> None:
    """Whether the service answers, is ready, and takes this token for reads on the namespace."""
    from kcache_schemas import wire

    from kcache.exceptions import AuthError, KcacheError, ServiceUnavailable
    from kcache.transport.http import KcacheClient

    client = KcacheClient(config)
    try:
        t0 = time.perf_counter()
        try:
            health = client.get_json("/healthz")
        except ServiceUnavailable as exc:
            c.row("service", f"not answering: {exc}")
            c.problems.append(f"the service at {config.url} does not answer: start it (kcache serve) or fix KCACHE_URL / --url; jobs run without kcache (fail-open)")
            return
        except KcacheError as exc:
            c.row("service", f"answers, but not as kcache does: {exc}")
            c.problems.append(f"{config.url} answers /healthz with {exc}: is it a kcache service's root URL?")
            return
        version = health.get("version", "?") if isinstance(health, dict) else "?"
        c.row("service", f"answers in {1000 * (time.perf_counter() - t0):.0f} ms: kcache {version}")
        try:
            ready = client.get_json("/readyz")
            c.row("storage", ", ".join(f"{k} {v}" for k, v in ready.get("checks", {}).items()) if isinstance(ready, dict) else "ready")
        except KcacheError as exc:
            c.row("storage", f"not ready: {exc}")
            c.problems.append("the service's storage backends do not answer (GET /readyz): reads and uploads fail until they do")
        try:
            client.get_json(wire.path(wire.KERNELS, namespace=config.namespace), limit=1)
            c.row("access", f"read on namespace {config.namespace!r}: ok")
        except AuthError as exc:
            c.row("access", f"refused: {exc}")
            c.problems.append(f"the service refuses this token on namespace {config.namespace!r}: {exc} (KCACHE_TOKEN / --token)")
        if client.server_open:
            c.row("auth", "the service has no tokens (open, loopback only)")
            if config.token:
                c.problems.append("a token is given but the service has no tokens: it is not checked (a wrong token passes; anyone on that host can write)")
    finally:
        client.close()


def checkup(url: str | None, token: str | None, namespace: str | None, *, offline: bool = False) -> Checkup:
    """Every check; raises :class:`kcache.exceptions.ConfigError` for settings that do not parse."""
    c = Checkup()
    config = ClientConfig.from_env(given_as=lambda name: "--" + name.replace("_", "-"), url=url, token=token, namespace=namespace)
    c.row("kcache", f"{__version__} ({_distribution()}) at {Path(__file__).parent}")
    settings_checks(c, config, url, token, namespace)
    local_checks(c, config)
    signing_checks(c, config)
    environment_checks(c)
    if config.url and not offline:
        service_checks(c, config)
    return c
