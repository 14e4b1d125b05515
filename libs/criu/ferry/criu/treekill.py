"""Ending a process tree for good, and knowing when it has ended.

A SIGKILLed process is not gone when `kill` returns: the kernel still tears down its memory (about
40 ms for 1 GiB here), its sockets and its devices. Whoever then says "the job is stopped" (a final
checkpoint, a gang's release) lets the scheduler start it elsewhere, or on this node, where a port
or a GPU it held may still be taken. So the tree is waited for until each process has exited: a
zombie has released all that and can never run again, so it counts as ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

from ferry.criu.fdwait import until_ready
from ferry.criu.linux import is_gone, process_tree

log = logging.getLogger(__name__)

KILL_WAIT_S = 30.0
"""How long a killed tree is waited for; past it, a process stuck in the kernel is only logged."""


async def kill_tree(pid: int, timeout_s: float = KILL_WAIT_S) -> list[int]:
    """SIGKILLs `pid` and its descendants and returns once each has exited (gone or a zombie).

    Returns the pids still there after `timeout_s` ([] when all ended). Each process is held by a
    pidfd opened before the signal, so a pid the kernel hands out again is never signalled or
    waited for.
    """
    held: list[tuple[int, int]] = []
    for p in process_tree(pid) or [pid]:
        try:
            held.append((p, os.pidfd_open(p)))
        except ProcessLookupError:
            continue
        except OSError as exc:  # out of descriptors, say: it is still killed, only not waited for
            log.warning("pid %d: no pidfd (%s); killed without waiting", p, exc)
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
    try:
        for _, fd in held:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        try:
            async with asyncio.timeout(timeout_s):
                for _, fd in held:
                    await until_ready(fd)  # a pidfd turns readable when its process exits
        except TimeoutError:
            left = [p for p, _ in held if not is_gone(p)]
            log.error("pids %s did not end %.0f s after SIGKILL", left, timeout_s)
            return left
        return []
    finally:
        for _, fd in held:
            os.close(fd)
