"""SLURM as Ferry reads and drives it (the SLURM integration of ``ferry.cli.slurm``, the SLURM
provider of ``ferry.fleet.slurm``): `scontrol`, `squeue` and their one-line
output (`-o`), parsed by pure functions; the commands run behind one small class.

SLURM has no event stream to watch, so what SLURM knows is read when it is needed (the launcher,
once per stop) or every few seconds (the bridge, one `scontrol show node` and one `squeue` per
round for the whole cluster).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ferry.common.errors import FerryError

__all__ = ["ENDED_STATES", "FERRY_REASON", "Scontrol", "SlurmError", "SlurmJob", "SlurmNode", "parse_fields",
           "parse_job", "parse_nodes", "parse_preempt_mode", "parse_queue"]

FERRY_REASON = "ferry:"  # how a drain reason that Ferry's bridge set begins
# a job in one of these states has ended for good (a requeued one is PENDING again)
ENDED_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                          "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"})
_KEY = re.compile(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_:]*)=")


class SlurmError(FerryError):
    """A SLURM command failed or could not be run."""


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # the base state: IDLE, ALLOCATED, MIXED, DOWN, ...
    flags: frozenset[str]  # DRAIN, NOT_RESPONDING, COMPLETING, ...
    reason: str  # the reason an admin (or Ferry) gave, without SLURM's [user@time]

    @property
    def drained(self) -> bool:
        """Drained or draining: SLURM starts nothing new there."""
        return "DRAIN" in self.flags

    @property
    def drained_by_ferry(self) -> bool:
        return self.drained and self.reason.startswith(FERRY_REASON)


@dataclass(frozen=True)
class SlurmJob:
    id: int
    state: str  # RUNNING, PENDING, COMPLETING, ...
    partition: str
    restarts: int
    preempted: bool  # SLURM chose it for preemption (PreemptTime is set)


def parse_fields(line: str, last: str | None = None) -> dict[str, str]:
    """One record of `scontrol show ... -o`: `Key=Value` pairs, where a value may hold spaces (OS=).
    `last`: a field that ends the line and may hold anything, `=` included (a node's Reason), so
    it is cut off first."""
    line = line.strip()
    reason = None
    cut = line.find(f" {last}=") if last else -1
    if cut >= 0:
        line, reason = line[:cut], line[cut + len(f" {last}="):]
    keys = list(_KEY.finditer(line))
    fields = {}
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        fields[m.group(1)] = line[m.end():end].strip()
    if reason is not None and last is not None:
        fields[last] = reason.strip()
    return fields


def _reason(text: str) -> str:
    """A reason without the `[user@time]` SLURM appends."""
    return re.sub(r"\s*\[[^\]]*@[^\]]*\]$", "", text).strip()


def parse_nodes(text: str) -> list[SlurmNode]:
    nodes = []
    for line in text.splitlines():
        f = parse_fields(line, last="Reason")
        if "NodeName" not in f:
            continue
        base, *flags = f.get("State", "UNKNOWN").split("+")
        reason = _reason(f.get("Reason", ""))
        nodes.append(SlurmNode(f["NodeName"], base.rstrip("*"), frozenset(flags), "" if reason == "(null)" else reason))
    return nodes


def parse_job(text: str) -> SlurmJob | None:
    for line in text.splitlines():
        f = parse_fields(line)
        if "JobId" in f:
            return SlurmJob(id=int(f["JobId"]), state=f.get("JobState", ""), partition=f.get("Partition", ""),
                            restarts=int(f.get("Restarts", "0") or 0),
                            preempted=f.get("PreemptTime", "None") not in ("None", "", "Unknown"))
    return None


def parse_preempt_mode(text: str) -> str:
    """A partition's PreemptMode (`scontrol show partition NAME -o`), e.g. REQUEUE or CANCEL."""
    for line in text.splitlines():
        mode = parse_fields(line).get("PreemptMode")
        if mode is not None:
            return mode.upper()
    return ""


def parse_queue(text: str) -> dict[int, str]:
    """`squeue -h -o %i|%T`: job id -> state. An array task's id (12_3) is kept as its own job's."""
    queue = {}
    for line in text.splitlines():
        ident, sep, state = line.strip().partition("|")
        head = ident.split("_")[0]
        if sep and head.isdigit():
            queue[int(head)] = state.strip().upper()
    return queue


class Scontrol:
    """Runs SLURM's commands (`env`: e.g. SLURM_CONF; default: this process's environment)."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout_s: float = 15.0) -> None:
        self.env = dict(os.environ if env is None else env)
        self.timeout_s = timeout_s

    def run(self, *argv: str) -> str:
        try:
            done = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=self.timeout_s,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"{' '.join(argv[:3])}: {exc}") from exc
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()
            raise SlurmError(f"{' '.join(argv[:3])} exited {done.returncode}: {said[-1] if said else 'no message'}")
        return done.stdout

    def nodes(self) -> list[SlurmNode]:
        return parse_nodes(self.run("scontrol", "show", "node", "-o"))

    def job(self, job_id: int) -> SlurmJob | None:
        try:
            return parse_job(self.run("scontrol", "show", "job", "-o", str(job_id)))
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return None
            raise

    def preempt_mode(self, partition: str) -> str:
        return parse_preempt_mode(self.run("scontrol", "show", "partition", "-o", partition))

    def queue(self, job_ids: Iterable[int]) -> dict[int, str]:
        """The states of those of `job_ids` SLURM still knows (ended ones while MinJobAge keeps them)."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        return parse_queue(self.run("squeue", "-h", "-t", "all", "-j", ",".join(map(str, ids)), "-o", "%i|%T"))

    def requeue(self, job_id: int) -> None:
        self.run("scontrol", "requeue", str(job_id))

    def drain(self, node: str, reason: str) -> None:
        self.run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")

    def resume(self, node: str) -> None:
        self.run("scontrol", "update", f"nodename={node}", "state=resume")

    def hostnames(self, hostlist: str) -> list[str]:
        """The names a host list (``node-[1-3],gpu-1``) stands for."""
        return self.run("scontrol", "show", "hostnames", hostlist).split()

    def power(self, node: str, up: bool) -> None:
        """Power saving: SLURM runs its ResumeProgram (or, once the node is idle, SuspendProgram)."""
        self.run("scontrol", "update", f"nodename={node}", f"state={'power_up' if up else 'power_down'}")
