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
from ferry.criu.linux import catches_signal, is_gone, ns_pids, process_tree

log = logging.getLogger(__name__)

KILL_WAIT_S = 30.0
"""How long a killed tree is waited for; past it, a process stuck in the kernel is only logged."""


async def kill_tree(pid: int, grace_s: float = 0.0, timeout_s: float = KILL_WAIT_S) -> list[int]:
    """Ends `pid` and its descendants and returns once each has exited (gone or a zombie).

    With `grace_s`, SIGTERM first, and SIGKILL to what is left after that long. A workload is PID 1
    of its own namespace: from outside, the kernel delivers SIGTERM to it only when it handles the
    signal, so without a handler the grace is skipped. Killing a namespace's init kills every
    process in it; a process that is not one is signalled with its process group when it leads one.

    Returns the pids still there `timeout_s` after the SIGKILL ([] when all ended). Each process is
    held by a pidfd opened before any signal, so a pid the kernel hands out again is never
    signalled or waited for.
    """
    try:
        nspids = ns_pids(pid)
        group = os.getpgid(pid) == pid and len(nspids) <= 1
    except (OSError, ValueError):  # gone already
        return []
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
        if grace_s > 0 and held and held[0][0] == pid and _term_reaches(pid, nspids):
            _signal(held[0][1], pid, signal.SIGTERM, group)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):
                    await until_ready(held[0][1])
        for p, fd in held:
            _signal(fd, p, signal.SIGKILL, group and p == pid)
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


def _term_reaches(pid: int, nspids: list[int]) -> bool:
    """Whether SIGTERM sent from outside reaches `pid`: a namespace's init gets it only when it
    handles it (without, there is no grace to wait out)."""
    if len(nspids) <= 1 or nspids[-1] != 1:
        return True
    try:
        return catches_signal(pid, signal.SIGTERM)
    except OSError:  # gone meanwhile
        return False


def _signal(fd: int, pid: int, sig: int, group: bool) -> None:
    """To the process behind `fd`; to the process group `pid` leads too, when `group`."""
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(fd, sig)
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
