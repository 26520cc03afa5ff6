"""kcache: a distributed cache for compiled GPU kernels (Triton, PyTorch Inductor).

``kcache.install()`` hooks Inductor's TritonBundler (and, where enabled, Inductor's remote caches
and Triton's cache manager). With ``KCACHE_URL`` set this happens by itself when Inductor is
imported (see ``kcache._autoload``). This module stays import-light: it runs at interpreter start.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: importing typing at every interpreter start costs ~10 ms
    from typing import Any

__all__ = ["__version__", "install", "uninstall"]


def install(url: str | None = None, **options: Any) -> bool:
    """Activate kcache in this process. Options override ``KCACHE_*`` env vars
    (``token``, ``namespace``, ``mode``, timeouts, ...). Returns False when kcache is off
    (no URL or ``mode="off"``); never raises because the service is unreachable. A setting that
    does not parse raises ``kcache.exceptions.ConfigError`` (a ValueError) naming it, before anything
    is switched on."""
    from kcache.activation import activate

    return activate(url=url, **options)


def uninstall() -> None:
    """Remove every hook and stop the background uploader (flushing with a time cap)."""
    from kcache.activation import deactivate

    deactivate()


def __getattr__(name: str) -> str:
    # ``kcache.__version__`` is read from kcache.version on first use, not here: this module runs
    # at every interpreter start (kcache_autoload.pth), which imports nothing else of kcache.
    if name == "__version__":
        from kcache.version import __version__

        return __version__
    raise AttributeError(f"module 'kcache' has no attribute {name!r}")
