"""The shim's zygote (ferry.criu.zygote): a launch through it runs the workload exactly as a
launch through a new interpreter does (environment, stdio, no descriptor leaked, the exit
recorded), refusals come back the same way, the job outlives the zygote, and without a zygote the shim is
started as before. A restore through it continues the job, and its shim shows the command line
by which a restarted node service finds a restore under way."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from ferry.criu.errors import LaunchFailed
from ferry.criu.jobdir import JobDir
from ferry.criu.launch import launch, restore
from ferry.criu.linux import is_gone
from ferry.criu.runner import CriuRunner
from ferry.criu.zygote import ZygoteClient, ZygoteProcess
from ferry.node.procs import restores_of
from tests.integration.criu_helpers import COUNTER, ENV, wait_exit, wait_for
from tests.integration.test_criu_migrate import checkpoint_and_kill, lines_in, rebuild

BIG_COUNTER = ("import sys, time\nheld = bytearray(256 << 20)\nfor i in range(0, len(held), 4096): held[i] = 1\n"
               "i = 0\nwhile True:\n    print(i, flush=True)\n    i += 1\n    time.sleep(0.01)\n")

pytestmark = [pytest.mark.usefixtures("criu_ok"), pytest.mark.criu, pytest.mark.timeout(90)]


@pytest.fixture
def zygote(tmp_path: Path) -> Iterator[tuple[ZygoteProcess, ZygoteClient]]:
    proc = ZygoteProcess(tmp_path / "zygote.sock")
    proc.start()
    yield proc, ZygoteClient(proc.path)
    proc.stop()


async def test_a_launch_through_the_zygote_is_a_launch(tmp_path: Path,
                                                       zygote: tuple[ZygoteProcess, ZygoteClient]) -> None:
    proc, client = zygote
    assert oct(proc.path.stat().st_mode & 0o777) == "0o600"
    job = JobDir(tmp_path / "job")
    script = 'env | sort; ls -l /proc/self/fd/ | grep -c -- "->"; read x || echo eof; echo oops >&2; exit 3'
    info = await launch(job, ["sh", "-c", script], cwd=tmp_path, env={**ENV, "FOO": "a b"}, incarnation=2,
                        zygote=client)
    assert proc.proc is not None
    # forked by the zygote, then detached: neither the zygote nor us is its parent
    assert info.shim_pid != proc.proc.pid and os.getsid(info.shim_pid) != os.getsid(proc.proc.pid)
    ended = await wait_exit(job)
    assert (ended.code, ended.incarnation) == (3, 2)
    lines = job.stdout.read_text().splitlines()
    assert [line for line in lines if "=" in line and not line.startswith("PWD=")] == ["FOO=a b", "PATH=/usr/bin:/bin"]
    assert "4" in lines and "eof" in lines  # 0, 1, 2 and ls's own: no descriptor of the zygote's leaked
    assert job.stderr.read_text() == "oops\n"


async def test_refusals_come_back_and_the_job_outlives_the_zygote(
        tmp_path: Path, zygote: tuple[ZygoteProcess, ZygoteClient]) -> None:
    proc, client = zygote
    with pytest.raises(LaunchFailed, match="no-such-command"):
        await launch(JobDir(tmp_path / "bad"), ["no-such-command"], cwd=None, env=ENV, incarnation=1, zygote=client)
    job = JobDir(tmp_path / "job")
    info = await launch(job, ["sh", "-c", "echo up; sleep 2; echo done"], cwd=None, env=ENV, incarnation=1,
                        zygote=client)
    assert proc.proc is not None
    os.kill(proc.proc.pid, signal.SIGKILL)  # the zygote dies: the job and its monitor do not
    proc.proc.wait()
    assert (await wait_exit(job)).code == 0 and job.stdout.read_text() == "up\ndone\n"
    await wait_for("the monitor to exit", lambda: is_gone(info.shim_pid))
    # the socket is left behind by a killed zygote: the next launch starts the shim itself
    again = JobDir(tmp_path / "again")
    await launch(again, ["sh", "-c", "echo fallback"], cwd=None, env=ENV, incarnation=1, zygote=client)
    assert (await wait_exit(again)).code == 0 and again.stdout.read_text() == "fallback\n"


async def test_a_restore_through_the_zygote_continues_the_job_and_is_found_by_its_command_line(
        tmp_path: Path, criu_ok: CriuRunner, pids: list[int], zygote: tuple[ZygoteProcess, ZygoteClient]) -> None:
    proc, client = zygote
    src = JobDir(tmp_path / "a")
    info = await launch(src, ["sh", "-c", COUNTER], cwd=tmp_path, env=ENV, incarnation=1, zygote=client)
    pids.append(info.pid)
    await wait_for("some output", lambda: len(lines_in(src.stdout)) >= 5)
    dumped = await checkpoint_and_kill(criu_ok, src, info.pid, tmp_path / "images")
    seen = len(lines_in(src.stdout))
    dst = JobDir(tmp_path / "b")
    restored = await restore(dst, tmp_path / "images", inherit=rebuild(src, dst, dumped), incarnation=2,
                             zygote=client)
    pids.append(restored.pid)
    assert proc.proc is not None and restored.shim_pid != proc.proc.pid
    # the monitor is a fork of the zygote (no new interpreter), and shows the restore's command line
    assert psutil.Process(restored.shim_pid).exe() == psutil.Process(proc.proc.pid).exe()
    assert [p.pid for p in restores_of(dst.path, 2)] == [restored.shim_pid]
    assert restores_of(dst.path, 1) == [] and restores_of(src.path, 2) == []
    await wait_for("output after the restore", lambda: len(lines_in(dst.stdout)) >= seen + 3)
    os.kill(restored.pid, signal.SIGKILL)
    ended = await wait_exit(dst)
    assert (ended.signal, ended.incarnation) == (9, 2)
    await wait_for("the monitor to exit", lambda: is_gone(restored.shim_pid))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "paused"])
async def test_a_zygote_killed_or_paused_during_a_restore_leaves_one_restore_that_the_caller_still_gets(
        tmp_path: Path, criu_ok: CriuRunner, pids: list[int], zygote: tuple[ZygoteProcess, ZygoteClient],
        sig: signal.Signals) -> None:
    """The zygote dies with the node's checkpointer, which the migrator's restore does not: the
    restore it forked goes on, and the caller must neither start a second one nor lose the first,
    nor wait on a paused zygote until its timeout kills a starter whose restore went well."""
    proc, client = zygote
    assert proc.proc is not None
    src = JobDir(tmp_path / "a")
    # 256 MiB to restore: the zygote is killed while CRIU is at it
    info = await launch(src, [sys.executable, "-c", BIG_COUNTER], cwd=tmp_path, env=ENV, incarnation=1,
                        zygote=client)
    pids.append(info.pid)
    await wait_for("some output", lambda: len(lines_in(src.stdout)) >= 5)
    dumped = await checkpoint_and_kill(criu_ok, src, info.pid, tmp_path / "images")
    dst = JobDir(tmp_path / "b")
    restoring = asyncio.create_task(restore(dst, tmp_path / "images", inherit=rebuild(src, dst, dumped),
                                            incarnation=2, zygote=client))
    while not (dst.shim_log.exists() and "running" in dst.shim_log.read_text()):  # CRIU runs
        assert not restoring.done(), "the restore ended before CRIU was seen running"
        await asyncio.sleep(0.001)
    os.kill(proc.proc.pid, sig)
    try:
        restored = await asyncio.wait_for(restoring, 20)  # well within the restore's own timeout
    finally:
        os.kill(proc.proc.pid, signal.SIGCONT)
    pids.append(restored.pid)
    assert [p.pid for p in restores_of(dst.path, 2)] == [restored.shim_pid]
    assert dst.shim_log.read_text().count("criu restore exited") == 1  # CRIU ran once: no second shim
    seen = len(lines_in(dst.stdout))
    await wait_for("output after the restore", lambda: len(lines_in(dst.stdout)) >= seen + 3)
    os.kill(restored.pid, signal.SIGKILL)
    assert (await wait_exit(dst)).incarnation == 2
