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
  A move is worth its cost here, the alternative being the kernel's OOM killer, unless the job will
  end sooner than the move takes (its measured ``move_cost_s``) and still fits its node now: then it
  stays and finishes where it is.
- GPU memory (``decide_gpu``): a job holding ``GPU_PRESSURE`` or more of its GPU's memory gets a
  per-GPU memory request of its peak times ``HEADROOM``; past what its GPUs have, it moves to a node
  whose GPUs have that much (the scheduler's GPU placement finds them), under the same rule of cost.
  One whose GPU peak stays under ``WASTE`` of its request gets it lowered, so smaller GPUs may take it.
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ferry.common.units import format_bytes
from ferry.policy.decisions import JobView, NodeView, best_node

PRESSURE = 0.85
GPU_PRESSURE = 0.9
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
    if not_worth_moving(job, rss, room):
        return Resize(memory, None, False, f"{why}; it ends in about {job.remaining_s:.0f}s, sooner than a move "
                                           f"takes ({job.move_cost_s:.0f}s): it finishes on {current.id}")
    bigger = replace(job, memory_bytes=memory)
    best, _ = best_node(bigger, [n for n in others if n.usable and n.id != current.id], now)
    if best is not None:
        return Resize(memory, best.id, False, f"{why}; {current.id} has {format_bytes(room)}: moves to {best.id}")
    if wanted is None and outgrown:
        return None  # still nowhere to go: nothing new to say
    return Resize(memory, None, True, f"{why}; no node has that much free (the autoscaler may launch one)")


def not_worth_moving(job: JobView, used: int, room: int) -> bool:
    """The job ends before a move would be over, and what it uses still fits where it is."""
    return job.remaining_s is not None and job.remaining_s < job.move_cost_s and used < room


def new_gpu_request(request: int, used: int, peak: int, capacity: int) -> tuple[int, str] | None:
    """The per-GPU memory request a job's use of its busiest GPU calls for (`capacity`: that GPU's
    memory), and why; None to keep it."""
    if capacity <= 0 or peak <= 0:
        return None
    if peak >= GPU_PRESSURE * capacity:
        new = _mib(peak * HEADROOM)
        if new > request:
            return new, (f"holds {format_bytes(peak)} of its GPU's {format_bytes(capacity)}: needs GPUs with "
                         f"{format_bytes(new)}")
    if request > 0 and peak < WASTE * request:
        new = _mib(peak * HEADROOM)
        if new < request:
            return new, (f"holds at most {format_bytes(peak)} of GPU memory of its {format_bytes(request)}: "
                         f"asks for {format_bytes(new)}")
    return None


def decide_gpu(job: JobView, gpu_request: int, used: int, peak: int, capacity: int, current: str,
               fitting: Sequence[NodeView], now: float) -> Resize | None:
    """GPU right-sizing of `job` on node `current` whose GPUs have `capacity` bytes each;
    `fitting`: the other nodes whose free GPUs would hold the new request (the scheduler's GPU
    placement). The Resize's memory_bytes is the new per-GPU request."""
    wanted = new_gpu_request(gpu_request, used, peak, capacity)
    if wanted is None:
        return None
    request, why = wanted
    if request <= capacity:
        return Resize(request, None, False, why)
    if not_worth_moving(job, used, capacity):
        return Resize(request, None, False, f"{why}; it ends in about {job.remaining_s:.0f}s, sooner than a move "
                                            f"takes ({job.move_cost_s:.0f}s): it finishes on {current}")
    best, _ = best_node(job, [n for n in fitting if n.usable and n.id != current], now)
    if best is not None:
        return Resize(request, best.id, False, f"{why}: moves to {best.id}")
    return Resize(request, None, True, f"{why}; no node has such GPUs free (the autoscaler may launch one)")
