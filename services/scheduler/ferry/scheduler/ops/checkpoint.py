"""Checkpointing a running job, and the checkpoint phase of a cold move.

    [checkpoint]  the checkpointer of ``job.node`` dumps the job (``stop``: and ends it) and commits
                  the checkpoint to the store

Then a checkpoint op ends (the job runs on, or is parked when ``stop``); a cold move goes on to
restore the final checkpoint on its target (``restore``). A failed checkpoint leaves the job
running where it was.
"""

from ferry.common import wire
from ferry.common.models import CheckpointRecord, Job, JobState, Op, OpKind, OpState
from ferry.common.opargs import CheckpointArgs, ColdMove, LiveMove
from ferry.scheduler.ops import restore
from ferry.scheduler.ops.step import Step, derived_id, next_checkpoint_at


def begin(job: Job, op: Op, *, stop: bool) -> Step:
    s = Step.of(job, op)
    start(s, stop=stop)
    return s


def start(s: Step, *, stop: bool) -> None:
    job, op = s.job, s.op
    if isinstance(op.args, CheckpointArgs | ColdMove | LiveMove):
        op.args.stop = stop
    else:
        op.args = CheckpointArgs(stop=stop)
    ckpt = op.checkpoint or derived_id("ck", op.id)
    job.state = JobState.MIGRATING if op.kind == OpKind.MIGRATE else JobState.CHECKPOINTING
    job.op = op.id
    target = op.args.target if isinstance(op.args, ColdMove | LiveMove) else None
    job.moving_to = target if op.kind == OpKind.MIGRATE else None
    s.save_job()
    op.state, op.phase, op.checkpoint, op.job = OpState.RUNNING, "checkpoint", ckpt, job.id
    s.save_op()
    send(s)


def send(s: Step) -> None:
    stop = bool(getattr(s.op.args, "stop", False))
    s.send("checkpointer", wire.NodeCommand(
        kind="checkpoint", op=s.op.id, job=s.job.clone(), incarnation=s.job.incarnation,
        checkpoint=s.op.checkpoint, parent=s.job.last_checkpoint, stop=stop))


def resend(job: Job, op: Op) -> Step:
    s = Step.of(job, op)
    send(s)
    return s


def on_committed(job: Job, op: Op, record: CheckpointRecord, now: float) -> Step:
    """The op's checkpoint committed (not a live move's pre-copy round: ``live_move.on_round``)."""
    s = Step.of(job, op)
    job, op = s.job, s.op
    if op.kind == OpKind.MIGRATE and isinstance(op.args, ColdMove | LiveMove):
        if isinstance(op.args, LiveMove):  # pre-copy only: this was the final delta
            op.args.final_bytes, op.args.final_freeze_ms = record.bytes_uploaded, record.freeze_ms
            op.args.final_cpu_s = record.cpu_s
        op.args.dumped_at = record.dumped_at  # the job's last progress before the move (ferry.policy.lost)
        op.phase = "restore"
        op.args.checkpoint_ms = record.total_ms
        s.save_op()
        job.incarnation += 1
        job.node = op.args.target
        s.save_job("migrating", f"restoring {record.id} on {job.node}")
        restore.send(s)
        return s
    args = op.args if isinstance(op.args, CheckpointArgs) else CheckpointArgs()
    job.state = JobState.PREEMPTED if record.final else JobState.RUNNING
    job.parked_by = (args.parked_by or "user") if record.final else None
    job.reason = (args.reason or "stopped by `ferry checkpoint --stop`") if record.final else None
    job.op = None
    job.next_checkpoint_at = next_checkpoint_at(job, now)
    s.save_job("preempted" if record.final else None)
    s.finish(now, checkpoint=record.id, checkpoint_record=record)
    return s


def on_failed(job: Job, op: Op, record: CheckpointRecord, now: float) -> Step:
    """The op's checkpoint failed: the job runs on where it was."""
    s = Step.of(job, op)
    job = s.job
    if job.state in (JobState.CHECKPOINTING, JobState.MIGRATING):
        job.state = JobState.RUNNING
    job.op, job.moving_to = None, None
    job.next_checkpoint_at = next_checkpoint_at(job, now)
    s.save_job("checkpoint_failed", record.error or "")
    s.finish(now, error=record.error or "checkpoint failed", checkpoint=record.id, checkpoint_record=record)
    return s
