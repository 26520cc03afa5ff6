"""What a burst of readers and a few slow writers cost one ``kcache serve`` worker (issue #31).

Two figures, each on a fresh ``kcache serve --workers 1`` (the server is the subprocess itself;
its peak RSS is ``VmHWM`` of ``/proc/<pid>/status``, reset through ``/proc/<pid>/clear_refs``):

* ``readers``: ``--readers`` (16) concurrent whole-pack GETs of one ``--pack-mib`` (48 MiB) pack
  of random bytes (a large autotuned pack's shape; it does not compress): peak RSS above the
  warmed-up server's, the wall time of the burst, and whether every reader got the pack's bytes.
  Target: peak growth ≤ 100 MB.
* ``tricklers``: ``--tricklers`` (4) connections declare 64 MiB entry uploads (together the
  default 256 MiB memory budget) and send a byte every few seconds; meanwhile a 1 KB upload, an
  8 MiB upload and a file view of a stored kernel are tried. Target: all three land (before:
  every one answered 503 until the tricklers' 120 s body deadline).

``--source DIR`` runs another checkout's server (e.g. ``git archive <rev> | tar -x -C DIR``) for
the "before" figures; this checkout's client side makes the same requests for both.

    python -m bench.burst_memory [--source DIR] [--readers 16] [--pack-mib 48]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench import common
from bench.hostile_memory import reset_peak, serve, status_kib

NS = "burst"
MIB = 1 << 20


def _digest(url: str, path: str) -> str:
    h = hashlib.sha256()
    with httpx.Client(base_url=url, timeout=600) as c, c.stream("GET", path) as r:
        r.raise_for_status()
        for chunk in r.iter_bytes(MIB):
            h.update(chunk)
    return h.hexdigest()


def readers(root: Path, source: Path, key: str, pack: bytes, n: int) -> dict[str, Any]:
    want = hashlib.sha256(pack).hexdigest()
    path = f"/v1/{NS}/kernels/{key}"
    with serve(root, source, {}) as (url, pid):
        assert httpx.put(f"{url}{path}", content=pack, timeout=600).status_code in (200, 201)
        assert _digest(url, path) == want  # warm the read path
        reset_peak(pid)
        idle = status_kib(pid, "VmRSS")
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            got = list(pool.map(lambda _: _digest(url, path), range(n)))
        seconds = time.perf_counter() - t0
        return {
            "readers": n, "pack_mib": round(len(pack) / MIB, 1), "idle_rss_mib": round(idle / 1024, 1),
            "peak_growth_mib": round((status_kib(pid, "VmHWM") - idle) / 1024, 1),
            "seconds": round(seconds, 2), "all_bytes_right": got == [want] * n,
        }


def tricklers(root: Path, source: Path, key: str, pack: bytes, name: str, n: int) -> dict[str, Any]:
    with serve(root, source, {}) as (url, _pid):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        with httpx.Client(base_url=url, timeout=120) as c:
            assert c.put(f"/v1/{NS}/kernels/{key}", content=pack).status_code in (200, 201)
            socks = []
            for i in range(n):
                sock = socket.create_connection((host, int(port)), timeout=30)
                head = f"PUT /v1/{NS}/entries/fx-graph/trickle-{i} HTTP/1.1\r\nHost: kcache\r\nContent-Length: {64 * MIB}\r\n\r\n"
                sock.sendall(head.encode() + b"x")
                socks.append(sock)
            stop = threading.Event()

            def trickle() -> None:
                while not stop.wait(5):
                    for sock in socks:
                        with contextlib.suppress(OSError):
                            sock.send(b"x")

            threading.Thread(target=trickle, daemon=True).start()
            try:
                time.sleep(1)  # the four routes have started
                t0 = time.perf_counter()
                small = c.put(f"/v1/{NS}/entries/fx-graph/small", content=b"s" * 1000).status_code
                eight = c.put(f"/v1/{NS}/entries/fx-graph/eight", content=b"e" * (8 * MIB)).status_code
                view = c.get(f"/v1/{NS}/kernels/{key}/files/{name}.ptx").status_code
                seconds = time.perf_counter() - t0
            finally:
                stop.set()
                for sock in socks:
                    sock.close()
    return {"tricklers": n, "declared_mib_each": 64, "small_upload": small, "upload_8mib": eight,
            "file_view": view, "seconds": round(seconds, 2)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.burst_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--readers", type=int, default=16)
    parser.add_argument("--pack-mib", type=int, default=48)
    parser.add_argument("--tricklers", type=int, default=4)
    parser.add_argument("--source", type=Path, default=common.REPO, help="checkout whose server to run")
    parser.add_argument("--result-name", default="burst_memory")
    args = parser.parse_args(argv)
    from kcache_testkit.kernels import large_pack, real_kernels

    root = common.tmp_root("burst-")
    res: dict[str, Any] = {"source": str(args.source)}
    try:
        kernel = real_kernels(root / "triton", count=1)[0]
        source = args.source.resolve()
        res["readers"] = readers(root / "r", source, kernel.key, large_pack(kernel, args.pack_mib * MIB), args.readers)
        print("readers", res["readers"], flush=True)
        res["tricklers"] = tricklers(root / "t", source, kernel.key, kernel.pack, kernel.name, args.tricklers)
        print("tricklers", res["tricklers"], flush=True)
    finally:
        common.drop_dir(root)
    ok = res["readers"]["peak_growth_mib"] * MIB / 1e6 <= 100 and res["readers"]["all_bytes_right"]
    print(f"readers: peak RSS growth {res['readers']['peak_growth_mib']} MiB (target <= 100 MB): {common.verdict(ok)}")
    t = res["tricklers"]
    print(f"tricklers: small upload {t['small_upload']}, 8 MiB upload {t['upload_8mib']}, file view {t['file_view']}: "
          f"{common.verdict(t['small_upload'] == 201 and t['upload_8mib'] == 201 and t['file_view'] == 200)}")
    common.write_result(args.result_name, {"benchmark": "burst_memory", "machine": common.machine(),
                                           "params": {k: str(v) for k, v in vars(args).items()}, "results": res})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
