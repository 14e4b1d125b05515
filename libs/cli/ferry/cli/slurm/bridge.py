"""`ferry slurm bridge`: keeps SLURM's and Ferry's views of the nodes in step, and ends the Ferry
jobs of SLURM jobs that SLURM will never start again.

    a node drained in SLURM (scontrol update ... state=drain)  ->  drained in Ferry: its jobs are
        checkpointed; a --ferry job's task then requeues its SLURM job, which SLURM starts elsewhere
    resumed in SLURM                                            ->  undrained in Ferry
    a spot interruption notice on a Ferry node, or a Ferry drain ->  drained in SLURM, reason
        "ferry: ...", so that SLURM starts nothing new there (and no requeued job comes back)
    that reason gone in Ferry (undrained, notice withdrawn)     ->  resumed in SLURM
    a parked Ferry job whose SLURM job has ended for good       ->  killed in Ferry (nothing would
        restore it; its checkpoints then follow the retention of ended jobs)

One bridge per cluster, where `scontrol` reaches the controller, with an admin token (it drains
nodes). SLURM has no event stream to watch, so each round reads SLURM's nodes and queue (one
`scontrol show node` and one `squeue`) and Ferry's nodes and jobs; the decisions are a pure
function of what it read (`reconcile`). A SLURM node and a Ferry node are the same node when they
have the same name (what the SPANK plugin assumes too: SLURMD_NODENAME is the Ferry node).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from ferry.common.errors import FerryError, UsageError
from ferry.common.labels import SOURCE_LABEL
from ferry.common.scontrol import ENDED_STATES, FERRY_REASON, Scontrol, SlurmError, SlurmNode
from ferry.common.units import parse_duration

__all__ = ["Action", "ApiFerry", "Bridge", "Ferry", "FerryJob", "FerryNode", "Slurm", "add_slurm_parser", "cmd_slurm",
           "reconcile"]

PARKED = frozenset({"preempted"})
ActionKind = Literal["drain_ferry", "undrain_ferry", "drain_slurm", "resume_slurm", "end_ferry_job"]


@dataclass(frozen=True)
class FerryNode:
    id: str
    state: str  # ready, draining, preempting, lost


@dataclass(frozen=True)
class FerryJob:
    name: str
    state: str
    slurm_job: int | None  # its label slurm.job: the SLURM job it runs for

    @classmethod
    def of(cls, name: str, state: str, labels: Mapping[str, str]) -> FerryJob:
        ident = labels.get("slurm.job", "") if labels.get(SOURCE_LABEL) == "slurm" else ""
        return cls(name, state, int(ident) if ident.isdigit() else None)


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    target: str  # a node, or a Ferry job's name
    why: str


def _ferry_reason(node: FerryNode) -> str:
    if node.state == "preempting":
        return f"{FERRY_REASON} spot interruption notice; Ferry checkpoints its jobs"
    return f"{FERRY_REASON} drained in Ferry"


def reconcile(slurm_nodes: Iterable[SlurmNode], ferry_nodes: Iterable[FerryNode], jobs: Iterable[FerryJob],
              queue: Mapping[int, str] | None, mirrored: Iterable[str]) -> tuple[list[Action], set[str]]:
    """What to do about what was read; `mirrored` names the nodes whose Ferry drain mirrors a SLURM
    drain (SLURM resuming them undrains Ferry). Returns the actions and the new `mirrored`.
    `queue`: SLURM's jobs by id with their states (None when squeue could not be read: no job is
    ended then)."""
    actions, mirrored = _node_actions(slurm_nodes, ferry_nodes, mirrored)
    return actions + (_ended_jobs(jobs, queue) if queue is not None else []), mirrored


def _node_actions(slurm_nodes: Iterable[SlurmNode], ferry_nodes: Iterable[FerryNode],
                  mirrored: Iterable[str]) -> tuple[list[Action], set[str]]:
    actions: list[Action] = []
    mirrored = set(mirrored)
    by_id = {n.id: n for n in ferry_nodes}
    for s in slurm_nodes:
        f = by_id.get(s.name)
        if f is None or f.state == "lost":
            continue  # not a Ferry node, or gone: SLURM sees its own failures
        if s.drained and not s.drained_by_ferry:
            if f.state == "ready":
                actions.append(Action("drain_ferry", s.name, f"drained in SLURM: {s.reason or 'no reason given'}"))
            mirrored.add(s.name)
        elif s.drained_by_ferry:
            if f.state == "ready":
                actions.append(Action("resume_slurm", s.name, "Ferry's reason to drain it is gone"))
        elif s.name in mirrored:
            mirrored.discard(s.name)
            if f.state == "draining":
                actions.append(Action("undrain_ferry", s.name, "resumed in SLURM"))
        elif f.state in ("draining", "preempting"):
            actions.append(Action("drain_slurm", s.name, _ferry_reason(f)))
    return actions, mirrored


def _ended_jobs(jobs: Iterable[FerryJob], queue: Mapping[int, str]) -> list[Action]:
    actions = []
    for job in jobs:
        if job.slurm_job is None or job.state not in PARKED:
            continue
        state = queue.get(job.slurm_job)
        if state is None or state in ENDED_STATES:
            ended = state.lower() if state else "no longer known to SLURM"
            actions.append(Action("end_ferry_job", job.name,
                                  f"SLURM job {job.slurm_job} has ended ({ended}): nothing will restore it"))
    return actions


class Ferry(Protocol):
    """What the bridge reads and does in Ferry (``ApiFerry``: through the admin API)."""

    def nodes(self) -> list[FerryNode]: ...

    def jobs(self) -> list[FerryJob]: ...

    def drain(self, node: str, undo: bool) -> None: ...

    def end(self, job: str) -> None: ...


class Slurm(Protocol):
    """What the bridge reads and does in SLURM (``ferry.common.scontrol.Scontrol``)."""

    def nodes(self) -> list[SlurmNode]: ...

    def queue(self, job_ids: Iterable[int]) -> dict[int, str]: ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> None: ...


class ApiFerry:
    """Ferry through its admin API (the client loads late: the CLI's start-up stays light)."""

    def __init__(self, client: object) -> None:
        from ferry.cli.client import Client

        assert isinstance(client, Client)
        self.client = client

    def nodes(self) -> list[FerryNode]:
        from ferry.v1 import ferry_pb2 as pb

        reply = self.client.call(self.client.stub.ListNodes, pb.ListNodesRequest(), timeout=15)
        return [FerryNode(n.id, n.state) for n in reply.nodes]

    def jobs(self) -> list[FerryJob]:
        from ferry.v1 import ferry_pb2 as pb

        reply = self.client.call(self.client.stub.ListJobs, pb.ListJobsRequest(), timeout=15)
        return [FerryJob.of(j.name, j.state, j.labels) for j in reply.jobs]

    def drain(self, node: str, undo: bool) -> None:
        from ferry.v1 import ferry_pb2 as pb

        self.client.call(self.client.stub.DrainNode, pb.DrainNodeRequest(node=node, undo=undo), timeout=30)

    def end(self, job: str) -> None:
        from ferry.v1 import ferry_pb2 as pb

        self.client.call(self.client.stub.KillJob, pb.KillJobRequest(job=job, grace_s=0), timeout=30)


@dataclass
class Bridge:
    """Runs `reconcile` every `interval_s` against Ferry and SLURM."""

    ferry: Ferry
    slurm: Slurm
    interval_s: float = 5.0
    mirrored: set[str] = field(default_factory=set)
    stopping: threading.Event = field(default_factory=threading.Event)

    def read(self) -> tuple[list[SlurmNode], list[FerryNode], list[FerryJob], dict[int, str] | None]:
        nodes, jobs = self.ferry.nodes(), self.ferry.jobs()
        slurm_nodes = self.slurm.nodes()
        wanted = [j.slurm_job for j in jobs if j.slurm_job is not None and j.state in PARKED]
        try:
            queue: dict[int, str] | None = self.slurm.queue(wanted)
        except SlurmError as exc:
            _say(f"cannot read SLURM's queue ({exc}); no job is ended this round")
            queue = None
        return slurm_nodes, nodes, jobs, queue

    def apply(self, action: Action) -> None:
        _say(f"{action.kind.replace('_', ' ')} {action.target}: {action.why}")
        if action.kind in ("drain_ferry", "undrain_ferry"):
            self.ferry.drain(action.target, undo=action.kind == "undrain_ferry")
        elif action.kind == "drain_slurm":
            self.slurm.drain(action.target, action.why)
        elif action.kind == "resume_slurm":
            self.slurm.resume(action.target)
        else:
            self.ferry.end(action.target)

    def round(self) -> list[Action]:
        slurm_nodes, nodes, jobs, queue = self.read()
        if not self.mirrored:  # after a start: what the world shows was mirrored before
            by_id = {n.id: n.state for n in nodes}
            self.mirrored = {s.name for s in slurm_nodes
                             if s.drained and not s.drained_by_ferry and by_id.get(s.name) == "draining"}
        actions, self.mirrored = reconcile(slurm_nodes, nodes, jobs, queue, self.mirrored)
        for action in actions:
            try:
                self.apply(action)
            except FerryError as exc:  # the next round sees the world again and decides again
                _say(f"{action.kind.replace('_', ' ')} {action.target} failed: {exc}")
        return actions

    def run(self) -> None:
        print(f"ferry slurm bridge: ready, every {self.interval_s:g} s", flush=True)
        while not self.stopping.is_set():
            try:
                self.round()
            except FerryError as exc:
                _say(f"this round failed ({exc}); trying again in {self.interval_s:g} s")
            self.stopping.wait(self.interval_s)


def _say(line: str) -> None:
    print(f"ferry slurm bridge: {line}", file=sys.stderr, flush=True)


EPILOG = """examples:
  FERRY_TOKEN=$(cat /etc/ferry/admin.token) ferry slurm bridge --interval 5s   # on the controller's host
"""


def add_slurm_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("slurm", help="Ferry under SLURM: the bridge between SLURM's and Ferry's nodes",
                       description=__doc__, epilog=EPILOG, parents=[common],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="slurm", metavar="ACTION", required=True)
    a = actions.add_parser("bridge", parents=[common], help="mirror drains and spot notices between SLURM and Ferry "
                           "and end the Ferry jobs of ended SLURM jobs (foreground; SIGTERM stops it)")
    a.add_argument("--interval", default="5s", metavar="DURATION",
                   help="how often SLURM and Ferry are read (default 5s; SLURM has no event stream)")


def cmd_slurm(args: argparse.Namespace) -> int:
    from ferry.cli.client import Client, default_addr

    interval = parse_duration(args.interval)
    if not 0.2 <= interval <= 3600:
        raise UsageError(f"--interval {args.interval}: give 0.2s to 1h")
    client = Client(args.addr or default_addr())
    bridge = Bridge(ApiFerry(client), Scontrol(), interval)

    def stop(signum: int, frame: object) -> None:
        bridge.stopping.set()  # the round under way ends, then the bridge does

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    started = time.monotonic()
    try:
        bridge.run()
    finally:
        client.close()
    _say(f"stopped after {time.monotonic() - started:.0f} s")
    return 0
