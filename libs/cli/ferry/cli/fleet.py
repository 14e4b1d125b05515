"""`ferry autoscale`: the autoscaler's bounds, and what it has launched and retired."""

import argparse

from ferry.cli.client import Client
from ferry.cli.output import ago, print_json, table, to_dict
from ferry.common.models import AutoscalePolicy
from ferry.common.units import parse_duration
from ferry.v1 import ferry_pb2 as pb

CHANGES = ("min", "max", "target_utilization", "scale_down_after", "scale_up_after")


def wanted(current: pb.AutoscalePolicy | None, args: argparse.Namespace) -> AutoscalePolicy:
    """The policy the flags ask for: what is set now (or the defaults), with each given flag changed.
    A UsageError (exit 2) says what is wrong, before anything is sent."""
    base = AutoscalePolicy() if current is None else AutoscalePolicy(
        enabled=current.enabled, min_nodes=current.min_nodes, max_nodes=current.max_nodes,
        target_utilization=current.target_utilization, scale_down_after_s=current.scale_down_after_s,
        scale_up_after_s=current.scale_up_after_s)
    fields = base.model_dump(exclude={"updated"}) | {"enabled": not args.off}
    if args.min is not None:
        fields["min_nodes"] = args.min
    if args.max is not None:
        fields["max_nodes"] = args.max
    if args.target_utilization is not None:
        fields["target_utilization"] = args.target_utilization
    if args.scale_down_after is not None:
        fields["scale_down_after_s"] = parse_duration(args.scale_down_after)
    if args.scale_up_after is not None:
        fields["scale_up_after_s"] = parse_duration(args.scale_up_after)
    return AutoscalePolicy.checked(**fields)


def cmd_autoscale(client: Client, args: argparse.Namespace) -> int:
    status = client.call(client.stub.GetAutoscale, pb.GetAutoscaleRequest())
    if args.off or any(getattr(args, name) is not None for name in CHANGES):
        policy = wanted(status.policy if status.set else None, args)
        status = client.call(client.stub.SetAutoscale, pb.AutoscalePolicy(
            enabled=policy.enabled, min_nodes=policy.min_nodes, max_nodes=policy.max_nodes,
            target_utilization=policy.target_utilization, scale_down_after_s=policy.scale_down_after_s,
            scale_up_after_s=policy.scale_up_after_s))
    if args.output == "json":
        print_json({"set": status.set, "policy": to_dict(status.policy) if status.set else None,
                    "fleet": [to_dict(n) for n in status.fleet]})
        return 0
    p = status.policy
    if not status.set:
        print("autoscaling is off: no bounds set (`ferry autoscale --min 1 --max 8`)")
    else:
        state = "on" if p.enabled else "off"
        print(f"autoscaling {state}: {p.min_nodes}..{p.max_nodes} nodes, target utilization "
              f"{p.target_utilization:.0%}, retire after {p.scale_down_after_s:.0f}s underused, launch after a job "
              f"waited {p.scale_up_after_s:.0f}s")
    if status.fleet:
        table([[n.id, n.state, n.offer or "-", f"{n.price_per_hour:.4f}", ago(n.since), n.reason]
               for n in status.fleet], ["NODE", "STATE", "OFFER", "USD/H", "SINCE", "WHY"])
    return 0
