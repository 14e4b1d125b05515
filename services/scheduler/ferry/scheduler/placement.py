"""Where a job goes: a pure function of the cluster's nodes, the jobs on them and the time."""

from collections.abc import Iterable, Sequence

from ferry.common.models import Job, Node, NodeState


def usable(node: Node, now: float, heartbeat_timeout_s: float) -> str | None:
    """Why `node` cannot take a job now, or None when it can."""
    if node.state != NodeState.READY:
        return f"node {node.id} is {node.state}"
    if now - node.heartbeat > heartbeat_timeout_s:
        return f"node {node.id} has not sent a heartbeat for {now - node.heartbeat:.0f}s"
    if not node.criu_ok:
        return f"node {node.id} has no usable CRIU ({node.criu_error or 'unknown reason'})"
    return None


def choose_node(
    nodes: Sequence[Node],
    jobs: Iterable[Job],
    now: float,
    heartbeat_timeout_s: float,
    *,
    exclude: str | None = None,
) -> tuple[Node | None, str]:
    """The least loaded usable node (ties by id), or None with the reason nothing fits."""
    load: dict[str, int] = {}
    for job in jobs:
        if job.node and not job.terminal:
            load[job.node] = load.get(job.node, 0) + 1
    reasons = []
    candidates = []
    for node in nodes:
        if node.id == exclude:
            continue
        why = usable(node, now, heartbeat_timeout_s)
        if why:
            reasons.append(why)
        else:
            candidates.append(node)
    if not candidates:
        return None, "; ".join(reasons) or "no nodes have joined the cluster"
    best = min(candidates, key=lambda n: (load.get(n.id, 0), n.id))
    return best, ""
