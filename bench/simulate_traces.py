"""`ferry simulate` over every shared spot trace: each zone alone, all zones together, and all
zones of several regions each at its own price, from several starts; Ferry's policy next to Uniform
Progress, on-demand only and the omniscient optimum (the cheapest schedule that meets the deadline
knowing the future). Prints a Markdown table for the README: cost ratios (over the whole job on
on-demand) for the first start, then the distribution of each policy's gap to the optimum over
every zone set and start.

    python bench/simulate_traces.py [--shared ../shared] [--starts 4] [--json out.json]
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

from ferry.common.pricefeeds import region_of_zone
from ferry.policy.simulate import Trace, load_trace, simulate, zone_of

# Several regions at once, each with its own spot price: the availability traces' zones are in
# us-east-1, us-east-2 and us-west-2. The traces carry no prices; these are assumed (the shared
# README: spot near a third of the 3.06 USD/h on-demand price), differing by region as spot prices do.
REGION_PRICES = {"us-east-1": 0.92, "us-east-2": 0.80, "us-west-2": 1.05}

SETS = (  # (folder, job hours, deadline hours, hours between starts)
    ("availability/1-node/aws-02-15-2023", 48.0, 70.0, 150.0),
    ("preemption/1-node/aws-04-22-2023", 24.0, 36.0, 30.0),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared")
    parser.add_argument("--starts", type=int, default=4, help="starts per zone set (default 4)")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    args = parser.parse_args()
    root = args.shared / "data" / "spot-traces"
    print("| traces (first start) | job / deadline (h) | optimal | Ferry | Uniform Progress | on-demand | "
          "Ferry's gap to optimal | deadlines met |")
    print("|---|---|---|---|---|---|---|---|")
    gaps: dict[str, list[float]] = {"ferry": [], "uniform_progress": []}
    runs = []
    all_met = True
    for folder, job, deadline, every in SETS:
        files = sorted((root / folder).glob("*.json"))
        if not files:
            print(f"no traces in {root / folder}", file=sys.stderr)
            return 1
        traces = [load_trace(f) for f in files]
        groups: list[tuple[list[Trace], str, list[list[float]]]] = [
            ([t], f.stem, []) for t, f in zip(traces, files, strict=True)]
        groups.append((traces, f"all {len(traces)} zones of {folder.split('/')[0]}", []))
        regions = {region_of_zone(zone_of(t.name)) for t in traces}
        if regions <= set(REGION_PRICES) and len(regions) > 1:
            prices = [[REGION_PRICES[region_of_zone(zone_of(t.name))]] for t in traces]
            label = "/".join(f"{REGION_PRICES[r]:g}" for r in sorted(regions))
            groups.append((traces, f"all {len(traces)} zones, {len(regions)} regions at {label} USD/h", prices))
        for group, label, zone_prices in groups:
            for k in range(args.starts):
                start = round(k * every * 3600 / group[0].gap_seconds)
                r = simulate(group, job, deadline, start_tick=start, zone_prices=zone_prices)
                p, best = r.policies, r.optimal
                assert best is not None
                met = all(x.deadline_met for x in p.values())
                all_met &= met
                for name in gaps:
                    gaps[name].append(r.gap_to_optimal[name])
                runs.append({"traces": label, "start_hour": k * every, "optimal": best.cost_ratio,
                             **{n: x.cost_ratio for n, x in p.items()}, "gap": r.gap_to_optimal, "met": met})
                if k == 0:
                    print(f"| {label} | {job:g} / {deadline:g} | {best.cost_ratio:.3f} | {p['ferry'].cost_ratio:.3f} | "
                          f"{p['uniform_progress'].cost_ratio:.3f} | {p['on_demand'].cost_ratio:.3f} | "
                          f"{r.gap_to_optimal['ferry']:+.1%} | {'all' if met else 'NO'} |")
    print()
    for name, xs in gaps.items():
        q = statistics.quantiles(xs, n=10)
        print(f"{name}: gap to optimal over {len(xs)} runs: median {statistics.median(xs):+.1%}, "
              f"p10 {q[0]:+.1%}, p90 {q[-1]:+.1%}, max {max(xs):+.1%}")
    print(f"every deadline met: {'yes' if all_met else 'NO'}")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "gaps": gaps}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
