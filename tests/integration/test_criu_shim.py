"""The per-job shim, through its command line and through ``ferry.criu.launch``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from ferry.criu.errors import LaunchFailed, RestoreFailed
from ferry.criu.hold import HELD_FILE, read_held, write_lease
from ferry.criu.jobdir import JobDir
from ferry.criu.launch import launch, restore
from ferry.criu.linux import is_gone, ns_pids, proc_state, process_tree
from ferry.criu.runner import CriuRunner
from tests.integration.criu_helpers import ENV, wait_exit, wait_for

pytestmark = [pytest.mark.usefixtures("criu_ok"), pytest.mark.criu, pytest.mark.timeout(60)]

async def shim_cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ferry.criu.shim",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize(("script", "code", "sig"), [("exit 0", 0, None), ("exit 3", 3, None), ("kill", None, 9)])
async def test_cli_records_how_the_workload_ended(
    tmp_path: Path, pids: list[int], script: str, code: int | None, sig: int | None
) -> None:
    job = JobDir(tmp_path / "job")
    command = "echo started; sleep 60" if script == "kill" else f"echo started; {script}"
    rc, out, err = await shim_cli("launch", "--job-dir", str(job.path), "--incarnation", "4", "--", "sh", "-c", command)
    assert rc == 0, err
    assert err == ""
    reply = json.loads(out)
    assert set(reply) == {"pid", "shim_pid"}
    pids.append(reply["pid"])
    shim = job.read_shim()
    assert shim is not None and shim.pid == reply["pid"] and shim.shim_pid == reply["shim_pid"]
    assert shim.mode == "launch" and shim.incarnation == 4
    # The monitor is detached: its own session, and its parent is not us.
    assert os.getsid(shim.shim_pid) != os.getsid(0)
    if script == "kill":
        assert ns_pids(shim.pid)[-1] == 1
        await wait_for("output", lambda: job.stdout.exists() and job.stdout.read_bytes() == b"started\n")
        os.kill(shim.pid, signal.SIGKILL)
    ended = await wait_exit(job)
    assert (ended.code, ended.signal, ended.incarnation) == (code, sig, 4)
    assert job.stdout.read_bytes() == b"started\n" and job.stderr.read_bytes() == b""
    await wait_for("the monitor to exit", lambda: is_gone(shim.shim_pid))


async def test_env_cwd_and_stdio_are_exactly_as_asked(tmp_path: Path) -> None:
    job = JobDir(tmp_path / "job")
    work = tmp_path / "work"
    work.mkdir()
    script = 'env | sort; pwd; ls -l /proc/self/fd/ | grep -c -- "->"; read x || echo eof; echo oops >&2'
    info = await launch(job, ["sh", "-c", script], cwd=work, env={**ENV, "FOO": "a b"}, incarnation=1)
    assert (await wait_exit(job)).code == 0
    lines = job.stdout.read_text().splitlines()
    env_lines = [line for line in lines if "=" in line and not line.startswith("PWD=")]
    assert env_lines == ["FOO=a b", "PATH=/usr/bin:/bin"]
    assert str(work) in lines
    # 0, 1, 2 and the fd ls uses to read the directory: nothing else leaked into the workload.
    assert "4" in lines and "eof" in lines
    assert job.stderr.read_text() == "oops\n"
    assert "launch: workload pid" in job.shim_log.read_text()
    assert info.pid > 1


async def test_missing_command_fails_fast(tmp_path: Path) -> None:
    job = JobDir(tmp_path / "job")
    started = time.monotonic()
    rc, out, err = await shim_cli("launch", "--job-dir", str(job.path), "--incarnation", "1", "--", "no-such-cmd")
    assert rc != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and "no-such-cmd" in err
    with pytest.raises(LaunchFailed, match="command not found: no-such-cmd"):
        await launch(job, ["no-such-cmd", "x"], cwd=None, env=ENV, incarnation=1)
    with pytest.raises(LaunchFailed, match="working directory does not exist"):
        await launch(job, ["true"], cwd=tmp_path / "nowhere", env=ENV, incarnation=1)
    with pytest.raises(LaunchFailed, match="no command"):
        await launch(job, [], cwd=None, env=ENV, incarnation=1)
    assert time.monotonic() - started < 10
    assert job.read_shim() is None


async def test_exec_failure_after_the_fork_is_reported(tmp_path: Path) -> None:
    job = JobDir(tmp_path / "job")
    bogus = tmp_path / "not-a-program"
    bogus.write_bytes(b"\x00\x01\x02 no shebang, no ELF")
    bogus.chmod(0o755)
    with pytest.raises(LaunchFailed, match=r"cannot execute .*not-a-program: Exec format error"):
        await launch(job, [str(bogus)], cwd=tmp_path, env=ENV, incarnation=1)
    assert job.read_shim() is None and job.read_exit() is None


async def test_restore_failure_carries_the_criu_log(tmp_path: Path, criu_ok: CriuRunner, pids: list[int]) -> None:
    src = JobDir(tmp_path / "a")
    info = await launch(src, ["sh", "-c", "while :; do echo x; sleep 0.01; done"], cwd=tmp_path, env=ENV, incarnation=1)
    pids.append(info.pid)
    await wait_for("output", lambda: src.stdout.exists() and src.stdout.stat().st_size > 10)
    await criu_ok.dump(info.pid, tmp_path / "images", leave_running=False)
    await wait_exit(src)
    # Without --inherit CRIU reopens the original paths, and this node has no such files.
    src.stdout.rename(tmp_path / "moved-away")
    with pytest.raises(RestoreFailed) as exc_info:
        await restore(JobDir(tmp_path / "b").create(), tmp_path / "images", inherit={}, incarnation=2)
    err = exc_info.value
    assert str(err).startswith("criu restore failed: ") and "\n" not in str(err)
    assert err.log_path == str(tmp_path / "images" / "restore.log")
    assert any("Error" in line and "stdout" in line for line in err.log_excerpt), err.log_excerpt
    assert len(err.log_excerpt) <= 30
    assert JobDir(tmp_path / "b").read_shim() is None


async def test_the_monitor_holds_its_workload_while_the_nodes_lease_is_out(tmp_path: Path, pids: list[int]) -> None:
    """A job folder as a node keeps it (``<work>/jobs/<job>``, the lease in ``<work>``): past the
    lease, the monitor stops every process of the tree on its own, and resumes them when it is
    renewed; the workload ends as it would have."""
    job = JobDir(tmp_path / "jobs" / "held")
    lease = tmp_path / "lease"
    write_lease(lease, time.time() + 1.5)
    info = await launch(job, ["sh", "-c", "sleep 60 & wait"], cwd=tmp_path, env=ENV, incarnation=2)
    pids.append(info.pid)
    await wait_for("the tree", lambda: len(process_tree(info.pid)) == 2)
    tree = process_tree(info.pid)
    assert {proc_state(p) for p in tree} <= {"S", "R"}
    # the held file is written once every process is stopped
    await wait_for("the hold", lambda: {proc_state(p) for p in tree} == {"T"} and read_held(job) is not None, 5)
    held = read_held(job)
    assert held is not None and held.incarnation == 2 and set(tree) <= set(held.pids)
    await asyncio.sleep(0.5)
    assert {proc_state(p) for p in tree} == {"T"}  # still held
    write_lease(lease, time.time() + 60)
    await wait_for("the release", lambda: {proc_state(p) for p in tree} <= {"S", "R"}, 5)
    assert not (job.path / HELD_FILE).exists()
    os.kill(tree[1], signal.SIGTERM)  # its child ends: so does the workload, as it would have
    ended = await wait_exit(job)
    assert (ended.code, ended.incarnation) == (0, 2)
