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


def effective_price(node: Node, prices: Iterable[PriceRecord]) -> float:
    """The node's price per hour: the newest price feed entry for its zone, instance type and
    market when the pricing service has one, else the price the node declares."""
    market = "spot" if node.spot else "on-demand"
    zone, kind = node.labels.get("zone", ""), node.labels.get("instance_type", "")
    matching = [p for p in prices if p.zone == zone and p.instance_type == kind and p.market == market]
    return max(matching, key=lambda p: p.timestamp).price_per_hour if matching else node.price_per_hour


def node_views(nodes: Sequence[Node], jobs: Iterable[Job], now: float, heartbeat_timeout_s: float,
               prices: Sequence[PriceRecord] = ()) -> list[NodeView]:
    used: dict[str, tuple[float, int, int, int]] = {}
    for job in jobs:
        if not holds_capacity(job):
            continue
        for where in {job.node, job.moving_to} - {None}:
            assert where is not None
            c, m, g, k = used.get(where, (0.0, 0, 0, 0))
            used[where] = (c + job.cpus, m + job.memory_bytes, g + job.gpus, k + 1)
    views = []
    for n in nodes:
        c, m, g, k = used.get(n.id, (0.0, 0, 0, 0))
        why = usable(n, now, heartbeat_timeout_s)
        healthy_gpus = sum(1 for info in n.gpu_list if info.get("healthy", True)) if n.gpu_list else n.gpus
        views.append(NodeView(
            id=n.id, spot=n.spot, price_per_hour=effective_price(n, prices), zone=n.labels.get("zone", ""),
            cpus=float(n.cpus), memory_bytes=n.memory_bytes, gpus=healthy_gpus, free_cpus=n.cpus - c,
            free_memory_bytes=n.memory_bytes - m, free_gpus=healthy_gpus - g, preemptions=n.preemptions,
            uptime_s=max(1.0, now - n.started), usable=why is None, reason=why or "", lazy_pages=n.lazy_pages,
            notice_deadline=n.notice_deadline if n.state == NodeState.PREEMPTING else None, jobs=k))
    return views


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
