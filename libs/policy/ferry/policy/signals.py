"""What an operator (or an operator's agent) watches, computed from the cluster's records.

Pure functions of a ``Snapshot`` (jobs, nodes, prices, checkpoints, the time): the API serves them
(`ferry signals`, `ferry explain`, the MCP tools) and tests feed them records directly. Each answer
is a pydantic model, whose JSON schema is what the MCP tools declare as their output.

    queue           pending and capacity-parked jobs by priority and shape, their waits and why
    sla_risk        per job with an SLA: deadline slack, interruption odds, downtime budget left
    spot_market     per zone and instance type: spot and on-demand price, trend, interruptions seen
    cluster_health  nodes by state, late heartbeats, GPU conditions, failing checkpoints
    savings         what the fleet saved against the same nodes on demand, so far and per hour
    explain         why a job is where it is, its best alternatives, a move's saving, cost and pause
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel

from ferry.common.models import (
    TERMINAL_STATES,
    CheckpointRecord,
    Job,
    JobState,
    Node,
    NodeState,
    PriceRecord,
)
from ferry.common.units import format_bytes
from ferry.policy import decisions, progress
from ferry.policy.decisions import HOUR
from ferry.policy.views import effective_price, job_view, node_views

DAY = 24 * HOUR
EXPLAIN_HORIZON_S = HOUR  # a job with no deadline is assumed to run at least this much longer
Risk = Literal["low", "medium", "high"]


@dataclass(frozen=True)
class Snapshot:
    """The records the signals are computed from, read at ``now``."""

    jobs: Sequence[Job]
    nodes: Sequence[Node]
    prices: Sequence[PriceRecord] = ()
    checkpoints: Sequence[CheckpointRecord] = ()
    now: float = 0.0
    heartbeat_timeout_s: float = 5.0

    @cached_property
    def views(self) -> dict[str, decisions.NodeView]:
        """The policy's view of each node, by id (computed once per snapshot)."""
        return {v.id: v for v in node_views(self.nodes, self.jobs, self.now, self.heartbeat_timeout_s, self.prices)}

    def node(self, node_id: str | None) -> Node | None:
        return next((n for n in self.nodes if n.id == node_id), None)


def shape(job: Job) -> str:
    return f"{job.cpus:g}cpu/{format_bytes(job.memory_bytes)}/{job.gpus}gpu"


def waiting(job: Job) -> bool:
    """Waiting for capacity: never placed yet, or parked because nothing had room."""
    return job.state == JobState.PENDING or (job.state == JobState.PREEMPTED and job.parked_by == "capacity")


# ---------------------------------------------------------------- queue


class QueueGroup(BaseModel):
    priority: int
    shape: str
    waiting: int
    oldest_wait_s: float
    median_wait_s: float
    jobs: list[str]
    reasons: list[str]  # why no node takes them, one line per distinct reason


class Queue(BaseModel):
    waiting: int
    groups: list[QueueGroup]


def queue(snap: Snapshot) -> Queue:
    views = list(snap.views.values())
    groups: dict[tuple[int, str], list[Job]] = {}
    for job in snap.jobs:
        if waiting(job):
            groups.setdefault((job.priority, shape(job)), []).append(job)
    out = []
    for (priority, kind), jobs in sorted(groups.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        waits = [max(0.0, snap.now - (j.created if j.state == JobState.PENDING else j.updated)) for j in jobs]
        reasons = sorted({decisions.unplaced_reason(job_view(j, snap.now), views) for j in jobs})
        out.append(QueueGroup(priority=priority, shape=kind, waiting=len(jobs), oldest_wait_s=round(max(waits), 1),
                              median_wait_s=round(statistics.median(waits), 1), jobs=[j.name for j in jobs],
                              reasons=reasons))
    return Queue(waiting=sum(g.waiting for g in out), groups=out)


# ---------------------------------------------------------------- SLA risk


class SlaRisk(BaseModel):
    job: str
    node: str | None
    spot: bool
    risk: Risk
    why: str
    deadline_in_s: float | None = None
    remaining_work_s: float | None = None  # when the job said how much work it has (`--work`)
    slack_s: float | None = None  # deadline minus remaining work minus one move; None when the work is unknown
    interruptions_per_hour: float = 0.0  # the node's observed rate (with a prior for spot nodes)
    p_interruption: float = 0.0  # before the deadline, or within the next hour without one
    expected_loss_s: float = 0.0  # work an interruption would throw away: unsaved work plus a restore
    downtime_budget_s: float | None = None  # max downtime minus what one cold move costs
    suggestion: str = ""


def _unsaved_s(job: Job, snap: Snapshot) -> float:
    latest = max((c.created for c in snap.checkpoints if c.job == job.id and c.state == "committed"),
                 default=None)
    every = job.checkpoint_every_s or 600.0
    return min(snap.now - latest, every) if latest is not None else every


def sla_risk(snap: Snapshot) -> list[SlaRisk]:
    """Every live job with a deadline or a downtime limit, riskiest first."""
    views = snap.views
    out = []
    for job in snap.jobs:
        if job.state in TERMINAL_STATES or (job.deadline is None and job.max_downtime_s is None):
            continue
        node = snap.node(job.node)
        view = views.get(job.node or "")
        hazard = decisions.hazard_per_hour(view) if view is not None else 0.0
        window_h = max(0.0, (job.deadline - snap.now) / HOUR) if job.deadline is not None else 1.0
        p = 1.0 - math.exp(-hazard * window_h)
        loss = job.move_cost_s + _unsaved_s(job, snap)
        budget = job.max_downtime_s - job.move_cost_s if job.max_downtime_s is not None else None
        jv = job_view(job, snap.now)
        slack = decisions.slack_s(jv, snap.now) if jv.remaining_s is not None else None
        risk, why, suggestion = _judge(job, node, view, snap.now, p, loss, budget, slack)
        out.append(SlaRisk(
            job=job.name, node=job.node, spot=bool(node and node.spot), risk=risk, why=why,
            deadline_in_s=round(job.deadline - snap.now, 1) if job.deadline is not None else None,
            remaining_work_s=_round(jv.remaining_s), slack_s=_round(slack),
            interruptions_per_hour=round(hazard, 4), p_interruption=round(p, 4), expected_loss_s=round(loss, 1),
            downtime_budget_s=round(budget, 1) if budget is not None else None, suggestion=suggestion))
    order = {"high": 0, "medium": 1, "low": 2}
    return sorted(out, key=lambda r: (order[r.risk], -r.p_interruption, r.job))


def _judge(job: Job, node: Node | None, view: decisions.NodeView | None, now: float, p: float, loss: float,
           budget: float | None, slack: float | None) -> tuple[Risk, str, str]:
    if job.deadline is not None and job.deadline <= now:
        return "high", "its deadline has passed", ""
    if slack is not None and slack < 0:
        return "high", f"its remaining work does not fit before its deadline ({-slack:.0f}s short)", \
            "give it more resources or a later deadline; moving it does not help"
    if node is None or view is None:
        return "high", f"it is {job.state} and runs nowhere", "restore it: `restore` (the scheduler picks a node)"
    if node.state in (NodeState.PREEMPTING, NodeState.LOST):
        return "high", f"its node {node.id} is {node.state}", f"migrate it off {node.id} now (live if it allows)"
    if node.gpu_conditions:
        return "high", f"its node {node.id} reports GPU trouble: {node.gpu_conditions[0]}", \
            f"migrate it off {node.id}"
    jv = job_view(job, now)
    if node.spot and job.deadline is not None and decisions.deadline_critical(jv, now):
        return "high", "its deadline leaves no room for a spot interruption", "migrate it to an on-demand node"
    if budget is not None and budget < 0 and node.spot:
        live = "live (its node can serve post-copy)" if view.lazy_pages else "a cold move"
        return "high", (f"one interruption costs about {job.move_cost_s:.0f}s, over its {job.max_downtime_s:g}s "
                        f"downtime limit"), f"keep it on on-demand; a planned move should be {live}"
    if slack is not None and node.spot and slack < loss:
        return "high", (f"one interruption on spot node {node.id} (~{loss:.0f}s lost) would exceed its {slack:.0f}s "
                        "of slack"), "migrate it to an on-demand node"
    if p >= 0.2:
        return "medium", f"{p:.0%} chance of an interruption on {node.id} before it matters, losing ~{loss:.0f}s", \
            "a shorter --checkpoint-every caps the loss, or move it to a steadier node"
    return "low", f"{p:.0%} chance of an interruption on {node.id}", ""


# ---------------------------------------------------------------- spot market


class Market(BaseModel):
    zone: str
    instance_type: str
    spot_price: float | None = None
    on_demand_price: float | None = None
    discount: float | None = None  # 1 - spot / on-demand
    trend: float | None = None  # relative change of the spot price at its last update
    nodes: int = 0
    interruptions: int = 0  # seen on this market's nodes
    interruptions_per_day: float | None = None  # per node-day observed


def spot_market(snap: Snapshot) -> list[Market]:
    markets: dict[tuple[str, str], Market] = {}
    for p in snap.prices:
        m = markets.setdefault((p.zone, p.instance_type), Market(zone=p.zone, instance_type=p.instance_type))
        if p.market == "spot":
            m.spot_price = p.price_per_hour
            if p.previous_price_per_hour:
                m.trend = round(p.price_per_hour / p.previous_price_per_hour - 1.0, 4)
        else:
            m.on_demand_price = p.price_per_hour
    uptime: dict[tuple[str, str], float] = {}
    for n in snap.nodes:
        key = (n.labels.get("zone", ""), n.labels.get("instance_type", ""))
        if key not in markets and not n.spot:
            continue
        m = markets.setdefault(key, Market(zone=key[0], instance_type=key[1],
                                           spot_price=n.price_per_hour if n.spot else None))
        m.nodes += 1
        m.interruptions += n.preemptions
        uptime[key] = uptime.get(key, 0.0) + max(snap.now - n.started, 1.0)
    for key, m in markets.items():
        if m.spot_price is not None and m.on_demand_price:
            m.discount = round(1.0 - m.spot_price / m.on_demand_price, 4)
        if key in uptime:
            m.interruptions_per_day = round(m.interruptions / (uptime[key] / DAY), 3)
    return sorted(markets.values(), key=lambda m: (m.zone, m.instance_type))


# ---------------------------------------------------------------- cluster health


class NodeHealth(BaseModel):
    node: str
    state: str
    problems: list[str]


class Health(BaseModel):
    nodes: dict[str, int]  # by state
    usable: int
    problems: list[NodeHealth]  # nodes with something wrong
    failing_checkpoints: dict[str, int]  # job -> failed checkpoints in the last day
    failed_jobs: list[str]  # failed in the last day
    ok: bool


def cluster_health(snap: Snapshot) -> Health:
    views = snap.views
    by_state: dict[str, int] = {}
    problems = []
    for n in snap.nodes:
        by_state[n.state.value] = by_state.get(n.state.value, 0) + 1
        found = [views[n.id].reason] if not views[n.id].usable and n.state == NodeState.READY else []
        found += n.gpu_conditions
        found += [f"GPU driver: {n.gpu_error}"] if n.gpu_error else []
        found += [f"under a spot notice, {n.notice_deadline - snap.now:.0f}s left"] \
            if n.state == NodeState.PREEMPTING and n.notice_deadline else []
        if found or n.state not in (NodeState.READY, NodeState.DRAINING):
            problems.append(NodeHealth(node=n.id, state=n.state.value, problems=found or [f"it is {n.state}"]))
    names = {j.id: j.name for j in snap.jobs}
    failing: dict[str, int] = {}
    for c in snap.checkpoints:
        if c.state == "failed" and snap.now - c.created < DAY:
            name = names.get(c.job, c.job_name or c.job)
            failing[name] = failing.get(name, 0) + 1
    failed = sorted(j.name for j in snap.jobs if j.state == JobState.FAILED and snap.now - j.updated < DAY)
    return Health(nodes=by_state, usable=sum(1 for v in views.values() if v.usable), problems=problems,
                  failing_checkpoints=failing, failed_jobs=failed,
                  ok=not problems and not failing and not failed and bool(snap.nodes))


# ---------------------------------------------------------------- savings


class NodeSaving(BaseModel):
    node: str
    spot: bool
    price_per_hour: float
    on_demand_per_hour: float | None  # None: no on-demand price known for its zone and type
    hours: float
    saved: float


class Savings(BaseModel):
    saved_usd: float  # so far, against the same nodes on demand for the same time
    spent_usd: float
    saving_per_hour: float  # at today's prices
    nodes: list[NodeSaving]
    unpriced: list[str]  # spot nodes whose on-demand price is unknown (counted as saving nothing)


def on_demand_price(node: Node, prices: Sequence[PriceRecord]) -> float | None:
    zone, kind = node.labels.get("zone", ""), node.labels.get("instance_type", "")
    matching = [p for p in prices if p.zone == zone and p.instance_type == kind and p.market == "on-demand"]
    if matching:
        return max(matching, key=lambda p: p.timestamp).price_per_hour
    return None if node.spot else effective_price(node, prices)


def savings(snap: Snapshot) -> Savings:
    rows, unpriced = [], []
    for n in snap.nodes:
        if n.state == NodeState.LOST:
            continue
        price = effective_price(n, snap.prices)
        od = on_demand_price(n, snap.prices)
        hours = max(0.0, snap.now - n.started) / HOUR
        if od is None:
            unpriced.append(n.id)
        saved = (od - price) * hours if od is not None else 0.0
        rows.append(NodeSaving(node=n.id, spot=n.spot, price_per_hour=price, on_demand_per_hour=od,
                               hours=round(hours, 4), saved=round(saved, 4)))
    rate = sum((r.on_demand_per_hour or r.price_per_hour) - r.price_per_hour for r in rows)
    return Savings(saved_usd=round(sum(r.saved for r in rows), 4),
                   spent_usd=round(sum(r.price_per_hour * r.hours for r in rows), 4),
                   saving_per_hour=round(rate, 4), nodes=rows, unpriced=unpriced)


# ---------------------------------------------------------------- explain


class Alternative(BaseModel):
    node: str
    spot: bool
    price_per_hour: float
    score: float | None  # None: the job does not fit there
    progress_cost_per_hour: float | None  # USD per hour of progress, preemptions counted
    why_not: str = ""


class Explanation(BaseModel):
    job: str
    state: str
    node: str | None
    score: float | None
    progress_cost_per_hour: float | None
    alternatives: list[Alternative]  # best first
    best: str | None
    move_saving_usd: float | None  # over the job's remaining time (its deadline, else one hour)
    move_cost_usd: float | None
    move_pause_s: float  # what a cold move stops it for (measured: its last checkpoint plus restore)
    live_possible: bool
    would_move: bool
    why: str


def horizon_s(job: Job, now: float) -> float:
    """How long a move's saving counts for: the job's remaining work when it said how much it has,
    else the time to its deadline, else an hour."""
    left = progress.remaining_s(job, now)
    if left is not None:
        return left
    return max(job.deadline - now, 0.0) if job.deadline is not None else EXPLAIN_HORIZON_S


def explain(snap: Snapshot, job: Job) -> Explanation:
    views = dict(snap.views)
    jv = job_view(job, snap.now)
    here = views.get(job.node or "")
    own_free = here is not None and not (job.state in TERMINAL_STATES or job.state == JobState.PREEMPTED)
    alternatives = []
    for v in list(views.values()):
        if v.id == job.node and own_free:  # the job's own capacity is free for it there
            v = replace(v, free_cpus=v.free_cpus + job.cpus, free_memory_bytes=v.free_memory_bytes + job.memory_bytes,
                        free_gpus=v.free_gpus + job.gpus)
            views[v.id] = v
        score = decisions.score_node(jv, v, snap.now)
        alternatives.append(Alternative(
            node=v.id, spot=v.spot, price_per_hour=v.price_per_hour, score=_round(score),
            progress_cost_per_hour=_round(decisions.progress_rate(jv, v)) if score is not None else None,
            why_not=decisions.fit_problem(jv, v) or ""))
    alternatives.sort(key=lambda a: (a.score is None, -(a.score or 0.0), a.node))
    best = next((a.node for a in alternatives if a.score is not None), None)
    current = next((a for a in alternatives if a.node == job.node), None)
    remaining = horizon_s(job, snap.now)
    saving = cost = None
    would, why = False, "it does not run on a node"
    if here is not None and best is not None:
        decision = decisions.should_move(jv, here, views[best], snap.now, remaining, job.last_move_at)
        saving, cost, would, why = decision.saving, decision.cost, decision.move, decision.reason
    elif best is None:
        why = "no node can take it: " + decisions.unplaced_reason(jv, list(views.values()))
    target = views.get(best or "")
    return Explanation(
        job=job.name, state=job.state.value, node=job.node, score=current.score if current else None,
        progress_cost_per_hour=current.progress_cost_per_hour if current else None,
        alternatives=alternatives, best=best, move_saving_usd=_round(saving), move_cost_usd=_round(cost),
        move_pause_s=job.move_cost_s,
        live_possible=bool(here and target and here.lazy_pages and target.lazy_pages and not job.gpu_uuids),
        would_move=would, why=why)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def to_json(answer: BaseModel | list[Any]) -> str:
    """A signal's answer as the API sends it (a list of models is a JSON array)."""
    if isinstance(answer, BaseModel):
        return answer.model_dump_json()
    return "[" + ",".join(a.model_dump_json() for a in answer) + "]"


SIGNALS: dict[str, Callable[[Snapshot], Any]] = {
    "queue": queue, "sla_risk": sla_risk, "spot_market": spot_market, "cluster_health": cluster_health,
    "savings": savings,
}
