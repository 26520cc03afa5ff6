"""``KCACHE_REQUIRE_HIT=warn|fail``: a compile kcache should have served is said, or fails the job.

For CI gates and serving fleets where a recompile is an incident. After activation (and the
workload prefetch, which lookups already wait for), an Inductor lowering whose FX graph missed
locally and remotely, or a Triton compile of a kernel kcache did not have, is named with the
reason :mod:`kcache.reporting.explanations` finds (nearest stored key, the parts that differ). ``warn`` logs it
and changes nothing else; ``fail`` raises :class:`RequiredHitMissed` into the compile, the one
place kcache raises on purpose, because the user asked for it.
"""

from __future__ import annotations

import logging

from kcache_schemas import wire
from kcache_schemas.key_diff import KeyComponents, graph_key

from kcache.current import get_runtime
from kcache.host.failopen import guard, warn_once

log = logging.getLogger("kcache")
KERNEL = wire.CacheLayer.KERNEL.value
VLLM = wire.CacheLayer.VLLM.value


class RequiredHitMissed(RuntimeError):
    """A compile ran that ``KCACHE_REQUIRE_HIT=fail`` says kcache must have served."""


def _reason(missed: KeyComponents) -> str:
    """The explanation, bounded by the client's timeouts; a plain note when none can be found."""
    rt = get_runtime()
    if rt is None or rt.client is None:
        return "not in the cache"
    from kcache.reporting.explanations import explain_key
    from kcache.store.fingerprint import current

    with guard("could not explain a miss"):
        return explain_key(rt.client, missed.layer, missed.key, workload=rt.config.workload,
                           environment=current(), wanted=missed).headline()
    return "not in the cache"


def compile_ahead(layer: str, missed: KeyComponents) -> None:
    """Called right before a compile kcache could not avoid; raises in ``fail`` mode."""
    rt = get_runtime()
    policy = rt.config.require_hit if rt is not None else None
    if not policy:
        return
    if layer == KERNEL and policy != "fail":
        # A cold kernel set is hundreds of compiles: said once, without a lookup per kernel.
        warn_once("KCACHE_REQUIRE_HIT=warn: Triton compiles kernels kcache did not have, e.g. " + missed.key)
        return
    what = {KERNEL: "Triton must compile kernel", VLLM: "vLLM must compile its model"}.get(layer, f"Inductor must compile {layer}")
    message = (f"KCACHE_REQUIRE_HIT={policy}: {what} {graph_key(missed.key)}: {_reason(missed)}"
               " (run `kcache explain --file $KCACHE_STATS_FILE` for every miss)")
    if policy == "fail":
        raise RequiredHitMissed("kcache: " + message)
    log.warning("kcache: %s", message)
