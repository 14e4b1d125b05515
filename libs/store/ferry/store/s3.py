"""A backend on any S3 API (MinIO first; AWS S3, Ceph RGW, ...) through the ``minio`` client.

The bucket is created on first use when missing (and again if it disappears). Objects larger than
``part_size`` are uploaded as multipart uploads, which S3 makes visible only once complete.
Transient failures (connection errors, timeouts, 5xx, SlowDown) are retried with exponential
backoff; every failure is translated to a StoreError with ``raise ... from``.
"""

from __future__ import annotations

import builtins
import io
import os
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import certifi
import urllib3
from minio import Minio
from minio.error import InvalidResponseError, S3Error, ServerError
from minio.helpers import check_bucket_name

from ferry.common.errors import UsageError
from ferry.store.backend import check_key, check_prefix
from ferry.store.errors import BackendUnavailable, ObjectNotFound, StoreError
from ferry.store.retry import RetryPolicy, call_with_retries

T = TypeVar("T")

DEFAULT_PART_SIZE = 16 * 1024 * 1024
_TRANSIENT_CODES = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "OperationAborted"}
_AUTH_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"}
_MISSING_CODES = {"NoSuchKey", "NoSuchObject", "ResourceNotFound"}


class S3Backend:
    """Objects under ``prefix`` in ``bucket`` at ``endpoint`` (``host[:port]``, no scheme)."""

    list_page = 1000  # keys per listing request; a failed request resumes after the last key seen
    coalesce_bytes = 8 * 1024 * 1024  # a restore's ranged reads of neighbouring chunks (CoalescedReads)

    def __init__(
        self,
        endpoint: str,
        bucket: str,
        prefix: str = "",
        *,
        access_key: str | None,
        secret_key: str | None,
        secure: bool = True,
        region: str | None = None,
        part_size: int = DEFAULT_PART_SIZE,
        retry: RetryPolicy | None = None,
        timeout: float = 30.0,
    ) -> None:
        if not endpoint or "/" in endpoint:
            raise UsageError(f"S3 endpoint must be host[:port] without scheme or path, got {endpoint!r}")
        try:
            check_bucket_name(bucket, strict=True)
        except ValueError as exc:
            raise UsageError(f"invalid S3 bucket name {bucket!r}: {exc}") from exc
        prefix = prefix.strip("/")
        check_prefix(prefix)
        self.endpoint, self.bucket = endpoint, bucket
        self.prefix = f"{prefix}/" if prefix else ""
        self.part_size = part_size
        self.retry = retry or RetryPolicy()
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=min(timeout, 10.0), read=timeout),
            maxsize=32,
            retries=False,
            cert_reqs="CERT_REQUIRED",
            ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
        )
        self._client = Minio(
            endpoint, access_key=access_key, secret_key=secret_key, secure=secure, region=region, http_client=http
        )
        self._region = region
        self._bucket_ok = threading.Event()
        self._bucket_lock = threading.Lock()

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix} at {self.endpoint}"

    # -- error handling ---------------------------------------------------------------------

    def _translate(self, exc: Exception) -> tuple[StoreError, bool]:
        where = self.describe()
        if isinstance(exc, StoreError):
            return exc, False
        if isinstance(exc, S3Error):
            code = exc.code or ""
            if code in _AUTH_CODES:
                return BackendUnavailable(
                    f"{where} refused the credentials ({code}); check FERRY_S3_ACCESS_KEY and FERRY_S3_SECRET_KEY"
                ), False
            transient = code in _TRANSIENT_CODES or getattr(exc.response, "status", 0) >= 500
            return (BackendUnavailable if transient else StoreError)(f"{where}: {code}: {exc.message}"), transient
        if isinstance(exc, ServerError):
            return BackendUnavailable(f"{where}: server error {exc.status_code}"), True
        if isinstance(exc, InvalidResponseError):
            return BackendUnavailable(f"{where}: unexpected response: {exc}"), True
        if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
            return BackendUnavailable(f"{where} is unreachable: {exc}"), True
        return StoreError(f"{where}: {type(exc).__name__}: {exc}"), False

    def _call(self, op: Callable[[], T]) -> T:
        def attempt() -> T:
            self._ensure_bucket()
            try:
                return op()
            except S3Error as exc:
                if exc.code == "NoSuchBucket":  # removed (or the server restarted empty): make it again
                    self._bucket_ok.clear()
                    self._ensure_bucket()
                    return op()
                raise

        return call_with_retries(attempt, self._translate, self.retry)

    def _ensure_bucket(self) -> None:
        if self._bucket_ok.is_set():
            return
        with self._bucket_lock:
            if self._bucket_ok.is_set():
                return
            if not self._client.bucket_exists(self.bucket):
                try:
                    self._client.make_bucket(self.bucket, location=self._region)
                except S3Error as exc:
                    if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise
            self._bucket_ok.set()

    # -- Backend ------------------------------------------------------------------------------

    def _name(self, key: str) -> str:
        return self.prefix + check_key(key)

    def put(self, key: str, data: bytes) -> None:
        name = self._name(key)

        def op() -> None:
            self._client.put_object(self.bucket, name, io.BytesIO(data), len(data), part_size=self.part_size)

        self._call(op)

    def get(self, key: str) -> bytes:
        name = self._name(key)

        def op() -> bytes:
            try:
                response = self._client.get_object(self.bucket, name)
            except S3Error as exc:
                if exc.code in _MISSING_CODES:
                    raise ObjectNotFound(key, self.describe()) from exc
                raise
            try:
                return bytes(response.read())
            finally:
                response.close()
                response.release_conn()

        return self._call(op)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        name = self._name(key)

        def op() -> bytes:
            try:
                response = self._client.get_object(self.bucket, name, offset=offset, length=length)
            except S3Error as exc:
                if exc.code in _MISSING_CODES:
                    raise ObjectNotFound(key, self.describe()) from exc
                if exc.code == "InvalidRange":  # from past the end: nothing there
                    return b""
                raise
            try:
                return bytes(response.read())
            finally:
                response.close()
                response.release_conn()

        return self._call(op)

    def exists(self, key: str) -> bool:
        return self.stored_size(key) is not None

    def stored_size(self, key: str) -> int | None:
        name = self._name(key)

        def op() -> int | None:
            try:
                found = self._client.stat_object(self.bucket, name)
            except S3Error as exc:
                if exc.code in _MISSING_CODES:
                    return None
                raise
            return int(found.size) if found.size is not None else 0

        return self._call(op)

    def delete(self, key: str) -> None:
        name = self._name(key)
        self._call(lambda: self._client.remove_object(self.bucket, name))

    def list(self, prefix: str) -> Iterator[str]:
        for key, _ in self.list_sizes(prefix):
            yield key

    def list_sizes(self, prefix: str) -> Iterator[tuple[str, int]]:
        """Yield keys and sizes page by page; a failed page is retried from the last key seen."""
        full = self.prefix + check_prefix(prefix)
        last: builtins.list[str] = []

        def page() -> builtins.list[tuple[str, int]]:
            objects = self._client.list_objects(
                self.bucket, prefix=full, recursive=True, start_after=last[0] if last else None
            )
            batch: builtins.list[tuple[str, int]] = []
            for obj in objects:
                if obj.object_name is None or obj.is_dir:
                    continue
                batch.append((obj.object_name, obj.size or 0))
                if len(batch) >= self.list_page:
                    break
            return batch

        while True:
            batch = self._call(page)
            if not batch:
                return
            for name, size in batch:
                yield name[len(self.prefix) :], size
            if len(batch) < self.list_page:
                return
            last[:] = [batch[-1][0]]
