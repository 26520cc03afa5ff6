"""The ``kcache`` command line."""

from __future__ import annotations

import argparse
import sys


def _serve(args: argparse.Namespace) -> int:
    try:
        from kcache_server.server import serve
    except ImportError as exc:
        print(f"kcache serve needs the service install ({exc.name} is missing): pip install kcache", file=sys.stderr)
        return 2
    serve({"host": args.host, "port": args.port, "data_dir": args.data_dir, "workers": args.workers, "log_level": args.log_level})
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kcache", description="Distributed cache for compiled GPU kernels")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the cache service (embedded default: files + SQLite)")
    serve.add_argument("--host", default=None, help="bind address (default 127.0.0.1; KCACHE_HOST)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8765; KCACHE_PORT)")
    serve.add_argument("--data-dir", default=None, help="data dir (default ~/.cache/kcache/server; KCACHE_DATA_DIR)")
    serve.add_argument("--workers", type=int, default=None, help="worker processes (default 1)")
    serve.add_argument("--log-level", default=None, help="debug|info|warning (default info)")
    serve.set_defaults(func=_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
