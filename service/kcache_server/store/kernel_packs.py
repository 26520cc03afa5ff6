"""Kernels: Triton kernel dirs stored as verified packs (``/v1/{namespace}/kernels``).

A pack is verified before it is stored (canonical bytes, every file's size and sha256, bounded
unpacking); reads stream it, batch reads fetch ahead from remote blob stores, and presigned URLs
let clients fetch the bytes straight from an object store.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Literal

from kcache_schemas import (
    InvalidKeyError,
    KernelEntry,
    KernelManifest,
    PackLimits,
    normalize_kernel_key,
)
from kcache_schemas.models import BatchUrls
from kcache_schemas.pack import pack_work_bytes, read_pack_file, verify_pack

from kcache_server.domain_errors import KeyMismatch, NotFound
from kcache_server.kinds import KERNEL
from kcache_server.memory_budget import Hold, MemoryBudget
from kcache_server.storage import BlobNotFound, BlobStore, BlobStream, Index, IndexRecord
from kcache_server.store.access_recorder import AccessRecorder
from kcache_server.store.blob_references import BlobReferences
from kcache_server.store.commit import CommitProtocol
from kcache_server.store.presigned_urls import PresignedUrls
from kcache_server.store.quarantine import Quarantine
from kcache_server.store.records import Records

# Remote blob stores (S3) are read this many at a time by a batch get, whole, if they are at
# most _FETCH_AHEAD_MAX_BYTES; larger ones are streamed when their turn comes, so a batch of
# large packs holds a chunk of one, not sixteen packs.
_FETCH_AHEAD = 16
_FETCH_AHEAD_MAX_BYTES = 1 << 20
# Top-kernel queries scan the namespace's kernel records; stop somewhere sane.
_TOP_SCAN_LIMIT = 200_000


@dataclass(frozen=True)
class BatchGet:
    """A batch get's answer: which keys are found, missing or invalid, and their packs (opened
    lazily, in ``found`` order, each to be read and closed before the next is asked for; a pack
    whose blob vanished since the lookup is left out)."""

    found: list[str]
    missing: list[str]
    invalid: list[str]
    packs: Iterator[tuple[str, BlobStream]] = field(repr=False)


@dataclass(frozen=True)
class TopKernel:
    entry: KernelEntry
    hits: int
    last_access: float | None


class KernelPacks:
    """``limits`` bound what a pack may unpack to; ``budget`` is the replica's memory budget,
    from which pack verification and file views take their working memory."""

    def __init__(
        self, blobs: BlobStore, index: Index, limits: PackLimits, budget: MemoryBudget, access: AccessRecorder,
        commits: CommitProtocol, references: BlobReferences, quarantine: Quarantine, records: Records, urls: PresignedUrls,
    ) -> None:
        self._blobs, self._index, self._limits, self._budget, self._access = blobs, index, limits, budget, access
        self._urls = urls
        self._commits, self._references, self._quarantine, self._records = commits, references, quarantine, records

    def put(self, namespace: str, key: str, pack: bytes, share: Hold | None = None) -> tuple[KernelEntry, bool]:
        """Store a pack that is canonical (``verify_pack``: the bytes are what build_pack writes)
        and whose files verify; memory stays bounded whatever it unpacks to. The working memory
        is taken from the budget, in ``share`` when the request holds one (its body's)."""
        with self._budget.hold(share) as share:
            share.take(pack_work_bytes(pack, self._limits), "verifying a kernel pack")
            manifest = verify_pack(pack, self._limits)
        if manifest.key != key:
            raise KeyMismatch(f"pack is for kernel {manifest.key}, not {key}")
        entry = kernel_entry_of(namespace, manifest, len(pack))
        record = IndexRecord(
            namespace=namespace,
            kind=KERNEL,
            key=key,
            digest=hashlib.sha256(pack).hexdigest(),
            size=len(pack),
            meta=entry.model_dump_json(),
            created_at=entry.created_at.timestamp(),
        )
        result = self._quarantine.commit(KERNEL, record, pack)
        return KernelEntry.model_validate_json(result.meta), result.created

    def _record(self, namespace: str, key: str) -> IndexRecord:
        return self._quarantine.stored(namespace, KERNEL, KERNEL, key, f"kernel {key}")

    def manifest(self, namespace: str, key: str) -> KernelEntry:
        return KernelEntry.model_validate_json(self._record(namespace, key).meta)

    def pack(self, namespace: str, key: str) -> tuple[KernelEntry, bytes]:
        record = self._record(namespace, key)
        data = self._commits.read(record)
        self._access.record(namespace, KERNEL, [key])
        return KernelEntry.model_validate_json(record.meta), data

    def open_pack(self, namespace: str, key: str) -> tuple[KernelEntry, BlobStream]:
        """:meth:`pack`, streamed (the caller closes the stream)."""
        record = self._record(namespace, key)
        stream = self._commits.open(record)
        self._access.record(namespace, KERNEL, [key])
        return KernelEntry.model_validate_json(record.meta), stream

    def file(self, namespace: str, key: str, filename: str) -> bytes:
        """One file of a stored pack, checked against the pack's manifest. Only that file is
        held; the pack is decompressed up to its end. A pack stored by an older service that
        unpacks to more than ``limits`` allow is refused (TOO_LARGE), not opened."""
        record = self._record(namespace, key)
        entry = KernelEntry.model_validate_json(record.meta)
        wanted = next((f for f in entry.files if f.name == filename), None)
        if wanted is None:
            raise NotFound(f"file {filename} of kernel {key}")
        with self._budget.hold() as share:
            share.take(record.size + min(wanted.size, self._limits.max_unpacked_bytes), "a kernel file view")
            pack = self._commits.read(record)
            self._access.record(namespace, KERNEL, [key])
            share.take(pack_work_bytes(pack, self._limits), "a kernel file view")
            _manifest, data = read_pack_file(pack, filename, self._limits)
        if data is None:
            raise NotFound(f"file {filename} of kernel {key}")
        return data

    def download_url(self, namespace: str, key: str, expires_s: int) -> str | None:
        """A presigned URL of the kernel's pack where the blob store makes them (S3), else None."""
        record = self._record(namespace, key)
        url = self._urls.url(record.digest, expires_s)
        if url is not None:
            self._access.record(namespace, KERNEL, [key])
        return url

    def download_urls(self, namespace: str, keys: list[str], expires_s: int | None) -> BatchUrls:
        """Presigned URLs of many packs, one index read for all (``expires_s`` None: presigned
        downloads are off, and every found key is ``inline``: to be fetched through batch-get)."""
        valid, invalid = split_kernel_keys(keys)
        unique = list(dict.fromkeys(valid))
        records = self._index.get_many(namespace, KERNEL, unique)
        urls: dict[str, str] = {}
        inline: list[str] = []
        for key in unique:
            if key not in records:
                continue
            url = self._urls.url(records[key].digest, expires_s) if expires_s is not None else None
            if url is None:
                inline.append(key)
            else:
                urls[key] = url
        if urls:  # the inline ones are recorded when batch-get serves them
            self._access.record(namespace, KERNEL, list(urls))
        missing = [k for k in unique if k not in records]
        return BatchUrls(urls=urls, inline=inline, missing=missing, invalid=invalid, expires_s=expires_s if urls and expires_s else 0)

    def missing(self, namespace: str, keys: list[str]) -> tuple[list[str], list[str]]:
        """``(missing, invalid)`` of the given keys (valid ones normalised)."""
        valid, invalid = split_kernel_keys(keys)
        return self._index.missing(namespace, KERNEL, valid), invalid

    def batch_get(self, namespace: str, keys: list[str]) -> BatchGet:
        valid, invalid = split_kernel_keys(keys)
        unique = list(dict.fromkeys(valid))
        records = self._index.get_many(namespace, KERNEL, unique)
        found = [k for k in unique if k in records]
        missing = [k for k in unique if k not in records]

        def packs() -> Iterator[tuple[str, BlobStream]]:
            for key, stream in self._open_many([records[k] for k in found]):
                if stream is not None:  # vanished between lookup and read: the client sees a miss
                    yield key, stream
            self._access.record(namespace, KERNEL, found)

        return BatchGet(found, missing, invalid, packs())

    def _open_many(self, wanted: list[IndexRecord]) -> Iterator[tuple[str, BlobStream | None]]:
        """``(key, its blob opened, or None if gone)`` in order; each stream is read (and
        closed) by the caller before it asks for the next. Remote blob stores (S3) read small
        blobs up to _FETCH_AHEAD at a time: one GET after another made a bulk pull wait on 500
        round trips. Errors other than a vanished blob surface in order, as from a plain loop."""

        def opened(digest: str) -> BlobStream | None:
            try:
                return self._blobs.open(digest)
            except BlobNotFound:
                return None

        def fetched(digest: str) -> BlobStream | None:
            try:
                return BlobStream.of(self._blobs.get(digest))
            except BlobNotFound:
                return None

        if self._blobs.name == "file" or len(wanted) < 2:  # local reads: threads would only add cost
            for record in wanted:
                yield record.key, opened(record.digest)
            return
        with ThreadPoolExecutor(max_workers=_FETCH_AHEAD, thread_name_prefix="kcache-batch-get") as pool:
            # A large blob is not fetched ahead (it would be held whole) nor opened ahead (its
            # connection would sit idle): it is opened when its turn comes.
            def ahead(record: IndexRecord) -> Future[BlobStream | None] | None:
                return pool.submit(fetched, record.digest) if record.size <= _FETCH_AHEAD_MAX_BYTES else None

            todo = iter(wanted)
            window = deque((record, ahead(record)) for record in itertools.islice(todo, _FETCH_AHEAD))
            while window:
                record, future = window.popleft()
                for nxt in itertools.islice(todo, 1):
                    window.append((nxt, ahead(nxt)))
                yield record.key, opened(record.digest) if future is None else future.result()

    def listing(self, namespace: str, after: str, prefix: str, limit: int) -> list[KernelEntry]:
        return [KernelEntry.model_validate_json(r.meta) for r in self._index.list(namespace, KERNEL, after=after, prefix=prefix, limit=limit)]

    def top(self, namespace: str, by: Literal["size", "hits"], limit: int) -> tuple[int, list[TopKernel]]:
        """``(records scanned, the top ``limit`` kernels by stored size or by hits)``."""
        records = self._records.all_records(namespace, KERNEL, limit=_TOP_SCAN_LIMIT)
        if by == "size":
            records.sort(key=lambda r: (r.size, r.key), reverse=True)
        else:
            records.sort(key=lambda r: (r.hits, r.last_access, r.key), reverse=True)
        top = [TopKernel(KernelEntry.model_validate_json(r.meta), r.hits, r.last_access or None) for r in records[:limit]]
        return len(records), top

    def delete(self, namespace: str, key: str) -> None:
        record = self._index.get(namespace, KERNEL, key)
        if record is None or not self._references.drop(record):
            raise NotFound(f"{KERNEL} {key}")


def split_kernel_keys(raw: list[str]) -> tuple[list[str], list[str]]:
    """``(valid keys normalised, invalid keys as given)``: bulk requests answer both."""
    valid, invalid = [], []
    for k in raw:
        try:
            valid.append(normalize_kernel_key(k))
        except InvalidKeyError:
            invalid.append(k)
    return valid, invalid


def kernel_entry_of(namespace: str, manifest: KernelManifest, pack_size: int) -> KernelEntry:
    """The index's entry for a verified pack: its manifest, where and when it was stored."""
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
