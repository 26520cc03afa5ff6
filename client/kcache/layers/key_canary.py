"""The key-soundness canary (``KCACHE_CANARY``): compile a sample of hits anyway and compare.

A fleet cache multiplies whatever its keys get wrong: a factor that changes the compiled output
but is not in the key (the SDPA backend outside Inductor's FX key, pytorch#185449; an option
outside Triton's autotune key, triton#10880) makes one node's code be served to another, silently.
kcache sees every consumer of a key, so it can check: on a sampled hit (``KCACHE_CANARY``: the
share of hits, 0 by default), the node compiles as if it had missed, on the normal compile path
(no extra thread or process: Inductor or Triton compiles as on any miss), and compares its output
with the entry it would have been served:

* **FX graphs**: the generated Python module (``CompiledFxGraph.source_code``: the wrapper and,
  inline, every C++ and Triton kernel's source), with absolute paths cut to their file names and
  Inductor's per-process ``# AOT ID`` line dropped. Stable: Inductor generates it from the graph,
  the inputs and its settings alone (identical on two nodes with other HOME and TMPDIR, checked).
* **Triton kernels** (hits of Triton's cache manager): every file of the kernel dir but the group
  file (which names absolute paths): the IR (``.source``, ``.ttir``, ``.ttgir``, ``.llir``,
  ``.ptx``) and the metadata ``.json`` as text, absolute paths cut to their file names; the
  binaries (``.cubin``, ...) by sha256 when the IR matched byte for byte (ptxas is deterministic,
  but the binary embeds the source's path in its line info, so it is only compared where the
  paths agree).

Agreement is counted (``audited`` in the stats' post-install checks). A difference means the key
is unsound: the node keeps its own output (Inductor and Triton use what they just compiled), and
:meth:`kcache.runtime.Runtime.quarantine` takes the entry out of service for every node, with an
:class:`~kcache_schemas.unsound_reports.UnsoundReport`: what differed, both compiles' recorded key parts,
context and environments, and the suspects (``kcache explain --key KEY``).

What it cannot catch: output that is not a function of the key's inputs on any node (autotuning
picks winners by measuring: graphs compiled with ``max_autotune`` or coordinate-descent tuning
are not audited, counted as ``audit_skipped``), and a factor that is the same on the sampled node
and the producer. Each key is sampled at most once per process (per runtime: what the canary
samples and holds under audit is the runtime's, :class:`Audits`); a key under audit reads as a
miss until its compile is compared.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kcache_schemas import wire
from kcache_schemas.key_diff import graph_key

from kcache.current import get_runtime
from kcache.host.failopen import warn_once

if TYPE_CHECKING:
    from kcache.runtime import Runtime

FX_GRAPH = wire.CacheLayer.FX_GRAPH.value
KERNEL = wire.CacheLayer.KERNEL.value
FX_COMPARED = "generated Python module (wrapper and inline kernel sources), absolute paths cut to file names, '# AOT ID' dropped"
KERNEL_COMPARED = ("kernel dir files but the group file: IR and .json metadata as text with absolute paths cut to file names; "
                   "binaries by sha256 where the IR matched byte for byte")
_TEXT_SUFFIXES = (".source", ".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn", ".json", ".spv", ".txt")
_GROUP_PREFIX = "__grp__"
# An absolute path of at least two parts, after a quote, a bracket, a space or '=' / ':' (IR
# locations, .file directives, comments naming a kernel path, metadata): cut to its file name.
_ABS_PATH = re.compile(r"(?<=[\"'(\s=:])/(?:[\w.+@-]+/)+([\w.+@-]+)")
_AOT_ID = re.compile(r"^# AOT ID: .*$", re.MULTILINE)
_AUTOTUNE_SWITCHES = ("max_autotune", "max_autotune_gemm", "max_autotune_pointwise", "coordinate_descent_tuning")


def normalise(text: str) -> str:
    """Generated code or IR without what differs between two nodes that compiled the same
    thing: absolute paths (to their file names) and the per-process AOT id."""
    return _ABS_PATH.sub(lambda m: "<path>/" + m.group(1), _AOT_ID.sub("", text))


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


@dataclass(frozen=True)
class _ServedGraph:
    service_key: str  # as stored (Inductor's remote form)
    stored_sha256: str  # of the stored bytes handed to Inductor ("": ask the local tier)
    source: str  # normalised
    debug_lines: tuple[str, ...]  # this node's key parts, as Inductor printed them


@dataclass
class Audits:
    """The canary's audits under one runtime (:meth:`Runtime.layer_state`): a reinstalled
    kcache samples and audits as a fresh process does, and an audit under way belongs to the
    installation that started it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    served: threading.local = field(default_factory=threading.local)  # .entry: the FX entry last handed to Inductor on this thread
    pending_fx: dict[str, _ServedGraph] = field(default_factory=dict)  # Inductor's graph key -> the served graph under audit
    pending_kernels: dict[str, bytes] = field(default_factory=dict)  # kernel key -> the served pack under audit
    decided: set[tuple[str, str]] = field(default_factory=set)  # keys sampled or passed over: once per runtime
    retried: set[str] = field(default_factory=set)  # graph keys under audit asked for again (AOTAutograd's retry)


def audits(rt: Runtime) -> Audits:
    return rt.layer_state(Audits)


def _on(rt: Runtime | None) -> bool:
    return rt is not None and rt.config.canary > 0


def _sampled(rt: Runtime, layer: str, key: str) -> bool:
    """Whether to audit this hit: once per key and runtime, with probability KCACHE_CANARY."""
    state = audits(rt)
    with state.lock:
        if (layer, key) in state.decided:
            return False
        state.decided.add((layer, key))
    share = rt.config.canary
    return share >= 1 or random.random() < share


def _autotuned() -> bool:
    config = sys.modules.get("torch._inductor.config")
    return any(bool(getattr(config, name, False)) for name in _AUTOTUNE_SWITCHES)


# ---- FX graphs -------------------------------------------------------------------------------


def note_served(layer: str, service_key: str, stored: bytes) -> None:
    """kcache handed Inductor an FX-graph entry (its remote backend's read): remembered on this
    thread until the lookup returns. Only while the canary is on."""
    rt = get_runtime()
    if layer == FX_GRAPH and rt is not None and _on(rt):
        audits(rt).served.entry = (service_key, stored)


def fx_lookup(answer: Any, key: str) -> Any:
    """``FxGraphCache.load_with_key``'s answer, or a miss in its place when this hit is audited
    (or its key is under audit): Inductor then compiles the graph on its normal path, and
    :func:`fx_compiled` compares when Inductor stores it."""
    rt = get_runtime()
    if rt is None:
        return answer
    state = audits(rt)
    served = getattr(state.served, "entry", None)
    state.served.entry = None
    if not _on(rt) or not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], dict)):
        return answer
    graph, info = answer
    if info.get("cache_state") != "hit":
        return answer
    with state.lock:
        under_audit = key in state.pending_fx
        first_retry = under_audit and key not in state.retried
        if first_retry:
            state.retried.add(key)
        elif under_audit:  # asked a third time, never compiled: the audit is given up, the hit used
            del state.pending_fx[key]
    if first_retry:  # asked again before its compile was compared (AOTAutograd's retry)
        return None, {**info, "cache_state": "miss"}
    if under_audit:
        rt.stats.verify("audit_skipped", "fx-graph: Inductor did not compile the audited graph")
        return answer
    if served is None or graph_key(served[0]) != key:
        return answer  # a hit of Inductor's own local cache: this node's compile
    if not _sampled(rt, FX_GRAPH, key):
        return answer
    if _autotuned():
        rt.stats.verify("audit_skipped", "fx-graph: autotuned (its choices are measured, so two compiles may differ)")
        return answer
    source = getattr(graph, "source_code", None)
    lines = info.get("components")
    if not isinstance(source, str):
        rt.stats.verify("audit_skipped", "fx-graph: the graph carries no generated source")
        return answer
    # The quarantine names the stored bytes: what Inductor got, unless a signature envelope was
    # opened on the way (then the local tier's stored copy is hashed when it is reported).
    stored_sha256 = _sha(served[1]) if rt.signing is None else ""
    with state.lock:
        state.pending_fx[key] = _ServedGraph(
            served[0], stored_sha256, normalise(source),
            tuple(line for line in lines if isinstance(line, str)) if isinstance(lines, list) else (),
        )
    return None, {**info, "cache_state": "miss"}


def fx_compiled(service_key: str, data: bytes) -> bool:
    """Inductor stores a graph it compiled (its remote backend's write): if its key is under
    audit, compare it with the served one. True: it was an audit (not to be uploaded: the key
    holds the served entry, or it is quarantined)."""
    key = graph_key(service_key)
    rt = get_runtime()
    if rt is None:
        return False
    state = audits(rt)
    with state.lock:
        served = state.pending_fx.pop(key, None)
    if served is None:
        return False
    import pickle

    from kcache.store import fx_graph_envelope

    own = normalise(str(getattr(pickle.loads(fx_graph_envelope.pickled_graph(data)), "source_code", "")))
    if own == served.source:
        rt.stats.verify("audited", "fx-graph: same generated code")
        return True
    from kcache_schemas.key_diff import parse_debug_lines

    from kcache.layers import key_context

    components = parse_debug_lines(served.debug_lines)
    _report(rt, FX_GRAPH, key, served.service_key, served.stored_sha256, FX_COMPARED,
            {"generated code": served.source}, {"generated code": own},
            components, key_context.fx_graph(components))
    return True


# ---- Triton kernels --------------------------------------------------------------------------


def kernel_audit(rt: Runtime, key: str) -> bool | None:
    """Before kcache emits a kernel for Triton's cache manager: ``None`` not audited (serve it
    as usual); ``True`` audited: the served pack is held and Triton compiles the kernel
    (:func:`kernel_compiled` compares when Triton stores it); ``False`` sampled, but kcache has
    no such kernel (a miss)."""
    if not _on(rt):
        return None
    state = audits(rt)
    with state.lock:
        if key in state.pending_kernels:
            return True
    if not _sampled(rt, KERNEL, key):
        return None
    pack = rt.kernel_pack(key)
    if pack is None:
        return False
    with state.lock:
        state.pending_kernels[key] = pack
    return True


def _kernel_texts(files: dict[str, bytes]) -> tuple[dict[str, str], dict[str, bytes]]:
    """A kernel dir's files but the group file: normalised texts, and binaries as they are."""
    texts: dict[str, str] = {}
    binaries: dict[str, bytes] = {}
    for name, data in files.items():
        if name.startswith(_GROUP_PREFIX):
            continue
        if name.endswith(_TEXT_SUFFIXES):
            texts[name] = data.decode("utf-8", "replace")
        else:
            binaries[name] = data
    return texts, binaries


def kernel_compiled(rt: Runtime, key: str, kernel_dir: Path) -> bool:
    """Triton stored a kernel it compiled (its cache manager's ``put_group``): if the kernel is
    under audit, compare its dir with the served pack. True: it was an audit (not uploaded)."""
    state = audits(rt)
    with state.lock:
        pack = state.pending_kernels.pop(key, None)
    if pack is None:
        return False
    from kcache_schemas import PackError
    from kcache_schemas.pack import read_kernel_dir, read_pack

    try:
        _manifest, served_files = read_pack(pack)
        own_files = read_kernel_dir(kernel_dir)
    except (PackError, OSError) as exc:
        warn_once(f"kcache's canary could not compare kernel {key}", exc)
        rt.stats.verify("audit_skipped", f"kernel: {type(exc).__name__}")
        return True
    served_raw, served_bin = _kernel_texts(served_files)
    own_raw, own_bin = _kernel_texts(own_files)
    served_text = {n: normalise(t) for n, t in served_raw.items()}
    own_text = {n: normalise(t) for n, t in own_raw.items()}
    if served_raw == own_raw:  # the binaries embed the same paths: comparable byte for byte
        served_text |= {n: "sha256:" + _sha(b) for n, b in served_bin.items()}
        own_text |= {n: "sha256:" + _sha(b) for n, b in own_bin.items()}
    else:
        served_text |= {n: "(binary, not compared)" for n in served_bin}
        own_text |= {n: "(binary, not compared)" for n in own_bin}
    if served_text == own_text:
        rt.stats.verify("audited", "kernel: same IR and binaries")
        return True
    from kcache_schemas.key_diff import from_parts

    from kcache.layers import key_context
    from kcache.layers.triton import kernel_key_parts

    parts = kernel_key_parts.recall(key) or {}
    components = from_parts(KERNEL, key, parts).components
    _report(rt, KERNEL, key, key, _sha(pack), KERNEL_COMPARED, served_text, own_text, components,
            key_context.kernel())
    return True


# ---- the report ------------------------------------------------------------------------------


# A kernel's files as a reader compares them: the metadata first, then the IR from the top down.
_READING_ORDER = (".json", ".source", ".ttir", ".ttgir", ".llir", ".ptx")


def _reading_order(name: str) -> tuple[int, str]:
    rank = next((i for i, suffix in enumerate(_READING_ORDER) if name.endswith(suffix)), len(_READING_ORDER))
    return rank, name


def _digest(outputs: dict[str, str]) -> str:
    return _sha(json.dumps(outputs, sort_keys=True))


def _report(
    rt: Runtime, layer: str, key: str, stored_key: str, stored_sha256: str, compared: str,
    served: dict[str, str], own: dict[str, str], components: dict[str, Any], context: dict[str, tuple[str, str]],
) -> None:
    """The key is unsound: quarantine the entry for everyone, with both sides' recorded inputs."""
    from kcache_schemas.key_diff import KeyComponents, from_parts
    from kcache_schemas.unsound_reports import MAX_DIFF_LINES, UnsoundReport, suspects, unified_diff

    differing = sorted((n for n in served.keys() | own.keys() if served.get(n) != own.get(n)), key=_reading_order)
    lines: list[str] = []
    share = max(8, MAX_DIFF_LINES // max(1, len(differing)))  # every differing file shows, the first ones most
    for name in differing:
        lines += unified_diff(served.get(name, ""), own.get(name, ""), f"served/{name}", f"own/{name}")[:share]
    consumer = rt.with_origin(KeyComponents(layer=layer, key=key, components=components,
                                            context=from_parts(layer, key, context).components))
    producer = None
    client = rt.client
    if client is not None:
        from kcache.reporting.explanations import fetch_components

        try:
            producer = fetch_components(client, layer, key)
        except Exception:  # diagnostic only: the quarantine goes ahead without the producer's parts
            producer = None
    report = UnsoundReport(
        layer=layer, key=stored_key, compared=compared, served_digest=_digest(served), own_digest=_digest(own),
        output_diff=lines[:MAX_DIFF_LINES], producer=producer, consumer=consumer, suspects=suspects(producer, consumer),
    )
    what = ", ".join(differing[:4]) + (f" (+{len(differing) - 4} more)" if len(differing) > 4 else "")
    rt.quarantine(layer, stored_key, f"unsound key: own compile differs from the entry in {what}",
                  sha256=stored_sha256 or None, unsound=report)
