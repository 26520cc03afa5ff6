"""The ``vllm`` layer's parts that need no vLLM: the tree container (kcache_schemas.tree), where
vLLM's entries live (:func:`kcache.layers.vllm_compile_cache.locate`), reading an entry off disk and installing
it where vLLM looks, and the checks that refuse an entry before a byte is written. The real
engine end to end: tests/test_vllm.py (the vLLM environment, scripts/vllm_env.sh)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kcache.layers import vllm_compile_cache as vllm_cache
from kcache_schemas import tree

HASH = "ab" * 32


def _entry(root: Path, rank: str = "rank_0_0") -> vllm_cache.AotEntry:
    located = vllm_cache.locate(str(root / "torch_compile_cache" / "torch_aot_compile" / HASH / rank / "model"))
    assert located is not None
    return located


def _populate(entry: vllm_cache.AotEntry) -> None:
    """What vLLM leaves after a compile (AOT on), with the files kcache must leave out."""
    base = Path(entry.hash_dir)
    files = {
        f"{entry.rank}/model": b"\x80\x04compiled model",
        "inductor_cache/ab/cabcdef.py": b"# generated wrapper\n",
        "inductor_cache/ab/cabcdef.so": b"\x7fELF" + bytes(100),
        "inductor_cache/fxgraph/zz/fzz/0": b"fx entry",
        "inductor_cache/locks/x.lock": b"",
        "inductor_cache/triton/0/KEY/__grp__k.json": b'{"child_paths": {"k.json": "/abs/path/k.json"}}',
        "inductor_cache/ab/__pycache__/cabcdef.cpython-311.pyc": b"pyc",
        "inductor_cache/ab/.1234.5678.tmp": b"half written",
        f"{entry.rank}/model.999.tmp": b"vLLM's save in flight",
    }
    for rel, data in files.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (base / "inductor_cache/ab/cabcdef.so").chmod(0o755)


# ---- the container -------------------------------------------------------------------------------


def test_a_tree_round_trips_and_checks_every_file() -> None:
    files = {"rank_0_0/model": tree.TreeFile(b"m" * 5000), "inductor_cache/ab/x.so": tree.TreeFile(b"\x7fELF" * 100, True)}
    data = tree.encode("vllm-aot", files)
    found = tree.decode(data)
    assert found.kind == "vllm-aot" and dict(found.files) == files
    assert len(data) < 5000  # compressed
    for bad in (data[:-1], data + b"x", tree.MAGIC + b"\x28\xb5\x2f\xfd", b"KCJIT1\n", b""):
        with pytest.raises(tree.TreeError):
            tree.decode(bad)


def test_a_tree_whose_file_does_not_match_its_header_is_refused() -> None:
    import zstandard

    data = tree.encode("vllm-aot", {"rank_0_0/model": tree.TreeFile(b"the real model")})
    body = bytearray(zstandard.ZstdDecompressor().decompress(data[len(tree.MAGIC):]))
    body[-1] ^= 1  # one bit of the model flipped, the header's sha256 unchanged
    tampered = tree.MAGIC + zstandard.ZstdCompressor().compress(bytes(body))
    with pytest.raises(tree.TreeError, match="sha256"):
        tree.decode(tampered)


def test_a_tree_that_declares_too_much_is_refused_before_decompressing() -> None:
    data = tree.encode("vllm-aot", {"rank_0_0/model": tree.TreeFile(bytes(1 << 20))})
    with pytest.raises(tree.TreeError, match="more than the allowed size"):
        tree.decode(data, max_unpacked_bytes=1 << 16)


@pytest.mark.parametrize("path", ["../x", "/abs/x", "a//b", "a/./b", "a/../b", "", "a/" * 20 + "x", "a\\b", "a/b/"])
def test_a_tree_holds_relative_plain_paths_only(path: str) -> None:
    with pytest.raises(tree.TreeError):
        tree.encode("vllm-aot", {path: tree.TreeFile(b"x")})


def test_a_path_that_is_both_file_and_dir_is_refused() -> None:
    with pytest.raises(tree.TreeError, match="both a file and a directory"):
        tree.encode("vllm-aot", {"a": tree.TreeFile(b"x"), "a/b": tree.TreeFile(b"y")})


# ---- where vLLM keeps an entry, and the entry on disk ---------------------------------------------


def test_locate_knows_vllms_aot_layout_only(tmp_path: Path) -> None:
    entry = _entry(tmp_path, "rank_1_0")
    assert entry.vllm_hash == HASH and entry.rank == "rank_1_0"
    assert entry.model_path == str(tmp_path / "torch_compile_cache/torch_aot_compile" / HASH / "rank_1_0/model")
    for other in ("torch_compile_cache/0123456789/rank_0_0/backbone/model", f"x/{HASH}/rank_0_0/model",
                  f"torch_aot_compile/{HASH}/rank_0_0/other", "torch_aot_compile/abc/rank_0_0/model"):
        assert vllm_cache.locate(str(tmp_path / other)) is None, other


def test_the_service_key_is_vllms_hash_rank_and_environment_not_a_path(tmp_path: Path) -> None:
    a, b = _entry(tmp_path / "node-a"), _entry(tmp_path / "elsewhere" / "node-b")
    assert a.service_key() == b.service_key()
    assert a.service_key().startswith(f"vllm-aot-v1:{HASH}:rank_0_0:")
    assert a.service_key() != _entry(tmp_path, "rank_1_0").service_key()  # ranks are separate entries
    assert str(tmp_path) not in a.service_key()


def test_an_entry_is_read_without_locks_temp_files_bytecode_or_triton_dirs(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    _populate(entry)
    files = vllm_cache.read_tree(entry)
    assert list(files) == ["inductor_cache/ab/cabcdef.py", "inductor_cache/ab/cabcdef.so", "inductor_cache/fxgraph/zz/fzz/0",
                           "rank_0_0/model"]  # model last
    assert files["inductor_cache/ab/cabcdef.so"].executable and not files["rank_0_0/model"].executable


def test_an_entry_installs_at_another_root_whole_and_model_last(tmp_path: Path) -> None:
    source = _entry(tmp_path / "a")
    _populate(source)
    payload = tree.encode(vllm_cache.TREE_KIND, vllm_cache.read_tree(source))
    target = _entry(tmp_path / "b" / "deeper")
    vllm_cache._check(target, payload)
    size, _mtime = vllm_cache.install_tree(target, tree.decode(payload))
    installed = sorted(str(p.relative_to(target.hash_dir)) for p in Path(target.hash_dir).rglob("*") if p.is_file())
    assert installed == ["inductor_cache/ab/cabcdef.py", "inductor_cache/ab/cabcdef.so", "inductor_cache/fxgraph/zz/fzz/0", "rank_0_0/model"]
    assert Path(target.model_path).read_bytes() == b"\x80\x04compiled model" and size == len(b"\x80\x04compiled model")
    assert os.access(Path(target.hash_dir) / "inductor_cache/ab/cabcdef.so", os.X_OK)
    assert not [p for p in Path(target.hash_dir).iterdir() if p.name.startswith(".")]  # no stage left


def test_an_installed_rank_leaves_files_already_there_alone(tmp_path: Path) -> None:
    """Another rank (or process) put the shared Inductor files there first: theirs stand."""
    source = _entry(tmp_path / "a")
    _populate(source)
    payload = tree.decode(tree.encode(vllm_cache.TREE_KIND, vllm_cache.read_tree(source)))
    target = _entry(tmp_path / "b")
    mine = Path(target.hash_dir) / "inductor_cache/ab/cabcdef.py"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"# written by rank 1\n")
    vllm_cache.install_tree(target, payload)
    assert mine.read_bytes() == b"# written by rank 1\n" and Path(target.model_path).exists()


@pytest.mark.parametrize("paths, why", [
    ({"rank_1_0/model": b"m"}, "no rank_0_0/model"),
    ({"rank_0_0/model": b"m", "rank_1_0/model": b"m"}, "outside"),
    ({"rank_0_0/model": b"m", "torch_aot_compile/x": b"m"}, "outside"),
])
def test_an_entry_for_another_rank_or_with_files_elsewhere_is_refused(tmp_path: Path, paths: dict[str, bytes], why: str) -> None:
    payload = tree.encode(vllm_cache.TREE_KIND, {p: tree.TreeFile(d) for p, d in paths.items()})
    with pytest.raises(tree.TreeError, match=why):
        vllm_cache._check(_entry(tmp_path), payload)


def test_an_entry_of_another_kind_is_refused(tmp_path: Path) -> None:
    payload = tree.encode("other", {"rank_0_0/model": tree.TreeFile(b"m")})
    with pytest.raises(tree.TreeError, match="another kind"):
        vllm_cache._check(_entry(tmp_path), payload)
