"""What a Triton kernel's cache key is made of, kept for the kernels this process compiles.

Triton's ``compile`` builds its key from named parts, ``get_cache_key(src, backend, options,
env_vars)``: Triton itself (its version and a hash of its own sources), the kernel source (the
function with everything it calls, its signature, constexprs and attributes), the backend (ptxas
version and GPU arch), every compile option (``num_warps``, ``num_stages``, ...) and the
cache-invalidating environment variables. The cache manager then only sees the sha256 of the
joined string. kcache wraps ``get_cache_key`` (the name ``compile`` looks up on each call; the same
in Triton 3.5 to 3.9) and remembers each key's parts by the key the cache manager gets, so that a
kernel the manager misses is recorded with its parts and ``kcache explain`` can name the part
that changed (``options[num_warps]: 4 -> 8``).

Runs in every process that compiles a Triton kernel, cache hits included, so it stays cheap: plain
tuples, a bounded memory, no pydantic (the parts become a ``KeyComponents`` only on a miss).
Values are what Triton hashes into its key, nothing else.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
import threading
from collections import OrderedDict
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kcache.host import patching
from kcache.host.failopen import guard, warn_once

if TYPE_CHECKING:
    from kcache.config import ClientConfig

PATCHES = "kernel-key-parts"
COMPILER = "triton.compiler.compiler"
MAX_REMEMBERED = 1024  # kernels whose parts are kept; a miss asks right after its key was made

Parts = dict[str, tuple[str, str]]  # name -> (hash, value)

_remembered: OrderedDict[str, Parts] = OrderedDict()
_lock = threading.Lock()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:32]


def _put(parts: Parts, name: str, value: object, digest: str | None = None) -> None:
    text = value if isinstance(value, str) else repr(value)
    parts[name] = (digest or _digest(text), text)


def _source_parts(parts: Parts, src: Any) -> None:
    fn = getattr(src, "fn", None)
    if fn is None or not hasattr(fn, "cache_key"):  # an IR file (ttir, ttgir, ...): one part
        _put(parts, "source", f"{getattr(src, 'ext', 'ir')} source", src.hash())
        return
    name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', getattr(src, 'name', '?'))}"
    # The JIT function's key covers its source, the functions it calls and its first line.
    _put(parts, "source[function]", name, _digest(str(fn.cache_key)))
    _put(parts, "source[signature]", sorted(src.signature.items()))
    constants = sorted(src.constants.items())
    _put(parts, "source[constexprs]", [(k, getattr(v, "cache_key", v)) for k, v in constants])
    _put(parts, "source[attrs]", str(src.attrs))


def _option_value(name: str, value: object) -> tuple[str, str | None]:
    """An option's value as shown, and its hash where the repr is not what Triton hashes."""
    if name == "extern_libs" and isinstance(value, (tuple, list)):
        # Triton hashes each library file's contents; the path differs per install.
        libs = [(str(lib), os.path.basename(str(path)), _file_size(str(path))) for lib, path in value]
        return repr([(lib, base) for lib, base, _ in libs]), _digest(repr(libs))
    return repr(value), None


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def parts_of(key: str, src: Any, backend: Any, options: Any, env_vars: Any) -> Parts:
    """The named parts of Triton's key string ``key`` for these arguments of ``get_cache_key``."""
    parts: Parts = {}
    src_hash = src.hash()
    triton = sys.modules.get("triton")
    head = key.split(f"-{src_hash}-", 1)[0]  # triton_key(): version + hashes of Triton's files
    _put(parts, "triton", getattr(triton, "__version__", "?"), _digest(head))
    _source_parts(parts, src)
    _put(parts, "backend", str(backend.hash()))
    for name, value in sorted(vars(options).items()):
        shown, digest = _option_value(name, value)
        _put(parts, f"options[{name}]", shown, digest)
    for name, value in sorted(dict(env_vars).items()):
        _put(parts, f"env[{name}]", str(value))
    return parts


def manager_key(key: str) -> str:
    """The key Triton hands its cache manager for key string ``key`` (``_base32(sha256)``)."""
    # Here, not at module level: `import triton` loads this module and stays free of kcache_schemas.
    from kcache_schemas.keys import hex_to_kernel_key

    return hex_to_kernel_key(hashlib.sha256(key.encode("utf-8")).hexdigest())


def remember(key: str, parts: Parts) -> None:
    known_as = manager_key(key)
    with _lock:
        _remembered[known_as] = parts
        _remembered.move_to_end(known_as)
        while len(_remembered) > MAX_REMEMBERED:
            _remembered.popitem(last=False)


def recall(manager_key: str) -> Parts | None:
    """The parts of the kernel the cache manager knows as ``manager_key``; None if not seen."""
    with _lock:
        return _remembered.get(manager_key)


def hook(compiler: ModuleType) -> None:
    """Wrap ``compiler.get_cache_key`` (a finished ``triton.compiler.compiler``), once."""
    with guard("could not hook Triton's cache key"):  # runs inside the user's `import triton`
        _hook(compiler)


def _hook(compiler: ModuleType) -> None:
    if patching.is_patched(PATCHES):
        return
    original = getattr(compiler, "get_cache_key", None)
    try:
        params = list(inspect.signature(original).parameters) if callable(original) else []
    except (TypeError, ValueError):
        params = []
    if original is None or params != ["src", "backend", "backend_options", "env_vars"]:
        warn_once("this Triton's get_cache_key is not the one kcache knows; kernel misses are recorded without their parts")
        return

    def get_cache_key(src: Any, backend: Any, backend_options: Any, env_vars: Any) -> Any:
        key = original(src, backend, backend_options, env_vars)
        with guard("could not record a Triton key's parts"):
            if isinstance(key, str):
                remember(key, parts_of(key, src, backend, backend_options, env_vars))
        return key

    patching.patch(PATCHES, compiler, "get_cache_key", get_cache_key)


def install() -> None:
    """Hook Triton's key once ``triton.compiler.compiler`` has finished importing (if Triton is
    installed at all)."""
    if patching.is_patched(PATCHES):
        return
    import importlib.util

    try:
        if importlib.util.find_spec("triton") is None:
            return
    except (ImportError, ValueError):
        return
    from kcache.host.after_import import call_after_import

    call_after_import(COMPILER, hook)


def uninstall() -> None:
    patching.restore(PATCHES)
    with _lock:
        _remembered.clear()


# ---- the layer protocol (kcache.layers.protocol) -------------------------------------------------

NAME = "kernel-key-parts"
STORES: tuple[str, ...] = ()  # remembers each key's parts, for explanations and the canary


def selected(config: ClientConfig) -> bool:
    return True


def install_layer(config: ClientConfig, hooked: ModuleType | None = None) -> None:
    install()
