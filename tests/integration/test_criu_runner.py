"""Real CRIU: the feature check, dumps that fail, images and stats of a real dump, kill_tree."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from ferry.criu.binary import required_version
from ferry.criu.errors import DumpFailed
from ferry.criu.images import PAGE_SIZE, find_page_maps, read_dump_stats, read_pagemap
from ferry.criu.jobdir import JobDir, ShimInfo
from ferry.criu.launch import launch
from ferry.criu.linux import is_gone
from ferry.criu.runner import CriuRunner
from ferry.criu.treekill import kill_tree
from tests.integration.criu_helpers import COUNTER, ENV, wait_exit, wait_for

pytestmark = [pytest.mark.usefixtures("criu_ok"), pytest.mark.criu, pytest.mark.timeout(60)]

async def start(job: JobDir, script: str, pids: list[int]) -> ShimInfo:
    info = await launch(job, ["sh", "-c", script], cwd=job.path.parent, env=ENV, incarnation=1)
    pids.append(info.pid)
    return info


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


async def assert_runs_on(job: JobDir, pid: int) -> None:
    """Alive, not left stopped by CRIU, and still making progress."""
    assert not is_gone(pid)
    assert state(pid) not in ("T", "t")
    size = job.stdout.stat().st_size
    await wait_for("progress", lambda: job.stdout.stat().st_size > size + 10)


def test_check(criu_ok: CriuRunner) -> None:
    status = criu_ok.check()
    assert status.version is not None and tuple(map(int, status.version.split(".")[:2])) >= (4, 1)
    assert status.error is None and status.path is not None


def test_check_never_raises_on_a_missing_binary(tmp_path: Path) -> None:
    status = CriuRunner(str(tmp_path / "no-criu")).check()
    need = ".".join(map(str, required_version()))  # 4.2 on kernels >= 6.16, where 4.1 cannot dump sockets
    assert not status.ok and status.error is not None and f"CRIU >= {need}" in status.error
    status = CriuRunner("/bin/true").check()  # answers, but is no CRIU
    assert not status.ok and status.error is not None and "\n" not in status.error


async def test_dump_of_a_dead_pid_fails_with_the_log(tmp_path: Path, criu_ok: CriuRunner) -> None:
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()
    with pytest.raises(DumpFailed) as exc_info:
        await criu_ok.dump(proc.pid, tmp_path / "images", leave_running=True)
    err = exc_info.value
    assert f"pid {proc.pid}" in str(err) and "\n" not in str(err)
    assert err.log_path == str(tmp_path / "images" / "dump.log")
    assert any("Error" in line for line in err.log_excerpt), err.log_excerpt
    assert 0 < len(err.log_excerpt) <= 30


async def test_failure_after_the_freeze_leaves_the_workload_running(
    tmp_path: Path, criu_ok: CriuRunner, pids: list[int]
) -> None:
    job = JobDir(tmp_path / "job")
    info = await start(job, COUNTER, pids)
    await wait_for("output", lambda: job.stdout.exists() and job.stdout.stat().st_size > 20)
    # The post-dump script cannot stat a missing file: the dump fails with the tree frozen and
    # fully dumped, at the last moment before CRIU would resume it.
    with pytest.raises(DumpFailed) as exc_info:
        await criu_ok.dump(
            info.pid, tmp_path / "images", leave_running=True, record_sizes=[job.stdout, tmp_path / "missing"]
        )
    assert any("script" in line.lower() for line in exc_info.value.log_excerpt), exc_info.value.log_excerpt
    await assert_runs_on(job, info.pid)
    # An option CRIU refuses: it fails before touching the tree, with its own output as the excerpt.
    with pytest.raises(DumpFailed) as exc_info:
        await criu_ok.dump(info.pid, tmp_path / "images2", leave_running=True, extra_args=["--no-such-option"])
    assert exc_info.value.log_excerpt
    await assert_runs_on(job, info.pid)
    assert job.read_exit() is None


async def test_images_and_stats_of_a_real_dump(tmp_path: Path, criu_ok: CriuRunner, pids: list[int]) -> None:
    job = JobDir(tmp_path / "job")
    # Some memory worth dumping: a shell variable of ~200 KiB.
    info = await start(job, 'x=$(head -c 200000 /dev/zero | tr "\\0" a); ' + COUNTER, pids)
    await wait_for("output", lambda: job.stdout.exists() and job.stdout.stat().st_size > 20)
    images = tmp_path / "images"
    result = await criu_ok.dump(info.pid, images, leave_running=False, record_sizes=[job.stdout])
    # Without --leave-running CRIU kills the tree once the images are written.
    assert (await wait_exit(job)).signal == 9

    assert result.images_dir == str(images)
    assert result.frozen_ms is not None and 0 < result.frozen_ms <= result.wall_ms
    assert result.freezing_ms is not None and result.memdump_ms is not None and result.memwrite_ms is not None
    assert result.file_sizes == {str(job.stdout): job.stdout.stat().st_size}

    maps = find_page_maps(images)
    assert maps and all(name in maps for name in (p.name for p in images.glob("pages-*.img")))
    total_pages = 0
    for name, spans in maps.items():
        size = (images / name).stat().st_size
        assert sum(n for _, n in spans) * PAGE_SIZE == size
        assert all(vaddr % PAGE_SIZE == 0 and n > 0 for vaddr, n in spans)
        total_pages += size // PAGE_SIZE
    assert total_pages >= 200_000 // PAGE_SIZE
    pagemap = read_pagemap(next(images.glob("pagemap-1.img")))
    assert pagemap.entries and pagemap.pages_file in maps

    stats = read_dump_stats(images / "stats-dump")
    assert stats.pages_written == total_pages == result.pages_written
    assert stats.pages_scanned >= stats.pages_written
    assert stats.frozen_time_us / 1000 == result.frozen_ms


async def test_kill_tree_uses_sigterm_when_handled(tmp_path: Path, pids: list[int]) -> None:
    job = JobDir(tmp_path / "job")
    info = await start(job, 'trap "echo bye; exit 5" TERM; echo ready; while :; do sleep 0.05; done', pids)
    await wait_for("ready", lambda: job.stdout.exists() and b"ready" in job.stdout.read_bytes())
    await kill_tree(info.pid, grace_s=10)
    ended = await wait_exit(job)
    assert ended.code == 5 and b"bye" in job.stdout.read_bytes()


async def test_kill_tree_skips_the_grace_when_sigterm_cannot_be_delivered(tmp_path: Path, pids: list[int]) -> None:
    job = JobDir(tmp_path / "job")
    info = await start(job, "sleep 60 & sleep 60 & wait", pids)
    started = time.monotonic()
    await kill_tree(info.pid, grace_s=30)
    assert time.monotonic() - started < 5
    assert (await wait_exit(job)).signal == 9
    await kill_tree(info.pid, grace_s=1)  # already gone: returns at once
