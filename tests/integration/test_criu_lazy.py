"""Real CRIU post-copy: a live move of a running memhog from one job directory to another.

The workload is examples/memhog.py (64 MiB, a round every 0.05 s), run under a tiny wrapper that
also writes a heartbeat line to stderr every 10 ms, so that the downtime measured from its output
is the time it did not run rather than the time until its next round.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from ferry.criu.jobdir import ExitInfo, JobDir
from ferry.criu.launch import launch
from ferry.criu.lazy import LiveMove, LiveMoveFailed, copy_images, ensure_pipe_limits
from ferry.criu.linux import is_gone, ns_pids
from ferry.criu.runner import CriuRunner
from ferry.criu.treekill import kill_tree

pytestmark = [pytest.mark.criu, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]
MEMHOG = ROOT / "examples" / "memhog.py"
MEMHOG_ARGS = ["--mib", "64", "--interval", "0.05"]
HEARTBEAT = (
    "import os, runpy, sys, threading, time\n"
    "def beat():\n"
    "    while True:\n"
    "        os.write(2, b'hb %d\\n' % time.time_ns())\n"
    "        time.sleep(0.01)\n"
    "threading.Thread(target=beat, daemon=True).start()\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


@pytest.fixture(scope="module", autouse=True)
def criu_ok() -> CriuRunner:
    """Every test here needs a working CRIU with post-copy: fail (never skip) when it is missing."""
    runner = CriuRunner()
    status = runner.check()
    assert status.ok, status.error
    problem = ensure_pipe_limits()
    assert problem is None, problem
    return runner


@pytest.fixture
async def pids() -> AsyncIterator[list[int]]:
    """Workload PIDs to kill when the test ends, whatever happened."""
    started: list[int] = []
    yield started
    for pid in started:
        await kill_tree(pid, grace_s=0)


async def wait_for(what: str, cond: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def rounds(path: Path) -> list[str]:
    """memhog's "<round> <crc>" lines (the "ready" line and a partial last line left out)."""
    text = path.read_text() if path.exists() else ""
    return [line for line in text.splitlines(keepends=True)[1:] if line.endswith("\n")]


def reference(script: Path, n: int) -> list[str]:
    """The first ``n`` rounds of an uninterrupted run (same seed, no sleeping)."""
    out = subprocess.run(
        [sys.executable, str(script), "--mib", "64", "--interval", "0", "--rounds", str(n)],
        capture_output=True,
        text=True,
        timeout=40,
        check=True,
    ).stdout
    return out.splitlines(keepends=True)[1:]


def running_copies(script: Path) -> list[int]:
    """Live processes running this test's copy of memhog.py under the wrapper (not the shims)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline[1:2] == [b"-c"] and cmdline[3:4] == [os.fsencode(script)] and not is_gone(int(entry.name)):
            found.append(int(entry.name))
    return found


async def start_memhog(tmp_path: Path, job: JobDir, pids: list[int]) -> tuple[Path, int]:
    script = tmp_path / "memhog.py"  # our own copy: its path finds exactly this test's processes
    shutil.copy(MEMHOG, script)
    argv = [sys.executable, "-c", HEARTBEAT, str(script), *MEMHOG_ARGS]
    info = await launch(job, argv, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, incarnation=1)
    pids.append(info.pid)
    await wait_for("a few rounds", lambda: len(rounds(job.stdout)) >= 5)
    return script, info.pid


def lazy_log_summary(root: Path) -> str:
    """What CRIU's logs under ``root`` say of the lazily served pages (found, then transferred per
    task): a failed size check names them, since the result alone does not say where pages went."""
    said = []
    for path in sorted(root.rglob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if "UFFD transferred pages" in line or "to be handled by UFFD" in line:
                said.append(f"{path.relative_to(root)}: {line.strip()}")
    return " | ".join(said[-12:]) or f"no CRIU log under {root} mentions lazy pages"


async def wait_exit(job: JobDir, timeout_s: float = 10.0) -> ExitInfo:
    await wait_for(str(job.exit_file), lambda: job.read_exit() is not None, timeout_s)
    info = job.read_exit()
    assert info is not None
    return info


async def test_live_move_continues_the_sequence(tmp_path: Path, pids: list[int]) -> None:
    src, dst = JobDir(tmp_path / "node-a" / "job"), JobDir(tmp_path / "node-b" / "job")
    script, pid = await start_memhog(tmp_path, src, pids)

    move = LiveMove(
        src,
        pid,
        dst,
        source_images=tmp_path / "node-a" / "images",
        target_images=tmp_path / "node-b" / "images",
        incarnation=2,
    )
    shim = await move.switch()
    pids.append(shim.pid)
    assert shim.mode == "restore" and shim.incarnation == 2 and shim.pid != pid
    nspid = ns_pids(shim.pid)
    assert len(nspid) == 2 and nspid[-1] == 1, nspid
    # While its pages follow, the source is held (ptrace-frozen, then stopped), never running.
    assert Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in ("t", "T")

    result = await move.complete(timeout_s=40)
    assert result.pid == shim.pid and result.source_pid == pid
    assert is_gone(pid)
    assert (await wait_exit(src)).signal == 9
    assert running_copies(script) == [shim.pid]

    assert result.downtime_ms is not None and 0 < result.downtime_ms < 2000, result
    assert result.freeze_ms <= result.dump_ms and result.switch_ms < 2000, result
    assert result.pages_lazy is not None and result.bytes_lazy is not None
    # the buffer travelled lazily ...
    assert 64 << 20 <= result.bytes_lazy < 80 << 20, (
        f"bytes_lazy {result.bytes_lazy}, bytes_final {result.bytes_final}; {lazy_log_summary(tmp_path)}")
    assert result.bytes_final < 8 << 20, result  # ... and not with the images at the freeze
    assert result.degraded_ms > 0 and result.total_ms >= result.degraded_ms

    before = len(rounds(src.stdout))
    await wait_for("rounds on the target", lambda: len(rounds(dst.stdout)) >= before + 10, timeout_s=20)
    moved = rounds(dst.stdout)
    assert moved == reference(script, len(moved))  # the CRC sequence continues: no gap, no repeat
    assert dst.stdout.read_text().startswith("ready 64\n")
    assert running_copies(script) == [shim.pid]

    await kill_tree(shim.pid, grace_s=0)
    assert (await wait_exit(dst)).signal == 9


async def test_failed_restore_leaves_the_source_running(tmp_path: Path, pids: list[int]) -> None:
    src, dst = JobDir(tmp_path / "a"), JobDir(tmp_path / "b")
    script, pid = await start_memhog(tmp_path, src, pids)

    async def copy_without_core(from_dir: Path, to_dir: Path) -> int:
        n = await copy_images(from_dir, to_dir)
        for core in to_dir.glob("core-*.img"):
            core.unlink()  # a wrong images dir: CRIU cannot restore the task's registers
        return n

    move = LiveMove(
        src,
        pid,
        dst,
        source_images=tmp_path / "a-images",
        target_images=tmp_path / "b-images",
        incarnation=2,
        copy=copy_without_core,
    )
    with pytest.raises(LiveMoveFailed) as failed:
        await move.switch()
    err = failed.value
    assert err.source_running and not err.target_killed
    assert "restore" in str(err) and err.log_excerpt, (str(err), err.log_excerpt)
    assert err.log_path is not None and err.log_path.endswith("restore.log")

    # The source runs on, where it was, and the target left nothing running.
    assert not is_gone(pid) and src.read_exit() is None
    assert dst.read_shim() is None
    seen = len(rounds(src.stdout))
    await wait_for("rounds after the failed move", lambda: len(rounds(src.stdout)) >= seen + 5)
    out = rounds(src.stdout)
    assert out == reference(script, len(out))
    assert running_copies(script) == [pid]


def criu_processes(command: bytes, images: Path) -> list[int]:
    """``criu <command>`` processes working on ``images``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if command in cmdline[1:2] and os.fsencode(images) in cmdline:
            found.append(int(entry.name))
    return found


def lazy_daemons(images: Path) -> list[int]:
    """``criu lazy-pages`` processes serving ``images``."""
    return criu_processes(b"lazy-pages", images)


async def test_source_resumes_when_the_pages_stop_coming(tmp_path: Path, pids: list[int]) -> None:
    """CRIU's dump takes a page client that goes away for success and would kill the source; Ferry
    holds the source stopped instead, and resumes it when the target cannot get its memory."""
    src, dst = JobDir(tmp_path / "a"), JobDir(tmp_path / "b")
    script, pid = await start_memhog(tmp_path, src, pids)
    move = LiveMove(
        src, pid, dst, source_images=tmp_path / "a-images", target_images=tmp_path / "b-images", incarnation=2
    )
    shim = await move.switch()
    pids.append(shim.pid)
    daemons = lazy_daemons(tmp_path / "b-images")
    assert len(daemons) == 1
    os.kill(daemons[0], 9)  # the target's pages stop coming

    with pytest.raises(LiveMoveFailed) as failed:
        await move.complete(timeout_s=30)
    assert "lazy-pages" in str(failed.value)
    assert failed.value.source_running and failed.value.target_killed
    assert is_gone(shim.pid) and src.read_exit() is None

    seen = len(rounds(src.stdout))
    await wait_for("rounds after the failed move", lambda: len(rounds(src.stdout)) >= seen + 5)
    out = rounds(src.stdout)
    assert out == reference(script, len(out))
    assert running_copies(script) == [pid]


def restores_of(images: Path) -> list[int]:
    """``criu restore`` processes reading ``images``."""
    return criu_processes(b"restore", images)


async def test_a_memory_source_gone_before_the_target_restores_fails_the_move_at_once(
        tmp_path: Path, pids: list[int]) -> None:
    """A page server that dies before the target's restore is done once left ``criu restore``
    waiting for a page forever (and the move for its 120 s timeout): the restore is given up as
    soon as the lazy-pages daemon fails, and nothing of it is left running."""
    src, dst = JobDir(tmp_path / "a"), JobDir(tmp_path / "b")
    _, pid = await start_memhog(tmp_path, src, pids)
    move: LiveMove

    async def copy_then_lose_the_source(from_dir: Path, to_dir: Path) -> int:
        n = await copy_images(from_dir, to_dir)
        await move._src.dump.kill()  # the source's page server goes away before the target asks
        return n

    move = LiveMove(src, pid, dst, source_images=tmp_path / "a-images", target_images=tmp_path / "b-images",
                    incarnation=2, copy=copy_then_lose_the_source)
    t0 = time.monotonic()
    with pytest.raises(LiveMoveFailed) as failed:
        await move.switch()
    assert time.monotonic() - t0 < 30, "the move waited for a page that cannot come"
    target = dst.read_shim()
    assert failed.value.source_running and (target is None or is_gone(target.pid))
    await wait_for("no restore left", lambda: not restores_of(tmp_path / "b-images"), timeout_s=10)
    assert lazy_daemons(tmp_path / "b-images") == []


async def test_a_live_move_over_tls_and_a_plain_client_refused(tmp_path: Path, pids: list[int]) -> None:
    """The page server speaks TLS: the memory crosses encrypted and a peer that does not present
    a certificate of the cluster's CA gets nothing (the move fails, the source runs on)."""
    from ferry.common.certs import make_tls
    from ferry.criu.lazy_common import tls_args

    tls = make_tls(tmp_path / "tls", ["127.0.0.1", "localhost"])
    args = tls_args(tls.ca, tls.cert, tls.key)
    src, dst = JobDir(tmp_path / "a" / "job"), JobDir(tmp_path / "b" / "job")
    script, pid = await start_memhog(tmp_path, src, pids)
    other = make_tls(tmp_path / "other", ["127.0.0.1"])
    wrong = LiveMove(src, pid, dst, source_images=tmp_path / "a" / "img1", target_images=tmp_path / "b" / "img1",
                     incarnation=2, tls_args=args)
    wrong_target_args = tls_args(other.ca, other.cert, other.key)
    wrong.tls_args = wrong_target_args  # the target trusts another CA and presents its certificate
    with pytest.raises(LiveMoveFailed) as failed:
        await wrong.switch()
    assert failed.value.source_running
    assert not is_gone(pid) and src.read_exit() is None
    seen = len(rounds(src.stdout))
    await wait_for("rounds after the refused move", lambda: len(rounds(src.stdout)) >= seen + 5)

    move = LiveMove(src, pid, dst, source_images=tmp_path / "a" / "img2", target_images=tmp_path / "b" / "img2",
                    incarnation=3, tls_args=args)
    shim = await move.switch()
    pids.append(shim.pid)
    result = await move.complete(timeout_s=40)
    assert (result.bytes_lazy or 0) >= 64 << 20, result  # the memory came over the TLS connection
    before = len(rounds(src.stdout))
    await wait_for("rounds on the target", lambda: len(rounds(dst.stdout)) >= before + 10, timeout_s=20)
    moved = rounds(dst.stdout)
    assert moved == reference(script, len(moved))
    await kill_tree(shim.pid, grace_s=0)
