"""Failover: a job's node was lost (or its GPU stopped answering); the job comes back elsewhere.

    the op in flight on the job, if any, ends in an error; the incarnation goes up (the fencing
    token: the copy on the lost node is stale, should it come back), then
    - with a committed checkpoint and a node that can take the job: a restore op ([restore] on
      the placement's node, as in ``restore``);
    - with a checkpoint but no room: the job is parked (``capacity``) until there is;
    - without a checkpoint: the job is pending again and starts from scratch wherever it fits
      (the shell places it);
    - a job run with ``--here`` stays put: the supervisor that ran it restores it (parked for the
      user) or starts it again (failed, without a checkpoint), so that it never runs twice.
"""

from ferry.common.models import Job, JobState, Op, OpKind, OpState
from ferry.common.opargs import RestoreArgs
from ferry.scheduler.ops import restore
from ferry.scheduler.ops.step import Placement, SaveOp, Step, ended


def on_lost(job: Job, in_flight: Op | None, lost_node: str, placement: Placement, *, why: str = "",
            restore_op: str, now: float) -> Step:
    """`placement`: where the job can go now (the lost node aside); `restore_op`: the id of the
    restore op to start, if one is started. `why`: what was lost, when not the whole node."""
    op = Op(id=restore_op, kind=OpKind.RESTORE, job=job.id, state=OpState.RUNNING, phase="restore",
            checkpoint=job.last_checkpoint, args=RestoreArgs(failover=lost_node, target=placement.node))
    s = Step.of(job, op)
    job = s.job
    gone = f"node {lost_node} was lost during the operation"
    if in_flight is not None and (old := ended(in_flight, now, error=gone)) is not None:
        s.effects.append(SaveOp(old))
    job.op, job.moving_to = None, None
    job.incarnation += 1  # fences the copy on the lost node, should it come back
    lost = why or f"node {lost_node} was lost"
    if job.supervised_elsewhere:  # its own supervisor (`--here`, adopted) starts it again, or it runs twice
        if job.last_checkpoint:
            job.state, job.parked_by = JobState.PREEMPTED, "user"
            job.reason = (f"{lost} while it ran under its own supervisor (`--here` or adopted): "
                          f"`ferry restore {job.name} [--here]` continues it from {job.last_checkpoint}")
        else:
            job.state = JobState.FAILED
            job.error = f"{lost} while it ran under its own supervisor (`--here` or adopted)"
            job.reason = "no checkpoint: its supervisor starts it again"
        s.save_job("failover", job.reason)
        return s
    if not job.last_checkpoint:
        job.state, job.node, job.restarts = JobState.PENDING, None, job.restarts + 1
        job.reason = f"{lost}; no checkpoint: starting again from scratch"
        s.save_job("failover", job.reason)
        return s
    if placement.node is None:
        job.state, job.parked_by = JobState.PREEMPTED, "capacity"
        job.reason = f"{lost}; waiting for capacity to restore {job.last_checkpoint}: {placement.why}"
        s.save_job("failover", job.reason)
        return s
    s.save_op()
    job.state, job.op, job.node = JobState.RESTORING, s.op.id, placement.node
    if placement.gpus:
        job.gpu_uuids = list(placement.gpus)
    s.save_job("failover", f"{lost}; restoring {job.last_checkpoint} on {placement.node}")
    restore.send(s)
    return s
