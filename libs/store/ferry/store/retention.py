"""Retention: which checkpoints of a job to delete so that only the newest ``keep_last`` remain,
and which ended jobs' checkpoints have expired (``keep_ended_s`` after the job ended)."""

from __future__ import annotations

from collections.abc import Iterable

from ferry.common.models import Job
from ferry.store.manifest import Manifest


def expired(manifests: Iterable[Manifest], keep_last: int) -> list[str]:
    """Ids of all but the ``keep_last`` newest (by ``created``, then id), oldest first."""
    ordered = sorted(manifests, key=lambda m: (m.created, m.checkpoint))
    return [m.checkpoint for m in ordered[: max(0, len(ordered) - keep_last)]]


def awaiting_expiry(job: Job) -> tuple[str, ...]:
    """A job record's index token while its checkpoints wait for ``expiring`` (ended, with a
    checkpoint, on its last node), so that a node reads only those, not every job that ever ran."""
    return (awaiting_expiry_on(job.node),) if job.terminal and job.node and job.last_checkpoint else ()


def awaiting_expiry_on(node: str) -> str:
    """The token of the jobs whose checkpoints wait for expiry on ``node``."""
    return f"expiring:{node}"


def expiring(jobs: Iterable[Job], node: str, keep_ended_s: float, now: float) -> tuple[list[Job], float | None]:
    """The ended jobs last on `node` whose checkpoints are due for deletion (they ended
    `keep_ended_s` ago or more), and when the next one is due (None: none is waiting; a
    `keep_ended_s` of 0 keeps them all). A job ends once: its record's last update is its end."""
    if keep_ended_s <= 0:
        return [], None
    due: list[tuple[float, Job]] = []
    later: list[tuple[float, Job]] = []
    for job in jobs:
        if job.terminal and job.node == node and job.last_checkpoint:
            at = job.updated + keep_ended_s
            (due if at <= now else later).append((at, job))
    return [j for _, j in sorted(due, key=lambda p: p[0])], min((at for at, _ in later), default=None)
