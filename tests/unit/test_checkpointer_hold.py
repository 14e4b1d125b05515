"""Self-fencing (ferry.checkpointer.hold, ferry.criu.hold): the lease a beat gives, what the
checkpointer grants of it, and the holds a monitor takes on real process trees when it runs out,
released to exactly what they stopped."""

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.checkpointer.hold import JobHolds, Lease
from ferry.criu.hold import (
    HELD_FILE,
    HOLD_PASS_S,
    NO_LEASE_S,
    LeaseWatch,
    held_since,
    hold_tree,
    read_held,
    read_lease,
    release_tree,
    write_lease,
)
from ferry.criu.jobdir import JobDir, ShimInfo
from ferry.criu.linux import proc_state, process_tree

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


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """No held file can be written (ENOSPC)."""
    def full(path: Path, model: object) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("ferry.criu.hold.write_json_atomic", full)


def job(tmp_path: Path, root: subprocess.Popen[bytes], incarnation: int = 3) -> tuple[JobDir, ShimInfo]:
    """A job folder as a node keeps it: ``<work>/jobs/job1``, the node's lease in ``<work>``."""
    jd = JobDir(tmp_path / "jobs" / "job1").create()
    shim = ShimInfo(shim_pid=root.pid, pid=root.pid, incarnation=incarnation, started=time.time(), mode="launch")
    jd.write_shim(shim)
    return jd, shim


RUNNING = {"S", "R"}  # asleep, or on a CPU at the moment it was read


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
    jd, _ = job(tmp_path, tree)
    pids = process_tree(tree.pid)
    assert len(pids) == 3 and states(pids) <= RUNNING
    stopped_before = pids[2]  # stopped by someone else (a user's SIGSTOP): the release leaves it stopped
    os.kill(stopped_before, signal.SIGSTOP)
    time.sleep(0.05)
    assert sorted(hold_tree(jd, tree.pid, 3)) == sorted(pids[:2])
    time.sleep(0.05)
    assert states(pids) == {"T"}
    held = read_held(jd)
    assert held is not None and held.incarnation == 3 and held.pids == sorted(pids[:2])
    assert held_since(jd, 3) and not held_since(jd, 4)
    assert hold_tree(jd, tree.pid, 3) == []  # a second pass stops nothing new
    assert sorted(release_tree(jd, tree.pid, 3)) == sorted(pids[:2])
    time.sleep(0.05)
    assert states(pids[:2]) <= RUNNING and proc_state(stopped_before) == "T"
    assert not (jd.path / HELD_FILE).exists()


def test_a_release_leaves_another_incarnation_stopped(tmp_path: Path, tree: subprocess.Popen[bytes]) -> None:
    jd, _ = job(tmp_path, tree)
    hold_tree(jd, tree.pid, 3)
    assert release_tree(jd, tree.pid, 4) == []  # a copy restored here since is not the one held
    assert states(process_tree(tree.pid)) == {"T"} and not (jd.path / HELD_FILE).exists()


def test_a_monitor_holds_its_tree_while_the_lease_is_out_and_resumes_it_when_renewed(
        tmp_path: Path, tree: subprocess.Popen[bytes]) -> None:
    jd, _ = job(tmp_path, tree)
    lease = tmp_path / "lease"
    watch = LeaseWatch(jd, tree.pid, 3)
    assert watch.lease == lease
    assert watch.tick(100.0) == NO_LEASE_S  # no lease on this node (yet): nothing held
    assert states(process_tree(tree.pid)) <= RUNNING
    write_lease(lease, 102.5)
    assert read_lease(lease) == 102.5
    assert watch.tick(100.0) == pytest.approx(2.5)  # the next look when it runs out
    assert states(process_tree(tree.pid)) <= RUNNING
    assert watch.tick(102.5) == HOLD_PASS_S  # run out: held, and looked at again soon
    time.sleep(0.05)
    assert states(process_tree(tree.pid)) == {"T"} and held_since(jd, 3)
    assert watch.tick(102.7) == HOLD_PASS_S  # still out: nothing more to stop
    write_lease(lease, 110.0)
    assert watch.tick(103.0) == pytest.approx(7.0)  # renewed: resumed
    time.sleep(0.05)
    assert states(process_tree(tree.pid)) <= RUNNING and not (jd.path / HELD_FILE).exists()


def test_the_checkpointer_grants_the_lease_after_a_beat_and_refuses_dumps_without_it(
        tmp_path: Path, tree: subprocess.Popen[bytes]) -> None:
    jd, shim = job(tmp_path, tree)
    lease = Lease(timeout_s=3.0, interval_s=0.5)
    holds = JobHolds(tmp_path, lease)
    now = time.time()
    refused = holds.dump_refused(jd, now)
    assert refused is not None and "bus" in refused  # nothing granted yet
    holds.grant(now)  # no beat landed: nothing to grant
    assert read_lease(tmp_path / "lease") is None
    lease.renew(now, False, now)
    holds.grant(now)
    assert read_lease(tmp_path / "lease") == pytest.approx(now + 2.0, abs=0.01)
    assert holds.dump_refused(jd, now) is None
    assert JobHolds(tmp_path, Lease(3.0, 0.5)).granted == pytest.approx(now + 2.0, abs=0.01)  # a restart reads it
    hold_tree(jd, tree.pid, shim.incarnation)
    refused = holds.dump_refused(jd, now)
    assert refused is not None and "held" in refused
    release_tree(jd, tree.pid, shim.incarnation)
    # right after a beat, before the fence: only a lease that has not run out is extended
    lease.renew(now + 0.5, False, now + 0.5)
    holds.grant(now + 0.5, before_fence=True)
    assert read_lease(tmp_path / "lease") == pytest.approx(now + 2.5, abs=0.01)
    lease.renew(now + 3.0, False, now + 3.0)
    holds.grant(now + 3.0, before_fence=True)  # it had run out: the monitors may hold; after the fence
    assert read_lease(tmp_path / "lease") == pytest.approx(now + 2.5, abs=0.01)
    holds.grant(now + 3.0)
    assert read_lease(tmp_path / "lease") == pytest.approx(now + 5.0, abs=0.01)
    # back after a declared loss: nothing granted for one more timeout, so the fence acts first
    lease.renew(now + 5.5, True, now + 5.5)
    holds.grant(now + 6.0)
    assert read_lease(tmp_path / "lease") == pytest.approx(now + 5.0, abs=0.01)
    assert holds.dump_refused(jd, now + 6.0) is not None


def test_a_failed_final_dump_gives_the_tree_back_to_the_hold_while_the_lease_is_out(
        tmp_path: Path, tree: subprocess.Popen[bytes]) -> None:
    jd, shim = job(tmp_path, tree)
    pids = process_tree(tree.pid)
    for p in pids:  # as --leave-stopped leaves it
        os.kill(p, signal.SIGSTOP)
    holds = JobHolds(tmp_path, Lease(3.0, 0.5))  # nothing granted
    holds.give_back(jd, shim)
    time.sleep(0.05)
    held = read_held(jd)
    assert states(pids) == {"T"} and held is not None and held.pids == sorted(pids)
    # the monitor resumes it once the lease is granted
    holds.lease.renew(time.time(), False, time.time())
    holds.grant(time.time())
    LeaseWatch(jd, tree.pid, shim.incarnation).tick(time.time())
    time.sleep(0.05)
    assert states(pids) <= RUNNING
    # with the lease good, a give-back resumes at once
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    holds.give_back(jd, shim)
    time.sleep(0.05)
    assert states(pids) <= RUNNING


@pytest.mark.usefixtures("full_disk")
def test_a_hold_that_could_not_be_recorded_is_still_released_by_its_monitor(
        tmp_path: Path, tree: subprocess.Popen[bytes]) -> None:
    """A full disk: the held file cannot be written, the monitor remembers what it stopped."""
    jd, _ = job(tmp_path, tree)
    write_lease(tmp_path / "lease", 100.0)
    watch = LeaseWatch(jd, tree.pid, 3)
    assert watch.tick(100.0) == HOLD_PASS_S
    time.sleep(0.05)
    assert states(process_tree(tree.pid)) == {"T"} and read_held(jd) is None
    write_lease(tmp_path / "lease", 200.0)
    watch.tick(101.0)
    time.sleep(0.05)
    assert states(process_tree(tree.pid)) <= RUNNING


@pytest.mark.usefixtures("full_disk")
def test_a_give_back_that_cannot_be_recorded_resumes_the_tree_for_its_monitor_to_hold(
        tmp_path: Path, tree: subprocess.Popen[bytes]) -> None:
    """Left stopped by a failed final dump while the lease is out, on a full disk: no record means
    no release ever, so the tree runs on, and its monitor (ticking while the lease is out) holds it."""
    jd, shim = job(tmp_path, tree)
    pids = process_tree(tree.pid)
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    JobHolds(tmp_path, Lease(3.0, 0.5)).give_back(jd, shim)  # nothing granted: the lease is out
    time.sleep(0.05)
    assert states(pids) <= RUNNING
