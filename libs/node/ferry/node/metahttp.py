"""Plain HTTP/1.1 to a cloud's metadata endpoint, with h11 over an asyncio stream.

    request(method, url, headers, body, timeout) -> Response    one request; MetadataError on failure
    close_all()                                                   the running loop's connections closed

The endpoints are link-local and plain http (no TLS, no proxy, no redirect, no auth scheme), and a
node service asks them the same two or three questions every second: a general client's layers
were most of the cost. httpx took 3.2 to 4.8 ms of CPU per AWS poll (two GETs) here, h11 on a kept
connection 0.7 ms (`bench/imds.py`).

Each event loop keeps one connection per endpoint (host, port) between requests, one request at a
time on it. A request on a kept connection that the endpoint had closed in the meantime (its idle
timeout) is sent once more on a new one, for the methods HTTP calls idempotent; a POST always goes
on a connection of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import h11

from ferry.common.errors import FerryError

MAX_RESPONSE = 1 << 20
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


class MetadataError(FerryError):
    """A metadata endpoint cannot be reached or answered something unexpected."""


@dataclass
class Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased
    body: bytes = b""

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise MetadataError(f"expected JSON, got {self.text()[:80]!r}") from exc


@dataclass(frozen=True)
class Target:
    """Where a URL's request goes, and its request line's target and Host header."""

    host: str
    port: int
    path: str  # path and query
    authority: str

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise MetadataError(f"{url}: only http://host[:port]/path URLs are supported")
        try:
            port = parts.port or 80
        except ValueError as exc:
            raise MetadataError(f"{url}: {exc}") from None
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.hostname, port, path, parts.netloc)


class _Stale(Exception):
    """A kept connection was closed by the endpoint before it answered."""


class Connection:
    """One HTTP/1.1 connection, kept open between requests."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.used = False  # has answered a request: a failure may be its idle close

    def reusable(self) -> bool:
        return self.h11.our_state is h11.IDLE and self.h11.their_state is h11.IDLE and not self.writer.is_closing()

    def encode(self, method: str, target: Target, headers: dict[str, str], body: bytes) -> bytes:
        """The request's bytes (h11 checks them: LocalProtocolError)."""
        fields = [("Host", target.authority), *headers.items()]
        if body or method in ("POST", "PUT"):
            fields.append(("Content-Length", str(len(body))))
        out = self.h11.send(h11.Request(method=method, target=target.path, headers=fields)) or b""
        if body:
            out += self.h11.send(h11.Data(data=body)) or b""
        return out + (self.h11.send(h11.EndOfMessage()) or b"")

    async def exchange(self, method: str, target: Target, headers: dict[str, str], body: bytes) -> Response:
        """One request and its whole answer. Raises _Stale (a kept connection the endpoint had
        closed: nothing was read), MetadataError, OSError."""
        try:
            out = self.encode(method, target, headers, body)
        except h11.LocalProtocolError as exc:
            raise MetadataError(f"bad request: {exc}") from None
        reused, self.used = self.used, True
        answer = Response(0)
        data = bytearray()
        read_any = False
        try:
            self.writer.write(out)
            await self.writer.drain()
            while True:
                event = self.h11.next_event()
                if event is h11.NEED_DATA:
                    chunk = await self.reader.read(65536)
                    read_any = read_any or bool(chunk)
                    self.h11.receive_data(chunk)  # b"": the endpoint closed
                elif isinstance(event, h11.Response):
                    answer.status = event.status_code
                    answer.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    data += event.data
                    if len(data) > MAX_RESPONSE:
                        raise MetadataError(f"response larger than {MAX_RESPONSE} bytes")
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    break
        except (h11.RemoteProtocolError, ConnectionResetError, BrokenPipeError) as exc:
            if reused and not read_any:
                raise _Stale() from exc
            raise MetadataError(str(exc)) from None
        if not answer.status:  # closed after a whole answer to an earlier request, before this one's
            if reused:
                raise _Stale()
            raise MetadataError("the endpoint closed the connection before it answered")
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
        answer.body = bytes(data)
        return answer

    def close(self) -> None:
        self.writer.close()


class Pool:
    """A loop's kept connections, one per endpoint."""

    def __init__(self) -> None:
        self.conns: dict[tuple[str, int], Connection] = {}
        self.locks: dict[tuple[str, int], asyncio.Lock] = {}

    async def connect(self, target: Target) -> Connection:
        reader, writer = await asyncio.open_connection(target.host, target.port)
        return Connection(reader, writer)

    async def request(self, method: str, target: Target, headers: dict[str, str], body: bytes) -> Response:
        if method not in IDEMPOTENT:  # never sent twice: a connection of its own
            conn = await self.connect(target)
            try:  # a new connection is never stale (_Stale): nothing to send again
                return await conn.exchange(method, target, headers, body)
            finally:
                conn.close()
        key = (target.host, target.port)
        async with self.locks.setdefault(key, asyncio.Lock()):  # one request at a time per endpoint
            for _ in range(2):
                kept = self.conns.get(key)
                if kept is not None and not kept.reusable():
                    self._drop(key, kept)
                    kept = None
                conn = kept or await self.connect(target)
                self.conns[key] = conn
                try:
                    answer = await conn.exchange(method, target, headers, body)
                except _Stale:
                    self._drop(key, conn)
                    continue  # once more, on a new connection
                except BaseException:
                    self._drop(key, conn)
                    raise
                if not conn.reusable():
                    self._drop(key, conn)
                return answer
        raise MetadataError("the endpoint closed a new connection before it answered")

    def _drop(self, key: tuple[str, int], conn: Connection) -> None:
        conn.close()
        if self.conns.get(key) is conn:
            del self.conns[key]


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Pool] = weakref.WeakKeyDictionary()


def pool() -> Pool:
    """The running loop's pool (made on first use)."""
    loop = asyncio.get_running_loop()
    found = _POOLS.get(loop)
    if found is None:
        found = _POOLS[loop] = Pool()
    return found


async def request(method: str, url: str, headers: Mapping[str, str] | None = None, body: bytes = b"",
                  timeout: float = 2.0) -> Response:
    """One request, answered within ``timeout`` seconds; MetadataError otherwise (the message
    names the method and the URL)."""
    target = Target.parse(url)
    try:
        async with asyncio.timeout(timeout):
            return await pool().request(method.upper(), target, dict(headers or {}), body)
    except TimeoutError:
        raise MetadataError(f"{method} {url}: no answer within {timeout}s") from None
    except MetadataError as exc:
        raise MetadataError(f"{method} {url}: {exc}") from None
    except OSError as exc:
        raise MetadataError(f"{method} {url}: {exc}") from None


async def close_all() -> None:
    """Closes the running loop's connections (a service's close); a later request opens anew."""
    found = _POOLS.pop(asyncio.get_running_loop(), None)
    if found is not None:
        for conn in list(found.conns.values()):
            conn.close()
            with contextlib.suppress(OSError):
                await conn.writer.wait_closed()
        found.conns.clear()
