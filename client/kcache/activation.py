"""What ``kcache.install()`` switches on, and ``kcache.uninstall()`` off."""

from __future__ import annotations

import logging
import sys
from typing import Any

from kcache.config import ClientConfig
from kcache.runtime import get_runtime, start_runtime, stop_runtime

log = logging.getLogger("kcache")


def activate(**overrides: Any) -> bool:
    config = ClientConfig.from_env(**overrides)
    if not config.enabled:
        return False
    rt = start_runtime(config)
    if "torch" in sys.modules or _torch_importable():
        try:
            from kcache.bundler_hooks import install_bundler_hooks

            install_bundler_hooks(rt)
        except Exception as exc:
            rt.warn_once("could not hook TritonBundler", exc)
    return True


def deactivate() -> None:
    if "torch._inductor.triton_bundler" in sys.modules:
        from kcache.bundler_hooks import uninstall_bundler_hooks

        uninstall_bundler_hooks()
    stop_runtime()


def _torch_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


__all__ = ["activate", "deactivate", "get_runtime"]
