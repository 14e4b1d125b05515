"""What the bridge-network jobs ask of the nodes: published ports free cluster-wide, and each
node's routes and port forwards (``ferry.common.jobnet``). Pure functions over the records; the
node service applies them (``ferry.node.bridge``).

A published host port belongs to one live job in the whole cluster, so the job can move to any node
and keep it. A job that runs (or is being checkpointed, restored or moved) on a node is reached
there; every other node routes its address to that node's ``net_ip``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ferry.common.jobnet import PortMap
from ferry.common.models import Job, JobState, Network, Node
from ferry.policy.decisions import NodeView

__all__ = ["NetState", "node_net_state", "published_conflict", "with_job_network"]

_PLACED = frozenset({JobState.RUNNING, JobState.CHECKPOINTING, JobState.RESTORING, JobState.MIGRATING,
                     JobState.PENDING})


def published_conflict(wanted: Sequence[PortMap], jobs: Iterable[Job], *, me: str | None = None) -> str | None:
    """Why ``wanted`` cannot be published (a live job other than ``me`` holds one of the ports), or None."""
    ports = {(m.proto, m.host) for m in wanted}
    for job in jobs:
        if job.id == me or job.terminal:
            continue
        for m in job.publish:
            if (m.proto, m.host) in ports:
                return (f"port {m.host}/{m.proto} is published by job {job.name} ({job.id}) already: "
                        "pick another --publish HOST port")
    return None


@dataclass(frozen=True)
class NetState:
    """One node's share: ``routes`` job address -> the node address it goes through (the other
    nodes' jobs); ``forwards`` (proto, host port) -> (job address, job port) for its own jobs."""

    routes: dict[str, str] = field(default_factory=dict)
    forwards: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)


def _where(job: Job) -> str | None:
    if job.network != Network.BRIDGE or not job.address or job.terminal or job.state not in _PLACED:
        return None
    return job.node


def node_net_state(me: str, jobs: Iterable[Job], nodes: Iterable[Node]) -> NetState:
    net_ip = {n.id: n.net_ip for n in nodes if n.net_ip}
    routes: dict[str, str] = {}
    forwards: dict[tuple[str, int], tuple[str, int]] = {}
    for job in jobs:
        node = _where(job)
        if node is None or job.address is None:
            continue
        if node == me:
            for m in job.publish:
                forwards[(m.proto, m.host)] = (job.address, m.job)
        elif node in net_ip:
            routes[job.address] = net_ip[node]
    return NetState(routes, forwards)


def with_job_network(views: Sequence[NodeView], nodes: Iterable[Node]) -> list[NodeView]:
    """``views`` for a bridge-network job: a node whose bridge is not up cannot take it."""
    by_id = {n.id: n for n in nodes}
    out = []
    for view in views:
        node = by_id.get(view.id)
        if view.usable and node is not None and not node.net_ip:
            view = dataclasses.replace(view, usable=False,
                                       reason=f"node {view.id} has no job network ({node.net_error or 'unknown'})")
        out.append(view)
    return out
