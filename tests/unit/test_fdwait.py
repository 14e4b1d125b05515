"""Waiting on descriptors in the event loop: a pipe drained as its writer writes and closes it, a
full socket written once it drains, a pidfd when its process exits."""

import asyncio
import os
import socket
import subprocess
import sys

from ferry.criu import zygote
from ferry.criu.fdwait import until_ready


def test_a_pipe_is_drained_to_its_end_as_its_writer_writes() -> None:
    async def go() -> bytes:
        r, w = os.pipe()

        def writer() -> None:
            os.write(w, b"one ")
            os.write(w, b"x" * 200_000)
            os.write(w, b" two")
            os.close(w)

        loop = asyncio.get_running_loop()
        writing = loop.run_in_executor(None, writer)
        try:
            out = await zygote._drain(r)
        finally:
            os.close(r)
        await writing
        return out

    out = asyncio.run(go())
    assert out == b"one " + b"x" * 200_000 + b" two"


def test_a_full_socket_is_waited_on_until_the_reader_makes_room() -> None:
    async def go() -> None:
        a, b = socket.socketpair()
        a.setblocking(False)
        try:
            while True:  # fill it
                try:
                    a.send(b"y" * 65536)
                except BlockingIOError:
                    break
            waiting = asyncio.ensure_future(until_ready(a.fileno(), writable=True))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            b.setblocking(False)
            while True:
                try:
                    b.recv(1 << 20)
                except BlockingIOError:
                    break
            await asyncio.wait_for(waiting, 5)
        finally:
            a.close()
            b.close()

    asyncio.run(go())


def test_a_pidfd_is_ready_when_its_process_exits() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    fd = os.pidfd_open(proc.pid)

    async def go() -> None:
        waiting = asyncio.ensure_future(until_ready(fd))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # still running
        await asyncio.wait_for(waiting, 10)

    try:
        asyncio.run(go())
        assert proc.wait(1) == 0
    finally:
        os.close(fd)
