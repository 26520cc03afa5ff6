"""Blob store on S3 or any S3-compatible service (SeaweedFS, MinIO, Cloudflare R2, Ceph RGW).

URL: ``s3://bucket[/prefix][?region=..&addressing_style=path|virtual|auto&public_endpoint=URL]``.

Layout, content-addressed: ``<prefix>/<digest[:2]>/<digest>``. The object name is the sha256 of
its bytes and nothing else, so a pack uploaded into several namespaces is stored once
(deduplicated); namespaces live only in the index. Deleting an index record therefore never
deletes the blob by itself: the GC deletes a blob once no record references it (the index
keeps the references), and its orphan sweep lists the bucket to find blobs nothing references.

Endpoint: the ``endpoint_url`` argument (``KCACHE_S3_ENDPOINT_URL``), else
``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, else AWS itself. Credentials and region come
from boto3's usual chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``,
``~/.aws/config``, instance/IRSA roles); ``?region=`` in the URL wins over it.

Outages: connect and read timeouts are ``timeout_s``; botocore's own retries are off and this
module retries only failures that came back fast (connection refused or reset, throttling, 5xx)
and only while the first attempt's ``timeout_s`` deadline has not passed, so a dead or hung S3
answers :class:`BackendUnavailable` in about ``timeout_s``, never later than twice that.
Every SDK error is translated here (the s3fs ``translate_boto_error`` habit): 404/NoSuchKey is
:class:`BlobNotFound`, access problems are :class:`S3AccessDenied`, everything else that stops us
talking to the bucket is :class:`BackendUnavailable`.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from kcache_server.storage.base import (
    READ_CHUNK,
    BackendUnavailable,
    BlobInfo,
    BlobNotFound,
    BlobStore,
    BlobStream,
)

T = TypeVar("T")

MULTIPART_THRESHOLD = 16 << 20  # objects at least this big are uploaded in parts
MULTIPART_CHUNKSIZE = 16 << 20
# Below this size a PUT is cheaper than asking first; above it, a HEAD avoids re-uploading a
# pack that another namespace already stored (content-addressed dedup).
_HEAD_BEFORE_PUT = 1 << 20
_ACCESS_CODES = {
    "AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch",
    "ExpiredToken", "InvalidToken", "TokenRefreshRequired", "AccountProblem", "403",
}
_NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound"}
_RETRYABLE_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
    "ServiceUnavailable", "InternalError", "503", "500", "502", "504",
}
_MAX_ATTEMPTS = 3


class S3AccessDenied(BackendUnavailable):
    """The bucket answered but refused our credentials (a configuration problem, still a 503)."""


def _is_digest(digest: str) -> bool:
    return len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)


class S3BlobStore(BlobStore):
    name = "s3"
    presigns = True

    def __init__(
        self,
        url: str,
        timeout_s: float = 5.0,
        endpoint_url: str | None = None,
        *,
        multipart_threshold: int = MULTIPART_THRESHOLD,
        max_pool_connections: int = 32,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"expected s3://bucket[/prefix], got {url!r}")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"region", "addressing_style", "public_endpoint"}
        if unknown:
            raise ValueError(f"unknown option(s) {sorted(unknown)} in {url!r}")
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self.timeout_s = float(timeout_s)
        self.endpoint_url = (
            endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
            or None
        )
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

        session = boto3.session.Session()
        region = query.get("region") or session.region_name or "us-east-1"
        # Path-style is what self-hosted S3 (SeaweedFS, MinIO) serves without wildcard DNS.
        addressing = query.get("addressing_style") or ("path" if self.endpoint_url else "auto")
        if addressing not in ("path", "virtual", "auto"):
            raise ValueError(f"addressing_style must be path, virtual or auto, not {addressing!r}")
        config = Config(
            region_name=region,
            signature_version="s3v4",
            connect_timeout=self.timeout_s,
            read_timeout=self.timeout_s,
            # botocore's retries would multiply the timeout; _call retries within one deadline.
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=max_pool_connections,
            s3={"addressing_style": addressing},
        )
        self._client: Any = session.client("s3", endpoint_url=self.endpoint_url, config=config)
        public = query.get("public_endpoint")
        # Presigned URLs must name a host the *client* can reach, which may differ from the
        # service's (in-cluster) endpoint; signing happens offline, no request goes there.
        self._presign_client: Any = (
            session.client("s3", endpoint_url=public, config=config) if public else self._client
        )
        self._transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=max(MULTIPART_CHUNKSIZE, 5 << 20),
            max_concurrency=4,
            use_threads=True,
        )
        self._multipart_threshold = multipart_threshold

    # ---- helpers --------------------------------------------------------------------------

    def key(self, digest: str) -> str:
        """The object key of a digest: ``<prefix>/<d[:2]>/<digest>``."""
        if not _is_digest(digest):
            raise ValueError(f"not a sha256 digest: {digest[:80]!r}")
        return f"{self.prefix}/{digest[:2]}/{digest}" if self.prefix else f"{digest[:2]}/{digest}"

    def _translate(self, exc: Exception, what: str) -> Exception:
        """SDK error → contract error (or the original, for bugs that are not I/O)."""
        where = f"{what} on {self.url}"
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code") or "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            msg = err.get("Message") or code
            if code in _ACCESS_CODES or status == 403:
                return S3AccessDenied(
                    self.name,
                    f"access denied ({code or status}: {msg}) for {where}; check the AWS "
                    "credentials and the bucket policy",
                )
            if code == "NoSuchBucket" or (what == "head_bucket" and status == 404):
                return BackendUnavailable(self.name, f"bucket {self.bucket!r} does not exist ({where})")
            if code in _NOT_FOUND_CODES or status == 404:
                return BlobNotFound(what)
            return BackendUnavailable(self.name, f"{code or status}: {msg} ({where})")
        if isinstance(exc, NoCredentialsError):
            return S3AccessDenied(
                self.name,
                f"no AWS credentials found for {where}; set AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or an instance role",
            )
        if isinstance(exc, (BotoCoreError, OSError)):
            # EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError,
            # ConnectionClosedError, ResponseStreamingError, IncompleteReadError, SSL errors, ...
            return BackendUnavailable(self.name, f"{type(exc).__name__}: {exc} ({where})")
        return exc

    @staticmethod
    def _retryable(exc: Exception) -> bool:
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            return str(err.get("Code") or "") in _RETRYABLE_CODES or int(status) >= 500
        if isinstance(exc, NoCredentialsError):
            return False
        return isinstance(exc, (BotoCoreError, OSError))

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one S3 operation; retry fast failures while the deadline allows."""
        deadline = time.monotonic() + self.timeout_s
        for attempt in range(_MAX_ATTEMPTS):
            try:
                return fn()
            except Exception as exc:
                backoff = 0.05 * (2**attempt) * (0.5 + random.random())
                if (
                    attempt + 1 < _MAX_ATTEMPTS
                    and self._retryable(exc)
                    and time.monotonic() + backoff < deadline
                ):
                    time.sleep(backoff)
                    continue
                raise self._translate(exc, what) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    # ---- the contract ---------------------------------------------------------------------

    def put(self, digest: str, data: bytes) -> None:
        key = self.key(digest)
        if len(data) >= _HEAD_BEFORE_PUT and self.size(digest) == len(data):
            return  # content-addressed: already stored (maybe by another namespace)
        if len(data) >= self._multipart_threshold:
            # S3 makes a completed multipart upload visible atomically, like a single PUT.
            self._call(
                "put",
                lambda: self._client.upload_fileobj(
                    io.BytesIO(data), self.bucket, key, Config=self._transfer
                ),
            )
        else:
            self._call("put", lambda: self._client.put_object(Bucket=self.bucket, Key=key, Body=data))

    def get(self, digest: str) -> bytes:
        key = self.key(digest)

        def fetch() -> bytes:
            body = self._client.get_object(Bucket=self.bucket, Key=key)["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()

        try:
            return self._call("get", fetch)
        except BlobNotFound:
            raise BlobNotFound(digest) from None

    def open(self, digest: str, chunk_size: int = READ_CHUNK) -> BlobStream:
        key = self.key(digest)
        try:
            answer = self._call("get", lambda: self._client.get_object(Bucket=self.bucket, Key=key))
        except BlobNotFound:
            raise BlobNotFound(digest) from None
        body = answer["Body"]
        # The object is read from S3 as the client reads it from us: a slow client keeps one
        # pooled connection busy for its download (botocore's read timeout applies to each of
        # our reads, not to the time between them). A failure halfway is not retried: the
        # client's download fails and it retries the whole GET.

        def chunks() -> Iterator[bytes]:
            try:
                yield from body.iter_chunks(chunk_size)
            except Exception as exc:
                raise self._translate(exc, "get") from exc
            finally:
                body.close()

        return BlobStream(int(answer["ContentLength"]), chunks(), body.close)

    def size(self, digest: str) -> int | None:
        key = self.key(digest)
        try:
            head = self._call("head", lambda: self._client.head_object(Bucket=self.bucket, Key=key))
        except BlobNotFound:
            return None
        return int(head["ContentLength"])

    def delete(self, digest: str) -> None:
        key = self.key(digest)
        # S3 answers 204 for absent keys; some compatibles say 404.
        with contextlib.suppress(BlobNotFound):
            self._call("delete", lambda: self._client.delete_object(Bucket=self.bucket, Key=key))

    def delete_many(self, digests: Sequence[str]) -> list[str]:
        # DeleteObjects: up to 1,000 keys per request instead of a request per blob.
        gone: list[str] = []
        for i in range(0, len(digests), 1000):
            chunk = list(digests[i : i + 1000])
            objects = [{"Key": self.key(d)} for d in chunk]
            answer = self._call("delete", lambda objects=objects: self._client.delete_objects(  # type: ignore[misc]
                Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True}))
            failed = {str(e.get("Key")) for e in answer.get("Errors", []) if e.get("Code") not in _NOT_FOUND_CODES}
            gone += [d for d in chunk if self.key(d) not in failed]
        return gone

    def scan(self) -> Iterator[BlobInfo]:
        # ListObjectsV2 page by page, each page one retried call: a dead S3 is BackendUnavailable
        # from the page where it died, never a half-silent end of the listing.
        prefix = f"{self.prefix}/" if self.prefix else ""
        token: str | None = None
        while True:
            args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": 1000}
            if token:
                args["ContinuationToken"] = token
            page = self._call("list", lambda args=args: self._client.list_objects_v2(**args))  # type: ignore[misc]
            for obj in page.get("Contents", []):
                name = str(obj["Key"])[len(prefix):]
                shard, _, digest = name.partition("/")
                if _is_digest(digest) and shard == digest[:2]:
                    yield BlobInfo(digest, int(obj["Size"]), obj["LastModified"].timestamp())
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    def ping(self) -> None:
        self._call("head_bucket", lambda: self._client.head_bucket(Bucket=self.bucket))

    def presigned_get_url(self, digest: str, expires_s: int) -> str | None:
        try:
            url = self._presign_client.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.bucket, "Key": self.key(digest)},
                ExpiresIn=int(expires_s),
            )
        except (BotoCoreError, ClientError) as exc:  # signing is local; no credentials, mostly
            raise self._translate(exc, "presign") from exc
        return str(url)

    def close(self) -> None:
        self._client.close()
        if self._presign_client is not self._client:
            self._presign_client.close()
