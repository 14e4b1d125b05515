"""The CLI's own gRPC client: unary and server-streaming calls over HTTP/2 (the ``h2`` library) on
a plain socket, TLS from the standard library. grpcio's client costs about 75 ms of imports in
every `ferry` command; this one about 25 ms (``bench/cli.py`` measures both).

One call at a time per connection; a pool holds the idle ones, so that threads (``ferry mcp``)
and a stream followed by calls each get their own. The wire format is ``ferry.cli.grpcframe``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from ferry.cli.grpcframe import MessageReader, RpcFailure, Status, encode_timeout, frame, http_error, status_of

if TYPE_CHECKING:
    import ssl

WINDOW = 16 << 20  # how much the server may send ahead (stream and connection)
READ = 256 << 10


class Tls(NamedTuple):
    """The API's CA (None: the system's), and this client's certificate for mutual TLS."""

    ca: bytes | None = None
    cert_file: str | None = None
    key_file: str | None = None


class _Retry(Exception):
    """The server refused the stream before reading it (it was closing the connection): another
    connection may carry the call safely."""


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{addr!r} is not host:port")
    return host.strip("[]"), int(port)


class Connection:
    """One HTTP/2 connection to the API."""

    def __init__(self, addr: str, tls: Tls | None, timeout: float) -> None:
        host, port = split_addr(addr)
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            sock = _wrap(sock, host, tls)
        self.sock: socket.socket = sock
        self.authority, self.scheme = addr, "https" if tls else "http"
        # Inbound headers are not held to h2's strict rules: a gRPC server sends grpc-message as the
        # error's text, printable ASCII as is, so a message that ends in a space would fail the call
        # (grpcio's clients take it). What is read from them is trimmed instead (grpcframe.status_of).
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8", validate_inbound_headers=False))
        self.h2.initiate_connection()
        self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW})
        self.h2.increment_flow_control_window(WINDOW)
        self.usable = True
        self.busy = False  # a call is under way (or was left unfinished): not reusable
        try:
            self._flush()
            self._handshake(timeout)
        except BaseException:
            self.sock.close()
            raise

    def _handshake(self, timeout: float) -> None:
        """Waits for the server's HTTP/2 settings: a server that speaks something else (TLS on
        a plain connection, say) fails here, as a connection error, not in the first call."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                events = self._receive(deadline)
            except TimeoutError:
                raise TimeoutError("no HTTP/2 answer from the server") from None
            except (RpcFailure, h2.exceptions.ProtocolError):
                raise ConnectionError("the server closed the connection without speaking HTTP/2 "
                                      "(does it speak TLS?)") from None
            if any(isinstance(e, h2.events.RemoteSettingsChanged) for e in events):
                return

    def _flush(self) -> None:
        out = self.h2.data_to_send()
        if out:
            self.sock.sendall(out)

    def _receive(self, deadline: float | None) -> list[h2.events.Event]:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
        else:
            self.sock.settimeout(None)
        data = self.sock.recv(READ)
        if not data:
            self.usable = False
            raise RpcFailure(Status.UNAVAILABLE, "the API closed the connection")
        events = self.h2.receive_data(data)
        self._flush()  # acknowledgements, pings, window updates
        return events

    def still_open(self) -> bool:
        """Whether an idle connection may carry another call (the server may have closed it)."""
        if not self.usable or self.busy:
            return False
        try:
            self.sock.setblocking(False)
            try:
                data = self.sock.recv(READ)
            finally:
                self.sock.setblocking(True)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not data:
            return False
        try:
            events = self.h2.receive_data(data)
            self._flush()
        except (h2.exceptions.ProtocolError, OSError):
            return False
        return not any(isinstance(e, h2.events.ConnectionTerminated) for e in events)

    def call(self, path: str, body: bytes, metadata: Sequence[tuple[str, str]],
             timeout: float | None) -> Iterator[bytes]:
        """Sends one request and yields the answer's messages; raises RpcFailure at a failed end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        sid = self.h2.get_next_available_stream_id()
        headers = [(":method", "POST"), (":scheme", self.scheme), (":path", path), (":authority", self.authority),
                   ("te", "trailers"), ("content-type", "application/grpc"), ("user-agent", "ferry-cli")]
        if timeout is not None:
            headers.append(("grpc-timeout", encode_timeout(timeout)))
        headers += [(k.lower(), v) for k, v in metadata]
        self.busy = True
        answer = _Answer(sid)
        try:
            self.h2.send_headers(sid, headers)
            stash = self._send(sid, frame(body), deadline)
            while True:
                for event in stash or self._receive(deadline):
                    if isinstance(event, h2.events.ConnectionTerminated):
                        self.usable = False
                    messages = answer.on(event)
                    if isinstance(event, h2.events.DataReceived) and event.stream_id == sid:
                        self.h2.acknowledge_received_data(event.flow_controlled_length, sid)
                        self._flush()
                    yield from messages
                    if answer.ended:
                        self.busy = False
                        answer.finish()
                        return
                stash = []
        except TimeoutError:
            self.usable = False
            raise RpcFailure(Status.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        except h2.exceptions.ProtocolError as exc:
            self.usable = False
            raise RpcFailure(Status.INTERNAL, f"the API broke HTTP/2's rules: {exc}") from exc
        except OSError as exc:
            self.usable = False
            raise RpcFailure(Status.UNAVAILABLE, f"connection to the API lost: {exc.strerror or exc}") from exc

    def _send(self, sid: int, data: bytes, deadline: float | None) -> list[h2.events.Event]:
        """Sends the request's body as the flow-control window allows; returns the events read
        while waiting for the window to open (for the caller to handle)."""
        stash: list[h2.events.Event] = []
        view = memoryview(data)
        while view:
            room = min(self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size)
            if room <= 0:
                self._flush()
                stash += self._receive(deadline)
                continue
            self.h2.send_data(sid, bytes(view[:room]))
            view = view[room:]
        self.h2.end_stream(sid)
        self._flush()
        return stash

    def close(self) -> None:
        self.usable = False
        try:
            self.h2.close_connection()
            self._flush()
        except (OSError, h2.exceptions.ProtocolError):
            pass
        self.sock.close()


class _Answer:
    """One call's answer as its HTTP/2 events arrive: its messages, then its end (OK or a failure)."""

    def __init__(self, sid: int) -> None:
        self.sid, self.reader = sid, MessageReader()
        self.answered = self.ended = False
        self.failure: RpcFailure | None = None

    def on(self, event: h2.events.Event) -> list[bytes]:
        """The messages the event completes; sets ``ended`` at the call's end."""
        if isinstance(event, h2.events.ConnectionTerminated):
            if not self.answered and event.last_stream_id is not None and event.last_stream_id < self.sid:
                raise _Retry
            raise RpcFailure(Status.UNAVAILABLE, "the API closed the connection during the call")
        if getattr(event, "stream_id", self.sid) != self.sid:
            return []
        if isinstance(event, h2.events.ResponseReceived):
            self.answered = True
            headers = _text(event.headers)
            failure = http_error(headers)
            if failure is not None:
                raise failure
            if any(k == "grpc-status" for k, _ in headers):  # trailers only: it ended at once
                self.ended, self.failure = True, status_of(headers)
        elif isinstance(event, h2.events.DataReceived):
            return list(self.reader.feed(event.data))
        elif isinstance(event, h2.events.TrailersReceived):
            self.ended, self.failure = True, status_of(_text(event.headers))
            if self.failure is None and self.reader.pending:
                self.failure = RpcFailure(Status.INTERNAL, "the API's answer was cut short")
        elif isinstance(event, h2.events.StreamReset):
            raise RpcFailure(Status.CANCELLED if event.error_code == 8 else Status.INTERNAL,
                             f"the API reset the call (HTTP/2 error {event.error_code})")
        elif isinstance(event, h2.events.StreamEnded) and not self.ended:
            raise RpcFailure(Status.INTERNAL, "the API ended the call without a gRPC status")
        return []

    def finish(self) -> None:
        """At the end: raises the call's failure, if it failed."""
        if self.failure is not None:
            raise self.failure


def _text(headers: Sequence[tuple[bytes | str, bytes | str]]) -> list[tuple[str, str]]:
    """Headers as text (h2 decodes them already, with ``header_encoding``)."""
    return [(k if isinstance(k, str) else k.decode("latin-1"), v if isinstance(v, str) else v.decode("latin-1"))
            for k, v in headers]


def _wrap(sock: socket.socket, host: str, tls: Tls) -> ssl.SSLSocket:
    import ssl  # only for TLS: 10 ms

    ctx = ssl.create_default_context(cadata=tls.ca.decode("ascii", "replace") if tls.ca else None)
    if tls.cert_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file or None)
    ctx.set_alpn_protocols(["h2"])
    try:
        return ctx.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


class Channel:
    """Calls to one API address over a pool of connections (one call at a time on each)."""

    def __init__(self, addr: str, tls: Tls | None, connect_timeout: float) -> None:
        self.addr, self.tls, self.connect_timeout = addr, tls, connect_timeout
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._idle.append(Connection(addr, tls, connect_timeout))  # fails here if the API is not there

    def _take(self) -> Connection:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if conn.still_open():
                    return conn
                conn.close()
        try:
            return Connection(self.addr, self.tls, self.connect_timeout)
        except OSError as exc:
            raise RpcFailure(Status.UNAVAILABLE, f"cannot connect to {self.addr}: {exc.strerror or exc}") from exc

    def _give(self, conn: Connection) -> None:
        if conn.usable and not conn.busy:
            with self._lock:
                self._idle.append(conn)
        else:
            conn.close()

    def stream(self, path: str, body: bytes, metadata: Sequence[tuple[str, str]],
               timeout: float | None = None) -> Iterator[bytes]:
        """The answer's messages, as they arrive."""
        for attempt in (1, 2):
            conn = self._take()
            sent = False
            try:
                for message in conn.call(path, body, metadata, timeout):
                    sent = True
                    yield message
                return
            except _Retry:
                if sent or attempt == 2:
                    raise RpcFailure(Status.UNAVAILABLE, "the API closed the connection during the call") from None
            finally:
                self._give(conn)

    def unary(self, path: str, body: bytes, metadata: Sequence[tuple[str, str]], timeout: float | None) -> bytes:
        """The answer's one message."""
        messages = list(self.stream(path, body, metadata, timeout))
        if len(messages) != 1:
            raise RpcFailure(Status.INTERNAL, f"the API answered a single call with {len(messages)} messages")
        return messages[0]

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
