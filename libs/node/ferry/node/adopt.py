"""What `ferry adopt PID` may take into Ferry's care, checked before anything starts.

Adopting leaves the tree where it runs (its cgroup, its parent, its session): Ferry watches it,
checkpoints it (CRIU with ``--shell-job``, since its session leader may be its supervisor) and
reports its end. Refused, each with its reason:
- PID 0 or 1, a process that does not exist, has ended, or is a kernel thread;
- Ferry's own: the caller and its parents, a node service, a shim, a Ferry job or anything below
  one (that is checkpointed as a job already);
- a process that shares a PID namespace with processes outside its tree: CRIU dumps a PID
  namespace whole, from its init, so only that init can be adopted.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

import psutil

from ferry.criu.linux import ns_pids

__all__ = ["adopt_problem", "cgroup_problem", "is_ferry_process", "stdio_pipes"]

_FERRY_MODULES = ("ferry.criu.shim", "ferry.criu.zygote_server", "ferry.scheduler", "ferry.checkpointer",
                  "ferry.migrator", "ferry.health", "ferry.pricing", "ferry.autoscaler", "ferry.api", "ferry.cli",
                  "ferry.sim")


def is_ferry_process(argv: list[str]) -> bool:
    """A Ferry service, shim or CLI, by its command line."""
    if any(arg in _FERRY_MODULES or arg.startswith(tuple(m + "." for m in _FERRY_MODULES)) for arg in argv[:4]):
        return True
    return any(os.path.basename(arg) == "ferry" for arg in argv[:2])


def adopt_problem(pid: int, *, ours: Collection[int] = (), callers: Collection[int] = ()) -> str | None:
    """Why the process `pid` cannot be adopted, or None. `ours`: PIDs whose trees are Ferry's (the
    node's jobs); `callers`: the asking process and its parents (a dump of one would take the
    asker along)."""
    if pid <= 1:
        return f"PID {pid} is not a workload (1 is this machine's init): name the process to adopt"
    if pid in callers:
        return f"process {pid} is this command or one of its parents"
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return f"process {pid} has already ended"
        if not proc.cmdline():
            return f"process {pid} is a kernel thread"
        chain = [proc, *proc.parents()]
        for p in chain:
            if p.pid in ours or is_ferry_process(p.cmdline()):
                what = "itself" if p.pid == pid else f"below {p.pid} ({' '.join(p.cmdline()[:3])})"
                return f"process {pid} is Ferry's own ({what}): Ferry already runs it or runs in it"
        spaces = ns_pids(pid)
    except psutil.NoSuchProcess:
        return f"no process {pid} on this machine (`ferry adopt` runs on the process's node)"
    except (psutil.AccessDenied, OSError) as exc:
        return f"cannot inspect process {pid}: {exc}"
    if len(spaces) > 1 and spaces[-1] != 1:
        return (f"process {pid} shares a PID namespace with processes outside its tree (it is PID {spaces[-1]} "
                f"there): CRIU dumps a PID namespace whole, so adopt that namespace's init")
    return None


def cgroup_problem(pid: int, cgroup: str) -> str | None:
    """Why `cgroup` (a folder with cgroup.procs, a SLURM step's say) is not exactly the tree of
    `pid`, or None: a dump takes the tree, so a process of the cgroup outside it would be left
    behind, and `pid` must be in it."""
    try:
        members = {int(p) for p in Path(cgroup, "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return f"--cgroup {cgroup}: not a cgroup (no readable cgroup.procs)"
    if pid not in members:
        return f"process {pid} is not in the cgroup {cgroup}"
    try:
        tree = {pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))}
    except psutil.NoSuchProcess:
        return f"no process {pid} on this machine"
    outside = sorted(members - tree)
    if outside:
        return (f"the cgroup {cgroup} holds processes outside the tree of {pid} ({', '.join(map(str, outside[:5]))}): "
                f"a checkpoint would leave them behind; adopt their common ancestor")
    return None


def stdio_pipes(pid: int) -> dict[str, str]:
    """Which of the process's stdout and stderr are pipes, as CRIU names them ("pipe:[INODE]"):
    a restore hands the job's output files to those (the pipe's reader stays behind)."""
    found = {}
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("pipe:["):
            found[name] = target
    return found
