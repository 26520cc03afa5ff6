"""Opaque Inductor cache entries (``/v1/{namespace}/entries/{layer}/{key}``): bytes in, bytes out.

The store never deserialises them (FX-graph entries carry pickles); it keeps what a signed
entry's envelope says in the index (shown by the entry info route) and, where the namespace
requires registered producer keys, lets a trusted upload replace an entry no registered key
signed (``supersede``, :mod:`kcache_server.producer_keys`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime, timezone

from kcache_schemas import EntryInfo, EntrySignature, Producer
from kcache_schemas.models import EntryRef, EntryUrl, EntryUrls

from kcache_server.domain_errors import NotFound
from kcache_server.kinds import entry_kind
from kcache_server.storage import BlobStream, Index, IndexRecord
from kcache_server.store.access_recorder import AccessRecorder
from kcache_server.store.blob_references import BlobReferences
from kcache_server.store.commit import CommitProtocol
from kcache_server.store.presigned_urls import PresignedUrls
from kcache_server.store.quarantine import Quarantine


class CacheEntries:
    def __init__(
        self, urls: PresignedUrls, index: Index, access: AccessRecorder, commits: CommitProtocol,
        references: BlobReferences, quarantine: Quarantine,
    ) -> None:
        self._urls, self._index, self._access = urls, index, access
        self._commits, self._references, self._quarantine = commits, references, quarantine

    def put(
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
        result = self._quarantine.commit(layer, record, data, replaceable)
        return EntryInfo.model_validate_json(result.meta), result.created

    def _record(self, namespace: str, layer: str, key: str) -> IndexRecord:
        return self._quarantine.stored(namespace, entry_kind(layer), layer, key, f"{layer} entry {key}")

    def info(self, namespace: str, layer: str, key: str) -> EntryInfo:
        return EntryInfo.model_validate_json(self._record(namespace, layer, key).meta)

    def listing(self, namespace: str, layer: str, after: str, prefix: str, limit: int) -> list[EntryInfo]:
        records = self._index.list(namespace, entry_kind(layer), after=after, prefix=prefix, limit=limit)
        return [EntryInfo.model_validate_json(r.meta) for r in records]

    def delete(self, namespace: str, layer: str, key: str) -> None:
        kind = entry_kind(layer)
        record = self._index.get(namespace, kind, key)
        if record is None or not self._references.drop(record):
            raise NotFound(f"{kind} {key}")

    def read(self, namespace: str, layer: str, key: str) -> tuple[EntryInfo, bytes]:
        record = self._record(namespace, layer, key)
        data = self._commits.read(record)
        self._access.record(namespace, record.kind, [key])
        return EntryInfo.model_validate_json(record.meta), data

    def download_url(self, namespace: str, layer: str, key: str, expires_s: int) -> tuple[EntryInfo, str | None]:
        """An entry's metadata and a presigned URL of its bytes where the blob store makes them
        (S3), else None (quarantined and missing entries raise as :meth:`open` does)."""
        record = self._record(namespace, layer, key)
        url = self._urls.url(record.digest, expires_s)
        if url is not None:
            self._access.record(namespace, record.kind, [key])
        return EntryInfo.model_validate_json(record.meta), url

    def download_urls(self, namespace: str, refs: list[EntryRef], expires_s: int | None) -> EntryUrls:
        """Presigned URLs of many entries, one index read per layer (``expires_s`` None: presigned
        downloads are off, and every stored entry is ``inline``: to be fetched by its GET).
        Quarantined entries have no record: they are ``missing``, as their GET is a refusal."""
        wanted = list(dict.fromkeys((ref.layer, ref.key) for ref in refs))
        by_layer: dict[str, list[str]] = {}
        for layer, key in wanted:
            by_layer.setdefault(layer, []).append(key)
        records = {layer: self._index.get_many(namespace, entry_kind(layer), keys) for layer, keys in by_layer.items()}
        urls: list[EntryUrl] = []
        inline: list[EntryRef] = []
        missing: list[EntryRef] = []
        for layer, key in wanted:
            record = records[layer].get(key)
            if record is None:
                missing.append(EntryRef(layer=layer, key=key))
                continue
            url = self._urls.url(record.digest, expires_s) if expires_s is not None else None
            if url is None:
                inline.append(EntryRef(layer=layer, key=key))
                continue
            info = EntryInfo.model_validate_json(record.meta)
            urls.append(EntryUrl(layer=layer, key=key, url=url, sha256=info.sha256, compile_time_s=info.producer.compile_time_s))
        for layer in by_layer:  # the inline ones are recorded when their GETs serve them
            signed = [u.key for u in urls if u.layer == layer]
            if signed:
                self._access.record(namespace, entry_kind(layer), signed)
        return EntryUrls(urls=urls, inline=inline, missing=missing, expires_s=expires_s if urls and expires_s else 0)

    def open(self, namespace: str, layer: str, key: str) -> tuple[EntryInfo, BlobStream]:
        """:meth:`read`, streamed (the caller closes the stream)."""
        record = self._record(namespace, layer, key)
        stream = self._commits.open(record)
        self._access.record(namespace, record.kind, [key])
        return EntryInfo.model_validate_json(record.meta), stream
