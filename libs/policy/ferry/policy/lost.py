"""What a move cost the job: the seconds of progress it lost against the same job unmoved.

A move's *window* runs from the job's last moment of full-speed progress before it (the first dump
of the move began: a live move's first pre-copy round, a cold move's final dump) to the moment it
runs at full speed again (a post-copy target once all its memory is there; any other restore once
it runs). Unmoved, the job would have used ``cores * window`` CPU seconds in that window, ``cores``
being what it used in the seconds before the first dump (its node's sample). What it did use there
(its source between the first dump and the final freeze, its target until the memory was all
there) is progress made; the rest is lost:

    lost = window - used / cores

That counts what a freeze costs, what an upload that takes CPU from the job costs, and what a
target that runs slowly while its memory arrives costs, each as the job felt it. For a job that
used under ``MIN_CORES`` (a server waiting for requests, a job that sleeps), CPU says nothing of
its progress: its figure is then the time it could not run at all (its freezes and the switch from
the frozen source to the running target), with basis ``"pause"``. A cold move makes no progress
inside its window, so its figure is the whole window, whatever the job's cores.
"""

from dataclasses import dataclass
from typing import Literal

MIN_CORES = 0.05


@dataclass(frozen=True)
class Lost:
    seconds: float
    basis: Literal["cpu", "pause"]
    window_s: float | None = None  # basis "cpu": what it was computed from
    cores: float | None = None

    def fields(self) -> dict[str, float | str | None]:
        """As a move's JSON carries it."""
        return {"lost_s": round(self.seconds, 3), "lost_basis": self.basis,
                "lost_window_s": None if self.window_s is None else round(self.window_s, 3), "lost_cores": self.cores}


def fields(cost: Lost | None) -> dict[str, float | str | None]:
    """A move's figure as its JSON carries it: every key, None where it was not measured."""
    return cost.fields() if cost is not None else dict.fromkeys(("lost_s", "lost_basis", "lost_window_s", "lost_cores"))


def lost(window_s: float, used_cpu_s: float | None, cores: float | None, paused_s: float) -> Lost:
    """The progress a move cost (see the module): ``window_s`` from the first dump to full speed
    again, ``used_cpu_s`` the CPU seconds the job used in it (None: not known), ``cores`` its rate
    before the move (None: not known), ``paused_s`` the time in it the job could not run at all."""
    window_s = max(0.0, window_s)
    if cores is None or cores < MIN_CORES or used_cpu_s is None:
        return Lost(max(0.0, paused_s), "pause")
    return Lost(min(window_s, max(0.0, window_s - max(0.0, used_cpu_s) / cores)), "cpu", window_s, cores)


def cold_lost(dumped_at: float | None, running_at: float) -> Lost | None:
    """A cold move (or a pre-copy move's end): no progress from its final dump to its restore."""
    if dumped_at is None:
        return None
    return Lost(max(0.0, running_at - dumped_at), "pause")
