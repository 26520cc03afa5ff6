"""Index in a SQLite file (the embedded default). WAL mode, so readers never block the writer
and several server worker processes can share one file."""

from __future__ import annotations

import builtins
import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from kcache_server.storage.base import (
    BackendUnavailable,
    Index,
    IndexRecord,
    KindUsage,
    new_token,
)

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
CREATE TABLE IF NOT EXISTS blob_refs (
    digest TEXT NOT NULL,
    ref TEXT NOT NULL,
    token TEXT NOT NULL,
    PRIMARY KEY (digest, ref)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS blob_deletes (
    digest TEXT PRIMARY KEY,
    token TEXT NOT NULL,
    expires REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    token TEXT NOT NULL,
    expires REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS flags (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
"""
_REFS_COMPLETE = "blob_refs_complete"
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
        self, namespace: str, kind: str, *, after: str = "", prefix: str = "", limit: int = 100, meta: bool = True
    ) -> list[IndexRecord]:
        columns = _COLUMNS if meta else _COLUMNS.replace("meta,", "'' AS meta,")
        sql = f"SELECT {columns} FROM records WHERE namespace=? AND kind=? AND key>?"
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

    # ---- retention -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``: the write lock first, so a check and the write that
        depends on it see no other writer in between (several worker processes share the file)."""
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise BackendUnavailable(self.name, str(exc)) from exc
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise BackendUnavailable(self.name, str(exc)) from exc

    def delete_unused(self, records: Sequence[IndexRecord]) -> builtins.list[bool]:
        out: builtins.list[bool] = []
        try:
            with self._transaction() as conn:
                for r in records:
                    rows = conn.execute(
                        "DELETE FROM records WHERE namespace=? AND kind=? AND key=? AND digest=? "
                        "AND max(created_at, last_access) <= ? RETURNING key",
                        (r.namespace, r.kind, r.key, r.digest, r.last_used),
                    ).fetchall()
                    out.append(bool(rows))
        except sqlite3.OperationalError as exc:
            raise BackendUnavailable(self.name, str(exc)) from exc
        return out

    def claim_blob(self, digest: str, ref: str) -> str | None:
        token = new_token()
        try:
            with self._transaction() as conn:
                if conn.execute("SELECT 1 FROM blob_deletes WHERE digest=? AND expires>?", (digest, time.time())).fetchone():
                    return None
                conn.execute("INSERT OR REPLACE INTO blob_refs (digest, ref, token) VALUES (?,?,?)", (digest, ref, token))
        except sqlite3.OperationalError as exc:
            raise BackendUnavailable(self.name, str(exc)) from exc
        return token

    def release_blob(self, digest: str, ref: str, token: str) -> bool:
        rows = self._query("DELETE FROM blob_refs WHERE digest=? AND ref=? AND token=? RETURNING ref", (digest, ref, token))
        return bool(rows)

    def blob_refs(self, digests: Sequence[str]) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        unique = list(dict.fromkeys(digests))
        for i in range(0, len(unique), _CHUNK):
            chunk = unique[i : i + _CHUNK]
            marks = ",".join("?" * len(chunk))
            for digest, ref, token in self._query(f"SELECT digest, ref, token FROM blob_refs WHERE digest IN ({marks})", chunk):
                out.setdefault(str(digest), {})[str(ref)] = str(token)
        return out

    def backfill_blob_refs(self, refs: Sequence[tuple[str, str]]) -> int:
        token = new_token()
        try:
            with self._transaction() as conn:
                cur = conn.executemany(
                    "INSERT OR IGNORE INTO blob_refs (digest, ref, token) VALUES (?,?,?)",
                    [(d, ref, token) for d, ref in refs],
                )
                return max(cur.rowcount, 0)
        except sqlite3.OperationalError as exc:
            raise BackendUnavailable(self.name, str(exc)) from exc

    def blob_refs_complete(self) -> bool:
        return bool(self._query("SELECT 1 FROM flags WHERE name=?", (_REFS_COMPLETE,)))

    def set_blob_refs_complete(self) -> None:
        self._query("INSERT OR REPLACE INTO flags (name, value) VALUES (?, ?)", (_REFS_COMPLETE, "1"))

    def begin_blob_delete(self, digest: str, token: str, ttl_s: float) -> bool:
        now = time.time()
        try:
            with self._transaction() as conn:
                if conn.execute("SELECT 1 FROM blob_refs WHERE digest=? LIMIT 1", (digest,)).fetchone():
                    return False
                if conn.execute("SELECT 1 FROM blob_deletes WHERE digest=? AND expires>?", (digest, now)).fetchone():
                    return False
                conn.execute("INSERT OR REPLACE INTO blob_deletes (digest, token, expires) VALUES (?,?,?)", (digest, token, now + ttl_s))
        except sqlite3.OperationalError as exc:
            raise BackendUnavailable(self.name, str(exc)) from exc
        return True

    def end_blob_delete(self, digest: str, token: str) -> None:
        self._query("DELETE FROM blob_deletes WHERE digest=? AND token=?", (digest, token))

    def release_blobs(self, releases: Sequence[tuple[str, str, str]]) -> builtins.list[bool]:
        try:
            with self._transaction() as conn:
                return [bool(conn.execute("DELETE FROM blob_refs WHERE digest=? AND ref=? AND token=? RETURNING ref", r).fetchall()) for r in releases]
        except sqlite3.OperationalError as exc:
            raise BackendUnavailable(self.name, str(exc)) from exc

    def begin_blob_deletes(self, digests: Sequence[str], token: str, ttl_s: float) -> builtins.list[bool]:
        now = time.time()
        out: builtins.list[bool] = []
        try:
            with self._transaction() as conn:
                for d in digests:
                    busy = conn.execute("SELECT 1 FROM blob_refs WHERE digest=? LIMIT 1", (d,)).fetchone() or conn.execute(
                        "SELECT 1 FROM blob_deletes WHERE digest=? AND expires>?", (d, now)).fetchone()
                    if not busy:
                        conn.execute("INSERT OR REPLACE INTO blob_deletes (digest, token, expires) VALUES (?,?,?)", (d, token, now + ttl_s))
                    out.append(not busy)
        except sqlite3.OperationalError as exc:
            raise BackendUnavailable(self.name, str(exc)) from exc
        return out

    def end_blob_deletes(self, digests: Sequence[str], token: str) -> None:
        try:
            with self._transaction() as conn:
                conn.executemany("DELETE FROM blob_deletes WHERE digest=? AND token=?", [(d, token) for d in digests])
        except sqlite3.OperationalError as exc:
            raise BackendUnavailable(self.name, str(exc)) from exc

    def acquire_lease(self, name: str, token: str, ttl_s: float) -> bool:
        now = time.time()
        rows = self._query(
            "INSERT INTO leases (name, token, expires) VALUES (?,?,?) "
            "ON CONFLICT(name) DO UPDATE SET token=excluded.token, expires=excluded.expires "
            "WHERE leases.token=excluded.token OR leases.expires<=? RETURNING token",
            (name, token, now + ttl_s, now),
        )
        return bool(rows)

    def release_lease(self, name: str, token: str) -> None:
        self._query("DELETE FROM leases WHERE name=? AND token=?", (name, token))

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def _values(r: IndexRecord) -> tuple[object, ...]:
    return (r.namespace, r.kind, r.key, r.digest, r.size, r.meta, r.created_at, r.last_access, r.hits)
