"""The omniscient bound of ``ferry simulate``: the cheapest schedule of the job on the given traces
that meets the deadline, knowing every zone's future, paying the same checkpoint and restore
times as the policies do (``ferry.policy.simulate``'s model).

Dynamic programming over ticks. At each tick boundary the job is either pending, with the progress
it saved, or on one node (a zone, or on-demand) with its progress; the omniscient schedule never
lets a zone take it away (leaving before costs a checkpoint, which is never worse than losing the
work since a periodic one: see below). In one tick it can:

- pending: wait (free), or start on an available node: a restore (``restore_s``) first unless
  nothing was saved yet, then work; or start, work and checkpoint before the tick ends;
- on a node (available this tick): work the whole tick; or work and checkpoint before the tick
  ends (it is then pending); or checkpoint at the tick's start and be pending; or checkpoint
  there, then restore and work on another available node (the move of the policies' model: the
  checkpoint billed on the old node, the rest of the tick on the new one).

A restore may take longer than a tick (a 60 s restore on traces of 32 s ticks): a job on a node
counts its progress from minus the restore time still to run, so it crosses into the next ticks as
work does. Leaving a node in the middle of a restore is never useful (not starting it is cheaper
and saves the same), so the search does not offer it.

The job finishes inside the tick where its progress reaches the work; billing stops then, and the
finish must come by the deadline. Costs are each node's price for the seconds held, as in the
policies' model, so no policy can cost less: a policy's periodic checkpoints and the work it loses
to preemptions are billed time the bound can spend waiting instead, at no cost.

Progress is counted on a grid of the largest step that divides the tick, the checkpoint and the
restore times (15 s for a 195 s tick, 30 s and 60 s). Where that grid would need more than
``MAX_BINS`` cells, the checkpoint and restore times are rounded down onto a coarser grid: the
result is then still a lower bound, no longer exact, and the report says so (``exact``). So it is
where a checkpoint is longer than a tick: the search lets it end inside its tick.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel

from ferry.policy.decisions import HOUR

MAX_BINS = 60_000
INF = math.inf


class Optimum(BaseModel):
    cost: float  # USD; inf when no schedule meets the deadline (never: on-demand always can)
    cost_ratio: float  # over the whole job on on-demand
    finished_at_hours: float | None
    exact: bool  # False: checkpoint and restore times were rounded down onto a coarser grid


def grid_step(gap: float, checkpoint_s: float, restore_s: float) -> float:
    """The largest step (seconds) that divides the tick, the checkpoint and the restore times (to a
    millisecond)."""
    values = [Fraction(v).limit_denominator(1000) for v in (gap, checkpoint_s, restore_s) if v > 0]
    step = values[0]
    for v in values[1:]:
        step = Fraction(math.gcd(step.numerator * v.denominator, v.numerator * step.denominator),
                        step.denominator * v.denominator)
    return float(step)


class _Search:
    """The dynamic programme's tables and steps (``optimum`` runs it). Tables are indexed by progress
    cells: ``pending`` from 0, ``on`` from ``-lead`` (a restore still running)."""

    def __init__(self, prices: list[float], job_s: float, deadline_s: float, gap: float, checkpoint_s: float,
                 restore_s: float) -> None:
        self.prices, self.nodes = prices, len(prices)
        self.job_s, self.deadline_s, self.gap = job_s, deadline_s, gap
        step, self.exact = grid_step(gap, checkpoint_s, restore_s), True
        if math.ceil(job_s / step) > MAX_BINS:  # a coarser grid that still divides the tick
            step, self.exact = gap / max(1, math.floor(gap / (job_s / MAX_BINS))), False
        self.step = step
        self.c_b, self.r_b = math.floor(checkpoint_s / step + 1e-9), math.floor(restore_s / step + 1e-9)
        self.g_b = round(gap / step)
        self.exact = self.exact and self.c_b <= self.g_b
        self.c_s, self.r_s = self.c_b * step, self.r_b * step  # on the grid (the given times when exact)
        self.bins = math.ceil(job_s / step - 1e-9)  # progress cells below the work: 0 .. bins-1
        self.lead = self.r_b  # cells below zero in `on`: a restore with that much still to run
        self.pending = np.full(self.bins, INF)  # pending, with what it saved
        self.pending[0] = 0.0
        self.on = np.full((self.nodes, self.lead + self.bins), INF)  # on a node, with its progress
        self.best: float = INF
        self.best_at: float | None = None

    def finish(self, costs: NDArray[np.float64], low: int, start: float, before: float, price: float,
               unbilled: float = 0.0) -> None:
        """Finishing from each cell (the first is progress ``low``), working after ``before`` seconds
        of overhead into the tick at ``start``, billed at ``price`` but for its first ``unbilled``
        seconds (billed already)."""
        x = (np.arange(len(costs)) + low) * self.step
        need = before + (self.job_s - x)  # seconds into the tick at which the work is done
        ok = (need <= self.gap + 1e-9) & (start + need <= self.deadline_s + 1e-6) & np.isfinite(costs)
        if ok.any():
            total = np.where(ok, costs + price * (need - unbilled) / HOUR, INF)
            i = int(np.argmin(total))
            if total[i] < self.best:
                self.best, self.best_at = float(total[i]), start + float(need[i])

    @staticmethod
    def put(into: NDArray[np.float64], into_low: int, costs: NDArray[np.float64], low: int, by: int) -> None:
        """into[progress + by] = min(into[progress + by], costs[progress]) for the progress values
        both tables hold (the first cell of ``into`` is progress ``into_low``, of ``costs`` ``low``)."""
        d = low + by - into_low
        i0, i1 = max(0, -d), min(len(costs), len(into) - d)
        if i1 > i0:
            np.minimum(into[i0 + d:i1 + d], costs[i0:i1], out=into[i0 + d:i1 + d])

    def tick(self, start: float, up: list[bool]) -> None:
        new_pending = self.pending.copy()  # waiting is free
        new_on = np.full_like(self.on, INF)
        checkpointed = np.full((self.nodes, self.bins), INF)  # on node n, then a checkpoint at the tick's start
        for n in range(self.nodes):
            if up[n]:  # a node that is gone this tick has nobody on it: they left before
                self._start_on(n, start, new_pending, new_on)
                self._stay_or_leave(n, start, new_pending, new_on, checkpointed)
        if self.c_b <= self.g_b and np.isfinite(checkpointed).any():
            self._move(start, up, checkpointed, new_on)
        self.pending, self.on = new_pending, new_on

    def _move(self, start: float, up: list[bool], checkpointed: NDArray[np.float64],
              new_on: NDArray[np.float64]) -> None:
        """Checkpoint on one node, then restore and work on another, starting in this tick: to each
        node m, the cheapest checkpointed cell of the other nodes (the best, or where the best is
        m's own, the second best)."""
        cells = np.arange(self.bins)
        first = checkpointed.argmin(axis=0)
        best = checkpointed[first, cells]
        rest = checkpointed.copy()
        rest[first, cells] = INF
        second = rest.min(axis=0)
        for m in range(self.nodes):
            if up[m]:
                src = np.where(first == m, second, best)
                self.finish(src, 0, start, self.c_s + self.r_s, self.prices[m], unbilled=self.c_s)
                self.put(new_on[m], -self.lead, src + self.prices[m] * (self.gap - self.c_s) / HOUR, 0,
                         self.g_b - self.c_b - self.r_b)

    def _start_on(self, n: int, start: float, new_pending: NDArray[np.float64], new_on: NDArray[np.float64]) -> None:
        """Pending -> node ``n``: a fresh start, or a restore of what was saved; then work, or work
        and checkpoint before the tick ends."""
        p = self.prices[n]
        fresh, saved = np.full(self.bins, INF), self.pending.copy()
        fresh[0], saved[0] = self.pending[0], INF
        for src, overhead, ob in ((fresh, 0.0, 0), (saved, self.r_s, self.r_b)):
            self.finish(src, 0, start, overhead, p)
            self.put(new_on[n], -self.lead, src + p * self.gap / HOUR, 0, self.g_b - ob)
            if self.g_b - ob - self.c_b >= 0:
                self.put(new_pending, 0, src + p * self.gap / HOUR, 0, self.g_b - ob - self.c_b)

    def _stay_or_leave(self, n: int, start: float, new_pending: NDArray[np.float64], new_on: NDArray[np.float64],
                       checkpointed: NDArray[np.float64]) -> None:
        here, p, low = self.on[n], self.prices[n], -self.lead
        if not np.isfinite(here).any():
            return
        self.finish(here, low, start, 0.0, p)
        self.put(new_on[n], low, here + p * self.gap / HOUR, low, self.g_b)  # the whole tick here
        if self.g_b >= self.c_b:  # work (the rest of a restore first), checkpoint, wait
            self.put(new_pending, 0, here + p * self.gap / HOUR, low, self.g_b - self.c_b)
        checkpointed[n] = here[self.lead:] + p * self.c_s / HOUR  # not in the middle of a restore
        np.minimum(new_pending, checkpointed[n], out=new_pending)  # checkpoint now, then wait


def optimum(available: Sequence[Sequence[bool]], *, job_s: float, deadline_s: float, gap: float,
            spot_price: float | Sequence[float | Sequence[float]], on_demand_price: float, checkpoint_s: float,
            restore_s: float) -> Optimum:
    """The cheapest schedule's cost. ``available[z][i]``: zone ``z`` has spot capacity in tick
    ``i`` of the job's time (tick 0 starts at its submission); ticks past a list's end have none.
    ``spot_price``: one for every zone, or one per zone (regions with their own prices), each a
    price or a price per tick (a history; its last price holds past its end)."""
    zones = len(available)
    given: list[float | Sequence[float]] = ([float(spot_price)] * zones if isinstance(spot_price, int | float)
                                            else list(spot_price))
    if len(given) != zones:
        raise ValueError(f"{len(given)} spot prices for {zones} zones")

    def at(p: float | Sequence[float], i: int) -> float:
        if isinstance(p, int | float):
            return float(p)
        return float(p[min(i, len(p) - 1)]) if len(p) else 0.0

    search = _Search([*(at(p, 0) for p in given), on_demand_price], job_s, deadline_s, gap, checkpoint_s, restore_s)
    for i in range(math.ceil(deadline_s / gap - 1e-9)):
        search.prices = [*(at(p, i) for p in given), on_demand_price]
        search.tick(i * gap, [i < len(a) and bool(a[i]) for a in available] + [True])
    full_od = job_s / HOUR * on_demand_price
    return Optimum(cost=round(search.best, 6), cost_ratio=round(search.best / full_od, 6) if full_od > 0 else 0.0,
                   finished_at_hours=None if search.best_at is None else round(search.best_at / HOUR, 6),
                   exact=search.exact)
