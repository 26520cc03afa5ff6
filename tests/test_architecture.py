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
