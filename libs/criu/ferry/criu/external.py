"""A job's output files as CRIU external files, so that they cross mount namespaces.

A job runs in a mount namespace of its own (``linux.mount_own_proc``). The files it writes its
stdout and stderr to are opened by Ferry: by the job's PID 1 in that namespace at launch, but on a
restore by the shim, in the node's namespace, and handed to CRIU (``--inherit-fd``). Such a file
sits on a mount of the node's namespace that the restored job's namespace does not contain, and
the next dump failed (``Can't lookup mount=27 for fd=1``). So every dump names the output files
external by CRIU's key for them, ``file[<mnt_id>:<inode>]`` (hex, from the root task's fds), and
every restore hands the node's copy of each file to CRIU under that key: CRIU neither looks the
file up nor reopens it, in either namespace.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["dump_args", "external_keys", "is_external_key"]


def _mnt_id(pid: int, fd: str) -> int | None:
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def external_keys(pid: int, files: Sequence[Path]) -> dict[str, str]:
    """CRIU's external key of each of `files` that task `pid` has open, by the file's path."""
    wanted: dict[tuple[int, int], str] = {}
    for file in files:
        try:
            st = os.stat(file)
        except OSError:
            continue
        wanted[(st.st_dev, st.st_ino)] = str(file)
    keys: dict[str, str] = {}
    try:
        fds = sorted(os.listdir(f"/proc/{pid}/fd"), key=lambda s: int(s) if s.isdigit() else 1 << 30)
    except OSError:
        return keys
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        path = wanted.get((st.st_dev, st.st_ino))
        mnt = _mnt_id(pid, fd) if path is not None and path not in keys else None
        if path is not None and mnt is not None:
            keys[path] = f"file[{mnt:x}:{st.st_ino:x}]"
    return keys


def dump_args(keys: Mapping[str, str]) -> list[str]:
    args: list[str] = []
    for key in sorted(set(keys.values())):
        args += ["--external", key]
    return args


def is_external_key(name: str) -> bool:
    """A name CRIU's --inherit-fd takes as is: an external file's key, or a pipe ("pipe:[INODE]",
    the stdout of an adopted process that wrote to its supervisor)."""
    return (name.startswith("file[") or name.startswith("pipe:[")) and name.endswith("]")
