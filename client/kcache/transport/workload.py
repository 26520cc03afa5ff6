"""Workloads: record what a job used, publish it at exit, prefetch it in the next job.

With ``KCACHE_WORKLOAD=<name>`` the prefetcher starts at interpreter start (from the ``.pth``
hook), in a background thread, so downloads overlap Python imports and model construction:
kernel packs and entries are pulled in bulk into kcache's local tier. The compile path waits only
for an entry or kernel it needs that the manifest promises and that has not arrived yet (bounded
by ``KCACHE_PREFETCH_WAIT_S``); anything else goes straight to the network.

**Deadlines.** The manifest (the workload's view, which the service merges from the runs it
recorded) is asked for under ``KCACHE_PREFETCH_TIMEOUT_S``, not the compile path's read deadline:
nothing but the prefetch waits for it, and a loaded service that takes a few seconds to merge it
should delay the prefetch, not fail it. A compile that needs the manifest meanwhile waits for it
no longer than it would for an answer of its own (``KCACHE_CONNECT_TIMEOUT_S`` +
``KCACHE_READ_TIMEOUT_S`` after it was asked for), then goes to the network. The downloads keep
the compile path's deadline: a compile waits for a promised entry until it arrives or its
download fails, and the job's exit waits for the downloads in flight.

**Once per node.** The processes of a node share the local tier, however they were started: the
first to start prefetches the workload under the tier's claim (:meth:`LocalEntryStore.
prefetch_claim`, a ``flock`` the kernel releases if the process dies); the others fetch only the
small manifest and wait for the tier to fill, their compile path reading each entry as it lands.
When the claim frees (the prefetch ended, or its process died halfway), the next process takes
it and pulls what is still missing: a prefetch skips whatever the tier already holds, so a killed
prefetcher costs the node one retry of what it had in flight, never a second download of the rest.

**Bytes from the object store.** Where the service hands out presigned URLs (its workload view
says ``wire.DOWNLOADS``: ``presigned``), packs come from S3 by the URLs of one
``kernels:batch-urls`` and entries by those of one ``entries:batch-urls``, 8 at a time: the API
tier answers the index, S3 sends the bytes (an entry's checked against the sha256 the service
listed). Packs without a URL, and a URL that failed, are fetched in one batch-get through the
service; entries by their GET (a service older than ``entries:batch-urls``: every entry so).

Kernels are *not* written into a Triton cache dir here: which dir is right (``TRITON_CACHE_DIR``,
Inductor's per-device ``<cache>/triton/<device>``, Triton's ``~/.triton/cache``) is known only to
the code that asks for the kernel, and learning Inductor's from this thread would mean calling
into torch while the main thread may still be importing it. The thread that asks (Triton's cache
manager, on its local miss) emits the pack from the local tier into its own dir; once Inductor
is imported, :mod:`kcache.layers.inductor.kernel_preemit` writes the prefetched packs into the dir
Inductor will most likely use, ahead of its first ask.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from kcache_schemas import PackError, wire
from kcache_schemas.models import EntryUrl, WorkloadManifest, WorkloadView

from kcache.exceptions import KcacheError, NotFound
from kcache.host.after_import import KCACHE_THREAD_PREFIX
from kcache.store.emitter import emit_pack
from kcache.store.fingerprint import current, packages
from kcache.store.local_store import LocalEntryStore
from kcache.transport.http import KcacheClient

log = logging.getLogger("kcache.transport.workload")
KERNEL_LAYER = wire.CacheLayer.KERNEL.value
# A process that follows another's prefetch looks for a promised entry in the tier this often,
# and tries the claim again after this long (it frees when the prefetch ends or its process dies).
_TIER_POLL_S = 0.02
_FOLLOW_POLL_S = 1.0
# Presigned pack downloads: this many at once (as the entries), at most this many in flight or
# downloaded and not yet written to the tier.
_URL_FETCHES = 8
_URL_WINDOW = 16


def fetch_view(client: KcacheClient, name: str, read_timeout_s: float | None = None) -> WorkloadView | None:
    try:
        return client.workload_view(name, current().id, read_timeout_s)
    except NotFound:
        return None


def _packs(client: KcacheClient, keys: list[str]) -> Iterator[tuple[str, bytes]]:
    """``(key, pack)`` for each of ``keys`` the service stores, in no set order: straight from
    the object store where the service hands out presigned URLs (the bytes skip the API tier;
    ``_URL_FETCHES`` at a time, at most ``_URL_WINDOW`` held), the rest, and any URL that failed,
    in one batch-get through the service."""
    if not keys:
        return
    if not client.presigned_downloads:
        yield from client.batch_get(keys)
        return
    answer = client.batch_urls(keys)
    retry = list(answer.inline)
    todo = iter(answer.urls.items())
    try:
        with ThreadPoolExecutor(max_workers=_URL_FETCHES, thread_name_prefix=KCACHE_THREAD_PREFIX + "prefetch") as pool:
            pending: dict[Future[bytes], str] = {}
            while True:
                while len(pending) < _URL_WINDOW and (item := next(todo, None)) is not None:
                    pending[pool.submit(client.get_url, item[1])] = item[0]
                if not pending:
                    break
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    key = pending.pop(future)
                    try:
                        pack = future.result()
                    except KcacheError:
                        retry.append(key)  # gone from the store, expired, unreachable: the service may have it
                        continue
                    yield key, pack
    except RuntimeError:
        if not sys.is_finalizing() and not shutting_down():
            raise
        return
    if retry:
        yield from client.batch_get(retry)


def publish(client: KcacheClient, name: str, kernels: set[str], entries: set[tuple[str, str]]) -> None:
    manifest = WorkloadManifest.model_validate(
        {"name": name, "fingerprint": current().model_dump(), "kernels": sorted(kernels),
         "entries": [{"layer": layer, "key": key} for layer, key in sorted(entries)]}
    )
    client.put_json(wire.path(wire.WORKLOAD, namespace=client.config.namespace, name=name), manifest.model_dump_json())


def pull_workload(
    client: KcacheClient, view: WorkloadView, local: LocalEntryStore, dest: Path | None = None,
    *, check_target: bool = True, on_entry: Callable[[str, str], None] | None = None,
    on_stored: Callable[[str, str], None] | None = None,
) -> dict[str, int]:
    """Download a workload's kernel packs and entries that ``local`` lacks into it (and, with
    ``dest``, emit every kernel into that Triton cache dir too); returns counts (``local``: those
    the tier already held, e.g. from another process of the node). ``on_entry(layer, key)`` is
    called as each arrives, fails or is found local (kernels as layer ``kernel``);
    ``on_stored(layer, key)`` before that, for each this pull wrote into ``local``."""
    counts = {"kernels": 0, "kernel_bytes": 0, "entries": 0, "entry_bytes": 0, "refused": 0, "local": 0}
    wanted: list[str] = []
    for key in view.kernels:
        if not local.has(KERNEL_LAYER, key):
            wanted.append(key)
            continue
        counts["local"] += 1
        try:
            if dest is not None and (pack := local.get(KERNEL_LAYER, key)) is not None:
                emit_pack(dest, pack, expected_key=key, check_target=check_target)
        except (PackError, OSError) as exc:
            counts["refused"] += 1
            log.warning("kcache: prefetch refused kernel %s: %s", key, exc)
        finally:
            if on_entry is not None:
                on_entry(KERNEL_LAYER, key)
    try:
        for key, pack in _packs(client, wanted):
            try:
                if dest is not None:
                    emit_pack(dest, pack, expected_key=key, check_target=check_target)
                local.put(KERNEL_LAYER, key, pack)  # verified again when emitted
                if on_stored is not None:
                    on_stored(KERNEL_LAYER, key)
                counts["kernels"] += 1
                counts["kernel_bytes"] += len(pack)
            except (PackError, OSError) as exc:
                counts["refused"] += 1
                log.warning("kcache: prefetch refused kernel %s: %s", key, exc)
            finally:
                if on_entry is not None:
                    on_entry(KERNEL_LAYER, key)
    except KcacheError as exc:
        log.warning("kcache: prefetching kernels stopped: %s", exc)

    lock = threading.Lock()

    def keep(layer: str, key: str, data: bytes) -> None:
        local.put(layer, key, data)
        if on_stored is not None:
            on_stored(layer, key)
        with lock:  # eight fetch threads share the counts
            counts["entries"] += 1
            counts["entry_bytes"] += len(data)

    def fetch(ref: tuple[str, str]) -> None:
        layer, key = ref
        try:
            data, _compile_time = client.get_entry(layer, key)
            keep(layer, key, data)
        except KcacheError:
            pass
        finally:
            if on_entry is not None:
                on_entry(layer, key)

    def fetch_url(entry: EntryUrl) -> None:
        try:
            data = client.get_url(entry.url)
        except KcacheError:
            data = None  # expired, gone from the store, unreachable: the service may still serve it
        if data is None or hashlib.sha256(data).hexdigest() != entry.sha256:
            fetch((entry.layer, entry.key))
            return
        try:
            keep(entry.layer, entry.key, data)
        finally:
            if on_entry is not None:
                on_entry(entry.layer, entry.key)

    refs = []
    for e in view.entries:
        if local.has(e.layer, e.key):
            counts["local"] += 1
            if on_entry is not None:
                on_entry(e.layer, e.key)
        else:
            refs.append((e.layer, e.key))
    jobs: list[Callable[[], None]] = []
    if refs and client.presigned_downloads:
        try:
            urls = client.batch_entry_urls(refs)
        except KcacheError:
            urls = None  # a service older than entries:batch-urls, or a failed ask: one GET each
        if urls is not None:
            gone = {(e.layer, e.key) for e in urls.missing}
            signed = {(u.layer, u.key) for u in urls.urls}
            for layer, key in gone:
                if on_entry is not None:
                    on_entry(layer, key)
            jobs += [functools.partial(fetch_url, u) for u in urls.urls]
            refs = [ref for ref in refs if ref not in gone and ref not in signed]
    jobs += [functools.partial(fetch, ref) for ref in refs]
    try:
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix=KCACHE_THREAD_PREFIX + "prefetch") as pool:
            list(pool.map(lambda job: job(), jobs))
    except RuntimeError:
        # The interpreter is shutting down (the job ended before the prefetch did): nothing
        # here is worth delaying its exit for, or telling it about.
        if not sys.is_finalizing() and not shutting_down():
            raise
    return counts


def shutting_down() -> bool:
    """True once ``threading`` began the interpreter's shutdown (new executor work is refused)."""
    from concurrent.futures import thread

    return bool(getattr(thread, "_shutdown", False))


class Prefetcher:
    """Runs ``pull_workload`` in the background and lets the compile path wait for one entry.

    Under the node's claim on the workload: a process that finds it taken (``following``) waits
    for the claim instead of downloading, and its compile path finds promised entries in the tier
    as the claim's holder writes them."""

    def __init__(self, client: KcacheClient, name: str, local: LocalEntryStore, wait_s: float = 30.0,
                 manifest_timeout_s: float | None = None) -> None:
        self.name = name
        self._client, self._local = client, local
        config = client.config
        # The manifest's own read deadline (off the compile path), and how long after it was asked
        # for a compile stops waiting for it: as long as a request of the compile path's own.
        self._manifest_timeout_s = max(manifest_timeout_s or 0.0, config.read_timeout_s)
        self._on_path_s = config.connect_timeout_s + config.read_timeout_s
        self._manifest_asked = threading.Event()
        self._manifest_asked_at = 0.0
        self.manifest_ready = threading.Event()
        self.done = threading.Event()
        self.view: WorkloadView | None = None
        self.miss_hint: str | None = None
        self.counts: dict[str, int] = {}
        self.seconds = 0.0
        self._pending: dict[tuple[str, str], threading.Event] = {}
        # What this prefetch wrote into the local tier: a hit on one is served by the prefetch
        # (kcache.store.tiered_store), whether or not the compile had to wait for it.
        self._brought: set[tuple[str, str]] = set()
        self._brought_lock = threading.Lock()
        self._wait_s = wait_s
        self.following = False  # another process of the node holds the claim (or held it first)
        self._thread = threading.Thread(target=self._run, name="kcache-prefetch", daemon=True)
        packages()  # here, not on the prefetch thread: it may import (see kcache.store.fingerprint)

    def start(self) -> Prefetcher:
        self._thread.start()
        return self

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            current()  # the fingerprint is computed before the manifest's deadline starts
            self._asked_manifest()
            view = fetch_view(self._client, self.name, self._manifest_timeout_s)
            if view is not None and view.runs == 0 and view.other_fingerprints:
                me = current()
                self.miss_hint = "environment differs from workload's earlier runs: " + "; ".join(me.diff(fp) for fp in view.other_fingerprints)
            claim = None
            if view is not None and view.runs:
                promised = [(KERNEL_LAYER, k) for k in view.kernels] + [(e.layer, e.key) for e in view.entries]
                self._pending = {ref: threading.Event() for ref in promised}
                claim = self._local.prefetch_claim(self.name, current().id)
                self.following = not claim.held
            self.view = view
            self.manifest_ready.set()
            if view is not None and claim is not None:
                while not claim.held:
                    # Another process of the node prefetches this workload into the tier: wait
                    # for it to finish or die, then pull what is still missing (nothing, mostly).
                    claim = self._local.prefetch_claim(self.name, current().id, wait_s=_FOLLOW_POLL_S)
                try:
                    self.counts = pull_workload(self._client, view, self._local, on_entry=self._arrived, on_stored=self._stored)
                finally:
                    claim.release()
        except Exception as exc:
            if not (sys.is_finalizing() or shutting_down()):
                log.warning("kcache: workload prefetch failed: %s", exc)
        finally:
            self._asked_manifest()
            self.manifest_ready.set()
            for event in self._pending.values():
                event.set()
            self.seconds = time.perf_counter() - t0
            self.done.set()

    def _asked_manifest(self) -> None:
        if not self._manifest_asked.is_set():
            self._manifest_asked_at = time.monotonic()
            self._manifest_asked.set()

    def _wait_manifest(self) -> bool:
        """Wait for the manifest at most ``KCACHE_PREFETCH_WAIT_S``, and no longer than the
        on-path deadline after it was asked for: its request may take up to
        ``KCACHE_PREFETCH_TIMEOUT_S``, a compile must not (until it arrives, lookups go to the
        network at once)."""
        deadline = time.monotonic() + self._wait_s
        if not self._manifest_asked.wait(self._wait_s):
            return False
        until = min(deadline, self._manifest_asked_at + self._on_path_s)
        return self.manifest_ready.wait(max(0.0, until - time.monotonic()))

    def _stored(self, layer: str, key: str) -> None:
        with self._brought_lock:
            self._brought.add((layer, key))

    def brought(self, layer: str, key: str) -> bool:
        """True if this prefetch wrote the item into the local tier."""
        with self._brought_lock:
            return (layer, key) in self._brought

    def _arrived(self, layer: str, key: str) -> None:
        event = self._pending.get((layer, key))
        if event is not None:
            event.set()

    def wait_for(self, layer: str, key: str) -> bool:
        """True if the entry is promised by the manifest and has now arrived (or failed), here
        or, while another process of the node prefetches, in the local tier."""
        if not self._wait_manifest():
            return False
        event = self._pending.get((layer, key))
        if event is None:
            return False
        if not self.following:
            return event.wait(self._wait_s)
        deadline = time.monotonic() + self._wait_s
        while not event.wait(min(_TIER_POLL_S, max(0.0, deadline - time.monotonic()))):
            if self._local.has(layer, key):
                return True
            if time.monotonic() >= deadline:
                return False
        return True
