"""Failover's pure transition (ferry.scheduler.ops.failover) and the choice of whom to park to
make room (ferry.policy.preemption), without a bus."""

from ferry.common.models import Job, JobState, Node, NodeState, Op, OpKind, OpState
from ferry.common.opargs import CheckpointArgs, ColdMove, RestoreArgs
from ferry.policy.decisions import JobView, NodeView
from ferry.policy.preemption import victims
from ferry.scheduler.ops import evacuate, failover
from ferry.scheduler.ops.step import Placement, SaveJob, SaveOp

NOW = 10_000.0


def job(**kw: object) -> Job:
    fields: dict[str, object] = {"id": "job-1", "name": "t1", "argv": ["x"], "node": "a", "state": JobState.RUNNING,
                                 "incarnation": 3, "last_checkpoint": "ck-old"}
    return Job.model_validate(fields | kw)


def test_a_lost_node_means_a_restore_of_the_last_checkpoint_elsewhere_as_the_next_incarnation() -> None:
    s = failover.on_lost(job(), None, "a", Placement("b", gpus=("GPU-1",)), restore_op="op-r", now=NOW)
    assert (s.job.state, s.job.node, s.job.op, s.job.incarnation) == (JobState.RESTORING, "b", "op-r", 4)
    assert s.job.gpu_uuids == ["GPU-1"]
    assert (s.op.kind, s.op.phase, s.op.checkpoint) == (OpKind.RESTORE, "restore", "ck-old")
    assert s.op.state == OpState.RUNNING
    assert isinstance(s.op.args, RestoreArgs) and (s.op.args.failover, s.op.args.target) == ("a", "b")
    assert [(c.service, c.cmd.job.node, c.cmd.kind, c.cmd.incarnation) for c in s.commands()] == [
        ("migrator", "b", "restore", 4)]


def test_the_op_in_flight_ends_in_the_loss() -> None:
    moving = Op(id="op-m", kind=OpKind.MIGRATE, job="job-1", state=OpState.RUNNING, created=NOW - 1,
                args=ColdMove(source="a", target="b"))
    s = failover.on_lost(job(op="op-m", state=JobState.MIGRATING, moving_to="b"), moving, "a", Placement("c"),
                         restore_op="op-r", now=NOW)
    ended = [e.op for e in s.effects if isinstance(e, SaveOp) and e.op.id == "op-m"]
    assert len(ended) == 1 and ended[0].state == OpState.FAILED and "node a was lost" in (ended[0].error or "")
    assert s.job.moving_to is None and s.job.node == "c"
    done = moving.model_copy(update={"state": OpState.DONE})
    again = failover.on_lost(job(), done, "a", Placement("c"), restore_op="op-r", now=NOW)
    assert not [e for e in again.effects if isinstance(e, SaveOp) and e.op.id == "op-m"]  # it ended once


def test_with_no_room_the_job_is_parked_and_without_a_checkpoint_it_starts_again() -> None:
    parked = failover.on_lost(job(), None, "a", Placement(None, "no node has 2 CPUs free"), restore_op="op-r",
                              now=NOW)
    assert (parked.job.state, parked.job.parked_by, parked.job.incarnation) == (JobState.PREEMPTED, "capacity", 4)
    assert "no node has 2 CPUs free" in (parked.job.reason or "") and not parked.commands()
    fresh = failover.on_lost(job(last_checkpoint=None), None, "a", Placement(None), restore_op="op-r", now=NOW)
    assert (fresh.job.state, fresh.job.node, fresh.job.restarts) == (JobState.PENDING, None, 1)
    assert [e.event for e in fresh.effects if isinstance(e, SaveJob)] == ["failover"] and not fresh.commands()
    gpu = failover.on_lost(job(), None, "a", Placement("b"), why="GPU fault on a: Xid 79", restore_op="op-r",
                           now=NOW)
    assert any(isinstance(e, SaveJob) and "GPU fault on a" in e.message for e in gpu.effects)


def test_the_fewest_lowest_priority_jobs_are_parked_on_the_first_node_where_that_makes_room() -> None:
    urgent = JobView(id="u", priority=10, cpus=4)
    views = [NodeView(id="a", spot=False, price_per_hour=1, cpus=4, free_cpus=0),
             NodeView(id="b", spot=False, price_per_hour=1, cpus=4, free_cpus=1)]
    jobs = [Job(id="j-old", name="old", argv=["x"], node="b", state=JobState.RUNNING, priority=1, cpus=2, created=1),
            Job(id="j-new", name="new", argv=["x"], node="b", state=JobState.RUNNING, priority=1, cpus=1, created=2),
            Job(id="j-hi", name="hi", argv=["x"], node="b", state=JobState.RUNNING, priority=20, cpus=1),
            Job(id="j-a", name="on-a", argv=["x"], node="a", state=JobState.RUNNING, priority=1, cpus=4)]
    found = victims(urgent, jobs, views, exclude="a")
    assert found is not None and found[0] == "b"
    assert [j.id for j in found[1]] == ["j-new", "j-old"]  # youngest first, until 4 CPUs are free
    assert victims(JobView(id="u", priority=10, cpus=8), jobs, views, exclude="a") is None  # never enough
    assert victims(JobView(id="u", priority=1, cpus=2), jobs, views, exclude="a") is None  # no lower priority


def test_an_evacuation_moves_the_job_where_it_fits_or_parks_it() -> None:
    draining = Node(id="a", state=NodeState.DRAINING)
    op, event = evacuate.plan(job(), draining, Placement("b"), "op-e")
    assert op.kind == OpKind.MIGRATE and isinstance(op.args, ColdMove)
    assert (op.args.source, op.args.target, op.args.evacuate) == ("a", "b", "draining")
    assert event.kind == "evacuating" and "moving to b" in event.message
    op, event = evacuate.plan(job(), draining, Placement(None, "no node has 2 CPUs free"), "op-e")
    assert op.kind == OpKind.CHECKPOINT and isinstance(op.args, CheckpointArgs) and op.args.parked_by == "capacity"
    assert "no node has 2 CPUs free" in (op.args.reason or "") and "parking" in event.message


def test_a_here_job_is_never_restarted_by_ferry_after_its_node_is_lost() -> None:
    """Its `--here` command's supervisor (a SLURM step, a container runtime) starts it again: a
    restore or a fresh start by Ferry would make it run twice."""
    s = failover.on_lost(job(here=True), None, "a", Placement("b"), restore_op="op-r", now=NOW)
    assert (s.job.state, s.job.parked_by, s.job.incarnation) == (JobState.PREEMPTED, "user", 4)
    assert "ferry restore t1 [--here]" in (s.job.reason or "") and not s.commands()
    fresh = failover.on_lost(job(here=True, last_checkpoint=None), None, "a", Placement("b"), restore_op="op-r",
                             now=NOW)
    assert (fresh.job.state, fresh.job.restarts) == (JobState.FAILED, 0) and not fresh.commands()
    assert "node a was lost" in (fresh.job.error or "")


def test_a_here_job_leaving_a_node_is_parked_for_the_user_never_moved() -> None:
    node = Node(id="a", state=NodeState.DRAINING)
    op, _ = evacuate.plan(job(here=True), node, Placement(None, "it runs in the foreground"), "op-e")
    assert op.kind == OpKind.CHECKPOINT and isinstance(op.args, CheckpointArgs) and op.args.parked_by == "user"
    op, _ = evacuate.plan(job(), node, Placement(None, "full"), "op-e")
    assert isinstance(op.args, CheckpointArgs) and op.args.parked_by == "capacity"


def test_an_adopted_job_is_never_restarted_by_ferry_and_an_unknown_exit_status_ends_it() -> None:
    from ferry.common import wire
    from ferry.scheduler.ops import run

    lost = failover.on_lost(job(adopt_pid=4242, adopted=True, last_checkpoint=None), None, "a", Placement("b"),
                            restore_op="op-r", now=NOW)
    assert lost.job.state == JobState.FAILED and not lost.commands()
    ev = wire.NodeEvent(kind="exited", node="a", job="job-1", incarnation=3, exit_code=None, signal=None)
    ended = run.on_exited(job(adopt_pid=4242, adopted=True), None, None, ev, NOW)
    assert (ended.job.state, ended.job.exit_code) == (JobState.ENDED, None)
    assert "its own parent" in (ended.job.reason or "")
