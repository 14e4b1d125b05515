"""Dumps of trees that share a working directory, all at once, with real CRIU: none collides on the
``proc.crtools`` directory CRIU's parasite makes there for a tree that sees the host's /proc, and a
stale one does not fail them. Ferry's own jobs have a /proc of their own, so CRIU makes no such
directory for them at all; trees another system started (host /proc, own PID namespace) go through
the host-wide lock of ``ferry.criu.procfs_guard``."""

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from ferry.criu.jobdir import JobDir
from ferry.criu.launch import launch
from ferry.criu.procfs_guard import PARASITE_DIR, has_own_proc
from ferry.criu.runner import CriuRunner

pytestmark = [pytest.mark.criu, pytest.mark.timeout(180)]

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
JOBS = 6
LOOP = "while true; do sleep 0.05; done"

# A tree as another system starts one: PID 1 of its own PID namespace, the host's /proc, a session
# of its own, stdio on /dev/null. Prints the tree's host PID.
FOREIGN = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
assert libc.unshare(0x20000000) == 0
pid = os.fork()
if pid == 0:
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, 1024)
    os.execvp("sh", ["sh", "-c", sys.argv[1]])
print(pid, flush=True)
"""


async def dump_all(runner: CriuRunner, pids: list[int], images: Path) -> None:
    for _ in range(2):  # twice: the second round runs where the first left the directory
        results = await asyncio.gather(*(runner.dump(pid, images / f"{i}", leave_running=True)
                                         for i, pid in enumerate(pids)), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        assert not failed, failed[0]


async def test_ferrys_jobs_in_one_working_directory_dump_at_once(tmp_path: Path, criu_ok: CriuRunner,
                                                                 pids: list[int]) -> None:
    shared = tmp_path / "shared-cwd"
    shared.mkdir()
    (shared / PARASITE_DIR).mkdir()  # as a CRIU killed midway leaves it
    for i in range(JOBS):
        info = await launch(JobDir(tmp_path / f"job-{i}"), ["sh", "-c", LOOP], cwd=shared, env=ENV, incarnation=1)
        pids.append(info.pid)
        assert has_own_proc(info.pid)
    await dump_all(criu_ok, list(pids), tmp_path / "images")
    assert (shared / PARASITE_DIR).is_dir() and not any((shared / PARASITE_DIR).iterdir()), \
        "CRIU used the working directory of a job that has its own /proc"


async def test_foreign_trees_in_one_working_directory_dump_at_once(tmp_path: Path, criu_ok: CriuRunner,
                                                                   pids: list[int]) -> None:
    shared = tmp_path / "shared-cwd"
    shared.mkdir()
    (shared / PARASITE_DIR).mkdir()
    for _ in range(JOBS):
        starter = await asyncio.create_subprocess_exec(sys.executable, "-c", FOREIGN, LOOP, cwd=shared,
                                                       stdout=asyncio.subprocess.PIPE)
        out, _ = await starter.communicate()
        assert starter.returncode == 0
        pids.append(int(out))
    deadline = time.monotonic() + 10
    while any(os.readlink(f"/proc/{pid}/exe").endswith("python3") for pid in pids if os.path.exists(f"/proc/{pid}")):
        assert time.monotonic() < deadline, "the trees did not exec"
        await asyncio.sleep(0.05)
    assert not any(has_own_proc(pid) for pid in pids)
    await dump_all(criu_ok, list(pids), tmp_path / "images")
    assert not (shared / PARASITE_DIR).exists()  # the stale one, removed under the lock
