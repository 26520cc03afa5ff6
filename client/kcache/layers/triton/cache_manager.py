"""A tiered Triton cache manager: ``TRITON_CACHE_MANAGER=kcache.triton_manager:KcacheCacheManager``.

Local dir first (exactly Triton's ``FileCacheManager``); only on a local miss is the service asked,
and a hit is emitted with the verified emitter, so Triton then loads it as a local hit. After a
local compile, the finished dir is uploaded in the background; in Inductor's compile workers,
which are killed without exit handlers, at once (bounded by the client's deadlines and breaker). Triton's own ``RemoteCacheManager``
instead goes to the network on every lookup, even when the file is on local disk.

Triton also keeps its host-side helper modules in this cache: ``cuda_utils`` (the driver glue,
built when the driver starts) and ``__triton_launcher`` (one per kernel signature not launched by
Inductor's static launcher), C sources it builds with the host C compiler, a few hundred ms of
``gcc`` each on a fresh node. They are not kernel dirs (one ``.so``, no group file), so they travel
as opaque entries of the ``triton-module`` layer, keyed by Triton's cache key, the C library and the
file name (whose ``EXT_SUFFIX`` names the Python ABI): a module built against a newer glibc is
never handed to an older one.

Works for any Triton JIT user (vLLM, hand-written kernels) and for Inductor's compile workers,
which inherit the environment. Needs ``KCACHE_URL``; without it this is ``FileCacheManager``.
This module is imported by every process that loads a Triton kernel, Inductor's compile workers
included, so the client (pydantic, httpx) is imported only on a local miss, never for a hit.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kcache_schemas import wire
from triton.runtime.cache import FileCacheManager

from kcache.host.failopen import guard, warn_once
from kcache.host.process_roles import in_inductor_compile_worker
from kcache.layers.triton import kernel_key_parts

if TYPE_CHECKING:
    from kcache.runtime import Runtime

HOST_MODULE_LAYER = wire.CacheLayer.TRITON_MODULE.value
KERNEL_LAYER = wire.CacheLayer.KERNEL.value

# A Triton user without Inductor (no kcache.install()) reaches kcache first here: record the
# parts of the keys it computes from now on (the autoload hook does it from Triton's import on).
# Triton imports this module inside its compile: nothing here may raise.
with guard("could not hook Triton's cache key"):
    kernel_key_parts.install()


def is_host_module(filename: str) -> bool:
    """Triton's compiled C helpers (``cuda_utils.cpython-312-x86_64-linux-gnu.so``, ...); kernel
    dirs hold cubin/hsaco/json/IR files, never a shared object."""
    return filename.endswith(".so") and "/" not in filename


def host_module_key(cache_key: str, filename: str) -> str:
    libc, version = platform.libc_ver()
    return f"{cache_key}:{libc or 'libc'}{version or ''}:{filename}"


def _runtime() -> Runtime | None:
    from kcache.config import settings_or_off
    from kcache.current import ensure_runtime, get_runtime

    rt = get_runtime()
    if rt is None:
        config = settings_or_off()  # a setting that does not parse: one warning, local only
        if config is not None and config.enabled:
            rt = ensure_runtime(config)
    return rt


class KcacheCacheManager(FileCacheManager):  # type: ignore[misc]
    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override=override, dump=dump)
        # Override and dump dirs are debugging tools with their own semantics: leave them local.
        self._tiered = not override and not dump
        self._build_started: dict[str, float] = {}  # host module -> when its local miss was seen

    def get_file(self, filename: str) -> str | None:
        path: str | None = super().get_file(filename)
        if path is not None or not self._tiered or not is_host_module(filename):
            return path
        rt = _runtime()
        if rt is None:
            return None
        try:
            data = rt.get_entry(HOST_MODULE_LAYER, host_module_key(self.key, filename))
        except Exception as exc:
            warn_once("host module fetch failed", exc)
            data = None
        if data is None:
            self._build_started[filename] = time.perf_counter()  # Triton builds it next, then put()s it
            return None
        return super().put(data, filename, binary=True)  # type: ignore[no-any-return]  # atomic: temp file + rename

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        path: str = super().put(data, filename, binary=binary)
        if self._tiered and is_host_module(filename) and isinstance(data, bytes):
            rt = _runtime()
            if rt is not None:
                started = self._build_started.pop(filename, None)
                build_s = time.perf_counter() - started if started is not None else None
                try:
                    rt.put_entry(HOST_MODULE_LAYER, host_module_key(self.key, filename), data, build_s, now=in_inductor_compile_worker())
                except Exception as exc:
                    warn_once("host module upload failed", exc)
        return path

    def get_group(self, filename: str) -> dict[str, str] | None:
        group: dict[str, str] | None = super().get_group(filename)
        if group is not None or not self._tiered:
            return group
        rt = _runtime()
        if rt is None:
            return None
        from kcache.store.emitter import EmitOutcome

        audit: bool | None = None
        if rt.config.canary > 0:
            from kcache.layers import key_canary as canary

            with guard("kcache's canary could not audit a kernel hit; it is served"):
                audit = canary.kernel_audit(rt, self.key)
        if audit:
            return None  # Triton compiles it; put_group compares it with the pack kcache holds
        try:
            outcome = rt.fetch_kernel(self.key, Path(self.cache_dir).parent) if audit is None else None
        except Exception as exc:
            warn_once("kernel fetch failed", exc)
            return None
        if outcome in (EmitOutcome.EMITTED, EmitOutcome.EXISTING, EmitOutcome.REPAIRED):
            return super().get_group(filename)  # type: ignore[no-any-return]
        from kcache_schemas.key_diff import KeyComponents, from_parts

        from kcache.layers import require_hit

        missed = KeyComponents(layer=KERNEL_LAYER, key=self.key)
        with guard("could not record a kernel miss"):
            parts = kernel_key_parts.recall(self.key)
            if parts:
                missed = from_parts(KERNEL_LAYER, self.key, parts)
            if outcome is None:  # not a refusal (another GPU, an invalid pack): a miss to explain
                rt.record_miss(missed, now=in_inductor_compile_worker())
        # Triton compiles it next; KCACHE_REQUIRE_HIT=fail raises here on purpose.
        require_hit.compile_ahead(KERNEL_LAYER, missed)
        return None

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        path: str = super().put_group(filename, group)
        if self._tiered:
            rt = _runtime()
            if rt is not None and rt.config.canary > 0:
                from kcache.layers import key_canary as canary

                with guard("kcache's canary could not compare a kernel"):
                    if canary.kernel_compiled(rt, self.key, Path(self.cache_dir)):
                        return path  # an audited hit's own compile: compared, not uploaded
            if rt is not None:
                try:
                    # Inductor terminates its compile workers without running exit handlers,
                    # which would drop a queued upload: there, upload now (workers compile in
                    # parallel). Elsewhere in the background, off the compile path.
                    rt.kernel_compiled(self.key, Path(self.cache_dir).parent)
                    rt.upload_kernel_dir(self.key, Path(self.cache_dir), now=in_inductor_compile_worker())
                except Exception as exc:
                    warn_once("kernel upload failed", exc)
        return path
