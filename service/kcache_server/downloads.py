"""The download log (opt-in, ``KCACHE_DOWNLOAD_LOG=1``): one line per artifact the service hands out.

Why it exists: proving that the processes of a node download each kernel pack and cache entry
once (issue #33: a multi-rank job on one node) needs counts per key. The metrics count per layer
(bounded label sets, on purpose), and uvicorn's access log names one path per request, while a
``kernels:batch-get`` carries its keys in its body. This log names every key handed out:

* ``GET .../kernels/{key}``: the pack (``via=get``), or the presigned URL it redirects to
  (``via=redirect``: the bytes then come from the object store, once per redirect);
* ``POST .../kernels:batch-get``: each pack as its turn in the stream comes (``via=batch-get``;
  a pack whose blob vanished is not logged: the client sees it missing);
* ``GET .../entries/{layer}/{key}``: the entry (``via=get``), or its redirect (``via=redirect``);
* ``POST .../kernels:batch-urls`` and ``.../entries:batch-urls``: each presigned URL handed out
  (``via=url``: the bytes then come from the object store).

HEAD, manifests, file views and misses are not downloads and are not logged. A line is written
when the service starts sending the artifact (a client that goes away mid-body still counts).
The lines go to the ``kcache_server.downloads`` logger at INFO (``kcache serve`` writes them as
JSON lines on stderr, the text in ``msg``); :func:`parse` reads one back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from fastapi import Request
from kcache_schemas import wire

from kcache_server.settings import Settings
from kcache_server.storage import BlobStream

log = logging.getLogger("kcache_server.downloads")
KERNEL_LAYER = wire.CacheLayer.KERNEL.value
_PREFIX = "download "


@dataclass(frozen=True)
class Download:
    namespace: str
    layer: str  # "kernel" or an entry layer
    key: str
    via: str  # "get", "batch-get", "redirect" or "url"
    size: int  # bytes sent (0 for a redirect)
    peer: str  # the client's host:port as the service saw it


def record(settings: Settings, request: Request, namespace: str, layer: str, key: str, via: str, size: int) -> None:
    if not settings.download_log:
        return
    peer = f"{request.client.host}:{request.client.port}" if request.client else "-"
    log.info("%sns=%s layer=%s key=%s via=%s bytes=%d peer=%s", _PREFIX, namespace, layer, key, via, size, peer)


def batch_packs(
    settings: Settings, request: Request, namespace: str, packs: Iterator[tuple[str, BlobStream]]
) -> Iterator[tuple[str, BlobStream]]:
    """A batch-get's packs, each logged as its turn in the stream comes."""
    for key, blob in packs:
        record(settings, request, namespace, KERNEL_LAYER, key, "batch-get", blob.size)
        yield key, blob


def parse(msg: str) -> Download | None:
    """The download a log line's message records, None for any other message. Keys and
    namespaces never hold spaces (the schemas' key grammar), and a field's name ends at its first
    ``=`` (an entry key may hold more), so the fields split cleanly."""
    if not msg.startswith(_PREFIX):
        return None
    fields = dict(part.partition("=")[::2] for part in msg[len(_PREFIX):].split())
    try:
        return Download(fields["ns"], fields["layer"], fields["key"], fields["via"], int(fields["bytes"]), fields["peer"])
    except (KeyError, ValueError):
        return None
