"""The commit protocol on top of a blob store and an index.

Every write: verify the payload → write the blob (content-addressed) → check the blob is there
with the right size → insert the index record (the commit point; first writer wins). Entries are
write-once: a second write with the same content is accepted, different content is a conflict.
A record whose blob has vanished is a miss and is removed (the cache repairs itself).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone

from kcache_schemas import (
    EntryInfo,
    ErrorCode,
    KernelEntry,
    KernelManifest,
    PackLimits,
    Producer,
    wire,
)
from kcache_schemas.pack import read_pack

from kcache_server.errors import ApiError, not_found
from kcache_server.storage import BackendUnavailable, BlobNotFound, BlobStore, Index, IndexRecord

log = logging.getLogger("kcache_server.store")

KERNEL = wire.CacheLayer.KERNEL.value


def entry_kind(layer: str) -> str:
    return f"entry/{layer}"


@dataclass(frozen=True)
class PutResult:
    created: bool
    meta: str  # JSON of the stored entry


class AccessRecorder:
    """Counts hits in memory and flushes them to the index in the background.

    Last-access and hit counts feed pruning and the dashboard; writing them on every GET would
    put an index write on the hot read path, so they are batched (bazel-remote does the same).
    """

    def __init__(self, index: Index, interval_s: float) -> None:
        self._index, self._interval = index, interval_s
        self._pending: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kcache-access-flush", daemon=True)
        self._thread.start()

    def record(self, namespace: str, kind: str, keys: list[str]) -> None:
        with self._lock:
            for k in keys:
                self._pending[(namespace, kind, k)] += 1

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, Counter()
        groups: dict[tuple[str, str], list[str]] = {}
        for (ns, kind, key), n in pending.items():
            groups.setdefault((ns, kind), []).extend([key] * n)
        now = time.time()
        for (ns, kind), keys in groups.items():
            try:
                self._index.touch(ns, kind, keys, now)
            except BackendUnavailable:
                log.warning("could not record %d accesses: index unavailable", len(keys))

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()


class CacheStore:
    def __init__(self, blobs: BlobStore, index: Index, limits: PackLimits, access_flush_s: float = 2.0) -> None:
        self.blobs, self.index, self.limits = blobs, index, limits
        self.access = AccessRecorder(index, access_flush_s)

    def close(self) -> None:
        self.access.close()
        self.blobs.close()
        self.index.close()

    # ---- shared commit protocol ---------------------------------------------------------

    def _commit(self, record: IndexRecord, data: bytes, same_content: bool | None = None) -> PutResult:
        existing = self.index.get(record.namespace, record.kind, record.key)
        if existing is not None:
            return self._resolve_existing(existing, record)
        self.blobs.put(record.digest, data)
        if self.blobs.size(record.digest) != len(data):
            raise BackendUnavailable(self.blobs.name, "blob did not verify after write")
        stored = self.index.put_if_absent(record)
        if stored.digest == record.digest:
            return PutResult(created=stored.created_at == record.created_at, meta=stored.meta)
        # Lost a race to a concurrent writer: our blob is an orphan (content-addressed, harmless).
        return self._resolve_existing(stored, record)

    def _resolve_existing(self, existing: IndexRecord, new: IndexRecord) -> PutResult:
        if _content_id(existing) == _content_id(new):
            return PutResult(created=False, meta=existing.meta)
        raise ApiError(
            409,
            ErrorCode.CONFLICT,
            f"{new.key} already exists in namespace {new.namespace!r} with different content; "
            "entries are write-once",
        )

    def _read_blob(self, record: IndexRecord) -> bytes:
        try:
            return self.blobs.get(record.digest)
        except BlobNotFound:
            # The index points at bytes that are gone (pruned bucket, lost disk): drop the record
            # so the next writer can repopulate it, and report a miss.
            log.warning("blob %s for %s/%s vanished; removing index record", record.digest, record.kind, record.key)
            self.index.delete(record.namespace, record.kind, record.key, digest=record.digest)
            raise not_found(f"{record.kind} {record.key}") from None

    # ---- kernels ------------------------------------------------------------------------

    def put_kernel(self, namespace: str, key: str, pack: bytes) -> tuple[KernelEntry, bool]:
        manifest, _files = read_pack(pack, self.limits)
        if manifest.key != key:
            raise ApiError(400, ErrorCode.KEY_MISMATCH, f"pack is for kernel {manifest.key}, not {key}")
        entry = _kernel_entry(namespace, manifest, len(pack))
        record = IndexRecord(
            namespace=namespace,
            kind=KERNEL,
            key=key,
            digest=hashlib.sha256(pack).hexdigest(),
            size=len(pack),
            meta=entry.model_dump_json(),
            created_at=entry.created_at.timestamp(),
        )
        result = self._commit(record, pack)
        return KernelEntry.model_validate_json(result.meta), result.created

    def kernel_record(self, namespace: str, key: str) -> IndexRecord:
        record = self.index.get(namespace, KERNEL, key)
        if record is None:
            raise not_found(f"kernel {key}")
        return record

    def kernel_entry(self, namespace: str, key: str) -> KernelEntry:
        return KernelEntry.model_validate_json(self.kernel_record(namespace, key).meta)

    def kernel_pack(self, namespace: str, key: str) -> tuple[IndexRecord, bytes]:
        record = self.kernel_record(namespace, key)
        data = self._read_blob(record)
        self.access.record(namespace, KERNEL, [key])
        return record, data

    def kernel_file(self, namespace: str, key: str, filename: str) -> bytes:
        _record, pack = self.kernel_pack(namespace, key)
        _manifest, files = read_pack(pack, self.limits)
        if filename not in files:
            raise not_found(f"file {filename} of kernel {key}")
        return files[filename]

    def missing_kernels(self, namespace: str, keys: list[str]) -> list[str]:
        return self.index.missing(namespace, KERNEL, keys)

    def list_kernels(self, namespace: str, after: str, prefix: str, limit: int) -> list[KernelEntry]:
        return [KernelEntry.model_validate_json(r.meta) for r in self.index.list(namespace, KERNEL, after=after, prefix=prefix, limit=limit)]

    def delete(self, namespace: str, kind: str, key: str) -> None:
        if not self.index.delete(namespace, kind, key):
            raise not_found(f"{kind} {key}")

    # ---- opaque Inductor cache entries ------------------------------------------------------

    def put_entry(self, namespace: str, layer: str, key: str, data: bytes, producer: Producer) -> tuple[EntryInfo, bool]:
        info = EntryInfo(
            namespace=namespace,
            layer=layer,
            key=key,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            created_at=datetime.now(timezone.utc),
            producer=producer,
        )
        record = IndexRecord(
            namespace=namespace,
            kind=entry_kind(layer),
            key=key,
            digest=info.sha256,
            size=info.size,
            meta=info.model_dump_json(),
            created_at=info.created_at.timestamp(),
        )
        result = self._commit(record, data)
        return EntryInfo.model_validate_json(result.meta), result.created

    def entry_record(self, namespace: str, layer: str, key: str) -> IndexRecord:
        record = self.index.get(namespace, entry_kind(layer), key)
        if record is None:
            raise not_found(f"{layer} entry {key}")
        return record

    def entry_bytes(self, namespace: str, layer: str, key: str) -> tuple[IndexRecord, bytes]:
        record = self.entry_record(namespace, layer, key)
        data = self._read_blob(record)
        self.access.record(namespace, record.kind, [key])
        return record, data


def _content_id(record: IndexRecord) -> str:
    """What makes two writes "the same": kernel file hashes, or the raw bytes for entries."""
    if record.kind == KERNEL:
        return str(json.loads(record.meta)["content_digest"])
    return record.digest


def _kernel_entry(namespace: str, manifest: KernelManifest, pack_size: int) -> KernelEntry:
    return KernelEntry(
        namespace=namespace,
        key=manifest.key,
        kernel_name=manifest.kernel_name,
        target=manifest.target,
        triton_version=manifest.triton_version,
        files=manifest.files,
        total_size=manifest.total_size,
        pack_size=pack_size,
        content_digest=manifest.content_digest,
        created_at=datetime.now(timezone.utc),
        producer=manifest.producer,
    )
