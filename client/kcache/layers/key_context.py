"""What a compile depended on beyond its cache key, recorded beside the key's parts.

A key misses a factor when something changes the compiled output without changing the key
(the SDPA backend outside Inductor's FX key, a rank, an option left out of Triton's). When the
key-soundness canary (:mod:`kcache.layers.key_canary`) finds two compiles of one key that disagree, the
factor is among what differs between the two compiles' *recorded inputs*; the key's own parts
are equal by definition. So each key's parts are recorded with this context:

* ``inductor_config[<name>]`` for every Inductor setting the key's parts do not already carry
  (torch leaves some out of its key on purpose: ``_cache_config_ignore_prefix``,
  ``_save_config_ignore``; a torch bug may leave out others), but those naming a directory or
  file (they differ per node), FX-graph keys only;
* ``backends[<switch>]``: torch's global switches that select kernels (SDPA backends, TF32,
  cuDNN), read from torch's own flags, FX-graph keys only;
* ``distributed[rank]``, ``distributed[world_size]`` from ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``;
* ``env[<name>]`` for ``TORCHINDUCTOR_*``, ``TORCH_*``, ``TRITON_*`` and ``PYTORCH_*`` variables
  by the sha256 of their value only (values may be anything; what differs is named, not shown),
  without those that name a directory (they differ per node and change no output).

Runs where a key missed (once per compile) or a canary audit found a difference; never on a hit.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable, Mapping

Parts = dict[str, tuple[str, str]]  # name -> (hash, value), as kernel_key_parts
_ENV_PREFIXES = ("TORCHINDUCTOR_", "TORCH_", "TRITON_", "PYTORCH_")
_DIR_SUFFIXES = ("_DIR", "_PATH", "_HOME", "_ROOT", "_FILE")
_PLACE_SUFFIXES = tuple(s.lower() for s in _DIR_SUFFIXES)
_RANK_VARS = (("rank", "RANK"), ("local_rank", "LOCAL_RANK"), ("world_size", "WORLD_SIZE"))
# torch.backends switches that choose kernels without appearing in Inductor's FX key on every
# torch (pytorch#185449: the SDPA backend). Read as attributes or zero-argument calls.
_BACKEND_SWITCHES = (
    ("cuda.flash_sdp", "torch.backends.cuda", "flash_sdp_enabled"),
    ("cuda.mem_efficient_sdp", "torch.backends.cuda", "mem_efficient_sdp_enabled"),
    ("cuda.math_sdp", "torch.backends.cuda", "math_sdp_enabled"),
    ("cuda.cudnn_sdp", "torch.backends.cuda", "cudnn_sdp_enabled"),
    ("cuda.matmul.allow_tf32", "torch.backends.cuda.matmul", "allow_tf32"),
    ("cudnn.enabled", "torch.backends.cudnn", "enabled"),
    ("cudnn.allow_tf32", "torch.backends.cudnn", "allow_tf32"),
    ("cudnn.benchmark", "torch.backends.cudnn", "benchmark"),
    ("cudnn.deterministic", "torch.backends.cudnn", "deterministic"),
    ("mkldnn.enabled", "torch.backends.mkldnn", "enabled"),
)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:32]


def _put(parts: Parts, name: str, value: object) -> None:
    text = value if isinstance(value, str) else repr(value)
    parts[name] = (_digest(text), text)


def common() -> Parts:
    """The rank and the compile-related environment variables (by hash): every layer's context."""
    parts: Parts = {}
    for name, var in _RANK_VARS:
        if (value := os.environ.get(var)) is not None:
            _put(parts, f"distributed[{name}]", value)
    for var in sorted(os.environ):
        if var.startswith(_ENV_PREFIXES) and not var.endswith(_DIR_SUFFIXES):
            digest = _digest(os.environ[var])
            parts[f"env[{var}]"] = (digest, f"sha256:{digest[:12]}")
    return parts


def _backend_switches() -> Parts:
    parts: Parts = {}
    for name, module_name, attr in _BACKEND_SWITCHES:
        module = sys.modules.get(module_name)
        value = getattr(module, attr, None) if module is not None else None
        if value is None:
            continue
        try:
            value = value() if callable(value) else value
        except Exception:
            continue
        _put(parts, f"backends[{name}]", value)
    return parts


def _inductor_settings(in_key: Iterable[str]) -> Parts:
    """Every Inductor setting whose ``inductor_config[<name>]`` the key's parts lack."""
    config = sys.modules.get("torch._inductor.config")
    copy = getattr(config, "get_config_copy", None)
    if copy is None:
        return {}
    known = set(in_key)
    parts: Parts = {}
    for name, value in sorted(copy().items()):
        label = f"inductor_config[{name}]"
        if label in known or callable(value) or _names_a_place(name, value):
            continue
        _put(parts, label, value)
    return parts


def _names_a_place(name: str, value: object) -> bool:
    """Settings that name a directory or file (``cuda.cutlass_dir``, resolved against the working
    directory): they differ per node and change no output, so they would only hide the suspect."""
    return name.endswith(_PLACE_SUFFIXES) or (isinstance(value, str) and os.path.isabs(value))


def fx_graph(key_parts: Mapping[str, object]) -> Parts:
    """The context of an FX-graph compile whose key has ``key_parts`` (names)."""
    return {**_inductor_settings(key_parts), **_backend_switches(), **common()}


def kernel() -> Parts:
    """The context of a Triton kernel compile (Triton hashes its options and env vars itself)."""
    return common()
