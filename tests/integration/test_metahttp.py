"""ferry.node.metahttp against a small HTTP/1.1 server of the test's own (asyncio streams), which
can close idle connections, answer in chunks, send too much or nothing at all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from ferry.node import metahttp
from ferry.node.metahttp import MetadataError, Target


@dataclass
class Server:
    """Answers ``GET /n`` with the count of requests it has had; ``/close`` with Connection:
    close; ``/chunked`` in chunks; ``/big`` with a body over the limit; ``/slow`` never."""

    connections: int = 0
    requests: list[tuple[str, str, bytes]] = field(default_factory=list)
    close_after_each: bool = False  # close every connection once it answered (an idle timeout)
    server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ")
                headers = dict(line.split(": ", 1) for line in lines[1:] if line)
                body = await reader.readexactly(int(headers.get("Content-Length", "0")))
                self.requests.append((method, path, body))
                if path == "/slow":
                    await asyncio.sleep(10)
                if path == "/chunked":
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
                elif path == "/big":
                    size = metahttp.MAX_RESPONSE + 1
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size)
                else:
                    text = str(len(self.requests)).encode()
                    extra = b"Connection: close\r\n" if path == "/close" else b""
                    head = b"HTTP/1.1 200 OK\r\nX-Test: yes\r\n%sContent-Length: %d\r\n\r\n" % (extra, len(text))
                    writer.write(head + text)
                await writer.drain()
                if path == "/close" or self.close_after_each:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    srv = Server()
    srv.server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    try:
        yield srv
    finally:
        await metahttp.close_all()
        srv.server.close()


async def test_requests_share_one_connection(server: Server) -> None:
    answers = [await metahttp.request("GET", f"{server.url}/n") for _ in range(5)]
    assert [a.text() for a in answers] == ["1", "2", "3", "4", "5"]
    assert answers[0].status == 200 and answers[0].headers["x-test"] == "yes"
    assert server.connections == 1


async def test_a_connection_the_endpoint_closed_is_replaced_and_the_request_sent_once_more(server: Server) -> None:
    server.close_after_each = True
    for _ in range(3):
        assert (await metahttp.request("GET", f"{server.url}/n")).status == 200
        await asyncio.sleep(0.05)  # the close reaches the client before its next request
    assert len(server.requests) == 3 and server.connections == 3


async def test_a_connection_closed_with_an_answer_is_not_kept(server: Server) -> None:
    assert (await metahttp.request("GET", f"{server.url}/close")).status == 200
    assert metahttp.pool().conns == {}
    assert (await metahttp.request("GET", f"{server.url}/n")).text() == "2"
    assert server.connections == 2


async def test_a_post_goes_on_a_connection_of_its_own_and_carries_its_body(server: Server) -> None:
    await metahttp.request("GET", f"{server.url}/n")
    reply = await metahttp.request("POST", f"{server.url}/n?x=1", {"Content-Type": "application/json"}, b'{"a": 1}')
    assert reply.text() == "2"
    assert server.requests[-1] == ("POST", "/n?x=1", b'{"a": 1}')
    assert server.connections == 2 and len(metahttp.pool().conns) == 1  # the kept one is the GET's


async def test_a_chunked_answer_is_read_whole(server: Server) -> None:
    assert (await metahttp.request("GET", f"{server.url}/chunked")).body == b"abcde"


async def test_limits_and_failures_are_metadata_errors_that_name_the_request(server: Server) -> None:
    with pytest.raises(MetadataError, match=r"GET .*/big: response larger than"):
        await metahttp.request("GET", f"{server.url}/big")
    with pytest.raises(MetadataError, match=r"GET .*/slow: no answer within 0.2s"):
        await metahttp.request("GET", f"{server.url}/slow", timeout=0.2)
    assert metahttp.pool().conns == {}  # neither connection is kept mid-answer
    assert (await metahttp.request("GET", f"{server.url}/n")).text() == "3"
    with pytest.raises(MetadataError, match="only http://"):
        await metahttp.request("GET", "https://127.0.0.1/x")
    with pytest.raises(MetadataError, match="bad request"):
        await metahttp.request("GET", f"{server.url}/n", {"Bad Header": "x"})


async def test_concurrent_requests_take_turns_on_the_kept_connection(server: Server) -> None:
    answers = await asyncio.gather(*(metahttp.request("GET", f"{server.url}/n") for _ in range(8)))
    assert sorted(int(a.text()) for a in answers) == list(range(1, 9))
    assert server.connections == 1


def test_target_parse() -> None:
    t = Target.parse("http://169.254.169.254/latest/meta-data/x?y=1")
    assert (t.host, t.port, t.path) == ("169.254.169.254", 80, "/latest/meta-data/x?y=1")
    assert t.authority == "169.254.169.254"
    assert Target.parse("http://h:8080").path == "/"
    with pytest.raises(MetadataError, match="out of range"):
        Target.parse("http://h:99999/")
