"""Index on Redis or Redis Cluster (redis-py).

URLs::

    redis://[user:password@]host:6379/0[?prefix=kc]        one server (or a managed primary endpoint)
    rediss://[user:password@]host:6380/0[?prefix=kc]       the same over TLS
    redis+cluster://[user:password@]host:7000[,host2:7001][?prefix=kc&ssl=true]   Redis Cluster

Other query options of the ``redis://`` form (``ssl_cert_reqs``, ``health_check_interval``, ...)
are passed to redis-py. ``prefix`` (default ``kc``) namespaces every key, so several deployments
(or test runs) can share one Redis.

Key design (``P`` = prefix, ``T`` = ``url-quoted(namespace)|url-quoted(kind)``)::

    P:{T}:r:<key>    hash    digest, size, meta, created_at, last_access, hits   (one record)
    P:{T}:keys       zset    every key of (namespace, kind), score 0: ordered listing (ZRANGEBYLEX)
    P:{T}:stats      hash    entries, bytes: usage counters of (namespace, kind)
    P:kinds          set     JSON [namespace, kind] of every pair ever written (for usage())
    P:{b:D}:refs     hash    ref -> claim token: the records using blob D (retention)
    P:{b:D}:del      string  deletion marker of blob D (token, expires by itself)
    P:lease:NAME     string  lease token (expires by itself): one GC at a time
    P:flags          hash    blob_refs_complete

The ``{T}`` hash tag puts all keys of one (namespace, kind) in one cluster slot, so the Lua
scripts that change a record, its listing entry and the counters together run atomically on one
node, in cluster mode too. ``put_if_absent`` is such a script: the first writer's record wins on
every replica of the service at once, with no WATCH/MULTI retry loops.

A blob's references and its deletion marker share the slot ``{b:D}`` of the digest, not the
records' slots (records of many namespaces may name one blob), so they cannot change in the
same script as a record: the store orders the calls instead (claim before the record is
inserted, release after it is deleted; see :mod:`kcache_server.storage.base`), and the scripts
on the digest's slot make "no reference, so mark it deleted" and "not being deleted, so claim
it" atomic against each other.

Outages: socket connect/read timeouts are ``timeout_s``; a dropped connection (server restart,
reset) is retried once on a fresh connection, a timeout is not retried, so a dead Redis answers
:class:`BackendUnavailable` in about ``timeout_s``. Connections are re-established by redis-py
on the next call, so the service recovers by itself once Redis is back.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException, RedisError
from redis.retry import Retry

from kcache_server.storage.base import (
    BackendUnavailable,
    Index,
    IndexRecord,
    KindUsage,
    new_token,
)

T = TypeVar("T")

DEFAULT_PREFIX = "kc"
_BATCH = 500  # keys per pipeline / script call
_CLUSTER_FANOUT = 8  # concurrent script calls where a cluster cannot pipeline them

# KEYS: record, keys zset, stats.  ARGV: key, digest, size, meta, created_at, last_access, hits
_PUT_IF_ABSENT = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'digest', ARGV[2], 'size', ARGV[3], 'meta', ARGV[4],
             'created_at', ARGV[5], 'last_access', ARGV[6], 'hits', ARGV[7])
  redis.call('ZADD', KEYS[2], 0, ARGV[1])
  redis.call('HINCRBY', KEYS[3], 'entries', 1)
  redis.call('HINCRBY', KEYS[3], 'bytes', ARGV[3])
end
return redis.call('HGETALL', KEYS[1])
"""

_UPSERT = """
local old = redis.call('HGET', KEYS[1], 'size')
if old then
  redis.call('HINCRBY', KEYS[3], 'bytes', tonumber(ARGV[3]) - tonumber(old))
else
  redis.call('ZADD', KEYS[2], 0, ARGV[1])
  redis.call('HINCRBY', KEYS[3], 'entries', 1)
  redis.call('HINCRBY', KEYS[3], 'bytes', ARGV[3])
end
redis.call('HSET', KEYS[1], 'digest', ARGV[2], 'size', ARGV[3], 'meta', ARGV[4],
           'created_at', ARGV[5], 'last_access', ARGV[6], 'hits', ARGV[7])
return 1
"""

# ARGV: key, expected digest ('' = any)
_DELETE = """
local rec = redis.call('HMGET', KEYS[1], 'digest', 'size')
if not rec[1] then return 0 end
if ARGV[2] ~= '' and rec[1] ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HINCRBY', KEYS[3], 'entries', -1)
redis.call('HINCRBY', KEYS[3], 'bytes', 0 - tonumber(rec[2] or '0'))
return 1
"""

# KEYS: records (one slot).  ARGV: when, then one hit count per key.
# Only existing records are touched: HINCRBY on a deleted record would resurrect half of it.
_TOUCH = """
local when = tonumber(ARGV[1])
for i, k in ipairs(KEYS) do
  if redis.call('EXISTS', k) == 1 then
    redis.call('HINCRBY', k, 'hits', ARGV[i + 1])
    local last = tonumber(redis.call('HGET', k, 'last_access') or '0') or 0
    if when > last then redis.call('HSET', k, 'last_access', ARGV[1]) end
  end
end
return 1
"""


# KEYS: keys zset, stats, then one record per key (one slot).  ARGV: per record key, digest,
# last_used. Deletes a record only if it still names the digest and was not used since.
_DELETE_UNUSED = """
local out = {}
for i = 3, #KEYS do
  local j = (i - 3) * 3
  local rec = redis.call('HMGET', KEYS[i], 'digest', 'size', 'created_at', 'last_access')
  local ok = 0
  if rec[1] and rec[1] == ARGV[j + 2] then
    local used = math.max(tonumber(rec[3]) or 0, tonumber(rec[4] or '0') or 0)
    if used <= tonumber(ARGV[j + 3]) then
      redis.call('DEL', KEYS[i])
      redis.call('ZREM', KEYS[1], ARGV[j + 1])
      redis.call('HINCRBY', KEYS[2], 'entries', -1)
      redis.call('HINCRBY', KEYS[2], 'bytes', 0 - tonumber(rec[2] or '0'))
      ok = 1
    end
  end
  out[#out + 1] = ok
end
return out
"""

# KEYS: records (one slot). Per record "digest size created_at last_access hits", "" if absent.
_LEAN = """
local out = {}
for i, k in ipairs(KEYS) do
  local v = redis.call('HMGET', k, 'digest', 'size', 'created_at', 'last_access', 'hits')
  if v[1] then
    out[i] = v[1] .. ' ' .. v[2] .. ' ' .. v[3] .. ' ' .. (v[4] or '0') .. ' ' .. (v[5] or '0')
  else
    out[i] = ''
  end
end
return out
"""

# KEYS: refs, del (the digest's slot).  ARGV: ref, token
_CLAIM = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

# KEYS: refs.  ARGV: ref, token
_RELEASE = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 1
end
return 0
"""

# KEYS: refs, del.  ARGV: token, ttl_ms
_BEGIN_DELETE = """
if redis.call('HLEN', KEYS[1]) > 0 then return 0 end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""

# KEYS: one string.  ARGV: token.  (end of a blob deletion, release of a lease)
_DELETE_IF_MINE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: lease.  ARGV: token, ttl_ms
_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


def _scripts_for(client: Any) -> dict[str, Any]:
    # Script objects run EVALSHA and reload the script after NOSCRIPT (e.g. a Redis restart).
    sources = {
        "put": _PUT_IF_ABSENT, "upsert": _UPSERT, "delete": _DELETE, "touch": _TOUCH,
        "delete_unused": _DELETE_UNUSED, "claim": _CLAIM, "release": _RELEASE,
        "begin_delete": _BEGIN_DELETE, "delete_if_mine": _DELETE_IF_MINE, "acquire": _ACQUIRE, "lean": _LEAN,
    }
    return {name: client.register_script(src) for name, src in sources.items()}


def _f(x: float) -> str:
    return repr(float(x))  # exact round trip through Redis strings


class RedisIndex(Index):
    name = "redis"

    def __init__(self, url: str, timeout_s: float = 5.0, *, prefix: str | None = None) -> None:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        own = {k: v for k, v in query if k in ("prefix", "ssl")}
        passthrough = [(k, v) for k, v in query if k not in own]
        self.prefix = prefix if prefix is not None else own.get("prefix", DEFAULT_PREFIX)
        if not self.prefix or any(c in self.prefix for c in "{}"):
            raise ValueError(f"Redis key prefix must be non-empty and free of braces: {self.prefix!r}")
        self.timeout_s = float(timeout_s)
        self.cluster = parts.scheme == "redis+cluster"
        if self.cluster:
            self.name = "redis-cluster"
        # For messages: the URL without credentials.
        self._safe_url = f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}{parts.path}"
        # Only ConnectionError (dropped/refused connection) is retried, on a new connection;
        # a timeout already took timeout_s and is not repeated.
        retry = Retry(ExponentialBackoff(cap=0.2, base=0.02), 2, (redis.ConnectionError,))
        common: dict[str, Any] = {
            "socket_timeout": self.timeout_s,
            "socket_connect_timeout": self.timeout_s,
            "decode_responses": True,
            "health_check_interval": 30,
        }
        self._lock = threading.Lock()
        self._client: Any = None
        self._scripts: dict[str, Any] = {}
        if self.cluster:
            nodes = []
            for hostport in parts.netloc.rsplit("@", 1)[-1].split(","):
                host, _, port = hostport.rpartition(":")
                node = ClusterNode(host.strip("[]") or "127.0.0.1", int(port or 6379))  # type: ignore[no-untyped-call]
                nodes.append(node)
            auth = parts.netloc.rsplit("@", 1)[0] if "@" in parts.netloc else ""
            user, _, password = auth.partition(":")
            extra = dict(passthrough)
            if extra:
                raise ValueError(f"unknown option(s) {sorted(extra)} in {url!r}; cluster URLs take prefix and ssl")
            self._cluster_args: dict[str, Any] = dict(
                common,
                startup_nodes=nodes,
                username=unquote(user) or None,
                password=unquote(password) or None,
                ssl=own.get("ssl", "").lower() in ("1", "true", "yes"),
                retry=retry,
                require_full_coverage=True,
            )
        else:
            clean = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(passthrough), ""))
            # Standalone clients connect lazily: creating one never touches the network.
            client = redis.Redis.from_url(clean, retry=retry, **common)
            self._scripts = _scripts_for(client)
            self._client = client

    # ---- plumbing -------------------------------------------------------------------------

    def _redis(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    # RedisCluster discovers the slot map when built; do that on first use so the
                    # service starts (and reports "not ready") while the cluster is down.
                    client = RedisCluster(**self._cluster_args)
                    self._scripts = _scripts_for(client)
                    self._client = client  # published last: other threads see scripts too
        return self._client

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except (RedisError, RedisClusterException) as exc:
            # Connection refused/reset, timeouts, cluster down or moving, a READONLY replica
            # after failover, OOM, ...: in every case the index cannot serve us right now.
            raise BackendUnavailable(self.name, f"{type(exc).__name__}: {exc} ({self._safe_url})") from exc

    def _run(self, fn: Callable[[Any], T]) -> T:
        with self._errors():
            return fn(self._redis())

    def _script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        with self._errors():
            self._redis()
            return self._scripts[name](keys=keys, args=args)

    def _script_many(self, name: str, calls: Sequence[tuple[list[str], list[Any]]]) -> builtins.list[Any]:
        """One script over many keys of different slots: pipelined on one server; Redis Cluster
        refuses scripts in pipelines, so there a few threads overlap the round trips."""
        if not calls:
            return []
        if not self.cluster:
            out: builtins.list[Any] = []
            for i in range(0, len(calls), _BATCH):

                def run(r: Any, chunk: Sequence[tuple[list[str], list[Any]]] = calls[i : i + _BATCH]) -> builtins.list[Any]:
                    pipe = r.pipeline(transaction=False)
                    for keys, args in chunk:
                        self._scripts[name](keys=keys, args=args, client=pipe)
                    return builtins.list(pipe.execute())

                with self._errors():
                    self._redis()
                    out += run(self._client)
            return out
        with ThreadPoolExecutor(max_workers=_CLUSTER_FANOUT, thread_name_prefix="kcache-redis") as pool:
            return builtins.list(pool.map(lambda c: self._script(name, c[0], c[1]), calls))

    def _tag(self, namespace: str, kind: str) -> str:
        return f"{self.prefix}:{{{quote(namespace, safe='')}|{quote(kind, safe='/')}}}"

    def _rec_key(self, namespace: str, kind: str, key: str) -> str:
        return f"{self._tag(namespace, kind)}:r:{key}"

    def _keys(self, record: IndexRecord) -> list[str]:
        tag = self._tag(record.namespace, record.kind)
        return [f"{tag}:r:{record.key}", f"{tag}:keys", f"{tag}:stats"]

    def _remember_kind(self, namespace: str, kind: str) -> None:
        # Another slot than the record's, so not in the same script; idempotent, done first.
        self._run(lambda r: r.sadd(f"{self.prefix}:kinds", json.dumps([namespace, kind])))

    @staticmethod
    def _args(r: IndexRecord) -> list[Any]:
        return [r.key, r.digest, int(r.size), r.meta, _f(r.created_at), _f(r.last_access), int(r.hits)]

    @staticmethod
    def _record(namespace: str, kind: str, key: str, h: dict[str, str]) -> IndexRecord | None:
        if not h or "digest" not in h:
            return None
        return IndexRecord(
            namespace=namespace,
            kind=kind,
            key=key,
            digest=h["digest"],
            size=int(h["size"]),
            meta=h["meta"],
            created_at=float(h["created_at"]),
            last_access=float(h.get("last_access") or 0),
            hits=int(h.get("hits") or 0),
        )

    def _hgetall_many(self, namespace: str, kind: str, keys: list[str], meta: bool = True) -> dict[str, IndexRecord]:
        found: dict[str, IndexRecord] = {}
        for i in range(0, len(keys), _BATCH):
            chunk = keys[i : i + _BATCH]

            if not meta:
                # The GC's scan: the small fields only, not the 1-2 KB of JSON, one string per
                # record from one script call per chunk (a third of the time of a pipeline of
                # HMGETs, which spends it building and parsing commands in Python).
                lean = self._script("lean", [self._rec_key(namespace, kind, k) for k in chunk], [])
                for k, line in zip(chunk, lean, strict=True):
                    if line:
                        digest, size, created, last, hits = line.split(" ")
                        found[k] = IndexRecord(namespace, kind, k, digest, int(size), "", float(created), float(last), int(hits))
                continue

            def fetch(r: Any, chunk: list[str] = chunk) -> list[Any]:
                pipe = r.pipeline(transaction=False)
                for k in chunk:
                    pipe.hgetall(self._rec_key(namespace, kind, k))
                return list(pipe.execute())

            for k, h in zip(chunk, self._run(fetch), strict=True):
                rec = self._record(namespace, kind, k, h)
                if rec is not None:
                    found[k] = rec
        return found

    # ---- the contract ---------------------------------------------------------------------

    def get(self, namespace: str, kind: str, key: str) -> IndexRecord | None:
        h = self._run(lambda r: r.hgetall(self._rec_key(namespace, kind, key)))
        return self._record(namespace, kind, key, h)

    def get_many(self, namespace: str, kind: str, keys: list[str]) -> dict[str, IndexRecord]:
        return self._hgetall_many(namespace, kind, list(dict.fromkeys(keys)))

    def missing(self, namespace: str, kind: str, keys: list[str]) -> list[str]:
        unique = list(dict.fromkeys(keys))
        present: set[str] = set()
        for i in range(0, len(unique), _BATCH):
            chunk = unique[i : i + _BATCH]

            def exists(r: Any, chunk: list[str] = chunk) -> list[Any]:
                pipe = r.pipeline(transaction=False)
                for k in chunk:
                    pipe.exists(self._rec_key(namespace, kind, k))
                return list(pipe.execute())

            present.update(k for k, n in zip(chunk, self._run(exists), strict=True) if n)
        return [k for k in keys if k not in present]

    def put_if_absent(self, record: IndexRecord) -> IndexRecord:
        self._remember_kind(record.namespace, record.kind)
        flat = self._script("put", self._keys(record), self._args(record))
        h = dict(zip(flat[::2], flat[1::2], strict=True))
        stored = self._record(record.namespace, record.kind, record.key, h)
        assert stored is not None  # the script returns the record it found or wrote
        return stored

    def upsert(self, record: IndexRecord) -> None:
        self._remember_kind(record.namespace, record.kind)
        self._script("upsert", self._keys(record), self._args(record))

    def delete(self, namespace: str, kind: str, key: str, digest: str | None = None) -> bool:
        keys = self._keys(IndexRecord(namespace, kind, key, "", 0, "", 0.0))
        return bool(self._script("delete", keys, [key, digest or ""]))

    def list(
        self, namespace: str, kind: str, *, after: str = "", prefix: str = "", limit: int = 100, meta: bool = True
    ) -> list[IndexRecord]:
        zkey = f"{self._tag(namespace, kind)}:keys"
        # Lexicographic ranges compare raw bytes, like SQLite's BINARY collation and Python's
        # str order; b"\xff" never occurs in UTF-8, so [prefix, prefix+\xff) is "starts with".
        lo = b"(" + after.encode() if after else b"-"
        if prefix and (not after or prefix > after):
            lo = b"[" + prefix.encode()
        hi = b"(" + prefix.encode() + b"\xff" if prefix else b"+"
        out: list[IndexRecord] = []
        while len(out) < limit:
            want = limit - len(out)
            keys: list[str] = self._run(
                lambda r, lo=lo, want=want: list(r.zrangebylex(zkey, lo, hi, start=0, num=want))  # type: ignore[misc]
            )
            if not keys:
                break
            found = self._hgetall_many(namespace, kind, keys, meta)
            # A key whose record vanished between the two reads was deleted concurrently: skip it.
            out += [found[k] for k in keys if k in found]
            if len(keys) < want:
                break
            lo = b"(" + keys[-1].encode()
        return out

    def touch(self, namespace: str, kind: str, keys: Iterable[str], when: float) -> None:
        counts = Counter(keys)
        items = list(counts.items())
        for i in range(0, len(items), _BATCH):
            chunk = items[i : i + _BATCH]
            self._script(
                "touch",
                [self._rec_key(namespace, kind, k) for k, _n in chunk],
                [_f(when), *(n for _k, n in chunk)],
            )

    def usage(self) -> dict[str, dict[str, KindUsage]]:
        members: set[str] = self._run(lambda r: r.smembers(f"{self.prefix}:kinds"))
        pairs = sorted(tuple(json.loads(m)) for m in members)

        def stats(r: Any) -> list[Any]:
            pipe = r.pipeline(transaction=False)
            for ns, kind in pairs:
                pipe.hmget(f"{self._tag(ns, kind)}:stats", ["entries", "bytes"])
            return list(pipe.execute())

        out: dict[str, dict[str, KindUsage]] = {}
        for (ns, kind), (entries, total) in zip(pairs, self._run(stats) if pairs else [], strict=True):
            if entries and int(entries) > 0:
                out.setdefault(ns, {})[kind] = KindUsage(int(entries), int(total or 0))
        return out

    def ping(self) -> None:
        self._run(lambda r: r.ping())

    # ---- retention -------------------------------------------------------------------------

    def _blob_keys(self, digest: str) -> builtins.list[str]:
        tag = f"{self.prefix}:{{b:{digest}}}"
        return [f"{tag}:refs", f"{tag}:del"]

    def delete_unused(self, records: Sequence[IndexRecord]) -> builtins.list[bool]:
        deleted: dict[int, bool] = {}
        groups: dict[tuple[str, str], builtins.list[int]] = {}
        for i, r in enumerate(records):
            groups.setdefault((r.namespace, r.kind), []).append(i)
        for (ns, kind), positions in groups.items():
            tag = self._tag(ns, kind)
            for j in range(0, len(positions), _BATCH):
                chunk = positions[j : j + _BATCH]
                keys = [f"{tag}:keys", f"{tag}:stats", *(f"{tag}:r:{records[i].key}" for i in chunk)]
                args: builtins.list[Any] = []
                for i in chunk:
                    args += [records[i].key, records[i].digest, _f(records[i].last_used)]
                for i, ok in zip(chunk, self._script("delete_unused", keys, args), strict=True):
                    deleted[i] = bool(ok)
        return [deleted[i] for i in range(len(records))]

    def claim_blob(self, digest: str, ref: str) -> str | None:
        token = new_token()
        return token if self._script("claim", self._blob_keys(digest), [ref, token]) else None

    def release_blob(self, digest: str, ref: str, token: str) -> bool:
        return bool(self._script("release", self._blob_keys(digest)[:1], [ref, token]))

    def blob_refs(self, digests: Sequence[str]) -> dict[str, dict[str, str]]:
        unique = list(dict.fromkeys(digests))
        out: dict[str, dict[str, str]] = {}
        for i in range(0, len(unique), _BATCH):
            chunk = unique[i : i + _BATCH]

            def fetch(r: Any, chunk: builtins.list[str] = chunk) -> builtins.list[Any]:
                pipe = r.pipeline(transaction=False)
                for d in chunk:
                    pipe.hgetall(self._blob_keys(d)[0])
                return list(pipe.execute())

            for d, refs in zip(chunk, self._run(fetch), strict=True):
                if refs:
                    out[d] = dict(refs)
        return out

    def backfill_blob_refs(self, refs: Sequence[tuple[str, str]]) -> int:
        token = new_token()
        added = 0
        for i in range(0, len(refs), _BATCH):
            chunk = refs[i : i + _BATCH]

            def add(r: Any, chunk: Sequence[tuple[str, str]] = chunk) -> builtins.list[Any]:
                pipe = r.pipeline(transaction=False)
                for digest, ref in chunk:
                    pipe.hsetnx(self._blob_keys(digest)[0], ref, token)
                return list(pipe.execute())

            added += sum(1 for n in self._run(add) if n)
        return added

    def blob_refs_complete(self) -> bool:
        return bool(self._run(lambda r: r.hget(f"{self.prefix}:flags", "blob_refs_complete")))

    def set_blob_refs_complete(self) -> None:
        self._run(lambda r: r.hset(f"{self.prefix}:flags", "blob_refs_complete", "1"))

    def begin_blob_delete(self, digest: str, token: str, ttl_s: float) -> bool:
        ttl_ms = max(1, int(ttl_s * 1000))
        return bool(self._script("begin_delete", self._blob_keys(digest), [token, ttl_ms]))

    def end_blob_delete(self, digest: str, token: str) -> None:
        self._script("delete_if_mine", self._blob_keys(digest)[1:], [token])

    def release_blobs(self, releases: Sequence[tuple[str, str, str]]) -> builtins.list[bool]:
        calls = [(self._blob_keys(d)[:1], [ref, token]) for d, ref, token in releases]
        return [bool(x) for x in self._script_many("release", calls)]

    def begin_blob_deletes(self, digests: Sequence[str], token: str, ttl_s: float) -> builtins.list[bool]:
        ttl_ms = max(1, int(ttl_s * 1000))
        return [bool(x) for x in self._script_many("begin_delete", [(self._blob_keys(d), [token, ttl_ms]) for d in digests])]

    def end_blob_deletes(self, digests: Sequence[str], token: str) -> None:
        self._script_many("delete_if_mine", [(self._blob_keys(d)[1:], [token]) for d in digests])

    def acquire_lease(self, name: str, token: str, ttl_s: float) -> bool:
        ttl_ms = max(1, int(ttl_s * 1000))
        return bool(self._script("acquire", [f"{self.prefix}:lease:{name}"], [token, ttl_ms]))

    def release_lease(self, name: str, token: str) -> None:
        self._script("delete_if_mine", [f"{self.prefix}:lease:{name}"], [token])

    def close(self) -> None:
        client = self._client
        if self.cluster:
            self._client = None  # rebuilt (slot map and all) if used again
        if client is not None:
            with contextlib.suppress(RedisError):  # closing a broken pool
                client.close()
