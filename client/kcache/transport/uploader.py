"""Background uploads: never on the compile path.

A bounded queue feeds one daemon thread. Everything an upload costs happens in that thread: a
kernel dir is read, hashed and packed (zstd) there, an entry's stored form made there (Inductor's
JSON turned into kcache's envelope, the signature); the compile path only queues. Kernels are
checked with one ``kernels:missing`` call per batch so only what the service lacks is packed and
sent. When the queue is full new work is dropped and counted rather than blocking a compile.

**Quiet moments.** The thread is still Python: it takes the GIL (and a core) from the compile it
would overlap, and the service it feeds is the one that answers the compile's lookups (a populating
max-autotune node spent 47 ms per kernel miss with uploads alongside; bench/populate_overhead.py:
kcache's lookup time halved when they waited). So it sends only once the compile path has been
quiet for ``QUIET_S`` (kcache's hooks mark it busy:
:meth:`Uploader.compile_activity`), unless the queue is half full; a ``flush`` (at exit) sends at
once, everything left, whatever the compile path does. At exit, ``flush`` waits at most
``flush_timeout_s``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kcache_schemas import PackError, Producer, wire
from kcache_schemas.pack import build_pack, manifest_for_files, read_kernel_dir

from kcache.exceptions import Conflict, KcacheError
from kcache.host.failopen import warn_once
from kcache.store.counters import Stats
from kcache.transport.http import KcacheClient

log = logging.getLogger("kcache.transport.uploader")
_BATCH = 64
_KERNEL = wire.CacheLayer.KERNEL.value
_POLL_S = 0.02
# The compile path counts as busy this long after kcache's last hook ran on it.
QUIET_S = 0.5


@dataclass(frozen=True)
class KernelUpload:
    key: str
    files: Mapping[str, bytes]  # [REPLACE] form
    producer: Producer


@dataclass(frozen=True)
class KernelDirUpload:
    """A kernel dir on disk, read in the uploader thread (not on the compile path)."""

    key: str
    path: Path
    producer: Producer


@dataclass(frozen=True)
class EntryUpload:
    """``payload()`` makes the stored bytes (encoding, signature) in the thread that sends them,
    once; None: not to be sent (the maker counted why)."""

    layer: str
    key: str
    payload: Callable[[], bytes | None]
    compile_time_s: float | None


class Uploader:
    def __init__(self, client: KcacheClient, stats: Stats, maxsize: int, on_uploaded: Callable[[str], None] | None = None) -> None:
        self._client, self._stats = client, stats
        self._queue: queue.Queue[KernelUpload | KernelDirUpload | EntryUpload] = queue.Queue(maxsize=maxsize)
        self._seen: set[tuple[str, str]] = set()
        self._seen_lock = threading.Lock()
        self._on_uploaded = on_uploaded
        self._last_activity = 0.0  # monotonic time of the compile path's last kcache hook
        self._urgent = max(1, maxsize // 2)  # this many queued: send without waiting for quiet
        self._flushing = 0  # flush() calls waiting: send everything now
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="kcache-uploader", daemon=True)
        self._thread.start()

    def _first_time(self, item: KernelUpload | KernelDirUpload | EntryUpload) -> bool:
        ident = (item.layer, item.key) if isinstance(item, EntryUpload) else (_KERNEL, item.key)
        with self._seen_lock:
            if ident in self._seen:
                return False  # already queued or sent by this process
            self._seen.add(ident)
            return True

    def compile_activity(self) -> None:
        """The compile path ran a kcache hook: uploads wait until it has been quiet for ``QUIET_S``.
        One float stored (atomic under the GIL): cheap enough for every hook."""
        self._last_activity = time.monotonic()

    def _wait_for_quiet(self) -> None:
        """Return once the compile path has been quiet for ``QUIET_S``, the queue is half full,
        or a flush asks for everything."""
        while not self._flushing and self._queue.qsize() < self._urgent:
            quiet_for = time.monotonic() - self._last_activity
            if quiet_for >= QUIET_S:
                return
            with self._wake:
                if not self._flushing:
                    self._wake.wait(QUIET_S - quiet_for)

    def send_now(self, item: KernelUpload | KernelDirUpload | EntryUpload) -> None:
        """Upload in the calling thread, for processes that may be killed without running exit
        handlers (Inductor terminates its compile workers): bounded by the client's deadlines
        and skipped while the breaker is open."""
        if self._first_time(item):
            try:
                self._send([item])
            except Exception:  # an upload must never fail the compile
                log.debug("kcache: upload failed", exc_info=True)

    def submit(self, item: KernelUpload | KernelDirUpload | EntryUpload) -> bool:
        if not self._first_time(item):
            return False
        try:
            self._queue.put_nowait(item)
            return True
        except queue.Full:
            self._stats.put_error(item.layer if isinstance(item, EntryUpload) else _KERNEL, "queue_full")
            return False

    def drop_pending(self) -> int:
        """Give up on queued uploads (at exit, when waiting cannot help); each is counted."""
        dropped = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return dropped
            self._stats.put_error(item.layer if isinstance(item, EntryUpload) else _KERNEL, "dropped_at_exit")
            self._queue.task_done()
            dropped += 1

    def idle(self) -> bool:
        """Nothing queued and nothing being sent."""
        return self._queue.unfinished_tasks == 0

    def flush(self, timeout_s: float, give_up: Callable[[], bool] | None = None) -> bool:
        """Wait until everything queued is sent (True), or ``timeout_s`` passes or ``give_up()``
        says waiting cannot help (False). ``give_up`` is polled every few milliseconds."""
        deadline = time.monotonic() + timeout_s
        with self._wake:
            self._flushing += 1
            self._wake.notify_all()
        try:
            with self._queue.all_tasks_done:
                while self._queue.unfinished_tasks:
                    left = deadline - time.monotonic()
                    if left <= 0 or (give_up is not None and give_up()):
                        return False
                    self._queue.all_tasks_done.wait(min(left, _POLL_S))
            return True
        finally:
            with self._wake:
                self._flushing -= 1

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            self._wait_for_quiet()
            batch = [first]
            while len(batch) < _BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._send(batch)
            except Exception:
                log.debug("kcache: upload batch failed", exc_info=True)
            finally:
                for _ in batch:
                    self._queue.task_done()

    def _send(self, batch: list[KernelUpload | KernelDirUpload | EntryUpload]) -> None:
        kernels = [i for i in batch if not isinstance(i, EntryUpload)]
        entries = [i for i in batch if isinstance(i, EntryUpload)]
        if kernels:
            try:
                missing = set(self._client.missing([k.key for k in kernels]))
            except KcacheError as exc:
                for _ in kernels:
                    self._stats.put_error(_KERNEL, type(exc).__name__)
                kernels = []
            else:
                kernels = [k for k in kernels if k.key in missing]
        for k in kernels:
            self._put_kernel(k)
        for e in entries:
            try:
                data = e.payload()
            except Exception as exc:  # a bug of ours: this entry stays local
                self._stats.put_error(e.layer, "encode_failed")
                warn_once(f"could not make a {e.layer} entry to upload", exc)
                continue
            if data is None:
                continue
            try:
                self._client.put_entry(e.layer, e.key, data, e.compile_time_s)
                self._stats.put(e.layer, len(data))
            except Conflict:
                pass  # write-once: someone stored this key first; theirs stands
            except KcacheError as exc:
                self._stats.put_error(e.layer, type(exc).__name__)

    def _put_kernel(self, item: KernelUpload | KernelDirUpload) -> None:
        try:
            files = item.files if isinstance(item, KernelUpload) else read_kernel_dir(item.path)
            manifest = manifest_for_files(item.key, files, item.producer)
        except PackError as exc:
            # e.g. a dir whose paths could not be made path-free: not portable, so not shared.
            log.debug("kcache: not uploading %s: %s", item.key, exc)
            self._stats.put_error(_KERNEL, "unportable")
            return
        except OSError as exc:
            log.debug("kcache: could not read %s: %s", item.key, exc)
            self._stats.put_error(_KERNEL, "unreadable")
            return
        pack = build_pack(manifest, files)
        try:
            self._client.put_pack(item.key, pack)
            self._stats.put(_KERNEL, len(pack))
            if self._on_uploaded:
                self._on_uploaded(item.key)
        except Conflict:
            pass
        except KcacheError as exc:
            self._stats.put_error(_KERNEL, type(exc).__name__)
