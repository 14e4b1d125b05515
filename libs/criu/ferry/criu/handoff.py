"""Handing a workload's start to a caller on the node (``ferry run|restore --here``).

A node service that would start a shim for a ``--here`` job writes the shim's command line into
the job directory instead (``handoff.json``) and waits. The ``--here`` command on that node runs
it as its own child with ``--foreground``: the shim's monitor, and so the workload, are then the
caller's descendants, in the caller's cgroup. The monitor answers in ``handoff-reply.json`` (the
same report the detached starter prints), and the node service goes on as after any start.

    node service                       caller (`ferry run --here`)
    offer(): handoff.json, waits  -->  take(): reads it, runs argv (the shim, in the foreground)
    <-- handoff-reply.json  (written by the shim's monitor once the workload runs, or failed)

Both files hold no secret: the environment travels in a private file that the shim reads and the
node service removes.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ferry.criu.jobdir import JobDir, write_json_atomic

__all__ = ["FOREGROUND_FLAG", "Handoff", "HandoffReply", "find_offer", "offer", "take", "write_reply"]

FOREGROUND_FLAG = "--foreground"
POLL_S = 0.05


class Handoff(BaseModel):
    """A start the node service offers to the caller."""

    model_config = ConfigDict(frozen=True)

    job: str  # the job's name: a caller that submitted the job may not know its id yet
    incarnation: int
    mode: Literal["launch", "restore"]
    argv: list[str]  # the shim's command line, FOREGROUND_FLAG included
    offered: float = Field(default_factory=time.time)


class HandoffReply(BaseModel):
    """What the shim's monitor reports (as the detached starter would print it)."""

    model_config = ConfigDict(frozen=True)

    incarnation: int
    ok: bool
    pid: int | None = None
    shim_pid: int | None = None
    error: str = ""
    detail: list[str] = Field(default_factory=list)


def _handoff_file(job_dir: JobDir) -> Path:
    return job_dir.path / "handoff.json"


def _reply_file(job_dir: JobDir) -> Path:
    return job_dir.path / "handoff-reply.json"


def _read(path: Path, model: type[Handoff] | type[HandoffReply]) -> Handoff | HandoffReply | None:
    try:
        return model.model_validate_json(path.read_bytes())
    except (FileNotFoundError, ValidationError):  # written atomically: unreadable means foreign
        return None


def read_offer(job_dir: JobDir) -> Handoff | None:
    found = _read(_handoff_file(job_dir), Handoff)
    return found if isinstance(found, Handoff) else None


def read_reply(job_dir: JobDir, incarnation: int) -> HandoffReply | None:
    found = _read(_reply_file(job_dir), HandoffReply)
    return found if isinstance(found, HandoffReply) and found.incarnation == incarnation else None


def write_reply(job_dir: JobDir, reply: HandoffReply) -> None:
    write_json_atomic(_reply_file(job_dir), reply)


async def offer(job_dir: JobDir, handoff: Handoff, timeout_s: float) -> HandoffReply | None:
    """Offers `handoff` and waits for the monitor's reply; None when nobody took it in time.
    The offer is withdrawn however this ends."""
    _reply_file(job_dir).unlink(missing_ok=True)
    write_json_atomic(_handoff_file(job_dir), handoff)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reply = read_reply(job_dir, handoff.incarnation)
            if reply is not None:
                return reply
            await asyncio.sleep(POLL_S)
        return None
    finally:
        found = read_offer(job_dir)
        if found is not None and found.incarnation == handoff.incarnation:
            _handoff_file(job_dir).unlink(missing_ok=True)


def find_offer(jobs_dir: Path, job: str, *, newer_than: int) -> tuple[JobDir, Handoff] | None:
    """The offer for the job named `job` among a node's job directories, if one is above
    incarnation `newer_than`."""
    for path in jobs_dir.glob("*/handoff.json"):
        job_dir = JobDir(path.parent)
        found = read_offer(job_dir)
        if found is not None and found.job == job and found.incarnation > newer_than:
            return job_dir, found
    return None


async def take(jobs_dir: Path, job: str, *, newer_than: int, timeout_s: float) -> tuple[JobDir, Handoff] | None:
    """Waits for an offer for `job` (``find_offer``); None when none came in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = find_offer(jobs_dir, job, newer_than=newer_than)
        if found is not None:
            return found
        await asyncio.sleep(POLL_S)
    return None
