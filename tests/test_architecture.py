"""The shape of the code, checked: the wire is spelled once (in ``kcache_schemas.wire``), and the
client and the service stand side by side over ``schemas``, neither importing the other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLIENT, SERVICE, SCHEMAS = REPO / "client" / "kcache", REPO / "service" / "kcache_server", REPO / "schemas" / "kcache_schemas"
WIRE_LITERAL = re.compile(r"""["'](?:/v1\b|/v1/)|X-Kcache-""", re.IGNORECASE)


def _sources(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_wire_literal_outside_schemas() -> None:
    found = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for root in (CLIENT, SERVICE)
        for p in _sources(root)
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if WIRE_LITERAL.search(line)
    ]
    assert not found, "spell routes and headers with kcache_schemas.wire:\n" + "\n".join(found)


def test_client_and_service_never_import_each_other_and_schemas_imports_neither() -> None:
    assert not [p for p in _sources(CLIENT) if "kcache_server" in _imports(p)]
    assert not [p for p in _sources(SERVICE) if "kcache" in _imports(p)]
    assert not [p for p in _sources(SCHEMAS) if _imports(p) & {"kcache", "kcache_server"}]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _edges(path: Path, package: str) -> set[str]:
    """Modules of ``package`` this file imports, at import time or later inside a function (a
    lazy import still ties two modules together); ``if TYPE_CHECKING`` imports do not count."""
    out: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if "TYPE_CHECKING" in ast.unparse(node.test):
                for stmt in node.orelse:
                    self.visit(stmt)
            else:
                self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            out.update(a.name for a in node.names if a.name.split(".")[0] == package)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.module and node.level == 0 and node.module.split(".")[0] == package:
                out.add(node.module)
                out.update(f"{node.module}.{a.name}" for a in node.names)  # ``from pkg import mod``

    Visitor().visit(ast.parse(path.read_text()))
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of its package it imports. The package's ``__init__`` is left out:
    it re-exports its modules by design."""
    modules = {_module_name(p, root): p for p in _sources(root) if p != root / "__init__.py"}
    return {name: {m for m in _edges(path, root.name) if m in modules and m != name} for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_in_any_package() -> None:
    for root in (CLIENT, SERVICE, SCHEMAS):
        cycle = _cycle(import_graph(root))
        assert cycle is None, f"import cycle in {root.name}: {' -> '.join(cycle or [])}"


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# What the store's concerns share among themselves; routes reach ``store.<concern>`` instead.
STORE_INTERNALS = ("index", "blobs", "access", "commits", "references", "storage_limits")


def test_routes_reach_storage_only_through_the_domain_layer() -> None:
    """Routes call the methods of the store's concerns (``store.kernels.put``); the index, the
    blob store, the access recorder and the concerns the others are built on are the store's own."""
    found = []
    for p in _sources(SERVICE / "routes"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in STORE_INTERNALS:
                found.append(f"{p.relative_to(REPO)}:{node.lineno}: .{node.attr}")
        assert "kcache_server.storage" not in _imports_full(p), p
    assert not found, "\n".join(found)


def _imports_full(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


TESTS, BENCH, TESTKIT = REPO / "tests", REPO / "bench", REPO / "kcache_testkit"
# The fixture modules pytest puts on the path itself (tests/ is its rootdir for test modules).
TEST_MODULES = {p.stem for p in TESTS.glob("*.py")}


def _is_sys_path(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) and node.value.id == "sys"


def _sys_path_edits(source: str) -> list[int]:
    """Lines that change ``sys.path``: its insert/append/extend, or an assignment to it."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_sys_path(node.func.value):
            if node.func.attr in {"insert", "append", "extend"}:
                lines.append(node.lineno)
        elif isinstance(node, ast.AugAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AugAssign) else node.targets
            if any(_is_sys_path(t) for t in targets):
                lines.append(node.lineno)
    return lines


def test_test_and_bench_support_has_one_home_and_nothing_edits_sys_path() -> None:
    """Tests and benchmarks share kcache_testkit (kernels, the server launchers, ports); neither
    imports the other, the kit imports neither, and no module edits ``sys.path`` (subprocess
    jobs get the kit on PYTHONPATH, like any installed package)."""
    edits = [f"{p.relative_to(REPO)}:{n}" for root in (TESTS, BENCH, TESTKIT) for p in _sources(root)
             for n in _sys_path_edits(p.read_text())]
    assert not edits, "no sys.path edits: " + ", ".join(edits)
    assert not [p for p in _sources(TESTS) if "bench" in _imports(p)], "tests import bench"
    assert not [p for p in _sources(BENCH) if _imports(p) & ({"tests"} | TEST_MODULES)], "bench imports tests"
    assert not [p for p in _sources(TESTKIT) if _imports(p) & {"tests", "bench"}], "the kit imports tests or bench"


def test_the_sys_path_check_finds_an_edit() -> None:
    assert _sys_path_edits('import sys\nsys.path.insert(0, "tests")\n') == [2]
    assert _sys_path_edits("import sys\nsys.path += ['x']\nsys.path = []\n") == [2, 3]
    assert _sys_path_edits("import sys\nif 'x' not in sys.path:\n    pass\n") == []


OWN_PACKAGES = {"bench", "kcache_testkit", "kcache", "kcache_schemas", "kcache_server"}


def _unresolved_imports(path: Path) -> list[str]:
    """``from <one of ours> import name`` lines (lazy ones too) whose name is neither a submodule
    nor defined by the module: a module that moved leaves such lines behind."""
    import importlib
    import importlib.util

    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                and node.module.split(".")[0] in OWN_PACKAGES):
            continue
        spec = importlib.util.find_spec(node.module)
        if spec is None:
            missing.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.module}")
            continue
        for alias in node.names:
            is_package = spec.submodule_search_locations is not None
            if is_package and importlib.util.find_spec(f"{node.module}.{alias.name}") is not None:
                continue
            if not hasattr(importlib.import_module(node.module), alias.name):
                missing.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.module}.{alias.name}")
    return missing


def test_every_import_of_our_own_modules_in_bench_and_the_kit_resolves() -> None:
    """Benchmarks run by hand, not in CI, and import lazily: a stale import (a module moved to
    the kit) would only show when someone runs them."""
    missing = [m for root in (BENCH, TESTKIT) for p in _sources(root) for m in _unresolved_imports(p)]
    assert not missing, "imports that do not resolve: " + ", ".join(missing)


# ---- the torch matrix runs by marker ------------------------------------------------------------

TESTS = REPO / "tests"
_TOUCHES_TORCH = re.compile(
    r"""^\s*(?:import|from)\s+(?:torch|triton)\b"""  # imports torch or Triton (at any depth)
    r"""|importorskip\(["'](?:torch|triton)["']\)"""  # needs them
    r"""|\b\w*_job\.py\b|\bJOB\s*=""",  # runs a job interpreter (tests/*_job.py: a torch job)
    re.MULTILINE,
)


def _touches_torch(source: str) -> bool:
    return bool(_TOUCHES_TORCH.search(source))


def test_every_test_module_that_touches_torch_carries_the_torch_marker() -> None:
    """``scripts/torch_matrix.sh`` runs ``-m torch`` on the other torch versions: a module that
    drives torch or Triton and carries no marker would silently run on the default torch alone."""
    unmarked = [
        p.name for p in sorted(TESTS.glob("test_*.py"))
        if _touches_torch(p.read_text()) and not re.search(r"pytest\.mark\.(?:torch|one_torch)\b", p.read_text())
    ]
    assert not unmarked, (
        "mark these pytest.mark.torch (module pytestmark or the tests that touch torch), or pytest.mark.one_torch "
        "where nothing checked depends on torch's version:\n" + "\n".join(unmarked)
    )


def test_the_torch_marker_check_finds_a_module_that_touches_torch() -> None:
    assert _touches_torch("import pytest\n\ndef test_x():\n    import torch._inductor\n")
    assert _touches_torch('torch = pytest.importorskip("torch")\n')
    assert _touches_torch('JOB = REPO / "tests" / "host_job.py"\n')
    assert not _touches_torch('ENV = {"torch": "2.13.0", "triton": "3.9.0"}\n')


# ---- the client's floor plan: wings, their order, the layer registry -------------------------------

# Bottom up: a module imports only modules of its own floor or the floors below (lazy imports
# included; ``if TYPE_CHECKING`` ones do not count). Entries name a wing (a sub-package) or one
# module of the front door. The order follows what each floor is for: the host-safety ground
# (nothing of kcache beneath it), the settings, this node's store, the way to the service, the
# runtime that joins them, what a process reports, the handle on the process's runtime, the cache
# layers that hook torch and Triton through it, what switches them on, and the CLI over all of it.
CLIENT_FLOORS: tuple[tuple[str, ...], ...] = (
    ("kcache.host", "kcache.exceptions", "kcache.version"),
    ("kcache.config",),
    ("kcache.store",),
    ("kcache.transport",),
    ("kcache.runtime",),
    ("kcache.reporting",),
    ("kcache.current",),
    ("kcache.layers",),
    ("kcache.activation", "kcache._autoload", "kcache.triton_manager"),
    ("kcache.cli",),
)
# What stays at the top of the package: the names users and Triton import, and the process's one
# runtime. Everything else lives in a wing.
FRONT_DOOR = {"__init__", "_autoload", "config", "runtime", "current", "activation", "exceptions", "triton_manager", "version"}
MAX_ROOMS = 10  # modules and sub-wings of one wing
# Modules of kcache.layers that are not layers themselves: the protocol and the registry, what
# several layers share, and the parts of a layer that its registered module installs.
LAYER_SUPPORT = {
    "kcache.layers.protocol", "kcache.layers.layer_registry",
    "kcache.layers.key_context", "kcache.layers.key_canary", "kcache.layers.require_hit",
    "kcache.layers.inductor.fx_graph_reads",  # installed by remote_caches
    "kcache.layers.inductor.kernel_preemit",  # started by triton_bundler
    "kcache.layers.inductor.compile_sidecar",  # the .pth hands it the activation in the compile sidecar
    "kcache.layers.triton.cache_manager",  # Triton imports it; manager_switch switches it on
    "kcache.layers.dynamo.package_envelope", "kcache.layers.dynamo.payoff",
    "kcache.layers.jit.layer", "kcache.layers.jit.content_keys", "kcache.layers.jit.headers", "kcache.layers.jit.ninja_builds",
}
HOST_PACKAGES = {"torch", "triton", "vllm", "tvm_ffi"}


def _floor(module: str) -> int:
    for rank, floor in enumerate(CLIENT_FLOORS):
        if any(module == unit or module.startswith(unit + ".") for unit in floor):
            return rank
    raise AssertionError(f"{module} is on no floor of CLIENT_FLOORS")


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if _floor(b) > _floor(a))


def test_every_client_module_is_in_a_wing_or_the_front_door() -> None:
    top = {p.stem for p in CLIENT.glob("*.py")}
    assert top == FRONT_DOOR, f"move {sorted(top - FRONT_DOOR)} into a wing" if top - FRONT_DOOR else top
    for name in import_graph(CLIENT):
        _floor(name)  # raises for a module on no floor


def test_no_client_import_runs_up_a_floor() -> None:
    up = _upward(import_graph(CLIENT))
    assert not up, "imports that run up a floor (see CLIENT_FLOORS):\n" + "\n".join(up)


def test_no_client_module_imports_the_package_face() -> None:
    """``kcache/__init__`` is what users import; its ``install()`` reaches activation and so the
    runtime. A module that imports a name from it (``from kcache import __version__`` did, in six
    modules) joins the runtime in a circle that the floor check, which leaves the face out, does
    not see: shared facts live in a module of their own (``kcache.version``)."""
    face = [f"{_module_name(p, CLIENT)}: {line.strip()}" for p in _sources(CLIENT) if p != CLIENT / "__init__.py"
            for line in p.read_text().splitlines() if re.match(r"\s*(from kcache import |import kcache\s*$)", line)]
    assert not face, "imports of the package face:\n" + "\n".join(face)


def test_the_floor_check_finds_an_import_running_up() -> None:
    assert _upward({"kcache.store.emitter": {"kcache.transport.http"}}) == ["kcache.store.emitter -> kcache.transport.http"]
    assert _upward({"kcache.layers.jit.layer": {"kcache.current", "kcache.host.failopen"}}) == []


def _rooms(wing: Path) -> list[str]:
    return sorted([p.stem for p in wing.glob("*.py") if p.stem not in ("__init__", "__main__")]
                  + [d.name for d in wing.iterdir() if (d / "__init__.py").exists()])


def test_no_wing_has_more_than_ten_rooms() -> None:
    crowded = {str(d.relative_to(CLIENT)): len(_rooms(d)) for d in CLIENT.rglob("*") if (d / "__init__.py").exists()
               and d != CLIENT and len(_rooms(d)) > MAX_ROOMS}
    assert not crowded, f"wings over {MAX_ROOMS} rooms: {crowded} (split by concern into sub-wings)"


def _defines(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for n in tree.body:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _registered() -> list[str]:
    """The module names of ``kcache.layers.layer_registry.LAYERS``, read from its source."""
    tree = ast.parse((CLIENT / "layers" / "layer_registry.py").read_text())
    return [call.args[0].value for call in ast.walk(tree)
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Registered"
            and call.args and isinstance(call.args[0], ast.Constant)]


def test_every_layer_is_registered_and_implements_the_protocol() -> None:
    """Adding a layer is adding its module and one registry line: a module of ``kcache.layers``
    is a registered layer or a declared support room, and every registered module implements
    :class:`kcache.layers.protocol.Layer` (mypy checks the types; this checks the names)."""
    registered = _registered()
    assert len(registered) == len(set(registered)), registered
    modules = {m: p for m, p in ((_module_name(p, CLIENT), p) for p in _sources(CLIENT / "layers")) if p.name != "__init__.py"}
    assert not set(registered) - set(modules), f"registered but missing: {set(registered) - set(modules)}"
    unaccounted = set(modules) - set(registered) - LAYER_SUPPORT
    assert not unaccounted, f"register these layers in kcache.layers.layer_registry, or name them in LAYER_SUPPORT: {sorted(unaccounted)}"
    assert not set(registered) & LAYER_SUPPORT
    protocol = {"NAME", "STORES", "selected", "install_layer", "uninstall"}
    incomplete = {m: sorted(protocol - _defines(modules[m])) for m in registered if protocol - _defines(modules[m])}
    assert not incomplete, f"layers missing protocol members: {incomplete}"


def test_only_layers_import_torch_triton_or_vllm_and_only_layers_patch() -> None:
    """The layers are the client's one way into its host's packages: the other wings ask
    :func:`kcache.host.after_import.imported` (never importing), and every attribute replaced
    goes through :mod:`kcache.host.patching` from a layer."""
    importers, patchers = [], []
    for p in _sources(CLIENT):
        name = _module_name(p, CLIENT)
        if name.startswith("kcache.layers.") or name == "kcache.layers":
            continue
        if _imports(p) & HOST_PACKAGES:
            importers.append(name)
        if re.search(r"\bpatching\.patch\(", p.read_text()):
            patchers.append(name)
    assert not importers, f"import torch/Triton/vLLM/tvm-ffi only in kcache.layers: {importers}"
    assert not patchers, f"patch torch only from kcache.layers: {patchers}"


# ---- names: one file name, one module ---------------------------------------------------------

SHIPPED = (CLIENT, SCHEMAS, SERVICE)
TWO_SIDES = "two sides of one concept"


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def _dotted(path: Path, root: Path = REPO) -> str:
    """``service/kcache_server/store/gc.py`` -> ``kcache_server.store.gc``."""
    return ".".join(path.relative_to(root).with_suffix("").parts[1:])


def shared_file_names(paths: list[Path], root: Path = REPO) -> list[str]:
    """Modules whose file name another module has too, unless both docstrings say they are the
    two sides of one concept and name the other (``kcache_schemas.purge`` and ``kcache.purge``)."""
    by_name: dict[str, list[Path]] = {}
    for p in paths:
        if p.name != "__init__.py":
            by_name.setdefault(p.name, []).append(p)
    found = []
    for name, group in sorted(by_name.items()):
        for p in group:
            doc = " ".join(_docstring(p).split())
            others = [q for q in group if q != p]
            if others and not (TWO_SIDES in doc and all(_dotted(q, root) in doc for q in others)):
                found.append(f"{name}: {', '.join(str(q.relative_to(root)) for q in group)}")
                break
    return found


def test_no_two_modules_share_a_file_name_unless_two_sides_of_one_concept() -> None:
    """A file name says what a module is, so it names one module of client, schemas and service
    (read from the tree: a rename anywhere is checked as it lands). Where two modules really are
    the two sides of one concept, each docstring says "two sides of one concept" and names the other."""
    shared = shared_file_names([p for root in SHIPPED for p in _sources(root)])
    assert not shared, "rename one of each (or say in both docstrings that they are the two sides of one concept):\n" + "\n".join(shared)


def test_the_file_name_check_finds_a_shared_name(tmp_path: Path) -> None:
    schemas, client = tmp_path / "schemas" / "kcache_schemas" / "errors.py", tmp_path / "client" / "kcache" / "errors.py"
    for p in (schemas, client, tmp_path / "client" / "kcache" / "__init__.py", tmp_path / "schemas" / "kcache_schemas" / "__init__.py"):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text('"""Errors."""\n')
    paths = sorted(tmp_path.rglob("*.py"))
    assert shared_file_names(paths, tmp_path) == ["errors.py: client/kcache/errors.py, schemas/kcache_schemas/errors.py"]
    schemas.write_text(f'"""The wire side; {TWO_SIDES} with kcache.errors."""\n')
    assert shared_file_names(paths, tmp_path), "one docstring alone does not make two sides"
    client.write_text(f'"""The client side: the {TWO_SIDES}\nwith kcache_schemas.errors."""\n')
    assert shared_file_names(paths, tmp_path) == []
    assert _dotted(SERVICE / "store" / "gc.py") == "kcache_server.store.gc"


# ---- the service's store: split by concern, in one shape ------------------------------------

STORE = SERVICE / "store"


def _built_by_the_store() -> dict[str, str]:
    """``CacheStore.__init__``'s ``self.<concern> = <Class>(...)`` lines: concern -> class."""
    tree = ast.parse((STORE / "cache_store.py").read_text())
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    built = {}
    for node in ast.walk(init):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                    built[target.attr] = node.value.func.id
    return built


def _classes(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)}


def test_the_store_is_one_class_per_concern_that_cache_store_builds() -> None:
    """bazel-remote's ``cache/disk/`` habit: each module of ``store/`` is one concern, a class
    that ``CacheStore`` builds and hands only the parts it uses; no concern imports the store
    itself (``kcache_server.store`` or its ``cache_store``), so none can reach past its parts."""
    built = set(_built_by_the_store().values())
    for p in _sources(STORE):
        if p.name in ("__init__.py", "cache_store.py"):
            continue
        concerns = _classes(p) & built
        assert len(concerns) == 1, f"{p.relative_to(REPO)}: one concern CacheStore builds, found {sorted(concerns)}"
        reached = {m for m in _edges(p, "kcache_server") if m in ("kcache_server.store", "kcache_server.store.cache_store")}
        assert not reached, f"{p.relative_to(REPO)} reaches the whole store ({reached}): take the parts you use"


def _takes_a_store(source: str) -> list[str]:
    """Functions (or methods) with a parameter annotated ``CacheStore``: the old shape, free
    functions handed the whole store."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            if any(a.annotation is not None and ast.unparse(a.annotation).strip("'\"").split(".")[-1] == "CacheStore" for a in args):
                found.append(f"{node.name}:{node.lineno}")
    return found


def test_domain_code_is_methods_of_the_stores_concerns_never_functions_over_the_store() -> None:
    """One shape for domain code (store/__init__.py says which and why): nothing in the service
    takes the whole ``CacheStore`` as an argument; routes get it from their one dependency
    (``StoreDep``) and call ``store.<concern>.<method>``."""
    found = [f"{p.relative_to(REPO)}: {f}" for p in _sources(SERVICE) for f in _takes_a_store(p.read_text())]
    assert not found, "make it a method of a concern CacheStore builds:\n" + "\n".join(found)


def test_the_shape_checks_find_the_old_shape() -> None:
    assert _takes_a_store("def publish(store: CacheStore, namespace: str) -> None: ...\n") == ["publish:1"]
    assert _takes_a_store("class A:\n    def get(self, store: 'x.CacheStore') -> None: ...\n") == ["get:2"]
    assert _takes_a_store("def route(store: StoreDep) -> None: ...\n") == []
    assert {"kernels", "entries", "gc"} <= set(_built_by_the_store())


def test_the_client_names_no_module_like_one_of_the_service_or_the_schemas() -> None:
    """One name, one concept: a client module named like a service or schemas module (three
    ``errors.py``, two ``stats.py``) sent readers to the wrong file. Where client and service are
    two sides of one concept, the names say which side (``transport/workload.py`` publishes what
    ``kcache_server/workloads.py`` stores)."""
    other = {p.name for root in (SERVICE, SCHEMAS) for p in _sources(root)}
    shared = sorted({p.name for p in _sources(CLIENT)} & other - {"__init__.py", "__main__.py"})
    assert not shared, f"client modules named like service/schemas modules: {shared}"


# ---- process state lives in the Runtime (issue 27) ------------------------------------------------
# A module-level name holding a mutable value (a dict, set, list, lock, thread-local, counter), a
# name a function rebinds with ``global``, or a function cached with ``functools`` is per-process
# state: install -> uninstall -> install must behave like a fresh process, so a layer keeps what it
# learns in ``Runtime.layer_state`` (reached through ``kcache.current``), never in its module.
# What legitimately stays module-level, and why:
STATE_ALLOWED = {
    # the two handles of the process: the patch registry and the runtime
    "kcache.host.patching._patches": "the patch registry: what kcache replaced on torch/Triton",
    "kcache.host.patching._lock": "the patch registry's lock",
    "kcache.current._runtime": "the runtime handle",
    "kcache.current._lock": "the runtime handle's lock",
    "kcache.current._forked_from": "the runtime handle of a forked child (its parent's runtime, to make its own like it)",
    "kcache.activation._env_before": "the patch registry's environment half: KCACHE_* values install() replaced, put back by uninstall()",
    # locks that guard the interpreter's own shared objects, holding nothing themselves
    "kcache.host.after_import._lock": "guards edits of sys.meta_path",
    "kcache.store.counters._write_lock": "serializes writes of the stats file",
    # what the process's log was told
    "kcache.host.failopen._warned": "what kcache told this process's log, once (a fleet of thousands must not flood its logs): "
    "the log is the process's, and a reinstall that said everything again would be the noise this prevents",
    "kcache.host.failopen._warned_lock": "guards _warned",
    # facts of the interpreter and its machine, the same under every runtime
    "kcache.store.kernel_dirs._target": "the visible GPU, read once from a fully imported torch",
    "kcache.store.kernel_dirs._target_lock": "guards _target",
    "kcache.store.fingerprint.packages": "installed package versions (tests clear it when they change them)",
    "kcache.store.fingerprint.current": "the environment fingerprint (tests clear it when they change it)",
    "kcache.transport.entry_signing._machine": "host name and fingerprint",
    "kcache.layers.jit.content_keys._file_sha": "content hash of a header file of the toolchain",
    "kcache.layers.jit.content_keys.cpu_identity": "the CPU",
    "kcache.layers.jit.content_keys.python_abi": "the interpreter's ABI",
    "kcache.layers.jit.content_keys.libc": "the C library",
    "kcache.layers.jit.content_keys._banner": "a compiler's version banner",
    "kcache.layers.jit.content_keys._install_roots": "where torch and Python are installed",
    "kcache.layers.jit.inductor_cpp._path_names": "path names of torch's install and a cache dir",
    "kcache.layers.jit.layer._serves_jit": "a pure function of a KCACHE_LAYERS value",
    "kcache.layers.dynamo.packages._file_digest": "content hash of a model's source file",
    "kcache.layers.inductor.remote_caches.backend_class": "a class built once on torch's base class",
    "kcache.layers.triton.kernel_key_parts._remembered": "a Triton key's parts: a pure fact of the key, recorded from "
    "interpreter start (the .pth hooks Triton's key before any runtime exists); cleared at uninstall",
    "kcache.layers.triton.kernel_key_parts._lock": "guards _remembered",
    "kcache.store.emitter._cleaned": "Triton cache dirs already swept of stale kernel dirs (the CLI emits without a runtime); "
    "a sweep skipped after a reinstall changes nothing any runtime sees",
    "kcache.store.emitter._sweep_lock": "guards _cleaned: a dir's first sweep ends before other threads emit into it",
    # constant tables, never written
    "kcache.__all__": "constant", "kcache.cli.__all__": "constant", "kcache.store.fingerprint.__all__": "constant",
    "kcache.triton_manager.__all__": "constant", "kcache.config.MODES": "constant", "kcache.config._VARIABLES": "constant",
    "kcache.exceptions._BY_CODE": "constant", "kcache.layers.inductor.fx_graph_reads._PARAMETERS": "constant",
    "kcache.layers.inductor.remote_caches.LAYERS": "constant", "kcache.layers.inductor.remote_caches.GPU_ONLY": "constant",
    "kcache.layers.inductor.remote_caches.OPT_IN": "constant", "kcache.layers.inductor.remote_caches.PREDICATES": "constant",
    "kcache.layers.vllm_compile_cache._SKIP_DIRS": "constant", "kcache.reporting.report.FORMATTERS": "constant",
    "kcache.store.entry_keys.INDUCTOR_CACHE_IDS": "constant", "kcache.transport.http._BODY_HEADERS": "constant",
}
# Per-process state not moved into the Runtime yet (issue 27): this list only shrinks, and is empty
# now. Moving one is taking it off here, with a reinstall test for its layer
# (tests/test_dynamo_cache.py's test_install_uninstall_install_is_a_fresh_process_for_the_dynamo_layer,
# tests/test_layer_reinstall.py).
STATE_NOT_YET_MOVED: set[str] = set()
_MUTABLE_LITERALS = (ast.Dict, ast.List, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
_MUTABLE_CALLS = {"dict", "set", "list", "defaultdict", "OrderedDict", "deque", "Counter", "count", "local", "Lock", "RLock",
                  "Condition", "Event", "Semaphore", "WeakKeyDictionary", "WeakValueDictionary", "WeakSet"}


def _called(node: ast.AST | None) -> str:
    if not isinstance(node, ast.Call):
        return ""
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def module_state(source: str) -> set[str]:
    """Names of ``source``'s module-level state: mutable values bound at module level, names a
    function rebinds with ``global``, and functions with a ``functools`` cache."""
    tree = ast.parse(source)
    found = {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = [t for t in node.targets if isinstance(t, ast.Name)], node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets, value = [node.target], node.value
        else:
            continue
        if isinstance(value, _MUTABLE_LITERALS) or _called(value) in _MUTABLE_CALLS:
            found |= {t.id for t in targets}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
            "cache" in ast.unparse(d) for d in node.decorator_list
        ):
            found.add(node.name)
    return found


def _client_state() -> set[str]:
    return {f"{_module_name(p, CLIENT)}.{name}" for p in _sources(CLIENT) for name in module_state(p.read_text())}


def test_no_module_level_mutable_state_in_the_client_outside_the_allow_list() -> None:
    state = _client_state()
    new = sorted(state - set(STATE_ALLOWED) - STATE_NOT_YET_MOVED)
    assert not new, ("per-process state belongs in the Runtime (Runtime.layer_state, reached through kcache.current), "
                     "not in a module; or, if it truly is the process's (a lock, a pure fact), STATE_ALLOWED with why:\n"
                     + "\n".join(new))
    gone = sorted((set(STATE_ALLOWED) | STATE_NOT_YET_MOVED) - state)
    assert not gone, "no longer module state: take it off STATE_ALLOWED / STATE_NOT_YET_MOVED:\n" + "\n".join(gone)


def test_the_state_check_finds_module_state() -> None:
    source = "import functools, threading\nA = {}\nB: set[str] = set()\nC = threading.local()\nD = (1, 2)\nE = None\n" \
             "def f():\n    global E\n    E = 1\n@functools.lru_cache\ndef g(): ...\n"
    assert module_state(source) == {"A", "B", "C", "E", "g"}
