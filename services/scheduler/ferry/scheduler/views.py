"""Pure translation of KV records into the policy's views (NodeView, JobView)."""

from collections.abc import Iterable, Sequence

from ferry.common.models import TERMINAL_STATES, Job, JobState, Node
from ferry.scheduler.placement import usable
from ferry.scheduler.policy import JobView, NodeView


def holds_capacity(job: Job) -> bool:
    """Whether `job` counts against its node's capacity (parked and finished jobs do not)."""
    return job.node is not None and job.state not in TERMINAL_STATES and job.state != JobState.PREEMPTED


def node_views(nodes: Sequence[Node], jobs: Iterable[Job], now: float, heartbeat_timeout_s: float) -> list[NodeView]:
    used: dict[str, tuple[float, int, int]] = {}
    for job in jobs:
        if not holds_capacity(job):
            continue
        for where in {job.node, job.moving_to} - {None}:
            assert where is not None
            c, m, g = used.get(where, (0.0, 0, 0))
            used[where] = (c + job.cpus, m + job.memory_bytes, g + job.gpus)
    views = []
    for n in nodes:
        c, m, g = used.get(n.id, (0.0, 0, 0))
        why = usable(n, now, heartbeat_timeout_s)
        views.append(NodeView(
            id=n.id, spot=n.spot, price_per_hour=n.price_per_hour, zone=n.labels.get("zone", ""),
            cpus=float(n.cpus), memory_bytes=n.memory_bytes, gpus=n.gpus, free_cpus=n.cpus - c,
            free_memory_bytes=n.memory_bytes - m, free_gpus=n.gpus - g, preemptions=n.preemptions,
            uptime_s=max(1.0, now - n.started), usable=why is None, reason=why or ""))
    return views


def job_view(job: Job, now: float) -> JobView:
    return JobView(
        id=job.id, priority=job.priority, cpus=job.cpus, memory_bytes=job.memory_bytes, gpus=job.gpus,
        deadline_at=job.deadline, max_downtime_s=job.max_downtime_s, node=job.node,
        move_cost_s=job.move_cost_s, checkpoint_every_s=job.checkpoint_every_s or 600.0,
    )
