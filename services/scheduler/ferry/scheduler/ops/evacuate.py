"""Evacuation: a job leaves a node that drains or has an interruption notice.

    a node can take it        a move (``ColdMove``, or live when the policy wants it: the shell's
                              ``begin_move``), marked with the node's state
    none can, even by parking lower-priority jobs elsewhere (``ferry.policy.preemption``)
                              a final checkpoint parks the job (``parked_by`` capacity) until
                              capacity comes back
    a ``--here`` job          a final checkpoint parks it for the user (``parked_by`` user): the
                              supervisor that ran it restores it, Ferry never moves it
"""

from ferry.common.models import Event, Job, Node, Op, OpKind
from ferry.common.opargs import CheckpointArgs, ColdMove
from ferry.scheduler.ops.step import Placement


def plan(job: Job, node: Node, placement: Placement, op_id: str) -> tuple[Op, Event]:
    """The op that takes `job` off `node`, and the event that says so."""
    if placement.node is None:
        # a --here job's supervisor restores it (`ferry restore --here`): parked for the user, not capacity
        op = Op(id=op_id, kind=OpKind.CHECKPOINT, job=job.id, args=CheckpointArgs(
            parked_by="user" if job.supervised_elsewhere else "capacity",
            reason=f"parked: {node.id} is {node.state} and {placement.why}"))
        what = "parking (no capacity)"
    else:
        op = Op(id=op_id, kind=OpKind.MIGRATE, job=job.id,
                args=ColdMove(target=placement.node, source=node.id, evacuate=node.state.value))
        what = f"moving to {placement.node}"
    return op, Event(kind="evacuating", job=job.id, node=node.id, message=f"{node.id} is {node.state}: {what}")
