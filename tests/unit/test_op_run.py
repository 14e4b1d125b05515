"""A job's own life as pure transitions (ferry.scheduler.ops.run): placed, started, killed, exited."""

from ferry.common import wire
from ferry.common.models import Job, JobState, Op, OpKind, OpState
from ferry.scheduler.ops import run
from ferry.scheduler.ops.step import Placement, SaveJob, SaveOp

NOW = 10_000.0


def job(**kw: object) -> Job:
    return Job.model_validate({"id": "job-1", "name": "t1", "argv": ["x"], "checkpoint_every_s": 60.0} | kw)


def submit_op(**kw: object) -> Op:
    return Op.model_validate({"id": "op-s", "kind": OpKind.SUBMIT, "job": "job-1", "state": OpState.RUNNING,
                              "created": NOW - 1} | kw)


def event(kind: str, **kw: object) -> wire.NodeEvent:
    return wire.NodeEvent.model_validate({"kind": kind, "node": "a", "job": "job-1", "incarnation": 1} | kw)


def test_a_submitted_job_is_recorded_from_its_spec_and_its_op_runs() -> None:
    spec = wire.JobSpec(name="t1", argv=["python", "x.py"], node="a", cpus=2)
    s = run.submit(spec.to_job("job-1", "op-s"), Op(id="op-s", kind=OpKind.SUBMIT))
    assert (s.job.id, s.job.requested_node, s.job.cpus, s.job.op) == ("job-1", "a", 2, "op-s")
    assert [e.event for e in s.effects if isinstance(e, SaveJob)] == ["submitted"]
    accepted = run.accept(s.job, s.op)
    assert (accepted.op.state, accepted.op.job) == (OpState.RUNNING, "job-1")


def test_a_submit_that_fits_is_recorded_once_then_launched_and_one_that_does_not_waits_for_place() -> None:
    spec = wire.JobSpec(name="t1", argv=["x"])
    s = run.submit(spec.to_job("job-1", "op-s"), Op(id="op-s", kind=OpKind.SUBMIT),
                   placement=Placement("a", gpus=("GPU-1",)))
    assert [type(e).__name__ for e in s.effects] == ["SaveJob", "SaveOp", "Send"]  # the record before the launch
    saved = s.effects[0]
    assert isinstance(saved, SaveJob) and saved.event == "submitted"
    assert (saved.job.node, saved.job.incarnation, saved.job.gpu_uuids, saved.job.state) == (
        "a", 1, ["GPU-1"], JobState.PENDING)
    assert (s.op.state, s.op.job) == (OpState.RUNNING, "job-1")
    assert [(c.cmd.kind, c.cmd.job.node, c.cmd.incarnation, c.cmd.op) for c in s.commands()] == [
        ("launch", "a", 1, "op-s")]
    waits = run.submit(spec.to_job("job-1", "op-s"), Op(id="op-s", kind=OpKind.SUBMIT),
                       placement=Placement(None, "full"))
    assert [type(e).__name__ for e in waits.effects] == ["SaveJob", "SaveOp"] and not waits.commands()
    assert (waits.job.node, waits.job.incarnation) == (None, 0)


def test_a_placed_job_is_launched_as_its_next_incarnation_and_one_that_fits_nowhere_waits() -> None:
    s = run.place(job(op="op-s"), submit_op(), Placement("a", gpus=("GPU-1",)), NOW)
    assert (s.job.node, s.job.incarnation, s.job.gpu_uuids) == ("a", 1, ["GPU-1"])
    assert [(c.cmd.kind, c.cmd.job.node, c.cmd.incarnation, c.cmd.op) for c in s.commands()] == [
        ("launch", "a", 1, "op-s")]
    waits = run.place(job(op="op-s"), submit_op(), Placement(None, "no node has 64 CPUs"), NOW)
    assert (waits.job.reason, waits.job.op, waits.job.node) == ("no node has 64 CPUs", None, None)
    assert waits.op.state == OpState.DONE and not waits.commands()  # accepted: it starts when it fits
    again = run.place(waits.job, None, Placement(None, "no node has 64 CPUs"), NOW)
    assert again.effects == []  # nothing changed: nothing written


def test_a_started_job_runs_and_its_submit_is_done_a_failed_launch_fails_it() -> None:
    s = run.on_started(job(op="op-s"), submit_op(), event("started", pid=7), NOW)
    assert s is not None and (s.job.state, s.job.node, s.job.op) == (JobState.RUNNING, "a", None)
    assert s.job.next_checkpoint_at == NOW + 60 and s.op.state == OpState.DONE and s.op.job_record == s.job
    assert run.on_started(job(state=JobState.RUNNING), None, event("started"), NOW) is None
    f = run.on_launch_failed(job(op="op-s"), submit_op(), event("launch_failed", error="no such file"), NOW)
    assert f.job.state == JobState.FAILED and f.op.state == OpState.FAILED and f.op.error == "no such file"


def test_a_kill_ends_a_job_at_once_unless_it_runs_then_its_node_kills_it() -> None:
    kill = Op(id="op-k", kind=OpKind.KILL, job="job-1")
    parked = run.kill(job(state=JobState.PREEMPTED, node="a"), kill, 5.0, NOW)
    assert parked.job.state == JobState.KILLED and parked.op.state == OpState.DONE and not parked.commands()
    running = run.kill(job(state=JobState.RUNNING, node="a", incarnation=2), kill, 5.0, NOW)
    assert (running.job.kill_requested, running.job.kill_op, running.op.state) == (True, "op-k", OpState.RUNNING)
    assert [(c.cmd.kind, c.cmd.job.node, c.cmd.grace_s) for c in running.commands()] == [("kill", "a", 5.0)]
    done = run.kill(job(state=JobState.SUCCEEDED), kill, 5.0, NOW)
    assert done.op.state == OpState.DONE and done.job.state == JobState.SUCCEEDED


def test_an_exit_ends_the_job_its_kill_and_the_op_in_flight() -> None:
    killing = job(state=JobState.RUNNING, node="a", kill_requested=True, kill_op="op-k")
    kill = Op(id="op-k", kind=OpKind.KILL, job="job-1", state=OpState.RUNNING)
    s = run.on_exited(killing, None, kill, event("exited", signal=9), NOW)
    assert (s.job.state, s.job.exit_code, s.job.kill_op) == (JobState.KILLED, 137, None)
    ended = [e.op for e in s.effects if isinstance(e, SaveOp)]
    assert [(o.id, o.state) for o in ended] == [("op-k", OpState.DONE)]
    ok = run.on_exited(job(state=JobState.RUNNING, op="op-s"), submit_op(), None, event("exited", exit_code=0), NOW)
    assert ok.job.state == JobState.SUCCEEDED and ok.op.state == OpState.DONE  # it ran: the submit worked
    moving = Op(id="op-m", kind=OpKind.CHECKPOINT, job="job-1", state=OpState.RUNNING)
    bad = run.on_exited(job(state=JobState.CHECKPOINTING, op="op-m"), moving, None, event("exited", exit_code=3),
                        NOW)
    assert bad.job.state == JobState.FAILED and bad.op.state == OpState.FAILED
    assert bad.op.error == "job t1 exited (exit code 3) during the checkpoint"
