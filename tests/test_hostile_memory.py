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
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kcache_schemas.pack import MEDIA_TYPE

from kcache_testkit.kernels import Kernel

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
