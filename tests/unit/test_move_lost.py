"""What a move cost the job (ferry.policy.lost): the pure figure, and how the scheduler's steps fill
it in for cold, post-copy and pre-copy moves from what the nodes measured."""

import pytest

from ferry.common import wire
from ferry.common.models import CheckpointRecord, Job, JobState, Op, OpKind, OpState
from ferry.common.moves import LiveFrozen, LiveLocal, LiveRestored
from ferry.common.opargs import ColdMove, LiveMove, RestoreArgs, Round
from ferry.policy.lost import MIN_CORES, cold_lost, lost
from ferry.scheduler.ops import checkpoint, restore
from ferry.scheduler.ops.live_report import live_result

NOW = 10_000.0


def job(**kw: object) -> Job:
    fields: dict[str, object] = {"id": "job-1", "name": "t1", "argv": ["x"], "node": "b", "state": JobState.MIGRATING,
                                 "incarnation": 4, "op": "op-1"}
    return Job.model_validate(fields | kw)


def restored(node: str = "b") -> wire.NodeEvent:
    return wire.NodeEvent(kind="restored", node=node, job="job-1", incarnation=4, pid=9, restore_ms=500.0,
                          time=NOW)  # when it ran again, by its node's clock


def test_the_window_less_the_work_done_in_it_at_the_rate_before() -> None:
    # 10 s window, a 2-core job that did 14 CPU seconds of work in it: 7 s of its time, 3 s lost
    got = lost(10.0, 14.0, 2.0, paused_s=0.5)
    assert got.seconds == pytest.approx(3.0) and got.basis == "cpu"
    assert lost(10.0, 0.0, 1.0, 0.5).seconds == 10.0  # no work at all: the whole window
    assert lost(10.0, 25.0, 2.0, 0.5).seconds == 0.0  # faster than before: nothing lost, never negative
    # an idle job: CPU says nothing, the figure is the time it could not run
    idle = lost(10.0, 0.001, MIN_CORES / 2, paused_s=0.7)
    assert (idle.seconds, idle.basis) == (0.7, "pause")
    assert lost(10.0, None, 1.0, 0.7).basis == "pause"  # a node that could not read the CPU
    assert cold_lost(None, NOW) is None
    assert cold_lost(NOW - 4.0, NOW) == lost(0.0, None, None, 4.0)


def test_a_cold_move_loses_the_time_from_its_dump_to_its_restore_and_the_job_keeps_the_figure() -> None:
    op = Op(id="op-1", kind=OpKind.MIGRATE, phase="checkpoint", args=ColdMove(source="a", target="b"))
    rec = CheckpointRecord(id="ck-1", job="job-1", final=True, total_ms=1500.0, dumped_at=NOW - 3.5, cpu_s=80.0,
                           cores=1.0)
    s = checkpoint.on_committed(job(node="a", incarnation=3), op, rec, NOW - 2.0)
    assert isinstance(s.op.args, ColdMove) and s.op.args.dumped_at == NOW - 3.5
    s = restore.on_restored(s.job, s.op, restored(), NOW + 0.4)  # the event reached the scheduler 0.4 s later
    assert s.op.state == OpState.DONE
    assert (s.op.result["lost_s"], s.op.result["lost_basis"]) == (3.5, "pause")
    assert s.job.last_move_lost_s == 3.5
    # what the user did not ask to be a move (a restore of a stopped job) leaves the figure alone
    plain = Op(id="op-2", kind=OpKind.RESTORE, phase="restore", args=RestoreArgs(target="b"))
    assert restore.on_restored(job(last_move_lost_s=1.0), plain, restored(), NOW).job.last_move_lost_s == 1.0


def postcopy(**local: object) -> LiveMove:
    return LiveMove(
        source="a", target="b", mode="postcopy",
        rounds=[Round(checkpoint="r1", bytes_uploaded=1, freeze_ms=400.0, dumped_at=100.0, cpu_s=50.0, cores=1.0)],
        frozen=LiveFrozen(address="x", port=1, store_job="s", images="i", stdout_path="o", stderr_path="e",
                          started_at=102.0, frozen_at=102.0, freeze_ms=200.0, cpu_s=51.2),
        restored=LiveRestored(running_at=102.3),
        local=LiveLocal.model_validate({"local_at": 104.0, "cpu_s": 1.2} | local))


def test_a_post_copy_move_counts_the_work_done_on_both_sides_until_the_memory_is_all_there() -> None:
    # window 100 -> 104 (4 s); work: 1.2 s on the source after the round, 1.2 s on the target
    r = live_result(job(), Op(id="op-1", kind=OpKind.MIGRATE, args=postcopy()), NOW)
    assert r["lost_s"] == pytest.approx(1.6) and r["lost_basis"] == "cpu"
    # a target that could not read the job's CPU: the pauses (the round's freeze, the switch)
    r = live_result(job(), Op(id="op-1", kind=OpKind.MIGRATE, args=postcopy(cpu_s=None)), NOW)
    assert r["lost_s"] == pytest.approx(0.7) and r["lost_basis"] == "pause"
    # not all there yet, or fell back to an older checkpoint: not made up
    unfinished = postcopy()
    unfinished.local = None
    assert live_result(job(), Op(id="op-1", kind=OpKind.MIGRATE, args=unfinished), NOW)["lost_s"] is None
    fell = postcopy()
    fell.fallback_error = "the source a is lost"
    assert live_result(job(), Op(id="op-1", kind=OpKind.MIGRATE, args=fell), NOW)["lost_s"] is None


def test_a_pre_copy_move_counts_its_rounds_and_ends_at_the_restore() -> None:
    args = LiveMove(source="a", target="b", mode="precopy", final_cpu_s=52.0, dumped_at=NOW - 1.0,
                    rounds=[Round(checkpoint="r1", bytes_uploaded=1, freeze_ms=300.0, dumped_at=NOW - 4.0,
                                  cpu_s=50.0, cores=1.0)])
    s = restore.on_restored(job(), Op(id="op-1", kind=OpKind.MIGRATE, phase="restore", args=args), restored(), NOW)
    # window 4 s, 2 CPU s of work at 1 core: 2 s lost
    assert s.op.result["lost_s"] == pytest.approx(2.0) and s.job.last_move_lost_s == pytest.approx(2.0)
