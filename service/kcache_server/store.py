"""The cache's domain: kernels and entries on top of a blob store and an index, with the commit
protocol. Routes reach storage only through here (and :mod:`kcache_server.runs`,
:mod:`kcache_server.workloads`); it returns domain models and raises
:mod:`kcache_server.errors`, which one handler maps to HTTP.

Every write: verify the payload → check the namespace's hard storage limit → claim a reference on
the blob → write the blob (content-addressed) → check the blob is there with the right size →
insert the index record (the commit point; first writer wins) → check the blob once more. Entries
are write-once: a second write with the same content is accepted, different content is a
conflict. A record whose blob has vanished is a miss and is removed (the cache repairs itself).

Every delete (eviction, an admin's delete, that repair) mirrors it: the index record first, then
its reference, then the blob, only if no reference is left (blobs are shared between namespaces)
and only under the index's deletion marker, which a writer's claim waits for. So no reader ever
meets a record whose blob was deleted on purpose, and no writer commits a record whose blob a GC
is deleting (see :mod:`kcache_server.storage.base`, docs/storage.md "Retention").
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Literal, NoReturn

from kcache_schemas import (
    EntryInfo,
    EntrySignature,
    InvalidKeyError,
    KernelEntry,
    KernelManifest,
    PackLimits,
    Producer,
    QuarantineInfo,
    normalize_kernel_key,
)
from kcache_schemas.models import BatchUrls
from kcache_schemas.pack import pack_work_bytes, read_pack_file, verify_pack
from kcache_schemas.retention import Amount
from kcache_schemas.units import format_bytes

from kcache_server.budget import Hold, MemoryBudget
from kcache_server.errors import (
    Conflict,
    InsufficientStorage,
    KeyMismatch,
    NotFound,
    Quarantined,
    QuarantinedUpload,
)
from kcache_server.kinds import KERNEL, collapse_usage, entry_kind, is_cache_kind, quarantine_kind
from kcache_server.retention import RetentionConfig
from kcache_server.storage import (
    BackendUnavailable,
    BlobNotFound,
    BlobStore,
    BlobStream,
    Index,
    IndexRecord,
)
from kcache_server.storage.base import KindUsage, blob_ref, new_token

log = logging.getLogger("kcache_server.store")

_PAGE = 1000
# Remote blob stores (S3) are read this many at a time by a batch get, whole, if they are at
# most _FETCH_AHEAD_MAX_BYTES; larger ones are streamed when their turn comes, so a batch of
# large packs holds a chunk of one, not sixteen packs.
_FETCH_AHEAD = 16
_FETCH_AHEAD_MAX_BYTES = 1 << 20
# Top-kernel queries scan the namespace's kernel records; stop somewhere sane.
_TOP_SCAN_LIMIT = 200_000
# A blob deletion marker outlives a stalled GC by this much; a writer of that blob waits for it at
# most _CLAIM_WAIT_S (a live GC holds it for one delete call), then answers 503.
BLOB_DELETE_TTL_S = 60.0
_CLAIM_WAIT_S = 10.0
# The hard-limit check reads usage at most this stale (plus this process's own writes since),
# and fresh once the namespace is past its soft limit.
_USAGE_TTL_S = 1.0


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


@dataclass(frozen=True)
class PutResult:
    created: bool
    meta: str  # JSON of the stored entry


@dataclass
class EvictResult:
    """What :meth:`CacheStore.evict` did: per record whether it was deleted, and the blobs."""

    deleted: list[bool]
    blobs_deleted: Amount = field(default_factory=Amount)
    blobs_shared: int = 0  # blobs kept because another record still references them


class AccessRecorder:
    """Counts hits in memory and flushes them to the index in the background.

    Last-access and hit counts feed the GC's eviction order and the dashboard; writing them on every GET would
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
    """``limits`` bound what a pack may unpack to; ``budget`` is the replica's memory budget,
    from which pack verification and file views take their working memory (unlimited if None);
    ``retention`` the namespaces' storage limits and age rules (:mod:`kcache_server.retention`)."""

    def __init__(
        self, blobs: BlobStore, index: Index, limits: PackLimits, access_flush_s: float = 2.0,
        budget: MemoryBudget | None = None, retention: RetentionConfig | None = None,
    ) -> None:
        self.blobs, self.index, self.limits = blobs, index, limits
        self.budget = budget or MemoryBudget(0)
        self.access = AccessRecorder(index, access_flush_s)
        self.retention = retention or RetentionConfig()
        # Called with a namespace whose uploads met its soft or hard limit: wakes the GC.
        self.on_pressure: Callable[[str], None] = lambda namespace: None
        self._usage_lock = threading.Lock()
        self._usage: tuple[float, dict[str, int]] | None = None  # (when read, cache bytes per namespace)
        self._refs_complete = False
        self._refs_checked = False

    def close(self) -> None:
        self.access.close()
        self.blobs.close()
        self.index.close()

    # ---- shared commit protocol ---------------------------------------------------------

    def _commit(self, record: IndexRecord, data: bytes, supersede: Callable[[IndexRecord], bool] | None = None) -> PutResult:
        """``supersede(existing)``: whether a stored record with other content gives way to this
        one (write-once otherwise; see :func:`kcache_server.signatures.supersedes`)."""
        existing = self.index.get(record.namespace, record.kind, record.key)
        if existing is not None and supersede is not None and _content_id(existing) != _content_id(record) and supersede(existing):
            log.info("%s/%s/%s: the stored entry gives way to a trusted upload", record.namespace, record.kind, record.key)
            self._drop(existing)  # record, then its reference, then its blob if nothing else uses it
            existing = None
        if existing is not None:
            return self._resolve_existing(existing, record)
        self._check_storage_limit(record.namespace, len(data))
        if not self._refs_checked:  # once per process: a fresh index is complete from its first write
            self._refs_checked = True
            self.refs_complete()
        ref = blob_ref(record.namespace, record.kind, record.key)
        # The claim comes first: from here on no GC starts deleting this blob, and one already
        # deleting it has finished (claim waits), so the blob written below stays.
        token = self._claim(record.digest, ref)
        self._write_blob(record.digest, data)
        # A failure from here on keeps the claim: the record may have committed (a frozen Redis
        # that resumes runs the queued insert); a claim without its record is a leak the orphan
        # sweep reclaims, a record without its claim could lose its blob.
        stored = self.index.put_if_absent(record)
        if stored.digest != record.digest:
            # Lost the race to a writer of other content: our reference and blob are not needed.
            self.index.release_blob(record.digest, ref, token)
            self.delete_blob_if_unreferenced(record.digest)
            return self._resolve_existing(stored, record)
        # Verified before the insert; once more now that the record commits it. Only a GC whose
        # deletion marker expired while it stalled (begun before our claim) can have deleted it,
        # and our claim stops every later one, so writing it back is final.
        if self.blobs.size(record.digest) != len(data):
            log.warning("blob %s vanished while its record committed; writing it again", record.digest)
            self._write_blob(record.digest, data)
        created = stored.created_at == record.created_at
        if created:
            self._count_usage(record.namespace, record.size)
        return PutResult(created=created, meta=stored.meta)

    def _write_blob(self, digest: str, data: bytes) -> None:
        self.blobs.put(digest, data)
        if self.blobs.size(digest) != len(data):
            raise BackendUnavailable(self.blobs.name, "blob did not verify after write")

    def _claim(self, digest: str, ref: str) -> str:
        deadline = time.monotonic() + _CLAIM_WAIT_S
        pause = 0.01
        while True:
            token = self.index.claim_blob(digest, ref)
            if token is not None:
                return token
            if time.monotonic() + pause > deadline:
                raise BackendUnavailable(self.index.name, f"blob {digest[:16]}… is being deleted by a GC that does not finish; retry")
            time.sleep(pause)  # a GC is deleting this very blob right now: one delete call
            pause = min(pause * 2, 0.2)

    # ---- storage budgets ----------------------------------------------------------------------

    def cache_usage(self, namespace: str) -> Amount:
        """Kernels and entries stored in ``namespace`` (what its budget counts), read now."""
        kinds = self.index.usage().get(namespace, {})
        return _cache_amount(kinds)

    def _cached_cache_bytes(self, namespace: str, fresh_above: float) -> int:
        """The namespace's cache bytes, at most _USAGE_TTL_S old, or read now if the cached value
        is above ``fresh_above`` (close to a limit, other replicas' writes matter)."""
        with self._usage_lock:
            cached = self._usage
            if cached is None or time.monotonic() - cached[0] > _USAGE_TTL_S or cached[1].get(namespace, 0) > fresh_above:
                usage = self.index.usage()
                cached = self._usage = (time.monotonic(), {ns: _cache_amount(k).bytes for ns, k in usage.items()})
            return cached[1].get(namespace, 0)

    def _count_usage(self, namespace: str, size: int) -> None:
        # Our own writes count at once; other replicas' within _USAGE_TTL_S.
        with self._usage_lock:
            if self._usage is not None:
                self._usage[1][namespace] = self._usage[1].get(namespace, 0) + size

    def _check_storage_limit(self, namespace: str, size: int) -> None:
        """Refuse (507) an upload that would take the namespace past its hard limit; wake the GC
        once it is past its soft limit. Free when the namespace has no limits."""
        policy = self.retention.policy(namespace)
        soft, hard = policy.soft_limit_bytes, policy.hard_limit_bytes
        if soft is None and hard is None:
            return
        # Past the soft limit every upload reads usage afresh: the hard limit then holds across
        # replicas up to the uploads in flight, and below it a second-old figure is plenty.
        near = soft if soft is not None else float("inf")
        used = self._cached_cache_bytes(namespace, fresh_above=near - size)
        if soft is not None and used + size > soft:
            self.on_pressure(namespace)
        if hard is not None and used + size > hard:
            raise InsufficientStorage(
                f"namespace {namespace!r} holds {format_bytes(used)} of its {format_bytes(hard)} hard limit; "
                f"this upload of {format_bytes(size)} would pass it. The GC is evicting least recently used "
                "items (nothing used within the minimum age); retry later, or raise the limit (KCACHE_RETENTION)"
            )

    def _resolve_existing(self, existing: IndexRecord, new: IndexRecord) -> PutResult:
        if _content_id(existing) == _content_id(new):
            return PutResult(created=False, meta=existing.meta)
        raise Conflict(
            f"{new.key} already exists in namespace {new.namespace!r} with different content; "
            "entries are write-once"
        )

    def _read_blob(self, record: IndexRecord) -> bytes:
        try:
            return self.blobs.get(record.digest)
        except BlobNotFound:
            pass
        # Evicted between our index read and blob read (a miss), or the bytes are gone (a pruned
        # bucket, a lost disk): drop the record if it still names them, so the next writer can
        # repopulate it, and report a miss. A writer that put the same bytes back meanwhile wins.
        if self.blobs.size(record.digest) is not None:
            with contextlib.suppress(BlobNotFound):
                return self.blobs.get(record.digest)
        self._blob_lost(record)

    def _open_blob(self, record: IndexRecord) -> BlobStream:
        """:meth:`_read_blob`, streamed: what responses send, so that concurrent readers of a
        large blob hold a chunk each instead of a copy each."""
        try:
            return self.blobs.open(record.digest)
        except BlobNotFound:
            pass
        if self.blobs.size(record.digest) is not None:
            with contextlib.suppress(BlobNotFound):
                return self.blobs.open(record.digest)
        self._blob_lost(record)

    def _blob_lost(self, record: IndexRecord) -> NoReturn:
        if self._drop(record):
            log.warning("blob %s for %s/%s vanished; removed its index record", record.digest, record.kind, record.key)
        raise NotFound(f"{record.kind} {record.key}") from None

    # ---- deletes and eviction ---------------------------------------------------------------

    def _drop(self, record: IndexRecord) -> bool:
        """Delete one record if it still names its digest, then its reference and blob."""
        ref = blob_ref(record.namespace, record.kind, record.key)
        token = self.index.blob_refs([record.digest]).get(record.digest, {}).get(ref) if record.digest else None
        if not self.index.delete(record.namespace, record.kind, record.key, digest=record.digest):
            return False
        if token is not None:
            self.index.release_blob(record.digest, ref, token)
            self.delete_blob_if_unreferenced(record.digest)
        return True

    def evict(self, records: list[IndexRecord]) -> EvictResult:
        """Delete records that were not used since they were read (index entries first), then the
        blobs no record references any more. Records used or replaced meanwhile are kept."""
        with_blob = [r for r in records if r.digest]
        tokens = self.index.blob_refs([r.digest for r in with_blob]) if with_blob else {}
        result = EvictResult(deleted=self.index.delete_unused(records))
        released: dict[str, int] = {}
        releases: list[tuple[str, str, str]] = []
        for r, ok in zip(records, result.deleted, strict=True):
            if not ok or not r.digest:
                continue
            ref = blob_ref(r.namespace, r.kind, r.key)
            token = tokens.get(r.digest, {}).get(ref)
            if token is not None:
                releases.append((r.digest, ref, token))
            released[r.digest] = r.size
        self.index.release_blobs(releases)
        deleted = set(self.delete_blobs_if_unreferenced(list(released)))
        for digest, size in released.items():
            if digest in deleted:
                result.blobs_deleted = result.blobs_deleted.plus(size)
            else:
                result.blobs_shared += 1
        with self._usage_lock:
            self._usage = None  # budgets see the space at once
        return result

    def refs_complete(self) -> bool:
        """Whether blob references can be trusted to name every record's blob: set once the GC
        backfilled them, or at once for an index that holds nothing yet."""
        if not self._refs_complete:
            if not self.index.blob_refs_complete() and not self.index.usage():
                self.index.set_blob_refs_complete()
            self._refs_complete = self.index.blob_refs_complete()
        return self._refs_complete

    def backfill_refs(self) -> int:
        """Add a reference for every record with a blob (all namespaces) where one is missing:
        records written before references existed, or during a rolling upgrade by a replica
        without them. Marks references complete; how many were added."""
        added = 0
        for namespace, kinds in self.index.usage().items():
            for kind in kinds:
                batch = [(r.digest, blob_ref(r.namespace, r.kind, r.key)) for r in self.iter_records(namespace, kind, meta=False) if r.digest]
                added += self.index.backfill_blob_refs(batch) if batch else 0
        self.index.set_blob_refs_complete()
        self._refs_complete = True
        return added

    def delete_blob_if_unreferenced(self, digest: str) -> bool:
        return bool(self.delete_blobs_if_unreferenced([digest]))

    def delete_blobs_if_unreferenced(self, digests: list[str]) -> list[str]:
        """Delete blobs under the index's deletion markers, which are only set while no record
        (of any namespace) references the blob and which make writers of the same bytes wait;
        the digests deleted."""
        if not digests or not self.refs_complete():
            return []  # the GC backfills references first; until then nothing is deleted
        token = new_token()
        began = time.monotonic()
        marked = [d for d, ok in zip(digests, self.index.begin_blob_deletes(digests, token, BLOB_DELETE_TTL_S), strict=True) if ok]
        if not marked:
            return []
        try:
            if time.monotonic() - began > BLOB_DELETE_TTL_S / 2:
                return []  # a slow answer: the markers may expire under us; leave them for later
            return self.blobs.delete_many(marked)
        finally:
            self.index.end_blob_deletes(marked, token)

    # ---- kernels ------------------------------------------------------------------------

    def put_kernel(self, namespace: str, key: str, pack: bytes, share: Hold | None = None) -> tuple[KernelEntry, bool]:
        """Store a pack that is canonical (``verify_pack``: the bytes are what build_pack writes)
        and whose files verify; memory stays bounded whatever it unpacks to. The working memory
        is taken from the budget, in ``share`` when the request holds one (its body's)."""
        with self.budget.hold(share) as share:
            share.take(pack_work_bytes(pack, self.limits), "verifying a kernel pack")
            manifest = verify_pack(pack, self.limits)
        if manifest.key != key:
            raise KeyMismatch(f"pack is for kernel {manifest.key}, not {key}")
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

    def _kernel_record(self, namespace: str, key: str) -> IndexRecord:
        record = self.index.get(namespace, KERNEL, key)
        if record is None:
            raise NotFound(f"kernel {key}")
        return record

    def kernel_entry(self, namespace: str, key: str) -> KernelEntry:
        return KernelEntry.model_validate_json(self._kernel_record(namespace, key).meta)

    def kernel_pack(self, namespace: str, key: str) -> tuple[KernelEntry, bytes]:
        record = self._kernel_record(namespace, key)
        data = self._read_blob(record)
        self.access.record(namespace, KERNEL, [key])
        return KernelEntry.model_validate_json(record.meta), data

    def open_kernel_pack(self, namespace: str, key: str) -> tuple[KernelEntry, BlobStream]:
        """:meth:`kernel_pack`, streamed (the caller closes the stream)."""
        record = self._kernel_record(namespace, key)
        stream = self._open_blob(record)
        self.access.record(namespace, KERNEL, [key])
        return KernelEntry.model_validate_json(record.meta), stream

    def kernel_file(self, namespace: str, key: str, filename: str) -> bytes:
        """One file of a stored pack, checked against the pack's manifest. Only that file is
        held; the pack is decompressed up to its end. A pack stored by an older service that
        unpacks to more than ``limits`` allow is refused (TOO_LARGE), not opened."""
        record = self._kernel_record(namespace, key)
        entry = KernelEntry.model_validate_json(record.meta)
        wanted = next((f for f in entry.files if f.name == filename), None)
        if wanted is None:
            raise NotFound(f"file {filename} of kernel {key}")
        with self.budget.hold() as share:
            share.take(record.size + min(wanted.size, self.limits.max_unpacked_bytes), "a kernel file view")
            pack = self._read_blob(record)
            self.access.record(namespace, KERNEL, [key])
            share.take(pack_work_bytes(pack, self.limits), "a kernel file view")
            _manifest, data = read_pack_file(pack, filename, self.limits)
        if data is None:
            raise NotFound(f"file {filename} of kernel {key}")
        return data

    def kernel_download_url(self, namespace: str, key: str, expires_s: int) -> str | None:
        """A presigned URL of the kernel's pack where the blob store makes them (S3), else None."""
        record = self._kernel_record(namespace, key)
        url = self.blobs.presigned_get_url(record.digest, expires_s)
        if url is not None:
            self.access.record(namespace, KERNEL, [key])
        return url

    @property
    def presigns(self) -> bool:
        """Whether the blob store makes presigned URLs (S3): the service can hand them out."""
        return self.blobs.presigns

    def kernel_download_urls(self, namespace: str, keys: list[str], expires_s: int | None) -> BatchUrls:
        """Presigned URLs of many packs, one index read for all (``expires_s`` None: presigned
        downloads are off, and every found key is ``inline``: to be fetched through batch-get)."""
        valid, invalid = split_kernel_keys(keys)
        unique = list(dict.fromkeys(valid))
        records = self.index.get_many(namespace, KERNEL, unique)
        urls: dict[str, str] = {}
        inline: list[str] = []
        for key in unique:
            if key not in records:
                continue
            url = self.blobs.presigned_get_url(records[key].digest, expires_s) if expires_s is not None else None
            if url is None:
                inline.append(key)
            else:
                urls[key] = url
        if urls:  # the inline ones are recorded when batch-get serves them
            self.access.record(namespace, KERNEL, list(urls))
        missing = [k for k in unique if k not in records]
        return BatchUrls(urls=urls, inline=inline, missing=missing, invalid=invalid, expires_s=expires_s if urls and expires_s else 0)

    def missing_kernels(self, namespace: str, keys: list[str]) -> tuple[list[str], list[str]]:
        """``(missing, invalid)`` of the given keys (valid ones normalised)."""
        valid, invalid = split_kernel_keys(keys)
        return self.index.missing(namespace, KERNEL, valid), invalid

    def batch_get(self, namespace: str, keys: list[str]) -> BatchGet:
        valid, invalid = split_kernel_keys(keys)
        unique = list(dict.fromkeys(valid))
        records = self.index.get_many(namespace, KERNEL, unique)
        found = [k for k in unique if k in records]
        missing = [k for k in unique if k not in records]

        def packs() -> Iterator[tuple[str, BlobStream]]:
            for key, stream in self._open_blobs([records[k] for k in found]):
                if stream is not None:  # vanished between lookup and read: the client sees a miss
                    yield key, stream
            self.access.record(namespace, KERNEL, found)

        return BatchGet(found, missing, invalid, packs())

    def _open_blobs(self, wanted: list[IndexRecord]) -> Iterator[tuple[str, BlobStream | None]]:
        """``(key, its blob opened, or None if gone)`` in order; each stream is read (and
        closed) by the caller before it asks for the next. Remote blob stores (S3) read small
        blobs up to _FETCH_AHEAD at a time: one GET after another made a bulk pull wait on 500
        round trips. Errors other than a vanished blob surface in order, as from a plain loop."""

        def opened(digest: str) -> BlobStream | None:
            try:
                return self.blobs.open(digest)
            except BlobNotFound:
                return None

        def fetched(digest: str) -> BlobStream | None:
            try:
                return BlobStream.of(self.blobs.get(digest))
            except BlobNotFound:
                return None

        if self.blobs.name == "file" or len(wanted) < 2:  # local reads: threads would only add cost
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

    def list_kernels(self, namespace: str, after: str, prefix: str, limit: int) -> list[KernelEntry]:
        return [KernelEntry.model_validate_json(r.meta) for r in self.index.list(namespace, KERNEL, after=after, prefix=prefix, limit=limit)]

    def top_kernels(self, namespace: str, by: Literal["size", "hits"], limit: int) -> tuple[int, list[TopKernel]]:
        """``(records scanned, the top ``limit`` kernels by stored size or by hits)``."""
        records = self.all_records(namespace, KERNEL, limit=_TOP_SCAN_LIMIT)
        if by == "size":
            records.sort(key=lambda r: (r.size, r.key), reverse=True)
        else:
            records.sort(key=lambda r: (r.hits, r.last_access, r.key), reverse=True)
        top = [TopKernel(KernelEntry.model_validate_json(r.meta), r.hits, r.last_access or None) for r in records[:limit]]
        return len(records), top

    def delete_kernel(self, namespace: str, key: str) -> None:
        record = self.index.get(namespace, KERNEL, key)
        if record is None or not self._drop(record):
            raise NotFound(f"{KERNEL} {key}")

    # ---- opaque Inductor cache entries ------------------------------------------------------

    def put_entry(
        self, namespace: str, layer: str, key: str, data: bytes, producer: Producer,
        signature: EntrySignature | None = None, supersede: Callable[[EntryInfo], bool] | None = None,
    ) -> tuple[EntryInfo, bool]:
        """Store an entry (write-once). ``signature``: what its envelope says (kept in the index,
        shown by the entry info route); ``supersede``: which stored entry this one may replace."""
        info = EntryInfo(
            namespace=namespace,
            layer=layer,
            key=key,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            created_at=datetime.now(timezone.utc),
            producer=producer,
            signature=signature,
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
        replaceable = None if supersede is None else (lambda existing: supersede(EntryInfo.model_validate_json(existing.meta)))
        self._refuse_quarantined(namespace, layer, key)
        result = self._commit(record, data, replaceable)
        if result.created and self.index.get(namespace, quarantine_kind(layer), key) is not None:
            # Quarantined while this upload committed: the report writes its marker before it
            # drops the entry, so one of the two sees the other; this one takes its record back.
            self._drop(record)
            self._refuse_quarantined(namespace, layer, key)
        return EntryInfo.model_validate_json(result.meta), result.created

    def _refuse_quarantined(self, namespace: str, layer: str, key: str) -> None:
        marker = self.index.get(namespace, quarantine_kind(layer), key)
        if marker is not None:
            raise QuarantinedUpload(f"{layer} entry {key}", QuarantineInfo.model_validate_json(marker.meta).reason)

    def _entry_record(self, namespace: str, layer: str, key: str) -> IndexRecord:
        record = self.index.get(namespace, entry_kind(layer), key)
        if record is None:
            # Only a miss pays for this lookup: a quarantined entry has no record any more.
            marker = self.index.get(namespace, quarantine_kind(layer), key)
            if marker is not None:
                raise Quarantined(f"{layer} entry {key}", QuarantineInfo.model_validate_json(marker.meta).reason)
            raise NotFound(f"{layer} entry {key}")
        return record

    def entry_info(self, namespace: str, layer: str, key: str) -> EntryInfo:
        return EntryInfo.model_validate_json(self._entry_record(namespace, layer, key).meta)

    def delete_entry(self, namespace: str, layer: str, key: str) -> None:
        kind = entry_kind(layer)
        record = self.index.get(namespace, kind, key)
        if record is None or not self._drop(record):
            raise NotFound(f"{kind} {key}")

    def entry_bytes(self, namespace: str, layer: str, key: str) -> tuple[EntryInfo, bytes]:
        record = self._entry_record(namespace, layer, key)
        data = self._read_blob(record)
        self.access.record(namespace, record.kind, [key])
        return EntryInfo.model_validate_json(record.meta), data

    def entry_download_url(self, namespace: str, layer: str, key: str, expires_s: int) -> tuple[EntryInfo, str | None]:
        """An entry's metadata and a presigned URL of its bytes where the blob store makes them
        (S3), else None (quarantined and missing entries raise as :meth:`open_entry` does)."""
        record = self._entry_record(namespace, layer, key)
        url = self.blobs.presigned_get_url(record.digest, expires_s)
        if url is not None:
            self.access.record(namespace, record.kind, [key])
        return EntryInfo.model_validate_json(record.meta), url

    def open_entry(self, namespace: str, layer: str, key: str) -> tuple[EntryInfo, BlobStream]:
        """:meth:`entry_bytes`, streamed (the caller closes the stream)."""
        record = self._entry_record(namespace, layer, key)
        stream = self._open_blob(record)
        self.access.record(namespace, record.kind, [key])
        return EntryInfo.model_validate_json(record.meta), stream

    # ---- quarantine: entries torch could not load --------------------------------------------

    def quarantine_entry(
        self, namespace: str, layer: str, key: str, reason: str, sha256: str | None = None, reporter: str | None = None,
    ) -> tuple[QuarantineInfo, bool]:
        """Take an entry a client could not load out of service for every node: a marker record
        (kind ``quarantine/<layer>``) first, then the entry's record and blob are dropped, so
        reads answer 404 ``quarantined`` and uploads of the key are refused until an admin
        lifts it. ``sha256``: the stored bytes the client got; other content under the key (a
        trusted upload replaced it, or the client's local copy was corrupt) is left alone
        (Conflict). ``(the report in force, whether this call made it)``."""
        kind = quarantine_kind(layer)
        existing = self.index.get(namespace, kind, key)
        if existing is not None:
            return QuarantineInfo.model_validate_json(existing.meta), False
        record = self.index.get(namespace, entry_kind(layer), key)
        if record is not None and sha256 is not None and record.digest != sha256:
            raise Conflict(f"{layer} entry {key} is not the content reported (stored sha256 {record.digest[:16]}...): left in service")
        info = QuarantineInfo(
            namespace=namespace, layer=layer, key=key, reason=reason, quarantined_at=datetime.now(timezone.utc),
            reporter=reporter, entry=EntryInfo.model_validate_json(record.meta) if record is not None else None,
        )
        marker = IndexRecord(namespace=namespace, kind=kind, key=key, digest="", size=0, meta=info.model_dump_json())
        stored = self.index.put_if_absent(marker)
        if record is not None:
            self._drop(record)  # record, then its reference, then its blob if nothing else uses it
        log.warning("%s/%s/%s quarantined: %s", namespace, layer, key, reason)
        return QuarantineInfo.model_validate_json(stored.meta), stored.created_at == marker.created_at

    def quarantine_info(self, namespace: str, layer: str, key: str) -> QuarantineInfo:
        marker = self.index.get(namespace, quarantine_kind(layer), key)
        if marker is None:
            raise NotFound(f"quarantine of {layer} entry {key}")
        return QuarantineInfo.model_validate_json(marker.meta)

    def lift_quarantine(self, namespace: str, layer: str, key: str) -> None:
        """Let the key be uploaded again (the entry itself stays gone)."""
        if not self.index.delete(namespace, quarantine_kind(layer), key):
            raise NotFound(f"quarantine of {layer} entry {key}")

    def quarantined_keys(self, namespace: str, layer: str, keys: list[str]) -> set[str]:
        """Which of ``keys`` of ``layer`` are quarantined (one index call)."""
        return set(self.index.get_many(namespace, quarantine_kind(layer), keys)) if keys else set()

    # ---- the whole store --------------------------------------------------------------------

    def all_records(self, namespace: str, kind: str, limit: int | None = None) -> list[IndexRecord]:
        """Every record of a kind (paged through the index), up to ``limit``."""
        records: list[IndexRecord] = []
        for record in self.iter_records(namespace, kind):
            if limit is not None and len(records) >= limit:
                break
            records.append(record)
        return records

    def iter_records(self, namespace: str, kind: str, meta: bool = True) -> Iterator[IndexRecord]:
        """Every record of a kind, one index page at a time (``meta=False``: without their JSON)."""
        after = ""
        while True:
            page = self.index.list(namespace, kind, after=after, limit=_PAGE, meta=meta)
            if not page:
                return
            yield from page
            after = page[-1].key

    def kinds(self, namespace: str) -> dict[str, KindUsage]:
        """Entries and bytes per record kind (uncollapsed: ``workload/<name>`` each)."""
        return self.index.usage().get(namespace, {})

    def usage(self) -> dict[str, dict[str, KindUsage]]:
        """Entries and bytes per namespace and kind family (see :func:`kcache_server.kinds.family`)."""
        return {ns: collapse_usage(kinds) for ns, kinds in self.index.usage().items()}

    def namespaces(self) -> set[str]:
        """Namespaces that hold anything."""
        return set(self.index.usage())

    def readiness(self) -> dict[str, str]:
        """``"ok"`` or what is wrong, for each backend."""
        checks: dict[str, str] = {}
        for name, backend in (("blobs", self.blobs), ("index", self.index)):
            try:
                backend.ping()
                checks[name] = "ok"
            except BackendUnavailable as exc:
                checks[name] = str(exc)
            except Exception as exc:  # a backend bug must still read as "not ready", not a 500
                checks[name] = f"{type(exc).__name__}: {exc}"
        return checks


def split_kernel_keys(raw: list[str]) -> tuple[list[str], list[str]]:
    """``(valid keys normalised, invalid keys as given)``: bulk requests answer both."""
    valid, invalid = [], []
    for k in raw:
        try:
            valid.append(normalize_kernel_key(k))
        except InvalidKeyError:
            invalid.append(k)
    return valid, invalid


def _cache_amount(kinds: dict[str, KindUsage]) -> Amount:
    cache = [u for kind, u in kinds.items() if is_cache_kind(kind)]
    return Amount(entries=sum(u.entries for u in cache), bytes=sum(u.bytes for u in cache))


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
