"""Index in a SQLite file (the embedded default). WAL mode, so readers never block the writer
and several server worker processes can share one file."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

from kcache_server.storage.base import BackendUnavailable, Index, IndexRecord, KindUsage

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    namespace TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    digest TEXT NOT NULL,
    size INTEGER NOT NULL,
    meta TEXT NOT NULL,
    created_at REAL NOT NULL,
    last_access REAL NOT NULL DEFAULT 0,
    hits INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, kind, key)
) WITHOUT ROWID;
"""
_COLUMNS = "namespace, kind, key, digest, size, meta, created_at, last_access, hits"
# SQLite's default limit on bound parameters is 999 in old builds; stay under it.
_CHUNK = 500


def _record(row: tuple[object, ...]) -> IndexRecord:
    return IndexRecord(*row)  # type: ignore[arg-type]


class SqliteIndex(Index):
    name = "sqlite"

    def __init__(self, path: str) -> None:
        self.path = path
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._conn() as conn:
            conn.executescript(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        # One connection per thread: sqlite3 connections must not be shared across threads
        # without serialising every call, and FastAPI runs sync endpoints in a thread pool.
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
            except sqlite3.Error as exc:
                raise BackendUnavailable(self.name, str(exc)) from exc
            self._local.conn = conn
        return conn

    def _query(self, sql: str, args: Iterable[object] = ()) -> list[tuple[object, ...]]:
        try:
            return self._conn().execute(sql, tuple(args)).fetchall()
        except sqlite3.OperationalError as exc:  # locked past the timeout, disk full, ...
            raise BackendUnavailable(self.name, str(exc)) from exc

    def get(self, namespace: str, kind: str, key: str) -> IndexRecord | None:
        rows = self._query(
            f"SELECT {_COLUMNS} FROM records WHERE namespace=? AND kind=? AND key=?",
            (namespace, kind, key),
        )
        return _record(rows[0]) if rows else None

    def get_many(self, namespace: str, kind: str, keys: list[str]) -> dict[str, IndexRecord]:
        found: dict[str, IndexRecord] = {}
        unique = list(dict.fromkeys(keys))
        for i in range(0, len(unique), _CHUNK):
            chunk = unique[i : i + _CHUNK]
            marks = ",".join("?" * len(chunk))
            for row in self._query(
                f"SELECT {_COLUMNS} FROM records WHERE namespace=? AND kind=? AND key IN ({marks})",
                (namespace, kind, *chunk),
            ):
                rec = _record(row)
                found[rec.key] = rec
        return found

    def put_if_absent(self, record: IndexRecord) -> IndexRecord:
        self._query(
            f"INSERT INTO records ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?) "
            "ON CONFLICT(namespace, kind, key) DO NOTHING",
            _values(record),
        )
        stored = self.get(record.namespace, record.kind, record.key)
        assert stored is not None  # nothing deletes between our insert and read but an admin
        return stored

    def upsert(self, record: IndexRecord) -> None:
        self._query(f"INSERT OR REPLACE INTO records ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)", _values(record))

    def delete(self, namespace: str, kind: str, key: str, digest: str | None = None) -> bool:
        sql = "DELETE FROM records WHERE namespace=? AND kind=? AND key=?"
        args: list[object] = [namespace, kind, key]
        if digest is not None:
            sql += " AND digest=?"
            args.append(digest)
        return bool(self._query(sql + " RETURNING key", args))

    def list(
        self, namespace: str, kind: str, *, after: str = "", prefix: str = "", limit: int = 100
    ) -> list[IndexRecord]:
        sql = f"SELECT {_COLUMNS} FROM records WHERE namespace=? AND kind=? AND key>?"
        args: list[object] = [namespace, kind, after]
        if prefix:
            # Range scan instead of LIKE, so '%' and '_' in prefixes mean themselves.
            sql += " AND key>=? AND key<?"
            args += [prefix, prefix + "\U0010ffff"]
        rows = self._query(sql + " ORDER BY key LIMIT ?", (*args, limit))
        return [_record(r) for r in rows]

    def touch(self, namespace: str, kind: str, keys: Iterable[str], when: float) -> None:
        try:
            conn = self._conn()
            conn.executemany(
                "UPDATE records SET hits=hits+1, last_access=max(last_access, ?) "
                "WHERE namespace=? AND kind=? AND key=?",
                [(when, namespace, kind, k) for k in keys],
            )
        except sqlite3.OperationalError as exc:
            raise BackendUnavailable(self.name, str(exc)) from exc

    def usage(self) -> dict[str, dict[str, KindUsage]]:
        out: dict[str, dict[str, KindUsage]] = {}
        rows = self._query(
            "SELECT namespace, kind, count(*), coalesce(sum(size), 0) FROM records GROUP BY 1, 2"
        )
        for ns, kind, count, total in rows:
            out.setdefault(str(ns), {})[str(kind)] = KindUsage(int(count), int(total))  # type: ignore[call-overload]
        return out

    def ping(self) -> None:
        self._query("SELECT 1")

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def _values(r: IndexRecord) -> tuple[object, ...]:
    return (r.namespace, r.kind, r.key, r.digest, r.size, r.meta, r.created_at, r.last_access, r.hits)
