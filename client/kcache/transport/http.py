"""The HTTP client for the kcache service: deadlines, bounded retries, a circuit breaker.

Every method raises a :mod:`kcache.exceptions` exception; callers on the compile path go through
:mod:`kcache.runtime`, which turns those into counted misses/errors and never lets one escape.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import tarfile
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
from kcache_schemas import (
    EntryInfo,
    ErrorCode,
    InvalidKeyError,
    KernelEntry,
    QuarantineInfo,
    QuarantineRequest,
    normalize_kernel_key,
    wire,
)
from kcache_schemas.error_codes import STATUS
from kcache_schemas.models import BatchUrls, EntryList, EntryRef, EntryUrl, EntryUrls, WorkloadView
from kcache_schemas.pack import DEFAULT_LIMITS, MEDIA_TYPE
from kcache_schemas.unsound_reports import UnsoundReport

from kcache.config import ClientConfig
from kcache.exceptions import InvalidPack, NotFound, ServiceUnavailable, raise_for_status
from kcache.transport.breaker import CircuitBreaker
from kcache.version import __version__

log = logging.getLogger("kcache")
_MISSING_BATCH = 5_000
_BATCH_GET = 1_000
# A slow body must still flow at this rate to earn time beyond the deadline (see _send).
_MIN_RATE = 1 << 20
# Nothing the service sends is larger than a pack at the client's own unpack limit.
_MAX_BODY = DEFAULT_LIMITS.max_unpacked_bytes + (64 << 20)
# 5xx answers from a healthy service: a namespace at its storage limit (507) refuses uploads, and
# reads go on. Counting them as failures would open the breaker and stop the reads too.
_ANSWERS = frozenset({STATUS[ErrorCode.INSUFFICIENT_STORAGE]})
# Describe the wire encoding of the body, not the decoded bytes we hand on.
_BODY_HEADERS = {"content-encoding", "content-length", "transfer-encoding"}
# kcache's own headers (the producer's compile time) ride on a redirect to the object store,
# whose answer lacks them: they are carried over to the response a caller sees.
_OWN_HEADER_PREFIX = wire.OWN_HEADER_PREFIX.lower()


class _ByteStream(io.RawIOBase):
    """File-like view over an iterator of chunks, so tarfile can stream an HTTP body."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._buf = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n


class _Retryable(Exception):
    """A failed attempt worth one more (a dropped connection, a stream cut short, a 5xx): carries the error to
    raise if none is left."""

    def __init__(self, error: ServiceUnavailable) -> None:
        super().__init__(str(error))
        self.error = error


def _canonical(key: str) -> str:
    """A kernel key as the service answers it ('' for one it would refuse)."""
    try:
        return normalize_kernel_key(key)
    except InvalidKeyError:
        return ""


def _refused(exc: BaseException) -> bool:
    """Did the OS refuse the connection (nothing listens there)? httpx wraps the OSError twice."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class KcacheClient:
    def __init__(self, config: ClientConfig, transport: httpx.BaseTransport | None = None) -> None:
        if not config.url:
            raise ValueError("KcacheClient needs a service URL (KCACHE_URL)")
        self.config = config
        self.breaker = CircuitBreaker(config.breaker_failures, config.breaker_reset_s)
        headers = {"User-Agent": f"kcache/{__version__}"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self._http = httpx.Client(
            base_url=config.url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s),
            limits=httpx.Limits(max_connections=16, max_keepalive_connections=8),
            follow_redirects=True,  # presigned S3 downloads; httpx drops Authorization cross-origin
            transport=transport,
        )
        self._ns = config.namespace
        self._base = config.url.rstrip("/")  # errors name the service they could not reach
        self._last_refused = False
        # The last answer said the server has no tokens (``wire.AUTH_MODE``); None before any.
        self.server_open: bool | None = None
        # Presigned object-store downloads go through a client of their own: never with the
        # service's bearer token (an S3 URL carries its own signature, and must not see ours).
        self._blob_http: httpx.Client | None = None
        self._blob_lock = threading.Lock()
        # What the service's last workload view said (wire.DOWNLOADS): it hands out object-store
        # URLs for packs and entries, so a prefetch asks for URLs rather than bytes.
        self.presigned_downloads = False

    def close(self) -> None:
        self._http.close()
        if self._blob_http is not None:
            self._blob_http.close()

    def _blob_client(self) -> httpx.Client:
        with self._blob_lock:
            if self._blob_http is None:
                self._blob_http = httpx.Client(
                    headers={"User-Agent": f"kcache/{__version__}"},
                    timeout=httpx.Timeout(self.config.read_timeout_s, connect=self.config.connect_timeout_s),
                    limits=httpx.Limits(max_connections=16, max_keepalive_connections=8),
                )
            return self._blob_http

    def known_dead(self) -> bool:
        """The service refused our last connection, or the breaker is open: waiting cannot help."""
        return self._last_refused or self.breaker.state == "open"

    # ---- transport ------------------------------------------------------------------------

    def _request(self, method: str, path: str, *, idempotent: bool = True, http: httpx.Client | None = None,
                 read_timeout_s: float | None = None, **kwargs: Any) -> httpx.Response:
        """``path`` under the service, or an absolute URL with ``http`` (an object store's);
        ``read_timeout_s``: this request's read deadline, if not the configured one."""
        if not self.breaker.allow():
            raise ServiceUnavailable("circuit breaker open: the service failed recently; not calling it")
        attempts = 1 + (max(0, self.config.retries) if idempotent else 0)
        last: ServiceUnavailable | None = None
        # A presigned URL's query is a credential: errors name the object, not the signature.
        where = path.split("?", 1)[0] if http is not None else f"{self._base}{path}"
        for attempt in range(attempts):
            try:
                response = self._send(method, path, http or self._http, read_timeout_s, **kwargs)
            except httpx.HTTPError as exc:  # timeouts, refused, reset, undecodable body, redirect loop
                self._last_refused = _refused(exc)
                last = ServiceUnavailable(f"{method} {where}: {type(exc).__name__}: {exc}")
                if isinstance(exc, httpx.TimeoutException):
                    break  # a service that let a whole deadline pass won't answer a retry sooner
            else:
                self._last_refused = False
                if response.status_code < 500 or response.status_code in _ANSWERS:
                    self.breaker.success()
                    if http is None:  # the service's answer, not an object store's
                        self._note_auth(response)
                    raise_for_status(response)
                    return response
                last = ServiceUnavailable(f"{method} {where}: HTTP {response.status_code}")
            if attempt + 1 < attempts:
                time.sleep(0.05 * (2**attempt))
        self.breaker.failure()
        assert last is not None
        raise last

    def _note_auth(self, response: httpx.Response) -> None:
        """A token sent to a server without tokens is checked by nobody: say so, once."""
        was_open = self.server_open
        self.server_open = response.headers.get(wire.AUTH_MODE) == wire.AUTH_OPEN
        if self.server_open and not was_open and self.config.token:
            log.warning("kcache: the service at %s has no tokens (open, loopback only): the token given "
                        "(KCACHE_TOKEN or --token) is not checked; anyone on that host can read and write", self._base)

    def _send(self, method: str, path: str, http: httpx.Client, read_timeout_s: float | None = None, **kwargs: Any) -> httpx.Response:
        """One attempt, body read under a total deadline and a size cap.

        httpx's read timeout applies to each socket read, so a server that trickles a byte
        every ``read_timeout_s - ε`` would hold a compile for hours. The body must arrive by
        ``connect + read`` seconds after the request, stretched by ``bytes / _MIN_RATE`` for
        bodies that really flow (large packs on a slow link).
        """
        if read_timeout_s is None:
            read_timeout_s = self.config.read_timeout_s
        else:
            kwargs["timeout"] = httpx.Timeout(read_timeout_s, connect=self.config.connect_timeout_s)
        deadline = time.monotonic() + self.config.connect_timeout_s + read_timeout_s
        with http.stream(method, path, **kwargs) as r:
            declared = r.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > _MAX_BODY:
                raise httpx.RemoteProtocolError(f"response body of {declared} bytes exceeds {_MAX_BODY}", request=r.request)
            chunks: list[bytes] = []
            received = 0
            for chunk in r.iter_bytes():
                received += len(chunk)
                if received > _MAX_BODY:
                    raise httpx.RemoteProtocolError(f"response body exceeds {_MAX_BODY} bytes", request=r.request)
                if time.monotonic() > deadline + received / _MIN_RATE:
                    raise httpx.ReadTimeout(f"response body too slow ({received} bytes by the deadline)", request=r.request)
                chunks.append(chunk)
        headers = [(k, v) for k, v in r.headers.multi_items() if k.lower() not in _BODY_HEADERS]
        for earlier in r.history:  # a redirect to the object store: our headers were on the redirect
            headers += [(k, v) for k, v in earlier.headers.multi_items() if k.lower().startswith(_OWN_HEADER_PREFIX) and k not in r.headers]
        return httpx.Response(r.status_code, headers=headers, content=b"".join(chunks), request=r.request)

    # ---- kernels --------------------------------------------------------------------------

    def get_pack(self, key: str) -> bytes:
        return self._request("GET", wire.path(wire.KERNEL, namespace=self._ns, key=key)).content

    def put_pack(self, key: str, pack: bytes) -> bool:
        """Upload; True if newly stored, False if identical content was already there."""
        r = self._request("PUT", wire.path(wire.KERNEL, namespace=self._ns, key=key), content=pack, headers={"Content-Type": MEDIA_TYPE})
        return r.status_code == 201

    def manifest(self, key: str) -> KernelEntry:
        return KernelEntry.model_validate_json(self._request("GET", wire.path(wire.KERNEL_MANIFEST, namespace=self._ns, key=key)).content)

    def exists(self, key: str) -> bool:
        try:
            self._request("HEAD", wire.path(wire.KERNEL, namespace=self._ns, key=key))
            return True
        except NotFound:
            return False

    def missing(self, keys: Iterable[str]) -> list[str]:
        keys = list(dict.fromkeys(keys))
        out: list[str] = []
        for i in range(0, len(keys), _MISSING_BATCH):
            r = self._request("POST", wire.path(wire.KERNELS_MISSING, namespace=self._ns), json={"keys": keys[i : i + _MISSING_BATCH]})
            body = r.json()
            out += body["missing"] + body.get("invalid", [])
        return out

    def batch_get(self, keys: Iterable[str]) -> Iterator[tuple[str, bytes]]:
        """Yield ``(key, pack)`` for each stored key, streaming many packs per request.

        A connection that drops before the answer or halfway through it (a replica restarting,
        a keep-alive connection the service closed as it was reused, an object-store read that
        failed mid-stream), a stream that ends inside a pack or is garbled on the way (seen on
        H200 nodes: a tar stream ended inside a pack, after 77 of them), or a 5xx, is retried
        as :meth:`_request` retries: once, for the packs that did not arrive; a timeout is not."""
        keys = list(dict.fromkeys(keys))
        attempts = 1 + max(0, self.config.retries)
        for i in range(0, len(keys), _BATCH_GET):
            todo = keys[i : i + _BATCH_GET]
            for attempt in range(attempts):
                got: set[str] = set()
                try:
                    for key, pack in self._batch_get_once(todo):
                        got.add(key)
                        yield key, pack
                    break
                except _Retryable as exc:
                    if attempt + 1 >= attempts:
                        self.breaker.failure()
                        raise exc.error from exc
                    todo = [k for k in todo if _canonical(k) not in got]
                    time.sleep(0.05 * (2**attempt))

    def _batch_get_once(self, keys: list[str]) -> Iterator[tuple[str, bytes]]:
        if not self.breaker.allow():
            raise ServiceUnavailable("circuit breaker open")
        # The service answers canonical keys; a name we did not ask for (another kernel,
        # "../x") is a broken or hostile server, and its key must never reach a path.
        wanted = {k for k in map(_canonical, keys) if k}
        arrived = 0
        try:
            with self._http.stream("POST", wire.path(wire.KERNELS_BATCH_GET, namespace=self._ns), json={"keys": keys}) as r:
                if r.status_code >= 500 and r.status_code not in _ANSWERS:
                    r.read()
                    raise _Retryable(ServiceUnavailable(f"batch-get: HTTP {r.status_code}"))
                if r.status_code >= 400:
                    r.read()
                    raise_for_status(r)
                with tarfile.open(fileobj=io.BufferedReader(_ByteStream(r.iter_raw()), 1 << 20), mode="r|") as tf:
                    for member in tf:
                        fh = tf.extractfile(member)
                        key = wire.batch_member_key(member.name)
                        if fh is None or key is None:
                            continue
                        if key not in wanted:
                            raise InvalidPack(f"batch-get answered {member.name[:80]!r}, which was not asked for")
                        pack = fh.read()
                        arrived += 1
                        yield key, pack
            self._last_refused = False
            self.breaker.success()
        except httpx.TransportError as exc:
            self._last_refused = _refused(exc)
            error = ServiceUnavailable(f"batch-get: {type(exc).__name__}: {exc}")
            if isinstance(exc, httpx.TimeoutException):
                self.breaker.failure()
                raise error from exc  # a service that let a whole deadline pass won't answer a retry sooner
            raise _Retryable(error) from exc
        except tarfile.TarError as exc:
            # Cut short with a clean end (the packs read so far are whole: a pack is handed on
            # only once all its bytes arrived) or garbled: worth the retry a dropped connection gets.
            raise _Retryable(ServiceUnavailable(f"batch-get: malformed stream after {arrived} of {len(wanted)} packs asked for: {exc}")) from exc

    def batch_urls(self, keys: Iterable[str]) -> BatchUrls:
        """Presigned object-store URLs of the stored packs among ``keys`` (``inline``: found
        keys to fetch through :meth:`batch_get`). Keys not asked for are dropped."""
        keys = list(dict.fromkeys(keys))
        urls: dict[str, str] = {}
        inline: list[str] = []
        missing: list[str] = []
        invalid: list[str] = []
        expires = 0
        for i in range(0, len(keys), _BATCH_GET):
            chunk = keys[i : i + _BATCH_GET]
            r = self._request("POST", wire.path(wire.KERNELS_BATCH_URLS, namespace=self._ns), json={"keys": chunk})
            part = BatchUrls.model_validate_json(r.content)
            wanted = set()
            for k in chunk:
                with contextlib.suppress(InvalidKeyError):
                    wanted.add(normalize_kernel_key(k))
            urls |= {k: u for k, u in part.urls.items() if k in wanted and u.startswith(("https://", "http://"))}
            inline += [k for k in part.inline if k in wanted]
            missing += part.missing
            invalid += part.invalid
            expires = part.expires_s
        return BatchUrls(urls=urls, inline=inline, missing=missing, invalid=invalid, expires_s=expires)

    def batch_entry_urls(self, refs: Iterable[tuple[str, str]]) -> EntryUrls:
        """Presigned object-store URLs of the stored entries among ``refs`` (``(layer, key)``;
        ``inline``: stored, to GET through the service; ``missing``: not stored, or quarantined).
        Entries not asked for are dropped. A service older than the route answers 404 or 405."""
        refs = list(dict.fromkeys(refs))
        urls: list[EntryUrl] = []
        inline: list[EntryRef] = []
        missing: list[EntryRef] = []
        expires = 0
        for i in range(0, len(refs), _BATCH_GET):
            chunk = refs[i : i + _BATCH_GET]
            body = {"entries": [{"layer": layer, "key": key} for layer, key in chunk]}
            part = EntryUrls.model_validate_json(
                self._request("POST", wire.path(wire.ENTRIES_BATCH_URLS, namespace=self._ns), json=body).content)
            wanted = set(chunk)
            urls += [u for u in part.urls if (u.layer, u.key) in wanted and u.url.startswith(("https://", "http://"))]
            inline += [e for e in part.inline if (e.layer, e.key) in wanted]
            missing += [e for e in part.missing if (e.layer, e.key) in wanted]
            expires = part.expires_s
        return EntryUrls(urls=urls, inline=inline, missing=missing, expires_s=expires)

    def get_url(self, url: str) -> bytes:
        """The body at a presigned object-store URL (under the same deadlines and breaker as
        the service: a node that cannot reach the store fails open as for a dead service)."""
        return self._request("GET", url, http=self._blob_client()).content

    def list_kernels(self, prefix: str = "", page_size: int = 500) -> Iterator[KernelEntry]:
        cursor = ""
        while True:
            r = self._request("GET", wire.path(wire.KERNELS, namespace=self._ns), params={"limit": page_size, "cursor": cursor, "prefix": prefix})
            body = r.json()
            for item in body["items"]:
                yield KernelEntry.model_validate(item)
            cursor = body.get("next_cursor") or ""
            if not cursor:
                return

    # ---- opaque entries -------------------------------------------------------------------

    def list_entries(self, layer: str, prefix: str = "", page_size: int = 500) -> Iterator[EntryInfo]:
        """A layer's entries in key order (``wire.ENTRY_LIST``), page by page."""
        cursor = ""
        while True:
            r = self._request("GET", wire.path(wire.ENTRY_LIST, namespace=self._ns, layer=layer),
                              params={"limit": page_size, "cursor": cursor, "prefix": prefix})
            page = EntryList.model_validate(r.json())
            yield from page.items
            cursor = page.next_cursor or ""
            if not cursor:
                return

    def get_entry(self, layer: str, key: str) -> tuple[bytes, float | None]:
        """Entry bytes and the producer's compile time (for "time saved"), or NotFound."""
        r = self._request("GET", wire.path(wire.ENTRY, namespace=self._ns, layer=layer, key=key))
        compile_time = r.headers.get(wire.COMPILE_TIME)
        return r.content, float(compile_time) if compile_time else None

    def put_entry(self, layer: str, key: str, data: bytes, compile_time_s: float | None = None) -> bool:
        headers = {"Content-Type": "application/octet-stream", wire.PRODUCER: f"kcache/{__version__}"}
        if compile_time_s is not None:
            headers[wire.COMPILE_TIME] = f"{compile_time_s:.3f}"
        r = self._request("PUT", wire.path(wire.ENTRY, namespace=self._ns, layer=layer, key=key), content=data, headers=headers)
        return r.status_code == 201

    def entry_info(self, layer: str, key: str) -> EntryInfo:
        return EntryInfo.model_validate_json(self._request("GET", wire.path(wire.ENTRY_INFO, namespace=self._ns, layer=layer, key=key)).content)

    def quarantine(self, layer: str, key: str, reason: str, sha256: str | None = None) -> QuarantineInfo:
        """Report that torch could not load the entry (``sha256``: of the stored bytes we got);
        the service then serves it to no node. Conflict if the service holds other content."""
        body = QuarantineRequest(reason=reason[:512], sha256=sha256).model_dump_json()
        headers = {"Content-Type": "application/json", wire.PRODUCER: f"kcache/{__version__}"}
        # Idempotent on the service (a second report returns the first): safe to retry.
        r = self._request("POST", wire.path(wire.ENTRY_QUARANTINE, namespace=self._ns, layer=layer, key=key), content=body, headers=headers)
        return QuarantineInfo.model_validate_json(r.content)

    def quarantine_info(self, layer: str, key: str) -> QuarantineInfo:
        """Why the entry is quarantined; NotFound if it is not."""
        return QuarantineInfo.model_validate_json(self._request("GET", wire.path(wire.ENTRY_QUARANTINE, namespace=self._ns, layer=layer, key=key)).content)

    # ---- key soundness (kcache.layers.key_canary) ---------------------------------------------------

    def report_unsound(self, report: UnsoundReport) -> UnsoundReport:
        """Report a key this node's canary found unsound; the service keeps the first report."""
        headers = {"Content-Type": "application/json", wire.PRODUCER: f"kcache/{__version__}"}
        path = wire.path(wire.UNSOUND, namespace=self._ns, layer=report.layer, key=report.key)
        return UnsoundReport.model_validate_json(self._request("PUT", path, content=report.model_dump_json(), headers=headers).content)

    def unsound_report(self, layer: str, key: str) -> UnsoundReport:
        """What a canary found for the key; NotFound if no canary reported it."""
        return UnsoundReport.model_validate_json(self._request("GET", wire.path(wire.UNSOUND, namespace=self._ns, layer=layer, key=key)).content)

    # ---- workloads ------------------------------------------------------------------------

    def workload_view(self, name: str, fingerprint: str, read_timeout_s: float | None = None) -> WorkloadView:
        """A workload's merged manifest for ``fingerprint`` (NotFound if none), under
        ``read_timeout_s`` if given (the prefetch's own deadline); also notes whether the service
        hands out presigned downloads (:attr:`presigned_downloads`)."""
        r = self._request("GET", wire.path(wire.WORKLOAD, namespace=self._ns, name=name), params={"fingerprint": fingerprint},
                          read_timeout_s=read_timeout_s)
        self.presigned_downloads = r.headers.get(wire.DOWNLOADS) == wire.DOWNLOADS_PRESIGNED
        return WorkloadView.model_validate_json(r.content)

    # ---- generic JSON (workloads, runs) ---------------------------------------------------

    def get_json(self, path: str, **params: Any) -> Any:
        return self._request("GET", path, params=params or None).json()

    def put_json(self, path: str, body: str) -> Any:
        r = self._request("PUT", path, content=body, headers={"Content-Type": "application/json"})
        return r.json() if r.content else None

    def post_json(self, path: str, body: Any) -> Any:
        r = self._request("POST", path, content=json.dumps(body), headers={"Content-Type": "application/json"})
        return r.json() if r.content else None

    def delete(self, path: str) -> None:
        """Remove a resource (admin routes: pins); NotFound if there is none."""
        self._request("DELETE", path)
