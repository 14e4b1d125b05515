"""Self-fencing (ferry.checkpointer.hold): the lease a beat gives, and the holds a run-out lease
takes on real process trees, released to exactly what they stopped."""

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.checkpointer.hold import HELD_FILE, JobHolds, Lease, hold_tree, read_held, release_tree
from ferry.criu.jobdir import JobDir, ShimInfo
from ferry.criu.lazy_common import proc_state
from ferry.criu.linux import process_tree

TREE = "sleep 60 & sleep 60 & echo ready; wait"


@pytest.fixture
def tree() -> Iterator[subprocess.Popen[bytes]]:
    root = subprocess.Popen(["sh", "-c", TREE], stdout=subprocess.PIPE)
    assert root.stdout is not None and root.stdout.readline() == b"ready\n"
    yield root
    for p in process_tree(root.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    root.wait()


def job(tmp_path: Path, root: subprocess.Popen[bytes], incarnation: int = 3) -> tuple[JobDir, ShimInfo]:
    jd = JobDir(tmp_path / "job1").create()
    shim = ShimInfo(shim_pid=root.pid, pid=root.pid, incarnation=incarnation, started=time.time(), mode="launch")
    jd.write_shim(shim)
    return jd, shim


def states(pids: list[int]) -> set[str | None]:
    return {proc_state(p) for p in pids}


def test_the_lease_ends_a_margin_before_health_may_declare_the_node_lost() -> None:
    lease = Lease(timeout_s=3.0, interval_s=0.5)
    assert lease.expired(0.0)  # nothing landed yet
    lease.renew(100.0, False, 100.1)
    assert lease.margin_s == 1.0 and lease.deadline == 102.0
    assert not lease.expired(101.9) and lease.expired(102.0)
    assert 101.5 - lease.heartbeat == pytest.approx(1.5)
    lease.renew(99.0, False, 100.2)  # an older beat landing late never shortens it
    assert lease.deadline == 102.0
    assert lease.may_release(101.0)
    # back after a declared loss: one more timeout before anything held runs again
    lease.renew(110.0, True, 110.0)
    lease.renew(111.5, False, 111.5)
    assert not lease.may_release(112.0) and lease.may_release(113.0)
    assert not lease.may_release(200.0)  # run out again meanwhile
    # the margin is two beats or a quarter of the timeout, at most half of it
    assert Lease(5.0, 1.0).margin_s == 2.0 and Lease(20.0, 1.0).margin_s == 5.0 and Lease(2.0, 5.0).margin_s == 1.0


def test_a_hold_stops_what_runs_and_its_release_resumes_only_that(tmp_path: Path,
                                                                  tree: subprocess.Popen[bytes]) -> None:
    jd, shim = job(tmp_path, tree)
    pids = process_tree(tree.pid)
    assert len(pids) == 3 and states(pids) == {"S"}
    stopped_before = pids[2]  # stopped by someone else (a user's SIGSTOP): the release leaves it stopped
    os.kill(stopped_before, signal.SIGSTOP)
    time.sleep(0.05)
    assert sorted(hold_tree(jd, shim)) == sorted(pids[:2])
    time.sleep(0.05)
    assert states(pids) == {"T"}
    held = read_held(jd)
    assert held is not None and held.incarnation == 3 and held.pids == sorted(pids[:2])
    assert hold_tree(jd, shim) == []  # a second pass stops nothing new
    assert sorted(release_tree(jd)) == sorted(pids[:2])
    time.sleep(0.05)
    assert states(pids[:2]) == {"S"} and proc_state(stopped_before) == "T"
    assert not (jd.path / HELD_FILE).exists()


def test_a_release_leaves_another_incarnation_stopped(tmp_path: Path, tree: subprocess.Popen[bytes]) -> None:
    jd, shim = job(tmp_path, tree)
    hold_tree(jd, shim)
    jd.write_shim(shim.model_copy(update={"incarnation": 4}))  # a copy restored here since
    assert release_tree(jd) == []
    assert states(process_tree(tree.pid)) == {"T"} and not (jd.path / HELD_FILE).exists()


async def test_holds_follow_the_lease_and_refuse_dumps_while_held(tmp_path: Path,
                                                                  tree: subprocess.Popen[bytes]) -> None:
    _, shim = job(tmp_path, tree)
    lease = Lease(timeout_s=1.2, interval_s=0.1)  # runs out 0.9 s after a beat (margin 0.3 s)
    lease.renew(time.time(), False, time.time())
    holds = JobHolds(tmp_path, lease, lambda: {"job1": shim}, lambda job_id: False)
    assert holds.dump_refused("job1", time.time()) is None
    stopping = asyncio.Event()
    loop = asyncio.create_task(holds.run(stopping))
    try:
        await asyncio.sleep(0.5)
        assert states(process_tree(tree.pid)) == {"S"}  # the lease holds: nothing stopped
        await asyncio.sleep(0.8)  # no beat landed since
        assert states(process_tree(tree.pid)) == {"T"} and holds.held == {"job1"}
        refused = holds.dump_refused("job1", time.time())
        assert refused is not None and "held" in refused
        await holds.release_all(time.time())  # the lease is still out: nothing resumes
        assert states(process_tree(tree.pid)) == {"T"}
        lease.renew(time.time(), False, time.time())
        await holds.release_all(time.time())
        await asyncio.sleep(0.05)
        assert states(process_tree(tree.pid)) == {"S"} and holds.held == set()
    finally:
        stopping.set()
        await loop


async def test_a_tree_being_dumped_is_held_only_once_the_dump_ended(tmp_path: Path,
                                                                     tree: subprocess.Popen[bytes]) -> None:
    _, shim = job(tmp_path, tree)
    holds = JobHolds(tmp_path, Lease(3.0, 0.5), lambda: {"job1": shim}, lambda job_id: False)  # run out
    with holds.dump_of("job1"):
        await holds.hold_all()
        assert states(process_tree(tree.pid)) == {"S"} and holds.held == set()
    await holds.hold_all()
    await asyncio.sleep(0.05)
    assert states(process_tree(tree.pid)) == {"T"}
    # a restarted checkpointer finds the hold in the job's folder
    assert JobHolds(tmp_path, Lease(3.0, 0.5), dict, lambda job_id: False).held == {"job1"}


def test_a_failed_final_dump_gives_the_tree_back_to_the_hold_while_the_lease_is_out(
        tmp_path: Path, tree: subprocess.Popen[bytes]) -> None:
    jd, shim = job(tmp_path, tree)
    pids = process_tree(tree.pid)
    for p in pids:  # as --leave-stopped leaves it
        os.kill(p, signal.SIGSTOP)
    holds = JobHolds(tmp_path, Lease(3.0, 0.5), dict, lambda job_id: False)
    holds.give_back(jd, shim)
    time.sleep(0.05)
    held = read_held(jd)
    assert states(pids) == {"T"} and held is not None and held.pids == sorted(pids)
    holds.lease.renew(time.time(), False, time.time())
    release_tree(jd)
    time.sleep(0.05)
    assert states(pids) == {"S"}
    # with the lease good, a give-back resumes at once
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    holds.held.clear()
    holds.give_back(jd, shim)
    time.sleep(0.05)
    assert states(pids) == {"S"}
