"""`ferry signals`, `ferry explain` and the `--dry-run` of the mutating commands: what the API's
GetSignal and Plan answer (ferry.policy.signals, ferry.policy.plans), as text or JSON."""

import argparse
import json
from collections.abc import Callable
from typing import Any

from ferry.cli.client import Client
from ferry.cli.output import print_json, table
from ferry.v1 import ferry_pb2 as pb

# the CLI spells them with dashes, the API and the MCP tools with underscores
SIGNAL_NAMES = {"queue": "queue", "sla-risk": "sla_risk", "spot-market": "spot_market", "health": "cluster_health",
                "savings": "savings"}


def add_insight_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("signals", parents=[common], help="what to watch: the queue, SLA risk, the spot market, "
                       "cluster health, savings against on-demand",
                       description="What an operator or an operator's agent watches, computed by the API from "
                       "the cluster's records (the MCP tools of the same names answer the same JSON).")
    p.add_argument("name", choices=list(SIGNAL_NAMES), help="queue: waiting jobs by priority and shape, their waits "
                   "and why; sla-risk: jobs with a deadline or downtime limit, riskiest first; spot-market: prices, "
                   "trend and interruptions per zone and instance type; health: nodes, GPUs, failing checkpoints; "
                   "savings: saved so far against the same nodes on demand")
    p = sub.add_parser("explain", parents=[common], help="why a job is where it is, the best alternatives, and what "
                       "a move would save, cost and pause it for",
                       description="The placement score of the job's node and of every other node, and the move "
                       "decision the scheduler would take now (saving over the job's remaining time, the move's "
                       "cost, its pause).")
    p.add_argument("job")


def cmd_signals(client: Client, args: argparse.Namespace) -> int:
    reply = client.call(client.stub.GetSignal, pb.SignalRequest(name=SIGNAL_NAMES[args.name]))
    data = json.loads(reply.json)
    if args.output == "json":
        print_json(data)
        return 0
    TEXT[args.name](data)
    return 0


def cmd_explain(client: Client, args: argparse.Namespace) -> int:
    data = json.loads(client.call(client.stub.GetSignal, pb.SignalRequest(name="explain", job=args.job)).json)
    if args.output == "json":
        print_json(data)
        return 0
    print(f"{data['job']} is {data['state']} on {data['node'] or 'no node'}; "
          f"{'it would move' if data['would_move'] else 'it stays'}: {data['why']}")
    table([[a["node"], "spot" if a["spot"] else "on-demand", f"{a['price_per_hour']:.3f}",
            _num(a["progress_cost_per_hour"]), _num(a["score"]), a["why_not"] or ("(here)" if a["node"] == data["node"]
                                                                             else "")]
           for a in data["alternatives"]], ["NODE", "MARKET", "USD/H", "USD/H OF PROGRESS", "SCORE", ""])
    print(f"a move: pause about {data['move_pause_s']:.0f}s, costs {_num(data['move_cost_usd'])} USD, saves "
          f"{_num(data['move_saving_usd'])} USD; live possible: {'yes' if data['live_possible'] else 'no'}")
    return 0


def dry_run(client: Client, args: argparse.Namespace, request: pb.PlanRequest) -> int:
    """Prints what the call would do; the API refuses it as it would refuse the call."""
    reply = client.call(client.stub.Plan, request)
    if args.output == "json":
        print_json(json.loads(reply.json))
    else:
        print(f"dry run: {reply.summary}")
        for move in json.loads(reply.json).get("moves", []):
            print(f"  {move['summary']}")
    return 0


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _queue(d: dict[str, Any]) -> None:
    print(f"{d['waiting']} job(s) waiting")
    table([[g["priority"], g["shape"], g["waiting"], f"{g['oldest_wait_s']:.0f}s", f"{g['median_wait_s']:.0f}s",
            "; ".join(g["reasons"])] for g in d["groups"]], ["PRIO", "SHAPE", "JOBS", "OLDEST", "MEDIAN", "WHY"])


def _sla(d: list[dict[str, Any]]) -> None:
    table([[r["job"], r["node"] or "-", r["risk"], f"{r['p_interruption']:.0%}", f"{r['expected_loss_s']:.0f}s",
            r["why"]] for r in d], ["JOB", "NODE", "RISK", "P(INTERRUPT)", "LOSS", "WHY"])


def _market(d: list[dict[str, Any]]) -> None:
    table([[m["zone"], m["instance_type"], _num(m["spot_price"]), _num(m["on_demand_price"]),
            "-" if m["discount"] is None else f"{m['discount']:.0%}",
            "-" if m["trend"] is None else f"{m['trend']:+.1%}", m["nodes"], m["interruptions"]] for m in d],
          ["ZONE", "TYPE", "SPOT", "ON-DEMAND", "DISCOUNT", "TREND", "NODES", "INTERRUPTIONS"])


def _health(d: dict[str, Any]) -> None:
    nodes = ", ".join(f"{n} {state}" for state, n in sorted(d["nodes"].items()))
    print(f"{'ok' if d['ok'] else 'NOT OK'}: nodes {nodes or 'none'} ({d['usable']} usable)")
    for p in d["problems"]:
        print(f"  {p['node']} ({p['state']}): " + "; ".join(p["problems"]))
    for job, n in sorted(d["failing_checkpoints"].items()):
        print(f"  {job}: {n} failed checkpoint(s) in the last day")
    if d["failed_jobs"]:
        print("  failed in the last day: " + ", ".join(d["failed_jobs"]))


def _savings(d: dict[str, Any]) -> None:
    print(f"saved {d['saved_usd']:.2f} USD against on-demand (spent {d['spent_usd']:.2f}); "
          f"saving {d['saving_per_hour']:.3f} USD/h now")
    if d["unpriced"]:
        print("no on-demand price known for: " + ", ".join(d["unpriced"]))


TEXT: dict[str, Callable[[Any], None]] = {
    "queue": _queue, "sla-risk": _sla, "spot-market": _market, "health": _health, "savings": _savings}
