"""Live moves (op phases in brackets):

    [precopy]   rounds of ordinary checkpoints while the job runs: each ships to the store only the
                chunks it does not have yet, and each is a committed checkpoint to fall back on
    [freeze]    post-copy: the source freezes, sends all but the memory, its page server listens
    [switch]    the target restores at once with lazy pages (incarnation + 1: the fencing token)
    [postcopy]  the job runs on the target while its memory arrives; then the source is ended
    pre-copy only (a node without post-copy): after the rounds, a final checkpoint ships only the
                delta and the target restores it ([checkpoint], [restore], as a cold move)

How many rounds: with post-copy the freeze ships no memory at all, so one round is enough (it is
the committed checkpoint that a failed post-copy falls back on), and none when the job's last
periodic checkpoint is younger than its interval (as good a fallback as the job has anyway).
Without post-copy, rounds go on while they pay, by P.Haul's rule (``precopy_done``). Without
soft-dirty tracking every round is a full dump that freezes the job for its duration: the rounds'
cost is in the op's result.

Failures: a round or the freeze failing leaves the source running (the op fails); the target
failing before or after it ran makes the source resume (``on_target_failed``); a source that is
gone by then, or lost, means a restore from the last committed checkpoint (``fall_back``). The job
never runs twice: the source stays frozen (SIGSTOP) until the target has every page, and is killed
only then.

The node halves: ``ferry.checkpointer.live`` (source) and ``ferry.migrator.live`` (target); what
they exchange: ``ferry.common.moves``.
"""

from ferry.common import wire
from ferry.common.models import CheckpointRecord, Event, Job, JobState, Node, NodeState, Op, OpState
from ferry.common.moves import FaultPhase, LiveFrozen, LiveLocal, LiveRestored, NodeOptions
from ferry.common.opargs import ColdMove, LiveMove, Round
from ferry.scheduler.ops import checkpoint, restore
from ferry.scheduler.ops.live_report import live_result
from ferry.scheduler.ops.step import Placement, Step, derived_id, next_checkpoint_at

MAX_ROUNDS = 8
ALMOST_NOTHING = 0.02  # of the first round's bytes
GROWTH = 1.10

RESENDABLE = ("precopy", "freeze", "switch", "resume")
"""Phases whose node command a restarted scheduler sends again (``resend``)."""


def live_phase(op: Op | None) -> str | None:
    """The phase of a live move, or None when `op` is not one."""
    return op.phase if op is not None and isinstance(op.args, LiveMove) else None


def precopy_done(shipped: list[int], max_rounds: int = MAX_ROUNDS) -> bool:
    """P.Haul's rule over the bytes each round shipped: stop after ``max_rounds``, after a round that
    shipped almost nothing (2% of the first), or after one that shipped 10% more than the one before."""
    if not shipped:
        return False
    if len(shipped) >= max_rounds:
        return True
    if len(shipped) >= 2 and shipped[-1] <= ALMOST_NOTHING * max(shipped[0], 1):
        return True
    return len(shipped) >= 2 and shipped[-1] > GROWTH * shipped[-2]


def _args(op: Op) -> LiveMove:
    assert isinstance(op.args, LiveMove), f"op {op.id} is not a live move"
    return op.args


def _options(a: LiveMove, *phases: FaultPhase) -> NodeOptions:
    """What the node command of a phase carries: CRIU options, and the armed fault of that phase."""
    return NodeOptions(criu_args=a.criu_args, fail=a.fault if a.fault in phases else None)


# ---- starting ----------------------------------------------------------------------------------

def start(job: Job, op: Op, *, source: Node, target: Node, fresh: CheckpointRecord | str | None,
          fault: FaultPhase | None, now: float) -> Step:
    """A live move of running `job` from `source` to `target` (already checked to fit). `fresh`:
    what ``fresh_fallback`` found, the checkpoint that replaces the round or why there is none
    (None: not looked for, as without post-copy)."""
    s = Step.of(job, op)
    job, op = s.job, s.op
    postcopy = source.lazy_pages and target.lazy_pages
    old = op.args
    op.args = LiveMove(mode="postcopy" if postcopy else "precopy", target=target.id, source=source.id,
                       source_incarnation=job.incarnation, fault=fault,
                       criu_args=old.criu_args if isinstance(old, ColdMove | LiveMove) else [],
                       evacuate=old.evacuate if isinstance(old, ColdMove | LiveMove) else None,
                       rebalance=old.rebalance if isinstance(old, ColdMove | LiveMove) else None)
    job.state, job.op, job.moving_to = JobState.MIGRATING, op.id, target.id
    s.emit(Event(kind="live_move", job=job.id, node=source.id, message=f"to {target.id} ({op.args.mode})"))
    if postcopy and isinstance(fresh, CheckpointRecord):  # a round would freeze the job and buy nothing
        op.state, op.job = OpState.RUNNING, job.id
        op.args.fallback_checkpoint = fresh.id
        _freeze(s, fresh.id)
    else:
        if postcopy and isinstance(fresh, str):
            op.args.round_why = fresh  # the move's result says so, and what would let it skip the round
        _round(s)
    return s


def fresh_fallback(job: Job, last: CheckpointRecord | None, now: float) -> CheckpointRecord | str:
    """`last`, the record of the job's last checkpoint, when it can replace a post-copy move's
    pre-copy round: committed and younger than the job's own checkpoint interval, as good a fallback
    as the job has anyway. Otherwise why it cannot."""
    if job.checkpoint_every_s <= 0:
        return "the job has no --checkpoint-every interval; with one, a live move needs no round"
    if not job.last_checkpoint:
        return "the job has no checkpoint yet"
    if last is None or last.state != "committed":
        return f"its last checkpoint {job.last_checkpoint} is not committed"
    if now - last.created > job.checkpoint_every_s:
        return f"its last checkpoint is older than its interval ({job.checkpoint_every_s:g}s)"
    return last


def why_not_postcopy(source: Node, target: Node) -> str | None:
    """Why a live move between the two nodes goes without post-copy; None when it can have it."""
    if source.lazy_pages and target.lazy_pages:
        return None
    return "; ".join(f"{n.id}: {n.lazy_pages_error or 'no post-copy'}" for n in (source, target) if not n.lazy_pages)


def _round(s: Step) -> None:
    job, op = s.job, s.op
    n = len(_args(op).rounds) + 1
    op.state, op.phase, op.checkpoint, op.job = OpState.RUNNING, "precopy", f"{derived_id('ck', op.id)}-r{n}", job.id
    s.save_op()
    s.save_job()
    _send_phase(s)


def _freeze(s: Step, checkpoint_id: str) -> None:
    """Post-copy: the target loads its restore while the source freezes (`checkpoint_id`,
    committed, tells the target where the job's output files were)."""
    job, op = s.job, s.op
    a = _args(op)
    op.phase = "freeze"
    a.images = derived_id("lv", op.id)
    s.save_op()
    s.save_job()
    target = job.model_copy(update={"node": a.target}, deep=True)
    s.send("migrator", wire.NodeCommand(kind="live_prepare", op=op.id, job=target, incarnation=job.incarnation + 1,
                                        checkpoint=checkpoint_id, options=_options(a)))
    _send_phase(s)


def resend(job: Job, op: Op) -> Step:
    """After a scheduler restart: the command of the phase in flight again (node commands are
    deduplicated by id, so one that had arrived is not repeated)."""
    s = Step.of(job, op)
    _send_phase(s)
    return s


def _send_phase(s: Step) -> None:
    job, op = s.job, s.op
    a = _args(op)
    snapshot = job.clone()
    if op.phase == "precopy" and op.checkpoint:
        s.send("checkpointer", wire.NodeCommand(
            kind="checkpoint", op=op.id, job=snapshot, incarnation=job.incarnation, checkpoint=op.checkpoint,
            parent=job.last_checkpoint, options=_options(a, "round")))
    elif op.phase == "freeze":
        s.send("checkpointer", wire.NodeCommand(
            kind="live_freeze", op=op.id, job=snapshot, incarnation=job.incarnation, checkpoint=a.images,
            options=_options(a, "freeze", "source")))
    elif op.phase == "switch":
        assert a.frozen is not None
        s.send("migrator", wire.NodeCommand(
            kind="live_restore", op=op.id, job=snapshot, incarnation=job.incarnation, checkpoint=a.images,
            pages=a.frozen.page_source(), options=_options(a, "restore", "postcopy")))
    elif op.phase == "resume":
        s.send("checkpointer", wire.NodeCommand(
            kind="live_resume", op=op.id, job=snapshot, incarnation=job.incarnation, checkpoint=a.images))


# ---- node reports ------------------------------------------------------------------------------

def on_round(job: Job, op: Op, record: CheckpointRecord, now: float) -> Step:
    """A pre-copy round committed (it is the job's newest checkpoint now)."""
    s = Step.of(job, op)
    a = _args(s.op)
    a.rounds.append(Round(checkpoint=record.id, bytes_uploaded=record.bytes_uploaded,
                          bytes_logical=record.bytes_logical, freeze_ms=record.freeze_ms,
                          dumped_at=record.dumped_at, cpu_s=record.cpu_s, cores=record.cores))
    if a.mode == "postcopy":
        _freeze(s, record.id)
    elif not precopy_done([r.bytes_uploaded for r in a.rounds]):
        _round(s)
    else:  # the final checkpoint: then the target restores it, as in a cold move
        s.op.checkpoint = None
        checkpoint.start(s, stop=True)
    return s


def on_frozen(job: Job, op: Op, ev: wire.NodeEvent) -> Step | None:
    """The source is frozen and its page server listens: the target restores (incarnation + 1)."""
    if ev.op != op.id or op.phase != "freeze" or not isinstance(ev.live, LiveFrozen):
        return None
    s = Step.of(job, op)
    a = _args(s.op)
    a.frozen = ev.live
    s.op.phase = "switch"
    s.save_op()
    s.job.incarnation += 1
    s.job.node = a.target
    s.save_job("migrating", f"live: restoring on {a.target} with lazy pages")
    _send_phase(s)
    return s


def on_freeze_failed(job: Job, op: Op, ev: wire.NodeEvent, now: float) -> Step | None:
    """The final dump failed: the source runs on."""
    if ev.op != op.id:
        return None
    s = Step.of(job, op)
    _failed(s, ev.error or "the final dump failed", now)
    return s


def on_restored(job: Job, op: Op, ev: wire.NodeEvent) -> Step:
    """The target runs, its memory still arriving; the job stays `migrating` until the source is
    no longer needed (a drain waits for that)."""
    s = Step.of(job, op)
    job, op = s.job, s.op
    _args(op).restored = ev.live if isinstance(ev.live, LiveRestored) else LiveRestored()
    op.phase = "postcopy"
    op.restore_ms = ev.restore_ms
    s.save_op()
    job.node, job.error, job.reason = ev.node, None, f"runs on {ev.node}; its memory is still arriving"
    s.save_job("restored", f"live on {ev.node} (pid {ev.pid}); memory still arriving")
    return s


def on_local(job: Job, op: Op, ev: wire.NodeEvent, now: float) -> Step | None:
    """Every page reached the target: the source is ended and the move is done."""
    if ev.op != op.id or op.phase != "postcopy":
        return None
    s = Step.of(job, op)
    job, op = s.job, s.op
    _args(op).local = ev.live if isinstance(ev.live, LiveLocal) else LiveLocal()
    end_source(s)
    job.state, job.reason, job.moving_to = JobState.RUNNING, None, None
    job.restarts += 1
    job.last_move_at = now
    result = live_result(job, op, now)  # move_cost_s stays a cold move's: what wants_live compares with
    job.last_move_lost_s = result["lost_s"]
    job.next_checkpoint_at = next_checkpoint_at(job, now)
    job.op = None
    s.save_job("live_moved", f"on {ev.node}; downtime {result['downtime_ms'] or 0:.0f} ms")
    s.finish(now, restore_ms=op.restore_ms, result=result)
    return s


def end_source(s: Step) -> None:
    """The frozen source is not needed any more: it is killed."""
    a = _args(s.op)
    source = s.job.model_copy(update={"node": a.source, "incarnation": a.source_incarnation}, deep=True)
    s.send("checkpointer", wire.NodeCommand(kind="live_end", op=s.op.id, job=source,
                                            incarnation=source.incarnation, checkpoint=a.images))


def on_target_exited(job: Job, op: Op, exit_code: int, source: Node | None, placement: Placement,
                     now: float) -> Step:
    """The target copy exited while its memory was still arriving: with 0 it finished (the frozen
    source is ended and the job's exit handled as any other); otherwise a page it needed never came
    (it reads as zeros), and the frozen source, which has them all, resumes."""
    if exit_code != 0:
        return on_target_failed(job, op, f"the target copy died (exit {exit_code}) before all of its memory "
                                         f"arrived", source, placement, now)
    s = Step.of(job, op)
    end_source(s)
    return s


def on_target_failed(job: Job, op: Op, error: str, source: Node | None, placement: Placement,
                     now: float) -> Step:
    """The target failed (before or after it ran; its copy is gone): the source resumes, or, when
    it is lost, the job is restored from its last committed checkpoint (`placement`: where)."""
    s = Step.of(job, op)
    job, op = s.job, s.op
    a = _args(op)
    a.target_error = error
    job.incarnation = a.source_incarnation
    job.node = a.source
    if source is None or source.state == NodeState.LOST:
        fall_back(s, f"{error}; the source {a.source} is lost", placement, now)
        return s
    op.phase = "resume"
    s.save_op()
    s.save_job("migrate_rollback", f"live: {error}; resuming on {a.source}")
    _send_phase(s)
    return s


def on_resumed(job: Job, op: Op, ev: wire.NodeEvent, now: float) -> Step | None:
    """The source runs again: the job is as it was before the move."""
    if ev.op != op.id:
        return None
    s = Step.of(job, op)
    _failed(s, _args(op).target_error or "the target failed", now)
    return s


def on_resume_failed(job: Job, op: Op, ev: wire.NodeEvent, placement: Placement, now: float) -> Step | None:
    """The frozen source is gone too: restore from the last committed checkpoint."""
    if ev.op != op.id:
        return None
    s = Step.of(job, op)
    fall_back(s, f"{_args(op).target_error}; {ev.error}", placement, now)
    return s


def on_lost(job: Job, op: Op, ev: wire.NodeEvent, source: Node | None, placement: Placement,
            now: float) -> Step | None:
    """The target lost its memory source after it ran (it was killed there)."""
    if live_phase(op) != "postcopy" or ev.op != op.id:
        return None
    return on_target_failed(job, op, ev.error or "the target lost its memory source", source, placement, now)


def _failed(s: Step, error: str, now: float) -> None:
    """The source runs (again): the job is as it was before the move."""
    job, op = s.job, s.op
    a = _args(op)
    job.state, job.node, job.op, job.moving_to = JobState.RUNNING, a.source, None, None
    job.incarnation = a.source_incarnation
    job.next_checkpoint_at = next_checkpoint_at(job, now)
    s.save_job("live_move_failed", f"{error}; it runs on {job.node}")
    s.finish(now, error=f"live move failed: {error}; {job.name} runs on {job.node} as before",
             result=live_result(job, op, now))


def fall_back(s: Step, error: str, placement: Placement, now: float) -> None:
    """Neither copy runs: restore from the last committed checkpoint (a pre-copy round at worst)."""
    job, op = s.job, s.op
    a = _args(op)
    if not job.last_checkpoint:
        job.state, job.op, job.error = JobState.FAILED, None, error
        s.save_job("failed", error)
        s.finish(now, error=f"live move failed: {error}, and there is no checkpoint")
        return
    if placement.node is None:
        job.state, job.op, job.parked_by = JobState.PREEMPTED, None, "capacity"
        job.reason = f"live move failed ({error}); waiting for capacity: {placement.why}"
        s.save_job("preempted", job.reason)
        s.finish(now, error=f"live move failed: {error}; the job is parked")
        return
    a.fallback_error = error
    op.phase, op.checkpoint = "restore", job.last_checkpoint
    a.target = placement.node
    s.save_op()
    job.state, job.node, job.moving_to = JobState.RESTORING, placement.node, None
    job.gpu_uuids = list(placement.gpus)
    job.incarnation = max(job.incarnation, a.source_incarnation + 1) + 1
    s.save_job("restoring", f"live move failed ({error}): {job.last_checkpoint} on {placement.node}")
    restore.send(s)
