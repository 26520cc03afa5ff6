"""Kernels whose names Triton shortens in their file names (``kcache_testkit.long_names``).

Triton names a kernel's files after the first 150 characters of its name while ``<file>.json``
keeps the whole name; Inductor's fused kernels in training graphs are often that long. kcache
once derived the kernel's name from the group file and refused every such kernel
(``PackError: ...json: 'name' is not '...'``): never cached, compiled on every fresh node.
"""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path

import pytest
from kcache.cli.commands import main as cli
from kcache.config import ClientConfig
from kcache.transport.http import KcacheClient
from kcache_schemas.pack import pack_kernel_dir, read_kernel_dir, read_pack

from kcache_testkit.kernels import triton_cache_hits
from kcache_testkit.long_names import LONG_NAME, TRITON_FILE_NAME_MAX, compile_long_name

pytestmark = pytest.mark.torch
pytest_plugins = ["live"]
SHORT = LONG_NAME[:TRITON_FILE_NAME_MAX]


@pytest.fixture(scope="module")
def long_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_long_name(tmp_path_factory.mktemp("triton-long"))




def test_the_pack_names_the_kernel_by_its_files(long_dir: Path) -> None:
    manifest, pack = pack_kernel_dir(long_dir)
    assert manifest.kernel_name == SHORT and manifest.group_file == f"__grp__{SHORT}.json"
    got, files = read_pack(pack)  # what the service and every client check before storing/emitting
    assert got == manifest and files == read_kernel_dir(long_dir)


def test_push_then_pull_is_a_triton_cache_hit(long_dir: Path, live_service, tmp_path: Path) -> None:
    assert cli(["push", str(long_dir.parent), "--url", live_service.url]) == 0
    client = KcacheClient(ClientConfig(url=live_service.url))
    assert client.missing([long_dir.name]) == []
    assert client.manifest(long_dir.name).kernel_name == SHORT

    dest = tmp_path / "fresh-node"
    assert cli(["pull", long_dir.name, "--dest", str(dest), "--url", live_service.url]) == 0
    assert read_kernel_dir(dest / long_dir.name) == read_kernel_dir(long_dir)
    assert triton_cache_hits(lambda: compile_long_name(dest)) == [True]  # Triton loads what kcache wrote


def test_inductor_bundles_upload_and_emit_it(long_dir: Path, live_service, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """Through kcache's TritonBundler hooks: ``collect`` uploads the kernel (it was counted
    ``unportable`` and dropped), ``read_and_emit`` on a fresh node writes it with kcache's
    emitter (it fell back to Inductor with ``could not emit kernel ... PackError``)."""
    pytest.importorskip("torch")
    import kcache
    from kcache.current import get_runtime
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config
    from torch._inductor.triton_bundler import TritonBundler

    assert kcache.install(url=live_service.url, local_dir=str(tmp_path / "local"))
    try:
        monkeypatch.setenv("TRITON_CACHE_DIR", str(long_dir.parent))
        with inductor_config.patch(bundle_triton_into_fx_graph_cache=True):
            TritonBundler.begin_compile()
            TritonBundler.put(long_dir.name, 0)
            bundle, _meta = TritonBundler.collect()
        rt = get_runtime()
        assert rt is not None and rt.uploader is not None and rt.uploader.flush(10)
        kernel = rt.stats.snapshot()["kernel"]
        assert kernel.puts == 1 and kernel.put_errors == 0, kernel
        _m, files = read_pack(KcacheClient(ClientConfig(url=live_service.url)).get_pack(long_dir.name))
        assert files == {a.filename: a.payload for a in bundle.kernel_artifacts[0].artifacts}

        fresh = tmp_path / "fresh-node"
        monkeypatch.setenv("TRITON_CACHE_DIR", str(fresh))
        counters.clear()
        with caplog.at_level(logging.WARNING, logger="kcache"), inductor_config.patch(bundle_triton_into_fx_graph_cache=True):
            meta = TritonBundler.read_and_emit(pickle.loads(pickle.dumps(bundle)))
        assert not [r for r in caplog.records if "could not emit" in r.getMessage()]
        assert meta is not None and SHORT in meta.cached_kernel_names
        assert counters["inductor"]["triton_bundler_read_and_emit_kernel"] == len(os.listdir(long_dir))
        assert rt.emitted_kernels.get(long_dir.name) == fresh  # written by kcache's emitter
        assert read_kernel_dir(fresh / long_dir.name) == read_kernel_dir(long_dir)
    finally:
        kcache.uninstall()
