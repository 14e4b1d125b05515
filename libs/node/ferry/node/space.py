"""Will a checkpoint fit? Asked before the job is frozen, so a full disk refuses a checkpoint
instead of failing it halfway (and leaving orphans, or a job stopped for nothing).

Worst case, a checkpoint needs the job's memory twice: its images in the scratch folder, and as
many bytes in a local store (chunks compress and deduplicate, so usually far less). A reserve is
kept free on each, for JetStream, logs and the next write.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil

from ferry.common.units import format_bytes


def tree_rss(pid: int) -> int:
    """Resident bytes of the tree rooted at `pid` (shared pages counted once per process: an
    overestimate, the safe side)."""
    total = 0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
    return total


def free_bytes(path: Path) -> int:
    """Free bytes for an unprivileged writer on the filesystem of `path` (or its nearest parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def space_problem(need: int, places: dict[str, Path], reserve: int) -> str | None:
    """Why `need` bytes do not fit in each of `places` (name -> folder) with `reserve` left over; None
    when they do."""
    for name, path in places.items():
        free = free_bytes(path)
        if need + reserve > free:
            return (f"not enough space for the checkpoint: it needs up to {format_bytes(need)} in the {name} "
                    f"({path}), which has {format_bytes(free)} free and keeps {format_bytes(reserve)} in reserve; "
                    "free some space (ferry store verify --repair removes unused chunks) or lower FERRY_DISK_RESERVE")
    return None
