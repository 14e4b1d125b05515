"""The placement and rebalancing policy: a pure function of cluster state and time.

Nothing here does IO, sleeps or reads a clock: `now` is always an argument, so the live scheduler
and `ferry simulate` run exactly the same code.

Units: seconds for time, USD per hour for prices, bytes for memory.

The score of a node for a job is the negated expected price of one hour of the job's *progress*
there, raised by a reliability penalty:

    waste    = hazard * loss_per_preemption      (fraction of held time thrown away by preemptions)
    rate     = price / (1 - waste)               (USD per hour of progress)
    score    = -rate * (1 + weight * waste)      (higher is better)

where `hazard` is the node's observed preemptions per hour of uptime (with a prior for spot nodes
that have not been watched for long), `loss_per_preemption` is half a checkpoint interval plus a
restore, and `weight` grows with the job's priority and with how much of its SLA (deadline slack
or tolerated downtime) the node's preemptions are expected to eat.

Deadlines are guarded exactly, not by score alone: a job is deadline-critical when its slack no
longer covers the time until the scheduler looks again plus the unsaved work one preemption would
throw away; a critical job is sent to on-demand (spot nodes score below every on-demand node, and
`should_move` moves it off spot at once). Checked at every look, this keeps every deadline that
on-demand alone could have met at submission. A job with a deadline that is not critical takes only
spot nodes and otherwise waits (`choose_node`): waiting is free, and the guard still sends it to
on-demand in time. It waits only while its slack is above a reserve (`slack_reserve_s`); below it,
it sits out outages on on-demand and goes back to spot when spot returns, rather than spend its
last slack waiting and then run on on-demand to the end whatever spot does.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from ferry.common.units import format_bytes

HOUR = 3600.0
# A spot node that nobody has watched yet is assumed to be preempted once a day; the prior fades as
# uptime is observed (it is worth one day of watching).
SPOT_PRIOR_PREEMPTIONS = 1.0
SPOT_PRIOR_UPTIME_S = 24 * HOUR
MAX_WASTE = 0.9
# Subtracted from a spot node's score for a deadline-critical job: below any on-demand node.
CRITICAL_PENALTY = 1e6
# The scheduler looks at every job at least this often; a decision must hold until the next look.
REVIEW_EVERY_S = 60.0
# Trips between on-demand and spot that a deadline job's slack reserve pays for (`slack_reserve_s`).
RESERVE_TRIPS = 8.0
RESERVE_OF_WORK = 0.2
NEVER: Mapping[str, int] = MappingProxyType({})  # ``spread_key``'s history when the caller keeps none


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the policy knows about one node."""

    id: str
    spot: bool
    price_per_hour: float
    zone: str = ""
    cpus: float = 0.0
    memory_bytes: int = 0
    gpus: int = 0
    free_cpus: float = 0.0
    free_memory_bytes: int = 0
    free_gpus: int = 0
    preemptions: int = 0  # observed
    uptime_s: float = 0.0  # observed time the node (or its spot market) was up
    usable: bool = True
    reason: str = ""  # why it is not usable
    lazy_pages: bool = False  # can be either end of a post-copy (live) move
    notice_deadline: float | None = None  # under an interruption notice: when it goes away
    jobs: int = 0  # jobs that hold capacity there (running, or moving there)


@dataclass(frozen=True, slots=True)
class JobView:
    """What the policy knows about one job."""

    id: str
    priority: int = 0
    cpus: float = 0.0
    memory_bytes: int = 0
    gpus: int = 0
    deadline_at: float | None = None
    max_downtime_s: float | None = None
    remaining_s: float | None = None  # work left, if known
    unsaved_s: float = 0.0  # work done since the last checkpoint (lost if preempted now)
    node: str | None = None
    move_cost_s: float = 30.0  # measured last checkpoint + restore time
    checkpoint_every_s: float = 600.0
    holds_gpus: bool = False  # GPUs are assigned to it (CUDA state cannot be served lazily)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where `place` put the pending jobs, and why the others wait."""

    assignments: dict[str, str] = field(default_factory=dict)  # job id -> node id
    unplaced: dict[str, str] = field(default_factory=dict)  # job id -> one-line reason


@dataclass(frozen=True, slots=True)
class MoveDecision:
    move: bool
    saving: float  # USD expected over the job's remaining time
    cost: float  # USD of one move
    reason: str


# ---------------------------------------------------------------- SLA


def slack_s(job: JobView, now: float) -> float | None:
    """Time to the deadline minus the work left and one move (`move_cost_s`); None without a deadline.

    A job with unknown remaining work is treated as needing all the time to its deadline.
    """
    if job.deadline_at is None:
        return None
    remaining = job.remaining_s if job.remaining_s is not None else job.deadline_at - now
    return job.deadline_at - now - remaining - job.move_cost_s


def deadline_critical(job: JobView, now: float, horizon_s: float = REVIEW_EVERY_S) -> bool:
    """Whether the job must be on on-demand now to be sure of its deadline.

    Staying on (or starting on) spot until the next look, `horizon_s` from now, is safe when the
    slack covers that time plus the unsaved work a preemption would throw away (work done meanwhile
    is either kept or replaces what it loses; a checkpoint every interval caps the unsaved work).
    """
    slack = slack_s(job, now)
    return slack is not None and slack < horizon_s + min(job.unsaved_s, job.checkpoint_every_s)


# ---------------------------------------------------------------- scoring


def hazard_per_hour(node: NodeView) -> float:
    """Observed preemptions per hour of uptime; spot nodes start from a prior of one a day."""
    if node.spot:
        return (node.preemptions + SPOT_PRIOR_PREEMPTIONS) / ((node.uptime_s + SPOT_PRIOR_UPTIME_S) / HOUR)
    return node.preemptions / max(node.uptime_s / HOUR, 24.0)


def waste_fraction(job: JobView, node: NodeView) -> float:
    """Expected fraction of the time held on `node` that preemptions throw away."""
    expected_loss_h = (job.checkpoint_every_s / 2 + job.move_cost_s) / HOUR
    return min(hazard_per_hour(node) * expected_loss_h, MAX_WASTE)


def progress_rate(job: JobView, node: NodeView) -> float:
    """Expected USD per hour of the job's progress on `node`."""
    return node.price_per_hour / (1.0 - waste_fraction(job, node))


def sla_pressure(job: JobView, node: NodeView, now: float) -> float:
    """How much of the job's SLA the node's preemptions are expected to eat (0: none, 1: all)."""
    pressure = 0.0
    slack = slack_s(job, now)
    if slack is not None and job.remaining_s is not None:
        expected_loss_s = waste_fraction(job, node) * job.remaining_s
        pressure = expected_loss_s / max(slack, 1.0)
    if job.max_downtime_s is not None and node.spot:
        pressure = max(pressure, job.move_cost_s / max(job.max_downtime_s, 1.0))
    return min(pressure, 100.0)


def reliability_weight(job: JobView, node: NodeView, now: float) -> float:
    """How much reliability matters: more for higher priority and tighter SLAs."""
    return (1.0 + max(job.priority, 0) / 10.0) * (1.0 + 10.0 * sla_pressure(job, node, now))


def fit_problem(job: JobView, node: NodeView) -> str | None:
    """Why `job` does not fit on `node` now, or None when it does."""
    if not node.usable:
        return f"node {node.id} is unusable ({node.reason or 'no reason given'})"
    if node.free_cpus < job.cpus:
        return f"node {node.id} has {node.free_cpus:g} free cpus, the job needs {job.cpus:g}"
    if node.free_memory_bytes < job.memory_bytes:
        return (f"node {node.id} has {format_bytes(node.free_memory_bytes)} of memory free, "
                f"the job needs {format_bytes(job.memory_bytes)}")
    if node.free_gpus < job.gpus:
        return f"node {node.id} has {node.free_gpus} free gpus, the job needs {job.gpus}"
    return None


def score_node(job: JobView, node: NodeView, now: float, horizon_s: float = REVIEW_EVERY_S) -> float | None:
    """How good `node` is for `job` now (higher is better), or None when the job does not fit.

    `horizon_s`: how long the choice must hold before the scheduler looks again (deadline safety).
    """
    if fit_problem(job, node) is not None:
        return None
    waste = waste_fraction(job, node)
    score = -progress_rate(job, node) * (1.0 + reliability_weight(job, node, now) * waste)
    if node.spot and deadline_critical(job, now, horizon_s):
        score -= CRITICAL_PENALTY
    return score


def spread_key(node: NodeView, last_given: Mapping[str, int]) -> tuple[int, float, int, str]:
    """The order among nodes that score the same: fewest jobs first, then the most free cpus, then
    the one given a job longest ago (``last_given``: node id to the sequence number of the last
    pick of it; a node never picked comes first), then by id. Ferry spreads equal work over equal
    nodes rather than packing it: a node's loss or spot reclaim then takes fewer jobs with it, and
    checkpoints and moves of its jobs compete less for its disk and network. Short jobs that end
    before the next pick leave every node at the same count: without the third key the first by
    id took them all; with it equal nodes take turns. (Packing, to free whole nodes for
    scale-down, is the autoscaler's job.)"""
    return node.jobs, -node.free_cpus, last_given.get(node.id, -1), node.id


def best_node(job: JobView, nodes: Sequence[NodeView], now: float, horizon_s: float = REVIEW_EVERY_S,
              last_given: Mapping[str, int] = NEVER) -> tuple[NodeView | None, float]:
    """The best-scoring node for `job` (among equals the one ``spread_key`` puts first), or None
    when nothing fits."""
    best: NodeView | None = None
    best_score = float("-inf")
    for node in nodes:
        score = score_node(job, node, now, horizon_s)
        if score is not None and (score > best_score or (
                score == best_score and best is not None
                and spread_key(node, last_given) < spread_key(best, last_given))):
            best, best_score = node, score
    return best, best_score


def slack_reserve_s(job: JobView) -> float:
    """The slack a job with a deadline keeps rather than spend it waiting for spot: enough for
    ``RESERVE_TRIPS`` trips from on-demand to spot and back, each a move there, the work one
    preemption throws away and a move back. Waiting is free, but slack spent down to the critical
    line leaves the job on on-demand for the rest of its run, even while spot comes back; with the
    reserve kept it sits out later outages on on-demand and returns to spot each time."""
    trips = RESERVE_TRIPS * (2 * job.move_cost_s + job.checkpoint_every_s)
    return trips if job.remaining_s is None else min(trips, RESERVE_OF_WORK * job.remaining_s)


def choose_node(job: JobView, nodes: Sequence[NodeView], now: float,
                horizon_s: float = REVIEW_EVERY_S, last_given: Mapping[str, int] = NEVER) -> NodeView | None:
    """Where one job with a deadline should run now, or None to wait.

    While its slack is above the reserve (``slack_reserve_s``) the job takes only spot nodes (the
    best-scoring one) and otherwise waits: waiting is free, and the deadline check guarantees
    on-demand in time. Below the reserve it takes on-demand when no spot node is there, and goes back
    to spot when one is (``should_move``); once critical, the score itself sends it to on-demand. A
    job without a deadline takes the best node.
    """
    slack = slack_s(job, now)
    if slack is not None and not deadline_critical(job, now, horizon_s):
        spot = [n for n in nodes if n.spot or n.id == job.node]
        if slack >= slack_reserve_s(job) or any(fit_problem(job, n) is None for n in spot):
            nodes = spot
    best, _ = best_node(job, nodes, now, horizon_s, last_given)
    return best


# ---------------------------------------------------------------- placement


def _take(node: NodeView, job: JobView) -> NodeView:
    return replace(node, free_cpus=node.free_cpus - job.cpus, free_gpus=node.free_gpus - job.gpus,
                   free_memory_bytes=node.free_memory_bytes - job.memory_bytes, jobs=node.jobs + 1)


def _largest_free(nodes: Sequence[NodeView], what: str) -> tuple[float, str]:
    usable = [n for n in nodes if n.usable]
    if not usable:
        return 0.0, ""
    top = max(usable, key=lambda n: (float(getattr(n, what)), n.id))
    return float(getattr(top, what)), top.id


def unplaced_reason(job: JobView, nodes: Sequence[NodeView]) -> str:
    """One line on why no node takes `job`."""
    if not nodes:
        return "no nodes have joined the cluster"
    if not any(n.usable for n in nodes):
        return "no usable node: " + "; ".join(f"{n.id}: {n.reason or 'unusable'}" for n in nodes)
    for need, what, unit in ((job.cpus, "free_cpus", "cpus"), (job.gpus, "free_gpus", "gpus"),
                             (job.memory_bytes, "free_memory_bytes", "memory")):
        largest, where = _largest_free(nodes, what)
        if largest < need:
            if unit == "memory":
                return f"needs {format_bytes(need)} of memory, the largest free is {format_bytes(largest)} on {where}"
            return f"needs {need:g} {unit}, the largest free is {largest:g} on {where}"
    return "no single node has enough free cpus, memory and gpus together"


def place(pending: Sequence[JobView], nodes: Sequence[NodeView], now: float,
          horizon_s: float = REVIEW_EVERY_S) -> Placement:
    """Assigns pending jobs to nodes, highest priority first (then by id), using up free capacity."""
    free = {n.id: n for n in nodes}
    placement = Placement()
    for job in sorted(pending, key=lambda j: (-j.priority, j.id)):
        best, _ = best_node(job, list(free.values()), now, horizon_s)
        if best is None:
            placement.unplaced[job.id] = unplaced_reason(job, list(free.values()))
            continue
        placement.assignments[job.id] = best.id
        free[best.id] = _take(best, job)
    return placement


# ---------------------------------------------------------------- rebalancing


def wants_live(job: JobView, source: NodeView, target: NodeView, now: float) -> bool:
    """For moves the scheduler starts itself: live when the job's SLA bounds its downtime below
    what a cold move costs, and, under a spot notice, when the time left covers a live move (its
    memory must leave the source before the source dies) three times over."""
    if job.max_downtime_s is None or job.max_downtime_s >= job.move_cost_s or job.holds_gpus:
        return False
    if not (source.lazy_pages and target.lazy_pages):
        return False
    if source.notice_deadline is not None:
        return source.notice_deadline - now > 3 * max(job.move_cost_s, 10.0)
    return True


def move_cost(job: JobView, current: NodeView, best: NodeView) -> float:
    """USD of one move: the move's time held on `current`, and that much work bought again on `best`."""
    return job.move_cost_s / HOUR * (current.price_per_hour + best.price_per_hour)


def should_move(job: JobView, current: NodeView, best: NodeView, now: float, remaining_s: float,
                last_move_at: float | None, hysteresis: float = 0.2, min_interval_s: float = 600.0,
                horizon_s: float = REVIEW_EVERY_S) -> MoveDecision:
    """Whether `job` should leave `current` for `best`: the expected saving over its remaining time
    must beat the cost of the move by the hysteresis factor, and the last move must be old enough.
    A job whose deadline needs on-demand leaves spot at once; one goes back to spot only when its
    slack covers the move and a whole checkpoint interval more."""
    job = replace(job, remaining_s=remaining_s)
    hours = remaining_s / HOUR
    saving = (progress_rate(job, current) - progress_rate(job, best)) * hours
    cost = move_cost(job, current, best)
    if best.id == current.id:
        return MoveDecision(False, 0.0, cost, "already on the best node")
    if score_node(job, best, now, horizon_s) is None:
        return MoveDecision(False, saving, cost, f"the job does not fit on {best.id}")
    if current.spot and not best.spot and deadline_critical(job, now, horizon_s):
        return MoveDecision(True, saving, cost, f"the deadline needs on-demand node {best.id} now")
    if best.spot and deadline_critical(job, now, horizon_s + job.move_cost_s + job.checkpoint_every_s):
        return MoveDecision(False, saving, cost, f"too close to the deadline to risk spot node {best.id}")
    if last_move_at is not None and now - last_move_at < min_interval_s:
        return MoveDecision(False, saving, cost,
                            f"moved {now - last_move_at:.0f}s ago, less than {min_interval_s:.0f}s")
    if saving <= cost * (1.0 + hysteresis):
        return MoveDecision(False, saving, cost,
                            f"saving {saving:.2f} USD does not beat the move's {cost:.2f} USD by {hysteresis:.0%}")
    return MoveDecision(True, saving, cost, f"saves {saving:.2f} USD against a move costing {cost:.2f} USD")
