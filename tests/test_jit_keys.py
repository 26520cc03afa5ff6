"""The ``jit`` layer's parts that need no compiler: the entry container (kcache_schemas.jit) and
content keys (kcache.layers.jit.content_keys): the same build at other paths has one key, anything a build is
made of changes it, and a miss names the part that changed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from kcache.layers.jit.content_keys import PathNames, Step, build_key, compiler_identity
from kcache_schemas import jit
from kcache_schemas.key_diff import diff, from_parts

ENV = {"torch": "2.13.0+cpu", "triton": "3.9.0", "cuda": None, "hip": None, "gpu_arch": None}
GCC_BANNER = "Using built-in specs.\nCOLLECT_GCC={argv0}\nCOLLECT_LTO_WRAPPER=/usr/lib/gcc/x86_64-linux-gnu/12/lto-wrapper\nTarget: x86_64-linux-gnu\nThread model: posix\ngcc version 12.2.0 (Debian 12.2.0-14+deb12u1)"


def _banner(compiler: str) -> str:
    return GCC_BANNER.format(argv0=compiler)


# ---- the container -------------------------------------------------------------------------------


def test_a_container_round_trips_and_checks_every_file() -> None:
    files = {"target": b"\x7fELF" + bytes(range(256)) * 4, ".ninja_log": b"# ninja log v5\n"}
    data = jit.encode("inductor-cpp", files)
    found = jit.decode(data)
    assert found.adapter == "inductor-cpp" and dict(found.files) == files
    flipped = bytearray(data)
    flipped[-1] ^= 1
    for bad in (bytes(flipped), data[:-1], data + b"x", b"KCJIT1\n\x00", b"\x7fELF...", b""):
        with pytest.raises(jit.JitArtifactError):
            jit.decode(bad)


@pytest.mark.parametrize("name", ["../x.so", "a/b.so", ".", "..", "", "x" * 300])
def test_a_container_holds_plain_file_names_only(name: str) -> None:
    with pytest.raises(jit.JitArtifactError):
        jit.encode("inductor-cpp", {name: b"x"})


# ---- content keys --------------------------------------------------------------------------------


def _install(root: Path, source: str = "int f() { return 1; }\n") -> tuple[Path, Path]:
    """A fake Python install (torch's include dir) and an Inductor cache dir with one source."""
    torch_dir = root / "site-packages" / "torch"
    (torch_dir / "include").mkdir(parents=True)
    cache = root / "cache"
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / "cab.cpp").write_text(source)
    return torch_dir, cache


def _key(root: Path, flags: str = "-O3 -march=native", source: str = "int f() { return 1; }\n", compiler: str = "g++") -> tuple[str, dict[str, tuple[str, str]]]:
    torch_dir, cache = _install(root, source)
    src, obj, lib = cache / "ab" / "cab.cpp", cache / "ab" / "cab.o", cache / "ab" / "cab.so"
    steps = [
        Step(f"{compiler} {src} {flags} -I{torch_dir}/include -c -o {obj}", str(obj)),
        Step(f"{compiler} {obj} -shared -L{torch_dir}/lib -ltorch -o {lib}", str(lib)),  # links what step 0 builds
    ]
    built = build_key("inductor-cpp", steps, PathNames([(str(cache), "<cache>"), (str(torch_dir), "<torch>")]), ENV, _banner)
    return built.key, dict(built.parts)


def test_the_same_build_elsewhere_has_the_same_key(tmp_path: Path) -> None:
    key_a, parts_a = _key(tmp_path / "node-a")
    key_b, _ = _key(tmp_path / "elsewhere" / "node-b")
    assert key_a == key_b and key_a.startswith("inductor-cpp-v1:")
    assert str(tmp_path) not in repr(parts_a)
    assert "<torch>/include" in parts_a["step0.command"][1] and "<built:" in parts_a["step1.command"][1]


def test_a_changed_flag_or_source_is_another_key_and_explain_names_it(tmp_path: Path) -> None:
    key, parts = _key(tmp_path / "a")
    flag_key, flag_parts = _key(tmp_path / "b", flags="-O2 -march=native")
    source_key, source_parts = _key(tmp_path / "c", source="int f() { return 2; }\n")
    assert len({key, flag_key, source_key}) == 3
    stored = from_parts("jit", key, parts).components
    assert [c.name for c in diff(stored, from_parts("jit", flag_key, flag_parts).components)] == ["step0.command", "step1.command"]
    # The source changed; the link step's command names the object it links by its build's hash.
    assert [c.name for c in diff(stored, from_parts("jit", source_key, source_parts).components)] == ["step0.input0", "step1.command"]


def test_the_compiler_is_known_by_what_it_is_not_where_it_runs() -> None:
    assert compiler_identity("g++", _banner) == compiler_identity("/usr/bin/g++", _banner)
    joined = _banner("/opt/shim/g++").replace("\n", "_")  # Inductor's get_compiler_version_info
    assert compiler_identity("g++", lambda _: joined) == compiler_identity("g++", lambda _: _banner("g++").replace("\n", "_"))
    assert "gcc version 12.2.0" in compiler_identity("g++", _banner)
    assert "/opt/shim" not in compiler_identity("g++", lambda _: joined)
    other = compiler_identity("g++", lambda c: _banner(c).replace("12.2.0 (Debian", "13.1.0 (Debian"))
    assert other != compiler_identity("g++", _banner)


def test_a_path_outside_the_named_dirs_stays_in_the_key(tmp_path: Path) -> None:
    """An include dir kcache cannot name is kept as written: a miss on another layout, never a
    wrong hit."""
    names = PathNames([(str(tmp_path / "torch"), "<torch>")])
    assert names(f"-I{tmp_path}/torch/include") == "-I<torch>/include"
    assert names(f"-I{tmp_path}/torchvision/include") == f"-I{tmp_path}/torchvision/include"
    assert names("-I/usr/local/cuda/include") == "-I/usr/local/cuda/include"


def test_input_files_are_keyed_by_content(tmp_path: Path) -> None:
    _, parts = _key(tmp_path)
    digest = hashlib.sha256(b"int f() { return 1; }\n").hexdigest()
    assert parts["step0.input0"][0] == digest


# ---- included headers (kcache.layers.jit.headers, through kcache.layers.jit.ninja_builds) ----------------------------


def _checkout(root: Path, value: int = 2) -> Path:
    """A user's sources: ext.cpp includes "kc_scale.h" beside it, which includes
    "include/kc_value.h"; <vector> and <pinned/api.h> come from dirs the key covers otherwise."""
    (root / "src" / "include").mkdir(parents=True)
    (root / "pinned" / "pinned").mkdir(parents=True)
    (root / "src" / "ext.cpp").write_text('#include <vector>\n#include <pinned/api.h>\n  #  include "kc_scale.h"\nint f() { return SCALE; }\n')
    (root / "src" / "kc_scale.h").write_text('#pragma once\n#include "include/kc_value.h"\n#define SCALE KC_VALUE\n')
    (root / "src" / "include" / "kc_value.h").write_text(f"#define KC_VALUE {value}\n")
    (root / "pinned" / "pinned" / "api.h").write_text("int api();\n")
    return root


def _ninja_key(root: Path) -> tuple[str, dict[str, tuple[str, str]]]:
    from kcache.layers.jit.ninja_builds import build_key_of

    build = root / "home" / ".cache" / "ext"
    build.mkdir(parents=True)
    (build / "build.ninja").write_text(
        "ninja_required_version = 1.3\ncxx = c++\n"
        f"cflags = -O2 -isystem {root}/pinned\n"
        "rule compile\n  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out\n"
        f"build ext.o: compile {root}/src/ext.cpp\n"
        "build ext.so: link ext.o\ndefault ext.so\n"
    )
    built = build_key_of("cpp-extension", str(build), [(str(root / "pinned"), "<pinned>")], [str(root / "pinned")], ENV)
    return built.key, dict(built.parts)


def test_included_headers_are_keyed_by_content_not_path(tmp_path: Path) -> None:
    key, parts = _ninja_key(_checkout(tmp_path / "a"))
    assert [n for n in parts if n.startswith("header[")] == ["header[kc_scale.h]", "header[include/kc_value.h]"]
    assert parts["header[include/kc_value.h]"][0] == hashlib.sha256(b"#define KC_VALUE 2\n").hexdigest()
    assert _ninja_key(_checkout(tmp_path / "elsewhere" / "b"))[0] == key  # another checkout, same content
    edited, edited_parts = _ninja_key(_checkout(tmp_path / "c", value=3))
    assert edited != key
    stored = from_parts("jit", key, parts).components
    assert [c.name for c in diff(stored, from_parts("jit", edited, edited_parts).components)] == ["header[include/kc_value.h]"]


def test_a_header_included_twice_or_in_a_cycle_is_read_once(tmp_path: Path) -> None:
    from kcache.layers.jit.headers import SearchPath, included_headers

    (tmp_path / "a.h").write_text('#include "b.h"\n#include "a.h"\n')
    (tmp_path / "b.h").write_text('#include "a.h"\n#include "missing.h"\n')
    (tmp_path / "x.cpp").write_text('#include "a.h"\n#include "b.h"\n')
    assert [n for n, _ in included_headers([str(tmp_path / "x.cpp")], SearchPath(), [])] == ["a.h", "b.h"]


def test_the_search_path_follows_the_compiler_flags() -> None:
    from kcache.layers.jit.headers import search_path

    found = search_path(["-I/a", "-I", "/b", "-isystem", "/c", "-iquote", "/q", "-Irelative", "-idirafter", "/d", "-I/a"])
    assert list(found.quote) == ["/q"] and list(found.angle) == ["/a", "/b", "/c", "/d"]
