"""Reading what a ``kcache serve`` with ``KCACHE_DOWNLOAD_LOG=1`` wrote to its stderr, a slice at
a time: the artifacts it handed out (:mod:`kcache_server.downloads`) and, with
``KCACHE_LOG_LEVEL=info``, the requests of uvicorn's access log (method and path).

A node's downloads are what the service logged while that node ran (nodes run one after the
other): ``take()`` before it starts, ``take()`` after it ends.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from kcache_server.downloads import Download, parse

_ACCESS = re.compile(r'"(\w+) (/[^ ?]+)\S* HTTP/[0-9.]+" (\d+)$')


@dataclass
class Slice:
    downloads: list[Download] = field(default_factory=list)
    requests: Counter[tuple[str, str, int]] = field(default_factory=Counter)  # (method, path, status)

    def per_artifact(self) -> Counter[tuple[str, str]]:
        """How many times each ``(layer, key)`` was handed out."""
        return Counter((d.layer, d.key) for d in self.downloads)


class DownloadLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def take(self) -> Slice:
        """What the service logged since the last ``take()`` (complete lines only)."""
        out = Slice()
        if not self.path.exists():
            return out
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next take
        self.offset += end
        for line in data[:end].decode(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            msg = str(record.get("msg", ""))
            if record.get("logger") == "kcache_server.downloads" and (d := parse(msg)) is not None:
                out.downloads.append(d)
            elif record.get("logger") == "uvicorn.access" and (m := _ACCESS.search(msg)):
                out.requests[(m.group(1), unquote(m.group(2)), int(m.group(3)))] += 1
        return out
