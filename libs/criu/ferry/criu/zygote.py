"""The shim's zygote: a process that has imported ``ferry.criu.shim`` once and forks a starter for
every launch or adoption, instead of a new Python interpreter for each (about 0.2 CPU-s of imports
and 20 MiB of private memory per job; a fork of the zygote costs a few milliseconds, and the
monitor that stays for the job's life shares the zygote's pages). Restores go through it too (the
migrator's): each fork takes the command line a new interpreter would have (its process title), by
which a node service that restarts finds a restore still under way (``ferry.node.procs.restores_of``).

    python -m ferry.criu.zygote_server --socket PATH

The node's checkpointer starts it (``ZygoteProcess``) and it ends with the checkpointer (the
parent-death signal); the monitors it forked do not: they are detached (``shim.detach``) and
outlive both, as before. Where it is not running, ``ferry.criu.launch`` starts ``python -m
ferry.criu.shim`` as it always did.

Protocol, one request per connection on a unix socket (mode 0600, and only this user's peers):
the client sends one JSON object ``{"argv": [...]}`` with three descriptors (SCM_RIGHTS: the
starter's stdin, stdout and stderr); the zygote forks a starter, which runs ``shim.main(argv)``
with those as 0, 1 and 2, answers ``{"pid": N}`` at once, and ``{"exit": CODE}`` (a signal: ``128 +
signal``) when the starter ended. The client reads the starter's output from its own pipes, as
it would from a child's.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ferry.criu.fdwait import until_ready

FDS = 3  # the starter's stdin, stdout and stderr
EXIT_WORD_S = 2.0  # how long the zygote may take to report a starter that closed its output


# -- the client --------------------------------------------------------------------------------


class ZygoteClient:
    """Starts a shim through the zygote at ``path``; ``run`` answers as a finished child would."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def available(self) -> bool:
        return self.path.exists()

    async def run(self, argv: Sequence[str], timeout_s: float) -> tuple[int, bytes, bytes]:
        """(exit code, stdout, stderr) of the shim started with ``argv`` (without ``python -m
        ferry.criu.shim``). OSError when the zygote cannot be reached or refuses, before any starter
        was forked (the caller then spawns the shim itself); a zygote that ends after it forked
        the starter, or is paused, is not an error: the starter's own output tells how it ended.
        TimeoutError after ``timeout_s``, with the starter killed, as is a starter whose caller is
        cancelled."""
        loop = asyncio.get_running_loop()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.setblocking(False)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY)
        starter = 0
        try:
            await loop.sock_connect(conn, str(self.path))
            payload = json.dumps({"argv": list(argv)}).encode() + b"\n"
            await _send_with_fds(loop, conn, payload, [devnull, out_w, err_w])
            for fd in (devnull, out_w, err_w):
                os.close(fd)
            devnull = out_w = err_w = -1
            reader = _Lines(loop, conn)
            async with asyncio.timeout(timeout_s):
                first = await reader.next()
                if "pid" not in first:
                    raise OSError(f"the zygote refused: {first.get('error', first)}")
                starter = int(str(first["pid"]))
                # The starter's result is on the pipes it writes to; the zygote's word of its exit
                # only confirms it. A zygote that ended after the fork (it dies with the node's
                # checkpointer) or is paused must not make the caller start a second shim beside a
                # starter that goes on, nor kill that starter: the job would run twice, or be
                # restored here while the caller reports a failure.
                out, err = await asyncio.gather(_drain(out_r), _drain(err_r))
                starter = 0
            try:
                async with asyncio.timeout(EXIT_WORD_S):
                    return int(str((await reader.next()).get("exit", 1))), out, err
            except (OSError, TimeoutError):  # a detached shim prints its reply only when it succeeded
                return (0 if out.strip() else 1), out, err
        except BaseException:
            if starter:
                with contextlib.suppress(OSError):
                    os.kill(starter, signal.SIGKILL)
            raise
        finally:
            conn.close()
            for fd in (devnull, out_w, err_w, out_r, err_r):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)


class _Lines:
    def __init__(self, loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
        self.loop, self.conn, self.buf = loop, conn, b""

    async def next(self) -> dict[str, object]:
        while b"\n" not in self.buf:
            chunk = await self.loop.sock_recv(self.conn, 65536)
            if not chunk:
                raise OSError("the zygote closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        doc = json.loads(line)
        if not isinstance(doc, dict):
            raise OSError(f"the zygote answered {line[:100]!r}")
        return doc


async def _send_with_fds(loop: asyncio.AbstractEventLoop, conn: socket.socket, payload: bytes,
                         fds: Sequence[int]) -> None:
    """``payload`` on the non-blocking ``conn``, the descriptors with its first byte, waiting
    in the loop (not a thread) while the socket is full."""
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
    while True:
        try:
            sent = conn.sendmsg([payload], rights)
            break
        except (BlockingIOError, InterruptedError):
            await until_ready(conn.fileno(), writable=True)
    if sent < len(payload):
        await loop.sock_sendall(conn, payload[sent:])


async def _drain(fd: int) -> bytes:
    """Everything written to the pipe ``fd`` until its last writer closes it, read in the loop as
    it comes (a thread per pipe cost more than the launch's other work in the node service)."""
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, InterruptedError):
            await until_ready(fd)
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


# -- the process -------------------------------------------------------------------------------


class ZygoteProcess:
    """The zygote as a child of the node's checkpointer (it dies with it)."""

    def __init__(self, path: Path, python: str = sys.executable) -> None:
        self.path = path
        self.python = python
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        r, w = os.pipe()
        try:
            self.proc = subprocess.Popen([self.python, "-m", "ferry.criu.zygote_server", "--socket", str(self.path),
                                          "--ready-fd", str(w)], pass_fds=(w,), stdin=subprocess.DEVNULL)
            os.close(w)
            w = -1
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                ready, _, _ = select.select([r], [], [], 0.2)
                if ready and os.read(r, 64):
                    return
                if self.proc.poll() is not None:
                    break
            raise OSError(f"the shim zygote did not start (exit {self.proc.poll()})")
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.path.unlink(missing_ok=True)
