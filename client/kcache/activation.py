"""What ``kcache.install()`` switches on, and ``kcache.uninstall()`` off."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from types import ModuleType
from typing import Any

from kcache import patching
from kcache.config import ClientConfig, selected_layers, settings_or_off
from kcache.current import ensure_runtime, stop_runtime
from kcache.failopen import guard

log = logging.getLogger("kcache")
TRITON_MANAGER = "kcache.triton_manager:KcacheCacheManager"
_env_before: dict[str, str | None] = {}  # KCACHE_* values install() replaced


def use_triton_manager(config: ClientConfig) -> None:
    """Route Triton's cache lookups through kcache's tiered manager unless the user chose one.

    Set in the environment so Inductor's compile worker processes inherit it."""
    if config.triton_manager:
        os.environ.setdefault("TRITON_CACHE_MANAGER", TRITON_MANAGER)


def activate(**overrides: Any) -> bool:
    """``kcache.install()``: a setting that does not parse raises ConfigError, before anything is
    switched on."""
    return _activate(ClientConfig.from_env(**overrides), overrides)


def autoactivate() -> bool:
    """Activation nobody asked for in code (``KCACHE_URL`` at interpreter start): a setting that
    does not parse is one warning and kcache stays off, never a less strict kcache than asked."""
    config = settings_or_off()
    return config is not None and _activate(config, {})


def _activate(config: ClientConfig, overrides: dict[str, Any]) -> bool:
    if not config.enabled:
        return False
    # Explicit install() arguments must reach Inductor's compile workers too.
    for name in ("url", "token", "namespace", "mode"):
        if overrides.get(name) is not None:
            var = f"KCACHE_{name.upper()}"
            _env_before.setdefault(var, os.environ.get(var))  # uninstall() puts it back
            os.environ[var] = str(overrides[name])
    # The hooks look the runtime up on every call: a second install() with other options is
    # the one they use from now on.
    ensure_runtime(config)
    use_triton_manager(config)
    with guard("could not hook Triton's cache key"):
        from kcache import kernel_key_parts

        kernel_key_parts.install()
    _serve_tvm_ffi(config)  # hooked when tvm_ffi.cpp.extension is imported; nothing imported here
    if "torch" in sys.modules or importlib.util.find_spec("torch") is not None:
        with guard("could not hook TritonBundler"):
            from kcache.bundler_hooks import install_bundler_hooks

            install_bundler_hooks()
        with guard("could not serve Inductor's remote caches"):
            from kcache.remote_cache import install_remote_caches

            install_remote_caches(selected_layers(config.layers))
        with guard("could not serve Dynamo's precompile cache"):
            from kcache import dynamo_cache

            if dynamo_cache.LAYER in selected_layers(config.layers):
                dynamo_cache.install()
        with guard("could not serve Inductor's C++ builds"):
            from kcache import inductor_cpp
            from kcache.jit_layer import LAYER as JIT_LAYER

            if JIT_LAYER in selected_layers(config.layers):
                inductor_cpp.install()
        _serve_torch_extensions(config)
        _serve_vllm(config)
        with guard("could not hook Inductor's FX-graph lookup"):
            from kcache import key_components

            key_components.install()
        with guard("could not hook Inductor's autotune recheck"):
            from kcache.coordesc_reuse import install as install_coordesc_reuse

            install_coordesc_reuse(config.coordesc_reuse)
        with guard("could not key Inductor's local autotune cache by this node's dir"):
            from kcache_schemas import wire

            from kcache import autotune_paths

            if wire.CacheLayer.AUTOTUNE.value in selected_layers(config.layers):  # so a fresh node asks kcache's layer
                autotune_paths.install()
    return True


def _serve_torch_extensions(config: ClientConfig, module: ModuleType | None = None) -> None:
    with guard("could not serve torch's extension JIT"):
        from kcache import torch_extensions
        from kcache.jit_layer import LAYER as JIT_LAYER

        if JIT_LAYER in selected_layers(config.layers):
            torch_extensions.install(module)


def _serve_tvm_ffi(config: ClientConfig, module: ModuleType | None = None) -> None:
    with guard("could not serve tvm-ffi's JIT"):
        from kcache import tvm_ffi_jit
        from kcache.jit_layer import LAYER as JIT_LAYER

        if JIT_LAYER in selected_layers(config.layers):
            tvm_ffi_jit.install(module)


def _serve_vllm(config: ClientConfig) -> None:
    with guard("could not serve vLLM's compile cache"):
        from kcache import vllm_cache

        if vllm_cache.LAYER in selected_layers(config.layers):
            vllm_cache.install()


def activate_vllm(_decorators: ModuleType) -> bool:
    """What a vLLM process needs before its first compile-cache lookup (the ``.pth`` calls it
    right after ``vllm.compilation.decorators``'s code ran, which may precede Inductor's import):
    the runtime and the vllm layer; the rest activates with Inductor as always."""
    config = settings_or_off()  # the .pth calls this: a bad setting is one warning, kcache off
    if config is None or not config.enabled:
        return False
    ensure_runtime(config)
    _serve_vllm(config)
    return True


def activate_extensions(extension: ModuleType) -> bool:
    """What a process that builds JIT extensions (``torch.utils.cpp_extension`` or
    ``tvm_ffi.cpp.extension``) but may never use Inductor needs (the ``.pth`` calls it right after
    that module's code ran): the runtime and that builder's hooks, none of Inductor's modules
    imported."""
    config = settings_or_off()  # the .pth calls this: a bad setting is one warning, kcache off
    if config is None or not config.enabled:
        return False
    ensure_runtime(config)
    if extension.__name__ == "tvm_ffi.cpp.extension":
        _serve_tvm_ffi(config, extension)
    else:
        _serve_torch_extensions(config, extension)
    return True


def deactivate() -> None:
    if "kcache.dynamo_cache" in sys.modules:
        from kcache import dynamo_cache

        dynamo_cache.uninstall()  # hands over what this process compiled, then unhooks
    if "kcache.remote_cache" in sys.modules:
        from kcache.remote_cache import uninstall_remote_caches

        uninstall_remote_caches()  # also forgets the layers a later-loading module would serve
    if "kcache.inductor_cpp" in sys.modules:
        from kcache import inductor_cpp

        inductor_cpp.uninstall()
    if "kcache.vllm_cache" in sys.modules:
        from kcache import vllm_cache

        vllm_cache.uninstall()  # lets uploads in flight finish, then unhooks
    if "kcache.torch_extensions" in sys.modules:
        from kcache import torch_extensions

        torch_extensions.uninstall()
    if "kcache.tvm_ffi_jit" in sys.modules:
        from kcache import tvm_ffi_jit

        tvm_ffi_jit.uninstall()
    patching.restore_all()
    if "kcache.canary" in sys.modules:
        from kcache import canary

        canary.reset()  # audits under way belong to this installation's runtime
    if os.environ.get("TRITON_CACHE_MANAGER") == TRITON_MANAGER:
        del os.environ["TRITON_CACHE_MANAGER"]
    # Otherwise processes started after uninstall() would still autoload kcache from KCACHE_URL.
    for var, value in _env_before.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    _env_before.clear()
    stop_runtime()
