"""A replica signs each blob's download URL once per reuse window (issue #31): real S3 (SeaweedFS).

Before, every request signed afresh: a fleet start paid the SigV4 CPU once per node and blob, and
no two nodes got the same URL, so nothing that caches by URL in front of S3 could help."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import servers
from kcache_server.storage import BlobStore
from kcache_server.storage.file_blobs import FileBlobStore
from kcache_server.store import presigned_urls
from kcache_server.store.presigned_urls import PresignedUrls

from kcache_testkit.pace import HANG_S


@pytest.fixture
def s3(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    with servers.s3_view(request, tmp_path) as store:
        yield store


def _blob(store: BlobStore, text: str) -> tuple[str, bytes]:
    data = text.encode() * 50
    digest = hashlib.sha256(data).hexdigest()
    store.put(digest, data)
    return digest, data


def _expires(url: str) -> int:
    return int(parse_qs(urlsplit(url).query)["X-Amz-Expires"][0])


def test_one_url_per_blob_per_window_each_valid_for_the_set_lifetime(s3: BlobStore) -> None:
    now = [1000.0]
    urls = PresignedUrls(s3, reuse_s=60, clock=lambda: now[0])
    digest, data = _blob(s3, "pack a")
    other, _ = _blob(s3, "pack b")

    first = urls.url(digest, 300)
    assert first is not None and urls.url(digest, 300) == first
    # Signed for the lifetime plus the window: handed out up to 60 s later it still has >= 300 s.
    assert _expires(first) == 360
    assert httpx.get(first, timeout=HANG_S).content == data
    now[0] += 59.0
    assert urls.url(digest, 300) == first
    assert (urls.signed, urls.handed_out) == (1, 3)

    assert urls.url(other, 300) not in (None, first)  # each blob its own URL
    assert urls.url(digest, 600) is not None and urls.signed == 3  # another lifetime, another URL
    now[0] += 2.0  # the window is over: signed again
    again = urls.url(digest, 300)
    assert urls.signed == 4 and again is not None and _expires(again) == 360
    assert httpx.get(again, timeout=HANG_S).content == data


def test_reuse_zero_signs_every_url_for_the_set_lifetime(s3: BlobStore) -> None:
    urls = PresignedUrls(s3, reuse_s=0)
    digest, _ = _blob(s3, "pack c")
    for _ in range(3):
        url = urls.url(digest, 300)
        assert url is not None and _expires(url) == 300
    assert urls.signed == 3


def test_the_url_memory_is_bounded(s3: BlobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(presigned_urls, "MAX_URLS", 3)
    urls = PresignedUrls(s3, reuse_s=60)
    digests = [_blob(s3, f"pack {i}")[0] for i in range(5)]
    for d in digests:
        urls.url(d, 300)
    assert urls.signed == 5
    urls.url(digests[-1], 300)  # recent: kept
    assert urls.signed == 5
    urls.url(digests[0], 300)  # the oldest was dropped: signed again
    assert urls.signed == 6


def test_a_store_without_urls_gives_none(tmp_path: Path) -> None:
    files = FileBlobStore(tmp_path / "blobs")
    urls = PresignedUrls(files, reuse_s=60)
    digest, _ = _blob(files, "pack d")
    assert urls.url(digest, 300) is None and urls.signed == 0
