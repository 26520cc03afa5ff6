"""One key form for cache entries, whichever command printed it.

Inductor's remote caches store an entry under its own key wrapped in the cache's id
(``pt2:fx-graph-v1::<key>:c1``), while torch's logs, ``kcache stats``/``explain`` and
``KCACHE_REQUIRE_HIT`` name Inductor's own ``<key>``. Every command prints that short form for
the layers whose cache id is fixed (:data:`INDUCTOR_CACHE_IDS`) and accepts both; any other key
is printed and accepted as stored.
"""

from __future__ import annotations

import re

from kcache_schemas import wire

L = wire.CacheLayer
# layer -> the cache id torch formats its keys with (torch/_inductor/remote_cache.py
# RedisRemoteCache: ``pt2:{cache_id}::{key}:c{version}``). Autotune caches use a content hash as
# their id: their keys are shown as stored.
INDUCTOR_CACHE_IDS = {
    L.FX_GRAPH.value: "fx-graph-v1",
    L.AOT_AUTOGRAD.value: "autograd-experimental",
    L.DYNAMO_PGO.value: "dynamo-pgo",
}
_VERSION = 1
_STORED = re.compile(r"^pt2:(?P<id>[^:]+)::(?P<key>[^:]+):c(?P<version>\d+)$")


def shown(layer: str, stored: str) -> str:
    """How commands print a stored entry key: Inductor's own key where the form is known."""
    match = _STORED.match(stored)
    if match and INDUCTOR_CACHE_IDS.get(layer) == match["id"] and int(match["version"]) == _VERSION:
        return match["key"]
    return stored


def stored_forms(layer: str, given: str) -> list[str]:
    """The keys ``given`` may be stored under, most likely first: as given, and wrapped the way
    torch stores the layer's keys when ``given`` is Inductor's short form."""
    cache_id = INDUCTOR_CACHE_IDS.get(layer)
    if cache_id is None or _STORED.match(given):
        return [given]
    return [f"pt2:{cache_id}::{given}:c{_VERSION}", given]
