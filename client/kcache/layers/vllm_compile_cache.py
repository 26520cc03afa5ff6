"""vLLM's compile cache served by kcache: the ``vllm`` layer.

vLLM (torch ≥ 2.10: AOT compile, its default) keeps one compiled model per hash of what it
compiles (``aot_compile_hash_factors``: vLLM's version, its compile-relevant environment variables,
its configs, the model's ``forward``) and per rank, under ``VLLM_CACHE_ROOT``::

    torch_compile_cache/torch_aot_compile/<64 hex>/rank_<tp>_<dp>/model   the compiled model
    torch_compile_cache/torch_aot_compile/<64 hex>/inductor_cache/        TORCHINDUCTOR_CACHE_DIR

A start that finds ``model`` loads it ("Directly load AOT compilation from path ...") and skips
Dynamo, AOTAutograd and Inductor; the Inductor cache beside it holds what loading still needs
(on the CPU the compiled C++ kernels; on GPUs the generated wrappers). kcache serves that pair
fleet-wide, keyed by vLLM's own hash, the rank dir and kcache's environment fingerprint (torch,
triton, CUDA/HIP, GPU arch), none of it a path:

* **lookup**: vLLM's ``_try_load_aot_compiled_fn(model, path)`` is wrapped. Where ``model`` is
  not on disk, the entry is asked of kcache (local tier, the workload's prefetch, the service:
  :meth:`Runtime.get_entry`, signatures checked when signing is on), decoded and verified
  (:mod:`kcache_schemas.tree`: every file's size and sha256, paths confined to this rank's dir
  and the Inductor cache), and installed: Inductor files each atomically (an existing file
  wins), then the rank dir staged and renamed into place, ``model`` last. Then vLLM's own
  loader runs, as on a local hit. Nothing is rewritten: vLLM and Inductor find their files
  relative to the hash dir, so the entry is relocation-safe (another ``VLLM_CACHE_ROOT``, HOME
  or node).
* **refusal**: an entry that fails verification is never installed (an error, not a hit). One
  vLLM cannot load (its loader returns None: it logs "Compiling model again due to a load
  failure") is removed from the dir and quarantined for every node (:meth:`Runtime.quarantine`),
  and vLLM compiles as on a miss; a source-changed refusal (vLLM checks the sources it traced
  against the ones of this node) is dropped here only, since the entry is right for the nodes
  whose vLLM it came from.
* **store**: once vLLM saved a model it compiled (``save_aot_compiled_function``, right after
  the compile, before the engine serves), the rank dir and the Inductor cache are packed on a
  kcache thread and uploaded then (serving processes do not exit): signed if signing is on,
  recorded in the workload. The thread is not a daemon: a process that ends right away (an engine
  core that multiprocessing started ends through ``threading._shutdown``) still finishes it.
  Triton's kernel dirs (``inductor_cache/triton/``) are left out: their group files hold absolute
  paths, and kcache's kernel layer serves them relocation-safe.
* **explain and must-hit**: a miss records the parts vLLM hashes (each compile-relevant
  environment variable, each config's hashed fields, the model's ``forward``) beside the key, so
  ``kcache explain`` names what differs from the nearest stored entry; ``KCACHE_REQUIRE_HIT``
  names (``warn``) or fails (``fail``) a compile kcache could not avoid.

vLLM's piecewise cache without AOT (``VLLM_USE_AOT_COMPILE=0``: ``torch_compile_cache/<10 hex>/``)
is not served by this layer: its key is known only after Dynamo traced the model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import types
import uuid
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from kcache_schemas import tree as trees
from kcache_schemas import wire
from kcache_schemas.key_diff import KeyComponents, from_parts

from kcache.config import ClientConfig, selected_layers
from kcache.current import get_runtime
from kcache.host import patching
from kcache.host.after_import import call_after_import, imported
from kcache.host.failopen import guard, warn_once
from kcache.runtime import Runtime
from kcache.store import fingerprint

log = logging.getLogger("kcache.layers.vllm_compile_cache")

LAYER = wire.CacheLayer.VLLM.value
PATCHES = "vllm-cache"
DECORATORS = "vllm.compilation.decorators"
KEY_PREFIX = "vllm-aot-v1:"
TREE_KIND = "vllm-aot"
AOT_DIR = "torch_aot_compile"
INDUCTOR_DIR = "inductor_cache"
MODEL_FILE = "model"
# Left out of an entry: Triton's kernel dirs (group files with absolute paths; the kernel layer
# serves them), locks, bytecode caches and the temp files of writes in flight.
_SKIP_DIRS = {"triton", "locks", "__pycache__"}
_SKIP_SUFFIXES = (".lock", ".tmp")
_RANK = re.compile(r"rank_\d{1,4}_\d{1,4}")
_HASH = re.compile(r"[0-9a-f]{64}")



@dataclasses.dataclass
class Models:
    """What the layer learned serving one runtime (:meth:`Runtime.layer_state`): a reinstalled
    kcache, or one installed with other options, knows none of it, as a fresh process does."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    # model path -> (service key, when vLLM started compiling)
    misses: dict[str, tuple[str, float]] = dataclasses.field(default_factory=dict)
    # model path -> (service key, size, mtime_ns) kcache wrote
    installed: dict[str, tuple[str, int, int]] = dataclasses.field(default_factory=dict)
    uploads: list[threading.Thread] = dataclasses.field(default_factory=list)  # joined at close
    # .changed: vLLM's source check refused the model being loaded
    source_check: threading.local = dataclasses.field(default_factory=threading.local)


def _state(rt: Runtime | None) -> Models:
    """``rt``'s state of this layer (a throwaway where no runtime runs: nothing is kept)."""
    return rt.layer_state(Models) if rt is not None else Models()


@dataclasses.dataclass(frozen=True)
class AotEntry:
    """Where one rank's compiled model lives: ``<hash_dir>/<rank>/model``."""

    hash_dir: str
    vllm_hash: str
    rank: str

    @property
    def rank_dir(self) -> str:
        return os.path.join(self.hash_dir, self.rank)

    @property
    def model_path(self) -> str:
        return os.path.join(self.rank_dir, MODEL_FILE)

    def service_key(self) -> str:
        """vLLM's hash and the rank dir (what vLLM keys the file by), and the environment."""
        return f"{KEY_PREFIX}{self.vllm_hash}:{self.rank}:{fingerprint.current().id}"


def locate(model_path: str) -> AotEntry | None:
    """The entry of ``.../torch_aot_compile/<64 hex>/rank_<i>_<j>/model``; None for another shape."""
    rank_dir, name = os.path.split(os.path.abspath(model_path))
    hash_dir, rank = os.path.split(rank_dir)
    aot_dir, vllm_hash = os.path.split(hash_dir)
    if name != MODEL_FILE or not _RANK.fullmatch(rank) or not _HASH.fullmatch(vllm_hash) or os.path.basename(aot_dir) != AOT_DIR:
        return None
    return AotEntry(hash_dir, vllm_hash, rank)


# ---- install / uninstall -------------------------------------------------------------------------


def install() -> None:
    """Serve the layer once vLLM's compile decorators have loaded (or now, if they have)."""
    rt = get_runtime()
    if rt is not None:  # activation made it first
        rt.at_close("finish vLLM uploads", wait_for_uploads)
    call_after_import(DECORATORS, _hook_decorators)


def uninstall() -> None:
    with guard("could not finish vLLM uploads"):
        wait_for_uploads()
    patching.restore(PATCHES)


def _hook_decorators(module: types.ModuleType) -> None:
    with guard("could not hook vLLM's compile cache; layer vllm not served"):
        load = patching.current(module, "_try_load_aot_compiled_fn")
        verify = patching.current(module, "_verify_source_unchanged")
        rt = get_runtime()
        if rt is None or not selected(rt.config) or getattr(load, "__wrapped__", None) is not None:
            return  # uninstalled before the module loaded (or not selected), or hooked already
        if not callable(load):
            warn_once("this vLLM has no _try_load_aot_compiled_fn; layer vllm not served (vLLM compiles as without kcache)")
            return
        patching.patch(PATCHES, module, "_try_load_aot_compiled_fn", _wrap_load(load))
        if callable(verify):  # called through the module's globals by the loader
            patching.patch(PATCHES, module, "_verify_source_unchanged", _wrap_verify(verify))


def _serving() -> Runtime | None:
    rt = get_runtime()
    return rt if rt is not None and rt.client is not None and selected(rt.config) else None


# ---- lookup --------------------------------------------------------------------------------------


def _wrap_load(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _try_load_aot_compiled_fn(model: Any, aot_compilation_path: str, *args: Any, **kwargs: Any) -> Any:
        missed: KeyComponents | None = None
        with guard("vllm lookup failed"):
            missed = _lookup(model, str(aot_compilation_path))
        if missed is not None:
            from kcache.layers.require_hit import compile_ahead

            compile_ahead(LAYER, missed)  # raises only under KCACHE_REQUIRE_HIT=fail: the user's ask
        source_check = _state(get_runtime()).source_check
        source_check.changed = False
        try:
            result = original(model, aot_compilation_path, *args, **kwargs)  # vLLM's, unguarded
        except BaseException:  # VLLM_FORCE_AOT_LOAD: vLLM raises on a failed load by itself
            with guard("vllm lookup failed"):
                _loaded(model, str(aot_compilation_path), None)
            raise
        with guard("vllm lookup failed"):
            _loaded(model, str(aot_compilation_path), result)
        return result

    return _try_load_aot_compiled_fn


def _wrap_verify(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _verify_source_unchanged(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)  # vLLM's, unguarded
        except Exception:
            _state(get_runtime()).source_check.changed = True
            raise

    return _verify_source_unchanged


def _lookup(model: Any, path: str) -> KeyComponents | None:
    """Install kcache's entry for ``path`` if vLLM has none on disk; the miss to name (must-hit)
    if kcache has none either."""
    rt = _serving()
    entry = locate(path)
    if rt is None or entry is None or os.path.exists(path):
        return None  # not served, another layout, or vLLM's own local entry: vLLM reads it
    key = entry.service_key()
    state = _state(rt)
    with state.lock:
        if path in state.installed:
            return None  # installed already under this runtime (a second model class of one hash)
    verified: list[trees.Tree] = []  # the tree the check decoded: verified once, not twice
    data = rt.get_entry(LAYER, key, validate=lambda payload: verified.append(_check(entry, payload)))
    if data is not None:
        size, mtime = install_tree(entry, verified[-1] if verified else _check(entry, data))
        with state.lock:
            state.installed[path] = (key, size, mtime)
        return None
    missed = from_parts(LAYER, key, key_parts(model, entry))
    rt.record_miss(missed)
    with state.lock:
        state.misses[path] = (key, time.monotonic())
    return missed


def _check(entry: AotEntry, data: bytes) -> trees.Tree:
    """The payload's tree, verified; ValueError for one that is not a tree of this rank's model."""
    tree = trees.decode(data)
    if tree.kind != TREE_KIND:
        raise trees.TreeError(f"an entry of another kind than {TREE_KIND!r}")
    if f"{entry.rank}/{MODEL_FILE}" not in tree.files:
        raise trees.TreeError(f"no {entry.rank}/{MODEL_FILE} in the entry")
    for path in tree.files:
        if not (path.startswith(f"{entry.rank}/") or path.startswith(f"{INDUCTOR_DIR}/")):
            raise trees.TreeError(f"{path[:120]!r} lies outside {entry.rank}/ and {INDUCTOR_DIR}/")
    return tree


def _loaded(model: Any, path: str, result: Any) -> None:
    """After vLLM's loader: a kcache entry it refused leaves the dir (and, unless vLLM's source
    check refused it, the fleet); a compile that follows is watched for its save."""
    rt = get_runtime()
    state = _state(rt)
    with state.lock:
        installed = state.installed.pop(path, None) if result is None else None
    if installed is not None:
        key, size, mtime = installed
        with contextlib.suppress(OSError):
            st = os.stat(path)
            if (st.st_size, st.st_mtime_ns) == (size, mtime):  # still the file kcache wrote
                os.unlink(path)
        if rt is not None:
            if getattr(state.source_check, "changed", False):
                rt.stats.error(LAYER, "source_changed")
                rt.stats.verify("refused", f"{LAYER}: vLLM's sources differ from the producer's")
                warn_once("vLLM refused a vllm entry kcache supplied: its traced sources differ from this node's; vLLM compiles")
                with contextlib.suppress(Exception):
                    rt.local.discard(LAYER, key)
            else:
                rt.quarantine(LAYER, key, "vLLM could not load the compiled model (_try_load_aot_compiled_fn)")
        with state.lock:
            state.misses[path] = (key, time.monotonic())
    if result is None:
        _watch_save(model)


# ---- what vLLM hashes (for kcache explain) -------------------------------------------------------


def key_parts(model: Any, entry: AotEntry) -> dict[str, tuple[str, str]]:
    """The named parts of vLLM's AOT hash, as ``name -> (digest, value)``: each compile-relevant
    environment variable (``vllm.envs.compile_factors``: what vLLM also writes to
    ``cache_key_factors.json``), each config's hashed fields, the model's ``forward``, the rank
    and kcache's environment fingerprint."""
    parts: dict[str, tuple[str, str]] = {}

    def add(name: str, value: Any) -> None:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=repr)
        parts[name] = (hashlib.sha256(text.encode()).hexdigest()[:32], text)

    vllm = imported("vllm")
    add("vllm.version", str(getattr(vllm, "__version__", None)))
    envs = imported("vllm.envs")
    factors = getattr(envs, "compile_factors", None)
    if callable(factors):
        with guard("could not read vLLM's compile factors"):
            for name, value in sorted(factors().items()):
                add(f"env.{name}", value)
    config = getattr(model, "vllm_config", None)
    with guard("could not read vLLM's config factors"):
        for name, value in config_factors(config).items():
            add(name, value)
    forward = getattr(model, "forward", None)
    code = getattr(forward, "__code__", None)
    add("model.forward", f"{getattr(forward, '__qualname__', None)}:{getattr(code, 'co_firstlineno', None)}")
    add("rank", entry.rank)
    for name, value in fingerprint.current().model_dump().items():
        add(f"environment.{name}", value)
    return parts


def config_factors(config: Any) -> dict[str, Any]:
    """Every factor ``VllmConfig.compute_hash`` hashes, as ``config.<Config>.<field>``: vLLM's
    own ``get_hash_factors`` is watched while ``compute_hash`` runs (it is what each config's
    ``compute_hash`` calls), so the fields are exactly the ones vLLM keys by; a config that hashes
    otherwise appears as ``config.<field>`` with its hash."""
    compute = getattr(config, "compute_hash", None)
    utils = imported("vllm.config.utils")
    get_factors = getattr(utils, "get_hash_factors", None)
    if not callable(compute):
        return {}
    seen: dict[str, Any] = {}
    if callable(get_factors) and utils is not None:

        def watched(cfg: Any, *args: Any, **kwargs: Any) -> dict[str, object]:
            found: dict[str, object] = get_factors(cfg, *args, **kwargs)
            seen.setdefault(type(cfg).__name__, found)
            return found

        with _watching(utils, "get_hash_factors", watched):
            compute()
    out: dict[str, Any] = {}
    for cls_name, found in seen.items():
        for name, value in found.items():
            out[f"config.{cls_name}.{name}"] = value
    for field in dataclasses.fields(config) if dataclasses.is_dataclass(config) else ():
        value = getattr(config, field.name, None)
        sub_hash = getattr(value, "compute_hash", None)
        if callable(sub_hash) and type(value).__name__ not in seen:
            with contextlib.suppress(Exception):
                out[f"config.{field.name}"] = sub_hash()
    return out


@contextlib.contextmanager
def _watching(module: Any, name: str, replacement: Any) -> Iterator[None]:
    """``module.name`` replaced for the duration (this thread's ``compute_hash`` call)."""
    original = module.__dict__[name]
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


# ---- install -------------------------------------------------------------------------------------


def install_tree(entry: AotEntry, tree: trees.Tree) -> tuple[int, int]:
    """Write a verified entry where vLLM looks: Inductor files first (each atomically; an existing
    file wins: another rank or process put the same content there), then this rank's dir, staged
    and renamed into place, so ``model`` appears last and whole. Returns ``model``'s size and
    mtime (to recognise the file later)."""
    from kcache.layers.jit.layer import install_file

    rank_files = {p[len(entry.rank) + 1 :]: f for p, f in tree.files.items() if p.startswith(f"{entry.rank}/")}
    for path, f in tree.files.items():
        if path.startswith(f"{INDUCTOR_DIR}/"):
            target = os.path.join(entry.hash_dir, *path.split("/"))
            if not os.path.exists(target):
                install_file(target, f.data, 0o755 if f.executable else 0o644)
    os.makedirs(entry.hash_dir, exist_ok=True)
    stage = os.path.join(entry.hash_dir, f".{entry.rank}.kcache-{uuid.uuid4().hex[:12]}")
    try:
        for path, f in sorted(rank_files.items(), key=lambda item: item[0] == MODEL_FILE):
            _write(os.path.join(stage, *path.split("/")), f)
        try:
            os.rename(stage, entry.rank_dir)  # atomic; fails if vLLM or a peer made the dir meanwhile
        except OSError:
            for path, f in sorted(rank_files.items(), key=lambda item: item[0] == MODEL_FILE):
                target = os.path.join(entry.rank_dir, *path.split("/"))
                if not os.path.exists(target):
                    install_file(target, f.data, 0o755 if f.executable else 0o644)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    st = os.stat(entry.model_path)
    return st.st_size, st.st_mtime_ns


def _write(path: str, f: trees.TreeFile) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as out:
        out.write(f.data)
    os.chmod(path, 0o755 if f.executable else 0o644)


# ---- store ---------------------------------------------------------------------------------------


def _watch_save(model: Any) -> None:
    """Wrap the model class's ``save_aot_compiled_function`` (vLLM sets it per decorated class)."""
    cls = type(model)
    save = patching.current(cls, "save_aot_compiled_function")
    if not callable(save) or getattr(save, "__wrapped__", None) is not None:
        return
    patching.patch(PATCHES, cls, "save_aot_compiled_function", _wrap_save(save))


def _wrap_save(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def save_aot_compiled_function(self: Any, *args: Any, **kwargs: Any) -> Any:
        path = getattr(self, "_aot_compilation_path", None)
        before = _mtime(path)
        result = original(self, *args, **kwargs)  # vLLM's, unguarded
        with guard("vllm store failed"):
            if isinstance(path, str) and not getattr(self, "was_aot_compile_fn_loaded_from_disk", False):
                after = _mtime(path)
                if after is not None and after != before:  # vLLM wrote it just now
                    _upload_soon(path)
        return result

    return save_aot_compiled_function


def _mtime(path: object) -> int | None:
    try:
        return os.stat(path).st_mtime_ns if isinstance(path, str) else None
    except OSError:
        return None


def _upload_soon(path: str) -> None:
    rt = _serving()
    entry = locate(path)
    if rt is None or entry is None or rt.uploader is None:
        return
    state = _state(rt)
    with state.lock:
        key, started = state.misses.pop(path, (entry.service_key(), None))
    compile_s = time.monotonic() - started if started is not None else None
    thread = threading.Thread(target=_upload, args=(rt, entry, key, compile_s), name="kcache-vllm-upload", daemon=False)
    with state.lock:
        state.uploads[:] = [t for t in state.uploads if t.is_alive()]
        state.uploads.append(thread)
    thread.start()


def _upload(rt: Runtime, entry: AotEntry, key: str, compile_s: float | None) -> None:
    with guard("could not upload a vLLM compiled model"):
        files = read_tree(entry)
        if f"{entry.rank}/{MODEL_FILE}" not in files:
            return
        rt.put_entry(LAYER, key, trees.encode(TREE_KIND, files), compile_s, now=True)


def read_tree(entry: AotEntry) -> dict[str, trees.TreeFile]:
    """This rank's dir and the Inductor cache as tree files (paths relative to the hash dir)."""
    files: dict[str, trees.TreeFile] = {}
    for top in (INDUCTOR_DIR, entry.rank):
        root = os.path.join(entry.hash_dir, top)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                if name.endswith(_SKIP_SUFFIXES) or name.startswith(".") or not os.path.isfile(full) or os.path.islink(full):
                    continue
                rel = os.path.relpath(full, entry.hash_dir).replace(os.sep, "/")
                try:
                    trees.check_path(rel)
                    with open(full, "rb") as fh:
                        data = fh.read()
                except (trees.TreeError, OSError):
                    continue  # a name the format cannot carry, or gone meanwhile
                files[rel] = trees.TreeFile(data, os.access(full, os.X_OK))
    # model last: a reader that streams the tree meets the file vLLM checks for after the rest
    model = files.pop(f"{entry.rank}/{MODEL_FILE}", None)
    if model is not None:
        files[f"{entry.rank}/{MODEL_FILE}"] = model
    return files


def wait_for_uploads() -> None:
    """At :meth:`Runtime.close`: let uploads started by saves finish (bounded like every flush)."""
    rt = get_runtime()
    deadline = time.monotonic() + (rt.config.flush_timeout_s if rt is not None else 5.0)
    state = _state(rt)
    with state.lock:
        pending = list(state.uploads)
    for thread in pending:
        thread.join(max(0.0, deadline - time.monotonic()))


# ---- the layer protocol (kcache.layers.protocol) -------------------------------------------------

NAME = "vllm"
STORES = (LAYER,)


def selected(config: ClientConfig) -> bool:
    return LAYER in selected_layers(config.layers)


def install_layer(config: ClientConfig, hooked: ModuleType | None = None) -> None:
    install()
