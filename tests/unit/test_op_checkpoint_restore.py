"""The pure transitions of checkpoints, cold moves and restores (ferry.scheduler.ops.checkpoint
and .restore), branch by branch, without a bus."""

import pytest

from ferry.common import wire
from ferry.common.errors import ConflictError
from ferry.common.models import CheckpointRecord, Job, JobState, Op, OpKind, OpState
from ferry.common.opargs import CheckpointArgs, ColdMove, LiveMove, RestoreArgs
from ferry.policy import admission
from ferry.scheduler.ops import checkpoint, restore
from ferry.scheduler.ops.step import SaveJob, Step

NOW = 10_000.0


def job(**kw: object) -> Job:
    fields: dict[str, object] = {"id": "job-1", "name": "t1", "argv": ["x"], "node": "a", "state": JobState.RUNNING,
                                 "incarnation": 3, "last_checkpoint": "ck-old", "checkpoint_every_s": 60.0}
    return Job.model_validate(fields | kw)


def rec(id: str, created: float = NOW, **kw: object) -> CheckpointRecord:
    return CheckpointRecord.model_validate({"id": id, "job": "job-1", "created": created, "total_ms": 1500.0} | kw)


def sent(step: Step) -> list[tuple[str, str | None, str, int]]:
    return [(c.service, c.cmd.job.node, c.cmd.kind, c.cmd.incarnation) for c in step.commands()]


def events(step: Step) -> list[str]:
    return [e.event for e in step.effects if isinstance(e, SaveJob) and e.event is not None]


def restored(node: str = "b") -> wire.NodeEvent:
    return wire.NodeEvent(kind="restored", node=node, job="job-1", incarnation=4, pid=9, restore_ms=500.0)


def restore_failed(node: str = "b", unverifiable: bool = False) -> wire.NodeEvent:
    return wire.NodeEvent(kind="restore_failed", node=node, job="job-1", incarnation=4, error="criu said no",
                          unverifiable=unverifiable, error_code=1)


# ---- checkpoint ----------------------------------------------------------------------------------

def test_only_an_idle_running_job_can_be_checkpointed() -> None:
    admission.checkpointable(job())
    with pytest.raises(ConflictError, match="busy"):
        admission.checkpointable(job(op="op-x"))
    with pytest.raises(ConflictError, match="only a running job"):
        admission.checkpointable(job(state=JobState.PREEMPTED))


def test_a_checkpoint_asks_the_jobs_node_and_the_stop_is_remembered_for_a_resend() -> None:
    op = Op(id="op-abc", kind=OpKind.CHECKPOINT, args=CheckpointArgs())
    s = checkpoint.begin(job(), op, stop=True)
    assert (s.job.state, s.job.op, s.job.moving_to) == (JobState.CHECKPOINTING, "op-abc", None)
    assert (s.op.phase, s.op.checkpoint, s.op.state) == ("checkpoint", "ck-abc", OpState.RUNNING)
    assert sent(s) == [("checkpointer", "a", "checkpoint", 3)] and s.commands()[0].cmd.parent == "ck-old"
    again = checkpoint.resend(s.job, s.op)
    assert again.commands()[0].cmd.stop and again.commands()[0].cmd.checkpoint == "ck-abc"


def test_a_cold_move_holds_its_target_while_it_checkpoints() -> None:
    op = Op(id="op-abc", kind=OpKind.MIGRATE, args=ColdMove(source="a", target="b"))
    s = checkpoint.begin(job(), op, stop=True)
    assert (s.job.state, s.job.moving_to) == (JobState.MIGRATING, "b")


def test_a_committed_checkpoint_ends_the_op_and_a_final_one_parks_the_job() -> None:
    j = job(state=JobState.CHECKPOINTING, op="op-abc")
    op = Op(id="op-abc", kind=OpKind.CHECKPOINT, phase="checkpoint", created=NOW - 2,
            args=CheckpointArgs(stop=False))
    s = checkpoint.on_committed(j, op, rec("ck-abc"), NOW)
    assert (s.job.state, s.job.op, s.job.next_checkpoint_at) == (JobState.RUNNING, None, NOW + 60.0)
    assert s.op.state == OpState.DONE and s.op.checkpoint == "ck-abc" and s.op.total_ms == 2000.0
    parked_op = op.model_copy(update={"args": CheckpointArgs(stop=True, parked_by="capacity", reason="room")})
    p = checkpoint.on_committed(j, parked_op, rec("ck-abc", final=True), NOW)
    assert (p.job.state, p.job.parked_by, p.job.reason) == (JobState.PREEMPTED, "capacity", "room")
    assert events(p) == ["preempted"]
    user = checkpoint.on_committed(j, op.model_copy(update={"args": CheckpointArgs(stop=True)}),
                                   rec("ck-abc", final=True), NOW)
    assert user.job.parked_by == "user" and "ferry checkpoint --stop" in (user.job.reason or "")


def test_a_cold_moves_final_checkpoint_is_restored_on_the_target_as_the_next_incarnation() -> None:
    j = job(state=JobState.MIGRATING, op="op-abc", moving_to="b")
    op = Op(id="op-abc", kind=OpKind.MIGRATE, phase="checkpoint", args=ColdMove(source="a", target="b"))
    s = checkpoint.on_committed(j, op, rec("ck-abc", final=True), NOW)
    assert s.op.phase == "restore" and isinstance(s.op.args, ColdMove) and s.op.args.checkpoint_ms == 1500.0
    assert (s.job.node, s.job.incarnation) == ("b", 4) and sent(s) == [("migrator", "b", "restore", 4)]
    live = op.model_copy(update={"args": LiveMove(source="a", target="b", mode="precopy")})
    s = checkpoint.on_committed(j, live, rec("ck-abc", final=True, bytes_uploaded=77, freeze_ms=12.0), NOW)
    assert isinstance(s.op.args, LiveMove) and (s.op.args.final_bytes, s.op.args.final_freeze_ms) == (77, 12.0)


def test_a_failed_checkpoint_leaves_the_job_running_where_it_was() -> None:
    j = job(state=JobState.MIGRATING, op="op-abc", moving_to="b")
    op = Op(id="op-abc", kind=OpKind.MIGRATE, phase="checkpoint", args=ColdMove(source="a", target="b"))
    s = checkpoint.on_failed(j, op, rec("ck-abc", state="failed", error="disk full"), NOW)
    assert (s.job.state, s.job.op, s.job.moving_to, s.job.node) == (JobState.RUNNING, None, None, "a")
    assert s.op.state == OpState.FAILED and s.op.error == "disk full" and events(s) == ["checkpoint_failed"]


# ---- restore -----------------------------------------------------------------------------------

def test_a_restore_runs_the_job_as_the_next_incarnation_on_its_target() -> None:
    j = job(state=JobState.PREEMPTED, node="a", kill_requested=True, exit_code=137)
    op = Op(id="op-abc", kind=OpKind.RESTORE, args=RestoreArgs())
    s = restore.begin(j, op, target="b", checkpoint="ck-old", pinned=True)
    assert (s.job.state, s.job.node, s.job.incarnation, s.job.kill_requested, s.job.exit_code) == (
        JobState.RESTORING, "b", 4, False, None)
    assert isinstance(s.op.args, RestoreArgs) and s.op.args.pinned and s.op.args.target == "b"
    assert sent(s) == [("migrator", "b", "restore", 4)] and s.commands()[0].cmd.checkpoint == "ck-old"


def test_a_restored_job_runs_and_its_move_cost_is_measured() -> None:
    j = job(state=JobState.MIGRATING, op="op-abc", node="b", incarnation=4, moving_to="b")
    op = Op(id="op-abc", kind=OpKind.MIGRATE, phase="restore", args=ColdMove(source="a", target="b",
                                                                             checkpoint_ms=1500.0))
    s = restore.on_restored(j, op, restored(), NOW)
    assert (s.job.state, s.job.node, s.job.op, s.job.moving_to, s.job.restarts) == (JobState.RUNNING, "b", None,
                                                                                     None, 1)
    assert s.job.move_cost_s == 2.0 and s.job.last_move_at == NOW and s.op.state == OpState.DONE


def test_a_live_moves_fallback_restore_ends_in_the_moves_error() -> None:
    j = job(state=JobState.RESTORING, op="op-abc", node="c", incarnation=5)
    op = Op(id="op-abc", kind=OpKind.MIGRATE, phase="restore", checkpoint="ck-old",
            args=LiveMove(source="a", target="c", fallback_error="the source a is lost"))
    s = restore.on_restored(j, op, restored("c"), NOW)
    assert s.job.state == JobState.RUNNING and s.op.state == OpState.FAILED
    assert s.op.error == "live move failed: the source a is lost; restored from ck-old on c"
    assert s.op.result["to"] == "c"


def test_an_unverifiable_checkpoint_gives_way_to_the_newest_older_one() -> None:
    j = job(state=JobState.RESTORING, op="op-abc", node="b", incarnation=4, last_checkpoint="ck-3")
    op = Op(id="op-abc", kind=OpKind.RESTORE, phase="restore", checkpoint="ck-3", args=RestoreArgs(target="b"))
    ckpts = [rec("ck-1", NOW - 30), rec("ck-2", NOW - 20), rec("ck-3", NOW - 10)]
    s = restore.on_restore_failed(j, op, restore_failed(unverifiable=True), ckpts, NOW)
    assert (s.op.checkpoint, s.job.last_checkpoint, s.job.incarnation) == ("ck-2", "ck-2", 5)
    assert isinstance(s.op.args, RestoreArgs) and set(s.op.args.unverifiable) == {"ck-3"}
    assert "ck-3 did not verify" in s.op.result["fallback"] and sent(s) == [("migrator", "b", "restore", 5)]
    pinned = op.model_copy(update={"args": RestoreArgs(target="b", pinned=True)})
    p = restore.on_restore_failed(j, pinned, restore_failed(unverifiable=True), ckpts, NOW)
    assert p.job.state == JobState.PREEMPTED and p.op.state == OpState.FAILED  # the user's pick: no other
    last = restore.on_restore_failed(j, op, restore_failed(unverifiable=True), [rec("ck-3", NOW - 10)], NOW)
    assert last.job.state == JobState.PREEMPTED  # nothing older left


def test_a_cold_moves_failed_restore_rolls_back_to_the_source_once() -> None:
    j = job(state=JobState.MIGRATING, op="op-abc", node="b", incarnation=4)
    op = Op(id="op-abc", kind=OpKind.MIGRATE, phase="restore", checkpoint="ck-abc", state=OpState.RUNNING,
            args=ColdMove(source="a", target="b"))
    s = restore.on_restore_failed(j, op, restore_failed("b"), [], NOW)
    assert (s.job.node, s.job.incarnation) == ("a", 5) and events(s) == ["migrate_rollback"]
    assert sent(s) == [("migrator", "a", "restore", 5)] and s.op.state == OpState.RUNNING
    again = restore.on_restore_failed(s.job, s.op, restore_failed("a"), [], NOW)
    assert again.job.state == JobState.PREEMPTED and again.op.state == OpState.FAILED
    assert again.op.error == "criu said no; rolling back to a failed too: criu said no"
    assert "ferry restore" in (again.job.reason or "") and not sent(again)


def test_an_ended_op_carries_the_job_and_checkpoint_it_ended_with() -> None:
    j = job(state=JobState.CHECKPOINTING, op="op-abc")
    op = Op(id="op-abc", kind=OpKind.CHECKPOINT, phase="checkpoint", args=CheckpointArgs())
    s = checkpoint.on_committed(j, op, rec("ck-abc"), NOW)
    assert s.op.job_record == s.job and s.op.checkpoint_record is not None and s.op.checkpoint_record.id == "ck-abc"
    before = s.op.model_copy(deep=True)
    s.finish(NOW + 5, error="again")  # an op ends once
    assert s.op == before
