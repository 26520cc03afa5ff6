"""What ``kcache.install()`` switches on, and ``kcache.uninstall()`` off: the process's runtime
(:mod:`kcache.current`), then every cache layer of :mod:`kcache.layers.layer_registry` in its order,
each inside its own fail-open guard; uninstall walks the layers back."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from types import ModuleType
from typing import Any

from kcache.config import ClientConfig, settings_or_off
from kcache.current import ensure_runtime, stop_runtime
from kcache.host import patching
from kcache.host.failopen import guard
from kcache.layers import layer_registry as registry

log = logging.getLogger("kcache")
_env_before: dict[str, str | None] = {}  # KCACHE_* values install() replaced


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
    torch_here: bool | None = None  # asked once, when the first layer that needs torch comes
    for entry in registry.LAYERS:
        if entry.needs_torch:
            if torch_here is None:
                torch_here = "torch" in sys.modules or importlib.util.find_spec("torch") is not None
            if not torch_here:
                continue
        _install(entry, config)
    return True


def _install(entry: registry.Registered, config: ClientConfig, hooked: ModuleType | None = None) -> None:
    """One layer, inside its own fail-open guard: a layer that cannot install leaves torch alone
    and the others installed."""
    with guard(entry.failure):
        layer = registry.load(entry)
        if layer.selected(config):
            layer.install_layer(config, hooked)


def activate_vllm(_decorators: ModuleType) -> bool:
    """What a vLLM process needs before its first compile-cache lookup (the ``.pth`` calls it
    right after ``vllm.compilation.decorators``'s code ran, which may precede Inductor's import):
    the runtime and the vllm layer; the rest activates with Inductor as always."""
    config = settings_or_off()  # the .pth calls this: a bad setting is one warning, kcache off
    if config is None or not config.enabled:
        return False
    ensure_runtime(config)
    _install(registry.registered("kcache.layers.vllm_compile_cache"), config)
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
    layer = "kcache.layers.jit.tvm_ffi" if extension.__name__ == "tvm_ffi.cpp.extension" else "kcache.layers.jit.torch_extensions"
    _install(registry.registered(layer), config, extension)
    return True


def deactivate() -> None:
    for entry in reversed(registry.LAYERS):  # each hands over what it holds, then unhooks
        layer = registry.installed_perhaps(entry)
        if layer is not None:
            layer.uninstall()
    patching.restore_all()
    # Otherwise processes started after uninstall() would still autoload kcache from KCACHE_URL.
    for var, value in _env_before.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    _env_before.clear()
    stop_runtime()
