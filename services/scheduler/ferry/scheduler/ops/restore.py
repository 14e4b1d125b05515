"""Restoring a job from a committed checkpoint on a node: the restore op itself, and the restore
phase of every op that ends in one (a cold move, a failover, a parked job coming back, a live move
that fell back).

    [restore]  the migrator of ``job.node`` fetches the checkpoint and restores it (incarnation + 1)

Failures: a checkpoint that did not verify gives way to the newest older one that may (unless the
user named it); a cold move's failed restore rolls back to its source once; otherwise the job is
parked with the error, for `ferry restore` to try another checkpoint or node.
"""

from typing import Any

from ferry.common import wire
from ferry.common.models import CheckpointRecord, Job, JobState, Op, OpState
from ferry.common.opargs import ColdMove, LiveMove, RestoreArgs, RestorePhase
from ferry.policy.fallback import older_checkpoint
from ferry.policy.lost import cold_lost
from ferry.scheduler.ops.live_report import live_result
from ferry.scheduler.ops.step import Step, next_checkpoint_at


def send(s: Step) -> None:
    """The node command of the restore phase (sent again as is after a scheduler restart)."""
    s.send("migrator", wire.NodeCommand(kind="restore", op=s.op.id, job=s.job.clone(),
                                        incarnation=s.job.incarnation, checkpoint=s.op.checkpoint))


def resend(job: Job, op: Op) -> Step:
    s = Step.of(job, op)
    send(s)
    return s


def begin(job: Job, op: Op, *, target: str, checkpoint: str, pinned: bool, here: bool = False) -> Step:
    """The user's restore of a stopped job (already checked: the checkpoint is committed and the
    target can take the job). `here`: in the foreground of the caller on `target`
    (``ferry restore --here``), which then owns the job's restarts."""
    s = Step.of(job, op)
    job, op = s.job, s.op
    job.state, job.op, job.node, job.here = JobState.RESTORING, op.id, target, here
    job.adopt_pid = None  # restored by Ferry: no longer the process another supervisor started
    job.incarnation += 1
    job.kill_requested = False
    job.exit_code = None
    s.save_job("restoring", f"from {checkpoint} on {target}")
    op.state, op.phase, op.checkpoint, op.job = OpState.RUNNING, "restore", checkpoint, job.id
    args = op.args if isinstance(op.args, RestoreArgs) else RestoreArgs()
    args.target, args.pinned = target, pinned  # the user's pick: no other checkpoint instead
    op.args = args
    s.save_op()
    send(s)
    return s


def on_restored(job: Job, op: Op, ev: wire.NodeEvent, now: float) -> Step:
    """The job runs again, on ``ev.node``: the op is done (a live move's fallback ends in its error)."""
    s = Step.of(job, op)
    job, op = s.job, s.op
    job.state, job.node, job.error, job.reason, job.parked_by = JobState.RUNNING, ev.node, None, None, None
    job.moving_to = None
    job.restarts += 1
    job.last_move_at = now
    if ev.restore_ms is not None and isinstance(op.args, RestorePhase):
        job.move_cost_s = (op.args.checkpoint_ms + ev.restore_ms) / 1000 or job.move_cost_s
    job.next_checkpoint_at = next_checkpoint_at(job, now)
    job.op = None
    result: dict[str, Any] | None = None  # a move's: what it cost the job (ferry.policy.lost)
    if isinstance(op.args, LiveMove):
        result = live_result(job, op, now, restored_at=ev.time)
    elif isinstance(op.args, ColdMove) and (cost := cold_lost(op.args.dumped_at, ev.time)) is not None:
        result = {**op.result, **cost.fields()}
    if result is not None:
        job.last_move_lost_s = result["lost_s"]
    s.save_job("restored", f"on {ev.node} (pid {ev.pid})")
    if isinstance(op.args, LiveMove):
        fallback = op.args.fallback_error
        s.finish(now, restore_ms=ev.restore_ms, result=result,
                 error=(f"live move failed: {fallback}; restored from {op.checkpoint} on {ev.node}"
                        if fallback else None))
    elif result is not None:
        s.finish(now, restore_ms=ev.restore_ms, result=result)
    else:
        s.finish(now, restore_ms=ev.restore_ms)
    return s


def on_restore_failed(job: Job, op: Op, ev: wire.NodeEvent, checkpoints: list[CheckpointRecord],
                      now: float) -> Step:
    """The restore on ``ev.node`` failed. `checkpoints`: the job's (only read when the checkpoint
    did not verify)."""
    s = Step.of(job, op)
    pinned = isinstance(op.args, RestoreArgs) and op.args.pinned
    if ev.unverifiable and not pinned and _older(s, ev, checkpoints, now):
        return s
    job, op = s.job, s.op
    args = op.args
    source = (args.source or "") if isinstance(args, ColdMove | LiveMove) else ""
    if isinstance(args, ColdMove | LiveMove) and source and source != ev.node and not args.rolled_back:
        args.rolled_back = True
        args.target_error = ev.error
        s.save_op()
        job.incarnation += 1
        job.node = source
        s.save_job("migrate_rollback", f"restore on {ev.node} failed: {ev.error}")
        send(s)
        return s
    job.state, job.error, job.moving_to = JobState.PREEMPTED, ev.error, None
    job.reason = "the last restore failed; `ferry restore` can try another checkpoint or node"
    job.op = None
    s.save_job("restore_failed", ev.error or "")
    error = ev.error or "restore failed"
    if isinstance(args, ColdMove | LiveMove) and args.rolled_back:
        error = f"{args.target_error}; rolling back to {source} failed too: {error}"
    s.finish(now, error=error, error_code=ev.error_code)
    return s


def _older(s: Step, ev: wire.NodeEvent, checkpoints: list[CheckpointRecord], now: float) -> bool:
    """The checkpoint of a restore (a failover's, an evacuation's, one the user did not pick) did
    not verify: restore the newest older one that may, saying which and why. False when there is
    none left."""
    job, op = s.job, s.op
    assert op.checkpoint and isinstance(op.args, RestorePhase)
    failed = next((c for c in checkpoints if c.id == op.checkpoint), None)
    unverifiable = dict(op.args.unverifiable)
    unverifiable[op.checkpoint] = failed.created if failed else now
    older = older_checkpoint(checkpoints, unverifiable)
    if older is None:
        return False
    why = f"{op.checkpoint} did not verify ({ev.error})"
    op.args.unverifiable = unverifiable
    op.result["fallback"] = f"{why}; restored {older.id} instead"
    op.checkpoint = older.id
    s.save_op()
    job.incarnation += 1
    job.last_checkpoint = older.id
    s.save_job("restore_fallback", f"{why}; restoring the older {older.id} on {job.node}")
    send(s)
    return True
