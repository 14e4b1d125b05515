"""Throwaway cgroups for tests of `--here` and `--cgroup` (cgroup v2 where it is mounted, else v1's
memory hierarchy, as on hybrid hosts)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path


def cgroup_root() -> Path:
    """A cgroup hierarchy this host mounts: v2's, else v1's memory controller's."""
    v1: Path | None = None
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, where, kind, options = line.split()[:4]
        if kind == "cgroup2":
            return Path(where)
        if kind == "cgroup" and "memory" in options.split(","):
            v1 = Path(where)
    if v1 is None:
        raise AssertionError("this host mounts no cgroup v2 and no v1 memory hierarchy")
    return v1


def cgroup_of(pid: int, root: Path) -> str:
    """`pid`'s cgroup in the hierarchy mounted at `root`, as a path below it ("/a/b")."""
    v2 = not (root / "memory.limit_in_bytes").exists()
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        if (v2 and hid == "0") or (not v2 and "memory" in controllers.split(",")):
            return path
    raise AssertionError(f"pid {pid} has no cgroup in {root}")


@contextlib.contextmanager
def scratch_cgroup(prefix: str = "ferry-test") -> Iterator[Path]:
    """A new cgroup, removed afterwards (once its processes are gone)."""
    path = cgroup_root() / f"{prefix}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        for _ in range(100):
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.05)
