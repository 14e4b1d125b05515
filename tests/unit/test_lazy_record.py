"""A post-copy target whose starter died: the record it left, and how a successor finishes or undoes
it. A stand-in for ``criu lazy-pages`` (it writes its status byte, then exits with a given code
after a while) runs under the same exit-recording shell, in its own session, as the real one."""

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ferry.criu.jobdir import JobDir, ShimInfo
from ferry.criu.lazy_common import CriuProcess, LiveMoveFailed
from ferry.criu.lazy_record import RECORD_FILE, LiveTargetRecord, OrphanTarget, process_start_time, write_record

FAKE_DAEMON = ("import os, sys, time; os.write(int(sys.argv[-1]), b'\\0'); time.sleep(float(sys.argv[2])); "
               "sys.exit(int(sys.argv[1]))")


async def start_daemon(tmp_path: Path, code: int, seconds: float) -> CriuProcess:
    log = tmp_path / "lazy-pages.log"
    log.write_text("(00.1) UFFD transferred pages: (7/9)\n(00.2) UFFD transferred pages: (3/3)\n")
    daemon = CriuProcess("fake lazy-pages", log, exit_file=tmp_path / "lazy-pages-2.rc")
    assert await daemon.start([sys.executable, "-c", FAKE_DAEMON, str(code), str(seconds)], 10)
    return daemon


def a_target(tmp_path: Path, incarnation: int = 2) -> tuple[JobDir, subprocess.Popen[bytes]]:
    jd = JobDir(tmp_path / "job").create()
    workload = subprocess.Popen(["sleep", "60"], start_new_session=True)
    jd.write_shim(ShimInfo(shim_pid=workload.pid, pid=workload.pid, incarnation=incarnation, started=time.time(),
                           mode="restore"))
    return jd, workload


def record_of(daemon: CriuProcess, jd: JobDir, tmp_path: Path, workload: subprocess.Popen[bytes]) -> OrphanTarget:
    assert daemon.pid is not None and daemon.exit_file is not None
    record = LiveTargetRecord(incarnation=2, op="op-1", lazy_pid=daemon.pid,
                              lazy_started=process_start_time(daemon.pid) or 0.0, exit_file=str(daemon.exit_file),
                              log_file=str(daemon.log_path), images=str(tmp_path / "images"),
                              shim_pid=workload.pid, running_at=time.time())
    write_record(jd, record)
    orphan = OrphanTarget.find(jd)
    assert orphan is not None and orphan.record == record
    return orphan


def gone(p: subprocess.Popen[bytes]) -> bool:
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_the_exit_file_holds_the_daemons_status(tmp_path: Path) -> None:
    async def go() -> tuple[int, str]:
        daemon = await start_daemon(tmp_path, 3, 0.1)
        rc = await daemon.wait(10)
        daemon.close()
        assert daemon.exit_file is not None
        return rc, daemon.exit_file.read_text().strip()

    assert asyncio.run(go()) == (3, "3")


def test_a_successor_waits_for_the_daemon_and_finds_every_page_here(tmp_path: Path) -> None:
    jd, workload = a_target(tmp_path)

    async def go() -> tuple[int | None, OrphanTarget]:
        daemon = await start_daemon(tmp_path, 0, 0.5)
        orphan = record_of(daemon, jd, tmp_path, workload)
        assert orphan.daemon_running()
        pages = await orphan.wait_local(10)
        daemon.close()
        return pages, orphan

    try:
        pages, orphan = asyncio.run(go())
        assert pages == 10  # from the daemon's log
        assert orphan.local_at is not None and workload.poll() is None  # the target runs on
        orphan.forget()
        assert not (jd.path / RECORD_FILE).exists()
    finally:
        workload.kill()


@pytest.mark.parametrize("how", ["failed", "killed"])
def test_a_daemon_that_failed_or_died_means_the_target_is_killed(tmp_path: Path, how: str) -> None:
    jd, workload = a_target(tmp_path)

    async def go() -> str:
        daemon = await start_daemon(tmp_path, 1 if how == "failed" else 0, 0.3 if how == "failed" else 30)
        orphan = record_of(daemon, jd, tmp_path, workload)
        if how == "killed":  # as when it died with the migrator's process group
            assert daemon.pid is not None
            os.killpg(daemon.pid, signal.SIGKILL)
        with pytest.raises(LiveMoveFailed) as failed:
            await orphan.wait_local(10)
        daemon.close()
        assert failed.value.target_killed and not failed.value.source_running
        return str(failed.value)

    try:
        message = asyncio.run(go())
        assert ("exit 1" in message) if how == "failed" else ("without an exit status" in message)
        assert gone(workload), "the target copy was left running"
    finally:
        workload.kill()


def test_a_daemon_that_outlasts_the_wait_is_killed_with_the_target(tmp_path: Path) -> None:
    jd, workload = a_target(tmp_path)

    async def go() -> int:
        daemon = await start_daemon(tmp_path, 0, 30)
        orphan = record_of(daemon, jd, tmp_path, workload)
        with pytest.raises(LiveMoveFailed, match="did not reach the target"):
            await orphan.wait_local(0.3)
        assert not orphan.daemon_running()
        return await daemon.wait(5)

    try:
        assert asyncio.run(go()) == -signal.SIGKILL  # the shell was killed, not left to finish
        assert gone(workload)
    finally:
        workload.kill()


def test_a_target_of_another_incarnation_is_not_touched(tmp_path: Path) -> None:
    jd, workload = a_target(tmp_path, incarnation=3)  # a newer run of the job lives here now

    async def go() -> None:
        daemon = await start_daemon(tmp_path, 0, 0.1)
        orphan = record_of(daemon, jd, tmp_path, workload)
        with pytest.raises(LiveMoveFailed, match="target copy is gone"):
            await orphan.wait_local(10)
        daemon.close()

    try:
        asyncio.run(go())
        assert workload.poll() is None
    finally:
        workload.kill()


def test_no_record_or_a_garbled_one_is_no_orphan(tmp_path: Path) -> None:
    jd = JobDir(tmp_path / "job").create()
    assert OrphanTarget.find(jd) is None
    (jd.path / RECORD_FILE).write_text("{not json")
    assert OrphanTarget.find(jd) is None


def test_a_process_that_ended_but_was_not_reaped_counts_as_ended() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert process_start_time(child.pid) is not None
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process_start_time(child.pid) is None  # a zombie: its parent (this test) has not reaped it yet
    finally:
        child.kill()
        child.wait()
