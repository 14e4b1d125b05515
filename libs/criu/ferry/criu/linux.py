"""Linux process primitives that Python 3.11's ``os`` lacks (unshare, prctl) and /proc readers."""

from __future__ import annotations

import ctypes
import os
import signal
from functools import cache

import psutil

__all__ = [
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "PR_SET_CHILD_SUBREAPER",
    "catches_signal",
    "is_gone",
    "mount_own_proc",
    "ns_pids",
    "process_tree",
    "reset_signals",
    "set_child_subreaper",
    "unshare",
]

CLONE_NEWPID = 0x20000000
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x2, 0x4, 0x8
MS_REC, MS_PRIVATE = 0x4000, 0x40000
PR_SET_CHILD_SUBREAPER = 36


@cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    """unshare(2). With CLONE_NEWPID the caller's next child is PID 1 of a new PID namespace."""
    _check(_libc().unshare(ctypes.c_int(flags)), "unshare")


def _mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    def enc(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    _check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), None), f"mount {target}")


def mount_own_proc() -> None:
    """For PID 1 of a new PID namespace: a mount namespace of its own, as the host's but private
    (nothing mounted in it reaches the host), with a /proc that shows this PID namespace.

    CRIU then dumps the tree's mounts too; each but that /proc is a copy of a host mount, which
    ``--external mnt[]`` records as external and a restore binds from the same path on its host."""
    unshare(CLONE_NEWNS)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def set_child_subreaper() -> None:
    """prctl(PR_SET_CHILD_SUBREAPER, 1): orphaned descendants are reparented to this process."""
    _check(
        _libc().prctl(
            ctypes.c_int(PR_SET_CHILD_SUBREAPER),
            ctypes.c_ulong(1),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        ),
        "prctl(PR_SET_CHILD_SUBREAPER)",
    )


def reset_signals() -> None:
    """Default dispositions and an empty mask, as a freshly exec'd program expects.

    Python ignores SIGPIPE (and a caller may ignore SIGHUP/SIGINT); ignored signals survive exec.
    """
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _status_fields(pid: int) -> dict[str, str]:
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def ns_pids(pid: int) -> list[int]:
    """``NSpid`` of a process: its PID in each namespace, outermost first."""
    return [int(p) for p in _status_fields(pid).get("NSpid", "").split()]


def catches_signal(pid: int, sig: int) -> bool:
    """Whether the process has a handler for ``sig`` (``SigCgt`` in /proc/<pid>/status)."""
    mask = int(_status_fields(pid).get("SigCgt", "0"), 16)
    return bool(mask & (1 << (sig - 1)))


def is_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs: absent, or a zombie waiting for its reaper."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants, parents first ([] when ``pid`` is gone). For a workload
    that is PID 1 of its own namespace, that is every process of the job."""
    try:
        root = psutil.Process(pid)
        return [pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []
