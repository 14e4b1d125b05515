"""Waiting for a descriptor in the event loop (a pipe, a socket, a pidfd), not in a thread."""

from __future__ import annotations

import asyncio


async def until_ready(fd: int, *, writable: bool = False) -> None:
    """Returns once `fd` is readable (a pidfd: its process exited), or writable if asked."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    if writable:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        if writable:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)
