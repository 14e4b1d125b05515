"""The node's checkpoint pipeline: a ``checkpoint`` node command from request to committed record.

    refuse early    not running here, or the disk cannot hold it (before anything freezes the job)
    GPU             the CUDA driver moves device memory into host memory (``ferry.gpu``)
    dump            CRIU dumps the tree (a final checkpoint leaves it stopped, not killed)
    upload          the store gets the chunks it lacks, then the manifest commits the checkpoint
    report          ``checkpoint_committed`` (with the retention policy's deletions) or
                    ``checkpoint_failed``, after which the job runs on as before

A `checkpoint --stop` writes a stop marker before the dump, so that a checkpointer that dies in the
middle finishes or undoes the stop when it comes back (``recover_interrupted_stops``).

The pipeline is composed into the checkpointer, which provides what it needs (``Host``).
"""

import asyncio
import json
import logging
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ferry.checkpointer.hold import JobHolds
from ferry.common import wire
from ferry.common.config import Settings
from ferry.common.models import CheckpointRecord, Job
from ferry.common.tracing import tracer
from ferry.criu import container
from ferry.criu.errors import CriuError, DumpFailed, ImageError
from ferry.criu.hold import held_since
from ferry.criu.images import find_page_maps
from ferry.criu.jobdir import JobDir
from ferry.criu.runner import CriuRunner, DumpResult, job_criu_args
from ferry.criu.sockets import read_sockets
from ferry.criu.treekill import kill_tree
from ferry.gpu.compat import snapshot_of
from ferry.gpu.cuda_checkpoint import (
    CudaCheckpointer,
    cuda_processes,
    default_checkpointer,
    resume_after_dump,
    suspend_for_dump,
)
from ferry.gpu.errors import GpuError
from ferry.gpu.models import GpuDumpStats, GpuInfo
from ferry.gpu.nvml import Nvml
from ferry.node.adopt import stdio_pipes
from ferry.node.base import LOGS_DIR, META_FILE, kernel_release, snapshot_logs
from ferry.node.procs import alive, signal_tree, wait_for_dumps_of
from ferry.node.space import space_problem, tree_rss
from ferry.node.usage import UsageSampler
from ferry.sim.faults import FaultHook
from ferry.store.errors import StoreError
from ferry.store.local import LocalBackend
from ferry.store.manifest import manifest_key
from ferry.store.store import CheckpointStore

log = logging.getLogger(__name__)
_tracer = tracer("checkpointer")
ORPHAN_DUMP_WAIT_S = 120.0  # a 4 GiB dump takes about 10 s here


class Host(Protocol):
    """What the pipeline needs from the node service it runs in."""

    node_id: str
    settings: Settings
    store: CheckpointStore
    scratch_dir: Path
    jobs_dir: Path
    usage: UsageSampler

    def job_dir(self, job_id: str) -> JobDir: ...

    async def report(self, event: wire.NodeEvent) -> None: ...

    def progress_reporter(self, op: str | None, phase: str) -> Callable[[int, int], None]: ...

    def gpus(self) -> list[GpuInfo]: ...

    def gpu_driver_version(self) -> str: ...

    def nvml(self) -> Nvml: ...

    def in_any_live_move(self, jd: JobDir) -> bool: ...

    holds: JobHolds

    @property
    def faults(self) -> FaultHook: ...


class CheckpointPipeline:
    def __init__(self, host: Host, criu: CriuRunner, criu_version: str) -> None:
        self.host, self.criu, self.criu_version = host, criu, criu_version

    # ---- after a restart -----------------------------------------------------------------------

    async def recover_interrupted_stops(self) -> None:
        """A `checkpoint --stop` (or the source half of a cold move) whose service died between
        CRIU's dump, which leaves the tree stopped, and the commit must not leave the job stopped
        forever. Its stop marker, written before the dump, names the checkpoint: committed, the stop
        is finished (the tree is killed, its exit reported as the checkpoint's); not committed, the
        tree runs on. The redelivered command then does what was asked."""
        for d in sorted(self.host.jobs_dir.iterdir()):
            jd = JobDir(d)
            shim = jd.read_shim()
            if shim is None or jd.read_exit() is not None or self.host.in_any_live_move(jd):
                continue
            marker = jd.path / f"stop-{shim.incarnation}"
            if not marker.exists():
                continue
            # a CRIU its predecessor started may still be dumping the tree: let it end first
            if not await asyncio.to_thread(wait_for_dumps_of, shim.pid, ORPHAN_DUMP_WAIT_S):
                log.error("%s: a CRIU dump begun before the restart still runs after %.0fs", d.name,
                          ORPHAN_DUMP_WAIT_S)
            checkpoint = marker.read_text().strip()
            committed = bool(checkpoint) and await asyncio.to_thread(self.committed, d.name, checkpoint)
            if not alive(shim.pid):
                continue
            if committed:
                log.warning("%s: checkpoint %s committed before a restart; finishing the stop", d.name, checkpoint)
                await kill_tree(shim.pid)
            else:
                log.warning("%s: its stop checkpoint %s did not commit before a restart; it runs on",
                            d.name, checkpoint or "-")
                await asyncio.to_thread(self.host.holds.give_back, jd, shim)  # or, the lease out, waits for it
                marker.unlink(missing_ok=True)

    def committed(self, job_id: str, checkpoint: str) -> bool:
        try:
            return self.host.store.read_manifest(job_id, checkpoint) is not None
        except StoreError:
            return False

    def space_problem(self, pid: int) -> str | None:
        """Why a checkpoint of the tree of `pid` would not fit here (ferry.node.space), or None."""
        places = {"scratch folder": self.host.scratch_dir}
        if isinstance(self.host.store.backend, LocalBackend):
            places["store"] = self.host.store.backend.root
        return space_problem(tree_rss(pid), places, int(self.host.settings.disk_reserve))

    # ---- the command ---------------------------------------------------------------------------

    async def checkpoint(self, cmd: wire.NodeCommand) -> None:
        host, job, jd = self.host, cmd.job, self.host.job_dir(cmd.job.id)
        assert cmd.checkpoint
        record = CheckpointRecord(id=cmd.checkpoint, job=job.id, job_name=job.name, parent=cmd.parent,
                                  node=host.node_id, criu_version=self.criu_version,
                                  kernel=kernel_release(), final=cmd.stop, incarnation=cmd.incarnation)
        try:
            existing = await asyncio.to_thread(host.store.read_manifest, job.id, cmd.checkpoint, job.tenant)
        except StoreError:
            existing = None
        if existing is not None:  # committed before a restart of this service: report it again
            record = CheckpointRecord.model_validate(existing.meta.get("record", record.model_dump()))
            await self._report(cmd, "checkpoint_committed", record)
            return
        shim = jd.read_shim()
        if shim is None or shim.incarnation != cmd.incarnation or jd.read_exit() is not None or not alive(shim.pid):
            record.state, record.error = "failed", f"job {job.name} is not running on {host.node_id}"
            await self._report(cmd, "checkpoint_failed", record)
            return
        if (problem := await asyncio.to_thread(self.space_problem, shim.pid)) is not None:
            record.state, record.error = "failed", problem  # refused before anything froze the job
            log.warning("checkpoint %s of %s refused: %s", cmd.checkpoint, job.name, problem)
            await self._report(cmd, "checkpoint_failed", record)
            return
        images = host.scratch_dir / f"{job.id}-{cmd.checkpoint}"
        shutil.rmtree(images, ignore_errors=True)
        images.mkdir(parents=True)
        stop_marker = jd.path / f"stop-{cmd.incarnation}"
        t0 = time.monotonic()
        try:
            await self._dump_and_upload(cmd, jd, shim.pid, images, record, stop_marker)
        except (CriuError, StoreError, GpuError, OSError) as exc:
            if cmd.stop:  # left stopped by the dump: it runs on (or, on a node cut off, stays held)
                await asyncio.to_thread(host.holds.give_back, jd, shim)
                stop_marker.unlink(missing_ok=True)
            record.state, record.error = "failed", str(exc)
            record.log_excerpt = list(getattr(exc, "log_excerpt", []) or [])
            if record.log_excerpt:
                record.error = f"{exc} | CRIU log: " + " / ".join(record.log_excerpt[-5:])
            if not alive(shim.pid):  # CRIU's own words for that (a namespace gone, no such process) say little
                record.error = (f"job {job.name} ended while it was being checkpointed, so nothing was saved; "
                                f"its exit is reported as usual ({record.error})")
            record.total_ms = (time.monotonic() - t0) * 1000
            log.warning("checkpoint %s of %s failed: %s", cmd.checkpoint, job.name, record.error)
            await self._report(cmd, "checkpoint_failed", record)
            await self.collect_garbage(f"checkpoint {cmd.checkpoint} of {job.name} failed")
        else:
            record.total_ms = (time.monotonic() - t0) * 1000
            deleted = await self.apply_retention(job.id)
            await self._report(cmd, "checkpoint_committed", record, deleted)
        finally:
            shutil.rmtree(images, ignore_errors=True)

    async def _report(self, cmd: wire.NodeCommand, kind: wire.NodeEventKind, record: CheckpointRecord,
                      deleted: list[str] | None = None) -> None:
        await self.host.report(wire.NodeEvent(kind=kind, node=self.host.node_id, job=cmd.job.id,
                                              incarnation=cmd.incarnation, op=cmd.op, checkpoint=record,
                                              deleted_checkpoints=deleted or []))

    # ---- the store's upkeep --------------------------------------------------------------------

    async def collect_garbage(self, why: str) -> None:
        """Deletes the chunks no checkpoint uses: those a failed or crashed write left behind. Safe
        beside other writers (gc waits for them, see ferry.store.gc); a failure is only logged."""
        try:
            result = await asyncio.to_thread(self.host.store.gc)
        except (StoreError, OSError) as exc:
            log.warning("gc after %s failed: %s", why, exc)
            return
        if result.objects_deleted or result.quarantined_deleted or result.unfinished_deleted:
            log.info("gc after %s: %d orphaned chunk(s), %d pack(s), %d bytes, %d quarantined, %d unfinished",
                     why, result.chunks_deleted, result.packs_deleted, result.bytes_freed,
                     result.quarantined_deleted, result.unfinished_deleted)

    async def apply_retention(self, job_id: str) -> list[str]:
        """Keeps the newest FERRY_KEEP_CHECKPOINTS checkpoints of a job (0: all); returns the rest,
        deleted. A failure here never fails the checkpoint that was just committed."""
        keep = self.host.settings.keep_checkpoints
        if not keep:
            return []
        try:
            return await asyncio.to_thread(_retain, self.host.store, job_id, keep)
        except (StoreError, OSError) as exc:
            log.warning("retention for %s failed: %s", job_id, exc)
            return []

    async def expire(self, job: Job) -> bool:
        """Deletes every checkpoint of `job`, which ended `keep_ended_s` ago (then unused chunks go),
        and tells the scheduler; False when the store refused (the caller tries again later)."""
        try:
            deleted = await asyncio.to_thread(_expire, self.host.store, job.id)
        except (StoreError, OSError) as exc:
            log.warning("the checkpoints of ended job %s could not be deleted: %s", job.name, exc)
            return False
        log.info("job %s ended %.0f s ago: its %d checkpoint(s) deleted", job.name, time.time() - job.updated,
                 len(deleted))
        await self.host.report(wire.NodeEvent(kind="checkpoints_expired", node=self.host.node_id, job=job.id,
                                              incarnation=job.incarnation, deleted_checkpoints=deleted))
        return True

    # ---- dump and upload -----------------------------------------------------------------------

    async def _dump_and_upload(self, cmd: wire.NodeCommand, jd: JobDir, pid: int, images: Path,
                               record: CheckpointRecord, stop_marker: Path) -> None:
        job = cmd.job
        assert cmd.checkpoint
        self.host.faults.raise_at(cmd.options, "round", DumpFailed)
        if cmd.stop:  # durably, before anything freezes the job (recover_interrupted_stops reads it)
            stop_marker.write_text(cmd.checkpoint)
        # an adopted process may write to its supervisor's pipes: a restore hands it the job's files there
        pipes = stdio_pipes(pid) if job.adopted else {}
        # the job's last moment of progress: what a move's lost seconds are measured from (ferry.policy.lost)
        record.dumped_at = time.time()
        record.cpu_s, record.cores = await asyncio.to_thread(self.host.usage.before_dump, job.id, pid, cmd.incarnation)
        gpu: tuple[CudaCheckpointer, GpuDumpStats] | None = None
        cuda_pids: list[int] = await asyncio.to_thread(cuda_processes, pid) if job.gpu_uuids else []
        if cuda_pids:
            # The CUDA driver moves the job's device memory into its host memory, where CRIU sees it.
            with _tracer.start_as_current_span("cuda.suspend"):
                ckpt = default_checkpointer()
                gpu = ckpt, await suspend_for_dump(pid, ckpt, nvml=self.host.nvml())
        try:
            if (why := self.host.holds.dump_refused(jd, time.time())) is not None:
                raise DumpFailed(why)
            with _tracer.start_as_current_span("criu.dump") as span:
                # A final checkpoint leaves the tree stopped, not killed, until the upload committed:
                # if the upload fails the job simply continues.
                dump = await container.checkpoint(jd, images, final=cmd.stop) \
                    if job.container else await self.criu.dump(pid, images, leave_running=not cmd.stop,
                                            record_sizes=[jd.stdout, jd.stderr],
                                            extra_args=[*(["--leave-stopped"] if cmd.stop else []),
                                                        *job_criu_args(job.network, cmd.options.criu_args,
                                                                       adopted=job.adopted)])
                span.set_attribute("ferry.dump_ms", dump.wall_ms)
            if held_since(jd, cmd.incarnation):  # a hold landed as CRIU seized the tree: it would restore stopped
                raise DumpFailed("this node lost the bus while CRIU dumped the job (it is held): the dump is discarded")
        except CriuError:
            if gpu is not None:  # CRIU resumed the tree: give it its GPU state back
                await resume_after_dump(pid, gpu[0], pids=gpu[1].pids)
            raise
        if gpu is not None:
            if not cmd.stop:
                await resume_after_dump(pid, gpu[0], pids=gpu[1].pids)
            stats = gpu[1]
            record.gpu_bytes, record.gpu_lock_ms, record.gpu_checkpoint_ms = (
                stats.gpu_bytes, stats.lock_ms, stats.checkpoint_ms)
        try:
            await self._upload(cmd, jd, pid, images, record, dump, gpu is not None, pipes)
        except (StoreError, OSError):
            if cmd.stop and gpu is not None:  # the job goes on: running again, then its GPU state back
                signal_tree(pid, signal.SIGCONT)
                await resume_after_dump(pid, gpu[0], pids=gpu[1].pids)
            raise

    async def _upload(self, cmd: wire.NodeCommand, jd: JobDir, pid: int, images: Path, record: CheckpointRecord,
                      dump: DumpResult, uses_gpu: bool, pipes: dict[str, str]) -> None:
        job, host = cmd.job, self.host
        assert cmd.checkpoint
        await asyncio.to_thread(snapshot_logs, jd, images / LOGS_DIR, dump.file_sizes)
        meta: dict[str, object] = {
            "job": job.id, "name": job.name, "checkpoint": cmd.checkpoint, "incarnation": cmd.incarnation,
            "argv": job.argv, "node": host.node_id,
            # what the restore hands each output file to CRIU under (ferry.criu.external)
            "stdout_path": pipes.get("stdout") or dump.file_keys.get(str(jd.stdout), str(jd.stdout)),
            "stderr_path": pipes.get("stderr") or dump.file_keys.get(str(jd.stderr), str(jd.stderr))}
        if uses_gpu:  # what a restore target must match
            used = [g for g in host.gpus() if g.uuid in job.gpu_uuids]
            meta["gpu"] = snapshot_of(used, host.gpu_driver_version()).model_dump()
        (images / META_FILE).write_text(json.dumps(meta))
        page_maps = await asyncio.to_thread(find_page_maps, images)
        try:
            record.sockets = [str(s) for s in await asyncio.to_thread(read_sockets, images)]
        except ImageError as exc:  # only what the record says: the dump itself is good
            log.warning("could not list the sockets of %s: %s", cmd.checkpoint, exc)
        record.dump_ms = dump.wall_ms
        record.freeze_ms = dump.frozen_ms if dump.frozen_ms is not None else dump.wall_ms
        record.manifest_key = manifest_key(job.id, cmd.checkpoint)
        progress = host.progress_reporter(cmd.op, "upload")
        with _tracer.start_as_current_span("store.upload") as span:
            t0 = time.monotonic()
            # The manifest carries the record so that a restarted checkpointer can report it again.
            preview = record.model_copy()
            result = await asyncio.to_thread(
                host.store.write_checkpoint, job=job.id, tenant=job.tenant, checkpoint=cmd.checkpoint,
                parent=cmd.parent,
                src_dir=images, page_maps=page_maps, meta={**meta, "record": preview.model_dump()},
                progress=progress, verify_all=cmd.stop)  # the job is killed once a final one commits
            record.upload_ms = (time.monotonic() - t0) * 1000
            span.set_attribute("ferry.bytes_uploaded", result.bytes_uploaded)
        record.bytes_logical = result.bytes_logical
        record.bytes_stored = result.bytes_stored
        record.bytes_uploaded = result.bytes_uploaded
        if cmd.stop and not cmd.hold:  # held: a gang member waits, stopped, for its group (gang_release)
            # ended before the commit is reported: the job may be started again at once, maybe here
            await kill_tree(pid)


def _expire(store: CheckpointStore, job: str) -> list[str]:
    deleted = store.delete_job(job)
    if deleted:
        store.gc()
    return deleted


def _retain(store: CheckpointStore, job: str, keep: int) -> list[str]:
    """The retention policy, then garbage collection of the chunks no checkpoint uses any more."""
    deleted = store.apply_retention(job, keep)
    if deleted:
        result = store.gc()
        log.info("retention removed %d checkpoint(s) of %s; gc freed %d bytes", len(deleted), job, result.bytes_freed)
    return deleted
