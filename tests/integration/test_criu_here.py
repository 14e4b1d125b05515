"""Real CRIU: a `--here` start (issue 12). The node service offers the shim's command instead of
starting it (``ferry.criu.handoff``); a caller in a cgroup of its own runs it in the foreground.
The workload is then the caller's descendant, in the caller's cgroup, and the caller ends with the
workload's exit status; a restore does the same in another cgroup."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from ferry.criu.errors import LaunchFailed
from ferry.criu.handoff import FOREGROUND_FLAG, Handoff, take
from ferry.criu.jobdir import JobDir
from ferry.criu.launch import launch, restore
from ferry.criu.runner import CriuRunner
from ferry.criu.treekill import kill_tree
from tests.cgroups import cgroup_of, cgroup_root, scratch_cgroup
from tests.integration.criu_helpers import COUNTER, ENV, wait_for
from tests.integration.test_criu_migrate import lines_in, rebuild

pytestmark = [pytest.mark.criu, pytest.mark.timeout(60)]

# The caller: joins the cgroup given first, then becomes the offered shim (so the shim's monitor
# is the caller itself, as under `ferry run --here`, whose child it is).
CALLER = ("import os, sys; open(sys.argv[1] + '/cgroup.procs', 'w').write(str(os.getpid())); "
          "os.execv(sys.argv[2], sys.argv[2:])")


async def caller(cgroup: Path, offered: Handoff) -> asyncio.subprocess.Process:
    assert FOREGROUND_FLAG in offered.argv
    return await asyncio.create_subprocess_exec(sys.executable, "-c", CALLER, str(cgroup), *offered.argv)


async def offer_for(jd: JobDir, newer_than: int) -> Handoff | None:
    found = await take(jd.path.parent, "j", newer_than=newer_than, timeout_s=10)
    assert found is None or found[0].path == jd.path
    return found[1] if found else None


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def test_a_here_start_runs_in_the_callers_cgroup_and_ends_with_the_jobs_status(tmp_path: Path,
                                                                                     pids: list[int]) -> None:
    jd = JobDir(tmp_path / "job")
    starting = asyncio.create_task(launch(jd, ["sh", "-c", "echo started; sleep 1; exit 7"], cwd=tmp_path, env=ENV,
                                          incarnation=3, here="j"))
    offered = await offer_for(jd, 2)
    assert offered is not None and offered.incarnation == 3 and offered.mode == "launch"
    with scratch_cgroup() as cg:
        proc = await caller(cg, offered)
        info = await starting
        pids.append(info.pid)
        assert parent_of(info.pid) == proc.pid, "the workload is not the caller's child"
        assert cgroup_of(info.pid, cgroup_root()) == f"/{cg.name}"
        assert await asyncio.wait_for(proc.wait(), 10) == 7
    assert jd.read_exit() is not None and jd.read_exit().code == 7  # type: ignore[union-attr]
    assert lines_in(jd.stdout) == ["started"]
    assert not (jd.path / "handoff.json").exists(), "the offer outlived the start"


async def test_an_offer_nobody_takes_fails_the_start_and_is_withdrawn(tmp_path: Path) -> None:
    jd = JobDir(tmp_path / "job")
    with pytest.raises(LaunchFailed, match="did not take"):
        await launch(jd, ["true"], cwd=tmp_path, env=ENV, incarnation=1, here="j", timeout_s=0.5)
    assert not (jd.path / "handoff.json").exists()


async def test_a_here_start_that_cannot_exec_fails_on_both_sides(tmp_path: Path) -> None:
    jd = JobDir(tmp_path / "job")
    starting = asyncio.create_task(launch(jd, ["sh"], cwd=tmp_path, env={"PATH": "/nonexistent"}, incarnation=1,
                                          here="j"))
    offered = await offer_for(jd, 0)
    assert offered is not None
    with scratch_cgroup() as cg:
        proc = await caller(cg, offered)
        with pytest.raises(LaunchFailed, match="command not found: sh"):
            await starting
        assert await asyncio.wait_for(proc.wait(), 10) == 1


async def test_a_here_restore_continues_the_job_in_the_new_callers_cgroup(tmp_path: Path, criu_ok: CriuRunner,
                                                                          pids: list[int]) -> None:
    src = JobDir(tmp_path / "a")
    with scratch_cgroup() as first, scratch_cgroup() as second:
        starting = asyncio.create_task(launch(src, ["sh", "-c", COUNTER], cwd=tmp_path, env=ENV, incarnation=1,
                                              here="j"))
        offered = await offer_for(src, 0)
        assert offered is not None
        proc = await caller(first, offered)
        info = await starting
        pids.append(info.pid)
        await wait_for("output", lambda: len(lines_in(src.stdout)) >= 20)
        dumped = await criu_ok.dump(info.pid, tmp_path / "images", leave_running=False,
                                    record_sizes=[src.stdout, src.stderr])
        assert await asyncio.wait_for(proc.wait(), 10) == 128 + 9, "the dump ends the job with SIGKILL"
        count = len(lines_in(src.stdout))

        dst = JobDir(tmp_path / "b")
        restoring = asyncio.create_task(restore(dst, tmp_path / "images", inherit=rebuild(src, dst, dumped),
                                                incarnation=2, here="j"))
        offered = await offer_for(dst, 1)
        assert offered is not None and offered.mode == "restore"
        proc = await caller(second, offered)
        restored = await restoring
        pids.append(restored.pid)
        assert parent_of(restored.pid) == proc.pid, "the restored workload is not the caller's child"
        assert cgroup_of(restored.pid, cgroup_root()) == f"/{second.name}"
        await wait_for("output after the restore", lambda: len(lines_in(dst.stdout)) >= count + 10)
        seen = [int(x) for x in lines_in(dst.stdout)]
        assert seen == list(range(len(seen))), "the count restarted or skipped"
        await kill_tree(restored.pid, grace_s=0)
        assert await asyncio.wait_for(proc.wait(), 10) == 128 + 9
