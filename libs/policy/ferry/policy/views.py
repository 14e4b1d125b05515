"""Pure translation of KV records into the policy's views (NodeView, JobView)."""

from collections.abc import Iterable, Sequence

from ferry.common.models import TERMINAL_STATES, Job, JobState, Node, NodeState, PriceRecord
from ferry.gpu.models import GpuInfo
from ferry.gpu.placement import GpuRequest, assign
from ferry.policy import decisions, progress
from ferry.policy.decisions import JobView, NodeView
from ferry.policy.placement import usable


def holds_capacity(job: Job) -> bool:
    """Whether `job` counts against its node's capacity (parked and finished jobs do not)."""
    return job.node is not None and job.state not in TERMINAL_STATES and job.state != JobState.PREEMPTED


def price_key(node: Node) -> tuple[str, str, str]:
    return node.labels.get("zone", ""), node.labels.get("instance_type", ""), "spot" if node.spot else "on-demand"


def newest_prices(prices: Iterable[PriceRecord]) -> dict[tuple[str, str, str], float]:
    """The newest price per (zone, instance type, market): ``effective_price`` for many nodes."""
    newest: dict[tuple[str, str, str], PriceRecord] = {}
    for p in prices:
        key = (p.zone, p.instance_type, p.market)
        if key not in newest or p.timestamp > newest[key].timestamp:
            newest[key] = p
    return {k: p.price_per_hour for k, p in newest.items()}


def effective_price(node: Node, prices: Iterable[PriceRecord]) -> float:
    """The node's price per hour: the newest price feed entry for its zone, instance type and
    market when the pricing service has one, else the price the node declares."""
    return newest_prices(prices).get(price_key(node), node.price_per_hour)


Used = tuple[float, int, int, int]  # cpus, memory, gpus, jobs held on a node
NOTHING: Used = (0.0, 0, 0, 0)


Share = tuple[tuple[str, int, int, int], ...]  # (node, milli-cpus, memory, gpus) for each end a job holds


def share_of(job: Job) -> Share:
    if job.node is None or job.state in TERMINAL_STATES or job.state == JobState.PREEMPTED:
        return ()
    take = (round(job.cpus * 1000), job.memory_bytes, job.gpus)
    if job.moving_to is None or job.moving_to == job.node:
        return ((job.node, *take),)
    return ((job.node, *take), (job.moving_to, *take))


def used_by(jobs: Iterable[Job]) -> dict[str, Used]:
    """Per node, what the jobs that hold capacity there take (a moving job holds both ends);
    cpus are summed in whole milli-cpus, so that ten jobs of 0.1 take exactly one."""
    totals: dict[str, list[int]] = {}
    for job in jobs:
        for node, mcpu, memory, gpus in share_of(job):
            t = totals.setdefault(node, [0, 0, 0, 0])
            t[0] += mcpu
            t[1] += memory
            t[2] += gpus
            t[3] += 1
    return {n: (t[0] / 1000, t[1], t[2], t[3]) for n, t in totals.items()}


def node_view(n: Node, used: Used, now: float, why: str | None, price: float) -> NodeView:
    c, m, g, k = used
    healthy_gpus = sum(1 for info in n.gpu_list if info.get("healthy", True)) if n.gpu_list else n.gpus
    return NodeView(
        id=n.id, spot=n.spot, price_per_hour=price, zone=n.labels.get("zone", ""),
        cpus=float(n.cpus), memory_bytes=n.memory_bytes, gpus=healthy_gpus, free_cpus=n.cpus - c,
        free_memory_bytes=n.memory_bytes - m, free_gpus=healthy_gpus - g, preemptions=n.preemptions,
        uptime_s=max(1.0, now - n.started), usable=why is None, reason=why or "", lazy_pages=n.lazy_pages,
        notice_deadline=n.notice_deadline if n.state == NodeState.PREEMPTING else None, jobs=k)


def node_views(nodes: Sequence[Node], jobs: Iterable[Job], now: float, heartbeat_timeout_s: float,
               prices: Sequence[PriceRecord] = ()) -> list[NodeView]:
    used, newest = used_by(jobs), newest_prices(prices)
    return [node_view(n, used.get(n.id, NOTHING), now, usable(n, now, heartbeat_timeout_s),
                      newest.get(price_key(n), n.price_per_hour)) for n in nodes]


def wants_live(job: Job, source: Node, target: Node, now: float) -> bool:
    """``decisions.wants_live`` for the scheduler's records."""
    views = {v.id: v for v in node_views([source, target], [], now, float("inf"))}
    return decisions.wants_live(job_view(job, now), views[source.id], views[target.id], now)


def job_view(job: Job, now: float) -> JobView:
    return JobView(
        id=job.id, priority=job.priority, cpus=job.cpus, memory_bytes=job.memory_bytes, gpus=job.gpus,
        deadline_at=job.deadline, max_downtime_s=job.max_downtime_s, node=job.node,
        move_cost_s=job.move_cost_s, checkpoint_every_s=job.checkpoint_every_s or 600.0,
        holds_gpus=bool(job.gpu_uuids), remaining_s=progress.remaining_s(job, now),
    )


def gpu_assignments(job: Job, nodes: Sequence[Node], others: Iterable[Job]) -> dict[str, list[str] | str]:
    """For a GPU job: per node, the GPUs it would get there, or why it cannot (none for other jobs)."""
    if not job.gpus:
        return {}
    request = GpuRequest(count=job.gpus, model=job.gpu_model, memory_bytes=job.gpu_memory_bytes or None,
                         shared=job.gpu_shared)
    holders = [j for j in others if holds_capacity(j) and j.gpu_uuids]
    out: dict[str, list[str] | str] = {}
    for n in nodes:
        if n.gpu_error:
            out[n.id] = f"its GPU driver fails: {n.gpu_error}"
            continue
        gpus = [GpuInfo.model_validate(g) for g in n.gpu_list]
        in_use: dict[str, list[str]] = {}
        for j in holders:
            if n.id in (j.node, j.moving_to):
                for uuid in j.gpu_uuids:
                    in_use.setdefault(uuid, []).append(j.id)
        shared = {j.id for j in holders if j.gpu_shared}
        got = assign(request, gpus, in_use, shared_jobs=shared)
        out[n.id] = got if isinstance(got, str) else [g.uuid for g in got]
    return out


def gpu_trouble(job: Job, node: Node) -> tuple[bool, str] | None:
    """Whether a GPU `job` holds on `node` became unhealthy: (it still answers, what is wrong)."""
    if not job.gpu_uuids:
        return None
    for raw in node.gpu_list:
        gpu = GpuInfo.model_validate(raw)
        if gpu.uuid in job.gpu_uuids and not gpu.healthy:
            return not gpu.lost, f"GPU {gpu.index} ({gpu.uuid}): " + "; ".join(gpu.problems or ["unhealthy"])
    return None


class ViewCache:
    """``node_views`` for a caller that asks again and again over records that mostly stay (the
    scheduler, at every placement). Records are the mirror's own objects, replaced on every change:
    a job's share of its node is computed again only when its record is another object (and the
    nodes' totals move by the difference, in whole milli-cpus and bytes: no drift), and a node's
    view only when its record is another object, what its jobs take changed, its price changed, or
    a second has passed (its uptime, which the reliability score reads, and whether its heartbeat
    is late are counted in whole seconds here)."""

    def __init__(self) -> None:
        self._views: dict[str, tuple[Node, Used, int, float, NodeView]] = {}
        self._shares: dict[int, tuple[Job, Share]] = {}  # id(job) -> the record and its share
        self._totals: dict[str, list[int]] = {}  # node -> [milli-cpus, memory, gpus, jobs]

    def _add(self, share: Share, sign: int) -> None:
        for node, mcpu, memory, gpus in share:
            t = self._totals.setdefault(node, [0, 0, 0, 0])
            t[0] += sign * mcpu
            t[1] += sign * memory
            t[2] += sign * gpus
            t[3] += sign

    def used(self, jobs: Iterable[Job]) -> dict[str, Used]:
        """``used_by(jobs)``, from the shares of the records that changed since the last call."""
        old, fresh = self._shares, {}
        for job in jobs:
            key = id(job)
            hit = old.get(key)
            if hit is None or hit[0] is not job:
                if hit is not None:
                    self._add(hit[1], -1)
                hit = (job, share_of(job))
                self._add(hit[1], +1)
            fresh[key] = hit
        for key in old.keys() - fresh.keys():
            self._add(old[key][1], -1)
        self._shares = fresh
        return {n: (t[0] / 1000, t[1], t[2], t[3]) for n, t in self._totals.items() if t[3]}

    def views(self, nodes: Sequence[Node], jobs: Iterable[Job], now: float, heartbeat_timeout_s: float,
              prices: Sequence[PriceRecord] = ()) -> list[NodeView]:
        used = self.used(jobs)
        second = int(now)
        newest = newest_prices(prices)
        out = []
        for n in nodes:
            took = used.get(n.id, NOTHING)
            price = newest.get(price_key(n), n.price_per_hour) if newest else n.price_per_hour
            kept = self._views.get(n.id)
            # the same record in the same second: whether it is usable is the same too
            if kept is not None and kept[0] is n and kept[1] == took and kept[2] == second and kept[3] == price:
                out.append(kept[4])
                continue
            why = usable(n, now, heartbeat_timeout_s)
            view = node_view(n, took, float(second), why, price)
            self._views[n.id] = (n, took, second, price, view)
            out.append(view)
        if len(self._views) > 2 * len(nodes) + 16:  # nodes that left
            ids = {n.id for n in nodes}
            self._views = {k: v for k, v in self._views.items() if k in ids}
        return out
