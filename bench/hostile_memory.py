"""Peak memory of a real ``kcache serve`` under the memory-amplifying requests of issue #17.

A hostile client can send a tiny pack that unpacks to a lot: the issue's input is a valid 41.6 KB
pack whose ``.cubin`` is 900 MiB of zeros. Before the hardening, the PUT held it decompressed
(with copies: 2.83 GB peak RSS) and every file view of it decompressed the whole pack again.
This measures, on a fresh ``kcache serve`` subprocess per figure (``--workers 1``: the server is that process),
the peak RSS (``VmHWM`` of ``/proc/<pid>/status``, reset before each scenario through
``/proc/<pid>/clear_refs``) above the idle server's, for:

* ``put``: PUT of the amplifying pack;
* ``file_views``: two concurrent ``GET .../files/<name>`` of it, once for a file stored after the
  big one (the pack must be walked through it) and once for the big file itself. When the
  server refuses the PUT, the pack is placed in its storage as an older service stored it;
* the same for a pack just under the decompression cap (``--within-cap``), which is stored;
* ``pax_overflow``: the status of the issue's malformed PAX header (was 500).

``--source DIR`` runs another checkout's server (e.g. ``git archive core | tar -x -C DIR``) for
the "before" figures; the client side (this checkout) builds the same inputs for both.

    python -m bench.hostile_memory [--size-mib 900] [--source DIR]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench import common
from kcache_testkit import hostile_packs
from kcache_testkit.service import ServerProcess, server_env

NS = "hostile"


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def reset_peak(pid: int) -> None:
    """Linux >= 4.0: writing 5 to clear_refs resets VmHWM to the current RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@contextmanager
def serve(root: Path, source: Path, env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """``source``'s service (this checkout's, or an older one's to compare), one worker."""
    pythonpath = os.pathsep.join(str(source / p) for p in ("schemas", "client", "service", "."))
    penv = {k: v for k, v in server_env(root, PYTHONPATH=pythonpath, **env).items() if not k.startswith("TRITON_")}
    with ServerProcess(root / "data", root, args=["--workers", "1"], env=penv, name="serve", ready_path="/readyz") as srv:
        assert srv.proc is not None
        yield srv.url, srv.proc.pid


def peak_above_idle(root: Path, source: Path, fn: Any) -> tuple[Any, float]:
    """Run ``fn(url)`` against a fresh server on ``root``'s data; return its result and the
    server's peak RSS above its idle RSS, in MiB. A fresh process per measurement: memory an
    earlier request left in the allocator would hide the next one's peak."""
    with serve(root, source, {}) as (url, pid):
        reset_peak(pid)
        idle = status_kib(pid, "VmRSS")
        out = fn(url)
        return out, round((status_kib(pid, "VmHWM") - idle) / 1024, 1)


def scenario(root: Path, source: Path, key: str, pack: bytes, names: tuple[str, str]) -> dict[str, Any]:
    res: dict[str, Any] = {"pack_kb": round(len(pack) / 1e3, 1)}

    def put(url: str) -> httpx.Response:
        return httpx.put(f"{url}/v1/{NS}/kernels/{key}", content=pack, timeout=600)

    t0 = time.perf_counter()
    r, res["put_peak_mib"] = peak_above_idle(root, source, put)
    res["put_status"], res["put_s"] = r.status_code, round(time.perf_counter() - t0, 2)
    if r.status_code not in (200, 201):
        hostile_packs.store_as_older_service(root / "data", NS, key, pack)
        res["stored_by"] = "placed as an older service stored it"
    for label, name in zip(("after_big", "big"), names, strict=True):
        def two_views(url: str, name: str = name) -> list[int]:
            with httpx.Client(base_url=url, timeout=600) as client, concurrent.futures.ThreadPoolExecutor(2) as pool:
                return [f.status_code for f in pool.map(lambda _: client.get(f"/v1/{NS}/kernels/{key}/files/{name}"), range(2))]

        t0 = time.perf_counter()
        statuses, res[f"views_{label}_peak_mib"] = peak_above_idle(root, source, two_views)
        res[f"views_{label}_status"], res[f"views_{label}_s"] = statuses, round(time.perf_counter() - t0, 2)
    return res


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=900, help="zeros in the amplifying .cubin (MiB)")
    parser.add_argument("--within-cap-mib", type=int, default=60, help="zeros in a pack just under the cap (0: skip)")
    parser.add_argument("--source", type=Path, default=common.REPO, help="checkout whose server to run")
    parser.add_argument("--result-name", default="hostile_memory")
    args = parser.parse_args(argv)
    hp = hostile_packs
    from kcache_schemas.pack import pack_kernel_dir, read_kernel_dir

    from kcache_testkit.corpus import compile_small

    root = common.tmp_root("hostile-")
    res: dict[str, Any] = {"source": str(args.source)}
    try:
        kdirs = compile_small(root / "triton", count=2, arch=90)
        kernels = []
        for d in kdirs:
            manifest, _pack = pack_kernel_dir(d)
            kernels.append((d.name, manifest, read_kernel_dir(d)))
        source = args.source.resolve()
        for label, (key, manifest, files), mib in (("amplifier", kernels[0], args.size_mib),
                                                   ("within_cap", kernels[1], args.within_cap_mib)):
            if not mib:
                continue
            big = f"{manifest.kernel_name}.cubin"
            after = f"{manifest.kernel_name}.ptx"  # sorted after the .cubin: read through it
            pack = hp.zero_filled_pack(manifest, files, big, mib << 20)
            res[label] = {"unpacked_mib": mib} | scenario(root, source, key, pack, (after, big))
            print(label, res[label], flush=True)
        with serve(root, source, {}) as (url, pid):
            res["idle_rss_mib"] = round(status_kib(pid, "VmRSS") / 1024, 1)
            key, manifest, files = kernels[0]
            r = httpx.put(f"{url}/v1/{NS}-pax/kernels/{key}", content=hp.pax_overflow_pack(manifest, files), timeout=60)
            res["pax_overflow"] = {"status": r.status_code, "body": r.text[:200]}
            print("pax_overflow", res["pax_overflow"])
            res["final_rss_mib"] = round(status_kib(pid, "VmRSS") / 1024, 1)
    finally:
        common.drop_dir(root)
    common.write_result(args.result_name, {"benchmark": "hostile_memory", "machine": common.machine(),
                                           "params": {k: str(v) for k, v in vars(args).items()}, "results": res})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
