"""``kcache serve``: run the service under uvicorn with structured (JSON) log lines."""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sys
import time
from typing import Any

from pydantic import ValidationError

from kcache_server.settings import Settings, describe_errors


class JsonFormatter(logging.Formatter):
    """One JSON object per line, so log pipelines can parse fields instead of regexing text."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def log_config(level: str) -> dict[str, Any]:
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"default": handler},
        "loggers": {
            name: {"handlers": ["default"], "level": level.upper(), "propagate": False}
            for name in ("kcache_server", "uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }


def serve(settings_overrides: dict[str, Any]) -> None:
    # Overrides travel as env vars so that every uvicorn worker process builds the same Settings.
    for name, value in settings_overrides.items():
        if value is not None:
            os.environ[f"KCACHE_{name.upper()}"] = str(value)
    try:
        settings = Settings()
    except ValidationError as exc:  # e.g. a weak token: say which setting, not a traceback
        raise SystemExit(f"kcache: invalid settings: {describe_errors(exc)}") from None
    settings.check_bind()
    check_port(settings.host, settings.port)  # before "serving on": a taken port is said as such
    import uvicorn

    if settings.resolved_blob_url.startswith("file://") or settings.resolved_index_url.startswith("sqlite://"):
        print(f"kcache: data in {settings.data_dir.resolve()} (blobs {settings.resolved_blob_url}, "
              f"index {settings.resolved_index_url})", file=sys.stderr)
    print(f"kcache: serving on http://{settings.host}:{settings.port} (API docs at /docs)", file=sys.stderr)
    from uvicorn.config import Config

    bind_socket = Config.bind_socket

    def bind_tcp_socket(config: Config) -> socket.socket:
        return _with_tcp_proto(bind_socket(config))

    # Only the supervisor of ``--workers N`` calls bind_socket; restored when uvicorn returns.
    setattr(Config, "bind_socket", bind_tcp_socket)  # noqa: B010 - a method, not an attribute
    try:
        uvicorn.run(
            "kcache_server.app:create_app",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            log_config=log_config(settings.log_level),
            proxy_headers=True,
        )
    finally:
        setattr(Config, "bind_socket", bind_socket)  # noqa: B010


def check_port(host: str, port: int) -> None:
    """Exit with a clear message unless ``host:port`` can be bound now (as uvicorn binds it, with
    SO_REUSEADDR: a port in TIME_WAIT passes, one another process listens on does not)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            why = f"port {port} is taken (another process listens on it: another kcache serve?); pick another with --port or KCACHE_PORT"
        elif exc.errno == errno.EACCES:
            why = f"port {port} needs privileges here; pick one above 1023 with --port or KCACHE_PORT"
        else:
            why = f"{exc.strerror or exc} (check --host / KCACHE_HOST)"
        raise SystemExit(f"kcache: cannot serve on {host}:{port}: {why}") from None


def _with_tcp_proto(sock: socket.socket) -> socket.socket:
    """The listening socket uvicorn binds for ``--workers N`` with ``proto`` set to TCP.

    uvicorn's ``Config.bind_socket`` leaves ``proto`` 0; accepted connections inherit it and
    asyncio turns on TCP_NODELAY only for ``proto == IPPROTO_TCP``, so with ``--workers`` > 1
    every keep-alive response waited ~40 ms for the client's delayed ACK (Nagle):
    Kludex/uvicorn#3149. Same fd, same bound address, only the Python-side metadata changes.
    """
    if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM and sock.proto == 0:
        inheritable = sock.get_inheritable()
        sock = socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())
        sock.set_inheritable(inheritable)
    return sock
