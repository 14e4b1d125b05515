"""Right-sizing (`ferry run --right-size`): a job's memory request follows what it uses, and the job
moves when it outgrows its node. Pure: the scheduler calls it at each review of a running job with
what the job's node sampled (``Node.usage``).

- Pressure: a job using ``PRESSURE`` or more of its request (or with none yet) gets a request of
  its peak use times ``HEADROOM``: room to grow before the next review.
- Waste: a job whose peak stays under ``WASTE`` of its request gets its peak times ``HEADROOM``
  (never under ``FLOOR``), so that smaller, cheaper nodes can take it (the rebalancer and the
  autoscaler act on the request).
- Where it goes: the new request fits on its node beside the others' requests: it stays. Else it
  moves to the node the scheduler's policy likes best among those where it fits; with none, it is
  marked outgrown (the autoscaler launches a node that fits, then the next review moves it there).
  A move is worth its cost here: the alternative is the kernel's OOM killer.
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ferry.common.units import format_bytes
from ferry.policy.decisions import JobView, NodeView, best_node

PRESSURE = 0.85
WASTE = 0.3
HEADROOM = 1.5
FLOOR = 64 << 20
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Resize:
    memory_bytes: int  # the new request
    move_to: str | None  # a node where it fits, when its own cannot hold it
    outgrown: bool  # no node can hold it now
    reason: str


def _mib(n: float) -> int:
    return max(FLOOR, int(-(-n // MIB)) * MIB)


def new_request(request: int, rss: int, peak: int) -> tuple[int, str] | None:
    """The request the use calls for, and why; None to keep it."""
    if request <= 0:
        new = _mib(peak * HEADROOM)
        return new, f"uses {format_bytes(rss)} with no memory request: asks for {format_bytes(new)}"
    if rss >= PRESSURE * request:
        new = _mib(max(peak, rss) * HEADROOM)
        return new, f"uses {format_bytes(rss)} of its {format_bytes(request)}: grows to {format_bytes(new)}"
    if peak < WASTE * request:
        new = _mib(peak * HEADROOM)
        if new < request:
            return new, (f"uses at most {format_bytes(peak)} of its {format_bytes(request)}: shrinks to "
                         f"{format_bytes(new)}")
    return None


def decide(job: JobView, rss: int, peak: int, current: NodeView, others: Sequence[NodeView], now: float,
           outgrown: bool = False) -> Resize | None:
    """What right-sizing does for `job` on `current` (its view counts the job's own request as
    used); `others`: the other nodes, as they are now; `outgrown`: it was marked so before (a node
    that fits may have come since)."""
    wanted = new_request(job.memory_bytes, rss, peak)
    memory, why = wanted if wanted is not None else (job.memory_bytes, "")
    room = current.free_memory_bytes + job.memory_bytes  # what its node has for it
    if memory <= room or not current.usable:
        if wanted is None and not outgrown:
            return None
        return Resize(memory, None, False, why or f"fits on {current.id} again")
    why = why or f"needs {format_bytes(memory)}"
    bigger = replace(job, memory_bytes=memory)
    best, _ = best_node(bigger, [n for n in others if n.usable and n.id != current.id], now)
    if best is not None:
        return Resize(memory, best.id, False, f"{why}; {current.id} has {format_bytes(room)}: moves to {best.id}")
    if wanted is None and outgrown:
        return None  # still nowhere to go: nothing new to say
    return Resize(memory, None, True, f"{why}; no node has that much free (the autoscaler may launch one)")
