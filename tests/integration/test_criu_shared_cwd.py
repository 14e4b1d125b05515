"""Dumps of jobs that share a working directory, all at once, with real CRIU: none collides on the
``proc.crtools`` directory CRIU's parasite makes there, and a stale one does not fail them."""

import asyncio
from pathlib import Path

import pytest

from ferry.criu.jobdir import JobDir
from ferry.criu.launch import launch
from ferry.criu.procfs_guard import PARASITE_DIR
from ferry.criu.runner import CriuRunner

pytestmark = [pytest.mark.criu, pytest.mark.timeout(180)]

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
JOBS = 6


async def test_concurrent_dumps_in_one_working_directory_all_succeed(tmp_path: Path, criu_ok: CriuRunner,
                                                                      pids: list[int]) -> None:
    shared = tmp_path / "shared-cwd"
    shared.mkdir()
    (shared / PARASITE_DIR).mkdir()  # as a CRIU killed midway leaves it
    infos = []
    for i in range(JOBS):
        info = await launch(JobDir(tmp_path / f"job-{i}"), ["sh", "-c", "while true; do sleep 0.05; done"],
                            cwd=shared, env=ENV, incarnation=1)
        pids.append(info.pid)
        infos.append(info)

    async def dump(i: int) -> None:
        await criu_ok.dump(infos[i].pid, tmp_path / f"images-{i}", leave_running=True)

    for _ in range(2):  # twice: the second round runs where the first left the directory
        results = await asyncio.gather(*(dump(i) for i in range(JOBS)), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        assert not failed, failed[0]
    assert not (shared / PARASITE_DIR).exists()
