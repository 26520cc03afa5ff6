"""The per-process kcache runtime: one config, one HTTP client, one uploader, one Stats.

Everything the hooks call on the compile path goes through here and is *fail-open*: kcache
errors become counted errors and a ``None``/``False`` result, never an exception into torch or
Triton. Misses and errors are counted apart.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from kcache_schemas import KernelManifest, PackError, Producer

from kcache import __version__
from kcache.config import ClientConfig
from kcache.emitter import EmitOutcome, emit_files, emit_pack
from kcache.errors import InvalidPack, KcacheError, NotFound
from kcache.http import KcacheClient
from kcache.stats import Stats
from kcache.uploader import EntryUpload, KernelUpload, Uploader

log = logging.getLogger("kcache")
KERNEL_LAYER = "kernel"


def producer_info(compile_time_s: float | None = None) -> Producer:
    torch = sys.modules.get("torch")
    triton = sys.modules.get("triton")
    return Producer(
        kcache_version=__version__,
        torch_version=str(getattr(torch, "__version__", "")) or None if torch else None,
        triton_version=str(getattr(triton, "__version__", "")) or None if triton else None,
        compile_time_s=compile_time_s,
    )


class Runtime:
    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.stats = Stats()
        self.client: KcacheClient | None = KcacheClient(config) if config.enabled else None
        self.uploader: Uploader | None = (
            Uploader(self.client, self.stats, config.upload_queue) if self.client and config.can_write else None
        )
        # Keys this process compiled or used: for stats and workload manifests.
        self.used_kernels: set[str] = set()
        self.used_entries: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._warned: set[str] = set()

    def warn_once(self, what: str, exc: BaseException | None = None) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("kcache: %s%s (kcache stays out of the way)", what, f": {exc}" if exc else "")

    # ---- kernels --------------------------------------------------------------------------

    def note_kernel(self, key: str) -> None:
        with self._lock:
            self.used_kernels.add(key)

    def fetch_kernel(self, key: str, cache_dir: Path) -> EmitOutcome | None:
        """Fetch a kernel from the service and emit it into ``cache_dir``; None on miss/error."""
        if self.client is None:
            return None
        with self.stats.timed(KERNEL_LAYER):
            try:
                pack = self.client.get_pack(key)
            except NotFound:
                self.stats.miss(KERNEL_LAYER, "not_found")
                return None
            except KcacheError as exc:
                self.stats.error(KERNEL_LAYER, type(exc).__name__)
                return None
            try:
                outcome = emit_pack(cache_dir, pack, expected_key=key, check_target=self.config.check_target)
            except (PackError, InvalidPack) as exc:
                self.warn_once(f"refused an invalid pack for {key}", exc)
                self.stats.error(KERNEL_LAYER, "invalid_pack")
                return None
            except OSError as exc:
                self.stats.error(KERNEL_LAYER, "emit_failed")
                self.warn_once(f"could not write into {cache_dir}", exc)
                return None
        self._count_emit(outcome, len(pack))
        self.note_kernel(key)
        return outcome

    def emit_local(self, cache_dir: Path, manifest: KernelManifest, files: Mapping[str, bytes]) -> EmitOutcome:
        """Emit files we already hold (an Inductor bundle); raises on failure for the caller's fallback."""
        outcome = emit_files(cache_dir, manifest, files, check_target=self.config.check_target, verified=True)
        self.note_kernel(manifest.key)
        return outcome

    def _count_emit(self, outcome: EmitOutcome, nbytes: int) -> None:
        if outcome is EmitOutcome.SKIPPED_TARGET:
            self.stats.skipped(KERNEL_LAYER, "target_mismatch")
        else:
            self.stats.hit(KERNEL_LAYER, nbytes)

    def upload_kernel(self, key: str, files: Mapping[str, bytes], compile_time_s: float | None = None) -> None:
        self.note_kernel(key)
        if self.uploader is not None:
            self.uploader.submit(KernelUpload(key, dict(files), producer_info(compile_time_s)))

    def missing_kernels(self, keys: Iterable[str]) -> list[str] | None:
        if self.client is None:
            return None
        try:
            return self.client.missing(keys)
        except KcacheError as exc:
            self.stats.error(KERNEL_LAYER, type(exc).__name__)
            return None

    # ---- opaque entries -------------------------------------------------------------------

    def get_entry(self, layer: str, key: str) -> bytes | None:
        if self.client is None:
            return None
        with self.stats.timed(layer):
            try:
                data, compile_time = self.client.get_entry(layer, key)
            except NotFound:
                self.stats.miss(layer, "not_found")
                return None
            except KcacheError as exc:
                self.stats.error(layer, type(exc).__name__)
                return None
        self.stats.hit(layer, len(data), compile_time or 0.0)
        with self._lock:
            self.used_entries.add((layer, key))
        return data

    def put_entry(self, layer: str, key: str, data: bytes, compile_time_s: float | None = None) -> None:
        with self._lock:
            self.used_entries.add((layer, key))
        if self.uploader is not None:
            self.uploader.submit(EntryUpload(layer, key, data, compile_time_s))

    # ---- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.uploader is not None and not self.uploader.flush(self.config.flush_timeout_s):
            self.warn_once(f"uploads still pending after {self.config.flush_timeout_s}s at exit; dropped")
        if self.client is not None:
            self.client.close()


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def get_runtime() -> Runtime | None:
    return _runtime


def start_runtime(config: ClientConfig) -> Runtime:
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.close()
        _runtime = Runtime(config)
        return _runtime


def stop_runtime() -> None:
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.close()
        _runtime = None


atexit.register(stop_runtime)
