"""A gang's group checkpoint and its restore, as pure transitions over the gang's jobs and one op
(``ferry.policy.gangs`` says why the cut is consistent).

Group checkpoint (``GangCheckpointArgs``)::

    [lock]     every member's checkpointer blocks the member's bridge port (``gang_locked``)
    [dump]     once all are locked: every member dumps in parallel, running on (``--stop``: left
               stopped, so that nothing it writes after its dump changes the files it holds)
    [release]  once all committed: the group record is written (the commit point), then every member
               is unlocked, or ended for `--stop` (``gang_released``); the op ends when all are
    [abort]    a member that could not be locked or dumped: everyone is unlocked, nothing is committed

Group restore (``GangRestoreArgs``)::

    [restore]  every member's migrator restores the member's checkpoint of the group on its node; a
               member that fails ends the members that came back (a gang runs whole or not at all)
"""

from dataclasses import dataclass, field

from ferry.common import wire
from ferry.common.models import CheckpointRecord, GangCheckpoint, Job, JobState, Op, OpState
from ferry.common.moves import NodeOptions
from ferry.common.opargs import GangCheckpointArgs, GangRestoreArgs, Survivor
from ferry.scheduler.ops.step import Effect, SaveJob, SaveOp, Send, derived_id, ended, next_checkpoint_at


@dataclass(frozen=True)
class SaveGang:
    """The group checkpoint's record: written once, after every member's checkpoint committed."""

    record: GangCheckpoint


@dataclass
class GangStep:
    """A transition's result over a gang: copies of its jobs and op, and the effects, in order."""

    jobs: dict[str, Job]
    op: Op
    effects: list[Effect | SaveGang] = field(default_factory=list)

    @classmethod
    def of(cls, jobs: list[Job], op: Op) -> "GangStep":
        return cls({j.id: j.clone() for j in jobs}, op.clone())

    def save_job(self, job: Job, event: str | None = None, message: str = "") -> None:
        self.effects.append(SaveJob(job.clone(), event, message))

    def save_op(self) -> None:
        self.effects.append(SaveOp(self.op.clone()))

    def send(self, service: wire.NodeService, cmd: wire.NodeCommand) -> None:
        self.effects.append(Send(service, cmd))

    def finish(self, now: float, *, error: str | None = None, result: dict[str, object] | None = None) -> None:
        done = ended(self.op, now, error=error)
        if done is not None and result is not None:
            done.result = result
        if done is not None:
            self.op = done
            self.save_op()


def member_checkpoint(op_id: str, index: int) -> str:
    """The checkpoint id of the gang's `index`-th member in the group of op `op_id`."""
    return f"{derived_id('ck', op_id)}-{index}"


def _cmd(kind: wire.NodeCommandKind, op: Op, job: Job, **fields: object) -> wire.NodeCommand:
    return wire.NodeCommand(kind=kind, op=op.id, job=job.clone(), incarnation=job.incarnation,
                            **fields)


# ---- group checkpoint -------------------------------------------------------------------------


def begin_checkpoint(gang: str, members: list[Job], op: Op, *, stop: bool, now: float, periodic: bool = False,
                     reason: str | None = None, parked_by: str = "user", fault: bool = False) -> GangStep:
    """Locks every member's network (all members already checked: ``gangs.gang_checkpointable``)."""
    s = GangStep.of(members, op)
    op = s.op
    args = GangCheckpointArgs(gang=gang, members=[j.id for j in members], stop=stop, periodic=periodic,
                              reason=reason, parked_by=parked_by, locked_at=now, fault=fault)
    op.args, op.state, op.phase, op.job = args, OpState.RUNNING, "lock", ""
    op.checkpoint = derived_id("gk", op.id)
    s.save_op()
    for job in s.jobs.values():
        job.state, job.op = JobState.CHECKPOINTING, op.id
        s.save_job(job, "gang_checkpoint", f"gang {gang}: locking its network for group checkpoint {op.checkpoint}")
    for job in s.jobs.values():
        s.send("checkpointer", _cmd("gang_lock", op, job))
    return s


def _send_dump(s: GangStep, args: GangCheckpointArgs) -> None:
    for i, job_id in enumerate(args.members):
        job = s.jobs[job_id]
        fail = args.fault and i == len(args.members) - 1
        # `--stop`: each member stays stopped from its dump on (its files as dumped) until the group commits
        s.send("checkpointer", _cmd("checkpoint", s.op, job, checkpoint=member_checkpoint(s.op.id, i),
                                    parent=job.last_checkpoint, stop=args.stop, hold=args.stop,
                                    options=NodeOptions(fail="round" if fail else None)))


def resend(members: list[Job], op: Op) -> GangStep:
    """After a scheduler restart: the commands of the phase the op is in (the nodes deduplicate)."""
    s = GangStep.of(members, op)
    args = s.op.args
    if isinstance(args, GangCheckpointArgs):
        if s.op.phase == "lock":
            for job in s.jobs.values():
                s.send("checkpointer", _cmd("gang_lock", s.op, job))
        elif s.op.phase == "dump":
            _send_dump(s, args)
        elif s.op.phase in ("release", "abort"):
            _send_release(s, args)
    elif isinstance(args, GangRestoreArgs) and s.op.phase == "stop":
        for job_id, was in args.stopping.items():
            if job_id in s.jobs and job_id not in args.released:
                survivor = s.jobs[job_id].model_copy(update={"incarnation": was.incarnation, "node": was.node})
                s.send("checkpointer", _cmd("gang_release", s.op, survivor, stop=True))
    elif isinstance(args, GangRestoreArgs) and s.op.phase == "restore":
        _send_restores(s, args)
    elif isinstance(args, GangRestoreArgs) and s.op.phase == "release":
        _release_restored(s, args)
    return s


def on_locked(members: list[Job], op: Op, job_id: str) -> GangStep:
    s = GangStep.of(members, op)
    args = s.op.args
    if not isinstance(args, GangCheckpointArgs) or s.op.phase != "lock" or job_id in args.locked:
        return s
    args.locked.append(job_id)
    if set(args.locked) >= set(args.members):
        s.op.phase = "dump"
        _send_dump(s, args)
    s.save_op()
    return s


def on_member_committed(members: list[Job], op: Op, job_id: str, record: CheckpointRecord, now: float) -> GangStep:
    s = GangStep.of(members, op)
    op = s.op
    args = op.args
    if not isinstance(args, GangCheckpointArgs) or op.phase != "dump" or job_id in args.committed:
        return s
    args.committed[job_id] = record.id
    args.freeze_ms[job_id] = record.freeze_ms
    args.bytes_uploaded += record.bytes_uploaded
    if set(args.committed) < set(args.members):
        s.save_op()
        return s
    group = GangCheckpoint(id=op.checkpoint or derived_id("gk", op.id), gang=args.gang, created=now,
                           tenant=next(iter(s.jobs.values())).tenant, members=dict(args.committed),
                           names={j: s.jobs[j].name for j in args.members},
                           nodes={j: s.jobs[j].node or "" for j in args.members},
                           freeze_ms=max(args.freeze_ms.values(), default=0.0),
                           freeze_ms_sum=sum(args.freeze_ms.values()), bytes_uploaded=args.bytes_uploaded,
                           final=args.stop)
    s.effects.append(SaveGang(group))  # the commit point: before anyone is released
    op.phase = "release"
    s.save_op()
    for job in s.jobs.values():
        job.gang_checkpoint = group.id
        job.last_checkpoint = args.committed[job.id]
        s.save_job(job)
    _send_release(s, args)
    return s


def _send_release(s: GangStep, args: GangCheckpointArgs) -> None:
    stop = args.stop and s.op.phase == "release"
    for job_id in args.members:
        if job_id not in args.released:
            job = s.jobs[job_id]
            s.send("checkpointer", _cmd("gang_release", s.op, job, stop=stop,
                                        checkpoint=args.committed.get(job_id)))


def on_released(members: list[Job], op: Op, job_id: str, now: float) -> GangStep:
    """A member is unlocked (or ended): once all are, the op ends as its phase says."""
    s = GangStep.of(members, op)
    op = s.op
    args = op.args
    if isinstance(args, GangRestoreArgs):
        _survivor_ended(s, args, job_id, now)
        return s
    if not isinstance(args, GangCheckpointArgs) or op.phase not in ("release", "abort") or job_id in args.released:
        return s
    args.released.append(job_id)
    job = s.jobs.get(job_id)
    if job is not None and job.op == op.id:
        _settle(job, op, args, now)
        s.save_job(job, "preempted" if op.phase == "release" and args.stop else None)
    if set(args.released) < set(args.members):
        s.save_op()
        return s
    lock_ms = (now - args.locked_at) * 1000 if args.locked_at else 0.0
    if op.phase == "abort":
        s.finish(now, error=f"gang {args.gang}: group checkpoint undone, every member runs on: {args.error}")
        return s
    freeze = max(args.freeze_ms.values(), default=0.0)
    s.finish(now, result={"gang": args.gang, "group": op.checkpoint, "members": dict(args.committed),
                          "lock_ms": round(lock_ms, 1), "freeze_ms": round(freeze, 1),
                          "freeze_ms_sum": round(sum(args.freeze_ms.values()), 1),
                          "bytes_uploaded": args.bytes_uploaded, "stopped": args.stop})
    return s


def _settle(job: Job, op: Op, args: GangCheckpointArgs, now: float) -> None:
    """A member as the group checkpoint leaves it."""
    job.op = None
    job.next_checkpoint_at = next_checkpoint_at(job, now)
    if job.state != JobState.CHECKPOINTING:
        return  # it ended meanwhile: its exit said how
    if op.phase == "release" and args.stop:
        job.state, job.parked_by = JobState.PREEMPTED, args.parked_by
        job.reason = args.reason or f"stopped with gang {args.gang} by `ferry checkpoint --gang {args.gang} --stop`"
    else:
        job.state = JobState.RUNNING


def on_member_failed(members: list[Job], op: Op, job_id: str, error: str, now: float) -> GangStep:
    """A member could not be locked or dumped: the group checkpoint is undone, everyone unlocked."""
    s = GangStep.of(members, op)
    op = s.op
    args = op.args
    if not isinstance(args, GangCheckpointArgs) or op.phase not in ("lock", "dump"):
        return s
    name = s.jobs[job_id].name if job_id in s.jobs else job_id
    args.error = f"member {name}: {error}"
    op.phase = "abort"
    s.save_op()
    if job_id in s.jobs:
        s.save_job(s.jobs[job_id], "gang_checkpoint_failed", args.error)
    _send_release(s, args)
    return s


# ---- group restore ----------------------------------------------------------------------------


def begin_restore(gang: str, members: list[Job], op: Op, group: GangCheckpoint, targets: dict[str, str]) -> GangStep:
    """Restores every member of `group` on its target (all checked: ``gangs.gang_restorable``)."""
    s = GangStep.of(members, op)
    op = s.op
    args = GangRestoreArgs(gang=gang, group=group.id, members={j.id: group.members[j.id] for j in members},
                           targets=dict(targets))
    op.args, op.state, op.phase, op.job, op.checkpoint = args, OpState.RUNNING, "restore", "", group.id
    s.save_op()
    for job in s.jobs.values():
        job.state, job.op, job.node, job.here, job.adopt_pid = JobState.RESTORING, op.id, targets[job.id], False, None
        job.incarnation += 1
        job.kill_requested, job.exit_code, job.moving_to = False, None, None
        job.last_checkpoint, job.gang_checkpoint = args.members[job.id], group.id
        s.save_job(job, "restoring", f"gang {gang}: from {job.last_checkpoint} (group {group.id}) on {job.node}")
    _send_restores(s, args)
    return s


def _send_restores(s: GangStep, args: GangRestoreArgs) -> None:
    """Each member restored with its port blocked, until every member is back (``_maybe_end_restore``)."""
    for job_id, ckpt in args.members.items():
        if job_id in s.jobs and job_id not in args.restored and job_id not in args.failed:
            s.send("migrator", _cmd("restore", s.op, s.jobs[job_id], checkpoint=ckpt, hold=True))


def on_member_restored(members: list[Job], op: Op, ev: wire.NodeEvent, now: float) -> GangStep:
    s = GangStep.of(members, op)
    args = s.op.args
    job = s.jobs.get(ev.job)
    if not isinstance(args, GangRestoreArgs) or job is None or ev.job in args.restored or s.op.finished:
        return s
    args.restored.append(ev.job)
    job.state, job.node, job.error, job.reason, job.parked_by = JobState.RUNNING, ev.node, None, None, None
    job.restarts += 1
    job.last_move_at = now
    job.next_checkpoint_at = next_checkpoint_at(job, now)
    job.op = None
    s.save_job(job, "restored", f"gang {args.gang}: on {ev.node} (pid {ev.pid})")
    _maybe_end_restore(s, args, now)
    return s


def on_member_restore_failed(members: list[Job], op: Op, ev: wire.NodeEvent, now: float) -> GangStep:
    s = GangStep.of(members, op)
    args = s.op.args
    job = s.jobs.get(ev.job)
    if not isinstance(args, GangRestoreArgs) or job is None or ev.job in args.failed or s.op.finished:
        return s
    args.failed[ev.job] = ev.error or "restore failed"
    job.state, job.error, job.op = JobState.PREEMPTED, ev.error, None
    job.reason = f"gang {args.gang}: its restore failed; `ferry restore --gang {args.gang}` tries again"
    s.save_job(job, "restore_failed", ev.error or "")
    _maybe_end_restore(s, args, now)
    return s


def _maybe_end_restore(s: GangStep, args: GangRestoreArgs, now: float) -> None:
    if set(args.restored) | set(args.failed) < set(args.members):
        s.save_op()
        return
    if not args.failed:  # every member is back: they may all talk now
        s.op.phase = "release"
        s.save_op()
        _release_restored(s, args)
        return
    # a gang runs whole or not at all: the members that came back end again (their checkpoints stay)
    why = "; ".join(f"member {s.jobs[j].name}: {e}" for j, e in args.failed.items() if j in s.jobs)
    for job_id in args.restored:
        job = s.jobs[job_id]
        s.send("checkpointer", _cmd("gang_release", s.op, job, stop=True, checkpoint=args.members[job_id]))
        job.state, job.parked_by = JobState.PREEMPTED, "user"
        job.reason = f"gang {args.gang}: another member's restore failed ({why}); stopped again"
        s.save_job(job, "preempted", job.reason)
    s.finish(now, error=f"gang {args.gang}: restore from {args.group} failed: {why}; the members that came "
                        f"back were stopped again")


# ---- failover ---------------------------------------------------------------------------------


def failover(gang: str, members: list[Job], in_flight: Op | None, op: Op, lost: str, group: GangCheckpoint | None,
             targets: dict[str, str] | None, now: float) -> GangStep:
    """A member's node was lost: the gang comes back whole from its newest group checkpoint (on
    `targets`; None: nowhere fits now, so it is parked until capacity is back), or, without one,
    starts again. The members still running elsewhere are ended first (``stop``), then the
    restores go out, so that no copy of a member runs beside its restored self."""
    s = GangStep.of(members, op)
    op = s.op
    gone = f"node {lost} was lost during the operation"
    if in_flight is not None and (old := ended(in_flight, now, error=gone)) is not None:
        s.effects.append(SaveOp(old))
    args = GangRestoreArgs(gang=gang, group=group.id if group else "", failover=lost,
                           members={j.id: group.members[j.id] for j in members} if group else {},
                           targets=dict(targets or {}), fresh_start=group is None)
    op.args, op.state, op.phase, op.job, op.checkpoint = args, OpState.RUNNING, "stop", "", args.group or None
    for job in s.jobs.values():  # end the survivors (at the incarnation they run as)
        if job.node and job.node != lost and job.state not in (JobState.PREEMPTED, JobState.PENDING, JobState.FAILED):
            args.stopping[job.id] = Survivor(node=job.node, incarnation=job.incarnation)
            s.send("checkpointer", _cmd("gang_release", op, job, stop=True, checkpoint=job.last_checkpoint))
    why = f"gang {gang}: node {lost} was lost"
    for job in s.jobs.values():
        job.incarnation += 1  # fences every old copy, the lost node's should it come back
        job.op, job.moving_to, job.kill_requested = op.id, None, False
        job.exit_code, job.error = None, None
        if group is not None:
            job.last_checkpoint, job.gang_checkpoint = group.members[job.id], group.id
        if group is None:
            job.state, job.node = JobState.PENDING, None
            job.reason = f"{why}; no group checkpoint: the gang starts again"
        elif targets is None:
            job.state, job.parked_by = JobState.PREEMPTED, "capacity"
            job.reason = f"{why}; waiting for capacity to restore group {group.id}"
        else:
            job.state, job.node = JobState.RESTORING, targets[job.id]
            job.reason = None
        s.save_job(job, "failover", job.reason or f"{why}; restoring group {group.id if group else '-'} on {job.node}")
    s.save_op()
    if not args.stopping:
        _after_stop(s, args, now)
    return s


def _release_restored(s: GangStep, args: GangRestoreArgs) -> None:
    for job_id in args.restored:
        if job_id in s.jobs and job_id not in args.unblocked:
            s.send("checkpointer", _cmd("gang_release", s.op, s.jobs[job_id]))


def _survivor_ended(s: GangStep, args: GangRestoreArgs, job_id: str, now: float) -> None:
    if s.op.phase == "release" and job_id in args.restored and job_id not in args.unblocked:
        args.unblocked.append(job_id)
        if set(args.unblocked) >= set(args.members):
            s.finish(now, result={"gang": args.gang, "group": args.group, "nodes": dict(args.targets),
                                  "names": {j: s.jobs[j].name for j in args.members if j in s.jobs}})
        else:
            s.save_op()
        return
    if s.op.phase != "stop" or job_id not in args.stopping or job_id in args.released:
        return
    args.released.append(job_id)
    if set(args.released) >= set(args.stopping):
        _after_stop(s, args, now)
    else:
        s.save_op()


def _after_stop(s: GangStep, args: GangRestoreArgs, now: float) -> None:
    """Every survivor has ended: restore the gang, or let it start again, or wait for capacity."""
    op = s.op
    if args.fresh_start or not args.targets:
        for job in s.jobs.values():
            job.op = None
            if args.fresh_start:
                job.node, job.restarts = None, job.restarts + 1
            s.save_job(job)
        s.finish(now, error=None if args.fresh_start else f"gang {args.gang}: no room to restore it yet")
        return
    op.phase = "restore"
    s.save_op()
    _send_restores(s, args)
