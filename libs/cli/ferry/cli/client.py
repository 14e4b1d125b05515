"""The CLI's connection to the admin API, and the translation of gRPC errors into exit codes.

Calls go over the CLI's own small gRPC client (``ferry.cli.h2call``): importing grpcio's took
about 75 ms of every command. ``open_channel`` (grpcio) serves `ferry up`, which runs for long.
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ferry.cli.grpcframe import RpcFailure
from ferry.cli.h2call import Channel, Tls, split_addr
from ferry.common.errors import (
    AlreadyExistsError,
    FerryError,
    NotFoundError,
    PermissionDenied,
    QuotaExceeded,
    UsageError,
)
from ferry.common.tls import is_loopback
from ferry.v1 import ferry_pb2 as pb

if TYPE_CHECKING:
    import grpc

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


class Stub:
    """The admin API's methods by name, as grpcio's generated stub has them (``stub.ListNodes(req,
    metadata=..., timeout=...)``), over the CLI's own client."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._service = pb.DESCRIPTOR.services_by_name["FerryAdmin"]

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = self._service.methods_by_name.get(name)
        if method is None:
            raise AttributeError(name)
        answer = getattr(pb, method.output_type.name)
        call = self._stream if method.server_streaming else self._unary
        bound = functools.partial(call, f"/{self._service.full_name}/{name}", answer)
        setattr(self, name, bound)
        return bound

    def _unary(self, path: str, answer: Any, request: Any, metadata: Any = (), timeout: float | None = None) -> Any:
        return answer.FromString(self._channel.unary(path, request.SerializeToString(), metadata, timeout))

    def _stream(self, path: str, answer: Any, request: Any, metadata: Any = (),
                timeout: float | None = None) -> Iterator[Any]:
        for message in self._channel.stream(path, request.SerializeToString(), metadata, timeout):
            yield answer.FromString(message)


class Client:
    def __init__(self, addr: str | None = None, token: str | None = None, connect_timeout: float = 5.0,
                 reason: str | None = None) -> None:
        self.addr = addr or default_addr()
        token = token if token is not None else os.environ.get("FERRY_TOKEN", "")
        self.metadata: list[tuple[str, str]] = [("authorization", f"Bearer {token}")] if token else []
        reason = reason if reason is not None else os.environ.get("FERRY_REASON", "")
        self.metadata += self.reason_metadata(reason)
        tls = tls_settings(self.addr)
        try:
            self.channel = Channel(self.addr, tls, connect_timeout)
        except OSError as exc:
            if tls and type(exc).__module__ == "ssl":
                raise FerryError(f"TLS with the Ferry API at {self.addr} failed: {exc} (FERRY_TLS_CA must be "
                                 "the CA that signed the API's certificate)") from exc
            hint = "" if tls else "; if it speaks TLS, set FERRY_TLS_CA to its CA"
            raise FerryError(f"cannot reach the Ferry API at {self.addr}: is `ferry up` running? "
                             f"(set FERRY_ADDR to its address{hint}; {exc.strerror or exc})") from exc
        self.stub = cast("pb_grpc.FerryAdminStub", Stub(self.channel))

    @staticmethod
    def reason_metadata(reason: str) -> list[tuple[str, str]]:
        return [(REASON_KEY, reason_header(reason))] if reason.strip() else []

    def with_reason(self, reason: str) -> Client:
        """The same connection, its calls carrying ``reason`` (the audit trail records it)."""
        other = copy.copy(self)
        other.metadata = [m for m in self.metadata if m[0] != REASON_KEY] + self.reason_metadata(reason)
        return other

    def call(self, method: Callable[..., T], request: Any, timeout: float | None = None) -> T:
        try:
            return method(request, metadata=self.metadata, timeout=timeout)
        except RpcFailure as exc:
            raise translate(exc) from exc

    def stream(self, method: Callable[..., Iterator[T]], request: Any) -> Iterator[T]:
        try:
            yield from method(request, metadata=self.metadata)
        except RpcFailure as exc:
            raise translate(exc) from exc

    def close(self) -> None:
        self.channel.close()


def tls_settings(addr: str) -> Tls | None:
    """TLS when FERRY_TLS_CA (the API's CA) or FERRY_TLS_CERT/FERRY_TLS_KEY (this client's, for
    mutual TLS) are set; in the clear only to this machine."""
    try:
        host, _ = split_addr(addr)
    except ValueError as exc:
        raise UsageError(f"FERRY_ADDR={addr}: {exc}; say host:port") from exc
    ca, cert = _read("FERRY_TLS_CA"), _read("FERRY_TLS_CERT")
    _read("FERRY_TLS_KEY")  # readable, or a usage error now
    if ca or cert:
        cert_file = os.environ["FERRY_TLS_CERT"] if cert else None
        key_file = (os.environ.get("FERRY_TLS_KEY") or None) if cert else None
        return Tls(ca=ca, cert_file=cert_file, key_file=key_file)
    if not is_loopback(host):
        raise UsageError(f"{addr} is not on this machine, and Ferry speaks only TLS across a network: set "
                         "FERRY_TLS_CA to the API's CA certificate (and FERRY_TOKEN)")
    return None


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
    """A grpcio channel with the rules of ``tls_settings`` (for `ferry up`, which runs for long)."""
    import grpc

    options = [("grpc.max_receive_message_length", 64 << 20)]
    tls = tls_settings(addr)
    if tls is None:
        return grpc.insecure_channel(addr, options=options)
    key = _read("FERRY_TLS_KEY") if tls.key_file else None
    cert = _read("FERRY_TLS_CERT") if tls.cert_file else None
    credentials = grpc.ssl_channel_credentials(root_certificates=tls.ca, private_key=key, certificate_chain=cert)
    return grpc.secure_channel(addr, credentials, options=options)


def translate(exc: grpc.RpcError | RpcFailure) -> FerryError:
    """A failed call as Ferry's error of that kind (grpcio's RpcError or the CLI client's RpcFailure:
    the same status names)."""
    name: str = exc.code().name
    details: str = exc.details() or name
    if name == "NOT_FOUND":
        return NotFoundError(details)
    if name == "INVALID_ARGUMENT":
        return UsageError(details)
    if name == "PERMISSION_DENIED":
        return PermissionDenied(details)
    if name == "RESOURCE_EXHAUSTED":
        return QuotaExceeded(details)
    if name == "ALREADY_EXISTS":
        return AlreadyExistsError(details)
    if name == "UNAVAILABLE":
        return ApiError(f"the Ferry API is unavailable: {details}")
    return ApiError(details)
