"""Peak memory of a real ``kcache serve`` under issue #17's amplifying inputs (``--workers 1``:
the server is the subprocess itself; its peak RSS is ``VmHWM`` of ``/proc/<pid>/status``).

Before the fix, a valid 36 KB pack whose ``.cubin`` is 900 MiB of zeros took the PUT to 2.7 GB
of peak RSS above idle, and two concurrent file views of it (once stored) to 4.5 GB
(``bench/results/hostile_memory_core.json``). The stated bound now: every one of these inputs
together raises the server's peak RSS less than ``BOUND_MIB`` above its warmed-up RSS, which is
less than the 48 MiB that the within-cap pack below unpacks to, so no request can have held it
whole:

* PUT of the 900 MiB amplifier: refused (413) from its zstd frame header;
* two concurrent file views of it, stored as an older service stored it: refused (413);
* PUT of a pack whose ``.cubin`` is 48 MiB of zeros (under the 64 MiB cap): stored, verified
  while streaming;
* two concurrent views of its ``.ptx``, stored after the ``.cubin``: served, the ``.cubin``
  decompressed and dropped on the way.

A view of the 48 MiB ``.cubin`` itself holds that file (the bound there is the cap), so it is
checked for its bytes, after the measurement.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kcache_schemas.pack import MEDIA_TYPE

from kcache_testkit.kernels import Kernel, large_pack
from kcache_testkit.pace import HANG_S

pytest.register_assert_rewrite("api_helpers")


from kcache_testkit.hostile_packs import store_as_older_service, zero_filled_pack  # noqa: E402
from kcache_testkit.service import ServerProcess  # noqa: E402

pytest_plugins = ["api_helpers"]

BOUND_MIB = 32
NS = "hostile"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/status"),
]


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path / "data", tmp_path) as srv:
        yield srv


def _put(c: httpx.Client, key: str, pack: bytes) -> httpx.Response:
    return c.put(f"/v1/{NS}/kernels/{key}", content=pack, headers={"Content-Type": MEDIA_TYPE})


def _two_views(c: httpx.Client, key: str, name: str) -> list[httpx.Response]:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda _: c.get(f"/v1/{NS}/kernels/{key}/files/{name}"), range(2)))


def test_amplifying_inputs_stay_under_the_memory_bound(server: ServerProcess, kernels: list[Kernel]) -> None:
    amp, ok, warm = kernels[0], kernels[1], kernels[2]
    amplifier = zero_filled_pack(amp.manifest, amp.files, f"{amp.name}.cubin", 900 << 20)
    within_cap = zero_filled_pack(ok.manifest, ok.files, f"{ok.name}.cubin", 48 << 20)
    assert len(amplifier) < 64_000 and len(within_cap) < 16_000
    assert server.proc is not None
    pid = server.proc.pid
    with server.client() as c:
        # warm up every code path first (imports, pools), then measure from there
        assert _put(c, warm.key, warm.pack).status_code == 201
        assert c.get(f"/v1/{NS}/kernels/{warm.key}/files/{warm.name}.ptx").content == warm.files[f"{warm.name}.ptx"]
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)
        baseline = _kib(pid, "VmRSS")

        r = _put(c, amp.key, amplifier)
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large", r.text
        store_as_older_service(server.data_dir, NS, amp.key, amplifier)
        for name in (f"{amp.name}.ptx", f"{amp.name}.cubin"):
            assert [v.status_code for v in _two_views(c, amp.key, name)] == [413, 413]

        assert _put(c, ok.key, within_cap).status_code == 201
        ptx = f"{ok.name}.ptx"
        assert [v.content for v in _two_views(c, ok.key, ptx)] == [ok.files[ptx]] * 2

        peak_mib = (_kib(pid, "VmHWM") - baseline) / 1024
        assert peak_mib < BOUND_MIB, f"server peak RSS rose {peak_mib:.1f} MiB (bound {BOUND_MIB} MiB)"

        cubin = c.get(f"/v1/{NS}/kernels/{ok.key}/files/{ok.name}.cubin")
        assert cubin.status_code == 200 and cubin.content == bytes(48 << 20)
        assert c.get(f"/v1/{NS}/kernels/{ok.key}").content == within_cap  # stored byte for byte
    assert "Traceback" not in server.stderr()


# ---- a burst of readers (issue #31) ------------------------------------------------------------

READERS = 16
READ_BOUND_MIB = 100  # the target for 16 readers of a 48 MiB pack


def _digest_of(url: str, method: str, path: str, **kw: object) -> tuple[int, str]:
    """Stream one response (the test process must not hold 16 copies either): status, sha256."""
    h = hashlib.sha256()
    with httpx.Client(base_url=url, timeout=HANG_S) as c, c.stream(method, path, **kw) as r:  # type: ignore[arg-type]
        for chunk in r.iter_bytes(1 << 20):
            h.update(chunk)
    return r.status_code, h.hexdigest()


def _batch_pack_digest(url: str, key: str) -> str:
    with httpx.Client(base_url=url, timeout=HANG_S) as c, c.stream("POST", f"/v1/{NS}/kernels:batch-get", json={"keys": [key]}) as r:
        assert r.status_code == 200
        raw = io.BufferedReader(_Chunks(r.iter_bytes(1 << 20)), 1 << 20)  # type: ignore[arg-type]
        with tarfile.open(fileobj=raw, mode="r|") as tf:
            for member in tf:
                if member.name == f"{key}.kpack":
                    fh = tf.extractfile(member)
                    assert fh is not None
                    h = hashlib.sha256()
                    while chunk := fh.read(1 << 20):
                        h.update(chunk)
                    return h.hexdigest()
    raise AssertionError("the batch did not carry the pack")


class _Chunks(io.RawIOBase):
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._buf = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._buf:
            self._buf = next(self._chunks, b"")
            if not self._buf:
                return 0
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n


def test_concurrent_readers_of_a_large_pack_stay_under_the_bound(server: ServerProcess, kernels: list[Kernel]) -> None:
    """16 concurrent GETs of one 48 MiB pack, then of a 48 MiB entry, then 4 batch-gets of the
    pack: the server's peak RSS rises less than READ_BOUND_MIB. Before the blob store streamed
    reads, each GET held the whole blob: 16 GETs of a 48 MiB pack took a worker from 61 MB to
    862 MB (+801 MB; here +789 MiB)."""
    k = kernels[3]
    pack = large_pack(k, 48 << 20)
    entry = bytes(reversed(pack))  # as large, other bytes
    digests = {"pack": hashlib.sha256(pack).hexdigest(), "entry": hashlib.sha256(entry).hexdigest()}
    assert server.proc is not None
    pid, url = server.proc.pid, server.url
    with httpx.Client(base_url=url, timeout=HANG_S) as c:
        assert _put(c, k.key, pack).status_code == 201
        assert c.put(f"/v1/{NS}/entries/fx-graph/big", content=entry).status_code == 201
    del pack, entry
    # warm up the read paths (one of each), then measure from there
    assert _digest_of(url, "GET", f"/v1/{NS}/kernels/{k.key}") == (200, digests["pack"])
    assert _batch_pack_digest(url, k.key) == digests["pack"]
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    baseline = _kib(pid, "VmRSS")

    with concurrent.futures.ThreadPoolExecutor(READERS) as pool:
        packs = list(pool.map(lambda _: _digest_of(url, "GET", f"/v1/{NS}/kernels/{k.key}"), range(READERS)))
        entries = list(pool.map(lambda _: _digest_of(url, "GET", f"/v1/{NS}/entries/fx-graph/big"), range(READERS)))
        batches = list(pool.map(lambda _: _batch_pack_digest(url, k.key), range(4)))
    peak_mib = (_kib(pid, "VmHWM") - baseline) / 1024
    assert packs == [(200, digests["pack"])] * READERS
    assert entries == [(200, digests["entry"])] * READERS
    assert batches == [digests["pack"]] * 4
    assert peak_mib < READ_BOUND_MIB, f"server peak RSS rose {peak_mib:.1f} MiB with {READERS} readers (bound {READ_BOUND_MIB} MiB)"
    assert "Traceback" not in server.stderr()
