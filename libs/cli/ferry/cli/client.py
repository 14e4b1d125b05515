"""The CLI's connection to the admin API, and the translation of gRPC errors into exit codes."""

import copy
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from ferry.common.errors import (
    AlreadyExistsError,
    FerryError,
    NotFoundError,
    PermissionDenied,
    QuotaExceeded,
    UsageError,
)
from ferry.common.tls import is_loopback
from ferry.v1 import ferry_pb2_grpc as pb_grpc

T = TypeVar("T")

class ApiError(FerryError):
    """The API answered with an error; an operation's own exit code, else 1 (the caller's bad input
    arrives as a UsageError or a NotFoundError, exit 2)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


REASON_KEY = "x-ferry-reason"


def reason_header(reason: str) -> str:
    """A reason as gRPC metadata carries it: printable ASCII on one line (others become '?')."""
    flat = " ".join(reason.split())
    return "".join(c if " " <= c <= "~" else "?" for c in flat)[:500]


def default_addr() -> str:
    return os.environ.get("FERRY_ADDR", "127.0.0.1:7070")


class Client:
    def __init__(self, addr: str | None = None, token: str | None = None, connect_timeout: float = 5.0,
                 reason: str | None = None) -> None:
        self.addr = addr or default_addr()
        token = token if token is not None else os.environ.get("FERRY_TOKEN", "")
        self.metadata: list[tuple[str, str]] = [("authorization", f"Bearer {token}")] if token else []
        reason = reason if reason is not None else os.environ.get("FERRY_REASON", "")
        self.metadata += self.reason_metadata(reason)
        self.channel = open_channel(self.addr)
        try:
            grpc.channel_ready_future(self.channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError as exc:
            hint = "" if os.environ.get("FERRY_TLS_CA") else "; if it speaks TLS, set FERRY_TLS_CA to its CA"
            raise FerryError(f"cannot reach the Ferry API at {self.addr}: is `ferry up` running? "
                             f"(set FERRY_ADDR to its address{hint})") from exc
        self.stub = pb_grpc.FerryAdminStub(self.channel)

    @staticmethod
    def reason_metadata(reason: str) -> list[tuple[str, str]]:
        return [(REASON_KEY, reason_header(reason))] if reason.strip() else []

    def with_reason(self, reason: str) -> "Client":
        """The same connection, its calls carrying ``reason`` (the audit trail records it)."""
        other = copy.copy(self)
        other.metadata = [m for m in self.metadata if m[0] != REASON_KEY] + self.reason_metadata(reason)
        return other

    def call(self, method: Callable[..., T], request: Any, timeout: float | None = None) -> T:
        try:
            return method(request, metadata=self.metadata, timeout=timeout)
        except grpc.RpcError as exc:
            raise translate(exc) from exc

    def stream(self, method: Callable[..., Iterator[T]], request: Any) -> Iterator[T]:
        try:
            yield from method(request, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise translate(exc) from exc

    def close(self) -> None:
        self.channel.close()


def _read(variable: str) -> bytes | None:
    path = os.environ.get(variable, "")
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise UsageError(f"cannot read {variable}={path}: {exc.strerror or exc}") from exc


def open_channel(addr: str) -> grpc.Channel:
    """TLS when FERRY_TLS_CA (the API's CA) or FERRY_TLS_CERT/FERRY_TLS_KEY (this client's, for
    mutual TLS) are set; in the clear only to this machine."""
    options = [("grpc.max_receive_message_length", 64 << 20)]
    ca, cert, key = _read("FERRY_TLS_CA"), _read("FERRY_TLS_CERT"), _read("FERRY_TLS_KEY")
    if ca or cert:
        credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
        return grpc.secure_channel(addr, credentials, options=options)
    host = addr.rpartition(":")[0] or addr
    if not is_loopback(host):
        raise UsageError(f"{addr} is not on this machine, and Ferry speaks only TLS across a network: set "
                         "FERRY_TLS_CA to the API's CA certificate (and FERRY_TOKEN)")
    return grpc.insecure_channel(addr, options=options)


def translate(exc: grpc.RpcError) -> FerryError:
    code: grpc.StatusCode = exc.code()
    details: str = exc.details() or code.name
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFoundError(details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return UsageError(details)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return QuotaExceeded(details)
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return AlreadyExistsError(details)
    if code == grpc.StatusCode.UNAVAILABLE:
        return ApiError(f"the Ferry API is unavailable: {details}")
    return ApiError(details)
