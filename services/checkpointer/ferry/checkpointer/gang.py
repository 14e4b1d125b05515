"""A gang member's half of a group checkpoint (``ferry.scheduler.ops.gang``): its network locked
before any member dumps, and released (or the member ended) once the group committed or was undone.

The lock is the member's port on the node's bridge set to blocking (``HostEnd.block``): nothing
reaches the member or leaves it, so no member's kernel acknowledges what another member sends after
the gang was locked. A lock marker in the job's folder names the op, so that a checkpointer
restarted while the op had ended unlocks what it left locked: nothing stays cut off.
"""

import asyncio
import logging
import signal
from typing import Protocol

from ferry.common import wire
from ferry.common.bus import Bus
from ferry.common.config import Settings
from ferry.common.models import Job
from ferry.criu.jobdir import JobDir
from ferry.criu.treekill import kill_tree
from ferry.node.bridge import GANG_LOCK_MARKER, host_end
from ferry.node.procs import alive, signal_tree

log = logging.getLogger(__name__)
LOCK_MARKER = GANG_LOCK_MARKER


class Host(Protocol):
    node_id: str
    settings: Settings
    bus: Bus | None

    def job_dir(self, job_id: str) -> JobDir: ...

    async def report(self, event: wire.NodeEvent) -> None: ...


class GangMember:
    """The ``gang_lock`` and ``gang_release`` node commands."""

    async def gang_lock(self: Host, cmd: wire.NodeCommand) -> None:
        job, jd = cmd.job, self.job_dir(cmd.job.id)
        shim = jd.read_shim()
        error = None
        end = host_end(job, self.settings.node_netns)
        if shim is None or shim.incarnation != cmd.incarnation or jd.read_exit() is not None or not alive(shim.pid):
            error = f"job {job.name} is not running on {self.node_id}"
        elif end is None:
            error = f"job {job.name} has no link to lock (network {job.network}): gangs need --network bridge"
        else:
            (jd.path / LOCK_MARKER).write_text(cmd.op or "")
            try:
                await asyncio.to_thread(end.block, True)
            except OSError as exc:
                error = f"could not block its link: {exc}"
        kind: wire.NodeEventKind = "gang_lock_failed" if error else "gang_locked"
        if error:
            log.warning("gang lock of %s refused: %s", job.name, error)
        await self.report(wire.NodeEvent(kind=kind, node=self.node_id, job=job.id, incarnation=cmd.incarnation,
                                         op=cmd.op, error=error, id=f"{kind}-{job.id}-{cmd.op}-{cmd.incarnation}"))

    async def gang_release(self: Host, cmd: wire.NodeCommand) -> None:
        """Unlocks the member; with ``stop``, ends it instead (the group committed its final
        checkpoint): its link deleted first, so no reset reaches the other members."""
        job, jd = cmd.job, self.job_dir(cmd.job.id)
        shim = jd.read_shim()
        running = shim is not None and shim.incarnation == cmd.incarnation and jd.read_exit() is None \
            and alive(shim.pid)
        end = host_end(job, self.settings.node_netns)
        if running and shim is not None:
            try:
                if cmd.stop:
                    (jd.path / f"stop-{cmd.incarnation}").write_text(cmd.checkpoint or "")
                    if end is not None:
                        await asyncio.to_thread(end.delete)
                    await kill_tree(shim.pid)  # ended before gang_released says so
                else:  # a member dumped for a `--stop` that was undone waits stopped: it runs on
                    if end is not None:
                        await asyncio.to_thread(end.block, False)
                    signal_tree(shim.pid, signal.SIGCONT)
                    (jd.path / f"stop-{cmd.incarnation}").unlink(missing_ok=True)
            except OSError as exc:
                log.warning("gang release of %s: %s", job.name, exc)
        (jd.path / LOCK_MARKER).unlink(missing_ok=True)
        await self.report(wire.NodeEvent(kind="gang_released", node=self.node_id, job=job.id,
                                         incarnation=cmd.incarnation, op=cmd.op,
                                         id=f"gang_released-{job.id}-{cmd.op}-{cmd.incarnation}"))

    async def recover_gang_locks(self: Host, jobs: list[JobDir], known: dict[str, Job]) -> None:
        """After a restart: a member locked for an op that has ended since (or is gone) is unlocked."""
        assert self.bus is not None
        for jd in jobs:
            marker = jd.path / LOCK_MARKER
            if not marker.exists():
                continue
            op_id = marker.read_text().strip()
            op = await self.bus.ops.get(op_id) if op_id and wire.is_token(op_id) else None
            job = known.get(jd.path.name)
            if op is not None and not op.finished:
                continue  # the scheduler releases it
            if job is not None and (end := host_end(job, self.settings.node_netns)) is not None:
                try:
                    await asyncio.to_thread(end.block, False)
                except OSError as exc:
                    log.warning("unlocking %s after a restart: %s", job.name, exc)
                log.warning("%s was left locked by gang op %s, which has ended: unlocked", job.name, op_id or "-")
            marker.unlink(missing_ok=True)
