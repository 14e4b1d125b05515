"""What a failed network test prints about the job network as it is at the failure: each node's
routes to other nodes' jobs, neighbours and bridge ports, and each job's own addresses, routes,
neighbours, nftables tables (a CRIU network lock left behind would show there) and TCP sockets with
their retransmission counters. A connection that died after a move then names where its packets
went: CI removes the cluster with its namespaces once the test has failed."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import Cluster
from tests.e2e.test_frozen import workload_pid

NODE_COMMANDS = (["ip", "-4", "route", "show", "proto", "77"], ["ip", "-4", "neigh", "show", "dev", "ferry0"],
                 ["bridge", "link", "show"], ["nft", "list", "tables"])
JOB_COMMANDS = (["ip", "-4", "-br", "addr"], ["ip", "-4", "route"], ["ip", "-4", "neigh"], ["nft", "list", "tables"],
                ["ss", "-tnio", "state", "all"])


def _in(netns: str, argv: list[str]) -> str:
    try:
        done = subprocess.run(["nsenter", f"--net={netns}", "--", *argv], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"  ({exc})"
    return "\n".join(f"  {line}" for line in (done.stdout + done.stderr).strip().splitlines()[:40])


def _job_pid(c: Cluster, job: str) -> int | None:
    status = c.json("status", job)
    try:
        return workload_pid(c, str(status.get("node")), str(status.get("id")))
    except (OSError, ValueError, KeyError):  # not running anywhere now
        return None


def network_diagnosis(c: Cluster, jobs: tuple[str, ...] | list[str]) -> str:
    parts = []
    try:
        nodes = c.up_state()["net"]["nodes"]
    except (OSError, KeyError, ValueError):
        nodes = {}
    for node, env in sorted(nodes.items()):
        netns = env.get("FERRY_NODE_NETNS", "")
        if not netns.startswith("/"):
            continue
        parts.append(f"node {node} ({env.get('FERRY_NET_IP')}):")
        parts += [f" $ {' '.join(argv)}\n{_in(netns, argv)}" for argv in NODE_COMMANDS]
    for job in jobs:
        pid = _job_pid(c, job)
        netns = f"/proc/{pid}/ns/net"
        if pid is None or not Path(netns).exists():
            parts.append(f"job {job}: no process")
            continue
        parts.append(f"job {job} (pid {pid}):")
        parts += [f" $ {' '.join(argv)}\n{_in(netns, argv)}" for argv in JOB_COMMANDS]
    return "\n".join(parts)
