"""A job's own life: placed and launched, started, killed, exited.

    submit    the job record from its spec (the shell checks the name is free and the node known)
    place     a pending job goes to its placement's node (launch, incarnation + 1), or waits with
              the reason; either way its submit op is done: the request was accepted
    started   the node runs it; launch_failed: it could not start (the op ends in the error)
    kill      a job that is not running anywhere is killed at once; a running one is killed on
              its node, and the kill op ends when the job's exit is reported
    exited    the job ended on its node: succeeded, failed, or killed when a kill was asked; the op
              in flight, if any, ends (a submit as done: it ran)
"""

from ferry.common import wire
from ferry.common.models import Job, JobState, Op, OpKind, OpState
from ferry.scheduler.ops.step import Placement, SaveOp, Step, ended, next_checkpoint_at, no_op


def submit(job: Job, op: Op, *, placement: Placement | None = None) -> Step:
    """A new job (``JobSpec.to_job``, with a bridge-network job's address allocated by the shell,
    ``ferry.common.jobnet``) recorded, its submit op running, and, when `placement` names a node,
    the job sent there in the same step: one record of the job (with the ``submitted`` event), its
    op, then the launch. The record goes before the command, so a scheduler that dies in between
    finds the job when the submit is redelivered and places it again as its next incarnation. A
    job that fits nowhere yet (or a submit given no placement) is recorded pending for ``place``."""
    s = Step.of(job, op)
    placed = placement is not None and placement.node is not None
    if placed:
        assert placement is not None
        _assign(s.job, placement)
    s.save_job("submitted")
    s.op.job, s.op.state = s.job.id, OpState.RUNNING
    s.save_op()
    if placed:
        _launch(s)
    return s


def accept(job: Job, op: Op) -> Step:
    """The submit op runs (the job is recorded; it starts when it is placed)."""
    s = Step.of(job, op)
    s.op.job, s.op.state = job.id, OpState.RUNNING
    s.save_op()
    return s


def place(job: Job, op: Op | None, placement: Placement, now: float) -> Step:
    """A pending job (`op`: its submit, if still running) to the placement's node, or waiting."""
    s = Step.of(job, op or no_op(job))
    job = s.job
    if placement.node is None:
        changed = job.reason != placement.why or job.op is not None
        if job.reason != placement.why:
            job.reason = placement.why
            s.save_job("pending", placement.why)
        job.op = None
        s.finish(now)  # the submit is accepted: the job starts when it fits
        if changed:
            s.save_job()
        return s
    _assign(job, placement)
    s.save_job()
    _launch(s)
    return s


def _assign(job: Job, placement: Placement) -> None:
    """The job's next incarnation, on the placement's node (with its GPUs)."""
    job.incarnation += 1
    job.node, job.reason = placement.node, None
    job.gpu_uuids = list(placement.gpus)


def _launch(s: Step) -> None:
    s.send("checkpointer", wire.NodeCommand(kind="launch", op=s.job.op, job=s.job.clone(),
                                            incarnation=s.job.incarnation))


def on_started(job: Job, op: Op | None, ev: wire.NodeEvent, now: float) -> Step | None:
    if job.state != JobState.PENDING:
        return None
    s = Step.of(job, op or no_op(job))
    job = s.job
    job.state, job.node, job.reason = JobState.RUNNING, ev.node, None
    job.next_checkpoint_at = next_checkpoint_at(job, now)
    job.op = None
    s.save_job("started", f"on {ev.node} (pid {ev.pid})")
    s.finish(now)
    return s


def on_launch_failed(job: Job, op: Op | None, ev: wire.NodeEvent, now: float) -> Step:
    s = Step.of(job, op or no_op(job))
    s.job.state, s.job.error, s.job.op = JobState.FAILED, ev.error, None
    s.save_job("failed", ev.error or "")
    s.finish(now, error=ev.error or "the job could not start", error_code=ev.error_code)
    return s


def kill(job: Job, op: Op, grace_s: float, now: float) -> Step:
    s = Step.of(job, op)
    job, op = s.job, s.op
    if job.terminal:
        s.finish(now)
        return s
    if job.state in (JobState.PENDING, JobState.PREEMPTED) or not job.node:
        job.state, job.kill_requested = JobState.KILLED, True
        s.save_job("killed")
        s.finish(now)
        return s
    job.kill_requested, job.kill_op = True, op.id
    s.save_job()
    op.state = OpState.RUNNING
    s.save_op()
    s.send("checkpointer", wire.NodeCommand(kind="kill", op=op.id, job=job.clone(),
                                            incarnation=job.incarnation, grace_s=grace_s))
    return s


def on_exited(job: Job, op: Op | None, kill_op: Op | None, ev: wire.NodeEvent, now: float) -> Step:
    """The job ended on its node (not by a checkpoint, not a live move's target: see
    ``live_move.on_target_exited``). `op`: the op in flight; `kill_op`: the kill waiting for it."""
    s = Step.of(job, op or no_op(job))
    job = s.job
    unknown = ev.exit_code is None and ev.signal is None  # an adopted process whose parent reaped it first
    code = ev.exit_code if ev.exit_code is not None else 128 + (ev.signal or 0)
    job.exit_code = None if unknown else code
    if job.kill_requested:
        job.state = JobState.KILLED
    elif unknown:
        job.state = JobState.ENDED
        job.reason = "its exit status went to its own parent (it was adopted) before Ferry could read it"
    else:
        job.state = JobState.SUCCEEDED if code == 0 else JobState.FAILED
    job.op, job.kill_op = None, None
    detail = ("exit status unknown" if unknown else f"exit code {ev.exit_code}" if ev.exit_code is not None
              else f"signal {ev.signal}")
    s.save_job("exited", detail)
    if kill_op is not None and (done := ended(kill_op, now, job=job)) is not None:
        s.effects.append(SaveOp(done))
    if op is not None and op.kind == OpKind.SUBMIT:
        s.finish(now)  # it started and already ended: the submit worked
    elif op is not None:
        s.finish(now, error=f"job {job.name} exited ({detail}) during the {op.kind}")
    return s
