"""Elastic scale: which nodes to launch and which to retire, a pure function of the fleet, the jobs
and time (the autoscaler service carries the plan out; ``ferry simulate``-style tests drive it with
made-up clusters).

Scale up. Jobs that wait and that the nodes there are (and the nodes being launched) cannot take
get new nodes: each, highest priority first, goes onto a node this plan launches already when it
fits, else onto a new node of the offer that the scheduler's own score likes best for it
(``decisions.score_node``: price, the zone's interruption history, the job's SLA). A job that has
waited less than ``scale_up_after_s`` does not count yet (the scheduler may still place it). The
fleet never grows past ``max_nodes``, and it grows to ``min_nodes`` with the cheapest offer.

Scale down. A managed node whose jobs would all fit on the other nodes, with those nodes still at
or under ``target_utilization``, is underused; one that stays underused for ``scale_down_after_s``
is retired (its jobs are moved away by a drain, with checkpoints, then it is terminated): the most
expensive first, one at a time, never below ``min_nodes``, and not while any job waits for capacity
or a launch is under way. The delay is the hysteresis: a node that is busy again before it ends
starts its count over.

Every action carries its reason and what it is expected to cost or save per hour.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ferry.common.cluster import offer_key
from ferry.common.models import AutoscalePolicy
from ferry.policy.decisions import JobView, NodeView, fit_problem, place, score_node


@dataclass(frozen=True, slots=True)
class Offer:
    """An instance type a provider can launch, in one zone and market."""

    instance_type: str
    zone: str
    spot: bool
    price_per_hour: float
    cpus: int
    memory_bytes: int
    gpus: int = 0
    preemptions: int = 0  # interruptions seen in this zone and market
    uptime_s: float = 0.0  # time watched

    @property
    def key(self) -> str:
        return offer_key(self.instance_type, self.zone, self.spot)

    def as_node(self, node_id: str) -> NodeView:
        """The empty node a launch of this offer would add."""
        return NodeView(id=node_id, spot=self.spot, price_per_hour=self.price_per_hour, zone=self.zone,
                        cpus=float(self.cpus), memory_bytes=self.memory_bytes, gpus=self.gpus,
                        free_cpus=float(self.cpus), free_memory_bytes=self.memory_bytes, free_gpus=self.gpus,
                        preemptions=self.preemptions, uptime_s=self.uptime_s)


@dataclass(frozen=True, slots=True)
class ScaleUp:
    offer: Offer
    jobs: tuple[str, ...]  # the waiting jobs it is for (none: to reach --min)
    reason: str

    @property
    def cost_per_hour(self) -> float:
        return self.offer.price_per_hour


@dataclass(frozen=True, slots=True)
class ScaleDown:
    node: str
    jobs: tuple[str, ...]  # to move away first
    saving_per_hour: float
    reason: str


@dataclass(frozen=True, slots=True)
class Fleet:
    """What the planner sees. ``nodes``: the cluster's nodes as the scheduler sees them (usable or
    not); ``managed``: those the provider launched and may terminate; ``launching`` and
    ``retiring``: nodes with an action under way; ``jobs_on``: the jobs holding capacity on each
    node; ``waiting``: jobs no node has taken, with how long each has waited."""

    nodes: Sequence[NodeView]
    managed: frozenset[str]
    launching: Sequence[Offer] = ()
    retiring: frozenset[str] = frozenset()
    jobs_on: Mapping[str, Sequence[JobView]] = field(default_factory=dict)
    waiting: Sequence[tuple[JobView, float]] = ()
    refused: frozenset[str] = frozenset()  # offers whose last launch the provider refused (backing off)


@dataclass(frozen=True, slots=True)
class Plan:
    actions: tuple[ScaleUp | ScaleDown, ...]
    underused_since: dict[str, float]  # carried to the next plan
    stuck: dict[str, str]  # waiting job -> why no launch helps it


def utilization(node: NodeView) -> float:
    """The busiest of the node's cpus, memory and GPUs, 0..1."""
    parts = [(node.cpus - node.free_cpus) / node.cpus if node.cpus else 0.0,
             (node.memory_bytes - node.free_memory_bytes) / node.memory_bytes if node.memory_bytes else 0.0,
             (node.gpus - node.free_gpus) / node.gpus if node.gpus else 0.0]
    return max(parts)


def _headroom(node: NodeView, target: float) -> NodeView:
    """`node` with only the capacity left below `target` utilization counted as free."""
    return replace(node, free_cpus=node.free_cpus - (1 - target) * node.cpus,
                   free_memory_bytes=node.free_memory_bytes - int((1 - target) * node.memory_bytes),
                   free_gpus=node.free_gpus - round((1 - target) * node.gpus))


def _best_offer(job: JobView, offers: Sequence[Offer], now: float) -> Offer | None:
    scored = [(s, o) for o in offers if (s := score_node(job, o.as_node("new"), now)) is not None]
    if not scored:
        return None
    return max(scored, key=lambda so: (so[0], -so[1].price_per_hour, so[1].key))[1]


def _scale_up(policy: AutoscalePolicy, fleet: Fleet, offers: Sequence[Offer], now: float, size: int
              ) -> tuple[list[ScaleUp], dict[str, str]]:
    ready = [n for n in fleet.nodes if n.usable and n.id not in fleet.retiring]
    pool = ready + [o.as_node(f"launching-{i}") for i, o in enumerate(fleet.launching)]
    due = [j for j, waited in fleet.waiting if waited >= policy.scale_up_after_s]
    unplaced = set(place(due, pool, now).unplaced)
    usable_offers = [o for o in offers if o.key not in fleet.refused]
    launches: list[tuple[Offer, NodeView, list[str]]] = []
    stuck: dict[str, str] = {}
    for job in sorted((j for j in due if j.id in unplaced), key=lambda j: (-j.priority, j.id)):
        home = next((i for i, (_, view, _) in enumerate(launches) if fit_problem(job, view) is None), None)
        if home is not None:
            offer, view, ids = launches[home]
            launches[home] = (offer, replace(view, free_cpus=view.free_cpus - job.cpus,
                                             free_memory_bytes=view.free_memory_bytes - job.memory_bytes,
                                             free_gpus=view.free_gpus - job.gpus), [*ids, job.id])
            continue
        if size + len(launches) >= policy.max_nodes:
            stuck[job.id] = f"the fleet is at --max {policy.max_nodes} nodes"
            continue
        best = _best_offer(job, usable_offers, now)
        if best is None:
            why = "no instance type the providers offer fits it"
            if len(usable_offers) < len(offers):
                why += " (launches of some were refused; trying them again later)"
            stuck[job.id] = why
            continue
        launches.append((best, best.as_node("new"), [job.id]))
    actions = [ScaleUp(o, tuple(ids), f"{len(ids)} waiting job(s) fit no node: {', '.join(ids)}; "
                       f"{o.key} at {o.price_per_hour:.3f} USD/h") for o, _, ids in launches]
    if usable_offers:
        cheapest = min(usable_offers, key=lambda o: (o.price_per_hour, o.key))
        while size + len(actions) < policy.min_nodes:
            actions.append(ScaleUp(cheapest, (), f"below --min {policy.min_nodes} nodes; "
                                                 f"{cheapest.key} at {cheapest.price_per_hour:.3f} USD/h"))
    return actions, stuck


def _fits_elsewhere(node: NodeView, fleet: Fleet, policy: AutoscalePolicy, now: float) -> str | None:
    """Where the node's jobs would go (one line), or None when they do not all fit under the target."""
    others = [_headroom(n, policy.target_utilization) for n in fleet.nodes
              if n.usable and n.id != node.id and n.id not in fleet.retiring]
    jobs = list(fleet.jobs_on.get(node.id, ()))
    if not jobs:
        return "it runs no job"
    result = place([replace(j, node=None) for j in jobs], others, now)
    if result.unplaced:
        return None
    where = sorted(set(result.assignments.values()))
    return f"its {len(jobs)} job(s) fit on {', '.join(where)} at <= {policy.target_utilization:.0%}"


def plan(policy: AutoscalePolicy, fleet: Fleet, offers: Sequence[Offer], now: float,
         underused_since: Mapping[str, float]) -> Plan:
    """The actions to take now (see the module's docstring)."""
    if not policy.enabled:
        return Plan((), {}, {})
    size = sum(1 for n in fleet.nodes if n.id not in fleet.retiring) + len(fleet.launching)
    ups, stuck = _scale_up(policy, fleet, offers, now, size)
    if ups or fleet.launching or stuck or any(w >= policy.scale_up_after_s for _, w in fleet.waiting):
        return Plan(tuple(ups), {}, stuck)  # capacity is short: nothing retires, every count starts over
    since: dict[str, float] = {}
    due: list[tuple[float, NodeView, str]] = []
    for node in fleet.nodes:
        if node.id not in fleet.managed or node.id in fleet.retiring or not node.usable:
            continue
        where = _fits_elsewhere(node, fleet, policy, now)
        if where is None:
            continue
        since[node.id] = underused_since.get(node.id, now)
        if now - since[node.id] >= policy.scale_down_after_s:
            due.append((node.price_per_hour, node, where))
    if not due or size - 1 < policy.min_nodes:
        return Plan((), since, {})
    _, node, where = max(due, key=lambda d: (d[0], -d[1].jobs, d[1].id))
    jobs = tuple(j.id for j in fleet.jobs_on.get(node.id, ()))
    down = ScaleDown(node.id, jobs, node.price_per_hour,
                     f"underused for {now - since[node.id]:.0f}s: {where}; saves {node.price_per_hour:.3f} USD/h")
    return Plan((down,), since, {})
