"""`ferry simulate`: replay spot availability traces against Ferry's policy and two baselines.

Traces are the Can't Be Late format, ``{"metadata": {"gap_seconds": N}, "data": [0 or 1, ...]}``:
one value per tick, 1 = no spot capacity in that zone during the tick, 0 = spot runs. Each trace is
one zone; on-demand capacity is always there. Every trace of one simulation must share its tick.
Ticks past the end of a trace count as unavailable (no spot), so a deadline that reaches past the
traces is still simulated, on on-demand.

The model (all times in seconds, prices in USD per hour, billing per second of holding a node):

- The job needs ``job_hours`` of work by ``deadline_hours`` after it is submitted (at ``start_tick``).
- Running on spot in an available zone, or on on-demand, makes progress at rate 1.
- Spot capacity changes only at tick boundaries. When a zone turns unavailable while the job runs
  there, the job is preempted: the progress since its last checkpoint is thrown away.
- Ferry checkpoints every ``checkpoint_every_s`` of work while on spot; each checkpoint pauses the
  job for ``checkpoint_s``. (On on-demand, which is never preempted here, it checkpoints only to
  move.) Resuming from a checkpoint costs ``restore_s``; a planned move costs a checkpoint on the
  old node and a restore on the new one.
- Uniform Progress has no checkpoints: a preemption sends it back to zero. It runs on spot whenever
  a zone has capacity (the first one in the order given), waits otherwise, and switches to
  on-demand for good once the time left, less one tick of margin, would no longer cover a full
  restart plus the switch; the planned switch keeps its progress (one checkpoint and restore, the
  changeover of the Can't Be Late paper).
- On-demand only runs straight through on on-demand.

Prices: one spot price for every zone (``spot_price``), or each zone its own: a price per zone,
or a price history (``zone_prices``: per zone, one price per tick from the traces' first tick,
the last one holding after; built by ``price_series`` from EC2's spot price histories). Zones of
several regions with their own prices are then one simulation: the policies see each zone's price
at the time, the optimum knows them all ahead.

Ferry's policy is the scheduler's own (``ferry.policy.decisions``): it waits for spot while its
slack is above its reserve, sits out outages on on-demand below it, and is sent to on-demand for
good only when the deadline is critical.

Reported per policy: cost, cost over the cost of the whole job on on-demand, deadline met, moves
(node changes after the first placement; a zone counts as one node) and lost hours (progress thrown
away by preemptions plus time spent checkpointing for a move and restoring). Next to them, the
omniscient bound (``ferry.policy.optimum``: the cheapest schedule that meets the deadline knowing
every zone's future, with the same checkpoint and restore times) and each policy's gap to it
(its cost over the bound's, less one).
"""

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ferry.common.errors import UsageError
from ferry.common.pricefeeds import PricePoint
from ferry.policy import decisions as policy
from ferry.policy.decisions import JobView, NodeView
from ferry.policy.optimum import Optimum, optimum

ON_DEMAND = "on-demand"
_EPS = 1e-9


# ---------------------------------------------------------------- traces


@dataclass(frozen=True)
class Trace:
    """One zone's spot availability, with running counts of what an observer has seen so far."""

    name: str
    gap_seconds: float
    data: tuple[int, ...]  # 1 = no spot capacity in that tick
    # preemptions[t]: 0->1 transitions at ticks <= t; up_ticks[t]: available ticks before t
    preemptions: tuple[int, ...] = field(repr=False, default=())
    up_ticks: tuple[int, ...] = field(repr=False, default=())

    @classmethod
    def from_data(cls, name: str, gap_seconds: float, data: Sequence[int]) -> "Trace":
        pre, up = [], []
        count, ticks, last = 0, 0, 1
        for value in data:
            up.append(ticks)
            count += int(value == 1 and last == 0)
            pre.append(count)
            ticks += int(value == 0)
            last = value
        return cls(name, float(gap_seconds), tuple(data), tuple(pre), tuple(up))

    def available(self, tick: int) -> bool:
        return 0 <= tick < len(self.data) and self.data[tick] == 0


def _field_error(path: str, what: str) -> UsageError:
    return UsageError(f"{path}: {what}")


def parse_trace(text: str, path: str) -> Trace:
    """A trace from the text of file `path`; a UsageError names the file and the bad field."""
    try:
        doc: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _field_error(path, f"line {exc.lineno}: invalid JSON ({exc.msg})") from None
    if not isinstance(doc, dict):
        raise _field_error(path, f"expected a JSON object with metadata and data, got {type(doc).__name__}")
    meta = doc.get("metadata")
    if meta is None:
        raise _field_error(path, "metadata missing")
    if not isinstance(meta, dict):
        raise _field_error(path, "metadata is not an object")
    gap = meta.get("gap_seconds")
    if gap is None:
        raise _field_error(path, "metadata.gap_seconds missing")
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not math.isfinite(gap) or gap <= 0:
        raise _field_error(path, f"metadata.gap_seconds is {gap!r}, expected a number of seconds > 0")
    data = doc.get("data")
    if data is None:
        raise _field_error(path, "data missing")
    if not isinstance(data, list):
        raise _field_error(path, "data is not a list")
    if not data:
        raise _field_error(path, "data is empty")
    for i, value in enumerate(data):
        if isinstance(value, bool) or value not in (0, 1):
            raise _field_error(path, f"data[{i}] is {json.dumps(value)}, expected 0 or 1")
    return Trace.from_data(Path(path).stem, gap, [int(v) for v in data])


def load_trace(path: str | Path) -> Trace:
    """Reads and validates one trace file (the only IO in this module)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the trace ({exc})") from None
    return parse_trace(text, str(path))


# ---------------------------------------------------------------- results


class PolicyResult(BaseModel):
    cost: float  # USD
    cost_ratio: float  # cost over the cost of the whole job on on-demand
    deadline_met: bool
    moves: int
    lost_hours: float
    finished_at_hours: float | None  # None: did not finish within the simulated horizon


class SimulationReport(BaseModel):
    traces: list[str]
    gap_seconds: float
    start_hour: float
    job_hours: float
    deadline_hours: float
    on_demand_price: float
    spot_price: float
    policies: dict[str, PolicyResult]
    optimal: Optimum | None = None
    gap_to_optimal: dict[str, float] = {}  # policy -> its cost over the optimum's, less one
    zone_prices: dict[str, float] = {}  # per zone: its mean spot price (USD/h) from the start to the deadline

    def saving_vs(self, baseline: str, policy_name: str = "ferry") -> float:
        """The fraction of `baseline`'s cost that `policy_name` saves (negative: it costs more)."""
        base = self.policies[baseline].cost
        return (base - self.policies[policy_name].cost) / base if base > 0 else 0.0


@dataclass(frozen=True)
class Model:
    job_s: float
    deadline_s: float
    gap: float
    on_demand_price: float
    spot_price: float
    checkpoint_every_s: float
    checkpoint_s: float
    restore_s: float
    zones: tuple[str, ...] = ()  # one distinct node id per trace
    zone_prices: tuple[tuple[float, ...], ...] = ()  # per zone: its spot price per tick (empty: spot_price)

    def spot_at(self, zone: int, tick: int) -> float:
        """Zone `zone`'s spot price in trace tick `tick`."""
        series = self.zone_prices[zone] if zone < len(self.zone_prices) else ()
        if not series:
            return self.spot_price
        return series[min(max(tick, 0), len(series) - 1)]

    @property
    def move_s(self) -> float:
        return self.checkpoint_s + self.restore_s

    @property
    def max_ticks(self) -> int:
        return math.ceil((2 * self.deadline_s + 2 * self.job_s) / self.gap) + 10


# ---------------------------------------------------------------- the job's clock and bill


@dataclass
class _Run:
    """A job's progress, checkpoints and bill under one policy. node: None (pending), a zone index,
    or -1 for on-demand."""

    model: Model
    periodic: bool  # checkpoint every checkpoint_every_s of work while on spot
    progress: float = 0.0
    saved: float = 0.0  # progress at the last completed checkpoint
    ckpt_left: float = 0.0  # seconds left of a checkpoint in flight
    src_busy: float = 0.0  # seconds left of the checkpoint for a move, on the old node
    src_price: float = 0.0
    busy: float = 0.0  # seconds left of a restore on the current node
    node: int | None = None
    last_node: int | None = None
    cost: float = 0.0
    lost: float = 0.0
    moves: int = 0
    last_move_at: float | None = None
    finished_at: float | None = None
    tick: int = 0  # the trace tick the policy's loop is in (zones' prices change with it)

    def price(self, node: int | None) -> float:
        if node is None:
            return 0.0
        return self.model.on_demand_price if node == -1 else self.model.spot_at(node, self.tick)

    def place(self, node: int, now: float) -> None:
        """Starts, resumes or moves the job onto `node`."""
        if self.node is not None:  # a planned move: checkpoint here first
            self.src_busy = self.ckpt_left if self.ckpt_left > 0 else (
                self.model.checkpoint_s if self.progress > self.saved else 0.0)
            self.src_price = self.price(self.node)
            self.ckpt_left = 0.0
            self.saved = self.progress
            self.lost += self.src_busy
        self.busy = self.model.restore_s if self.saved > 0 else 0.0
        self.lost += self.busy
        if self.last_node is not None and node != self.last_node:
            self.moves += 1
            self.last_move_at = now
        self.node = self.last_node = node

    def preempt(self) -> None:
        self.lost += self.progress - self.saved
        self.progress = self.saved
        self.node = None
        self.ckpt_left = self.busy = 0.0

    def advance(self, now: float) -> None:
        """One tick on the current node (or pending)."""
        if self.node is None or self.finished_at is not None:
            return
        m = self.model
        price = self.price(self.node)
        periodic = self.periodic and self.node >= 0
        t = 0.0
        if self.src_busy > 0:  # the checkpoint of a move, still billed on the old node
            t = min(self.src_busy, m.gap)
            self.src_busy -= t
            self.cost += self.src_price * t / policy.HOUR
        on_src = t
        while t < m.gap - _EPS and self.progress < m.job_s - _EPS:
            if self.busy > 0 or self.ckpt_left > 0:
                pause = self.busy if self.busy > 0 else self.ckpt_left
                d = min(pause, m.gap - t)
                if self.busy > 0:
                    self.busy -= d
                else:
                    self.ckpt_left -= d
                    if self.ckpt_left <= _EPS:
                        self.ckpt_left, self.saved = 0.0, self.progress
                t += d
                continue
            d = min(m.gap - t, m.job_s - self.progress)
            if periodic:
                d = max(0.0, min(d, self.saved + m.checkpoint_every_s - self.progress))
            self.progress += d
            t += d
            due = self.progress >= self.saved + m.checkpoint_every_s - _EPS
            if periodic and due and self.progress < m.job_s - _EPS:
                if m.checkpoint_s > 0:
                    self.ckpt_left = m.checkpoint_s
                else:
                    self.saved = self.progress
        self.cost += price * (t - on_src) / policy.HOUR
        if self.progress >= m.job_s - _EPS:
            self.finished_at = now + t

    def result(self, model: Model) -> PolicyResult:
        full = model.job_s / policy.HOUR * model.on_demand_price
        done = self.finished_at
        return PolicyResult(
            cost=round(self.cost, 6), cost_ratio=round(self.cost / full, 6),
            deadline_met=done is not None and done <= model.deadline_s + 1e-6,
            moves=self.moves, lost_hours=round(self.lost / policy.HOUR, 6),
            finished_at_hours=None if done is None else round(done / policy.HOUR, 6))


# ---------------------------------------------------------------- policies


def _on_demand(model: Model) -> PolicyResult:
    run = _Run(model, periodic=False)
    run.place(-1, 0.0)
    for i in range(model.max_ticks):
        run.advance(i * model.gap)
        if run.finished_at is not None:
            break
    return run.result(model)


def _uniform_progress(traces: Sequence[Trace], model: Model, start: int) -> PolicyResult:
    run = _Run(model, periodic=False)
    switched = False
    for i in range(model.max_ticks):
        now, tick = i * model.gap, start + i
        run.tick = tick
        if run.node is not None and run.node >= 0 and not traces[run.node].available(tick):
            run.preempt()
        if not switched and model.deadline_s - now - model.gap < model.job_s + model.move_s:
            switched = True
            run.place(-1, now)
        elif run.node is None and not switched:
            up = [z for z, tr in enumerate(traces) if tr.available(tick)]
            zone = min(up, key=lambda z: model.spot_at(z, tick)) if up else None  # the cheapest, first on ties
            if zone is not None:
                run.progress = run.saved = 0.0
                run.place(zone, now)
        run.advance(now)
        if run.finished_at is not None:
            break
    return run.result(model)


def _node_views(traces: Sequence[Trace], model: Model, tick: int) -> list[NodeView]:
    views = [NodeView(id=ON_DEMAND, spot=False, price_per_hour=model.on_demand_price, zone=ON_DEMAND,
                      gpus=1, free_gpus=1)]
    for z, (zone, tr) in enumerate(zip(model.zones, traces, strict=True)):
        seen = min(tick, len(tr.data) - 1)  # what an observer has seen of the zone so far
        usable = tr.available(tick)
        views.append(NodeView(id=zone, spot=True, price_per_hour=model.spot_at(z, tick), zone=zone, gpus=1, free_gpus=1,
                              preemptions=tr.preemptions[seen], uptime_s=tr.up_ticks[seen] * model.gap,
                              usable=usable, reason="" if usable else "no spot capacity"))
    return views


def _zone_ids(traces: Sequence[Trace]) -> tuple[str, ...]:
    """The traces' names, made distinct (the same file twice is two zones) and never `on-demand`."""
    seen: set[str] = {ON_DEMAND}
    ids = []
    for tr in traces:
        name, n = tr.name, 1
        while name in seen:
            n += 1
            name = f"{tr.name}#{n}"
        seen.add(name)
        ids.append(name)
    return tuple(ids)


def _job_view(run: _Run, model: Model, node_id: str | None) -> JobView:
    unsaved = run.progress - run.saved if run.node is not None and run.node >= 0 else 0.0
    return JobView(id="job", gpus=1, deadline_at=model.deadline_s, remaining_s=model.job_s - run.progress,
                   unsaved_s=unsaved, node=node_id, move_cost_s=model.move_s,
                   checkpoint_every_s=model.checkpoint_every_s)


def _ferry_decide(run: _Run, traces: Sequence[Trace], model: Model, tick: int, now: float) -> None:
    """Places a pending job, or rebalances a running one, with the scheduler's own policy."""
    views = _node_views(traces, model, tick)
    index = {v.id: i - 1 for i, v in enumerate(views)}  # on-demand (first) is -1, zones 0..
    current = None if run.node is None else views[0 if run.node == -1 else run.node + 1]
    job = _job_view(run, model, current.id if current else None)
    best = policy.choose_node(job, views, now, model.gap)
    if current is None:
        if best is not None:
            run.place(index[best.id], now)
        return
    if best is None or best.id == current.id:
        return
    decision = policy.should_move(job, current, best, now, job.remaining_s or 0.0, run.last_move_at,
                                  horizon_s=model.gap)
    if decision.move:
        run.place(index[best.id], now)


def _ferry(traces: Sequence[Trace], model: Model, start: int) -> PolicyResult:
    run = _Run(model, periodic=True)
    before = [tr.available(start - 1) for tr in traces]
    for i in range(model.max_ticks):
        now, tick = i * model.gap, start + i
        run.tick = tick
        avail = [tr.available(tick) for tr in traces]
        if run.node is not None and run.node >= 0 and not avail[run.node]:
            run.preempt()
        event = avail != before
        before = avail
        # pending: it waits for spot, or takes on-demand once its slack is down to the reserve
        on_spot = run.node is not None and run.node >= 0
        if run.node is None or event or (on_spot and policy.deadline_critical(_job_view(run, model, ""), now,
                                                                              model.gap)):
            _ferry_decide(run, traces, model, tick, now)
        run.advance(now)
        if run.finished_at is not None:
            break
    return run.result(model)


def simulate(traces: Sequence[Trace], job_hours: float, deadline_hours: float, *, on_demand_price: float = 3.06,
             spot_price: float = 0.92, checkpoint_every_s: float = 600.0, checkpoint_s: float = 30.0,
             restore_s: float = 60.0, start_tick: int = 0, optimal: bool = True,
             zone_prices: Sequence[Sequence[float]] = ()) -> SimulationReport:
    """Runs the job under Ferry's policy, on-demand only and Uniform Progress over `traces` (one zone
    each), from tick `start_tick` of the traces, and (``optimal``) finds the omniscient bound. Ticks
    past a trace's end count as no spot capacity."""
    if not traces:
        raise UsageError("give at least one trace")
    gaps = {tr.gap_seconds for tr in traces}
    if len(gaps) > 1:
        raise UsageError(f"the traces have different ticks ({', '.join(f'{g:g}s' for g in sorted(gaps))}): "
                         "simulate zones with the same gap_seconds together")
    if job_hours <= 0 or deadline_hours < job_hours:
        raise UsageError(f"need 0 < job hours <= deadline hours, got {job_hours:g} and {deadline_hours:g}")
    if checkpoint_every_s <= 0 or checkpoint_s < 0 or restore_s < 0 or on_demand_price < 0 or spot_price < 0:
        raise UsageError("checkpoint interval must be > 0; times and prices must not be negative")
    if not 0 <= start_tick < max(len(tr.data) for tr in traces):
        raise UsageError(f"start tick {start_tick} is outside the traces")
    if zone_prices and len(zone_prices) != len(traces):
        raise UsageError(f"{len(zone_prices)} zone price series for {len(traces)} traces")
    if any(p < 0 or not math.isfinite(p) for series in zone_prices for p in series):
        raise UsageError("zone prices must be numbers >= 0")
    model = Model(job_hours * policy.HOUR, deadline_hours * policy.HOUR, gaps.pop(), on_demand_price, spot_price,
                  checkpoint_every_s, checkpoint_s, restore_s, _zone_ids(traces),
                  tuple(tuple(float(p) for p in series) for series in zone_prices))
    results = {"ferry": _ferry(traces, model, start_tick), "on_demand": _on_demand(model),
               "uniform_progress": _uniform_progress(traces, model, start_tick)}
    best = None
    gaps_to: dict[str, float] = {}
    window = max(1, math.ceil(model.deadline_s / model.gap))
    if optimal:
        ticks = math.ceil(model.deadline_s / model.gap) + 1
        prices = [[model.spot_at(z, start_tick + i) for i in range(ticks)] for z in range(len(traces))]
        best = optimum([[tr.available(start_tick + i) for i in range(ticks)] for tr in traces], job_s=model.job_s,
                       deadline_s=model.deadline_s, gap=model.gap, spot_price=prices,
                       on_demand_price=on_demand_price, checkpoint_s=checkpoint_s, restore_s=restore_s)
        gaps_to = {name: round(r.cost / best.cost - 1, 6) if best.cost > 0 else 0.0 for name, r in results.items()}
    return SimulationReport(traces=list(model.zones), gap_seconds=model.gap,
                            start_hour=start_tick * model.gap / policy.HOUR, job_hours=job_hours,
                            deadline_hours=deadline_hours, on_demand_price=on_demand_price, spot_price=spot_price,
                            policies=results, optimal=best, gap_to_optimal=gaps_to,
                            zone_prices={z: round(sum(model.spot_at(i, start_tick + t) for t in range(window))
                                                  / window, 6) for i, z in enumerate(model.zones)})


def price_series(traces: Sequence[Trace], points: Sequence[PricePoint], start_epoch: float,
                 default: float) -> list[list[float]]:
    """Per trace, its zone's spot price in each of its ticks, from spot price history points
    (``ferry.common.pricefeeds``: EC2's ``describe-spot-price-history``), the traces' first tick
    being at ``start_epoch``: in each tick the last price set at or before its start (before the
    first one, the first). A trace's zone is its name up to the first ``_`` (``us-east-1a_v100_1``);
    a zone without points keeps ``default`` (an empty series)."""
    by_zone: dict[str, list[PricePoint]] = {}
    for p in points:
        if p.market == "spot":
            by_zone.setdefault(p.zone, []).append(p)
    out: list[list[float]] = []
    for tr in traces:
        mine = sorted(by_zone.get(zone_of(tr.name), []), key=lambda p: p.timestamp)
        kinds = {p.instance_type for p in mine}
        if len(kinds) > 1:
            raise UsageError(f"the price history of {zone_of(tr.name)} has several instance types "
                             f"({', '.join(sorted(kinds))}): give one type's history")
        if not mine:
            out.append([])
            continue
        series, j = [], 0
        for tick in range(len(tr.data)):
            at = start_epoch + tick * tr.gap_seconds
            while j + 1 < len(mine) and mine[j + 1].timestamp <= at:
                j += 1
            series.append(mine[j].price_per_hour)
        out.append(series)
    return out


def zone_of(trace_name: str) -> str:
    return trace_name.split("_", 1)[0]
