"""`ferry simulate` over every shared spot trace: each zone alone and all zones together, Ferry's
policy next to Uniform Progress and on-demand only. Prints a Markdown table for the README.

    python bench/simulate_traces.py [--shared ../shared]
"""

import argparse
import sys
from pathlib import Path

from ferry.policy.simulate import load_trace, simulate

SETS = (  # (folder, job hours, deadline hours)
    ("availability/1-node/aws-02-15-2023", 48.0, 70.0),
    ("preemption/1-node/aws-04-22-2023", 24.0, 36.0),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared")
    args = parser.parse_args()
    root = args.shared / "data" / "spot-traces"
    print("| traces | job / deadline (h) | Ferry | Uniform Progress | on-demand | Ferry saves vs UP | deadlines met |")
    print("|---|---|---|---|---|---|---|")
    worst = 1.0
    for folder, job, deadline in SETS:
        files = sorted((root / folder).glob("*.json"))
        if not files:
            print(f"no traces in {root / folder}", file=sys.stderr)
            return 1
        traces = [load_trace(f) for f in files]
        groups = [([t], f.stem) for t, f in zip(traces, files, strict=True)]
        groups.append((traces, f"all {len(traces)} zones of {folder.split('/')[0]}"))
        for group, label in groups:
            r = simulate(group, job, deadline)
            p = r.policies
            met = all(x.deadline_met for x in p.values())
            saving = r.saving_vs("uniform_progress")
            worst = min(worst, saving)
            print(f"| {label} | {job:g} / {deadline:g} | {p['ferry'].cost_ratio:.3f} | "
                  f"{p['uniform_progress'].cost_ratio:.3f} | {p['on_demand'].cost_ratio:.3f} | {saving:.1%} | "
                  f"{'all' if met else 'NO'} |")
    print(f"\ncost ratios are each policy's cost over running the whole job on demand; smallest saving {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
