"""Workloads: record what a job used, publish it at exit, prefetch it in the next job.

With ``KCACHE_WORKLOAD=<name>`` the prefetcher starts at interpreter start (from the ``.pth``
hook), in a background thread, so downloads overlap Python imports and model construction:
kernels are pulled in bulk into the Triton cache dir, entries into kcache's local tier. The
compile path waits only for an entry it needs that the manifest promises and that has not arrived
yet (bounded by ``KCACHE_PREFETCH_WAIT_S``); anything else goes straight to the network.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kcache_schemas import PackError
from kcache_schemas.models import WorkloadManifest, WorkloadView

from kcache.dirs import triton_cache_dir
from kcache.emitter import emit_pack
from kcache.errors import KcacheError, NotFound
from kcache.fingerprint import current
from kcache.http import KcacheClient
from kcache.local_store import LocalEntryStore

log = logging.getLogger("kcache.workload")


def fetch_view(client: KcacheClient, name: str) -> WorkloadView | None:
    try:
        body = client.get_json(f"/v1/{client.config.namespace}/workloads/{name}", fingerprint=current().id)
    except NotFound:
        return None
    return WorkloadView.model_validate(body)


def publish(client: KcacheClient, name: str, kernels: set[str], entries: set[tuple[str, str]]) -> None:
    manifest = WorkloadManifest.model_validate(
        {"name": name, "fingerprint": current().model_dump(), "kernels": sorted(kernels),
         "entries": [{"layer": layer, "key": key} for layer, key in sorted(entries)]}
    )
    client.put_json(f"/v1/{client.config.namespace}/workloads/{name}", manifest.model_dump_json())


def pull_workload(
    client: KcacheClient, view: WorkloadView, dest: Path, local: LocalEntryStore,
    *, check_target: bool = True, on_entry: Callable[[str, str], None] | None = None,
) -> dict[str, int]:
    """Download a workload's kernels into ``dest`` and entries into ``local``; returns counts."""
    counts = {"kernels": 0, "kernel_bytes": 0, "entries": 0, "entry_bytes": 0, "refused": 0}
    for key, pack in client.batch_get(view.kernels):
        try:
            emit_pack(dest, pack, expected_key=key, check_target=check_target)
            counts["kernels"] += 1
            counts["kernel_bytes"] += len(pack)
        except (PackError, OSError) as exc:
            counts["refused"] += 1
            log.warning("kcache: prefetch refused kernel %s: %s", key, exc)

    lock = threading.Lock()

    def fetch(ref: tuple[str, str]) -> None:
        layer, key = ref
        try:
            data, _compile_time = client.get_entry(layer, key)
            local.put(layer, key, data)
            with lock:  # eight fetch threads share the counts
                counts["entries"] += 1
                counts["entry_bytes"] += len(data)
        except KcacheError:
            pass
        finally:
            if on_entry is not None:
                on_entry(layer, key)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(fetch, [(e.layer, e.key) for e in view.entries]))
    return counts


class Prefetcher:
    """Runs ``pull_workload`` in the background and lets the compile path wait for one entry."""

    def __init__(self, client: KcacheClient, name: str, local: LocalEntryStore, check_target: bool) -> None:
        self.name = name
        self._client, self._local, self._check_target = client, local, check_target
        self.manifest_ready = threading.Event()
        self.done = threading.Event()
        self.view: WorkloadView | None = None
        self.miss_hint: str | None = None
        self.counts: dict[str, int] = {}
        self.seconds = 0.0
        self._pending: dict[tuple[str, str], threading.Event] = {}
        self._wait_s = float(os.environ.get("KCACHE_PREFETCH_WAIT_S", "30"))
        self._thread = threading.Thread(target=self._run, name="kcache-prefetch", daemon=True)

    def start(self) -> Prefetcher:
        self._thread.start()
        return self

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            view = fetch_view(self._client, self.name)
            if view is not None and view.runs == 0 and view.other_fingerprints:
                me = current()
                self.miss_hint = "environment differs from workload's earlier runs: " + "; ".join(me.diff(fp) for fp in view.other_fingerprints)
            if view is not None:
                self._pending = {(e.layer, e.key): threading.Event() for e in view.entries}
            self.view = view
            self.manifest_ready.set()
            if view is not None and view.runs:
                self.counts = pull_workload(
                    self._client, view, triton_cache_dir(), self._local,
                    check_target=self._check_target, on_entry=self._arrived,
                )
        except Exception as exc:
            log.warning("kcache: workload prefetch failed: %s", exc)
        finally:
            self.manifest_ready.set()
            for event in self._pending.values():
                event.set()
            self.seconds = time.perf_counter() - t0
            self.done.set()

    def _arrived(self, layer: str, key: str) -> None:
        event = self._pending.get((layer, key))
        if event is not None:
            event.set()

    def wait_for(self, layer: str, key: str) -> bool:
        """True if the entry is promised by the manifest and has now arrived (or failed)."""
        if not self.manifest_ready.wait(self._wait_s):
            return False
        event = self._pending.get((layer, key))
        return event is not None and event.wait(self._wait_s)
