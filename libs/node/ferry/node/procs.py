"""Small helpers over /proc for a workload's process tree."""

import contextlib
import os
import signal
import time
from pathlib import Path

import psutil

from ferry.criu.jobdir import JobDir
from ferry.criu.linux import is_gone, process_tree


def alive(pid: int) -> bool:
    """`pid` runs (it exists and is not a zombie)."""
    return not is_gone(pid)


def tree(pid: int) -> list[int]:
    """`pid` and all its descendants, parents first (``ferry.criu.linux.process_tree``)."""
    return process_tree(pid) or [pid]


def signal_tree(pid: int, sig: signal.Signals) -> None:
    for p in tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


def dumps_of(pid: int) -> list[psutil.Process]:
    """The `criu dump` processes working on the tree rooted at `pid` (``criu dump -t PID``)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        argv = proc.info["cmdline"] or []
        if proc.info["name"] != "criu" or "dump" not in argv:
            continue
        with contextlib.suppress(ValueError, IndexError):
            if argv[argv.index("-t") + 1] == str(pid):
                found.append(proc)
    return found


def wait_for_dumps_of(pid: int, timeout_s: float) -> bool:
    """Waits until no CRIU dumps the tree of `pid` (one a dead predecessor started, say); False if
    one still runs after `timeout_s`."""
    _, still = psutil.wait_procs(dumps_of(pid), timeout=timeout_s)
    return not still


def restores_of(job_dir: Path, incarnation: int) -> list[psutil.Process]:
    """The shims restoring incarnation `incarnation` of the job in `job_dir` (started by a node
    service that may be gone: they outlive it), by their command line: ``python -m ferry.criu.shim
    restore --job-dir DIR --incarnation N ...``, as a new interpreter has it and as a fork of the
    node's zygote shows it (its title: one string, which psutil splits at spaces)."""
    wants = (f" --job-dir {job_dir} ", f" --incarnation {incarnation} ")  # a path with spaces stays whole
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if "ferry.criu.shim" in argv and "restore" in argv and all(w in f" {' '.join(argv)} " for w in wants):
            found.append(proc)
    return found


def wait_for_restores_of(job_dir: Path, incarnation: int, timeout_s: float) -> bool:
    """Waits until such a restore ended: it succeeded (its monitor wrote shim.json and stays to
    supervise the workload) or failed (no such shim is left); False if it still runs after
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not _restored(job_dir, incarnation) and restores_of(job_dir, incarnation):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _restored(job_dir: Path, incarnation: int) -> bool:
    """Whether the shim of `incarnation` has written its shim.json (an older run's does not count)."""
    shim = JobDir(job_dir).read_shim()
    return shim is not None and shim.incarnation == incarnation
