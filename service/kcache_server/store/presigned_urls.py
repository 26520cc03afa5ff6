"""Presigned download URLs, each blob's signed once per reuse window and handed out again.

A fleet start asks every replica for URLs of the same few hundred blobs, once per node. Signing
each time costs CPU for nothing (SigV4: about 0.24 ms a URL on the bench machine, a sixth of a
replica's busy time in a presigned burst), and it makes every node's URL differ, so nothing in
front of the object store that caches by URL (a CDN, a pull-through proxy) can serve one node's
GET from another's. Here a replica signs a blob's URL once, valid for ``expires_s + reuse_s``,
and hands that same URL out for ``reuse_s``: every URL handed out is still valid for at least
``expires_s``, the lifetime the operator set. Other replicas (and worker processes) sign their own:
a cache keyed by URL sees one URL per blob per process per window.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from kcache_server.storage import BlobStore

# How many blobs' URLs a replica keeps (least recently handed out dropped first): a workload's
# packs and entries are hundreds; a URL is about 600 bytes, so this is at most ~10 MB.
MAX_URLS = 16384


class PresignedUrls:
    """``reuse_s`` 0: sign every URL afresh (as before there was reuse). ``clock``: monotonic
    seconds (tests pass their own)."""

    def __init__(self, blobs: BlobStore, reuse_s: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self._blobs, self.reuse_s, self._clock = blobs, reuse_s, clock
        self._urls: OrderedDict[tuple[str, int], tuple[float, str]] = OrderedDict()
        self._lock = threading.Lock()
        # How many URLs were signed and how many handed out (signed ones included): the reuse rate.
        self.signed = 0
        self.handed_out = 0

    def url(self, digest: str, expires_s: int) -> str | None:
        """A URL the blob can be fetched from for at least ``expires_s`` more seconds, or None
        where the blob store makes none (files)."""
        if not self._blobs.presigns:
            return None
        key = (digest, expires_s)
        now = self._clock()
        with self._lock:
            self.handed_out += 1
            held = self._urls.get(key)
            if held is not None and now - held[0] < self.reuse_s:
                self._urls.move_to_end(key)
                return held[1]
        # Signing happens outside the lock; two threads that sign the same blob at once both
        # hand out valid URLs, and the later one is kept.
        url = self._blobs.presigned_get_url(digest, expires_s + self.reuse_s)
        if url is None or self.reuse_s <= 0:
            with self._lock:
                self.signed += 1
            return url
        with self._lock:
            self.signed += 1
            self._urls[key] = (now, url)
            self._urls.move_to_end(key)
            while len(self._urls) > MAX_URLS:
                self._urls.popitem(last=False)
        return url
