"""Whether a node can take work now (the scoring itself is in ferry.policy.decisions)."""

from ferry.common.models import Node, NodeState

LATE_HEARTBEAT = "has not sent a heartbeat"  # in a reason: the node may only be late (busy, reconnecting)


def usable(node: Node, now: float, heartbeat_timeout_s: float) -> str | None:
    """Why `node` cannot take a job now, or None when it can."""
    if node.state != NodeState.READY:
        return f"node {node.id} is {node.state}"
    if now - node.heartbeat > heartbeat_timeout_s:
        return f"node {node.id} {LATE_HEARTBEAT} for {now - node.heartbeat:.0f}s"
    if not node.criu_ok:
        return f"node {node.id} has no usable CRIU ({node.criu_error or 'unknown reason'})"
    return None
