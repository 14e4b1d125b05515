"""A gang's group checkpoint and restore (ferry.scheduler.ops.gang) and the checks before them
(ferry.policy.gangs), branch by branch, without a bus."""

import pytest

from ferry.common import wire
from ferry.common.errors import ConflictError, NotFoundError, UsageError
from ferry.common.models import CheckpointRecord, GangCheckpoint, Job, JobState, Network, Op, OpKind, OpState
from ferry.common.opargs import GangCheckpointArgs, GangRestoreArgs
from ferry.policy import gangs
from ferry.scheduler.ops import gang
from ferry.scheduler.ops.gang import GangStep, SaveGang
from ferry.scheduler.ops.step import SaveJob, SaveOp, Send

NOW = 10_000.0


def member(n: int, **kw: object) -> Job:
    fields: dict[str, object] = {"id": f"job-{n}", "name": f"m{n}", "argv": ["x"], "node": f"n{n}",
                                 "state": JobState.RUNNING, "incarnation": 2, "gang": "g",
                                 "network": Network.BRIDGE, "checkpoint_every_s": 60.0}
    return Job.model_validate(fields | kw)


def sends(step: GangStep) -> list[tuple[str, str, str, bool]]:
    return [(e.cmd.kind, e.cmd.job.id, e.service, e.cmd.stop) for e in step.effects if isinstance(e, Send)]


def saved_jobs(step: GangStep) -> dict[str, Job]:
    return {e.job.id: e.job for e in step.effects if isinstance(e, SaveJob)}


def last_op(step: GangStep) -> Op:
    return [e.op for e in step.effects if isinstance(e, SaveOp)][-1]


def rec(job: str, ckpt: str, freeze: float) -> CheckpointRecord:
    return CheckpointRecord(id=ckpt, job=job, freeze_ms=freeze, bytes_uploaded=100)


def locked_and_dumping() -> tuple[list[Job], Op]:
    jobs = [member(1), member(2)]
    s = gang.begin_checkpoint("g", jobs, Op(id="op-abc", kind=OpKind.CHECKPOINT), stop=False, now=NOW)
    jobs, op = list(s.jobs.values()), s.op
    op = gang.on_locked(jobs, op, "job-1").op
    s = gang.on_locked(jobs, op, "job-2")
    return jobs, s.op


# ---- the checks ---------------------------------------------------------------------------------

def test_a_gang_checkpoint_needs_every_member_running_and_idle() -> None:
    gangs.gang_checkpointable("g", [member(1), member(2)])
    with pytest.raises(NotFoundError, match="no gang 'g'"):
        gangs.gang_checkpointable("g", [])
    with pytest.raises(ConflictError, match="member m2 is still starting"):
        gangs.gang_checkpointable("g", [member(1), member(2, state=JobState.PENDING, node=None)])
    with pytest.raises(ConflictError, match="member m1 is busy"):
        gangs.gang_checkpointable("g", [member(1, op="op-x"), member(2)])
    with pytest.raises(ConflictError, match="member m2 is preempted"):
        gangs.gang_checkpointable("g", [member(1), member(2, state=JobState.PREEMPTED)])


def test_members_are_the_gangs_jobs_that_can_still_run() -> None:
    jobs = [member(2), member(1), member(3, gang="other"), member(4, state=JobState.KILLED),
            member(5, state=JobState.PREEMPTED)]
    assert [j.name for j in gangs.gang_members(jobs, "g")] == ["m1", "m2", "m5"]


def test_a_gang_restore_needs_every_member_stopped_and_a_group_that_holds_them_all() -> None:
    stopped = [member(1, state=JobState.PREEMPTED), member(2, state=JobState.PREEMPTED)]
    old = GangCheckpoint(id="gk-old", gang="g", created=1.0, members={"job-1": "a", "job-2": "b"})
    partial = GangCheckpoint(id="gk-new", gang="g", created=2.0, members={"job-1": "c"})
    group = gangs.newest_group([old, partial], stopped)
    assert group is old  # the newer one lacks a member
    assert gangs.gang_restorable("g", stopped, group) is old
    with pytest.raises(ConflictError, match="no committed group checkpoint"):
        gangs.gang_restorable("g", stopped, None)
    with pytest.raises(ConflictError, match="member m1 is running on n1: stop the gang first"):
        gangs.gang_restorable("g", [member(1), stopped[1]], old)
    with pytest.raises(ConflictError, match="never started"):
        gangs.gang_restorable("g", [member(1, state=JobState.PENDING), stopped[1]], old)


def test_the_users_nodes_must_give_each_member_its_own_unless_colocating() -> None:
    two = [member(1), member(2)]
    assert gangs.assign_nodes(two, ["x", "y", "z"], allow_colocate=False) == {"job-1": "x", "job-2": "y"}
    assert gangs.assign_nodes(two, [], allow_colocate=False) == {}
    with pytest.raises(UsageError, match="2 members and --nodes names 1 node"):
        gangs.assign_nodes(two, ["x"], allow_colocate=False)
    with pytest.raises(UsageError, match="names a node twice"):
        gangs.assign_nodes(two, ["x", "x"], allow_colocate=False)
    assert gangs.assign_nodes(two, ["x"], allow_colocate=True) == {"job-1": "x", "job-2": "x"}


# ---- group checkpoint ---------------------------------------------------------------------------

def test_every_member_is_locked_before_any_member_dumps() -> None:
    jobs = [member(1), member(2)]
    s = gang.begin_checkpoint("g", jobs, Op(id="op-abc", kind=OpKind.CHECKPOINT), stop=False, now=NOW)
    assert sends(s) == [("gang_lock", "job-1", "checkpointer", False), ("gang_lock", "job-2", "checkpointer", False)]
    assert all(j.state == JobState.CHECKPOINTING and j.op == "op-abc" for j in saved_jobs(s).values())
    assert s.op.phase == "lock" and s.op.checkpoint == "gk-abc"
    first = gang.on_locked(list(s.jobs.values()), s.op, "job-1")
    assert sends(first) == []  # one member locked: nobody dumps yet
    again = gang.on_locked(list(s.jobs.values()), first.op, "job-1")
    assert again.effects == []  # a redelivered report changes nothing
    both = gang.on_locked(list(s.jobs.values()), first.op, "job-2")
    assert both.op.phase == "dump"
    assert sends(both) == [("checkpoint", "job-1", "checkpointer", False),
                           ("checkpoint", "job-2", "checkpointer", False)]
    ids = [e.cmd.checkpoint for e in both.effects if isinstance(e, Send)]
    assert ids == ["ck-abc-0", "ck-abc-1"]


def test_the_group_commits_only_when_every_member_did_then_everyone_is_released() -> None:
    jobs, op = locked_and_dumping()
    one = gang.on_member_committed(jobs, op, "job-1", rec("job-1", "ck-abc-0", 80.0), NOW + 1)
    assert not any(isinstance(e, SaveGang) for e in one.effects) and sends(one) == []
    two = gang.on_member_committed(jobs, one.op, "job-2", rec("job-2", "ck-abc-1", 120.0), NOW + 1)
    groups = [e.record for e in two.effects if isinstance(e, SaveGang)]
    assert len(groups) == 1
    group = groups[0]
    assert group.members == {"job-1": "ck-abc-0", "job-2": "ck-abc-1"} and group.id == "gk-abc"
    assert (group.freeze_ms, group.freeze_ms_sum) == (120.0, 200.0)  # the slowest, and the sum
    kinds = [type(e).__name__ for e in two.effects]
    assert kinds.index("SaveGang") < kinds.index("Send")  # committed before anyone is released
    assert sends(two) == [("gang_release", "job-1", "checkpointer", False),
                          ("gang_release", "job-2", "checkpointer", False)]
    assert all(j.gang_checkpoint == "gk-abc" for j in saved_jobs(two).values())
    members = list(saved_jobs(two).values())
    r1 = gang.on_released(members, two.op, "job-1", NOW + 2)
    assert r1.op.state == OpState.RUNNING and saved_jobs(r1)["job-1"].state == JobState.RUNNING
    r2 = gang.on_released(members, r1.op, "job-2", NOW + 2)
    done = last_op(r2)
    assert done.state == OpState.DONE
    assert done.result["lock_ms"] == 2000.0 and done.result["freeze_ms"] == 120.0


def test_a_final_group_checkpoint_ends_every_member_and_parks_it() -> None:
    jobs = [member(1), member(2)]
    s = gang.begin_checkpoint("g", jobs, Op(id="op-abc", kind=OpKind.CHECKPOINT), stop=True, now=NOW)
    op = gang.on_locked(list(s.jobs.values()), s.op, "job-1").op
    op = gang.on_locked(list(s.jobs.values()), op, "job-2").op
    op = gang.on_member_committed(jobs, op, "job-1", rec("job-1", "ck-abc-0", 1.0), NOW).op
    s = gang.on_member_committed(jobs, op, "job-2", rec("job-2", "ck-abc-1", 1.0), NOW)
    assert all(stop for kind, _, _, stop in sends(s) if kind == "gang_release") and sends(s)
    members = [j.model_copy(update={"state": JobState.CHECKPOINTING, "op": "op-abc"}) for j in jobs]
    r = gang.on_released(members, s.op, "job-1", NOW)
    parked = saved_jobs(r)["job-1"]
    assert parked.state == JobState.PREEMPTED and parked.parked_by == "user" and parked.op is None


def test_a_member_that_cannot_dump_undoes_the_group_and_unlocks_everyone() -> None:
    jobs, op = locked_and_dumping()
    op = gang.on_member_committed(jobs, op, "job-1", rec("job-1", "ck-abc-0", 1.0), NOW).op
    s = gang.on_member_failed(jobs, op, "job-2", "criu said no", NOW)
    assert s.op.phase == "abort" and not any(isinstance(e, SaveGang) for e in s.effects)
    assert sends(s) == [("gang_release", "job-1", "checkpointer", False),
                        ("gang_release", "job-2", "checkpointer", False)]  # unlocked, never stopped
    late = gang.on_member_committed(jobs, s.op, "job-2", rec("job-2", "ck-abc-1", 1.0), NOW)
    assert late.effects == []  # a dump that ends after the abort commits no group
    members = [j.model_copy(update={"state": JobState.CHECKPOINTING, "op": "op-abc"}) for j in jobs]
    op = gang.on_released(members, s.op, "job-1", NOW).op
    end = gang.on_released(members, op, "job-2", NOW)
    assert saved_jobs(end)["job-2"].state == JobState.RUNNING
    failed = last_op(end)
    assert failed.state == OpState.FAILED and "member m2: criu said no" in (failed.error or "")


def test_a_member_that_cannot_be_locked_undoes_the_group_before_anyone_dumps() -> None:
    jobs = [member(1), member(2)]
    s = gang.begin_checkpoint("g", jobs, Op(id="op-abc", kind=OpKind.CHECKPOINT), stop=False, now=NOW)
    op = gang.on_locked(list(s.jobs.values()), s.op, "job-1").op
    s = gang.on_member_failed(list(s.jobs.values()), op, "job-2", "not running on n2", NOW)
    assert [k for k, *_ in sends(s)] == ["gang_release", "gang_release"]


def test_an_armed_fault_fails_the_last_members_dump_only() -> None:
    jobs = [member(1), member(2)]
    s = gang.begin_checkpoint("g", jobs, Op(id="op-abc", kind=OpKind.CHECKPOINT), stop=False, now=NOW, fault=True)
    op = gang.on_locked(list(s.jobs.values()), s.op, "job-1").op
    s = gang.on_locked(list(s.jobs.values()), op, "job-2")
    fails = [e.cmd.options.fail for e in s.effects if isinstance(e, Send)]
    assert fails == [None, "round"]


def test_a_restarted_scheduler_sends_the_phases_commands_again() -> None:
    jobs, op = locked_and_dumping()
    assert [k for k, *_ in sends(gang.resend(jobs, op))] == ["checkpoint", "checkpoint"]
    assert isinstance(op.args, GangCheckpointArgs)


# ---- group restore ------------------------------------------------------------------------------

def group() -> GangCheckpoint:
    return GangCheckpoint(id="gk-1", gang="g", members={"job-1": "ck-1-0", "job-2": "ck-1-1"})


def test_a_gang_restore_restores_each_member_from_its_checkpoint_of_the_group() -> None:
    stopped = [member(1, state=JobState.PREEMPTED), member(2, state=JobState.PREEMPTED)]
    s = gang.begin_restore("g", stopped, Op(id="op-r", kind=OpKind.RESTORE), group(), {"job-1": "x", "job-2": "y"})
    assert [(e.cmd.kind, e.cmd.job.node, e.cmd.checkpoint, e.cmd.incarnation) for e in s.effects
            if isinstance(e, Send)] == [("restore", "x", "ck-1-0", 3), ("restore", "y", "ck-1-1", 3)]
    jobs = list(s.jobs.values())
    ev = wire.NodeEvent(kind="restored", node="x", job="job-1", incarnation=3, pid=5)
    one = gang.on_member_restored(jobs, s.op, ev, NOW)
    assert saved_jobs(one)["job-1"].state == JobState.RUNNING and one.op.state == OpState.RUNNING
    ev2 = wire.NodeEvent(kind="restored", node="y", job="job-2", incarnation=3, pid=6)
    two = gang.on_member_restored(jobs, one.op, ev2, NOW)
    assert two.op.phase == "release"  # all back: now every member's port opens
    assert sends(two) == [("gang_release", "job-1", "checkpointer", False),
                          ("gang_release", "job-2", "checkpointer", False)]
    op = gang.on_released(jobs, two.op, "job-1", NOW).op
    assert op.state == OpState.RUNNING
    done = last_op(gang.on_released(jobs, op, "job-2", NOW))
    assert done.state == OpState.DONE and done.result["nodes"] == {"job-1": "x", "job-2": "y"}
    assert isinstance(s.op.args, GangRestoreArgs)
    assert all(e.cmd.hold for e in s.effects if isinstance(e, Send))  # restored with their ports blocked


def test_a_member_that_fails_to_restore_stops_the_ones_that_came_back() -> None:
    stopped = [member(1, state=JobState.PREEMPTED), member(2, state=JobState.PREEMPTED)]
    s = gang.begin_restore("g", stopped, Op(id="op-r", kind=OpKind.RESTORE), group(), {"job-1": "x", "job-2": "y"})
    jobs = list(s.jobs.values())
    ok = gang.on_member_restored(jobs, s.op, wire.NodeEvent(kind="restored", node="x", job="job-1", incarnation=3),
                                 NOW)
    bad = wire.NodeEvent(kind="restore_failed", node="y", job="job-2", incarnation=3, error="no room")
    end = gang.on_member_restore_failed(jobs, ok.op, bad, NOW)
    assert sends(end) == [("gang_release", "job-1", "checkpointer", True)]
    assert saved_jobs(end)["job-1"].state == JobState.PREEMPTED
    failed = last_op(end)
    assert failed.state == OpState.FAILED and "member m2: no room" in (failed.error or "")


# ---- failover -----------------------------------------------------------------------------------

def test_a_lost_members_gang_ends_its_survivors_before_anyone_is_restored() -> None:
    jobs = [member(1, node="a"), member(2, node="b", state=JobState.FAILED, exit_code=1), member(3, node="c")]
    grp = GangCheckpoint(id="gk-1", gang="g", members={"job-1": "c1", "job-2": "c2", "job-3": "c3"})
    in_flight = Op(id="op-old", kind=OpKind.CHECKPOINT, state=OpState.RUNNING)
    s = gang.failover("g", jobs, in_flight, Op(id="op-f", kind=OpKind.RESTORE), "c", grp,
                      {"job-1": "a", "job-2": "b", "job-3": "a"}, NOW)
    ended = [e.op for e in s.effects if isinstance(e, SaveOp) and e.op.id == "op-old"]
    assert ended and ended[0].state == OpState.FAILED and "node c was lost" in (ended[0].error or "")
    assert sends(s) == [("gang_release", "job-1", "checkpointer", True)]  # the only one still running
    stop_cmd = next(e.cmd for e in s.effects if isinstance(e, Send))
    assert stop_cmd.incarnation == 2 and stop_cmd.job.node == "a"  # as the survivor ran, not as it will
    saved = saved_jobs(s)
    assert all(j.incarnation == 3 and j.state == JobState.RESTORING for j in saved.values())
    assert saved["job-2"].exit_code is None  # it failed because its peer was lost: it comes back too
    assert s.op.phase == "stop"
    after = gang.on_released(list(saved.values()), s.op, "job-1", NOW)
    assert after.op.phase == "restore"
    assert [(k, j) for k, j, _, _ in sends(after)] == [("restore", "job-1"), ("restore", "job-2"), ("restore", "job-3")]
    again = gang.resend(list(saved.values()), s.op)  # a restarted scheduler ends the survivor as it ran
    assert [(e.cmd.job.node, e.cmd.incarnation) for e in again.effects if isinstance(e, Send)] == [("a", 2)]


def test_a_gang_without_a_group_checkpoint_starts_again_and_one_without_room_waits() -> None:
    jobs = [member(1, node="a"), member(2, node="c")]
    fresh = gang.failover("g", jobs, None, Op(id="op-f", kind=OpKind.RESTORE), "c", None, None, NOW)
    assert sends(fresh) == [("gang_release", "job-1", "checkpointer", True)]
    done = gang.on_released(list(fresh.jobs.values()), fresh.op, "job-1", NOW)
    assert all(j.state == JobState.PENDING and j.node is None and j.op is None for j in saved_jobs(done).values())
    parked = gang.failover("g", [member(2, node="c")], None, Op(id="op-p", kind=OpKind.RESTORE), "c",
                           GangCheckpoint(id="gk-1", gang="g", members={"job-2": "c2"}), None, NOW)
    assert sends(parked) == [] and saved_jobs(parked)["job-2"].state == JobState.PREEMPTED
    assert saved_jobs(parked)["job-2"].parked_by == "capacity" and last_op(parked).state == OpState.FAILED
