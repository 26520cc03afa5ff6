"""A tiered Triton cache manager: ``TRITON_CACHE_MANAGER=kcache.triton_manager:KcacheCacheManager``.

Local dir first (exactly Triton's ``FileCacheManager``); only on a local miss is the service asked,
and a hit is emitted with the verified emitter, so Triton then loads it as a local hit. After a
local compile, the finished dir is uploaded in the background; in Inductor's compile workers,
which are killed without exit handlers, at once (bounded by the client's deadlines and breaker). Triton's own ``RemoteCacheManager``
instead goes to the network on every lookup, even when the file is on local disk.

Works for any Triton JIT user (vLLM, hand-written kernels) and for Inductor's compile workers,
which inherit the environment. Needs ``KCACHE_URL``; without it this is ``FileCacheManager``.
This module is imported by every process that loads a Triton kernel, Inductor's compile workers
included, so the client (pydantic, httpx) is imported only on a local miss, never for a hit.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from triton.runtime.cache import FileCacheManager

from kcache._process import in_inductor_compile_worker

if TYPE_CHECKING:
    from kcache.runtime import Runtime


def _runtime() -> Runtime | None:
    from kcache.config import ClientConfig
    from kcache.runtime import ensure_runtime, get_runtime

    rt = get_runtime()
    if rt is None:
        config = ClientConfig.from_env()
        if config.enabled:
            rt = ensure_runtime(config)
    return rt


class KcacheCacheManager(FileCacheManager):  # type: ignore[misc]
    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override=override, dump=dump)
        # Override and dump dirs are debugging tools with their own semantics: leave them local.
        self._tiered = not override and not dump

    def get_group(self, filename: str) -> dict[str, str] | None:
        group: dict[str, str] | None = super().get_group(filename)
        if group is not None or not self._tiered:
            return group
        rt = _runtime()
        if rt is None:
            return None
        from kcache.emitter import EmitOutcome

        try:
            outcome = rt.fetch_kernel(self.key, Path(self.cache_dir).parent)
        except Exception as exc:
            rt.warn_once("kernel fetch failed", exc)
            return None
        if outcome in (EmitOutcome.EMITTED, EmitOutcome.EXISTING, EmitOutcome.REPAIRED):
            return super().get_group(filename)  # type: ignore[no-any-return]
        return None

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        path: str = super().put_group(filename, group)
        if self._tiered:
            rt = _runtime()
            if rt is not None:
                try:
                    # Inductor terminates its compile workers without running exit handlers,
                    # which would drop a queued upload: there, upload now (workers compile in
                    # parallel). Elsewhere in the background, off the compile path.
                    rt.upload_kernel_dir(self.key, Path(self.cache_dir), now=in_inductor_compile_worker())
                except Exception as exc:
                    rt.warn_once("kernel upload failed", exc)
        return path
