"""`ferry ray up`: a Ray cluster as a gang, a head and its workers each a bridge-network job on a
node of its own, checkpointed, restored and failed over as one (``ferry.policy.gangs``).

What every member gets, and why (each measured in tests/e2e/test_gang_ray.py):
- ``--include-log-monitor=False``: the log monitor holds every Ray log file open for reading, and
  CRIU refuses to restore a read-only file whose size changed since the checkpoint;
- on the head, ``RAY_health_check_failure_threshold=60``: the GCS gives up on a raylet after 5
  failed health checks 3 s apart by default, and a gang restored on other nodes is away longer;
- on the workers, ``RAY_raylet_start_wait_time_s=120``: raylets starting on a busy node time out;
- ``RAY_AUTH_MODE=disabled``: Ray's ports are reached only on the gang's own addresses in the job
  network, which no one outside the cluster's jobs can reach.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ferry.cli.client import Client
from ferry.cli.output import job_dict, print_json, table
from ferry.common.errors import UsageError
from ferry.common.jobspec import check_request
from ferry.common.labels import SOURCE_LABEL
from ferry.common.units import parse_duration
from ferry.v1 import ferry_pb2 as pb

HEAD_PORT = 6379
START_WAIT_S = 300.0
STARTED = b"Ray runtime started"  # what `ray start` prints once its node runs


def ray_binary(given: str | None) -> str:
    """The `ray` the members run: the one asked for, else the one beside this Python, else PATH's."""
    if given:
        return given
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else (shutil.which("ray") or "ray")


def member_requests(args: argparse.Namespace, head_address: str | None, nodes: list[str]) -> list[dict[str, Any]]:
    """The head's request (`head_address` None) or the workers' (pure: checked like `ferry run`).
    `nodes`: the head's, then each worker's, in turn. Each worker offers a custom resource named
    after it (``{"NAME-w1": 1}``), so a driver can pin an actor to a member."""
    ray = ray_binary(args.ray_bin)
    common: dict[str, Any] = {
        "network": "bridge", "gang": args.name, "labels": {SOURCE_LABEL: "ray", "ray.cluster": args.name},
        "checkpoint_every_s": parse_duration(args.checkpoint_every) if args.checkpoint_every else 0.0,
        "cwd": "/tmp"}
    cpus = ["--num-cpus", str(args.cpus)] if args.cpus else []
    if head_address is None:
        start = [ray, "start", "--head", f"--port={HEAD_PORT}", *cpus, "--include-dashboard=false",
                 "--include-log-monitor=False", "--disable-usage-stats", f"--temp-dir=/tmp/ferry-ray-{args.name}"]
        env = {"RAY_AUTH_MODE": "disabled", "RAY_health_check_failure_threshold": "60"}
        driver = list(args.driver or [])
        driver = driver[1:] if driver[:1] == ["--"] else driver
        if driver:  # on the head, where Ray wants a driver (a Ray node); ray.init() finds the cluster
            env["RAY_ADDRESS"] = "auto"
            argv = ["sh", "-c", f'{shlex.join(start)} >/dev/null && exec "$@"', f"{args.name}-head", *driver]
        else:
            argv = [*start, "--block"]
        return [{**common, "name": f"{args.name}-head", "node": nodes[0] if nodes else "", "env": env, "argv": argv}]
    return [{**common, "name": f"{args.name}-w{i}", "node": nodes[i % len(nodes)] if nodes else "",
             "env": {"RAY_AUTH_MODE": "disabled", "RAY_raylet_start_wait_time_s": "120"},
             "argv": [ray, "start", f"--address={head_address}:{HEAD_PORT}", *cpus,
                      f'--resources={{"{args.name}-w{i}": 1}}', "--include-log-monitor=False",
                      "--disable-usage-stats", "--block"]}
            for i in range(1, args.workers + 1)]


def _submit(client: Client, fields: dict[str, Any]) -> pb.Job:
    return client.call(client.stub.SubmitJob, pb.SubmitJobRequest(**check_request(fields).model_dump()))


def _wait_running(client: Client, job: pb.Job) -> pb.Job:
    deadline = time.monotonic() + START_WAIT_S
    while True:
        job = client.call(client.stub.GetJob, pb.JobRef(job=job.id))
        if job.state == "running" and job.node:
            return job
        if job.state in ("failed", "killed", "succeeded") or time.monotonic() > deadline:
            raise UsageError(f"Ray member {job.name} did not start ({job.state}: {job.error or job.reason}); "
                             f"`ferry logs {job.name} --stream stderr` says why")
        time.sleep(0.5)


def _wait_started(client: Client, job: pb.Job) -> pb.Job:
    """Waits until the member's `ray start` says its node runs (its stdout), or fails."""
    deadline = time.monotonic() + START_WAIT_S
    while True:
        out = b"".join(c.data for c in client.stream(client.stub.ReadLogs, pb.ReadLogsRequest(job=job.id,
                                                                                             stream="stdout")))
        if STARTED in out:
            return job
        state = client.call(client.stub.GetJob, pb.JobRef(job=job.id)).state
        if state in ("failed", "killed", "succeeded") or time.monotonic() > deadline:
            raise UsageError(f"Ray member {job.name} did not join ({state}); `ferry logs {job.name} --stream stderr` "
                             "says why")
        time.sleep(0.5)


def cmd_ray_up(client: Client, args: argparse.Namespace) -> int:
    if args.workers < 0:
        raise UsageError("--workers: give 0 or more")
    nodes = [n for n in (args.nodes or "").split(",") if n]
    if not nodes:  # a node each, in turn, among the nodes that take work
        nodes = sorted(n.id for n in client.call(client.stub.ListNodes, pb.ListNodesRequest()).nodes
                       if n.state == "ready")
    head_fields = member_requests(args, None, nodes)[0]
    for fields in (head_fields, *member_requests(args, "0.0.0.0", nodes)):
        check_request(fields)  # every bad option refused before anything starts
    head = _wait_running(client, _submit(client, head_fields))
    members = [head]
    for fields in member_requests(args, head.address, nodes):
        # one raylet starting at a time: on one machine (the nodes of `ferry up`) two that start
        # at once can pick the same socket names in the session folder the head chose
        members.append(_wait_started(client, _wait_running(client, _submit(client, fields))))
    address = f"{head.address}:{HEAD_PORT}"
    if getattr(args, "output", "text") == "json":
        print_json({"gang": args.name, "address": address, "members": [job_dict(j) for j in members]})
        return 0
    table([[j.name, j.node, j.address, j.state] for j in members], ["MEMBER", "NODE", "ADDRESS", "STATE"])
    print(f"Ray cluster {args.name} at {address}, a gang of {len(members)}"
          + (f"; its driver runs in {args.name}-head (`ferry logs {args.name}-head`)" if args.driver else "")
          + f"; checkpoint it with `ferry checkpoint --gang {args.name}`")
    return 0
