"""Pack size vs raw size over the corpus, and the CPU cost of packing and of unpacking.

For every kernel dir of the corpus: raw bytes (the files as they lie on disk), the pack at zstd
levels 1, 3 (kcache's default) and 9, and gzip -6 of the same tar as a reference point.

* ratio = raw bytes / pack bytes, summed over the corpus (target: >= 3x at the default level);
  (``--levels 1,3,9,19`` adds more; 19 packs at ~2 MB/s here, so it is not in the default run);
* pack MB/s = raw MB / seconds of ``build_pack`` (tar + zstd) for every kernel, single thread;
* unpack MB/s = raw MB / seconds of ``read_pack`` (zstd + tar + sha256 of every file + the
  manifest and kernel-dir checks), i.e. what the client and the service pay per download/upload.

Each timing is the median of ``--repeats`` passes over the whole corpus (one core).

    python -m bench.compression [--n 500] [--repeats 3] [--levels 1,3,9]
"""

from __future__ import annotations

import argparse
import io
import statistics
import tarfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import common

LEVELS = (1, 3, 9)
DEFAULT_LEVEL = 3


def _tar(manifest: Any, files: dict[str, bytes]) -> bytes:
    """The uncompressed tar inside a pack (for the gzip reference)."""
    from kcache_schemas.pack import MANIFEST_NAME

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w|", format=tarfile.PAX_FORMAT) as tf:
        for name, data in [(MANIFEST_NAME, manifest.model_dump_json().encode())] + [
            (f.name, files[f.name]) for f in manifest.files
        ]:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tf.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def _timed_pass(fn: Any, items: Sequence[Any], repeats: int) -> tuple[float, list[Any]]:
    times, out = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = [fn(x) for x in items]
        times.append(time.perf_counter() - t0)
    return common.median(times), out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compression", description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=common.DEFAULT_N, help="kernels (100..2000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="zstd levels, comma-separated")
    args = parser.parse_args(argv)
    level_list = [int(x) for x in args.levels.split(",") if x.strip()]
    if DEFAULT_LEVEL not in level_list:
        level_list.append(DEFAULT_LEVEL)

    from kcache_schemas.pack import build_pack, manifest_for_files, read_kernel_dir, read_pack

    info = common.machine()
    dirs = common.corpus_dirs(args.n)
    disk_bytes = common.dir_bytes(dirs)
    kernels = []
    for d in dirs:
        files = read_kernel_dir(d)
        kernels.append((manifest_for_files(d.name, files), files))
    raw = sum(sum(map(len, f.values())) for _, f in kernels)  # [REPLACE] form: what is packed
    raw_mb = raw / 1e6
    print(f"corpus: {len(dirs)} kernels, {disk_bytes / 1e6:.1f} MB on disk, {raw_mb:.1f} MB in [REPLACE] form")
    print(f"machine: {info['cpu_count']} x {info['cpu_model']}, load {info['loadavg_at_start']}")

    # Per-extension share of the raw bytes, so the ratio can be read against the content.
    by_ext: dict[str, int] = {}
    for _, files in kernels:
        for name, data in files.items():
            ext = "group" if name.startswith("__grp__") else Path(name).suffix or name
            by_ext[ext] = by_ext.get(ext, 0) + len(data)

    levels: dict[str, Any] = {}
    print(f"\n{'codec':10} {'packed MB':>9} {'ratio':>7} {'pack MB/s':>10} {'unpack+verify MB/s':>19} {'median pack KB':>15}")
    for level in level_list:
        pack_s, packs = _timed_pass(lambda k, lv=level: build_pack(k[0], k[1], lv), kernels, args.repeats)
        unpack_s, _ = _timed_pass(read_pack, packs, args.repeats)
        packed = sum(map(len, packs))
        levels[str(level)] = {
            "packed_bytes": packed,
            "ratio": raw / packed,
            "pack_mb_s": raw_mb / pack_s,
            "unpack_verify_mb_s": raw_mb / unpack_s,
            "pack_seconds": pack_s,
            "unpack_seconds": unpack_s,
            "median_pack_bytes": statistics.median(map(len, packs)),
        }
        lv = levels[str(level)]
        tag = f"zstd-{level}" + (" *" if level == DEFAULT_LEVEL else "")
        print(f"{tag:10} {packed / 1e6:>9.2f} {lv['ratio']:>6.2f}x {lv['pack_mb_s']:>10.1f} "
              f"{lv['unpack_verify_mb_s']:>19.1f} {lv['median_pack_bytes'] / 1e3:>15.1f}")

    tars = [_tar(m, f) for m, f in kernels]
    gz_s, gz = _timed_pass(lambda t: zlib.compress(t, 6), tars, args.repeats)
    gunz_s, _ = _timed_pass(zlib.decompress, gz, args.repeats)
    gz_bytes = sum(map(len, gz))
    gzip_ref = {"packed_bytes": gz_bytes, "ratio": raw / gz_bytes, "compress_mb_s": raw_mb / gz_s,
                "decompress_only_mb_s": raw_mb / gunz_s}
    print(f"{'gzip-6':10} {gz_bytes / 1e6:>9.2f} {gzip_ref['ratio']:>6.2f}x {gzip_ref['compress_mb_s']:>10.1f} "
          f"{gzip_ref['decompress_only_mb_s']:>19.1f}   (reference: compress of the tar only / decompress only)")

    d = levels[str(DEFAULT_LEVEL)]
    ratios = {
        "raw_over_pack_default": d["ratio"],
        "zstd3_size_over_gzip6_size": d["packed_bytes"] / gz_bytes,
        "zstd3_pack_speed_over_gzip6": d["pack_mb_s"] / gzip_ref["compress_mb_s"],
    }
    targets = {"pack_ge_3x_smaller": d["ratio"] >= 3.0}
    print("\ncontent: " + ", ".join(f"{k} {v / raw:.0%}" for k, v in sorted(by_ext.items(), key=lambda kv: -kv[1])))
    print(f"default (zstd-{DEFAULT_LEVEL}) ratio {d['ratio']:.2f}x   target >= 3x: {common.verdict(targets['pack_ge_3x_smaller'])}")
    print(f"zstd-3 vs gzip-6: {ratios['zstd3_size_over_gzip6_size']:.2f}x the size, "
          f"{ratios['zstd3_pack_speed_over_gzip6']:.1f}x the packing speed")

    common.write_result("compression", {
        "benchmark": "compression",
        "machine": info,
        "params": {"n": len(dirs), "repeats": args.repeats, "raw_bytes": raw, "disk_bytes": disk_bytes,
                   "default_level": DEFAULT_LEVEL, "statistic": "median of repeats, one thread",
                   "content_bytes_by_extension": by_ext},
        "results": {"zstd": levels, "gzip6_reference": gzip_ref},
        "ratios": ratios,
        "targets": targets,
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
