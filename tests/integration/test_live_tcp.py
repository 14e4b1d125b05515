"""Real CRIU post-copy with live TCP: redis-server moves between two "nodes" (network namespaces,
``tests/netns.py``) that carry the same service address, while a client on the host keeps talking
to it over one established connection.

The move is the one ``ferry.criu.lazy.LiveMove`` makes, driven half by half because each half runs
CRIU (and the target its shim) in its own node: ``LazySource`` dumps in src with
``--tcp-established``, ``LazyTarget`` restores in dst, the memory follows over the nodes' link.

The service address moves as a VIP would. src drops it just before the freeze. With
``--leave-running`` CRIU (4.1 and 4.2, ``cr_dump_finish``) unlocks the network as soon as the images
are written, before it serves the memory: the source's socket leaves repair mode and its kernel
answers for it again, while its state has already gone to dst. Without the fence it ACKed the
client's retransmission (new data there would be lost) and its newer TCP timestamps made the client
drop dst's reply as old (PAWS) until dst's clock caught up, a stall of 1.2 s; with it, src's kernel
drops what comes for the address and cannot send from it (no RST or FIN either when the source is
killed). Once dst runs, the host routes the address there; what the client sent meanwhile its
kernel retransmits, and dst gets it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ferry.criu.binary import find_criu
from ferry.criu.external import external_keys
from ferry.criu.jobdir import JobDir, ShimInfo
from ferry.criu.launch import launch
from ferry.criu.lazy_common import copy_images, ensure_pipe_limits, rebuild_outputs
from ferry.criu.lazy_source import LazySource
from ferry.criu.lazy_target import LazyTarget
from ferry.criu.linux import is_gone, ns_pids
from ferry.criu.runner import CriuRunner, CriuStatus
from tests.integration.criu_helpers import ENV, wait_exit, wait_for
from tests.netns import Node, Nodes, missing_tools

pytestmark = [pytest.mark.criu, pytest.mark.timeout(120)]

PORT = 6379
PAGE_PORT = 7011  # the source's page server, on src's end of the nodes' link
KEYS = 4000
BATCH = 500
SOURCE_ARGS = ("--tcp-established", "--network-lock", "nftables")
"""CRIU's default lock runs the iptables binary; the nftables one is CRIU's own libnftables.
The restore takes the lock method from the images."""
TARGET_ARGS = ("--tcp-established",)
REQUEST_TIMEOUT_S = 20.0
AFTER_MOVE = 300
"""Client rounds after the move before the client stops."""

# -- a RESP client over one socket ------------------------------------------------------------------


class RespError(Exception):
    """An error reply from redis."""


Reply = bytes | int | None | list["Reply"]


def encode(*args: str | bytes) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode() if isinstance(arg, str) else arg
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class Resp:
    """Blocking RESP2 over one TCP connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("redis closed the connection")
        self.buf += chunk

    def _line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            self._fill()
        line, self.buf = self.buf[:end], self.buf[end + 2 :]
        return line

    def read(self) -> Reply:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RespError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self._fill()
            data, self.buf = self.buf[:n], self.buf[n + 2 :]
            return data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise ConnectionError(f"not a RESP reply: {line[:80]!r}")

    def call(self, *args: str | bytes) -> Reply:
        self.sock.sendall(encode(*args))
        return self.read()

    def pipeline(self, commands: list[tuple[str | bytes, ...]]) -> list[Reply]:
        self.sock.sendall(b"".join(encode(*c) for c in commands))
        return [self.read() for _ in commands]


def value_of(i: int) -> bytes:
    """The preloaded value of key ``k:<i>`` (100 bytes, different for every key)."""
    return hashlib.sha256(b"%d" % i).hexdigest().encode() + b"-" * 36


def total_retrans(sock: socket.socket) -> int:
    """tcpi_total_retrans of the socket (struct tcp_info: 8 bytes of u8 fields, then u32s)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int(struct.unpack_from("=I", info, 8 + 23 * 4)[0])


# -- the client that runs through the move ----------------------------------------------------------


@dataclass
class Requests:
    """What the client thread saw. Times are ``time.monotonic()``."""

    rounds: int = 0
    errors: list[str] = field(default_factory=list)
    spans: list[tuple[float, float]] = field(default_factory=list)
    """(sent, answered) of every request."""
    stop_after: int | None = None
    """Set by the test: stop once ``rounds`` reaches it."""
    done: threading.Event = field(default_factory=threading.Event)

    def longest(self) -> tuple[float, float]:
        return max(self.spans, key=lambda s: s[1] - s[0])


def hammer(conn: Resp, seen: Requests) -> None:
    """INCR a counter, SET a key named after the round, GET it back; round after round, until told.

    Any surprise (an error reply, a wrong value, a closed or reset connection, a timeout) ends it."""
    try:
        while seen.stop_after is None or seen.rounds < seen.stop_after:
            i = seen.rounds + 1
            for args, want in (
                (("INCR", "counter"), i),
                (("SET", f"w:{i}", f"written {i}"), b"OK"),
                (("GET", f"w:{i}"), f"written {i}".encode()),
            ):
                t0 = time.monotonic()
                got = conn.call(*args)
                seen.spans.append((t0, time.monotonic()))
                if got != want:
                    seen.errors.append(f"round {i}: {' '.join(args)} answered {got!r}, expected {want!r}")
                    return
            seen.rounds = i
    except (OSError, RespError, ConnectionError) as exc:
        seen.errors.append(f"round {seen.rounds + 1}: {type(exc).__name__}: {exc}")
    finally:
        seen.done.set()


# -- fixtures ---------------------------------------------------------------------------------------


def _sbin_path() -> str:
    return os.pathsep.join([ENV["PATH"], "/usr/local/sbin", "/usr/sbin", "/sbin"])


@pytest.fixture(scope="module")
def criu_status() -> CriuStatus:
    status = CriuRunner().check()
    assert status.ok, f"CRIU is required and not usable: {status.error} (run ./setup.sh)"
    problem = ensure_pipe_limits()
    assert problem is None, problem
    return status


@pytest.fixture(scope="module")
def redis_server(criu_status: CriuStatus) -> str:
    """CRIU with post-copy, ip, nsenter and redis-server: fail (never skip) when one is missing."""
    missing = missing_tools()
    assert not missing, f"{', '.join(missing)} missing: run ./setup.sh (packages iproute2, util-linux)"
    found = shutil.which("redis-server", path=_sbin_path())
    assert found is not None, "redis-server is missing: run ./setup.sh (package redis-server)"
    return found


def _release(text: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", text)
    assert match is not None, text
    return int(match.group(1)), int(match.group(2))


@pytest.fixture(scope="module")
def criu_env(criu_status: CriuStatus) -> dict[str, str]:
    """CRIU 4.1 reads SO_PASSCRED and SO_PASSSEC of every socket it dumps, and Linux 6.16 refuses both
    on sockets that are not AF_UNIX, AF_NETLINK or AF_BLUETOOTH, so it cannot dump a TCP socket there
    ("sockets: Can't get 1:16 opt: Operation not supported"; upstream issue #2705). 4.2 can, and
    ./setup.sh installs it."""
    version = criu_status.version
    assert version is not None
    assert _release(version) >= (4, 2) or _release(os.uname().release) < (6, 16), (
        f"CRIU {version} cannot dump TCP sockets on Linux {os.uname().release}: run ./setup.sh (it builds 4.2)")
    return {}


@pytest.fixture
def nodes() -> Iterator[Nodes]:
    """src and dst, removed at the end with whatever still runs in them."""
    with Nodes() as both:
        yield both


def net_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def connect(nodes: Nodes) -> socket.socket:
    sock = socket.create_connection((nodes.vip, PORT), timeout=REQUEST_TIMEOUT_S,
                                    source_address=(nodes.client_ip, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def connects(nodes: Nodes) -> bool:
    try:
        with contextlib.closing(connect(nodes)):
            return True
    except OSError:
        return False


async def start_redis(redis: str, nodes: Nodes, job: JobDir, tmp_path: Path, pids: list[int]) -> ShimInfo:
    argv = [redis, "--bind", nodes.vip, "--port", str(PORT), "--save", "", "--appendonly", "no",
            "--protected-mode", "no", "--daemonize", "no", "--dir", str(tmp_path)]
    python = nodes.src.wrapper(tmp_path, sys.executable)
    info = await launch(job, argv, cwd=tmp_path, env=ENV, incarnation=1, python=str(python))
    pids.append(info.pid)
    await wait_for("redis-server to listen", lambda: connects(nodes))
    return info


def info_field(conn: Resp, section: str, name: str) -> str:
    text = conn.call("INFO", section)
    assert isinstance(text, bytes)
    for line in text.decode().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value
    raise AssertionError(f"INFO {section} has no {name}")


async def move(
    nodes: Nodes, src_job: JobDir, pid: int, dst_job: JobDir, tmp_path: Path, criu_env: Mapping[str, str]
) -> tuple[ShimInfo, dict[str, float]]:
    """The live move, src to dst, the service address with it. Returns the target and timings
    (``time.monotonic()``, ``*_ms`` in ms)."""
    criu = find_criu("criu")
    assert criu is not None
    src_images, dst_images = tmp_path / "src-images", tmp_path / "dst-images"
    keys = external_keys(pid, [src_job.stdout, src_job.stderr])  # what the freeze names them

    def in_node(node: Node, exe: str, env: Mapping[str, str] | None = None) -> str:
        return str(node.wrapper(tmp_path, exe, env))

    target = LazyTarget(dst_job, dst_images, incarnation=2,
                        inherit={p.name: keys.get(str(p), str(p)) for p in (src_job.stdout, src_job.stderr)},
                        criu_bin=in_node(nodes.dst, criu, criu_env), python=in_node(nodes.dst, sys.executable),
                        extra_args=TARGET_ARGS)
    source = LazySource(src_job, pid, src_images, criu_bin=in_node(nodes.src, criu, criu_env),
                        address=nodes.src.peer_ip, port=PAGE_PORT, extra_args=SOURCE_ARGS)
    await target.arm()
    t = {"fenced": time.monotonic()}
    nodes.drop_vip(nodes.src)
    try:
        frozen = await source.freeze()  # resumes the source when it fails
    except BaseException:
        nodes.add_vip(nodes.src)
        await target.kill()
        raise
    t["frozen"] = time.monotonic()
    try:
        await copy_images(src_images, dst_images)
        rebuild_outputs(src_job, dst_job, frozen.sizes)
        shim = await target.start(frozen.address, frozen.port)
        t["running"] = time.monotonic()
        nodes.route_vip_to(nodes.dst)
        t["routed"] = time.monotonic()
        t["pages"] = float(await target.wait_local(60) or 0)
        t["local"] = time.monotonic()
    except BaseException:
        await target.kill()
        await source.resume()
        nodes.add_vip(nodes.src)
        nodes.route_vip_to(nodes.src)
        raise
    await source.end()
    target.close()
    t["end"] = time.monotonic()
    t["freeze_ms"], t["dump_ms"] = frozen.freeze_ms, frozen.dump_ms
    return shim, t


# -- the test ---------------------------------------------------------------------------------------


async def test_redis_keeps_its_tcp_connection_across_a_live_move(
    redis_server: str, criu_env: dict[str, str], nodes: Nodes, tmp_path: Path, pids: list[int]
) -> None:
    src_job, dst_job = JobDir(tmp_path / "src" / "job"), JobDir(tmp_path / "dst" / "job")
    src = await start_redis(redis_server, nodes, src_job, tmp_path, pids)
    assert net_inode(src.pid) == nodes.src.inode()

    sock = connect(nodes)
    local, peer = sock.getsockname(), sock.getpeername()
    conn = Resp(sock)
    for first in range(0, KEYS, BATCH):
        replies = conn.pipeline([("SET", f"k:{i}", value_of(i)) for i in range(first, first + BATCH)])
        assert replies == [b"OK"] * BATCH
    assert conn.call("DBSIZE") == KEYS
    client_id = conn.call("CLIENT", "ID")
    accepted = info_field(conn, "stats", "total_connections_received")
    retrans = total_retrans(sock)

    seen = Requests()
    thread = threading.Thread(target=hammer, args=(conn, seen), daemon=True)
    thread.start()
    try:
        await wait_for("the client's first rounds", lambda: seen.rounds >= 200 or seen.done.is_set())
        assert not seen.errors, seen.errors
        shim, t = await move(nodes, src_job, src.pid, dst_job, tmp_path, criu_env)
        pids.append(shim.pid)
        seen.stop_after = seen.rounds + AFTER_MOVE
        await wait_for("the client's rounds after the move", seen.done.is_set, timeout_s=60)
    except BaseException:
        seen.stop_after = 0
        raise
    finally:
        thread.join(REQUEST_TIMEOUT_S + 5)
    assert not thread.is_alive()

    # The client saw nothing wrong: every INCR the next number, every GET what its SET wrote.
    assert not seen.errors, seen.errors
    assert seen.rounds == seen.stop_after
    # A request was outstanding when the source froze and answered after it, so by dst: the frozen
    # source has no address to answer from. (dst may answer even before the host routes the address
    # to it: a request that reached the source before the fence is in the restored socket, and dst
    # replies to the client directly.)
    assert any(sent <= t["frozen"] < answered for sent, answered in seen.spans), (
        {k: round((v - t["fenced"]) * 1000) for k, v in t.items() if k not in ("pages", "freeze_ms", "dump_ms")},
        [(round((a - t["fenced"]) * 1000), round((b - t["fenced"]) * 1000)) for a, b in seen.spans if b - a > 0.02],
    )
    sent, answered = seen.longest()
    print(
        f"\nlive move: freeze {t['freeze_ms']:.0f} ms, dst runs {(t['running'] - t['fenced']) * 1000:.0f} ms"
        f" after the fence, {t['pages']:.0f} pages lazily in {(t['local'] - t['running']) * 1000:.0f} ms;"
        f" client: {seen.rounds} rounds, {len(seen.spans)} requests, longest {(answered - sent) * 1000:.0f} ms"
        f" (sent {(sent - t['fenced']) * 1000:+.0f} ms from the fence), {total_retrans(sock) - retrans} retransmits"
    )

    # The same connection, the same redis client at the other end (a reconnect would get a new id).
    assert sock.getsockname() == local and sock.getpeername() == peer
    assert conn.call("CLIENT", "ID") == client_id
    assert info_field(conn, "stats", "total_connections_received") == accepted
    assert conn.call("GET", "counter") == str(seen.rounds).encode()

    # Every key is there: the preloaded ones and every one the client wrote.
    assert conn.call("DBSIZE") == KEYS + 1 + seen.rounds
    for first in range(0, KEYS, BATCH):
        got = conn.pipeline([("GET", f"k:{i}") for i in range(first, first + BATCH)])
        assert got == [value_of(i) for i in range(first, first + BATCH)]
    for first in range(1, seen.rounds + 1, BATCH):
        last = min(first + BATCH, seen.rounds + 1)
        got = conn.pipeline([("GET", f"w:{i}") for i in range(first, last)])
        assert got == [f"written {i}".encode() for i in range(first, last)]

    # redis runs in dst now, as PID 1 of its namespace; nothing of the source is left in src.
    assert shim.pid != src.pid and not is_gone(shim.pid)
    assert net_inode(shim.pid) == nodes.dst.inode()
    nspid = ns_pids(shim.pid)
    assert len(nspid) == 2 and nspid[-1] == 1, nspid
    assert is_gone(src.pid)
    assert (await wait_exit(src_job)).signal == 9
    await wait_for("nothing left running in src", lambda: nodes.src.pids() == [])
    # A new client reaches it at the service address too.
    with contextlib.closing(connect(nodes)) as other:
        assert Resp(other).call("GET", "counter") == str(seen.rounds).encode()
    sock.close()
