"""gRPC's wire format over HTTP/2, as pure functions: what the CLI's own small client
(``ferry.cli.h2call``) sends and reads, without importing grpcio (about 75 ms of every call).

A message is framed as one byte (compressed or not), four bytes of big-endian length, then the
message (https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md). A call ends with
``grpc-status`` (and a percent-encoded ``grpc-message``) in the trailers, or in the response's
headers when it carries no message at all ("trailers only").
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Iterator

PREFIX = struct.Struct(">BI")
MAX_MESSAGE = 64 << 20  # what the CLI accepts, as its grpcio channel did (grpc.max_receive_message_length)


class Status(enum.IntEnum):
    """gRPC's status codes (the names are grpc.StatusCode's)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcFailure(Exception):
    """A call that ended with a status other than OK; ``code()`` and ``details()`` as grpcio's
    RpcError has them, so that one translation into Ferry's errors serves both."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(f"{status.name}: {message}")
        self.status, self.message = status, message

    def code(self) -> Status:
        return self.status

    def details(self) -> str:
        return self.message


def frame(message: bytes) -> bytes:
    """One uncompressed message as it goes on the wire."""
    return PREFIX.pack(0, len(message)) + message


class MessageReader:
    """Cuts the messages out of a response's DATA, which may split or join them anyhow."""

    def __init__(self, limit: int = MAX_MESSAGE) -> None:
        self._buf = bytearray()
        self._limit = limit

    def feed(self, data: bytes) -> Iterator[bytes]:
        self._buf += data
        while len(self._buf) >= PREFIX.size:
            compressed, size = PREFIX.unpack_from(self._buf)
            if compressed:
                raise RpcFailure(Status.INTERNAL, "the API sent a compressed message, which this client never asks for")
            if size > self._limit:
                raise RpcFailure(Status.RESOURCE_EXHAUSTED,
                                 f"the API's answer is {size} bytes, more than the {self._limit} this client takes")
            if len(self._buf) < PREFIX.size + size:
                return
            message = bytes(self._buf[PREFIX.size : PREFIX.size + size])
            del self._buf[: PREFIX.size + size]
            yield message

    @property
    def pending(self) -> int:
        """Bytes of a message not yet whole (a stream that ends with some is cut short)."""
        return len(self._buf)


def encode_timeout(seconds: float) -> str:
    """``grpc-timeout``: at most eight digits and a unit; milliseconds, or seconds when longer."""
    millis = max(1, int(seconds * 1000 + 0.999))
    return f"{millis}m" if millis < 10**8 else f"{min(int(seconds + 0.999), 10**8 - 1)}S"


def percent_decode(text: str) -> str:
    """``grpc-message`` is UTF-8, percent-encoded outside printable ASCII (and '%' itself)."""
    if "%" not in text:
        return text
    out, i, raw = bytearray(), 0, text.encode("ascii", "replace")
    while i < len(raw):
        if raw[i] == 0x25 and _is_hex(raw[i + 1 : i + 3]):
            out.append(int(raw[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(raw[i])
            i += 1
    return out.decode("utf-8", "replace")


def _is_hex(pair: bytes) -> bool:
    return len(pair) == 2 and all(c in b"0123456789abcdefABCDEF" for c in pair)


# what a response's HTTP status means when gRPC's own status is missing (the protocol's table)
_HTTP_STATUS = {400: Status.INTERNAL, 401: Status.UNAUTHENTICATED, 403: Status.PERMISSION_DENIED,
                404: Status.UNIMPLEMENTED, 429: Status.UNAVAILABLE, 502: Status.UNAVAILABLE,
                503: Status.UNAVAILABLE, 504: Status.UNAVAILABLE}


def status_of(headers: Iterable[tuple[str, str]]) -> RpcFailure | None:
    """The call's end from the headers or trailers that carry it: None when OK, else the failure.
    Headers without ``grpc-status`` fail by their HTTP status (a proxy's, not the API's)."""
    found = {k.strip(): v.strip() for k, v in headers}
    code = found.get("grpc-status")
    if code is None:
        http = int(found.get(":status", "0") or 0)
        if http == 200:
            return RpcFailure(Status.INTERNAL, "the API ended the call without a gRPC status")
        return RpcFailure(_HTTP_STATUS.get(http, Status.UNKNOWN),
                          f"HTTP status {http} from {found.get('server', 'the API')}")
    try:
        status = Status(int(code))
    except ValueError:
        status = Status.UNKNOWN
    if status == Status.OK:
        return None
    return RpcFailure(status, percent_decode(found.get("grpc-message", "")) or status.name)


def http_error(headers: Iterable[tuple[str, str]]) -> RpcFailure | None:
    """A response's first headers that are not a gRPC answer at all (wrong HTTP status or type)."""
    found = {k.strip(): v.strip() for k, v in headers}
    http = int(found.get(":status", "0") or 0)
    if http != 200:
        return RpcFailure(_HTTP_STATUS.get(http, Status.UNKNOWN),
                          f"HTTP status {http} from the server, not a gRPC answer")
    kind = found.get("content-type", "")
    if not kind.startswith("application/grpc"):
        return RpcFailure(Status.UNKNOWN,
                          f"the server answered {kind or 'no content type'}, not gRPC: is FERRY_ADDR the API?")
    return None
