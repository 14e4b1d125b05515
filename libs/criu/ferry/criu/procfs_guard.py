"""One CRIU dump at a time per working directory on a host, for trees without a /proc of their own.

Ferry's jobs have their own /proc (``linux.mount_own_proc``), so CRIU's parasite opens it directly
and this guard lets their dumps through at once. A tree whose PID namespace sees the host's /proc
(one Ferry did not start) makes the parasite (criu/pie/parasite.c, ``get_proc_fd``) create the
directory ``proc.crtools`` relative to the root task's working directory, mount the namespace's
proc there, detach it and remove the directory. Two dumps of trees that share a working directory
then collide (``Can't create a directory (-17)``), and a directory a killed CRIU left behind fails
every later dump of jobs there. Dumps of such trees take a host-wide lock on their working
directory until CRIU is past that step, and a stale empty ``proc.crtools`` is removed under the
lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_DIR = Path("/run/ferry/criu-cwd")
PARASITE_DIR = "proc.crtools"


def _cwd_of(pid: int) -> str | None:
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None
    return None if cwd.endswith(" (deleted)") else cwd


def remove_stale(cwd: str) -> bool:
    """Removes ``cwd/proc.crtools`` when it is an empty directory and no mount (held under the lock,
    so no CRIU of this host is using it); True when it did."""
    stale = Path(cwd) / PARASITE_DIR
    if not stale.is_dir() or os.path.ismount(stale):
        return False
    try:
        stale.rmdir()
    except OSError:
        return False
    log.warning("removed %s, left by a CRIU dump that did not finish", stale)
    return True


def has_own_proc(pid: int) -> bool:
    """The /proc that `pid` sees is another proc than this process's (its PID namespace's own)."""
    try:
        return os.stat(f"/proc/{pid}/root/proc").st_dev != os.stat("/proc").st_dev
    except OSError:
        return False


@contextlib.asynccontextmanager
async def cwd_dump_lock(pid: int, lock_dir: Path = LOCK_DIR) -> AsyncIterator[None]:
    """Held while CRIU starts dumping the tree of `pid` (see the module's doc)."""
    cwd = None if has_own_proc(pid) else _cwd_of(pid)
    if cwd is None:  # its own /proc, gone, or no working directory left to collide in
        yield
        return
    lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = lock_dir / f"{hashlib.sha256(cwd.encode()).hexdigest()[:24]}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        remove_stale(cwd)
        yield
    finally:
        os.close(fd)  # releases the lock
