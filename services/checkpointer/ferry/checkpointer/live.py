"""The source half of a live move, as node commands of the checkpointer.

    live_freeze   criu dump --lazy-pages: the tree freezes, everything but its memory goes to the
                  store (a manifest of job ``<id>.live``), the page server listens; reports
                  live_frozen (or live_freeze_failed: the tree runs on)
    live_end      every page is on the target: the frozen tree is killed
    live_resume   the target failed: the frozen tree runs on (live_resumed), or, when it is gone,
                  live_resume_failed (the scheduler restores from the last committed checkpoint)

While a move is in flight the job directory holds ``live.json`` (the op, the frozen pids): the
fence leaves such a copy alone while the job's op is still that move (then kills it if the job
moved on), also across a restart of the checkpointer.
"""

import asyncio
import contextlib
import logging
import shutil
import signal
import time
from pathlib import Path

from pydantic import BaseModel

from ferry.checkpointer.hold import JobHolds
from ferry.common import wire
from ferry.common.models import Job
from ferry.common.moves import LiveFrozen
from ferry.criu.errors import CriuError
from ferry.criu.hold import held_since
from ferry.criu.jobdir import JobDir
from ferry.criu.lazy_common import STAYS_BEHIND, LiveMoveFailed, signal_all
from ferry.criu.lazy_source import LazySource
from ferry.criu.linux import is_gone
from ferry.criu.runner import job_criu_args
from ferry.criu.treekill import kill_tree
from ferry.node.base import LOGS_DIR, NodeService, page_tls, snapshot_logs
from ferry.node.bridge import host_end
from ferry.node.procs import alive, signal_tree
from ferry.node.usage import UsageSampler
from ferry.store.errors import StoreError

log = logging.getLogger(__name__)

LIVE_MARKER = "live.json"
RESUME_SETTLE_S = 0.3


def live_store_job(job_id: str) -> str:
    """The store's job under which a live move's images (all but memory) travel."""
    return f"{job_id}.live"


class LiveMarker(BaseModel):
    op: str
    incarnation: int
    stopped: list[int] = []


class LiveSource(NodeService):
    """Mixed into the checkpointer."""

    live: dict[str, LazySource]
    usage: UsageSampler
    holds: JobHolds

    def live_marker(self, jd: JobDir) -> LiveMarker | None:
        try:
            return LiveMarker.model_validate_json((jd.path / LIVE_MARKER).read_text())
        except (OSError, ValueError):
            return None

    def recover_live_moves(self) -> None:
        """After a restart. A frozen source stays frozen: its dump (its own session) still serves the
        target, the fence spares it while its move is in flight, and live_end or live_resume, which
        work without the lost LazySource, finish it either way."""
        self.live = {}
        for d in sorted(self.jobs_dir.iterdir()):
            marker = self.live_marker(JobDir(d))
            if marker is not None:
                log.warning("%s is the frozen source of live move %s, begun before a restart", d.name, marker.op)

    def in_live_move(self, job: Job, jd: JobDir) -> bool:
        """Whether the local copy is the source of the live move `job` is in now (the fence spares it)."""
        marker = self.live_marker(jd)
        return marker is not None and job.op == marker.op

    async def live_freeze(self, cmd: wire.NodeCommand) -> None:
        job, jd = cmd.job, self.job_dir(cmd.job.id)
        assert cmd.checkpoint and cmd.op
        shim = jd.read_shim()
        if job.id in self.live:
            return  # a redelivery: this freeze is under way or done (its event went out)
        if shim is None or shim.incarnation != cmd.incarnation or jd.read_exit() is not None or not alive(shim.pid):
            await self._freeze_failed(cmd, f"job {job.name} is not running on {self.node_id}")
            return
        images = self.scratch_dir / f"live-{job.id}-{cmd.checkpoint}"
        shutil.rmtree(images, ignore_errors=True)
        source = LazySource(jd, shim.pid, images, criu_bin=self.settings.criu_bin, address=self.settings.node_ip,
                            tls_args=page_tls(self.settings),
                            extra_args=job_criu_args(job.network, cmd.options.criu_args, adopted=job.adopted),
                            host_end=host_end(job, self.settings.node_netns))
        self.live[job.id] = source
        cpu_s, cores = await asyncio.to_thread(self.usage.before_dump, job.id, shim.pid, cmd.incarnation)
        try:
            self.faults.raise_at(cmd.options, "freeze", LiveMoveFailed, source_running=True)
            if (why := self.holds.dump_refused(jd, time.time())) is not None:
                raise LiveMoveFailed(why, source_running=True)
            frozen = await source.freeze()
            if held_since(jd, cmd.incarnation):  # a hold landed as CRIU seized it: the target would run it stopped
                raise LiveMoveFailed("this node lost the bus during the freeze (the job is held)", source_running=True)
        except LiveMoveFailed as exc:
            self.live.pop(job.id, None)
            if source.stopped:
                await source.resume()
            shutil.rmtree(images, ignore_errors=True)
            await self._freeze_failed(cmd, f"the final dump on {self.node_id} failed: {exc}")
            return
        marker = LiveMarker(op=cmd.op, incarnation=cmd.incarnation, stopped=source.stopped)
        (jd.path / LIVE_MARKER).write_text(marker.model_dump_json())
        t0 = time.monotonic()
        try:
            uploaded = await asyncio.to_thread(self._upload_live_images, cmd, jd, images, frozen.sizes)
        except (StoreError, OSError) as exc:
            self.live.pop(job.id, None)
            await source.resume()
            (jd.path / LIVE_MARKER).unlink(missing_ok=True)
            await self._freeze_failed(cmd, f"sending the final images from {self.node_id} failed: {exc}")
            return
        finally:
            shutil.rmtree(images, ignore_errors=True)
        report = LiveFrozen(
            **frozen.model_dump(exclude={"file_keys"}), bytes_final=uploaded,
            upload_ms=(time.monotonic() - t0) * 1000, store_job=live_store_job(job.id), images=cmd.checkpoint,
            source_pid=shim.pid, cpu_s=cpu_s, cores=cores,
            stdout_path=frozen.file_keys.get(str(jd.stdout), str(jd.stdout)),
            stderr_path=frozen.file_keys.get(str(jd.stderr), str(jd.stderr)))
        await self.report(wire.NodeEvent(kind="live_frozen", node=self.node_id, job=job.id,
                                         incarnation=cmd.incarnation, op=cmd.op, live=report))
        if self.faults.hit(cmd.options, "source"):  # the source dies midway
            await asyncio.sleep(0.2)
            await source.dump.kill()
            signal_tree(shim.pid, signal.SIGKILL)

    def _upload_live_images(self, cmd: wire.NodeCommand, jd: JobDir, images: Path, sizes: dict[str, int]) -> int:
        snapshot_logs(jd, images / LOGS_DIR, sizes)
        files = sorted(str(p.relative_to(images)) for p in images.rglob("*")
                       if p.is_file() and p.name not in STAYS_BEHIND)
        assert cmd.checkpoint
        result = self.store.write_checkpoint(job=live_store_job(cmd.job.id), tenant=cmd.job.tenant,
                                             checkpoint=cmd.checkpoint, parent=None,
                                             src_dir=images, files=files)
        return result.bytes_logical

    async def _freeze_failed(self, cmd: wire.NodeCommand, error: str) -> None:
        log.warning("%s", error)
        await self.report(wire.NodeEvent(kind="live_freeze_failed", node=self.node_id, job=cmd.job.id,
                                         incarnation=cmd.incarnation, op=cmd.op, error=error))

    async def _drop_live_images(self, cmd: wire.NodeCommand) -> None:
        """The move is over either way: its images (all but memory) leave the store."""
        if cmd.checkpoint:
            with contextlib.suppress(StoreError):
                await asyncio.to_thread(self.store.delete_checkpoint, live_store_job(cmd.job.id), cmd.checkpoint)

    async def live_end(self, cmd: wire.NodeCommand) -> None:
        jd = self.job_dir(cmd.job.id)
        (jd.path / f"stop-{cmd.incarnation}").touch()  # its exit is the move's, not the job's
        source = self.live.pop(cmd.job.id, None)
        try:
            if source is not None:
                await source.end()
            else:
                shim = jd.read_shim()
                if shim is not None and shim.incarnation == cmd.incarnation and alive(shim.pid):
                    await kill_tree(shim.pid)
        except (CriuError, OSError) as exc:
            log.warning("ending the source of %s: %s", cmd.job.name, exc)
        (jd.path / LIVE_MARKER).unlink(missing_ok=True)
        await self._drop_live_images(cmd)

    async def live_resume(self, cmd: wire.NodeCommand) -> None:
        jd = self.job_dir(cmd.job.id)
        source = self.live.pop(cmd.job.id, None)
        shim = jd.read_shim()
        running = False
        if source is not None:
            running = await source.resume()
        elif shim is not None and shim.incarnation == cmd.incarnation and alive(shim.pid):
            marker = self.live_marker(jd)
            signal_all(marker.stopped if marker else [], signal.SIGCONT)
            signal_tree(shim.pid, signal.SIGCONT)
            running = True
        if running:  # a tree that was being killed as it resumed shows as running for a moment
            await asyncio.sleep(RESUME_SETTLE_S)
            running = shim is not None and alive(shim.pid) and not is_gone(shim.pid) and jd.read_exit() is None
        (jd.path / LIVE_MARKER).unlink(missing_ok=True)
        (jd.path / f"stop-{cmd.incarnation}").unlink(missing_ok=True)
        await self._drop_live_images(cmd)
        if running and shim is not None and jd.read_exit() is None:
            await self.report(wire.NodeEvent(kind="live_resumed", node=self.node_id, job=cmd.job.id,
                                             incarnation=cmd.incarnation, op=cmd.op, pid=shim.pid))
        else:
            await self.report(wire.NodeEvent(kind="live_resume_failed", node=self.node_id, job=cmd.job.id,
                                             incarnation=cmd.incarnation, op=cmd.op,
                                             error=f"the frozen source on {self.node_id} is gone"))
