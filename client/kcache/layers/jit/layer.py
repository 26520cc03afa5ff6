"""The ``jit`` layer: native modules that JIT builders compile, served under content keys.

One layer, one adapter per builder (``kcache.layers.jit.inductor_cpp``: Inductor's own C++ builds;
``kcache.layers.jit.torch_extensions``: torch's cpp_extension; ``kcache.layers.jit.tvm_ffi``: tvm-ffi's JIT). An
adapter computes the content key of a build (:mod:`kcache.layers.jit.content_keys`), asks :func:`fetch` before
the builder runs the compiler, writes what it gets where the builder looks with
:func:`install_file`, and hands what the builder compiled to :func:`upload`.

An entry goes through :meth:`Runtime.get_entry` like every entry (local tier, the workload's
prefetch, the service; signed entries checked before a byte is used: the bytes are native code
loaded into the process, like ``triton-module`` host modules), then through the container's own
check (every file's size and sha256, :mod:`kcache_schemas.jit`), before anything is written. An
entry that is refused, or that the builder then cannot load (:func:`refuse`), is a miss: counted as
an error, warned about once, dropped from the local tier, and the builder compiles; one the
service sent damaged is quarantined for every node besides (:func:`fetch`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from kcache_schemas import jit as artifact
from kcache_schemas import wire

from kcache.current import get_runtime
from kcache.host.failopen import warn_once
from kcache.host.process_roles import in_inductor_compile_worker

if TYPE_CHECKING:
    from kcache.layers.jit.content_keys import BuildKey
    from kcache.runtime import Runtime

LAYER = wire.CacheLayer.JIT.value


def serving_runtime() -> Runtime | None:
    """The runtime, if there is one that talks to a service and serves this layer (``KCACHE_LAYERS``)."""
    rt = get_runtime()
    if rt is None or rt.client is None or not _serves_jit(rt.config.layers):
        return None
    return rt


@functools.lru_cache(maxsize=8)
def _serves_jit(layers: str | None) -> bool:
    from kcache.config import selected_layers

    return LAYER in selected_layers(layers)


def fetch(rt: Runtime, key: str, adapter: str, accept: Callable[[Mapping[str, bytes]], None] | None = None) -> Mapping[str, bytes] | None:
    """The files of ``key``'s entry, verified (a malformed or damaged one, or one ``accept``
    raises ValueError for, is refused by :meth:`Runtime.get_entry`: an error, not a hit); None on
    a miss or a refusal. A damaged local copy is dropped and the service asked; a damaged copy
    from the service is also quarantined (:meth:`Runtime.quarantine`): the container's sizes and
    sha256 and the file checks are the same on every node, so no node will get it again."""

    def check(data: bytes) -> None:
        found = artifact.decode(data)
        if found.adapter != adapter:
            raise artifact.JitArtifactError(f"an entry of another adapter than {adapter!r}")
        if accept is not None:
            accept(found.files)

    data = rt.get_entry(LAYER, key, validate=check, quarantine_invalid=True)
    return artifact.decode(data).files if data is not None else None


def refuse(rt: Runtime, key: str, why: str) -> None:
    """An entry that passed every check and that the builder could not load here: counted, said
    once, and dropped from the local tier so the next process asks the service again. Not
    quarantined: the bytes are the producer's, whole, and a library that does not load on this
    node (a shared library it links missing here) may load on the others."""
    rt.stats.error(LAYER, "refused")
    rt.stats.verify("refused", f"{LAYER}: {why[:200]}")
    warn_once(f"refused a {LAYER} entry ({why}); the builder compiles it")
    with contextlib.suppress(Exception):
        rt.local.discard(LAYER, key)


def missed(rt: Runtime, build: BuildKey) -> None:
    """Counted for ``kcache explain``, with the key's parts stored beside it."""
    from kcache_schemas.key_diff import from_parts

    rt.record_miss(from_parts(LAYER, build.key, build.parts), now=in_inductor_compile_worker())


def upload(rt: Runtime, key: str, adapter: str, files: Mapping[str, bytes], build_s: float | None) -> None:
    # Encoded (sizes, sha256 of every file) in the uploader thread, off the build's path.
    rt.put_entry(LAYER, key, functools.partial(artifact.encode, adapter, dict(files)), build_s, now=in_inductor_compile_worker())


def install_file(path: str, data: bytes, mode: int = 0o755) -> None:
    """Write ``data`` at ``path`` whole or not at all (a temp file in the same dir, then
    ``os.replace``): a process that finds the file finds it complete."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.kcache-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
