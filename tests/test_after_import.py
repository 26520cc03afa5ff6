"""kcache.host.after_import: hooks that wait for a module torch is still importing."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
from kcache.host.after_import import call_after_import


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(tmp_path))
    created: list[str] = []

    def write(name: str, body: str) -> None:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
        created.append(name)

    yield write
    for name in created:
        sys.modules.pop(name, None)


def test_a_module_not_imported_yet_is_called_back_right_after_its_import(modules) -> None:
    modules("kc_target_a", "def predicate():\n    return False\n")
    seen: list[ModuleType] = []
    call_after_import("kc_target_a", seen.append)
    assert seen == []
    import kc_target_a  # type: ignore[import-not-found]

    assert seen == [kc_target_a] and hasattr(seen[0], "predicate")


def test_an_imported_module_is_called_back_at_once() -> None:
    seen: list[ModuleType] = []
    call_after_import("json", seen.append)
    assert seen == [sys.modules["json"]]


def test_a_module_being_imported_is_called_back_once_it_is_complete(modules) -> None:
    # The module asks for the hook halfway through its own body (as kcache does when it installs
    # from inside torch's imports); the callback must see the finished module, not half of it.
    modules("kc_later", "X = 1\n")
    modules(
        "kc_half",
        """
        import sys
        from kcache.host.after_import import call_after_import
        SEEN = []
        call_after_import(__name__, lambda m: SEEN.append(hasattr(m, "predicate")))
        assert SEEN == []  # not yet: the body is still running
        def predicate():
            return False
        """,
    )
    import kc_half  # type: ignore[import-not-found]

    assert kc_half.SEEN == []
    import kc_later  # type: ignore[import-not-found]  # noqa: F401  # any later import fires it

    assert kc_half.SEEN == [True]


def test_a_hook_that_fires_on_another_modules_import_never_hides_that_modules_own_hook(modules) -> None:
    """Two hooks at once, as kcache installs them (Inductor's codecache mid-import, AOTAutograd's
    cache module not imported yet): the first fires on the import of the second's module and
    unregisters itself there; the second must still fire (it was skipped: removing a finder from
    ``sys.meta_path`` while the import system walks it shifts the list under the walk)."""
    modules("kc_pending", "Y = 2\n")
    modules(
        "kc_mid",
        """
        from kcache.host.after_import import call_after_import
        SEEN = []
        call_after_import("kc_pending", lambda m: SEEN.append(("pending", m.Y)))
        call_after_import(__name__, lambda m: SEEN.append(("mid", hasattr(m, "done"))))
        done = True
        """,
    )
    import kc_mid  # type: ignore[import-not-found]

    assert kc_mid.SEEN == []
    import kc_pending  # type: ignore[import-not-found]  # noqa: F401

    assert sorted(kc_mid.SEEN) == [("mid", True), ("pending", 2)]
