"""Every cache layer, in the order activation installs them (uninstall runs in reverse).

Adding a layer is adding its module (implementing :class:`kcache.layers.protocol.Layer`) and one
line here. Modules are named, not imported: a layer's module is imported only when it is
installed, so a process without torch never imports a torch layer (``needs_torch``), and
``kcache.triton_manager``, which Triton imports for every kernel it loads, stays light.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from kcache.layers.protocol import Layer


@dataclass(frozen=True)
class Registered:
    module: str  # the layer's module
    failure: str  # the one warning when installing it fails (kcache.host.failopen.guard)
    needs_torch: bool = True  # installed only where torch is importable


LAYERS: tuple[Registered, ...] = (
    Registered("kcache.layers.triton.manager_switch", "could not route Triton's cache through kcache", needs_torch=False),
    Registered("kcache.layers.triton.kernel_key_parts", "could not hook Triton's cache key", needs_torch=False),
    # Hooked when tvm_ffi.cpp.extension is imported: nothing is imported here.
    Registered("kcache.layers.jit.tvm_ffi", "could not serve tvm-ffi's JIT", needs_torch=False),
    Registered("kcache.layers.inductor.triton_bundler", "could not hook TritonBundler"),
    Registered("kcache.layers.inductor.remote_caches", "could not serve Inductor's remote caches"),
    Registered("kcache.layers.dynamo.packages", "could not serve Dynamo's precompile cache"),
    Registered("kcache.layers.jit.inductor_cpp", "could not serve Inductor's C++ builds"),
    Registered("kcache.layers.jit.torch_extensions", "could not serve torch's extension JIT"),
    Registered("kcache.layers.vllm_compile_cache", "could not serve vLLM's compile cache"),
    Registered("kcache.layers.inductor.key_components", "could not hook Inductor's FX-graph lookup"),
    Registered("kcache.layers.inductor.coordesc_reuse", "could not hook Inductor's autotune recheck"),
    Registered("kcache.layers.inductor.autotune_paths", "could not key Inductor's local autotune cache by this node's dir"),
)


def registered(module: str) -> Registered:
    (entry,) = [e for e in LAYERS if e.module == module]
    return entry


def load(entry: Registered) -> Layer:
    return cast("Layer", importlib.import_module(entry.module))


def installed_perhaps(entry: Registered) -> Layer | None:
    """The layer if it may have been installed, without importing what was never imported: a
    torch layer only if its module was (importing it to uninstall it would cost an import for
    nothing); a layer that needs no torch always (its module is light, and it may have been
    switched on before kcache activated: ``kcache._autoload`` routes Triton's cache and hooks its
    key at interpreter start)."""
    if entry.needs_torch:
        return cast("Layer | None", sys.modules.get(entry.module))
    return load(entry)


if TYPE_CHECKING:  # mypy checks that every registered module implements the protocol
    from kcache.layers import vllm_compile_cache
    from kcache.layers.dynamo import packages
    from kcache.layers.inductor import (
        autotune_paths,
        coordesc_reuse,
        key_components,
        remote_caches,
        triton_bundler,
    )
    from kcache.layers.jit import inductor_cpp, torch_extensions, tvm_ffi
    from kcache.layers.triton import kernel_key_parts, manager_switch

    _CONFORM: tuple[Layer, ...] = (
        manager_switch, kernel_key_parts, tvm_ffi, triton_bundler, remote_caches, packages, inductor_cpp,
        torch_extensions, vllm_compile_cache, key_components, coordesc_reuse, autotune_paths,
    )
