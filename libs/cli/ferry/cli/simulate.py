"""`ferry simulate`: replay spot availability traces against Ferry's placement policy.

It needs no cluster: it reads the trace files, runs the scheduler's own policy over them next to
two baselines (on-demand only, and Uniform Progress from the Can't Be Late paper) and prints
cost relative to on-demand, whether the deadline was met, moves and lost hours.
"""

import argparse
import math
from typing import TYPE_CHECKING, Any

from ferry.cli.output import print_json, table
from ferry.common.errors import UsageError
from ferry.common.units import parse_duration

if TYPE_CHECKING:  # the simulator loads only for `ferry simulate`, keeping every other command quick
    from ferry.policy.simulate import SimulationReport, Trace

EPILOG = """examples:
  ferry simulate --trace us-east-1a.json --job-hours 48 --deadline-hours 70
  ferry simulate --trace a.json --trace b.json --job-hours 24 --deadline-hours 36 --start-hour 12 -o json
  ferry simulate --trace us-east-1a_v100_1.json --trace us-west-2a_v100_1.json --job-hours 48 \
      --deadline-hours 70 --zone-price us-east-1a=0.92 --zone-price us-west-2a=0.71
  ferry simulate --trace ... --spot-history us-east-1.json --spot-history us-west-2.json \
      --trace-start 2023-02-15T00:00:00Z
"""


def add_simulate_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]",
                        common: argparse.ArgumentParser) -> None:
    """Adds `ferry simulate` to the CLI's subcommands (`common` adds -o/--output and --addr)."""
    help_ = ("replay spot availability traces: Ferry's policy against on-demand, Uniform Progress and the "
             "omniscient optimum (the cheapest schedule that knows the future)")
    p = sub.add_parser("simulate", help=help_, description=help_, parents=[common], epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", action="append", required=True, metavar="FILE",
                   help='availability trace, {"metadata": {"gap_seconds": N}, "data": [0|1, ...]} '
                        "(1 = no spot); repeat for more zones")
    p.add_argument("--job-hours", type=float, required=True, help="hours of work the job needs")
    p.add_argument("--deadline-hours", type=float, required=True, help="hours from the start to the deadline")
    p.add_argument("--on-demand-price", type=float, default=3.06, help="USD per hour on on-demand (default 3.06)")
    p.add_argument("--spot-price", type=float, default=0.92, help="USD per hour on spot (default 0.92)")
    p.add_argument("--checkpoint-every", default="10m", metavar="DURATION",
                   help="Ferry's checkpoint interval while on spot (default 10m)")
    p.add_argument("--checkpoint-time", default="30s", metavar="DURATION",
                   help="how long one checkpoint pauses the job (default 30s)")
    p.add_argument("--restore-time", default="60s", metavar="DURATION",
                   help="how long a restore takes (default 60s)")
    p.add_argument("--start-hour", type=float, default=0.0, help="start this many hours into the traces (default 0)")
    p.add_argument("--zone-price", action="append", default=[], metavar="ZONE=PRICE",
                   help="a zone's own spot price in USD per hour (zones of several regions); ZONE is the trace's "
                        "name up to its first '_' (us-east-1a for us-east-1a_v100_1.json); repeat per zone")
    p.add_argument("--spot-history", action="append", default=[], metavar="FILE",
                   help="spot price history, the JSON of `aws ec2 describe-spot-price-history`: each zone's price "
                        "changes as it did (needs --trace-start); repeat for more regions")
    p.add_argument("--trace-start", metavar="TIME",
                   help="when the traces' first tick began (ISO 8601, e.g. 2023-02-15T00:00:00Z), to line the "
                        "price histories up with them")


def _positive(name: str, value: float, *, zero_ok: bool = False) -> float:
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise UsageError(f"{name} must be a number {'>= 0' if zero_ok else '> 0'}, got {value:g}")
    return value


def run_simulation(args: argparse.Namespace) -> "SimulationReport":
    from ferry.policy.simulate import load_trace, simulate

    """Checks the arguments, loads the traces and simulates."""
    job = _positive("--job-hours", args.job_hours)
    deadline = _positive("--deadline-hours", args.deadline_hours)
    if deadline < job:
        raise UsageError(f"--deadline-hours {deadline:g} is shorter than --job-hours {job:g}: no policy can make it")
    od = _positive("--on-demand-price", args.on_demand_price)
    spot = _positive("--spot-price", args.spot_price, zero_ok=True)
    start = _positive("--start-hour", args.start_hour, zero_ok=True)
    every = parse_duration(args.checkpoint_every)
    if every <= 0:
        raise UsageError("--checkpoint-every must be longer than 0s")
    traces = [load_trace(path) for path in args.trace]
    gaps = sorted({tr.gap_seconds for tr in traces})
    if len(gaps) > 1:
        raise UsageError(f"the traces have different ticks ({', '.join(f'{g:g}s' for g in gaps)}): "
                         "give traces recorded with the same gap_seconds")
    start_tick = round(start * 3600 / gaps[0])
    longest = max(len(tr.data) for tr in traces)
    if start_tick >= longest:
        raise UsageError(f"--start-hour {start:g} is past the end of the traces "
                         f"({longest * gaps[0] / 3600:g} hours long)")
    return simulate(traces, job, deadline, on_demand_price=od, spot_price=spot, checkpoint_every_s=every,
                    checkpoint_s=parse_duration(args.checkpoint_time), restore_s=parse_duration(args.restore_time),
                    start_tick=start_tick, zone_prices=zone_prices(args, traces, spot))


def zone_prices(args: argparse.Namespace, traces: "list[Trace]", spot: float) -> list[list[float]]:
    """Per trace, its zone's spot prices (--spot-history, then --zone-price); [] when none is given."""
    from ferry.common.pricefeeds import load_feed, parse_time
    from ferry.policy.simulate import price_series, zone_of

    zones = {zone_of(tr.name) for tr in traces}
    fixed: dict[str, float] = {}
    for item in args.zone_price:
        zone, sep, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not sep or not math.isfinite(price) or price < 0:
            raise UsageError(f"--zone-price {item!r}: expected ZONE=PRICE, e.g. us-east-1a=0.92")
        if zone not in zones:
            raise UsageError(f"--zone-price {zone}: no trace of that zone (the traces' zones: "
                             f"{', '.join(sorted(zones))})")
        fixed[zone] = price
    series: list[list[float]] = [[] for _ in traces]
    if args.spot_history:
        if not args.trace_start:
            raise UsageError("--spot-history needs --trace-start: when the traces' first tick began")
        start = parse_time(args.trace_start)
        if start is None:
            raise UsageError(f"--trace-start {args.trace_start!r}: expected ISO 8601, e.g. 2023-02-15T00:00:00Z")
        points = [p for path in args.spot_history for p in load_feed(path)]
        series = price_series(traces, points, start, spot)
    if not fixed and not any(series):
        return []
    return [[fixed[zone_of(tr.name)]] if zone_of(tr.name) in fixed else s for tr, s in zip(traces, series, strict=True)]


def report_dict(report: "SimulationReport") -> dict[str, Any]:
    """The JSON document of `ferry simulate -o json`."""
    doc = report.model_dump(mode="json")
    doc["ferry_saving"] = {base: round(report.saving_vs(base), 6) for base in ("uniform_progress", "on_demand")}
    return doc


def cmd_simulate(args: argparse.Namespace) -> int:
    report = run_simulation(args)
    if args.output == "json":
        print_json(report_dict(report))
        return 0
    rows = []
    for name in report.policies:
        r = report.policies[name]
        finished = "-" if r.finished_at_hours is None else f"{r.finished_at_hours:.2f}"
        rows.append([name, f"{r.cost:.2f}", f"{r.cost_ratio:.3f}", "met" if r.deadline_met else "MISSED",
                     r.moves, f"{r.lost_hours:.2f}", finished])
    print(f"{len(report.traces)} zone(s), {report.job_hours:g} h of work, deadline {report.deadline_hours:g} h, "
          f"from hour {report.start_hour:g} of the traces")
    if len(set(report.zone_prices.values())) > 1:  # zones with their own prices: say them
        print("mean spot prices (USD/h): " + ", ".join(f"{z} {p:.3f}" for z, p in report.zone_prices.items()))
    best = report.optimal
    if best is not None:
        for row in rows:
            row.append(f"{report.gap_to_optimal.get(str(row[0]), 0.0):+.1%}")
        finished = "-" if best.finished_at_hours is None else f"{best.finished_at_hours:.2f}"
        rows.append(["optimal" + ("" if best.exact else " (bound)"), f"{best.cost:.2f}", f"{best.cost_ratio:.3f}",
                     "met", "-", "-", finished, "-"])
    table(rows, ["POLICY", "COST USD", "VS ON-DEMAND", "DEADLINE", "MOVES", "LOST H", "FINISHED H",
                 *(["VS OPTIMAL"] if best is not None else [])])
    print(f"ferry saves {report.saving_vs('uniform_progress'):.1%} against uniform_progress "
          f"and {report.saving_vs('on_demand'):.1%} against on_demand")
    return 0
