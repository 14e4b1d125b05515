"""What a mutating call would do, in words and numbers: the answer of a dry run (`--dry-run`, the
API's Plan, an agent's tool called with ``dry_run``). Pure: the API checks the call first (the same
checks the call itself runs), then describes it from a ``Snapshot``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from ferry.common.models import Job, JobState
from ferry.policy.signals import Explanation, Snapshot, explain, horizon_s

ActionName = Literal["checkpoint", "restore", "migrate", "drain", "undrain", "kill"]


class Plan(BaseModel):
    action: ActionName
    job: str | None = None
    node: str | None = None  # where it acts: the job's node, the drained node
    target: str | None = None  # where work would go
    live: bool = False
    summary: str
    pause_s: float | None = None  # how long the job would stop
    price_per_hour_before: float | None = None
    price_per_hour_after: float | None = None
    expected_saving_usd: float | None = None  # over the job's remaining time (its deadline, else an hour)
    move_cost_usd: float | None = None
    cost_per_hour: float = 0.0  # what the action commits: the hourly price of the node work goes to
    explanation: Explanation | None = None
    moves: list[Plan] = []  # a drain: each job's move


def _price(snap: Snapshot, node: str | None) -> float | None:
    view = snap.views.get(node or "")
    return view.price_per_hour if view is not None else None


def _money(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"


def migrate(snap: Snapshot, job: Job, to: str, live: bool) -> Plan:
    ex = explain(snap, job)
    before, after = _price(snap, job.node), _price(snap, to)
    target = next((a for a in ex.alternatives if a.node == to), None)
    fits = "" if target is None or target.score is not None else f"; it does not fit there now ({target.why_not})"
    how = "live: a short freeze, then its memory follows" if live else "cold: checkpoint, stop, restore there"
    saving = None
    if ex.progress_cost_per_hour is not None and target and target.progress_cost_per_hour is not None:
        hours = horizon_s(job, snap.now) / 3600.0
        saving = (ex.progress_cost_per_hour - target.progress_cost_per_hour) * hours
    summary = (f"would move {job.name} from {job.node} ({_money(before)} USD/h) to {to} ({_money(after)} USD/h), "
               f"{how}; it stops for about {job.move_cost_s:.0f}s (Ferry's estimate for this job)"
               f"; expected saving {_money(saving)} USD against a move costing "
               f"{_money(ex.move_cost_usd)} USD{fits}")
    return Plan(action="migrate", job=job.name, node=job.node, target=to, live=live, summary=summary,
                pause_s=job.move_cost_s, price_per_hour_before=before, price_per_hour_after=after,
                expected_saving_usd=None if saving is None else round(saving, 4), move_cost_usd=ex.move_cost_usd,
                cost_per_hour=after or 0.0, explanation=ex)


def restore(snap: Snapshot, job: Job, node: str | None, checkpoint: str | None) -> Plan:
    ex = explain(snap, job)
    target = node or ex.best
    which = f"checkpoint {checkpoint}" if checkpoint else "its newest checkpoint"
    where = f"on {target}" if node else (f"where the scheduler would pick now: {target}" if target else
                                         "nowhere yet: no node can take it now, it would wait")
    after = _price(snap, target)
    summary = f"would restore {job.name} from {which} {where} ({_money(after)} USD/h)"
    return Plan(action="restore", job=job.name, node=job.node, target=target, summary=summary,
                pause_s=job.move_cost_s, price_per_hour_after=after, cost_per_hour=after or 0.0, explanation=ex)


def checkpoint(snap: Snapshot, job: Job, stop: bool) -> Plan:
    last = [c for c in snap.checkpoints if c.job == job.id and c.state == "committed"]
    newest = max(last, key=lambda c: c.created, default=None)
    size = f"; its last one held {newest.bytes_logical / 2**20:.0f} MiB and took {newest.total_ms / 1000:.1f}s" \
        if newest else ""
    then = ", then stop it (it holds no capacity until restored)" if stop else " while it keeps running"
    summary = f"would checkpoint {job.name} on {job.node}{then}{size}"
    return Plan(action="checkpoint", job=job.name, node=job.node, summary=summary,
                pause_s=newest.freeze_ms / 1000 if newest else None)


def kill(snap: Snapshot, job: Job, grace_s: float) -> Plan:
    running = job.state not in (JobState.PENDING, JobState.PREEMPTED)
    how = f"SIGTERM, then SIGKILL after {grace_s:g}s" if running else "it is not running: it would just end"
    return Plan(action="kill", job=job.name, node=job.node, summary=f"would kill {job.name} ({how}); its "
                "checkpoints stay until they expire")


def drain(snap: Snapshot, node: str, undo: bool) -> Plan:
    if undo:
        return Plan(action="undrain", node=node, summary=f"would let {node} take work again")
    moves = []
    for job in snap.jobs:
        if job.node != node or job.state not in (JobState.RUNNING, JobState.CHECKPOINTING):
            continue
        ex = explain(snap, job)
        others = [a for a in ex.alternatives if a.node != node and a.score is not None]
        to = others[0].node if others else None
        if to is None:
            moves.append(Plan(action="checkpoint", job=job.name, node=node, summary=(
                f"{job.name}: no other node can take it, it would be checkpointed and parked"), explanation=ex))
        else:
            moves.append(migrate(snap, job, to, live=ex.live_possible and job.max_downtime_s is not None))
    parked = sum(1 for m in moves if m.action == "checkpoint")
    summary = (f"would drain {node}: {len(moves)} job(s) leave it ({parked} parked for lack of room), and no new "
               "job is placed there until `undrain`")
    return Plan(action="drain", node=node, summary=summary, moves=moves,
                cost_per_hour=sum(m.cost_per_hour for m in moves))
